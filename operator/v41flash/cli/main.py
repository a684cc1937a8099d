"""`v41flash` command line: one entry point, each subcommand group in its own module.

A module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its subcommands and sets
`func` (a callable taking the parsed args and returning an exit code) on each parser. `bench` comes from the
evaluation package v41flash_bench (the `bench` extra, absent from the image); without it the command is still
listed and says how to install it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "v41flash.cli.manifests",  # render, validate, crd
    "v41flash.cli.operator",  # operator (run the controller)
    "v41flash.cli.profiles",  # profile build/show (capacity profiles)
    "v41flash.cli.proxy",  # session-proxy (the router pod's front step)
)
BENCH_PACKAGE = "v41flash_bench"
BENCH_MODULE = "v41flash_bench.cli"  # bench autoscale / bench routing


def missing_extra(what: str) -> int:
    print(f"{what} needs the evaluation package v41flash_bench: pip install 'v41flash[bench]' from a checkout "
          f"(it is not in the operator image)", file=sys.stderr)
    return 2


def _register_bench(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    try:
        module = importlib.import_module(BENCH_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != BENCH_PACKAGE:  # an import error inside the package must surface
            raise
        p = sub.add_parser("bench", help="Benchmarks (needs the bench extra: not installed)", add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args: missing_extra("v41flash bench"))
        return
    module.register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="v41flash",
        description="Operator and tools for DeepSeek-V4.1-Flash disaggregated serving on vLLM.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _register_bench(sub)
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
