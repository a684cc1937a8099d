"""Which processes a simulated pod needs (Child records): the simulator of an engine pod (with the P/D sidecar in
front of it in mode Gateway), vllm-router and the session proxy of a router pod, a rollout's front, the endpoint
picker and its forwarder; and what they need from the apiserver (a ServiceAccount token, Services, the routing
table). Supervisor mixes PodProcesses in."""
from __future__ import annotations

import ipaddress
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.cluster_config import ROLE_LABEL
from e2e.engine_pods import (HOSTILE_METRICS_ENV, POD_SIM_ARGS_ENV, hostile_command, parse_vllm, pod_sim_command,
                             start_plan)
from e2e.gateway_pods import (EPP_PORT_FLAGS, epp_command, forward_command, is_routing_sidecar, sidecar_command,
                              sidecar_container)
from e2e.pod_spec import go_flag, command_tokens, container_env, flag_values, http_port, volume_paths
from e2e.probes import ProbeRun, probe_url, readiness_url
from e2e.router_pods import (UNREACHABLE, front_container, has_router, local_front_bootstrap, local_front_clusters,
                             local_routes, proxy_command, proxy_container,
                             resolve_service_url, router_command, routes_volume)
from e2e.tools import VENV_BIN, log
from v41flash_bench.inference_sim import split_knobs
from v41flash_bench.procs import Proc, free_ports

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


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
    # kubelet's probes (supervisor.attach_probes): consecutive readiness results, the liveness probe and its results,
    # when it is next due, probe runs in flight (a frozen process holds one for its whole timeoutSeconds)
    readiness: ProbeRun | None = None
    liveness_url: str | None = None
    liveness: ProbeRun | None = None
    next_live: float = 0.0
    pending: dict = field(default_factory=dict)
    started_at: float = 0.0  # monotonic: when its process last started (backoff resets after 10 min running)
    backoff: int = 0  # crash-loop step: the next restart waits min(10, 0.5 x 2^backoff) s

    def running(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def live(self) -> bool:
        return self.running() or (self.hook is not None and self.hook.alive())


def hostile_child(pod: dict, role: str, ip: str, port: int, mode: str, container: dict, log_path: Path) -> Child:
    meta = pod["metadata"]
    return Child(meta["uid"], meta["namespace"], meta["name"], role, "hostile", ip, port,
                 hostile_command(ip, port, mode), {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
                 str(log_path), readiness_url(pod, container), extra={"mode": mode}, container=container["name"])


class PodProcesses:
    """The Supervisor's reading of a pod into the processes it runs. Mixed into Supervisor: uses its api, state,
    logs, tools, extra (per-role simulator flags), overrides (per-pod ones), pods and routes_synced."""

    overrides: dict[str, list[str]] = {}  # "<ns>/<pod>" -> the harness's flags; replaced whole, never mutated

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
        if role == "router" and front_container(pod) is not None:  # the front: Envoy and its counters
            return self.envoy_front_children(pod, ip, tag)
        if role == "router" and not has_router(pod):  # a front of an older operator: the session proxy alone
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
        # the harness's own per-pod flags last (`python -m e2e.harness sim-args`): a pod slowed on purpose
        extra = [*self.extra[role], *shlex.split(env.get(POD_SIM_ARGS_ENV, "")),
                 *self.overrides.get(f"{meta['namespace']}/{meta['name']}", [])]
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
        if go_flag(sargv, "--enable-ssrf-protection")[0] >= 0:  # it then watches InferencePools: under its RBAC
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

    def envoy_front_children(self, pod: dict, ip: str, tag: str) -> list[Child]:
        """The front's Envoy with its rendered arguments, reading copies of its ConfigMap files (sync_front: the
        listener on the pod IP, admin and counters on free loopback ports, Service names resolved to Ready pods),
        and `v41flash front-counters` reading that admin port."""
        meta = pod["metadata"]
        c = front_container(pod)
        assert c is not None
        env = container_env(pod, c)
        toks = command_tokens(c, env)
        admin, counters = free_ports(2, "127.0.0.1")
        local = self.state / "front" / tag
        local.mkdir(parents=True, exist_ok=True)
        i = toks.index("-c") + 1
        rendered = toks[i]
        src = routes_volume(pod, c, rendered)
        if src is None:
            raise ValueError(f"-c {rendered} is not a configMap volume file")
        cdir = rendered.rpartition("/")[0]
        items = {f"{cdir}/{it['path']}": it["key"] for v in pod["spec"].get("volumes") or []
                 if (v.get("configMap") or {}).get("name") == src[0] for it in v["configMap"].get("items") or []}
        toks[i] = str(local / rendered.rpartition("/")[2])
        port = next(p["containerPort"] for p in c.get("ports") or [] if p.get("name") == "http")
        extra = {"front": {"namespace": meta["namespace"], "configmap": src[0], "dir": str(local), "ip": ip,
                           "admin": admin, "counters": counters,
                           "files": {k: path.rpartition("/")[2] for path, k in items.items()},
                           "bootstrap": src[1]}}
        envoy = Child(meta["uid"], meta["namespace"], meta["name"], "router", "front", ip, port,
                      [str(VENV_BIN / "envoy"), *toks[1:]], {"PATH": os.environ.get("PATH", ""), **env},
                      str(self.logs / f"front-{tag}.log"), readiness_url(pod, c), extra=extra, container=c["name"])
        counter = Child(meta["uid"], meta["namespace"], meta["name"], "router", "counters", ip, counters,
                        [str(VENV_BIN / "v41flash"), "front-counters", "--listen", f"127.0.0.1:{counters}",
                         "--admin", f"127.0.0.1:{admin}"], {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
                        str(self.logs / f"counters-{tag}.log"), container="counters")
        self.sync_front(envoy)
        return [envoy, counter]

    def sync_front(self, ch: Child) -> None:
        """Copy the front's files from its ConfigMap (each tick): the bootstrap once, made local; the routes as they
        are; the clusters with Services resolved. Written by rename, which Envoy's watched directory picks up."""
        f = ch.extra.get("front")
        if not f or time.monotonic() < self.routes_synced.get(ch.uid, 0.0) + 1.0:
            return
        self.routes_synced[ch.uid] = time.monotonic()
        try:
            cm = self.api.read_namespaced_config_map(f["configmap"], f["namespace"], _request_timeout=10)
            data = cm.data or {}
            services = self.services(f["namespace"])
        except Exception as e:  # noqa: BLE001 - apiserver hiccup: Envoy keeps what it has
            log(f"front files for {ch.namespace}/{ch.pod}: {str(e)[:200]}")
            return
        d = Path(f["dir"])
        for key, name in f["files"].items():
            text = data.get(key)
            if text is None:
                continue
            if key == f["bootstrap"]:
                if (d / name).exists():
                    continue  # Envoy reads its bootstrap at start only (a change rolls the pod)
                text = local_front_bootstrap(text, f["ip"], f["admin"], f["counters"], str(d))
            elif "resources" in text and '"STRICT_DNS"' in text:
                text = local_front_clusters(text, services, list(self.pods.values()))
            path = d / name
            if not path.exists() or path.read_text() != text:
                tmp = d / f".{name}.tmp"
                tmp.write_text(text)
                os.replace(tmp, path)

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
