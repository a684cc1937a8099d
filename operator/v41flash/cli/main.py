"""`v41flash` command line: one entry point, each subcommand group in its own module.

A module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its subcommands and sets
`func` (a callable taking the parsed args and returning an exit code) on each parser.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "v41flash.cli.manifests",  # render, validate, crd
    "v41flash.cli.operator",  # operator (run the controller)
    "v41flash.cli.profile",  # profile build/show (capacity profiles)
    "v41flash.cli.bench",  # bench autoscale / bench routing
    "v41flash.cli.session_proxy",  # session-proxy (the router pod's front step)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="v41flash",
        description="Operator and tools for DeepSeek-V4.1-Flash disaggregated serving on vLLM.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside the module must surface
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
