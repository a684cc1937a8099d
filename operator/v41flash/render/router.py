"""The vllm-router (PyPI vllm-router 0.1.17) in front of the engines: arguments and objects.

Every flag below exists in `vllm-router --help` of 0.1.17 (tests/test_render_router.py parses the
rendered args with the router's own argparse). The e2e harness runs this exact args list as a local
process (replacing only --host), so it must be complete and runnable as is.
"""
from __future__ import annotations

from typing import Any

from ..api import v1alpha1 as api
from . import labels as L
from .resolve import Resolved

ROUTER_PORT = 30000
METRICS_PORT = 29000
ENGINE_PORT = 8000
POLICIES_WITH_CACHE_THRESHOLDS = ("cache_aware",)
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


def router_args(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved) -> list[str]:
    routing = spec.routing
    args: list[str] = []
    if res.disaggregated:
        args += ["--vllm-pd-disaggregation", "--service-discovery",
                 "--prefill-selector", *L.selector_args(L.serving_selector(cr_name, "prefill")),
                 "--decode-selector", *L.selector_args(L.serving_selector(cr_name, "decode")),
                 "--prefill-policy", routing.policy, "--decode-policy", routing.decode_policy,
                 "--kv-connector", "nixl"]
        policies = (routing.policy, routing.decode_policy)
    else:
        args += ["--service-discovery",
                 "--selector", *L.selector_args(L.serving_selector(cr_name, "decode")),
                 "--policy", routing.policy]
        policies = (routing.policy,)
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
    args += ["--host", "0.0.0.0", "--port", str(ROUTER_PORT),
             "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    return args


def _num(value: float) -> str:
    return repr(float(value))


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
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # /readiness answers 503 until the router has healthy workers: no traffic to an empty pool.
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
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
                    # A long request in flight finishes (up to the request timeout) before the pod goes.
                    "terminationGracePeriodSeconds": min(spec.routing.request_timeout_seconds, 600),
                    "containers": [container],
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
                {"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"},
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
