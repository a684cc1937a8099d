"""The data flows one way: the renderer never needs the planner; the planner needs neither the API nor
the Kubernetes client (it shares facts with them through roles.py, defaults.py and gpus.py)."""
from __future__ import annotations

import subprocess
import sys


def modules_loaded_by(module: str) -> set[str]:
    """Every module a fresh interpreter has loaded after importing `module`."""
    out = subprocess.run([sys.executable, "-c", f"import sys, {module}; print('\\n'.join(sys.modules))"],
                         check=True, capture_output=True, text=True).stdout
    return set(out.split())


def _under(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_render_does_not_import_the_planner():
    assert _under(modules_loaded_by("v41flash.render"), "v41flash.planner", "v41flash.controller") == []


def test_planner_imports_neither_the_api_nor_kubernetes():
    loaded = modules_loaded_by("v41flash.planner")
    assert _under(loaded, "v41flash.api", "v41flash.render", "v41flash.controller", "kopf", "kubernetes") == []


def test_rollout_machine_is_pure():
    loaded = modules_loaded_by("v41flash.rollout.machine")
    assert _under(loaded, "v41flash.controller", "v41flash.render", "kopf", "kubernetes") == []
