"""The data flows one way (DESIGN.md): each rule below is its own test, and each failure names the module that
breaks it and the import that does.

Two readings of "imports": what the source says (every import statement, at module level or inside a function,
followed from module to module: the chain is the failure message), and what a fresh interpreter has loaded after
importing the modules (sys.modules: it also sees imports no statement spells, e.g. importlib).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "operator"
PACKAGE = "v41flash"
BENCH = "v41flash_bench"

# The fact modules the API may import: each a leaf (it imports nothing of the package), shared with the renderer,
# the argument builder and the planner (v41flash/__init__.py lists what each holds).
LEAF_FACTS = ("v41flash.defaults", "v41flash.roles", "v41flash.facts", "v41flash.gpus", "v41flash.lanes",
              "v41flash.cron", "v41flash.figures", "v41flash.serve_flags")

# Function-local imports of the package allowed, by module, each with its reason. Keep it tiny.
LOCAL_IMPORTS_ALLOWED = {
    # The CLI is the entry point of four processes: the operator, the front pod's counters, the session proxy and the
    # offline tools. Each subcommand loads its own stack when it runs, so `session-proxy` starts without kopf, kubernetes
    # or the API models, and only `v41flash operator` imports controller.handlers (importing it registers the kopf
    # handlers).
    "v41flash.cli.manifests": "per-command stack",
    "v41flash.cli.operator": "per-command stack",
    "v41flash.cli.proxy": "per-command stack",
    "v41flash.cli.front": "per-command stack",
}


@dataclass(frozen=True)
class Import:
    importer: str  # module
    target: str  # the module the statement imports (or a package's attribute's package)
    line: int
    statement: str
    local: bool  # inside a function body

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} `{self.statement}`"


@cache
def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in sorted((SOURCE / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def imports_in(module: str, source: str, is_package: bool = False) -> list[Import]:
    """Every import statement of one module's source, resolved to absolute module names."""
    tree = ast.parse(source)
    local_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    here = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules() else origin for a in node.names]
        else:
            continue
        statement = ast.get_source_segment(source, node) or ""
        for target in dict.fromkeys(targets):
            out.append(Import(module, target, node.lineno, " ".join(statement.split()), id(node) in local_nodes))
    return out


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    path = modules()[module]
    return tuple(imports_in(module, path.read_text(), path.name == "__init__.py"))


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a/__init__ and a/b/__init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_chain(start: str, forbidden: Iterable[str]) -> list[Import] | None:
    """The first chain of import statements (breadth first) from `start` to a module under `forbidden`."""
    forbidden = tuple(forbidden)
    seen = {start}
    queue: deque[tuple[str, list[Import]]] = deque([(start, [])])
    while queue:
        module, chain = queue.popleft()
        for imp in imports_of(module):
            if under(imp.target, *forbidden):
                return [*chain, imp]
            for nxt in _with_parents(imp.target):
                if nxt in modules() and nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, [*chain, imp]))
    return None


def package_modules(*packages: str) -> list[str]:
    return [m for m in modules() if under(m, *packages)]


def loaded_after_importing(names: Iterable[str]) -> set[str]:
    """Every module a fresh interpreter has loaded after importing `names`."""
    code = ("import importlib, sys\n"
            "for n in sys.argv[1:]:\n    importlib.import_module(n)\n"
            "print('\\n'.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *names], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def check_does_not_import(packages: Iterable[str], forbidden: Iterable[str]) -> None:
    """No module under `packages` imports (directly or through others) a module under `forbidden`."""
    packages, forbidden = list(packages), tuple(forbidden)
    chains: dict[Import, list[Import]] = {}  # the offending import -> the shortest chain to it
    for m in package_modules(*packages):
        if (c := import_chain(m, forbidden)) and len(c) < len(chains.get(c[-1], c + [c[-1]])):
            chains[c[-1]] = c
    assert not chains, f"{', '.join(packages)} must not import {', '.join(forbidden)}:\n" + \
        "\n".join(" -> ".join(map(str, c)) for c in chains.values())
    loaded = loaded_after_importing(package_modules(*packages))
    assert sorted(m for m in loaded if under(m, *forbidden)) == [], \
        f"importing {', '.join(packages)} loads these (no import statement names them: importlib?)"


# --- the rules --------------------------------------------------------------------------------------------------

def test_render_imports_neither_the_planner_nor_the_controller_nor_rollout():
    check_does_not_import(["v41flash.render"], ["v41flash.planner", "v41flash.controller", "v41flash.rollout"])


def test_planner_imports_neither_the_api_nor_render_nor_the_controller_nor_kubernetes():
    check_does_not_import(["v41flash.planner"],
                          ["v41flash.api", "v41flash.render", "v41flash.controller", "kopf", "kubernetes"])


# The planner reads what a window observed (WindowFigures, RouterFigures) from the leaf v41flash.figures; metrics makes
# them. Importing anything of v41flash.metrics runs its __init__, which loads the scraper's parser and prometheus_client:
# the pure planner imports none of it (metrics may import the planner's types, never the reverse).
METRICS_IO = ("v41flash.metrics", "prometheus_client", "httpx")


def test_planner_never_imports_the_metrics_io_nor_prometheus_client():
    check_does_not_import(["v41flash.planner"], METRICS_IO)


def test_rollout_machine_is_pure():
    check_does_not_import(["v41flash.rollout.machine"],
                          ["v41flash.controller", "v41flash.render", "kopf", "kubernetes"])


def _outside_api(imp: Import) -> bool:
    return under(imp.target, PACKAGE) and not under(imp.target, "v41flash.api", *LEAF_FACTS) and imp.target != PACKAGE


def test_api_is_a_leaf():
    """api/ imports nothing of the package outside api/ but the leaf fact modules."""
    bad = [imp for m in package_modules("v41flash.api") for imp in imports_of(m) if _outside_api(imp)]
    assert not bad, "api/ imports outside api/ and the leaf facts " + f"{LEAF_FACTS}:\n" + "\n".join(map(str, bad))
    loaded = loaded_after_importing(package_modules("v41flash.api"))
    assert sorted(m for m in loaded if under(m, PACKAGE) and not under(m, "v41flash.api", *LEAF_FACTS)
                  and m != PACKAGE) == []


def test_the_fact_modules_are_leaves():
    bad = [imp for m in (PACKAGE, *LEAF_FACTS) for imp in imports_of(m) if under(imp.target, PACKAGE)]
    assert not bad, "a leaf fact module imports the package:\n" + "\n".join(map(str, bad))


def test_the_product_never_imports_the_evaluation_package():
    named = [f"{path.relative_to(SOURCE)}:{i}: {line.strip()}" for path in modules().values()
             for i, line in enumerate(path.read_text().splitlines(), 1) if BENCH in line]
    assert not named, f"the product names {BENCH} (evaluation tooling, not in the image):\n" + "\n".join(named)
    loaded = loaded_after_importing(modules())
    assert sorted(m for m in loaded if under(m, BENCH)) == [], f"importing every module of {PACKAGE} loads these"


def local_imports(imports: Iterable[Import]) -> list[Import]:
    return [imp for imp in imports if imp.local and under(imp.target, PACKAGE)
            and imp.importer not in LOCAL_IMPORTS_ALLOWED]


def test_no_function_local_imports_of_the_package():
    """An import inside a function hides a dependency (often a cycle) from the module's header."""
    bad = local_imports(imp for m in modules() for imp in imports_of(m))
    assert not bad, "function-local imports of the package (import at module level, or fix the cycle):\n" + \
        "\n".join(map(str, bad))


def test_the_local_imports_allowlist_names_only_modules_that_need_it():
    needless = [m for m in LOCAL_IMPORTS_ALLOWED
                if m not in modules() or not any(i.local and under(i.target, PACKAGE) for i in imports_of(m))]
    assert needless == []


@pytest.mark.parametrize("package,words", [
    ("v41flash.render", ("rollout",)),  # what a slot is made of is render's (render/slots.py); deciding them is not
    ("v41flash.controller", ("slot", "rollout")),
])
def test_rollout_code_lives_only_in_rollout(package, words):
    stray = [m for m in package_modules(package) if any(w in m.rpartition(".")[2] for w in words)]
    assert stray == [], f"rollout modules outside v41flash/rollout/: {stray}"



# --- bench and e2e: one direction only ------------------------------------------------------------------------------
# e2e (the harness and its tests: the top of the graph) may import bench's process library, simulator command lines,
# workload generators and benchmark code (it tests some); bench never imports e2e. A benchmark that runs on the local
# cluster reaches it as any client does: its state directory (v41flash_bench.local_cluster) and commands
# (`python -m e2e.harness ...`, `python -m e2e.gateway`).
BENCH_SOURCE = SOURCE.parent / "bench"
E2E = "e2e"


def bench_modules(root: Path = BENCH_SOURCE) -> dict[str, Path]:
    out = {}
    for path in sorted((root / BENCH).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def e2e_imports_in_bench(root: Path = BENCH_SOURCE) -> list[Import]:
    """Every import statement of a bench module (at module level or inside a function) that names e2e."""
    return [imp for m, path in bench_modules(root).items()
            for imp in imports_in(m, path.read_text(), path.name == "__init__.py") if under(imp.target, E2E)]


def test_bench_never_imports_e2e():
    bad = e2e_imports_in_bench()
    assert not bad, f"{BENCH} imports {E2E} (e2e imports bench, never the reverse):\n" + "\n".join(map(str, bad))
    loaded = loaded_after_importing(bench_modules())
    assert sorted(m for m in loaded if under(m, E2E)) == [], f"importing every module of {BENCH} loads these"


def test_the_bench_rule_catches_a_planted_import(tmp_path):
    pkg = tmp_path / BENCH / "routing"
    pkg.mkdir(parents=True)
    (tmp_path / BENCH / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("import json\nfrom v41flash_bench.procs import spawn\n"
                              "def run():\n    from e2e.harness import Cluster\n    return Cluster\n")
    (pkg / "y.py").write_text("from e2e import kit\n")
    assert [(str(i), i.local) for i in e2e_imports_in_bench(tmp_path)] == [
        ("v41flash_bench.routing.x:4 `from e2e.harness import Cluster`", True),
        ("v41flash_bench.routing.y:1 `from e2e import kit`", False)]

# --- controller/handlers.py: kopf's registrations and nothing else -----------------------------------------------

def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _immutable(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant) or node is None:
        return True
    if isinstance(node, ast.Tuple):
        return all(_immutable(e) for e in node.elts)
    if isinstance(node, (ast.UnaryOp, ast.BinOp)):
        return all(_immutable(n) for n in ast.iter_child_nodes(node) if isinstance(n, ast.expr))
    return False


def kopf_module_problems(source: str) -> list[str]:
    """What in a module's top level is not an import, a docstring, an immutable constant or a function that kopf
    registers (decorated with kopf.on.*, or passed to a module-level kopf.on.*(...)(fn) call)."""
    tree = ast.parse(source)
    registered = {a.id for node in tree.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and _dotted(node.value.func).startswith("kopf.on.") for a in node.value.args
                  if isinstance(a, ast.Name)}
    problems = []
    for i, node in enumerate(tree.body):
        where = f"line {node.lineno}"
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name not in registered and not any(_dotted(d).startswith("kopf.on.") for d in node.decorator_list):
                problems.append(f"{where}: def {node.name} is not a kopf handler")
        elif isinstance(node, ast.ClassDef):
            problems.append(f"{where}: class {node.name}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            if not _immutable(node.value):
                names = [_dotted(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
                problems.append(f"{where}: module-level state {', '.join(names)}")
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and _dotted(node.value.func).startswith("kopf.on.")):
            problems.append(f"{where}: {type(node).__name__} statement")
    return problems


def test_controller_handlers_holds_only_kopf_handlers():
    problems = kopf_module_problems(modules()["v41flash.controller.handlers"].read_text())
    assert problems == [], "v41flash.controller.handlers:\n" + "\n".join(problems)


# --- the checks themselves catch what they are for ------------------------------------------------------------------

def test_the_checks_catch_their_violations():
    local = imports_in("v41flash.render.x", "import os\ndef f():\n    from ..rollout import machine\n    import json\n")
    assert [(str(i), i.target) for i in local_imports(local)] == [
        ("v41flash.render.x:3 `from ..rollout import machine`", "v41flash.rollout.machine")]
    handlers = ('"""doc"""\nimport kopf\nX = 3\nY = (1, "a")\n@kopf.on.create("a")\ndef ok(**_): pass\n'
                'def helper(): pass\nclass C: pass\nstate = {}\nlock = make()\n'
                'def later(**_): pass\nkopf.on.resume("a")(later)\n')
    assert kopf_module_problems(handlers) == ["line 7: def helper is not a kopf handler", "line 8: class C",
                                              "line 9: module-level state state", "line 10: module-level state lock"]
    assert _outside_api(Import("v41flash.api.v1alpha1", "v41flash.vllm.args", 1, "", False))
    assert not _outside_api(Import("v41flash.api.v1alpha1", "v41flash.gpus", 1, "", False))


@pytest.fixture
def planted_tree(tmp_path, monkeypatch):
    """A copy of the package the checks read instead of the real one (plant a violation in it)."""
    shutil.copytree(SOURCE / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sys.modules[__name__], "SOURCE", tmp_path)
    modules.cache_clear()
    imports_of.cache_clear()
    yield tmp_path / PACKAGE
    modules.cache_clear()
    imports_of.cache_clear()


@pytest.mark.parametrize("module,planted,chain", [
    # the cycle as it was: the planner's window figures from metrics (whose __init__ loads the parser)
    ("planner/demand.py", "from v41flash.metrics.figures import WindowFigures\n",
     "v41flash.planner.demand:1 `from v41flash.metrics.figures import WindowFigures`"),
    # through another planner module, inside a function
    ("planner/wording.py", "def f():\n    from ..metrics import parse\n",
     "v41flash.planner.wording:2 `from ..metrics import parse`"),
    ("planner/caps.py", "import prometheus_client\n", "v41flash.planner.caps:1 `import prometheus_client`"),
    # the leaf both import, importing the scraper: the planner reaches metrics through it
    ("figures.py", "from v41flash.metrics import window\n",
     "v41flash.planner.datatypes:14 `from v41flash.figures import RouterFigures, WindowFigures` -> "
     "v41flash.figures:1 `from v41flash.metrics import window`"),
])
def test_the_planner_metrics_rule_catches_a_planted_import(planted_tree, module, planted, chain):
    path = planted_tree / module
    path.write_text(planted + path.read_text())
    with pytest.raises(AssertionError) as caught:
        check_does_not_import(["v41flash.planner"], METRICS_IO)
    assert chain in str(caught.value)


# --- one class per name ------------------------------------------------------------------------------------------

def class_homes(paths: dict[str, Path]) -> dict[str, list[str]]:
    """Top-level class name -> the modules that define it."""
    out: dict[str, list[str]] = {}
    for module, path in paths.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(module)
    return out


def test_every_class_name_is_defined_once_in_the_product():
    """Two classes of one name (Decision, Model, Observed were) make a reader guess which one a module means."""
    twice = {name: homes for name, homes in class_homes(modules()).items() if len(homes) > 1}
    assert twice == {}, f"class names defined in more than one module: {twice}"


def test_the_class_name_check_catches_a_second_definition(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("class Decision:\n    pass\n")
    b.write_text("import x\n\n\nclass Decision(x.Base):\n    pass\n\n\ndef f():\n    class Local:\n        pass\n")
    assert class_homes({"v41flash.a": a, "v41flash.b": b}) == {"Decision": ["v41flash.a", "v41flash.b"]}
