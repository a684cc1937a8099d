"""`v41flash bench serve`: measure an OpenAI-compatible endpoint as an honest benchmark does (a V41FlashDeployment
through its front, or any URL), writing DIR/records.jsonl, points.csv/json and the plots; `v41flash bench compare`:
A/B of two such runs on the same requests, refused when they differ in more than the named variable.

Method and record: v41flash_bench/serve/run.py and records.py; docs/benchmarking.md."""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

from v41flash_bench.serve import records as R  # noqa: N812


def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: a comma list of numbers") from None
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"{flag} {text!r}: numbers > 0")
    return vals


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve", help="Measure a deployment or an OpenAI-compatible URL: records.jsonl, plots, CSV/JSON.",
        description="Sends AgentX-shaped agent sessions (or a request log, or fixed lengths) to a "
                    "V41FlashDeployment's front or to a URL, at each load of a sweep (repeated; warm-up excluded; "
                    "stops after the first point that breaks the SLO), and appends one record per point to "
                    "DIR/records.jsonl. Prints a table; writes points.csv, points.json and two PNG plots.")
    t = p.add_argument_group("target (one of --deployment, --url; --url with --deployment: the address to use)")
    t.add_argument("--deployment", help="V41FlashDeployment name: system facts, SLO and $/GPU-h from its CR.")
    t.add_argument("--namespace", "-n", default="default")
    t.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster).")
    t.add_argument("--url", help="OpenAI-compatible base URL (without /v1): a managed API, a port-forward, a Gateway.")
    t.add_argument("--model", help="Model name to send (default: the CR's servedModelName; a --url's only model).")
    t.add_argument("--api-key-env", metavar="VAR", help="Send $VAR as a bearer token.")
    t.add_argument("--price-input", type=float, metavar="USD", help="Managed API: $ per million input tokens.")
    t.add_argument("--price-output", type=float, metavar="USD", help="Managed API: $ per million output tokens.")
    t.add_argument("--price-cached", type=float, metavar="USD", help="Managed API: $ per million cached tokens.")
    t.add_argument("--gpu-hour-price", type=float, metavar="USD",
                   help="Self-hosted TCO $ per GPU-hour (default: the CR's autoscaling.costPerGpuHour).")
    t.add_argument("--gpus", type=int, help="GPUs behind a --url (per-GPU figures); a deployment's come from its CR.")
    t.add_argument("--decode-ranks", type=int, help="Decode DP ranks behind a --url (the decode batch the profile fit "
                                                    "needs); a deployment's come from its CR.")
    t.add_argument("--system", action="append", default=[], metavar="KEY=VALUE",
                   help="Declare a system fact of a --url target (checkpoint, gpu_model, precision, ...).")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=("agentx", "replay", "fixed"), default="agentx")
    w.add_argument("--agentx-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="Change one field of the session shape (v41flash_bench/routing/sessions.py RoutingScenario).")
    w.add_argument("--replay", metavar="FILE", help="JSONL request log: {time, messages, max_tokens[, session]}.")
    w.add_argument("--isl", type=int, default=1000, help="fixed: prompt words (default %(default)s).")
    w.add_argument("--osl", type=int, default=100, help="fixed: output tokens (default %(default)s).")
    w.add_argument("--ignore-eos", action="store_true",
                   help="Ask for exactly max_tokens (always on for fixed; vLLM's extension, not every API takes it).")
    m = p.add_argument_group("method")
    m.add_argument("--concurrency", help="Closed-loop sweep: comma list of client counts (default for fixed: 1,2,4,8).")
    m.add_argument("--rate", help="Open-loop sweep: scripts (sessions, requests) per second; replay: speed-ups.")
    m.add_argument("--warmup", type=float, default=10.0, help="Seconds excluded before each window (%(default)s).")
    m.add_argument("--duration", type=float, default=30.0, help="Seconds of each measured window (%(default)s).")
    m.add_argument("--repeats", type=int, default=3, help="Repeats per point: median and range (%(default)s).")
    m.add_argument("--drain", type=float, default=60.0, help="Seconds in-flight requests may finish after a window.")
    m.add_argument("--seed", type=int,
                   help="Seed of the requests and arrivals (default: a new one per run, recorded: a run never hits "
                        "what an earlier run left in the engines' caches). A/B: give both runs the same seed.")
    m.add_argument("--cold", action="store_true", help="Also record the first warm-up as a point of state cold.")
    m.add_argument("--whole-sweep", action="store_true", help="Measure every point even after the SLO breaks.")
    m.add_argument("--slo-ttft", type=float, metavar="S", help="TTFT target (default: the CR's).")
    m.add_argument("--slo-ttft-percentile", type=float, default=90.0)
    m.add_argument("--slo-e2e-p95", type=float, metavar="S", help="e2e p95 target (default: the CR's).")
    p.add_argument("--out", required=True, help="Output directory (records.jsonl is appended to).")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--job", action="store_true",
                   help="Print a Kubernetes Job that runs this same command next to the deployment, and exit.")
    p.add_argument("--job-image", default="", help="--job: an image with v41flash[bench] installed (required).")
    p.add_argument("--job-pvc", default="", metavar="CLAIM",
                   help="--job: keep DIR on this PersistentVolumeClaim (default: records also go to the log).")
    p.set_defaults(func=cmd_serve)

    c = sub.add_parser(
        "compare", help="A/B: two bench serve runs on the same requests, differing in one named variable.",
        description="Pairs the records of two runs point by point (same load and state) and prints B against A; "
                    "refuses (exit 3) a pair whose system, workload (the requests' digests) or method differ in "
                    "anything but VARIABLE: a record path (system.roles.decode.args.--max-num-seqs), a group "
                    "(system) or a last part (--variable=--max-num-seqs).")
    c.add_argument("a", help="Run A: DIR or records.jsonl.")
    c.add_argument("b", help="Run B: DIR or records.jsonl.")
    c.add_argument("--variable", required=True)
    c.add_argument("--out", help="Write compare.json here.")
    c.set_defaults(func=cmd_compare)


def _slo(args) -> dict | None:
    if args.slo_ttft is None:
        return None
    return {"ttft_s": args.slo_ttft, "ttft_percentile": args.slo_ttft_percentile, "e2e_p95_s": args.slo_e2e_p95}


def headers_for(args) -> dict:
    if not args.api_key_env:
        return {}
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: the variable is not set")
    return {"Authorization": f"Bearer {key}"}


def endpoint_models(url: str, headers: dict) -> list[str] | None:
    """The model ids the endpoint lists at /v1/models; None when it does not answer with a list."""
    import httpx
    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=10)
        return [m["id"] for m in r.json()["data"]] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def build(args):
    """(target, endpoint, workload, loads, method) from the arguments; ValueError/LookupError name the flag."""
    from v41flash_bench.serve.driver import Endpoint, Load
    from v41flash_bench.serve.run import Method, WorkloadSpec
    from v41flash_bench.serve.target import deployment_target, url_target
    from v41flash_bench.serve.workloads import agentx_scenario, parse_sets

    if not args.deployment and not args.url:
        raise ValueError("give --deployment NAME (with --namespace) or --url URL")
    prices = [args.price_input, args.price_output, args.price_cached]
    if any(x is not None for x in prices) and not all(x is not None for x in prices):
        raise ValueError("a managed API's prices are three: --price-input, --price-output, --price-cached")
    if args.deployment and prices[0] is not None:
        raise ValueError("--price-* are a managed API's (with --url alone); a deployment costs --gpu-hour-price")
    if (args.system or args.gpus or args.decode_ranks) and args.deployment:
        raise ValueError("--system, --gpus and --decode-ranks declare a --url target's facts; a deployment's come "
                         "from its CR")
    if args.concurrency and args.rate:
        raise ValueError("give --concurrency (closed loop) or --rate (open loop), not both")
    if args.workload == "replay" and not args.replay:
        raise ValueError("--workload replay needs --replay FILE")
    if args.replay and args.workload != "replay":
        raise ValueError("--replay FILE belongs to --workload replay")
    if args.agentx_set and args.workload != "agentx":
        raise ValueError("--agentx-set belongs to --workload agentx")
    if args.repeats < 1 or args.duration <= 0 or args.warmup < 0:
        raise ValueError("--repeats >= 1, --duration > 0, --warmup >= 0")
    if args.cold and args.warmup <= 0:
        raise ValueError("--cold records the first warm-up: give --warmup > 0")
    overrides = parse_sets(args.agentx_set)
    agentx_scenario(overrides)  # refuses an unknown field now, not after the first point
    if args.rate:
        loads = [Load("rate", v) for v in _floats(args.rate, "--rate")]
    elif args.concurrency:
        loads = [Load("concurrency", int(v)) for v in _floats(args.concurrency, "--concurrency")]
    elif args.workload == "replay":
        loads = [Load("rate", 1.0)]
    elif args.workload == "fixed":
        loads = [Load("concurrency", v) for v in (1, 2, 4, 8)]
    else:
        loads = [Load("rate", v) for v in (0.5, 1, 2, 4)]
    if args.workload == "replay" and any(ld.kind == "concurrency" for ld in loads):
        raise ValueError("a replay keeps its log's times: --rate gives speed-ups, --concurrency does not apply")
    slo = _slo(args)
    if args.deployment:
        target = deployment_target(args.deployment, args.namespace, url=args.url, model=args.model,
                                   kubeconfig=args.kubeconfig, usd_per_gpu_hour=args.gpu_hour_price, slo=slo)
    else:
        models = endpoint_models(args.url, headers_for(args))
        if not args.model and len(models or ()) != 1:
            raise ValueError(f"--url needs --model: the endpoint serves {models or 'an unknown list (no /v1/models)'}")
        declared = parse_sets(args.system)
        target = url_target(args.url, args.model or models[0], declared, gpus=args.gpus,
                            prices=dict(zip(("input", "output", "cached"), prices)) if prices[0] is not None else None,
                            usd_per_gpu_hour=args.gpu_hour_price, slo=slo)
        target.decode_ranks = args.decode_ranks
    headers = headers_for(args)
    models = endpoint_models(target.url, headers)
    target.identity["endpoint_models"] = models
    if models is None:
        target.unknown.append("the endpoint's /v1/models")
    elif target.model not in models:
        raise ValueError(f"the endpoint serves {models}, not {target.model!r} (--model)")
    ep = Endpoint(target.url, target.model, headers, ignore_eos=args.ignore_eos or args.workload == "fixed")
    wl = WorkloadSpec(args.workload, overrides, args.replay or "", args.isl, args.osl)
    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 31)
    method = Method(args.warmup, args.duration, args.repeats, args.drain, seed, args.cold,
                    not args.whole_sweep)
    return target, ep, wl, loads, method


def cmd_serve(args) -> int:
    from v41flash_bench.serve import report
    from v41flash_bench.serve.run import sweep

    if args.job:
        from v41flash_bench.serve.job import job_manifest
        try:
            argv = sys.argv[sys.argv.index("serve") + 1:] if "serve" in sys.argv else []
            sys.stdout.write(job_manifest(argv, args.deployment, args.namespace, args.job_image, args.job_pvc))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        target, ep, wl, loads, method = build(args)
    except (ValueError, LookupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the apiserver's answer (no CR, no access): say it and what to do
        print(f"error: cannot read {args.namespace}/{args.deployment}: {exc.__class__.__name__}: "
              f"{str(exc)[:300]}\n(check --kubeconfig/--namespace and that the CR exists: kubectl get v41f -n "
              f"{args.namespace})", file=sys.stderr)
        return 2
    out = Path(args.out)
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f}s] {msg}", file=sys.stderr, flush=True)

    progress(f"{target.kind} {target.identity.get('deployment') or target.url} at {target.url}, model "
             f"{target.model}; {len(loads)} points × {method.repeats} repeats × ({method.warmup_s:g} + "
             f"{method.duration_s:g}) s; seed {method.seed}; unknown: {', '.join(target.unknown) or 'nothing'}")
    recs = sweep(target, ep, wl, loads, method, out, progress)
    if not recs:
        print("error: no point was measured", file=sys.stderr)
        return 1
    all_recs = R.read(out)
    report.write_tables(all_recs, out)
    print(report.table(recs))
    plots = [] if args.no_plots else report.plot(all_recs, out)
    print(f"records: {out / R.RECORDS} ({len(recs)} new); tables: {out}/points.csv, points.json"
          + (f"; plots: {', '.join(p.name for p in plots)}" if plots else ""))
    return 0


def cmd_compare(args) -> int:
    from v41flash_bench.serve.compare import compare, format_compare
    try:
        a, b = R.read(Path(args.a)), R.read(Path(args.b))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = compare(a, b, args.variable)
    print(format_compare(result))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "compare.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0 if result["comparable"] else 3
