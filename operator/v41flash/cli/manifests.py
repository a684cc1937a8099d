"""`v41flash crd | validate | render`: offline tools over V41FlashDeployment manifests."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CRD_PATH = Path("crds") / "v41flash.io_v41flashdeployments.yaml"


# Nesting the reader follows (PyYAML composes nodes recursively); a manifest nested deeper is refused with a clear
# error, never a RecursionError traceback. kvTransfer.extraConfig, the deepest free-form field, allows 8 levels.
MAX_READ_DEPTH = 5000


_QUOTED_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\']|\'\')*\'|[\[\]{}]')


def _flow_depth(text: str) -> int:
    """How deep [ and { nest outside quoted strings: PyYAML's scanner is quadratic in it, so a deep flow collection
    is refused before parsing (in seconds, not minutes)."""
    depth = deepest = 0
    for m in _QUOTED_OR_BRACKET.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
    return deepest


class ManifestError(Exception):
    """A file that cannot be read as YAML manifests: the message says why, in one line."""


def _load_docs(path: str) -> list[Any]:
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot be read: {exc}") from None
    if _flow_depth(text) > MAX_READ_DEPTH:
        raise ManifestError(f"{path}: nested deeper than {MAX_READ_DEPTH} levels: not a manifest this tool reads")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * MAX_READ_DEPTH + 1000))  # Python frames only: the composer, no C recursion
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:
        raise ManifestError(f"{path}: nested deeper than {MAX_READ_DEPTH} levels: not a manifest this tool reads") \
            from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    finally:
        sys.setrecursionlimit(limit)


def _cr_docs(path: str) -> list[dict[str, Any]]:
    from ..api.v1alpha1 import KIND
    return [d for d in _load_docs(path) if isinstance(d, dict) and d.get("kind") == KIND]


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name[:80] if isinstance(name, str) and name else "<unnamed>"


def _never_a_traceback(cmd):
    """Every input ends in a clear error and exit 1: a file that cannot be read, or a bug no check foresaw."""
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except ManifestError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        except Exception as exc:  # noqa: BLE001 - the last net: one line naming the failure, not a traceback
            print(f"{args.filename}: {cmd.__name__.removeprefix('cmd_')} failed: {type(exc).__name__}: "
                  f"{' '.join(str(exc).split())[:300]}", file=sys.stderr)
            return 1
    run.__name__ = cmd.__name__
    return run


def cmd_crd(args: argparse.Namespace) -> int:
    from ..api.crd import crd_yaml
    text = crd_yaml()
    if args.check:
        current = Path(args.output).read_text() if Path(args.output).exists() else ""
        if current != text:
            print(f"{args.output} is out of date with the API models: run `v41flash crd -o {args.output}`",
                  file=sys.stderr)
            return 1
        print(f"{args.output} matches the API models")
        return 0
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    return 0


def _problems(doc: dict[str, Any]) -> list[str]:
    from ..api.validation import validate
    from ..render.checks import operator_checks
    return [str(p) for p in validate(doc, extra_checks=operator_checks())]


@_never_a_traceback
def cmd_validate(args: argparse.Namespace) -> int:
    docs = _cr_docs(args.filename)
    if not docs:
        print(f"{args.filename}: no V41FlashDeployment found", file=sys.stderr)
        return 1
    failed = 0
    for doc in docs:
        name = _name(doc)
        problems = _problems(doc)
        if problems:
            failed += 1
            print(f"{name}: INVALID", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
        else:
            print(f"{name}: valid")
    return 1 if failed else 0


@_never_a_traceback
def cmd_render(args: argparse.Namespace) -> int:
    from ..api.v1alpha1 import V41FlashDeployment
    from ..render import render
    docs = _cr_docs(args.filename)
    if not docs:
        print(f"{args.filename}: no V41FlashDeployment found", file=sys.stderr)
        return 1
    out: list[dict[str, Any]] = []
    for doc in docs:
        problems = _problems(doc)
        if problems:
            print(f"{_name(doc)}: INVALID, nothing rendered", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
        doc.setdefault("metadata", {}).setdefault("namespace", args.namespace)
        out += render(V41FlashDeployment.model_validate(doc))
    from ..render.yamlout import to_yaml  # quotes y/n/on/off that Go YAML readers would turn into booleans
    sys.stdout.write(to_yaml(out))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="print or write the CRD generated from the API models")
    p.add_argument("-o", "--output", default=str(CRD_PATH), help="file to write ('-' = stdout)")
    p.add_argument("--check", action="store_true", help="exit 1 when the file differs from the models")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("validate", help="check V41FlashDeployment manifests offline; each problem names its field")
    p.add_argument("-f", "--filename", required=True, help="YAML file ('-' = stdin)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="print the Kubernetes objects the operator would apply, as YAML")
    p.add_argument("-f", "--filename", required=True, help="YAML file ('-' = stdin)")
    p.add_argument("-n", "--namespace", default="default", help="namespace when the manifest has none")
    p.set_defaults(func=cmd_render)
