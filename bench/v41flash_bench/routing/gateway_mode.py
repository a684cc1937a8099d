"""The routing benchmark's Gateway variant: llm-d's endpoint picker choosing among N simulated engines through
a real Envoy's ext_proc, on the local real cluster (e2e harness), with the trace, oracle and observation of
runner.py.

The picker needs the Kubernetes API (it watches its InferencePool and the pool's pods), so this variant runs
on a cluster started with `python -m e2e.harness up` (`make up`): in a fresh namespace it applies an
aggregated (prefill disabled) `spec.routing.mode: Gateway` V41FlashDeployment with N decode replicas, starts
an operator and the e2e Gateway (e2e/gateway.py: Envoy -> ext_proc -> the picker -> the chosen pod), replays
the trace against Envoy and reads each simulator pod's own /metrics before and after. The simulators get the
scenario's engine flags (KV cache, block size, latency model, max-num-seqs) through the engine container's
V41F_SIM_ARGS, which the e2e supervisor appends last (the simulator keeps a flag's last value).
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from v41flash_bench.local_cluster import ClusterRecords
from v41flash_bench.procs import Proc, cpu_seconds, free_port, proc_start_ticks, spawn, stop_procs
from v41flash_bench.routing import engine_stats as obs
from v41flash_bench.routing import runner as R
from v41flash_bench.routing.sessions import Trace

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "manifests" / "examples" / "aggregated-h200.yaml"
GATEWAY_NAME = "e2e-gateway"  # e2e/gateway.py programs the Gateways of this name
VENV_BIN = REPO / ".venv" / "bin"
OPERATOR_TIMER_S = 3.0  # the operator's periodic tick, as the e2e suite's operators run (e2e.kit.TIMER_INTERVAL_S)
POD_SIM_ARGS_ENV = "V41F_SIM_ARGS"  # read by e2e/supervisor.py from the engine container's env
# GB300 (one NVL72 rack of 18 trays x 4 GPUs in the harness): 18 TP4 replicas fit, so 8 and 16 engines run
# on the same kind of node (4 H200 nodes hold 8 TP4 replicas only).
GPU_PRODUCT = "GB300"
# the flags sim_argv sets that name the engine itself (where it listens, what it serves): the pod's own
POD_OWNED_FLAGS = {"--port": 1, "--model": 1, "--served-model-name": 1}


def pod_sim_args(sc: Any, lat: R.EngineLatency, max_model_len: int, seed: int) -> list[str]:
    """The scenario's simulator flags, as runner.sim_argv gives them to a loopback engine, minus the binary and
    the flags the pod owns (port, model names): appended to the pod's simulator command they make it the same
    engine as the loopback rows' (KV cache blocks, block size, latency model, max-num-seqs, queue, seed)."""
    argv, _ = R.sim_argv(Path("sim"), 0, sc, lat, None, seed, max_model_len)
    out, skip = [], 0
    for tok in argv[1:]:
        if skip:
            skip -= 1
        elif tok in POD_OWNED_FLAGS:
            skip = POD_OWNED_FLAGS[tok]
        elif not tok.startswith("--zmq-endpoint"):  # no KV-event publisher (the picker scores prompts itself)
            out.append(tok)
    return out


def deployment_doc(name: str, engines: int, sim_args: Sequence[str], gpu_product: str = GPU_PRODUCT,
                   model: str = R.MODEL, gateway_spec: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    """The aggregated example as a mode Gateway deployment of exactly `engines` decode replicas (autoscaling
    bounds pinned), its route on the e2e Gateway, the scenario's simulator flags in the engine's env;
    gateway_spec: more spec.routing.gateway fields (the picker's scorer weights)."""
    import shlex
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name}
    spec = doc["spec"]
    spec["model"]["servedModelName"] = model
    spec["gpu"] = {"product": gpu_product}
    spec["decode"] = {**spec.get("decode", {}), "minReplicas": engines, "maxReplicas": engines,
                      "extraEnv": [{"name": POD_SIM_ARGS_ENV, "value": shlex.join(sim_args)}]}
    spec["routing"] = {"mode": "Gateway", "gateway": {**dict(gateway_spec), "httpRoute": {"name": GATEWAY_NAME}}}
    return doc


def gateway_variant_flags(doc: dict[str, Any]) -> tuple[str, ...]:
    """What makes the row what it is, for the report (scorer weights not named are the CRD's defaults)."""
    gw = {k: v for k, v in doc["spec"]["routing"]["gateway"].items() if k != "httpRoute"}
    return ("spec.routing.mode=Gateway", *(f"gateway.{k}={v}" for k, v in sorted(gw.items())),
            f"gpu.product={doc['spec']['gpu']['product']}",
            f"decode.replicas={doc['spec']['decode']['minReplicas']}", "epp=llm-d-inference-scheduler v0.4.0",
            "envoy=1.40.0 ext_proc")


class ClusterMissing(RuntimeError):
    """No running harness cluster."""


def _wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


class LocalCluster(ClusterRecords):
    """The running harness cluster as this benchmark uses it: through its state directory and commands (kubectl,
    `v41flash operator`, `python -m e2e.gateway`), never by importing e2e. The processes it starts are registered in
    the cluster's pids.json, so `python -m e2e.harness down` stops them if this run cannot."""

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([str(VENV_BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def core(self) -> Any:
        from kubernetes import client, config
        return client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))

    def supervised_now(self, namespace: str, kind: str) -> list[dict[str, Any]]:
        """The supervisor's sims.json entries of one namespace and kind whose process runs now."""
        return [s for s in self.supervised() if s["namespace"] == namespace and s["kind"] == kind
                and proc_start_ticks(s["pid"]) == s["start"]]

    def start(self, name: str, argv: list[str], **kw: Any) -> Proc:
        proc = spawn(name, argv, self.logs / f"{name}.log", **kw)
        self.register(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        stop_procs([proc], timeout=15)
        self.unregister(proc.name)

    def start_operator(self, namespace: str) -> Proc:
        """`v41flash operator` watching one namespace, on its own loopback ports, as the e2e suite runs it."""
        argv = [str(VENV_BIN / "v41flash"), "operator", "--kubeconfig", str(self.kubeconfig), "--bind-address",
                "127.0.0.1", "--metrics-port", str(free_port()), "--health-port", str(free_port()),
                "--leader-election-id", f"bench-operator-{namespace}", "--timer-interval-seconds",
                f"{OPERATOR_TIMER_S:g}", "--namespace", namespace]
        return self.start(f"operator-{namespace}", argv, env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})

    def start_gateway(self, name: str = GATEWAY_NAME) -> Proc:
        """The e2e Gateway's data plane (`python -m e2e.gateway`: Envoy programmed from the HTTPRoutes)."""
        return self.start(f"gateway-{name}", [str(VENV_BIN / "python"), "-m", "e2e.gateway", "--state",
                                              str(self.state), "--name", name],
                          cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def gateway_address(self, namespace: str, name: str = GATEWAY_NAME) -> str | None:
        """http://127.0.0.1:PORT of Gateway <namespace>/<name> once a route attached to it is programmed."""
        try:
            info = json.loads((self.state / "gateway" / "gateway.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        addr = (info.get("gateways") or {}).get(f"{namespace}/{name}")
        return f"http://{addr}" if addr else None


def _pods_ready(core: Any, ns: str, name: str, engines: int) -> bool:
    pods = [p for p in core.list_namespaced_pod(ns, label_selector=f"v41flash.io/deployment={name}").items
            if not p.metadata.deletion_timestamp]
    ready = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
    roles = [p.metadata.labels.get("v41flash.io/role") for p in ready]
    return roles.count("decode") == engines and roles.count("epp") >= 1


def _sim_urls(cluster: LocalCluster, ns: str) -> dict[str, str]:
    """pod name -> the URL of its simulator (the engine itself, read directly: not through the Gateway)."""
    return {s["pod"]: f"http://{s['ip']}:{s['port']}" for s in cluster.supervised_now(ns, kind="sim")}


def run_gateway(cfg: R.BenchConfig, trace: Trace, oracle_rates: dict[int, float], mode: str, variant: R.Variant,
                log_dir: Path, progress: Callable[[str], None] = print) -> R.RunResult:
    """One Gateway-mode row: deploy, wait Ready, start Envoy, replay through it, scrape the engine pods, clean up."""
    cluster = LocalCluster()
    if not cluster.is_up():
        raise ClusterMissing("the Gateway variant runs on the local cluster: start it with `python -m e2e.harness "
                             "up` (make up), and `python -m e2e.harness down` after")
    core = cluster.core()
    sc = cfg.scenario
    n = sc.engines
    ns = f"rbench-{uuid.uuid4().hex[:6]}"
    name = "rb"
    doc = deployment_doc(name, n, pod_sim_args(sc, cfg.latency, R.model_len_for(trace), sc.seed),
                         gateway_spec=variant.gateway_spec)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "deployment.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    op = gw = None
    notes: list[str] = [f"namespace {ns}; one seed for all engines ({sc.seed}): the pods share one env"]
    try:
        cluster.kubectl("create", "namespace", ns)
        op = cluster.start_operator(ns)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        t0 = time.monotonic()
        _wait(lambda: _pods_ready(core, ns, name, n), 300, f"{n} decode pods and the picker Ready")
        progress(f"  {n} engine pods and the endpoint picker Ready in {time.monotonic() - t0:.0f}s")
        gw = cluster.start_gateway()
        base = _wait(lambda: cluster.gateway_address(ns), 120, f"Gateway {ns}/{GATEWAY_NAME} programmed")
        urls = _wait(lambda: (lambda u: u if len(u) == n else None)(_sim_urls(cluster, ns)), 60,
                     f"{n} simulators in sims.json")
        epp = [e["pid"] for e in cluster.supervised_now(ns, kind="epp")]
        return asyncio.run(_measure(cfg, trace, oracle_rates, mode, variant, base, urls, doc, notes, progress,
                                    epp[0] if len(epp) == 1 else None))
    finally:
        for f in cluster.logs.glob(f"epp-{ns}-*.log"):  # the picker's log, before `harness down` removes it
            shutil.copy(f, log_dir / f.name)
        if gw is not None:
            cluster.stop(gw)
        if op is not None:
            cluster.stop(op)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


async def _measure(cfg: R.BenchConfig, trace: Trace, oracle_rates: dict[int, float], mode: str, variant: R.Variant,
                   base: str, urls: dict[str, str], doc: dict[str, Any], notes: list[str],
                   progress: Callable[[str], None], epp_pid: int | None = None) -> R.RunResult:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.run_timeout_s), limits=limits) as client:
        # the path works end to end before the clock starts (a short prompt sharing nothing with the trace)
        probe = {"model": R.MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "gateway probe"}]}
        deadline = time.monotonic() + 90
        while True:
            try:
                if (await client.post(f"{base}/v1/chat/completions", json=probe, timeout=10)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no 200 through the Gateway {base} in 90 s")
            await asyncio.sleep(1.0)
        pods = sorted(urls)
        before = {p: await R._scrape(client, urls[p]) for p in pods}
        cpu0, t0 = cpu_seconds(epp_pid) if epp_pid else None, time.monotonic()
        latencies, errors, total = await R._replay(client, base, trace, mode, variant, cfg.run_timeout_s)
        wall, cpu1 = time.monotonic() - t0, cpu_seconds(epp_pid) if epp_pid else None
        after = {p: await R._scrape(client, urls[p]) for p in pods}
    progress(f"  replayed {total} requests through {base} in {wall:.1f}s")
    usage = [obs.engine_usage(p, before[p], after[p], wall) for p in pods]
    o = obs.observe(usage)
    return R.RunResult(
        mode=mode, variant=variant.name, policy=variant.policy, ours=variant.ours,
        router_args=gateway_variant_flags(doc), requests=total, errors=errors, hit_rate=o.hit_rate,
        oracle_hit_rate=oracle_rates[len(pods)], running_spread=o.running_spread, uncached_spread=o.uncached_spread,
        request_spread=o.request_spread, p50_ms=R._ms(R.percentile(latencies, 0.5)),
        p95_ms=R._ms(R.percentile(latencies, 0.95)),
        # router cpu: the picker's
        router_cpu_s=(cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None, wall_s=round(wall, 2),
        engines=tuple({"engine": i, "pod": u.engine, "role": "both", "prompt_tokens": u.prompt_tokens,
                       "hit_tokens": u.hit_tokens, "requests": u.requests, "mean_running": u.mean_running}
                      for i, u in enumerate(usage)),
        notes=tuple(notes),
    )
