"""`v41flash bench ...`: benchmarks (the evaluation package; a plugin of the v41flash CLI, pyproject's entry points
``v41flash.commands``). `bench autoscale` compares autoscaling policies in the simulator.

Other benchmark kinds register further sub-subcommands on the same `bench` parser (see
``BENCH_COMMANDS``), so `bench routing` can live next to `bench autoscale`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def planner_overrides(items: list[str]) -> dict:
    """['service_cv2=1.0', ...] → {'service_cv2': 1.0}; unknown fields and bad values are refused."""
    import yaml

    from v41flash.planner.datatypes import PlannerConfig

    fields = PlannerConfig.knobs()  # by name, whatever step's group holds it
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"{item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        value = yaml.safe_load(raw)
        default = fields[name][1].default
        if isinstance(default, bool) and not isinstance(value, bool) or \
                isinstance(default, (int, float)) and not isinstance(default, bool) and \
                (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{item!r}: {name} takes a {type(default).__name__}")
        out[name] = value
    return out


def _suite(args: argparse.Namespace, policies: tuple[str, ...] | None, overrides: dict) -> int:
    from v41flash_bench.sim.suite import HELD_OUT_SEEDS, format_summary, parse_seeds, run_suite, seeds_text

    if args.duration is not None or args.seed is not None:
        print("error: --duration and --seed apply to --scenario; a suite's scenarios come from --seeds",
              file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(args.seeds or "")
    except ValueError as exc:
        print(f"error: --seeds: {exc} (e.g. --seeds {seeds_text(HELD_OUT_SEEDS)})", file=sys.stderr)
        return 2
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    progress(f"suite {args.suite}: {len(seeds)} scenarios (seeds {args.seeds}), jobs {args.jobs}")
    report = run_suite(args.suite, seeds, Path(args.out), policies=policies, jobs=max(1, args.jobs),
                       plots=not args.no_plots, progress=progress, planner_overrides=overrides, router=args.router,
                       router_session_ttl_s=args.router_session_ttl, ceiling_headroom=args.ceiling_headroom,
                       fast_starts=args.fast_starts)
    print(format_summary(report))
    if report.get("targets"):
        print("targets (ours): " + ", ".join(f"{k}={v}" for k, v in report["targets"].items()))
    print(f"{time.perf_counter() - started:.0f}s; report: {Path(args.out) / 'report.json'}")
    return 0


def _autoscale(args: argparse.Namespace) -> int:
    from v41flash_bench.sim.autoscale_bench import format_table, run_benchmark
    from v41flash_bench.sim.oracle import check_headroom
    from v41flash_bench.sim.scenario import POLICIES, load_scenario, with_router

    policies = None
    if args.policies:
        policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            print(f"error: unknown policies {unknown}; choose from {', '.join(POLICIES)}", file=sys.stderr)
            return 2
    try:
        check_headroom(args.ceiling_headroom)
    except ValueError as exc:
        print(f"error: --ceiling-headroom: {exc}", file=sys.stderr)
        return 2
    if args.router_session_ttl is not None and not args.router_session_ttl > 0:
        print(f"error: --router-session-ttl {args.router_session_ttl:g}: give seconds > 0", file=sys.stderr)
        return 2
    if (args.scenario is None) == (args.suite is None):
        print("error: give exactly one of --scenario FILE or --suite NAME --seeds A-B", file=sys.stderr)
        return 2
    try:
        overrides = planner_overrides(args.planner_set or [])
    except ValueError as exc:
        print(f"error: --planner-set: {exc}", file=sys.stderr)
        return 2
    if args.suite is not None:
        return _suite(args, policies, overrides)
    if args.seeds is not None:
        print("error: --seeds belongs to --suite (use --seed with --scenario)", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario)
    except (OSError, ValueError) as exc:
        print(f"error: cannot load scenario {args.scenario}: {exc}", file=sys.stderr)
        return 2
    if args.seed is not None:
        sc = sc.model_copy(update={"seed": args.seed})
    if args.duration is not None and args.duration <= sc.warmup_s:
        print(f"error: --duration {args.duration:g} leaves no scored window after the scenario's {sc.warmup_s:g} s "
              f"warm-up: give more than {sc.warmup_s:g}", file=sys.stderr)
        return 2
    if args.router is not None or args.router_session_ttl is not None:
        sc = with_router(sc, args.router, args.router_session_ttl)
    if args.fast_starts:
        from v41flash_bench.sim.scenario import with_startup
        from v41flash_bench.sim.startup import FAST
        sc = with_startup(sc, FAST)
    out = Path(args.out)
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    report = run_benchmark(sc, out, policies=policies, duration=args.duration, progress=progress,
                           plots=not args.no_plots, jobs=max(1, args.jobs), planner_overrides=overrides,
                           ceiling_headroom=args.ceiling_headroom)
    print(f"scenario {sc.name}: {report['duration_s']:.0f} s simulated, SLO TTFT p{sc.slo.ttft_percentile * 100:g} "
          f"≤ {sc.slo.ttft_s:g}s and e2e p95 ≤ {sc.slo.e2e_p95_s:g}s; ${sc.cost_per_gpu_hour:g}/GPU-h; "
          f"tokens = cached + uncached prompt + output")
    print(format_table(report))
    orc = report.get("oracle") or {}
    if orc.get("pooled_lower_bound_gpu_hours"):
        print(f"oracle: prefill scale {orc['prefill_scale']:g} of the pooled-queue need; pooled lower bound "
              f"{orc['pooled_lower_bound_gpu_hours']:.1f} GPU-h (perfect load balancing, no cache affinity, "
              f"no start-up time; not simulated)")
    rel = report.get("relative") or {}
    if rel:
        print("ours GPU-hours relative to: " + ", ".join(f"{k.split('_vs_')[1]} {v:.2f}×" for k, v in rel.items()))
    speed = report["simulator_speed"]
    if speed:
        best = max((v for v in speed.values() if v.get("requests_per_cpu_s")), key=lambda v: v["requests"], default=None)
        if best:
            print(f"simulator speed: {best['requests']} requests over {best['simulated_s']:.0f} simulated s in "
                  f"{best['cpu_s']:.1f} CPU-s ({best['requests_per_cpu_s']:.0f} requests per CPU-second, one core)")
    print(f"report: {out / 'report.json'}" + ("" if args.no_plots else f"; plots: {out}/*.png"))
    return 0


def register(subparsers) -> None:
    from v41flash_bench.sim.scenario import POLICIES
    from v41flash_bench.sim.simulator import ROUTERS

    bench = subparsers.add_parser("bench", help="Benchmarks (autoscaling simulator, ...).")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    a = sub.add_parser(
        "autoscale",
        help="Compare autoscaling policies on one scenario in the P/D serving simulator.",
        description="Simulate a scenario (bench/scenarios/*.yaml) under each policy on the same workload and "
        "write DIR/report.json plus PNG plots. Prints the comparison table.",
    )
    a.add_argument("--scenario", help="Scenario YAML file (or --suite).")
    a.add_argument("--suite", help="Run a drawn scenario suite under this name instead of one file "
                   "(families, ranges and seeds: v41flash_bench/sim/suite.py, TUNING_SEEDS and HELD_OUT_SEEDS).")
    a.add_argument("--seeds", help="Suite seeds, one scenario each: 'A-B' or a comma list (with --suite).")
    a.add_argument("--out", required=True, help="Output directory (report.json, *.png).")
    a.add_argument("--policies", help=f"Comma-separated subset of: {','.join(POLICIES)}.")
    a.add_argument("--ceiling-headroom", type=float, default=1.0, metavar="H",
                   help="The no-foresight ceiling's standing headroom: H × the most the oracle's per-minute need "
                        "has reached so far, never released (default: %(default)s).")
    a.add_argument("--duration", type=float, help="Override the scenario's simulated seconds (quick runs).")
    a.add_argument("--seed", type=int, help="Override the scenario's seed.")
    a.add_argument("--no-plots", action="store_true", help="Skip the PNG plots.")
    a.add_argument("--fast-starts", action="store_true",
                   help="Give every deployment spec.startup's fast options (Run:ai streamer, a prefetched node-local "
                        "weight cache) and a warm compile cache: the simulated cold starts shorten by their published "
                        "factors (sim/startup.py); the policies are not told.")
    a.add_argument("--router", choices=ROUTERS,
                   help="Replace the scenarios' deployment.router: cache_aware (cost-based, the default), "
                        "sticky_least_loaded and vllm_cache_aware (vllm-router's, as the operator renders them).")
    a.add_argument("--router-session-ttl", type=float, metavar="S",
                   help="sticky_least_loaded: seconds an idle session counts on its engine (default: what the "
                        "operator renders, 600; vllm-router's own default is 7200).")
    a.add_argument("--planner-set", action="append", metavar="FIELD=VALUE",
                   help="Change one PlannerConfig field for 'ours' (repeatable; an ablation, e.g. service_cv2=1.0).")
    a.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="Simulations run in parallel processes (results do not depend on it; default: %(default)s).")
    a.set_defaults(func=_autoscale)
    from v41flash_bench.cli_routing import add_routing_parser  # `bench routing` lives in its own module
    add_routing_parser(sub)
    from v41flash_bench.front_bench import add_parser as add_front_parser  # `bench front`
    add_front_parser(sub)
    from v41flash_bench.operator_load import add_parser as add_operator_parser  # `bench operator`
    add_operator_parser(sub)
    from v41flash_bench.sim.forecastability import add_parser as add_forecastability_parser  # `bench forecastability`
    add_forecastability_parser(sub)
    from v41flash_bench.sim.traces import add_parser as add_trace_shape_parser  # `bench trace-shape`
    add_trace_shape_parser(sub)
    from v41flash_bench.serve.cli import add_parsers as add_serve_parsers  # `bench serve`, `bench compare`
    add_serve_parsers(sub)
