"""Home of the router's flags and ports: the vllm-router (PyPI vllm-router 0.1.17) in front of the engines, its
arguments and objects.

``router_objects`` is the base both router workloads are made from: the front (``front_objects``: the session proxy,
`v41flash session-proxy` in the operator image, alone on the Service's port) and each slot's vllm-router
(``slot_router_objects``: vllm-router alone on ROUTER_INTERNAL_PORT, reachable only from the deployment's router
pods: its admin API has no authentication, and the proxy forwards only the serving and health paths).
With spec.routing.sessionKey: derive (the default) the proxy sets x-session-id when a client sent none;
with client (`--session-key client`) it forwards what clients send unchanged.

Every flag below exists in `vllm-router --help` of 0.1.17 (tests/test_render_router.py parses the
rendered args with the router's own argparse). The e2e harness runs this exact args list as a local
process (replacing only --host), so it must be complete and runnable as is.
"""
from __future__ import annotations

import copy
from typing import Any

from ..api import v1alpha1 as api
from ..front.envoy import (ADMIN_PORT, BOOTSTRAP_FILE, CONFIG_DIR, COUNTERS_PORT, FRONT_FILES, FrontSettings,
                           bootstrap_hash, config_files)
from ..proxy.revisions import ROUTES_FILE_NAME, Route
from . import labels as L
from .ports import ENGINE_PORT, METRICS_PORT, ROUTER_INTERNAL_PORT, ROUTER_PORT, SERVICE_PORT  # noqa: F401 (importers)
from .resolve import Resolved, resolve

PROXY_API_KEY_ENV = "V41FLASH_PROXY_API_KEY"  # the front reads the client API key from it
POLICIES_WITH_CACHE_THRESHOLDS = ("cache_aware",)
# vllm-router 0.1.17's sticky_least_loaded counts a session on its engine until it has been idle this many seconds
# (its own default 7200); nothing tells it a session ended, so the count is of sessions seen in that window.
SLL_SESSION_EXPIRATION_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"
# vllm-router 0.1.17 discovers each engine's KV event publishers itself (GET /kv_event_sources on
# every discovered engine, vLLM 0.33.0's per-DP-rank KVEventsConfig); static --kv-event-source /
# --pd-kv-events entries need worker URLs, which pod discovery does not know at render time.
KV_EVENT_SOURCES = "discovered: GET /kv_event_sources on each engine (vllm-router 0.1.17 kv_index discovery)"


def intra_node_dp_size(res: Resolved) -> int:
    """--intra-node-data-parallel-size: the router addresses DP ranks behind one engine URL.

    The router takes one size for every worker, so it is set only when all enabled roles run the same
    DP size > 1 (DEP2 everywhere). With different sizes (GB300 DEP4 prefill + DEP16 decode) a single
    value would address ranks that do not exist or leave ranks idle, so it stays 1 and each engine's
    API server balances over its own DP ranks.
    """
    sizes = {r.data_parallel_size for r in res.enabled_roles}
    return sizes.pop() if len(sizes) == 1 and next(iter(sizes)) > 1 else 1


def router_policies(spec: api.V41FlashDeploymentSpec, res: Resolved) -> tuple[str, ...]:
    """The vllm-router policies in use: prefill's and decode's in P/D, the one policy otherwise."""
    return (spec.routing.policy, spec.routing.decode_policy) if res.disaggregated else (spec.routing.policy,)


def router_env(spec: api.V41FlashDeploymentSpec, res: Resolved) -> list[dict[str, str]]:
    """sticky_least_loaded balances new sessions by the sessions counted on each engine: with its 2 h default a
    session that ended 1 h ago still counts, so an engine added later takes every new session until it has
    as many, and sessions once spread stay where they are. spec.routing.sessionAffinityTtlSeconds (the
    proxy's revision TTL too) makes the count one of live sessions (docs/decisions/2026-12-01-autoscale-suite.md)."""
    return session_count_env(router_policies(spec, res), spec.routing.session_affinity_ttl_seconds)


def session_count_env(policies: tuple[str, ...], ttl_s: int) -> list[dict[str, str]]:
    """The router container's env for these policies and routing.sessionAffinityTtlSeconds (0: none)."""
    if "sticky_least_loaded" in policies and ttl_s > 0:
        return [{"name": SLL_SESSION_EXPIRATION_ENV, "value": str(ttl_s)}]
    return []


def router_args(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved) -> list[str]:
    routing = spec.routing
    args: list[str] = []
    if res.disaggregated:
        args += ["--vllm-pd-disaggregation", "--service-discovery",
                 "--prefill-selector", *L.selector_args(L.serving_selector(cr_name, "prefill")),
                 "--decode-selector", *L.selector_args(L.serving_selector(cr_name, "decode")),
                 "--prefill-policy", routing.policy, "--decode-policy", routing.decode_policy,
                 "--kv-connector", "nixl"]
    else:
        args += ["--service-discovery",
                 "--selector", *L.selector_args(L.serving_selector(cr_name, "decode")),
                 "--policy", routing.policy]
    policies = router_policies(spec, res)
    args += ["--service-discovery-port", str(ENGINE_PORT), "--service-discovery-namespace", namespace]
    if any(p in POLICIES_WITH_CACHE_THRESHOLDS for p in policies):
        args += ["--cache-threshold", _num(routing.cache_threshold),
                 "--balance-abs-threshold", str(routing.balance_abs_threshold),
                 "--balance-rel-threshold", _num(routing.balance_rel_threshold)]
    if "kv_aware" in policies and routing.session_affinity_ttl_seconds > 0:
        args += ["--kv-aware-session-affinity-ttl-secs", str(routing.session_affinity_ttl_seconds)]
    dp = intra_node_dp_size(res)
    if dp > 1:
        args += ["--intra-node-data-parallel-size", str(dp)]
    args += ["--request-timeout-secs", str(routing.request_timeout_seconds)]
    if not routing.retries:
        args.append("--disable-retries")
    args += ["--host", "127.0.0.1", "--port", str(ROUTER_INTERNAL_PORT),
             "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    return args


def front_settings(spec: api.V41FlashDeploymentSpec) -> FrontSettings:
    """What spec.routing decides about the front's Envoy (front/envoy.py)."""
    routing = spec.routing
    return FrontSettings(session_key=routing.session_key, session_header=routing.session_header,
                         api_key_env=PROXY_API_KEY_ENV if routing.api_key_secret_ref is not None else "",
                         max_in_flight=routing.front_or_default.max_in_flight,
                         max_connections=routing.front_or_default.max_connections,
                         request_timeout_s=routing.request_timeout_seconds)


def front_command() -> list[str]:
    """Envoy's command line in the front container (its configuration: the mounted ConfigMap files)."""
    return ["envoy", "-c", f"{CONFIG_DIR}/{BOOTSTRAP_FILE}", "--concurrency", str(FRONT_WORKERS),
            "--disable-hot-restart", "--drain-time-s", str(FRONT_DRAIN_S), "--drain-strategy", "immediate",
            "--log-level", "warn"]


# A stopping front replica: Envoy drains its listener (new connections refused, kept-alive ones closed after
# their answer) and the hook waits until no request is in flight (at most the grace period), then SIGTERM.
# bash's /dev/tcp reaches the admin API on loopback (the Envoy image has no HTTP client).
_DRAIN_SCRIPT = (
    "adm() { exec 3<>/dev/tcp/127.0.0.1/%d && printf '%%s /%%s HTTP/1.1\\r\\nHost: l\\r\\nConnection: close"
    "\\r\\n\\r\\n' \"$1\" \"$2\" >&3 && cat <&3; exec 3<&-; }; "
    "adm POST 'drain_listeners?graceful&inboundonly' >/dev/null; "
    "while :; do r=$(adm GET 'stats?filter=^http.front.downstream_rq_active$'); [ -z \"$r\" ] && exit 0; "
    "printf '%%s' \"$r\" | grep -q 'rq_active: 0$' && exit 0; sleep 1; done" % ADMIN_PORT)


def front_containers(spec: api.V41FlashDeploymentSpec) -> list[dict[str, Any]]:
    """Envoy on the Service's port, and `v41flash front-counters` (the operator image) on loopback."""
    routing = spec.routing
    cmd = front_command()
    secure = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "readOnlyRootFilesystem": True}
    envoy = {
        "name": "front",
        "image": routing.front_or_default.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": cmd[:1],
        "args": cmd[1:],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        **({"env": [{"name": PROXY_API_KEY_ENV, "valueFrom": {"secretKeyRef": {
            "name": routing.api_key_secret_ref.name, "key": routing.api_key_secret_ref.key}}}]}
           if routing.api_key_secret_ref is not None else {}),
        # /readiness goes to the serving slot's router: Ready only when the whole chain answers
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"},
                           "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5,
                          "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/bash", "-c", _DRAIN_SCRIPT]}}},
        # Envoy's workers relay the streams: FRONT_WORKERS threads on about one core at full load
        "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": copy.deepcopy(secure),
        "volumeMounts": [{"name": "front", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    counters = {
        "name": "counters",
        "image": routing.session_proxy_image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["v41flash"],
        "args": ["front-counters", "--listen", f"127.0.0.1:{COUNTERS_PORT}", "--admin", f"127.0.0.1:{ADMIN_PORT}"],
        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": copy.deepcopy(secure),
    }
    return [envoy, counters]


def _num(value: float) -> str:
    return repr(float(value))


def service_address(cr_name: str, namespace: str) -> str:
    """host:port of the router's Service: what clients call (status.router.service)."""
    return f"{L.child_name(cr_name, L.ROUTER)}.{namespace}.svc:{SERVICE_PORT}"


def router_objects(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
                   owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    name = L.child_name(cr_name, L.ROUTER)

    def meta(annotations: dict[str, str] | None = None) -> dict[str, Any]:
        return L.metadata(cr_name, namespace, name, L.ROUTER, owner, annotations)

    pod_labels = L.common_labels(cr_name, L.ROUTER)
    selector = L.selector_labels(cr_name, L.ROUTER)
    container = {
        "name": "router",
        "image": spec.routing.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["vllm-router"],
        "args": router_args(cr_name, namespace, spec, res),
        **({"env": env} if (env := router_env(spec, res)) else {}),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        # kubelet probes the pod IP, and the router listens on loopback only: its metrics listener (same
        # process) stands in for liveness; readiness is the proxy's (forwarded to /readiness).
        "livenessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }
    containers = [container]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(),
        "spec": {
            "replicas": spec.routing.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    # Router replicas on different nodes when they can be: one node loss keeps the front door.
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": dict(selector)}}],
                    "enableServiceLinks": False,
                    # Pod Security `restricted`: non-root (the images' nobody), seccomp, read-only roots.
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                    # A long request in flight finishes (up to the request timeout) before the pod goes.
                    "terminationGracePeriodSeconds": min(spec.routing.request_timeout_seconds, 600),
                    "containers": containers,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
    service_account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(),
        # Pod discovery (kube-rs) lists and watches pods in this namespace only.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    role_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    return [service_account, role, role_binding, deployment, service]


# --- the front and the slots' routers (render/slots.py) ---------------------------------------------------

ROUTES_CONFIG_KEY = ROUTES_FILE_NAME  # the routing table in the deployment's ConfigMap (the front's routes are built
# from it; kept there for people and tools to read)
FRONT_WORKERS = 2  # Envoy worker threads per front replica (its CPU request is one core)
FRONT_DRAIN_S = 5  # a stopping front replica closes kept-alive connections over this long


def serving_router_name(cr_name: str) -> str:
    """The Service in front of the serving slot's router: the front's --upstream (used only while the routing
    table cannot be read). Its selector follows the serving slot, so a promotion never changes the front's pod
    template (a front restart would forget which revision each live session is on)."""
    return L.child_name(cr_name, f"{L.ROUTER}-serving")


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind)


def front_objects(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, serving_slot: str,
                  owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``<cr>-router``: the front (Envoy, configured from the ConfigMap's front files, and its counters), scaled by
    a HorizontalPodAutoscaler between routing.front.minReplicas and maxReplicas; its ServiceAccount/Role/RoleBinding
    are the slot routers' (pod discovery); ``<cr>-router-serving``: the serving slot's router (the front's health
    paths)."""
    objs = router_objects(cr_name, namespace, spec, resolve(spec), owner)
    deployment, service = _one(objs, "Deployment"), _one(objs, "Service")
    name = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]
    del deployment["spec"]["replicas"]  # the autoscaler's (the one writer)
    pod["spec"]["containers"] = front_containers(spec)
    pod["spec"]["volumes"] = [{"name": "front", "configMap": {
        "name": L.config_name(cr_name), "items": [{"key": k, "path": k} for k in FRONT_FILES]}}]
    pod["spec"]["terminationGracePeriodSeconds"] = min(spec.routing.request_timeout_seconds, 600)
    pod["metadata"]["labels"][L.FRONT_LABEL] = "true"
    # Envoy reads its bootstrap only at start: a change of it rolls the front (routes and clusters do not)
    pod["metadata"]["annotations"] = {L.CONFIG_HASH_ANNOTATION: bootstrap_hash(front_settings(spec))}
    service["spec"]["selector"] = {**L.selector_labels(cr_name, L.ROUTER), L.COMPONENT_LABEL: L.ROUTER}
    service["spec"]["ports"] = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    serving_service = copy.deepcopy(_one(objs, "Service"))
    serving_service["metadata"]["name"] = serving_router_name(cr_name)
    serving_service["spec"]["selector"] = {**L.selector_labels(cr_name, L.ROUTER), L.SLOT_LABEL: L.slot_tag(serving_slot)}
    serving_service["spec"]["ports"] = [p for p in serving_service["spec"]["ports"] if p["name"] == "http"]
    front = spec.routing.front_or_default
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": L.metadata(cr_name, namespace, name, L.ROUTER, owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": front.min_replicas,
            "maxReplicas": front.max_replicas,
            "metrics": [{"type": "ContainerResource", "containerResource": {
                "name": "cpu", "container": "front",
                "target": {"type": "Utilization", "averageUtilization": front.target_cpu_utilization_percent}}}],
        },
    }
    return [o for o in objs if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")] + [deployment, service,
                                                                                            serving_service, hpa]


def front_files(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec,
                table: list[Route]) -> dict[str, str]:
    """The front's three ConfigMap files: Envoy's bootstrap, the routes (the revision split) and the clusters (each
    revision's router, and the serving slot's router Service for health)."""
    serving = f"http://{serving_router_name(cr_name)}.{namespace}.svc:{SERVICE_PORT}"
    return config_files(table, front_settings(spec), serving)


def slot_router_objects(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, slot: str, revision: str,
                        owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """vllm-router alone for one slot (``spec`` carries the current routing settings): discovery scoped to the
    slot's revision, on the internal port (its admin API is reachable only from the front's pods, network.py)."""
    objs = router_objects(cr_name, namespace, spec, resolve(spec), owner)
    deployment, service = _one(objs, "Deployment"), _one(objs, "Service")
    name = L.child_name(cr_name, f"{L.ROUTER}-{L.slot_tag(slot)}")
    sel = {**L.selector_labels(cr_name, L.ROUTER), L.SLOT_LABEL: L.slot_tag(slot)}
    for o in (deployment, service):
        o["metadata"]["name"] = name
        o["metadata"]["labels"][L.SLOT_LABEL] = L.slot_tag(slot)
        o["metadata"]["labels"][L.REVISION_LABEL] = revision
    deployment["spec"]["selector"]["matchLabels"] = dict(sel)
    pod = deployment["spec"]["template"]
    pod["metadata"]["labels"].update({L.SLOT_LABEL: L.slot_tag(slot), L.REVISION_LABEL: revision,
                                      L.COMPONENT_LABEL: L.SLOT_ROUTER_COMPONENT})
    pod["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] = dict(sel)
    # The router pod's vllm-router container alone (the front runs the session proxy), listening on the pod IP.
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "router")
    pod["spec"]["containers"] = [container]
    args = container["args"]
    # Discovery: only engine pods of this revision (the label is set at pod creation and never changed).
    for flag in ("--prefill-selector", "--decode-selector", "--selector"):
        if flag in args:
            i = args.index(flag) + 1
            while i < len(args) and not args[i].startswith("--"):
                i += 1
            args.insert(i, f"{L.REVISION_LABEL}={revision}")
    args[args.index("--host") + 1] = "0.0.0.0"
    args[args.index("--port") + 1] = str(ROUTER_INTERNAL_PORT)
    container["ports"] = [{"name": "http", "containerPort": ROUTER_INTERNAL_PORT, "protocol": "TCP"},
                          *(p for p in container["ports"] if p["name"] != "http")]
    # /readiness answers 503 until the router has healthy workers: no traffic to an empty pool.
    container["readinessProbe"] = {"httpGet": {"path": "/readiness", "port": "http"},
                                   "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3}
    container["livenessProbe"] = {"httpGet": {"path": "/liveness", "port": "http"},
                                  "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}
    service["spec"]["selector"] = dict(sel)
    return [deployment, service]
