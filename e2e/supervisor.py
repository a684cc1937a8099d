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

A crashed process is restarted with backoff (like a container restart). A deleted pod terminates as kubelet
terminates it (kwok leaves these pods to the supervisor, harness.kwok_stages): Ready False at once, so the router's
pod discovery stops sending it requests; each container's preStop hook (the engines' drain script, run with `sh`
on a copy of the configMap files it reads); SIGTERM once the hook is over; SIGKILL at the grace deadline, counted
from the deletion (each pod's grace period capped at $V41F_GRACE_PERIOD_CAP_SECONDS, default 5 s); then the pod
object is deleted with grace 0, which frees its IP in kwok's pool. A pod that stops running otherwise has its
processes stopped at once, and one removed from the apiserver while they run (a forced deletion) too.
State: <state>/sims.json (a restarted supervisor goes on with the terminations recorded there); logs:
<state>/logs/{sim,router,hostile,prestop}-<ns>-<pod>*.log. Started (`python -m e2e.supervisor --state DIR`) and
stopped by e2e/harness.py; on SIGTERM it stops every process it started.
"""
from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from e2e.harness import ROLE_LABEL, SUPERVISED_ROLES, VENV_BIN, Tools, log, write_json
from v41flash_bench.inference_sim import FAIL_START, SimKnobs, SimLatency, sim_command, split_knobs
from v41flash_bench.procs import Proc, free_ports, spawn, stop_procs

SELECTOR = f"{ROLE_LABEL} in ({','.join(SUPERVISED_ROLES)})"
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
    found = sorted(ready_backends(services.get((ns, name)), int(port), pods, ns),
                   key=lambda b: b[0]["metadata"]["name"])
    if not found:
        return None
    _, ip, target = found[0]
    return f"{scheme}://{ip}:{target}{path or ''}"


def ready_backends(svc: dict | None, port: int, pods: list, namespace: str) -> list[tuple[dict, str, int]]:
    """(pod, pod IP, target port) of each Ready, not terminating pod behind a Service port, as kube-proxy would
    pick from (there is none here); [] when the Service, its selector or its port is missing."""
    if not svc or not (svc.get("spec") or {}).get("selector"):
        return []
    sport = next((p for p in svc["spec"].get("ports") or [] if int(p.get("port", 0)) == int(port)), None)
    if sport is None:
        return []
    sel = svc["spec"]["selector"]
    out = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if pod["metadata"].get("namespace") != namespace or any(labels.get(k) != v for k, v in sel.items()):
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
        out.append((pod, st["podIP"], int(target)))
    return out


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
    elif role == "epp":
        return next((c for c in cs if c["name"] == "epp"), cs[0])
    else:
        engines = [c for c in cs if not is_routing_sidecar(c)] or cs
        for c in engines:
            if any(p.get("name") == "http" for p in c.get("ports") or []) or c["name"] in ("vllm", "engine"):
                return c
        return engines[0]
    return cs[0]


# ---------------------------------------------------------------------------------------------------
# pure helpers: mode Gateway (llm-d's endpoint picker, and the P/D routing sidecar in decode pods)

EPP_PORT_FLAGS = {"--grpc-port": 9002, "--grpc-health-port": 9003, "--metrics-port": 9090}  # epp's own defaults


def is_routing_sidecar(container: dict) -> bool:
    """llm-d's P/D routing sidecar (pd-sidecar): by its image or its container name."""
    image = str(container.get("image", ""))
    return container.get("name") == "routing-sidecar" or any(x in image for x in ("routing-sidecar", "pd-sidecar"))


def sidecar_container(pod: dict) -> dict | None:
    return next((c for c in pod["spec"]["containers"] if is_routing_sidecar(c)), None)


def _go_flag(tokens: list[str], name: str) -> tuple[int, str | None, bool]:
    """(index, value, inline) of a Go flag given as -name/--name VALUE or -name=/--name=VALUE; (-1, None, False)."""
    bare = name.lstrip("-")
    for i, t in enumerate(tokens):
        key, eq, val = t.partition("=")
        if key in (f"-{bare}", f"--{bare}"):
            if eq:
                return i, val, True
            return i, (tokens[i + 1] if i + 1 < len(tokens) else None), False
    return -1, None, False


def strip_executable(tokens: list[str], *names: str) -> list[str]:
    """The flags after the executable when command+args start with it (else all tokens: the image entrypoint)."""
    return tokens[1:] if tokens and os.path.basename(tokens[0]) in names else list(tokens)


def epp_command(binary: str, tokens: list[str], local_ports: dict[str, int]) -> tuple[list[str], dict[int, int]]:
    """The endpoint picker's argv from its rendered flags, each of its ports (grpc, grpc-health, metrics) moved to
    the given free loopback port; and {pod port: local port} for the forwarder. It listens on ":<port>" (every
    address), so two pickers on this machine would collide on the pod ports: the forwarder puts them back on the
    pod IP."""
    flags = strip_executable(tokens, "epp")
    forwards: dict[int, int] = {}
    for flag, default in EPP_PORT_FLAGS.items():
        i, val, inline = _go_flag(flags, flag)
        pod_port = int(val) if val is not None else default
        local = local_ports[flag]
        forwards[pod_port] = local
        if i < 0:
            flags += [flag, str(local)]
        elif inline:
            flags[i] = f"{flag}={local}"
        else:
            flags[i + 1] = str(local)
    return [binary, *flags], forwards


def forward_command(pod_ip: str, forwards: dict[int, int]) -> list[str]:
    """e2e/tcp_forward.py: <podIP>:<pod port> -> 127.0.0.1:<local port>, for each port."""
    return [sys.executable, "-m", "e2e.tcp_forward",
            *(f"{pod_ip}:{pp}=127.0.0.1:{lp}" for pp, lp in sorted(forwards.items()))]


def sidecar_command(binary: str, tokens: list[str]) -> tuple[list[str], int]:
    """pd-sidecar argv from the rendered container (its flags as they are) and the port it serves."""
    flags = strip_executable(tokens, "pd-sidecar")
    _, port, _ = _go_flag(flags, "--port")
    return [binary, *flags], int(port or 8000)


def volume_paths(pod: dict, container: dict, tokens: list[str], volumes: Path) -> list[str]:
    """Tokens with each configMap mount path they name moved to its copy under `volumes/<volume name>`."""
    for path, volume, _ in configmap_mounts(pod, container, " ".join(tokens)):
        tokens = [t.replace(path, str(volumes / volume)) for t in tokens]
    return tokens


def grpc_health_ok(target: str, service: str, timeout: float = 1.0) -> bool:
    """A gRPC health check (grpc.health.v1.Health/Check) as kubelet's grpc probe runs it: plaintext, SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        with grpc.insecure_channel(target) as channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)
    except grpc.RpcError:
        return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def http_port(container: dict) -> int | None:
    for p in container.get("ports") or []:
        if p.get("name") == "http":
            return int(p["containerPort"])
    return None


def probe_url(pod: dict, container: dict, kind: str = "readinessProbe") -> str | None:
    """URL of one of the container's probes on the pod IP: http(s)://IP:PORT/PATH for httpGet,
    grpc://IP:PORT/SERVICE for grpc, tcp://IP:PORT for tcpSocket (None: no such probe)."""
    probe = container.get(kind) or {}
    ip = pod["status"]["podIP"]
    if "grpc" in probe:
        return f"grpc://{ip}:{int(probe['grpc']['port'])}/{probe['grpc'].get('service', '')}"
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if not action:
        return None
    port = action.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return None
    if "tcpSocket" in probe:
        return f"tcp://{ip}:{int(port)}"
    path = action.get("path") or "/"
    return f"{action.get('scheme', 'HTTP').lower()}://{ip}:{int(port)}{path}"


def readiness_url(pod: dict, container: dict) -> str | None:
    return probe_url(pod, container, "readinessProbe")


def probe_ok(url: str) -> bool:
    """One probe as kubelet runs it: a gRPC health check, a TCP connect, or an HTTP GET answered 2xx/3xx."""
    if url.startswith("grpc://"):
        target, _, service = url[len("grpc://"):].partition("/")
        return grpc_health_ok(target, service)
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://"):].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return 200 <= r.status < 400
    except (OSError, urllib.error.URLError):
        return False


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
# pure helpers: pod termination as kubelet runs it
#
# On deletion the apiserver sets deletionTimestamp = now + grace and deletionGracePeriodSeconds = grace; kubelet
# then marks the pod not Ready, runs each running container's preStop hook, sends SIGTERM once the hook is over
# (or at the grace deadline, which stops a hook still running), SIGKILLs what is left at the deadline (no sooner
# than 2 s after SIGTERM: kubelet's minimum), and finally deletes the pod object with grace 0.

GRACE_CAP_ENV = "V41F_GRACE_PERIOD_CAP_SECONDS"
# Every pod's grace period is capped at this here, as if each deletion said --grace-period=5: the engines'
# rendered preStop sleeps for the drain deadline in their ConfigMap (30 s at least, the SLO's p95 e2e x 1.5
# + 10 s; 460 s without the file) and their grace period is 3630 s. The cap ends the hook at the deadline as
# kubelet does when a grace period runs out; "none" keeps the pods' own (real-time drains).
DEFAULT_GRACE_CAP_S = 5.0
MIN_SIGTERM_GRACE_S = 2.0  # kubelet's minimumGracePeriodInSeconds: a SIGTERM always gets this long

PRESTOP, WAIT, SIGTERM, SIGKILL, DONE = "prestop", "wait", "sigterm", "sigkill", "done"
NETWORK_KINDS = ("fwd",)  # children that are the pod's network, not a container: stopped after the containers


def grace_cap(value: str | None) -> float | None:
    """The grace-period cap from V41F_GRACE_PERIOD_CAP_SECONDS: seconds (>= 0), "none" for no cap, unset for
    the default; ValueError naming the variable otherwise."""
    if value is None or value.strip() == "":
        return DEFAULT_GRACE_CAP_S
    if value.strip().lower() == "none":
        return None
    try:
        cap = float(value)
    except ValueError:
        cap = -1.0
    if not cap >= 0:
        raise ValueError(f"{GRACE_CAP_ENV}={value!r}: seconds (>= 0) or none")
    return cap


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def termination_window(pod: dict, cap: float | None) -> tuple[float, float]:
    """(when the deletion was asked for, the grace deadline) in epoch seconds: deletionTimestamp is the
    deletion's time plus its grace period (deletionGracePeriodSeconds; else the pod's own, default 30 s), and
    the deadline is that grace, capped, after the deletion."""
    meta = pod["metadata"]
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
    started = _epoch(meta["deletionTimestamp"]) - grace
    return started, started + (grace if cap is None else min(grace, cap))


@dataclass(frozen=True)
class Step:
    """What to do next for one container of a terminating pod; WAIT: nothing before `until` (epoch s)."""
    action: str
    until: float = 0.0


def container_step(now: float, deadline: float, *, running: bool, hook: str, sigterm_at: float | None) -> Step:
    """kubelet's killContainer for one container, as a state machine. `hook`: "none" (no preStop), "pending",
    "running" or "over"; `sigterm_at`: when SIGTERM was sent (None: not yet). A container whose process is not
    running is DONE (a hook still running is stopped by the caller); SIGTERM ends a running hook first."""
    if not running:
        return Step(DONE)
    if sigterm_at is None:
        if hook == "pending" and now < deadline:
            return Step(PRESTOP)
        if hook == "running" and now < deadline:
            return Step(WAIT, deadline)
        return Step(SIGTERM)
    kill_at = max(deadline, sigterm_at + MIN_SIGTERM_GRACE_S)
    return Step(SIGKILL) if now >= kill_at else Step(WAIT, kill_at)


def configmap_mounts(pod: dict, container: dict, text: str) -> list[tuple[str, str, dict]]:
    """(mountPath, volume name, its configMap source) of each configMap volume the container mounts at a path
    that `text` names, longest path first (a hook's command reads files there)."""
    vols = {v["name"]: v["configMap"] for v in pod["spec"].get("volumes") or [] if v.get("configMap")}
    mounts = [(m["mountPath"].rstrip("/"), m["name"], vols[m["name"]]) for m in container.get("volumeMounts") or []
              if m["name"] in vols and m["mountPath"].rstrip("/") in text]
    return sorted(mounts, key=lambda m: -len(m[0]))


def configmap_files(data: dict | None, source: dict) -> dict[str, str]:
    """The files of a configMap volume: each item's key at its path, or every key at its own name."""
    data = data or {}
    items = source.get("items")
    if items is None:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}


def pre_stop_argv(pod: dict, container: dict, volumes: Path) -> list[str] | None:
    """The container's preStop hook as a local command (None without one): an exec hook's command, traced
    (`sh -x`) when it is a shell script, with each configMap mount path it names moved to its copy under
    `volumes/<volume name>`; a sleep hook as `sleep N`. Other hooks (httpGet) are not run here."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return ["sleep", str(int(hook["sleep"]["seconds"]))]
    cmd = [str(t) for t in (hook.get("exec") or {}).get("command") or []]
    if not cmd:
        return None
    for path, volume, _ in configmap_mounts(pod, container, " ".join(cmd)):
        cmd = [t.replace(path, str(volumes / volume)) for t in cmd]
    if os.path.basename(cmd[0]) in ("sh", "bash") and cmd[1:2] == ["-c"]:
        cmd.insert(1, "-x")
    return cmd


def ip_holder(ip: str, uid: str, others) -> "Child | None":
    """Another pod's child that still holds this IP with a live process or preStop hook: a terminating pod
    keeps its IP until its processes are gone, so a new pod given that IP (a pod force-deleted, kwok restarted)
    waits for them."""
    return next((c for c in others if c.uid != uid and c.ip == ip and c.live()), None)


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
    # the container's startupProbe: readiness is probed only once it has succeeded (as kubelet does)
    startup_url: str | None = None
    started: bool = False
    proc: Proc | None = None
    ready: bool | None = None  # what we last wrote into the pod's Ready condition
    next_probe: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    problem: str = ""
    extra: dict = field(default_factory=dict)
    container: str = ""  # the pod's container it runs (its preStop hook is run on deletion)
    # termination: the preStop hook's process, whether the hook is over, when SIGTERM was sent (epoch s)
    hook: Proc | None = None
    hook_over: bool = False
    sigterm_at: float | None = None
    ip_wait: str = ""  # the uid of another pod whose process still holds this one's IP (logged once)
    reads: str = ""  # the rendered command line: configMap files it names are copied to the state dir at start

    def running(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def live(self) -> bool:
        return self.running() or (self.hook is not None and self.hook.alive())


def hostile_child(pod: dict, role: str, ip: str, port: int, mode: str, container: dict, log_path: Path) -> Child:
    meta = pod["metadata"]
    return Child(meta["uid"], meta["namespace"], meta["name"], role, "hostile", ip, port,
                 hostile_command(ip, port, mode), {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
                 str(log_path), readiness_url(pod, container), extra={"mode": mode}, container=container["name"])


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
        # pod uid -> its termination: started, deadline (epoch s), unready (Ready False written), deleted
        self.terminations: dict[str, dict] = {}
        self.grace_cap = grace_cap(os.environ.get(GRACE_CAP_ENV))
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
        if role == "epp":
            return self.epp_children(pod, c, env, toks, ip, tag)
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
                         str(self.logs / f"router-{tag}.log"), readiness_url(pod, c), container=c["name"])]
            pc = proxy_container(pod)
            if pc is not None:
                pargv, pport = proxy_command(command_tokens(pc, container_env(pod, pc)), ip)
                qenv = {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"}
                out.insert(0, Child(meta["uid"], meta["namespace"], meta["name"], role, "proxy", ip, pport, pargv,
                                    qenv, str(self.logs / f"proxy-{tag}.log"), readiness_url(pod, pc),
                                    container=pc["name"]))
            return out
        v = parse_vllm(toks, http_port(c))
        if v.headless:
            return []  # a headless multi-node worker has no API server
        extra = [*self.extra[role], *shlex.split(env.get(POD_SIM_ARGS_ENV, ""))]
        if HOSTILE_METRICS_ENV in env:
            return [hostile_child(pod, role, ip, v.port, env[HOSTILE_METRICS_ENV], c, self.logs / f"hostile-{tag}.log")]
        start_at, problem = start_plan(split_knobs(extra)[0], time.monotonic())
        argv, senv = pod_sim_command(str(self.tools.sim), role, ip, v, extra)
        penv = {"PATH": os.environ.get("PATH", ""), "POD_NAME": meta["name"], "POD_NAMESPACE": meta["namespace"],
                **senv}
        if problem:
            log(f"not starting the simulator of {meta['namespace']}/{meta['name']}: {problem}")
        sim = Child(meta["uid"], meta["namespace"], meta["name"], role, "sim", ip, v.port, argv, penv,
                    str(self.logs / f"sim-{tag}.log"), readiness_url(pod, c), next_start=start_at, problem=problem,
                    extra={"dp_ranks": v.dp_ranks}, container=c["name"])
        sc = sidecar_container(pod)
        if sc is None:
            return [sim]
        # mode Gateway's decode pod: the P/D routing sidecar owns the serving port, the simulator (vLLM) is behind
        # it; the sidecar is listed first (the pod's front door, what sim_for() finds)
        senv = container_env(pod, sc)
        sargv, sport = sidecar_command(str(self.tools.pd_sidecar), command_tokens(sc, senv))
        qenv = {"PATH": os.environ.get("PATH", ""), **senv, "V41F_SIDECAR_BIND_HOST": ip}
        if _go_flag(sargv, "--enable-ssrf-protection")[0] >= 0:  # it then watches InferencePools: under its RBAC
            qenv["KUBECONFIG"] = str(self.service_account_kubeconfig(pod))
        side = Child(meta["uid"], meta["namespace"], meta["name"], role, "sidecar", ip, sport, sargv, qenv,
                     str(self.logs / f"sidecar-{tag}.log"), readiness_url(pod, sc), container=sc["name"])
        return [side, sim]

    def epp_children(self, pod: dict, c: dict, env: dict, toks: list[str], ip: str, tag: str) -> list[Child]:
        """The endpoint picker with its rendered flags (ports moved to free loopback ports, the plugins config read
        from a copy of its ConfigMap volume) under a token of the pod's ServiceAccount, and the forwarder that
        serves its ports on the pod IP. The picker's grpc readiness probe runs against the pod IP."""
        meta = pod["metadata"]
        local = dict(zip(EPP_PORT_FLAGS, free_ports(len(EPP_PORT_FLAGS), "0.0.0.0")))
        toks = volume_paths(pod, c, toks, self.state / "volumes" / meta["uid"])
        argv, forwards = epp_command(str(self.tools.epp), toks, local)
        penv = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"),
                "POD_NAME": meta["name"], "NAMESPACE": meta["namespace"], "POD_NAMESPACE": meta["namespace"],
                **env, "KUBECONFIG": str(self.service_account_kubeconfig(pod))}
        reads = " ".join(str(t) for t in (c.get("command") or []) + (c.get("args") or []))
        fwd = Child(meta["uid"], meta["namespace"], meta["name"], "epp", "fwd", ip, min(forwards),
                    forward_command(ip, forwards), {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
                    str(self.logs / f"fwd-{tag}.log"), extra={"forwards": {str(k): v for k, v in forwards.items()}})
        # a TCP probe checks the container's own listener: the forwarder (the pod network's stand-in) accepts
        # whether or not the picker listens behind it
        startup = probe_url(pod, c, "startupProbe")
        if startup and startup.startswith(f"tcp://{ip}:") and int(startup.rpartition(":")[2]) in forwards:
            startup = f"tcp://127.0.0.1:{forwards[int(startup.rpartition(':')[2])]}"
        epp = Child(meta["uid"], meta["namespace"], meta["name"], "epp", "epp", ip, local["--grpc-port"], argv, penv,
                    str(self.logs / f"epp-{tag}.log"), readiness_url(pod, c), startup_url=startup,
                    container=c["name"], reads=reads)
        return [fwd, epp]

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
                   str(self.logs / f"proxy-{tag}.log"), readiness_url(pod, pc), extra=extra, container=pc["name"])
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
        """One pass: processes of pods gone from the apiserver stop; terminating pods go through kubelet's
        termination; pods that run get their processes started (restarted with backoff) and probed."""
        changed = self.drop_vanished()
        for uid, pod in list(self.pods.items()):
            if pod["metadata"].get("deletionTimestamp"):
                changed |= self.terminate(pod)
        want: dict[str, dict] = {uid: p for uid, p in self.pods.items() if wants_process(p)}
        for key in [k for k, c in self.children.items() if c.uid not in want and c.uid not in self.terminations]:
            ch = self.children.pop(key)  # its pod stopped running without a deletion (a phase change)
            self.pod_ready.pop(ch.uid, None)
            changed = True
            if ch.proc:
                log(f"stopping {ch.kind} for {ch.namespace}/{ch.pod} (pid {ch.proc.pid}): the pod no longer runs")
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
        for ch in [c for c in self.children.values() if c.uid in want]:
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
                holder = ip_holder(ch.ip, ch.uid, self.children.values())
                if holder is not None:  # never two pods' processes on one IP
                    if ch.ip_wait != holder.uid:
                        ch.ip_wait = holder.uid
                        log(f"not starting {ch.kind} for {ch.namespace}/{ch.pod} yet: its IP {ch.ip} is still held "
                            f"by {holder.namespace}/{holder.pod} ({holder.kind} pid {holder.proc and holder.proc.pid})")
                    continue
                ch.ip_wait = ""
                self.materialize(pod, ch)
                with open(ch.log, "a") as f:
                    f.write(f"[supervisor] starting: {shlex.join(ch.argv)}\n")
                # No SIGTERM between starting a process and recording it: it would be orphaned.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
                try:
                    ch.proc = spawn(f"{ch.kind}-{ch.namespace}-{ch.pod}", ch.argv, Path(ch.log), env=ch.env,
                                    port=ch.port)
                    ch.started = False  # a (re)started container runs its startupProbe again
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

    # -- termination (kubelet's killPod): see container_step

    def drop_vanished(self) -> bool:
        """Pods gone from the apiserver: removed by this supervisor once their processes had ended, or
        force-deleted (grace 0) with processes still running, which stop now (their IP is free in kwok's pool)."""
        gone = [k for k, c in self.children.items() if c.uid not in self.pods]
        for key in gone:
            ch = self.children.pop(key)
            self.pod_ready.pop(ch.uid, None)
            live = [p for p in (ch.proc, ch.hook) if p is not None and p.alive()]
            if live:
                log(f"{ch.namespace}/{ch.pod} was removed from the apiserver with its {ch.kind} still running "
                    f"(a forced deletion): stopping pid {', '.join(str(p.pid) for p in live)} now")
                stop_procs(live, timeout=MIN_SIGTERM_GRACE_S)
        for uid in [u for u in self.terminations if u not in self.pods]:
            del self.terminations[uid]
            shutil.rmtree(self.state / "volumes" / uid, ignore_errors=True)
        return bool(gone)

    def terminate(self, pod: dict) -> bool:
        """One step of a deleted pod's termination: Ready False at once, then per container its preStop hook,
        SIGTERM, SIGKILL at the grace deadline (container_step); once nothing of the pod runs, the pod object is
        deleted with grace 0. Returns whether anything changed."""
        meta = pod["metadata"]
        uid, what = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        started, deadline = termination_window(pod, self.grace_cap)
        t = self.terminations.get(uid)
        if t is None:
            t = self.terminations[uid] = {"started": started, "deadline": deadline, "unready": False, "deleted": False}
            log(f"{what} deleted with grace period {meta.get('deletionGracePeriodSeconds')} s: terminating within "
                f"{deadline - started:g} s ({GRACE_CAP_ENV}: {self.grace_cap})")
        elif deadline < t["deadline"]:  # deleted again with a shorter grace period: kubelet honours it
            t["deadline"] = deadline
            log(f"{what}: grace period shortened, deadline in {deadline - time.time():.1f} s")
        if t["deleted"]:
            return False
        children = [c for c in self.children.values() if c.uid == uid]
        changed = False
        if not t["unready"] and any(c.running() for c in children):
            t["unready"] = self.mark_unready(pod)
            changed = True
        now = time.time()
        busy = False
        # the pod's network (a forwarder from the pod IP) goes last, once every container has ended: kubelet tears
        # the sandbox down after its containers, so a container draining in its grace period stays reachable
        containers = [c for c in children if c.kind not in NETWORK_KINDS]
        network = [c for c in children if c.kind in NETWORK_KINDS]
        if not any(c.live() for c in containers):
            containers += network
        else:
            busy = bool(network)
        for ch in containers:
            step = container_step(now, t["deadline"], running=ch.running(), hook=self.hook_phase(ch, pod),
                                  sigterm_at=ch.sigterm_at)
            if step.action == PRESTOP:
                self.run_pre_stop(ch, pod)
            elif step.action == SIGTERM:
                self.stop_hook(ch, "at the grace deadline")
                ch.sigterm_at = now
                log(f"{what}: SIGTERM to {ch.kind} (pid {ch.proc.pid}) {now - t['started']:.1f} s after the deletion")
                _signal(ch.proc, signal.SIGTERM)
            elif step.action == SIGKILL:
                log(f"{what}: {ch.kind} (pid {ch.proc.pid}) still runs at the grace deadline: SIGKILL")
                _signal(ch.proc, signal.SIGKILL)
            elif step.action == DONE:
                self.stop_hook(ch, "its container's process has ended")
                if ch.proc is not None:
                    ch.proc.exit_code()  # reaps it
            busy |= step.action != DONE
            changed |= step.action not in (WAIT, DONE)
        if not busy:
            t["deleted"] = self.delete_pod(pod, now - t["started"])
            changed = True
        return changed

    def hook_phase(self, ch: Child, pod: dict) -> str:
        """container_step's `hook` for a child: none, pending, running or over."""
        if ch.hook is not None:
            return "running" if ch.hook.alive() else "over"
        if ch.hook_over:
            return "over"
        return "none" if ch.kind == "none" or self.pre_stop(ch, pod) is None else "pending"

    def pre_stop(self, ch: Child, pod: dict) -> list[str] | None:
        c = next((c for c in pod["spec"]["containers"] if c["name"] == ch.container), None)
        return None if c is None else pre_stop_argv(pod, c, self.state / "volumes" / ch.uid)

    def run_pre_stop(self, ch: Child, pod: dict) -> None:
        """Start the container's preStop hook with its env, the configMap files it reads copied here."""
        self.materialize(pod, ch)
        c = next(c for c in pod["spec"]["containers"] if c["name"] == ch.container)
        argv = self.pre_stop(ch, pod)
        tag = f"{ch.namespace}-{ch.pod}-{ch.container}"
        log_path = self.logs / f"prestop-{tag}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"[supervisor] preStop of {ch.namespace}/{ch.pod} container {ch.container}: {shlex.join(argv)}\n")
        env = {"PATH": os.environ.get("PATH", ""), **container_env(pod, c)}
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            ch.hook = spawn(f"prestop-{tag}", argv, log_path, env=env)
            self.save()
        except (RuntimeError, OSError) as e:  # exited at once (a hook that fails fast): the hook is over
            ch.hook_over = True
            log(f"preStop of {ch.namespace}/{ch.pod} ({ch.container}) ended at once: {e}")
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} started (pid {ch.hook.pid}; log {log_path})")

    def stop_hook(self, ch: Child, why: str) -> None:
        """The hook is over: noted (and its exit logged), or stopped when it still runs."""
        if ch.hook is None:
            return
        if ch.hook.alive():
            log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} stopped {why}")
            stop_procs([ch.hook], timeout=MIN_SIGTERM_GRACE_S)
        else:
            log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} ended (exit {ch.hook.exit_code()})")
        ch.hook, ch.hook_over = None, True

    def mark_unready(self, pod: dict) -> bool:
        """Ready False on a terminating pod (what kube-proxy and the router's pod discovery read). A separate
        update after the deletion's: vllm-router drops a worker on the event that first shows its pod
        deleted, matching it by its Ready state as it was tracked."""
        meta = pod["metadata"]
        if not any(c["type"] == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get(
                "conditions") or []):
            return True  # not Ready already (never was, or written before a supervisor restart)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.api.patch_namespaced_pod_status(meta["name"], meta["namespace"], ready_status(pod, False, now))
        except Exception as e:  # noqa: BLE001 - apiserver hiccup: retried next pass
            log(f"cannot set Ready=False on terminating {meta['namespace']}/{meta['name']}: {str(e)[:200]}")
            return False
        self.pod_ready[meta["uid"]] = False
        log(f"{meta['namespace']}/{meta['name']} Ready=False (terminating)")
        return True

    def delete_pod(self, pod: dict, took: float) -> bool:
        """kubelet's last word on a pod: delete it with grace 0, only this very pod (uid precondition: a
        StatefulSet or LeaderWorkerSet pod comes back under the same name)."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.delete_namespaced_pod(meta["name"], meta["namespace"], body=body, _request_timeout=10)
        except Exception as e:  # noqa: BLE001 - 404/409: already gone (or replaced); else retried next pass
            if getattr(e, "status", None) not in (404, 409):
                log(f"cannot delete terminated {meta['namespace']}/{meta['name']}: {str(e)[:200]}")
                return False
        log(f"{meta['namespace']}/{meta['name']} terminated {took:.1f} s after its deletion: removed (grace 0)")
        for key in [k for k, c in self.children.items() if c.uid == meta["uid"]]:
            del self.children[key]
        return True

    def materialize(self, pod: dict, ch: Child) -> None:
        """Copy the configMap volumes the container's preStop hook (or its own command line: the endpoint picker's
        --config-file) reads into <state>/volumes/<uid>/<volume>/, as
        kubelet mounts them: at start (an optional ConfigMap that is missing: an empty directory) and again when
        the hook runs, where a ConfigMap gone meanwhile (deleted with its owner) leaves the copy as it was."""
        c = next((c for c in pod["spec"]["containers"] if c["name"] == ch.container), None)
        hook = ((c or {}).get("lifecycle") or {}).get("preStop") or {}
        text = " ".join([*(str(t) for t in (hook.get("exec") or {}).get("command") or []), ch.reads]).strip()
        for _, volume, source in configmap_mounts(pod, c, text) if text else []:
            d = self.state / "volumes" / ch.uid / volume
            d.mkdir(parents=True, exist_ok=True)
            try:
                cm = self.api.read_namespaced_config_map(source["name"], ch.namespace, _request_timeout=10)
            except Exception as e:  # noqa: BLE001 - 404 (optional, or deleted with its owner), apiserver hiccup
                log(f"configMap {ch.namespace}/{source['name']} (volume {volume} of {ch.pod}) not read: "
                    f"{str(e)[:120]}; {sorted(f.name for f in d.iterdir()) or 'no files'} as before")
                continue
            files = configmap_files(cm.data, source)
            for f in d.iterdir():
                if f.is_file() and f.name not in files:
                    f.unlink()
            for name, content in files.items():
                path = d / name
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(content)
                os.replace(tmp, path)

    def probe(self, ch: Child, pod: dict) -> None:
        """The probes, as kubelet runs them: the startupProbe until it first succeeds, then Ready follows the
        readinessProbe (or the process being up when there is none); re-probed every half second until Ready,
        then every 5 seconds."""
        if ch.startup_url and not ch.started:
            ch.started = probe_ok(ch.startup_url)
        ok = (ch.started or not ch.startup_url) and (probe_ok(ch.probe_url) if ch.probe_url else True)
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
        procs = []
        for c in self.children.values():
            if c.proc is None:
                continue
            d = {"uid": c.uid, "namespace": c.namespace, "pod": c.pod, "role": c.role, "kind": c.kind, "ip": c.ip,
                 "port": c.port, "pid": c.proc.pid, "start": c.proc.start, "name": c.proc.name, "argv": c.argv,
                 "log": c.log, "restarts": c.restarts, "container": c.container, **c.extra}
            if c.uid in self.terminations:  # what a restarted supervisor needs to go on with it
                d["terminating"] = {"sigterm_at": c.sigterm_at, "hook_over": c.hook_over, "hook": None if c.hook is None
                                    else {k: getattr(c.hook, k) for k in ("name", "pid", "start", "argv", "log")}}
            procs.append(d)
        write_json(self.sims_file, {"updated": time.time(), "processes": procs})

    def tick(self) -> int:
        """Watch timeout: short while a process waits for readiness or a pod terminates, so Ready follows and a
        termination steps within a second."""
        now = time.monotonic()
        waiting = [c.next_start - now for c in self.children.values() if c.proc is None and c.kind != "none"
                   and c.next_start != float("inf")]
        busy = any(c.proc is not None and not c.ready for c in self.children.values())
        terminating = any(not t["deleted"] for t in self.terminations.values())
        return 1 if busy or terminating or any(w < 5 for w in waiting) else 5

    def stop_all(self) -> None:
        stop_procs([p for c in self.children.values() for p in (c.proc, c.hook) if p], timeout=5)
        self.children.clear()
        self.save()

    def recover(self, records: list[dict]) -> None:
        """Processes recorded by an earlier supervisor (killed, or restarted): those of a pod that is
        terminating are adopted and their termination goes on where it was (preStop hook, SIGTERM time); the
        others are stopped (the pods that still run get theirs started again)."""
        stop = []
        for d in records:
            proc = Proc(d["name"], d["pid"], d["start"], d["argv"], d["log"], d.get("port"))
            term = d.get("terminating") or {}
            hook = Proc(**term["hook"]) if term.get("hook") else None
            pod = self.pods.get(d["uid"])
            if pod is None or not pod["metadata"].get("deletionTimestamp") or not proc.alive():
                stop += [p for p in (proc, hook) if p is not None]
                continue
            ch = Child(d["uid"], d["namespace"], d["pod"], d["role"], d["kind"], d["ip"], d["port"], d["argv"], {},
                       d["log"], proc=proc, restarts=d.get("restarts", 0), container=d.get("container", ""),
                       hook=hook, hook_over=bool(term.get("hook_over")), sigterm_at=term.get("sigterm_at"))
            self.children[f"{ch.uid}/{ch.kind}"] = ch
            log(f"adopted {ch.kind} of terminating {ch.namespace}/{ch.pod} (pid {proc.pid}"
                + (f", preStop pid {hook.pid}" if hook else "") + ")")
        stop_procs(stop, timeout=5)

    def run(self) -> None:
        from kubernetes import client, config, watch
        try:  # what an earlier supervisor left running: adopted or stopped once the pods are listed
            records = json.loads(self.sims_file.read_text())["processes"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            records = []
        api = self.api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        log(f"supervisor watching pods with {SELECTOR}; grace periods capped at "
            f"{'(none)' if self.grace_cap is None else f'{self.grace_cap:g} s'} ({GRACE_CAP_ENV})")
        while True:
            try:
                lst = api.list_pod_for_all_namespaces(label_selector=SELECTOR, _request_timeout=30)
                self.pods = {p.metadata.uid: api.api_client.sanitize_for_serialization(p) for p in lst.items}
                if records is not None:
                    self.recover(records)
                    records = None
                    self.save()
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
                    self.reconcile()  # also restarts crashed processes and steps terminations between events
            except Exception as e:  # apiserver restarts, 410 Gone, ...: relist (Shutdown is not an Exception)
                log(f"watch interrupted ({e.__class__.__name__}: {str(e)[:200]}); relisting")
                time.sleep(1)


def _signal(proc: Proc, sig: int) -> None:
    """Signal a process group if it still runs (its PID not recycled), reaping it when it is ours."""
    if proc.alive():
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    proc.exit_code()


class Shutdown(BaseException):
    pass


PROBE_MODULES = ("grpc", "grpc_health.v1")  # the picker's gRPC readiness probe (grpc_health_ok)


def missing_modules(names: Sequence[str] = PROBE_MODULES) -> list[str]:
    """The modules the supervisor imports only when a pod needs them, absent from this Python. Checked at start:
    imported inside the watch loop, an ImportError is retried forever like an apiserver hiccup and no picker pod
    ever turns Ready."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            out.append(name)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True)
    a = ap.parse_args()
    missing = missing_modules()
    if missing:
        log(f"supervisor: {', '.join(missing)} not installed in {sys.executable}: pip install -e '.[dev]'")
        return 2
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
