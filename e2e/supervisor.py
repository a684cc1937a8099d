#!/usr/bin/env python3
"""Plays kubelet for the simulated pods: watches pods labelled v41flash.io/role and, for each Running pod
with an IP (inside 127.0.0.0/8), runs

  * prefill/decode pods: one llm-d-inference-sim bound to <podIP>:<port> with the pod's vLLM settings
    (served model name, max-num-seqs, data-parallel size, max-model-len) and role-dependent latencies;
  * router pods: the real vllm-router with exactly the container's rendered arguments, except that it
    binds to the pod IP and discovers pods through the local apiserver (KUBECONFIG); and, when the pod
    has one, the session proxy (`v41flash session-proxy`) from its container's command, bound to the pod
    IP and forwarding to the router there (pods share 127.0.0.1 here, so "loopback" becomes the pod IP).
    The pod is Ready when every one of its processes is;
  * an engine pod whose container sets V41F_HOSTILE_METRICS=flood|drip: e2e/hostile_metrics.py instead of the
    simulator (healthy, but its /metrics floods or drips), for the scraper's e2e test.

The process stops when the pod is deleted or stops running; a crashed process is restarted with backoff
(like a container restart). State: <state>/sims.json; logs: <state>/logs/{sim,router,hostile}-<ns>-<pod>.log.
Started (`python -m e2e.supervisor --state DIR`) and stopped by e2e/harness.py; on SIGTERM it stops every
process it started.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.harness import VENV_BIN, Tools, log, write_json
from v41flash_bench.inference_sim import FAIL_START, SimKnobs, SimLatency, sim_command, split_knobs
from v41flash_bench.procs import Proc, spawn, stop_procs

ROLE_LABEL = "v41flash.io/role"
SELECTOR = f"{ROLE_LABEL} in (prefill,decode,router)"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
DEFAULT_VLLM_PORT = 8000
SIM_KV_BLOCKS_PER_ENGINE = 65536  # x 16 tokens: ~1M cached tokens per engine (DP rank)

# Simulated engine behaviour. Every engine can run a whole request (an aggregated deployment uses role
# decode), so all get prefill costs; prefill engines are tuned for prompt throughput, decode engines for
# inter-token latency. Latency grows linearly with running requests up to x2 at max-num-seqs. Extra args
# per role can be appended with V41F_SIM_ARGS_PREFILL / V41F_SIM_ARGS_DECODE (benchmarks), and per pod with
# the engine container's env V41F_SIM_ARGS (a deployment's spec.<role>.extraEnv; real vLLM ignores it).
SIM_BLOCK_SIZE = 16
SIM_KV_TRANSFER_MS = 10.0
SIM_ROLE_LATENCY = {
    "prefill": SimLatency(prefill_overhead_ms=15, prefill_us_per_token=20, inter_token_ms=20, time_factor_under_load=2.0),
    "decode": SimLatency(prefill_overhead_ms=25, prefill_us_per_token=40, inter_token_ms=10, time_factor_under_load=2.0),
}
POD_SIM_ARGS_ENV = "V41F_SIM_ARGS"
# An engine container with V41F_HOSTILE_METRICS=flood|drip gets e2e/hostile_metrics.py instead of the simulator:
# healthy, but its /metrics floods or drips (the scraper's byte cap and deadline under test).
HOSTILE_METRICS_ENV = "V41F_HOSTILE_METRICS"
HOSTILE_METRICS = Path(__file__).resolve().parent / "hostile_metrics.py"
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/env"}


# ---------------------------------------------------------------------------------------------------
# pure helpers: pod spec -> command line

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_vars(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion of command/args: unknown references stay as written, $$ escapes $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, s)


_FIELDS = {"metadata.name": lambda p: p["metadata"]["name"],
           "metadata.namespace": lambda p: p["metadata"]["namespace"],
           "metadata.uid": lambda p: p["metadata"].get("uid", ""),
           "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
           "spec.serviceAccountName": lambda p: p["spec"].get("serviceAccountName", ""),
           "status.podIP": lambda p: p.get("status", {}).get("podIP", ""),
           "status.hostIP": lambda p: p.get("status", {}).get("hostIP", "")}


def container_env(pod: dict, container: dict) -> dict[str, str]:
    """A container's env with literal values and downward-API fieldRefs resolved (others are skipped)."""
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand_vars(str(e["value"]), env)
            continue
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", ref)
        if m:
            env[e["name"]] = pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
        elif ref in _FIELDS:
            env[e["name"]] = _FIELDS[ref](pod)
    return env


def command_tokens(container: dict, env: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expanded; a `sh -c "<script>"` wrapper is split into its words."""
    toks = [expand_vars(str(t), env) for t in (container.get("command") or []) + (container.get("args") or [])]
    if toks and toks[0] in SHELLS and "-c" in toks:
        i = toks.index("-c")
        if i + 1 < len(toks):
            script = toks[i + 1].split("&&")[-1]  # the last command of `a && b && exec vllm serve ...`
            toks = [t for t in shlex.split(script) if t != "exec"]
    return toks


def flag_values(tokens: list[str], name: str) -> list[str] | None:
    """Values after --name (or --name=v) up to the next option; None when the flag is absent."""
    for i, t in enumerate(tokens):
        if t == name:
            vals = []
            for v in tokens[i + 1:]:
                if v.startswith("-") and not _is_number(v):
                    break
                vals.append(v)
            return vals
        if t.startswith(name + "="):
            return [t[len(name) + 1:]]
    return None


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _int_flag(tokens, *names, default=None):
    for n in names:
        v = flag_values(tokens, n)
        if v:
            return int(v[0])
    return default


@dataclass(frozen=True)
class VllmArgs:
    served_names: tuple
    port: int
    max_num_seqs: int | None
    max_model_len: int | None
    dp_ranks: int          # engines (DP ranks) this pod's API server fronts
    headless: bool


def parse_vllm(tokens: list[str], container_port: int | None = None) -> VllmArgs:
    """The settings a simulator needs from a `vllm serve` command line."""
    model = None
    if "serve" in tokens:
        i = tokens.index("serve")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            model = tokens[i + 1]
    model = (flag_values(tokens, "--model") or [model])[0]
    names = tuple(flag_values(tokens, "--served-model-name") or ([model] if model else []))
    if not names:
        raise ValueError("no model: neither `vllm serve <model>`, --model nor --served-model-name")
    dp = _int_flag(tokens, "--data-parallel-size", "-dp", default=1)
    local = _int_flag(tokens, "--data-parallel-size-local", "-dpl")
    ranks = 1 if flag_values(tokens, "--data-parallel-rank") is not None else (local or dp)
    return VllmArgs(served_names=names,
                    port=_int_flag(tokens, "--port", default=container_port or DEFAULT_VLLM_PORT),
                    max_num_seqs=_int_flag(tokens, "--max-num-seqs"),
                    max_model_len=_int_flag(tokens, "--max-model-len"),
                    dp_ranks=ranks, headless="--headless" in tokens)


def pod_sim_command(binary: str, role: str, pod_ip: str, v: VllmArgs, extra: list[str] = ()) -> tuple[list[str], dict]:
    """llm-d-inference-sim argv and env for one vLLM pod.

    vLLM's API server fronts all of the pod's DP ranks on one port (--max-num-seqs is per rank); the
    simulator's own --data-parallel-size would put rank r on port+r instead, where neither clients nor the
    router send anything. So one simulated engine on the pod's port stands for all its ranks, with their
    summed concurrency and KV blocks."""
    return sim_command(binary, bind_host=pod_ip, port=v.port, served_names=v.served_names,
                       max_num_seqs=(v.max_num_seqs or 256) * v.dp_ranks, max_model_len=v.max_model_len or 262144,
                       kv_cache_blocks=SIM_KV_BLOCKS_PER_ENGINE * v.dp_ranks, block_size=SIM_BLOCK_SIZE,
                       latency=SIM_ROLE_LATENCY[role], kv_transfer_ms=SIM_KV_TRANSFER_MS, extra=extra)


def hostile_command(pod_ip: str, port: int, mode: str) -> list[str]:
    """e2e/hostile_metrics.py argv for one engine pod (ValueError naming the variable on an unknown mode)."""
    from e2e.hostile_metrics import MODES
    if mode not in MODES:
        raise ValueError(f"{HOSTILE_METRICS_ENV}={mode!r}: one of {', '.join(MODES)}")
    return [sys.executable, str(HOSTILE_METRICS), "--host", pod_ip, "--port", str(port), "--mode", mode]


def start_plan(knobs: SimKnobs, now: float) -> tuple[float, str]:
    """When to start a pod's simulator (monotonic seconds) and why never (``problem``): a start delay holds the
    pod Running and unready for that long; a forced start failure keeps it unready for good."""
    if knobs.fail_start:
        return float("inf"), f"forced start failure ({FAIL_START})"
    return now + knobs.start_delay_s, ""


def router_command(tokens: list[str], pod_ip: str, log_dir: str) -> list[str]:
    """vllm-router argv from the rendered container: same flags, bound to the pod IP, logs in the state dir."""
    start = None
    for i, t in enumerate(tokens):
        if os.path.basename(t) == "vllm-router" or t in ("vllm_router.launch_router", "vllm_router"):
            start = i + 1
    flags = tokens[start:] if start is not None else tokens
    out: list[str] = []
    skip = 0
    for i, t in enumerate(flags):
        if skip:
            skip -= 1
            continue
        name = t.split("=", 1)[0]
        if name in ("--host", "--prometheus-host", "--log-dir"):
            skip = 0 if "=" in t else 1
            continue
        out.append(t)
    return [str(VENV_BIN / "vllm-router"), *out, "--host", pod_ip, "--prometheus-host", pod_ip,
            "--log-dir", log_dir]


def is_session_proxy(container: dict) -> bool:
    return "session-proxy" in [str(t) for t in (container.get("command") or []) + (container.get("args") or [])]


def proxy_container(pod: dict) -> dict | None:
    return next((c for c in pod["spec"]["containers"] if is_session_proxy(c)), None)


def proxy_command(tokens: list[str], pod_ip: str) -> tuple[list[str], int]:
    """`v41flash session-proxy` argv from the rendered container, listening on the pod IP and forwarding to
    the router on the pod IP (the rendered 127.0.0.1 is shared by every pod on this machine); and its port."""
    i = tokens.index("session-proxy")
    flags = list(tokens[i + 1:])
    port = None
    for j, t in enumerate(flags):
        if t == "--listen" and j + 1 < len(flags):
            port = int(flags[j + 1].rpartition(":")[2])
            flags[j + 1] = f"{pod_ip}:{port}"
        elif t == "--upstream" and j + 1 < len(flags):
            flags[j + 1] = re.sub(r"^(https?://)(127\.0\.0\.1|localhost|\[::1\])(?=[:/]|$)", rf"\g<1>{pod_ip}",
                                  flags[j + 1])
    if port is None:
        raise ValueError("session-proxy container without --listen HOST:PORT")
    return [str(VENV_BIN / "v41flash"), "session-proxy", *flags], port


def has_router(pod: dict) -> bool:
    """A router pod with a vllm-router container (a rollout's front runs the session proxy alone)."""
    for c in pod["spec"]["containers"]:
        toks = (c.get("command") or []) + (c.get("args") or [])
        if any(os.path.basename(str(t)) == "vllm-router" for t in toks) or c["name"] in ("router", "vllm-router"):
            return True
    return False


_SVC_URL = re.compile(r"^(https?)://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)(/.*)?$")


def resolve_service_url(url: str, services: dict, pods: list) -> str | None:
    """http://NAME.NS.svc:PORT -> http://<pod IP>:<target port> of a Ready pod behind that Service (no cluster
    DNS or kube-proxy here); another URL as it is; None when the Service or a Ready pod is missing."""
    m = _SVC_URL.match(url)
    if not m:
        return url
    scheme, name, ns, port, path = m.groups()
    svc = services.get((ns, name))
    if not svc or not (svc.get("spec") or {}).get("selector"):
        return None
    sport = next((p for p in svc["spec"].get("ports") or [] if int(p.get("port", 0)) == int(port)), None)
    if sport is None:
        return None
    sel = svc["spec"]["selector"]
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        labels = pod["metadata"].get("labels") or {}
        if pod["metadata"].get("namespace") != ns or any(labels.get(k) != v for k, v in sel.items()):
            continue
        st = pod.get("status") or {}
        if not st.get("podIP") or pod["metadata"].get("deletionTimestamp") or not any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []):
            continue
        target = sport.get("targetPort", sport["port"])
        if isinstance(target, str) and not target.isdigit():
            target = next((cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                           if cp.get("name") == target), None)
            if target is None:
                continue
        return f"{scheme}://{st['podIP']}:{int(target)}{path or ''}"
    return None


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a connection is refused, as by a Service with no Ready endpoint


def local_routes(table_text: str, services: dict, pods: list) -> str | None:
    """The routing table with each upstream resolved to a Ready pod's address. An upstream whose Service has
    no Ready pod yet (a candidate's router still starting) refuses connections, as a ClusterIP Service
    without endpoints does; the table is written all the same, so the serving revision's route works."""
    doc = json.loads(table_text)
    for r in doc.get("revisions") or []:
        r["upstream"] = resolve_service_url(r.get("upstream", ""), services, pods) or UNREACHABLE
    return json.dumps(doc, sort_keys=True)


def routes_volume(pod: dict, container: dict, path: str) -> tuple[str, str] | None:
    """(ConfigMap name, key) behind a file path the container reads from a configMap volume."""
    mounts = {m["name"]: m["mountPath"].rstrip("/") for m in container.get("volumeMounts") or []}
    for v in pod["spec"].get("volumes") or []:
        cm = v.get("configMap")
        if not cm or v["name"] not in mounts:
            continue
        for item in cm.get("items") or []:
            if f"{mounts[v['name']]}/{item['path']}" == path:
                return cm["name"], item["key"]
    return None


def pick_container(pod: dict, role: str) -> dict:
    cs = pod["spec"]["containers"]
    if role == "router":
        for c in cs:
            toks = (c.get("command") or []) + (c.get("args") or [])
            if any(os.path.basename(str(t)) == "vllm-router" for t in toks) or c["name"] in ("router", "vllm-router"):
                return c
    else:
        for c in cs:
            if any(p.get("name") == "http" for p in c.get("ports") or []) or c["name"] in ("vllm", "engine"):
                return c
    return cs[0]


def http_port(container: dict) -> int | None:
    for p in container.get("ports") or []:
        if p.get("name") == "http":
            return int(p["containerPort"])
    return None


def readiness_url(pod: dict, container: dict) -> str | None:
    """URL of the container's HTTP readiness probe on the pod IP (None: no httpGet readiness probe)."""
    get = (container.get("readinessProbe") or {}).get("httpGet")
    if not get:
        return None
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return None
    path = get.get("path") or "/"
    return f"{get.get('scheme', 'HTTP').lower()}://{pod['status']['podIP']}:{int(port)}{path}"


def ready_status(pod: dict, ready: bool, now: str) -> dict:
    """Pod status with Ready/ContainersReady and every container's ready flag set as a kubelet would;
    whole lists, so a merge patch and a strategic merge patch give the same result."""
    st = pod.get("status") or {}
    want = "True" if ready else "False"
    conds = []
    for c in st.get("conditions") or []:
        if c["type"] in ("Ready", "ContainersReady") and c.get("status") != want:
            c = {**c, "status": want, "lastTransitionTime": now}
        conds.append(c)
    statuses = [{**cs, "ready": ready, "started": True} for cs in st.get("containerStatuses") or []]
    return {"status": {"conditions": conds, "containerStatuses": statuses}}


def wants_process(pod: dict) -> bool:
    st = pod.get("status") or {}
    return (st.get("phase") == "Running" and bool(st.get("podIP"))
            and not pod["metadata"].get("deletionTimestamp"))


# ---------------------------------------------------------------------------------------------------

@dataclass
class Child:
    uid: str
    namespace: str
    pod: str
    role: str
    kind: str
    ip: str
    port: int
    argv: list
    env: dict
    log: str
    probe_url: str | None = None
    proc: Proc | None = None
    ready: bool | None = None  # what we last wrote into the pod's Ready condition
    next_probe: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    problem: str = ""
    extra: dict = field(default_factory=dict)


def hostile_child(pod: dict, role: str, ip: str, port: int, mode: str, probe_url: str | None, log_path: Path) -> Child:
    meta = pod["metadata"]
    return Child(meta["uid"], meta["namespace"], meta["name"], role, "hostile", ip, port,
                 hostile_command(ip, port, mode), {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
                 str(log_path), probe_url, extra={"mode": mode})


class Supervisor:
    def __init__(self, state: Path):
        self.state = state
        self.logs = state / "logs"
        self.kubeconfig = state / "kubeconfig"
        self.sims_file = state / "sims.json"
        self.tools = Tools.load()
        self.children: dict[str, Child] = {}  # "<pod uid>/<kind>" -> process
        self.pod_ready: dict[str, bool] = {}  # pod uid -> the Ready we last wrote
        self.pods: dict[str, dict] = {}
        self.api = None  # CoreV1Api, set in run()
        self.routes_synced: dict[str, float] = {}  # front pod uid -> when its routing table was last copied
        self.extra = {r: shlex.split(os.environ.get(f"V41F_SIM_ARGS_{r.upper()}", "")) for r in SIM_ROLE_LATENCY}

    def desired(self, pod: dict) -> list[Child]:
        """The processes a pod needs: [] for a headless worker; the session proxy first (the pod's front
        door, what sim_for() finds), then the router; or one simulator."""
        meta = pod["metadata"]
        role = meta.get("labels", {}).get(ROLE_LABEL)
        ip = pod["status"]["podIP"]
        if ipaddress.ip_address(ip) not in LOOPBACK:
            raise ValueError(f"pod IP {ip} is outside 127.0.0.0/8; refusing to bind it")
        c = pick_container(pod, role)
        env = container_env(pod, c)
        toks = command_tokens(c, env)
        tag = f"{meta['namespace']}-{meta['name']}"
        if role == "router" and not has_router(pod):  # a rollout's front: the session proxy alone
            return [self.front_child(pod, ip, tag)]
        if role == "router":
            logdir = self.logs / f"router-{tag}.d"
            logdir.mkdir(parents=True, exist_ok=True)
            argv = router_command(toks, ip, str(logdir))
            penv = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
            penv.setdefault("NO_COLOR", "1")
            penv.update(env)
            penv["KUBECONFIG"] = str(self.service_account_kubeconfig(pod))
            port = int((flag_values(argv, "--port") or ["30000"])[0])
            out = [Child(meta["uid"], meta["namespace"], meta["name"], role, "router", ip, port, argv, penv,
                         str(self.logs / f"router-{tag}.log"), readiness_url(pod, c))]
            pc = proxy_container(pod)
            if pc is not None:
                pargv, pport = proxy_command(command_tokens(pc, container_env(pod, pc)), ip)
                qenv = {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"}
                out.insert(0, Child(meta["uid"], meta["namespace"], meta["name"], role, "proxy", ip, pport, pargv,
                                    qenv, str(self.logs / f"proxy-{tag}.log"), readiness_url(pod, pc)))
            return out
        v = parse_vllm(toks, http_port(c))
        if v.headless:
            return []  # a headless multi-node worker has no API server
        extra = [*self.extra[role], *shlex.split(env.get(POD_SIM_ARGS_ENV, ""))]
        if HOSTILE_METRICS_ENV in env:
            return [hostile_child(pod, role, ip, v.port, env[HOSTILE_METRICS_ENV], readiness_url(pod, c),
                                  self.logs / f"hostile-{tag}.log")]
        start_at, problem = start_plan(split_knobs(extra)[0], time.monotonic())
        argv, senv = pod_sim_command(str(self.tools.sim), role, ip, v, extra)
        penv = {"PATH": os.environ.get("PATH", ""), "POD_NAME": meta["name"], "POD_NAMESPACE": meta["namespace"],
                **senv}
        if problem:
            log(f"not starting the simulator of {meta['namespace']}/{meta['name']}: {problem}")
        return [Child(meta["uid"], meta["namespace"], meta["name"], role, "sim", ip, v.port, argv, penv,
                      str(self.logs / f"sim-{tag}.log"), readiness_url(pod, c), next_start=start_at, problem=problem,
                      extra={"dp_ranks": v.dp_ranks})]

    def front_child(self, pod: dict, ip: str, tag: str) -> Child:
        """The front's session proxy, its --upstream and --routes-file made local: Service URLs resolved to
        pod addresses, the routing table copied from the ConfigMap into the state dir (sync_routes)."""
        meta = pod["metadata"]
        pc = proxy_container(pod)
        if pc is None:
            raise ValueError("router pod without vllm-router nor session proxy")
        argv, pport = proxy_command(command_tokens(pc, container_env(pod, pc)), ip)
        extra: dict = {}
        if "--routes-file" in argv:
            i = argv.index("--routes-file") + 1
            src = routes_volume(pod, pc, argv[i])
            if src is None:
                raise ValueError(f"--routes-file {argv[i]} is not a configMap volume file")
            local = self.state / "routes" / f"{tag}.json"
            local.parent.mkdir(parents=True, exist_ok=True)
            argv[i] = str(local)
            extra = {"routes": {"namespace": meta["namespace"], "configmap": src[0], "key": src[1],
                                "local": str(local)}}
        if "--upstream" in argv:
            j = argv.index("--upstream") + 1
            argv[j] = resolve_service_url(argv[j], self.services(meta["namespace"]), list(self.pods.values())) \
                or UNREACHABLE  # not resolvable yet: the routing table decides
        qenv = {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"}
        ch = Child(meta["uid"], meta["namespace"], meta["name"], "router", "proxy", ip, pport, argv, qenv,
                   str(self.logs / f"proxy-{tag}.log"), readiness_url(pod, pc), extra=extra)
        self.sync_routes(ch)
        return ch

    def services(self, namespace: str) -> dict:
        lst = self.api.list_namespaced_service(namespace, _request_timeout=10)
        return {(namespace, s.metadata.name): self.api.api_client.sanitize_for_serialization(s) for s in lst.items}

    def sync_routes(self, ch: Child) -> None:
        """Copy the front's routing table from its ConfigMap, upstreams resolved (each tick)."""
        r = ch.extra.get("routes")
        if not r or time.monotonic() < self.routes_synced.get(ch.uid, 0.0) + 1.0:
            return
        self.routes_synced[ch.uid] = time.monotonic()
        try:
            cm = self.api.read_namespaced_config_map(r["configmap"], r["namespace"], _request_timeout=10)
            text = (cm.data or {}).get(r["key"])
            table = local_routes(text, self.services(r["namespace"]), list(self.pods.values())) if text else None
        except Exception as e:  # noqa: BLE001 - apiserver hiccup: the proxy keeps the table it has
            log(f"routes for {ch.namespace}/{ch.pod}: {str(e)[:200]}")
            return
        path = Path(r["local"])
        if table is not None and (not path.exists() or path.read_text() != table):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(table)
            os.replace(tmp, path)
            log(f"routes for {ch.namespace}/{ch.pod}: {table}")

    def service_account_kubeconfig(self, pod: dict) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount (bound to the pod, like the projected token
        in a real pod), so the router's discovery runs under the RBAC the operator rendered, not as admin."""
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        req = {"spec": {"expirationSeconds": 86400,
                        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}}
        try:
            token = self.api.create_namespaced_service_account_token(sa, meta["namespace"], req).status.token
        except Exception as e:  # noqa: BLE001 - reported on the pod's entry and in the log
            raise ValueError(f"cannot get a token for ServiceAccount {meta['namespace']}/{sa}: {e}") from e
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "pod", "clusters": admin["clusters"],
               "users": [{"name": "sa", "user": {"token": token}}],
               "contexts": [{"name": "pod", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa",
                                                         "namespace": meta["namespace"]}}]}
        path = self.state / "pod-kubeconfigs" / f"{meta['namespace']}-{meta['name']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def reconcile(self) -> None:
        want: dict[str, dict] = {uid: p for uid, p in self.pods.items() if wants_process(p)}
        changed = False
        for key in [k for k, c in self.children.items() if c.uid not in want]:
            ch = self.children.pop(key)
            self.pod_ready.pop(ch.uid, None)
            changed = True
            if ch.proc:
                log(f"stopping {ch.kind} for {ch.namespace}/{ch.pod} (pid {ch.proc.pid})")
                stop_procs([ch.proc], timeout=5)
        have = {c.uid for c in self.children.values()}
        for uid, pod in want.items():
            if uid in have:
                continue
            try:
                new = self.desired(pod)
                if not new:  # a headless worker runs no API server: Ready as a kubelet without probe would
                    new = [Child(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], "worker", "none", "",
                                 0, [], {}, "", problem="headless", next_start=float("inf"), ready=True)]
            except (ValueError, KeyError, IndexError) as e:
                log(f"cannot simulate {pod['metadata']['namespace']}/{pod['metadata']['name']}: {e}")
                new = [Child(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], "?", "none", "", 0, [],
                             {}, "", problem=str(e), next_start=float("inf"))]
            for ch in new:
                self.children[f"{uid}/{ch.kind}"] = ch
            if new[0].problem == "headless":
                self.set_ready(new[0], pod, True)
            changed = True
        for ch in list(self.children.values()):
            pod = want[ch.uid]
            if ch.kind == "none":
                continue
            if ch.extra.get("routes"):
                self.sync_routes(ch)
            if ch.proc is not None and ch.proc.alive():
                if time.monotonic() >= ch.next_probe:
                    self.probe(ch, pod)
                continue
            if ch.proc is not None:  # it died: restart with backoff like a container restart
                ch.restarts += 1
                ch.next_start = time.monotonic() + min(10.0, 0.5 * 2 ** min(ch.restarts, 5))
                log(f"{ch.kind} for {ch.namespace}/{ch.pod} exited; restart #{ch.restarts} after backoff "
                    f"(log {ch.log})")
                ch.proc = None
                self.set_ready(ch, pod, False)
                changed = True
            if time.monotonic() >= ch.next_start:
                with open(ch.log, "a") as f:
                    f.write(f"[supervisor] starting: {shlex.join(ch.argv)}\n")
                # No SIGTERM between starting a process and recording it: it would be orphaned.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
                try:
                    ch.proc = spawn(f"{ch.kind}-{ch.namespace}-{ch.pod}", ch.argv, Path(ch.log), env=ch.env,
                                    port=ch.port)
                    self.save()
                except (RuntimeError, OSError) as e:  # exited at once: back off like a crash loop
                    ch.restarts += 1
                    ch.next_start = time.monotonic() + min(10.0, 0.5 * 2 ** min(ch.restarts, 5))
                    log(f"{ch.kind} for {ch.namespace}/{ch.pod} failed to start: {e}")
                    continue
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
                log(f"started {ch.kind} for {ch.namespace}/{ch.pod} ({ch.role}) on {ch.ip}:{ch.port} "
                    f"pid {ch.proc.pid}")
                ch.next_probe = 0.0
                changed = True
            if ch.proc is not None and time.monotonic() >= ch.next_probe:
                self.probe(ch, pod)
        if changed or not self.sims_file.exists():
            self.save()

    def probe(self, ch: Child, pod: dict) -> None:
        """The readiness probe, as kubelet runs it: Ready follows the container's httpGet probe (or the
        process being up when there is none); re-probed every second until Ready, then every 5 seconds."""
        ok = True
        if ch.probe_url:
            try:
                with urllib.request.urlopen(ch.probe_url, timeout=1) as r:
                    ok = 200 <= r.status < 400
            except (OSError, urllib.error.URLError):
                ok = False
        self.set_ready(ch, pod, ok)
        ch.next_probe = time.monotonic() + (5.0 if ok else 0.5)

    def set_ready(self, ch: Child, pod: dict, ready: bool) -> None:
        """Record one process's probe result; the pod is Ready when all of its processes are."""
        ch.ready = ready
        pod_ready = all(c.ready for c in self.children.values() if c.uid == ch.uid)
        if self.pod_ready.get(ch.uid) == pod_ready:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.api.patch_namespaced_pod_status(ch.pod, ch.namespace, ready_status(pod, pod_ready, now))
        except Exception as e:  # noqa: BLE001 - pod gone meanwhile, apiserver restarting: retried next probe
            log(f"cannot set Ready={pod_ready} on {ch.namespace}/{ch.pod}: {str(e)[:200]}")
            return
        self.pod_ready[ch.uid] = pod_ready
        log(f"{ch.namespace}/{ch.pod} Ready={pod_ready}")

    def save(self) -> None:
        write_json(self.sims_file, {"updated": time.time(), "processes": [
            {"uid": c.uid, "namespace": c.namespace, "pod": c.pod, "role": c.role, "kind": c.kind, "ip": c.ip,
             "port": c.port, "pid": c.proc.pid, "start": c.proc.start, "name": c.proc.name, "argv": c.argv,
             "log": c.log, "restarts": c.restarts, **c.extra}
            for c in self.children.values() if c.proc is not None]})

    def tick(self) -> int:
        """Watch timeout: short while a process waits for readiness, so Ready follows within a second."""
        now = time.monotonic()
        waiting = [c.next_start - now for c in self.children.values() if c.proc is None and c.kind != "none"
                   and c.next_start != float("inf")]
        busy = any(c.proc is not None and not c.ready for c in self.children.values())
        return 1 if busy or any(w < 5 for w in waiting) else 5

    def stop_all(self) -> None:
        stop_procs([c.proc for c in self.children.values() if c.proc], timeout=5)
        self.children.clear()
        self.save()

    def sweep_orphans(self) -> None:
        """Processes recorded by a supervisor that was killed without cleaning up."""
        try:
            old = json.loads(self.sims_file.read_text())["processes"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return
        stop_procs([Proc(d["name"], d["pid"], d["start"], d["argv"], d["log"]) for d in old], timeout=5)

    def run(self) -> None:
        from kubernetes import client, config, watch
        self.sweep_orphans()
        api = self.api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        self.save()
        log(f"supervisor watching pods with {SELECTOR}")
        while True:
            try:
                lst = api.list_pod_for_all_namespaces(label_selector=SELECTOR, _request_timeout=30)
                self.pods = {p.metadata.uid: api.api_client.sanitize_for_serialization(p) for p in lst.items}
                self.reconcile()
                rv = lst.metadata.resource_version
                while True:
                    w = watch.Watch()
                    for ev in w.stream(api.list_pod_for_all_namespaces, label_selector=SELECTOR,
                                       resource_version=rv, timeout_seconds=self.tick(),
                                       allow_watch_bookmarks=True):
                        obj = ev["raw_object"]
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if ev["type"] == "BOOKMARK":
                            continue
                        if ev["type"] == "DELETED":
                            self.pods.pop(obj["metadata"]["uid"], None)
                        elif ev["type"] in ("ADDED", "MODIFIED"):
                            self.pods[obj["metadata"]["uid"]] = obj
                        self.reconcile()
                    self.reconcile()  # also restarts crashed processes between events
            except Exception as e:  # apiserver restarts, 410 Gone, ...: relist (Shutdown is not an Exception)
                log(f"watch interrupted ({e.__class__.__name__}: {str(e)[:200]}); relisting")
                time.sleep(1)


class Shutdown(BaseException):
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True)
    a = ap.parse_args()
    sup = Supervisor(a.state.resolve())

    def on_signal(signum, _frame):
        raise Shutdown(signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sup.run()
    except Shutdown:
        log("supervisor: stopping simulators and routers")
    finally:
        sup.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
