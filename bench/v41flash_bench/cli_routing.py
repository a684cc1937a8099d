"""`v41flash bench routing`: every vllm-router policy and our defaults, side by side, on the same trace.

Hooked into `v41flash bench` by `add_routing_parser(bench_subparsers)` (called from v41flash_bench/cli.py); also
runnable alone: `python -m v41flash_bench.cli_routing --out DIR`.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

import yaml


def add_routing_parser(bench_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = bench_subparsers.add_parser(
        "routing",
        help="Routing policies vs the oracle prefix-cache hit rate (real vllm-router + llm-d-inference-sim)",
        description="Replays AgentX-like multi-turn agent sessions (shared system prefix, sub-agents) through "
                    "vllm-router 0.1.17 in front of llm-d-inference-sim engines on 127.0.0.1, once per "
                    "session-key mode (client sends x-session-id / sends nothing) and policy variant. Prints a "
                    "table and writes DIR/report.json (and DIR/logs/).",
    )
    _add_arguments(p)
    p.set_defaults(func=cmd_routing)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from v41flash_bench.routing.runner import DEFAULT_SCENARIO, MODES
    p.add_argument("--out", required=True, help="Output directory (report.json, logs/).")
    p.add_argument("--scenario", default=str(DEFAULT_SCENARIO),
                   help="Scenario YAML: workload, engine latency model, policy variants (default: %(default)s).")
    p.add_argument("--variants", default="",
                   help="Comma-separated variant names to run (default: all in the scenario).")
    p.add_argument("--modes", default="", help=f"Comma-separated session-key modes ({', '.join(MODES)}; default: "
                                               "the scenario's).")
    p.add_argument("--sessions", type=int, default=None, help="Override the scenario's root session count.")
    p.add_argument("--engines", type=int, default=None, help="Override the scenario's engine count.")
    p.add_argument("--markdown", action="store_true", help="Also print the table as Markdown.")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="Override any scenario field, e.g. --set system_tokens=1500 (repeatable).")


def cmd_routing(args: argparse.Namespace) -> int:
    from v41flash_bench.routing.runner import format_markdown, format_table, load_config, results_from_report, run_bench

    overrides: dict[str, object] = {}
    if args.sessions is not None:
        overrides["sessions"] = args.sessions
    if args.engines is not None:
        overrides["engines"] = args.engines
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"bench routing: --set wants FIELD=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[key.strip()] = yaml.safe_load(value)
    if args.modes:
        overrides["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    try:
        cfg = load_config(args.scenario, **overrides)
    except (OSError, ValueError, TypeError) as exc:
        print(f"bench routing: bad scenario {args.scenario}: {exc}", file=sys.stderr)
        return 2
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        known = {v.name: v for v in cfg.variants}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            print(f"bench routing: unknown variants {unknown}; known: {', '.join(known)}", file=sys.stderr)
            return 2
        cfg = type(cfg)(**{**cfg.__dict__, "variants": tuple(known[w] for w in wanted)})
    command = "v41flash bench routing " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if sys.argv[1:3] == ["bench", "routing"] else "v41flash bench routing --out " + shlex.quote(args.out)
    out = Path(args.out)
    # SIGTERM (and SIGINT, which a background shell may have set to ignore) unwind through the
    # benchmark's finally blocks, which stop every engine and router it started.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        report = run_bench(cfg, out, command, progress=lambda line: print(line, flush=True))
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"bench routing: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench routing: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    print()
    results = results_from_report(report)
    print(format_table(results))
    if args.markdown:
        print()
        print(format_markdown(results))
    print(f"\noracle: each root session (and its sub-agents) on one engine, infinite cache; target: hit/oracle "
          f">= 0.95 at running max/mean <= 1.25, no errors. * = our default.\nwrote {out / 'report.json'}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="v41flash bench routing", description=__doc__)
    _add_arguments(p)
    return cmd_routing(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
