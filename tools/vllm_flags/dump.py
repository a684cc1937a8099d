"""Snapshot vLLM's own `vllm serve` parser into a JSON file the operator can check argv against.

The operator must never render a flag that the pinned vLLM rejects (a wrong flag is a pod that
crash-loops after a 20-minute weight load), but the operator cannot import vLLM. So this script,
run in a SCRATCH venv that holds the vLLM release wheel, builds the real parser with vLLM's own
`vllm.entrypoints.common.cli_args.make_arg_parser` (what `vllm serve` uses, which calls
`FrontendArgs.add_cli_args` and `AsyncEngineArgs.add_cli_args`) and dumps every accepted option
string plus the field sets of the JSON-valued configs.

Heavy runtime dependencies (torch, CUDA kernels, transformers, ...) cannot be imported on a
CPU-only machine, so they are replaced in `sys.modules` by MagicMocks, exactly as vLLM's own
docs build does (docs/mkdocs/gen_files/generate_argparse.py in the 0.33.0 sdist). No flag is
platform-conditional in 0.33.0 (`current_platform.pre_register_and_update` adds none on
CUDA/ROCm), so the mocks change help defaults at most, never the set of options. Every mocked
module is listed in the output header; a config field whose type came from a mocked module is
recorded with kind "mocked" and is not type-checked.

Regenerate (see docs/decisions/2026-11-30-vllm-flag-snapshot.md):

    python3.11 -m venv /tmp/vllm-flags-venv
    /tmp/vllm-flags-venv/bin/pip download --no-deps vllm==0.33.0 -d /tmp/vllm-wheel
    /tmp/vllm-flags-venv/bin/pip install --no-deps /tmp/vllm-wheel/vllm-0.33.0-*.whl
    /tmp/vllm-flags-venv/bin/pip install pydantic==2.13.5 regex==2026.9.10 msgspec==0.21.1 \
        pyyaml==6.0.3 requests==2.34.2 typing-extensions==4.16.0 packaging==26.3
    /tmp/vllm-flags-venv/bin/python tools/vllm_flags/dump.py \
        --out operator/v41flash/vllm/vllm_0_33_0_serve_flags.json
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import importlib
import importlib.metadata
import json
import sys
import types
import typing
from importlib.machinery import ModuleSpec
from pathlib import Path
from unittest.mock import MagicMock, patch

EXPECTED_VERSION = "0.33.0"
REGENERATE = (
    "/tmp/vllm-flags-venv/bin/python tools/vllm_flags/dump.py "
    "--out operator/v41flash/vllm/vllm_0_33_0_serve_flags.json "
    "(scratch venv with vllm==0.33.0 installed --no-deps; see docs/decisions/2026-11-30-vllm-flag-snapshot.md)"
)
# JSON-valued flags whose config classes the operator renders or the recipe uses.
RENDERED_JSON_FLAGS = (
    "--kv-transfer-config",
    "--eplb-config",
    "--kv-events-config",
    "--attention-config",
    "--kernel-config",
    "--engram-config",
    "--speculative-config",
    "--compilation-config",
)
# `--speculative-config` is parsed as a plain dict and only becomes a SpeculativeConfig inside
# EngineArgs.create_speculative_config, so the parser does not name its class.
DICT_FLAG_CONFIGS = {"--speculative-config": ("vllm.config.speculative", "SpeculativeConfig")}
# Set by create_speculative_config itself, never by the user.
INTERNAL_FIELDS = {"SpeculativeConfig": {"target_model_config", "target_parallel_config"}}

MOCKED: list[str] = []


# ---------------------------------------------------------------- mocking (as vLLM's docs build)
class PydanticMagicMock(MagicMock):
    """A module mock that pydantic can build a schema for (as `Any`)."""

    def __init__(self, *args, **kwargs):
        name = kwargs.get("name")
        super().__init__(*args, **kwargs)
        self.__spec__ = ModuleSpec(name, None)

    def __get_pydantic_core_schema__(self, source_type, handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()


class _PassThroughRegistry:
    @staticmethod
    def register(*args, **kwargs):
        return lambda cls: cls


class _MockModuleBase:  # a real class: a MagicMock base conflicts with ABCMeta
    pass


def _infer_schema(fn, **kwargs) -> str:
    """torch.library.infer_schema stand-in: vllm.ir asserts the output arity."""
    ret = typing.get_type_hints(fn)["return"]
    name = lambda a: getattr(a, "__name__", str(a))  # noqa: E731
    if typing.get_origin(ret) is tuple:
        return "(Tensor x) -> " + ", ".join(name(a) for a in typing.get_args(ret))
    return f"(Tensor x) -> {name(ret)}"


def _mock(name: str, module=None) -> None:
    MOCKED.append(name)
    sys.modules[name] = module if module is not None else PydanticMagicMock(name=name)


def install_base_mocks() -> None:
    _mock("vllm._C", MagicMock())
    _mock("vllm._C_stable_libtorch", MagicMock())
    _mock(
        "vllm.model_executor.custom_op",
        MagicMock(CustomOp=_PassThroughRegistry, PluggableLayer=_PassThroughRegistry),
    )
    _mock("vllm.utils.torch_utils", MagicMock(direct_register_custom_op=lambda *a, **k: None))
    nn = MagicMock(Parameter=object, Module=_MockModuleBase)
    _mock("torch.nn", nn)
    _mock("torch", PydanticMagicMock(name="torch", nn=nn))
    _mock("torch.library", MagicMock(infer_schema=_infer_schema))
    _patch_versions()


def _patch_versions() -> None:
    """Report the wheel's own pins for packages we mocked (vLLM compares torch versions)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in importlib.metadata.requires("vllm") or []:
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator == "==":
                pins[req.name.lower()] = spec.version
    real = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return real(name)
        except importlib.metadata.PackageNotFoundError:
            return pins.get(name.lower(), "0.0.0")

    importlib.metadata.version = version


def with_auto_mock(fn, limit: int = 300):
    """Call fn, mocking each missing module it (lazily) imports, until it succeeds."""
    for _ in range(limit):
        try:
            return fn()
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name in sys.modules:
                raise
            _mock(exc.name)
    raise RuntimeError(f"still missing modules after mocking {limit}: {MOCKED[-10:]}")


# ---------------------------------------------------------------- parser
def build_serve_parser():
    cli_args = with_auto_mock(lambda: importlib.import_module("vllm.entrypoints.common.cli_args"))
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")

    def make():
        parser = argparse_utils.FlexibleArgumentParser(prog="vllm serve")
        # DeviceConfig probes the (absent) GPU when defaults are computed.
        with patch("vllm.config.DeviceConfig.__post_init__"):
            return cli_args.make_arg_parser(parser)

    return with_auto_mock(make)


def _is_mock(obj) -> bool:
    return isinstance(obj, MagicMock)


def _closure_values(fn) -> list:
    return [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]


def describe_value_type(fn) -> dict:
    """Name the parser's `type=` callable: what kind of value the option accepts."""
    if fn is None:
        return {"type": "str"}
    qual = getattr(fn, "__qualname__", repr(fn))
    if qual.startswith("optional_type"):  # '' and 'None' also accepted, meaning None
        inner = _closure_values(fn)
        desc = describe_value_type(inner[0] if inner else None)
        return {**desc, "optional": True}
    if qual.startswith("parse_type"):
        inner = _closure_values(fn)
        return describe_value_type(inner[0] if inner else None)
    if qual.endswith("parse_dataclass"):
        cls = fn.__defaults__[0]
        return {"type": "json_config", "config": cls.__name__, "_cls": cls}
    if fn is json.loads:
        return {"type": "json"}
    if fn in (int, float, str, bool):
        return {"type": fn.__name__}
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "<lambda>" and _probe(fn, "Ab-C") == "ab_c":
        return {"type": "lowercase_str"}  # `lambda s: s.lower().replace("-", "_")` (backend flags)
    return {"type": name}


def _probe(fn, value: str):
    try:
        return fn(value)
    except Exception:
        return None


def describe_action(action: argparse.Action, option: str) -> dict:
    entry: dict = {
        "dest": action.dest,
        "action": type(action).__name__,
        "takes_value": action.nargs != 0,
        "nargs": action.nargs,
        "choices": None,
        "type": None,
        "deprecated": bool(getattr(action, "deprecated", False)),
    }
    if action.nargs == 0:
        negative = getattr(action, "negative_option_strings", None)
        if negative is not None:  # vLLM's EnableDisableAction (--enable-x / --disable-x)
            entry["sets"] = option not in negative
        elif isinstance(action, argparse.BooleanOptionalAction):
            entry["sets"] = not option.startswith("--no-")
        else:
            entry["sets"] = action.const if action.const is not None else True
        entry["boolean"] = isinstance(action, argparse.BooleanOptionalAction)
        entry["type"] = "flag"
        return entry
    vt = describe_value_type(action.type)
    vt.pop("_cls", None)
    entry.update(vt)
    if action.choices is not None and not _is_mock(action.choices):
        entry["choices"] = [c for c in action.choices]
    return entry


def collect_options(parser) -> tuple[dict, list[str], dict]:
    options = {}
    config_classes = {}
    for option, action in sorted(parser._option_string_actions.items()):
        if option in ("-h", "--help"):
            continue
        options[option] = describe_action(action, option)
        if action.nargs != 0:
            vt = describe_value_type(action.type)
            if "_cls" in vt:
                config_classes[option] = vt["_cls"]
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    return options, positionals, config_classes


# ---------------------------------------------------------------- config classes
def _constraints(default) -> dict:
    out = {}
    for meta in getattr(default, "metadata", None) or []:
        for key in ("gt", "ge", "lt", "le", "min_length", "max_length"):
            value = getattr(meta, key, None)
            if value is not None and isinstance(value, int | float):
                out[key] = value
    return out


def describe_type(tp, nested: dict) -> list[dict]:
    """Flatten a field type into the alternatives a JSON value may take."""
    origin = typing.get_origin(tp)
    if tp is type(None) or tp is None:
        return [{"kind": "null"}]
    if origin is typing.Annotated:
        return describe_type(typing.get_args(tp)[0], nested)
    if origin is typing.Union or origin is types.UnionType:
        out = []
        for arg in typing.get_args(tp):
            out.extend(describe_type(arg, nested))
        return out
    if origin is typing.Literal:
        values = [v.value if isinstance(v, enum.Enum) else v for v in typing.get_args(tp)]
        return [{"kind": "literal", "values": values}]
    if _is_mock(tp):
        return [{"kind": "mocked"}]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        # vLLM's before-validators map a string to a member by NAME (case-insensitive); ints by value.
        values = [m.value for m in tp if isinstance(m.value, int) and not isinstance(m.value, bool)]
        return [{"kind": "enum", "name": tp.__name__, "names": list(tp.__members__), "values": values}]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        nested[tp.__name__] = tp
        return [{"kind": "config", "name": tp.__name__}]
    if tp is bool:
        return [{"kind": "bool"}]
    if tp is int:
        return [{"kind": "int"}]
    if tp is float:
        return [{"kind": "float"}]
    if tp is str:
        return [{"kind": "str"}]
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        return [{"kind": "list"}]
    if tp is dict or origin is dict or (isinstance(tp, type) and issubclass(tp, dict)):
        return [{"kind": "dict"}]
    if tp is typing.Any:
        return [{"kind": "any"}]
    if isinstance(tp, typing.TypeVar) or origin is type or callable(tp):
        return [{"kind": "any", "note": repr(tp)}]
    return [{"kind": "any", "note": repr(tp)}]


def describe_config(cls, nested: dict) -> dict:
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # a mocked forward reference: fall back to the raw annotations
        hints = {}
    fields = {}
    internal = INTERNAL_FIELDS.get(cls.__name__, set())
    for f in dataclasses.fields(cls):
        if not f.init or f.name in internal:
            continue
        alternatives = describe_type(hints.get(f.name, f.type), nested)
        if any(a["kind"] == "mocked" for a in alternatives):
            alternatives = [{"kind": "mocked"}]
        fields[f.name] = {"alternatives": alternatives, "constraints": _constraints(f.default)}
    return {"module": cls.__module__, "fields": fields}


def collect_configs(roots: dict[str, type]) -> dict:
    out = {}
    pending = dict(roots)
    while pending:
        name, cls = pending.popitem()
        if name in out:
            continue
        nested: dict = {}
        out[name] = describe_config(cls, nested)
        pending.update({k: v for k, v in nested.items() if k not in out})
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- main
def wheel_identity() -> dict:
    dist = importlib.metadata.distribution("vllm")
    record = dist.read_text("RECORD") or ""
    return {
        "distribution": f"vllm=={dist.version}",
        "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
        "installed_at": str(Path(dist.locate_file("vllm"))),
    }


def build_snapshot() -> dict:
    install_base_mocks()
    version = importlib.metadata.version("vllm")
    if version != EXPECTED_VERSION:
        raise SystemExit(f"expected vllm {EXPECTED_VERSION} in this venv, found {version}")
    parser = build_serve_parser()
    options, positionals, config_classes = collect_options(parser)
    roots = {}
    json_flags = {}
    for flag in RENDERED_JSON_FLAGS:
        action = parser._option_string_actions[flag]
        if flag in DICT_FLAG_CONFIGS:
            module, name = DICT_FLAG_CONFIGS[flag]
            cls = with_auto_mock(lambda m=module, n=name: getattr(importlib.import_module(m), n))
        else:
            cls = config_classes[flag]
        roots[cls.__name__] = cls
        for alias in action.option_strings:
            json_flags[alias] = cls.__name__
    # Every other dataclass-valued flag is also checked, so a typo there is caught too.
    for flag, cls in config_classes.items():
        roots.setdefault(cls.__name__, cls)
        json_flags.setdefault(flag, cls.__name__)
    configs = with_auto_mock(lambda: collect_configs(roots))
    identity = wheel_identity()
    return {
        "header": {
            "vllm_version": version,
            "source": identity["distribution"] + " release wheel (installed --no-deps)",
            "wheel_record_sha256": identity["record_sha256"],
            "parser": "vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser"
            "(prog='vllm serve')) -- the parser `vllm serve` builds",
            "generator": "tools/vllm_flags/dump.py",
            "regenerate": REGENERATE,
            "stubbed_modules": sorted(set(MOCKED)),
            "stub_note": "torch, CUDA kernels and other heavy imports were replaced by MagicMocks "
            "(as vLLM's docs build does); no 0.33.0 flag depends on the platform, so the option "
            "set is exact. Config fields whose type lives in a stubbed module have kind 'mocked'.",
        },
        "positionals": positionals,
        "options": options,
        "json_flags": dict(sorted(json_flags.items())),
        "configs": configs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    snapshot = build_snapshot()
    args.out.write_text(json.dumps(snapshot, indent=1, sort_keys=False, default=str) + "\n")
    print(
        f"wrote {args.out}: {len(snapshot['options'])} option strings, "
        f"{len(snapshot['configs'])} config classes, "
        f"{len(snapshot['header']['stubbed_modules'])} stubbed modules"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
