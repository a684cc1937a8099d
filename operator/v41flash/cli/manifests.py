"""`v41flash crd | validate | render`: offline tools over V41FlashDeployment manifests."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

CRD_PATH = Path("crds") / "v41flash.io_v41flashdeployments.yaml"


def _load_docs(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def _cr_docs(path: str) -> list[dict[str, Any]]:
    from ..api.v1alpha1 import KIND
    return [d for d in _load_docs(path) if d.get("kind") == KIND]


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


def cmd_validate(args: argparse.Namespace) -> int:
    docs = _cr_docs(args.filename)
    if not docs:
        print(f"{args.filename}: no V41FlashDeployment found", file=sys.stderr)
        return 1
    failed = 0
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "<unnamed>")
        problems = _problems(doc)
        if problems:
            failed += 1
            print(f"{name}: INVALID", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
        else:
            print(f"{name}: valid")
    return 1 if failed else 0


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
            print(f"{doc.get('metadata', {}).get('name', '<unnamed>')}: INVALID, nothing rendered", file=sys.stderr)
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
