"""`v41flash profile build`: fit a capacity profile from a benchmark run (evaluation tooling: numpy).

A command of the v41flash CLI that this package adds (pyproject.toml, entry points ``v41flash.commands``):
``register`` gets the subcommands of `v41flash profile`, whose `show` is the product's (v41flash/cli/profiles.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from v41flash_bench.profiles.fit import build_profile


def register(profile_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    build = profile_subparsers.add_parser(
        "build", help="fit a capacity profile from measured (ISL, TTFT, batch, ITL) points")
    build.add_argument("--from", dest="source", required=True, type=Path,
                       help="`v41flash bench serve` records (records.jsonl or its directory), or a benchmark-run "
                            "JSON (or YAML)")
    build.add_argument("--hold-out", metavar="LOAD",
                       help="records: leave the points at this load out of the fit (concurrency=8, rate=2) and print "
                            "what the profile predicts there against what was measured")
    build.add_argument("--out", type=Path, help="profile YAML to write (default: stdout)")
    build.add_argument("--name", help="metadata.name of the new profile (default: from the run)")
    build.add_argument("--no-base", action="store_true", help="do not fill unmeasured fields from a shipped profile")
    build.set_defaults(func=_build)


def _is_records(path: Path) -> bool:
    return path.is_dir() or path.suffix == ".jsonl"


def _read_run(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _build(args: argparse.Namespace) -> int:
    records = None
    try:
        if _is_records(args.source):
            from v41flash_bench.profiles.from_records import run_from_records
            from v41flash_bench.serve.records import read
            records = read(args.source)
            run = run_from_records(records, held_out=args.hold_out, name=args.name)
        elif args.hold_out:
            raise ValueError("--hold-out needs bench serve records (records.jsonl)")
        else:
            run = _read_run(args.source)
        if args.name:
            run["name"] = args.name
        if args.no_base:
            run["base"] = None
        profile, fits = build_profile(run)
    except (OSError, ValueError, KeyError, ValidationError) as exc:
        print(f"profile build: {args.source}: {exc}", file=sys.stderr)
        print("records: docs/benchmarking.md; the run format: docs/decisions/2026-11-30-capacity-profiles.md",
              file=sys.stderr)
        return 1
    header = f"# Capacity profile {profile.metadata.name}: fitted by `v41flash profile build --from {args.source.name}`\n"
    text = header + profile.to_yaml()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    if records is not None and args.hold_out:
        from v41flash_bench.profiles.from_records import check_held_out
        for row in check_held_out(profile, records, args.hold_out):
            print(f"held out {row['load']}: {row['figure']}: predicted {row['predicted']:.4g}, measured "
                  f"{row['measured']:.4g} ({row['error']:+.1%})", file=sys.stderr)
    for role, fit in fits.items():
        print(
            f"{role}: {fit.points} points, mean |error| {fit.mean_relative_error:.1%}, max {fit.max_relative_error:.1%}"
            + (f" -> {args.out}" if args.out else ""),
            file=sys.stderr,
        )
    return 0
