"""`v41flash` command line: one entry point, each subcommand group in its own module.

A module listed in COMMAND_MODULES exposes `register(subparsers)`, which adds its subcommands and sets
`func` (a callable taking the parsed args and returning an exit code) on each parser. Evaluation tooling
(`bench ...`, `profile build`) is not part of this package: the bench extra adds those commands as plugins,
entry points of the group PLUGIN_GROUP (pyproject.toml) whose name is the command's path (`profile.build`: `build`
under `profile`) and whose value is a `register(subparsers)` of the parent's subcommands. Where the extra is not
installed (the operator image), each such command is still listed and says how to install it.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

COMMAND_MODULES = (
    "v41flash.cli.manifests",  # render, validate, crd
    "v41flash.cli.operator",  # operator (run the controller)
    "v41flash.cli.profiles",  # profile show (capacity profiles)
    "v41flash.cli.proxy",  # session-proxy (the session proxy: the benchmarks' baseline front)
    "v41flash.cli.front",  # front-counters (the front pod's counters from Envoy's stats)
)
PLUGIN_GROUP = "v41flash.commands"
PLUGIN_EXTRA = "bench"  # the extra that installs the plugins' package and what it needs


def missing_extra(what: str) -> int:
    print(f"{what} needs the evaluation package (the {PLUGIN_EXTRA} extra): pip install 'v41flash[{PLUGIN_EXTRA}]' "
          f"from a checkout (it is not in the operator image)", file=sys.stderr)
    return 2


def _subcommands(sub: argparse._SubParsersAction,  # type: ignore[type-arg]
                 path: list[str]) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """The subcommands of the command at `path` under `sub` ([] = `sub` itself)."""
    for name in path:
        parser = sub.choices[name]
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub


def _not_installed(exc: ModuleNotFoundError, plugin: metadata.EntryPoint) -> bool:
    """The plugin's package is absent (the image), or a third-party module its extra brings is; a module missing
    inside the plugin's package, or inside this one, is a bug that must surface."""
    top = (exc.name or "").split(".")[0]
    return exc.name == plugin.module.split(".")[0] or top not in (plugin.module.split(".")[0], "v41flash")


def _register_plugins(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for plugin in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        *parent, name = plugin.name.split(".")
        where = _subcommands(sub, parent)
        try:
            plugin.load()(where)
        except ModuleNotFoundError as exc:
            if not _not_installed(exc, plugin):
                raise
            command = " ".join(["v41flash", *parent, name])
            # every argument after the command is taken as it is: no option of the missing command is known here
            # (argv cannot hold a NUL, so nothing looks like an option to this parser)
            p = where.add_parser(name, help=f"(needs the {PLUGIN_EXTRA} extra: not installed)", add_help=False,
                                 prefix_chars="\0")
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=lambda args, command=command: missing_extra(command))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="v41flash",
        description="Operator and tools for DeepSeek-V4.1-Flash disaggregated serving on vLLM.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _register_plugins(sub)
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
