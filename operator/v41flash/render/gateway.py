"""Home of spec.routing.mode: Gateway (the Gateway API Inference Extension): the InferencePool of the serving
pods, llm-d's endpoint picker (EPP) with its plugins config, the P/D routing sidecar's container, and the
optional HTTPRoute (pure).

Request path: client -> the user's Gateway (Envoy Gateway, kgateway, Istio, GKE) -> HTTPRoute -> InferencePool.
The Gateway asks the EPP (ext-proc, gRPC on EPP_GRPC_PORT) which pod serves each request; the EPP scores the
pool's pods with its prefix-cache index, their queues and KV-cache use (scraped from each pod's /metrics).
With prefill enabled the EPP runs two scheduling profiles: it picks a decode pod (the Gateway's destination)
and a prefill pod, named in the x-prefiller-host-port header; the decode pod's routing sidecar (on the
serving port, vLLM behind it on VLLM_BEHIND_SIDECAR_PORT) sends the prompt to that prefill pod with
kv_transfer_params, then decodes locally, as vllm-router's P/D mode does.

Every flag below exists in llm-d-inference-scheduler v0.4.0's `epp` and `pd-sidecar` (gateway-api-inference-
extension v1.2.0's runner); the e2e harness runs these args as local processes.
"""
from __future__ import annotations

from typing import Any

from ..api import v1alpha1 as api
from . import labels as L
from .ports import ENGINE_PORT
from .resolve import Resolved
from .timing import DEFAULT_DRAIN_SECONDS
from .yamlout import to_yaml_doc

INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_API_VERSION = f"{INFERENCE_GROUP}/v1"
INFERENCE_POOL_PLURAL = "inferencepools"
# The EPP of llm-d-inference-scheduler v0.4.0 also watches InferenceObjectives (GIE v1.2.0, alpha group).
INFERENCE_OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
INFERENCE_OBJECTIVE_API_VERSION = f"{INFERENCE_OBJECTIVE_GROUP}/v1alpha2"
INFERENCE_OBJECTIVE_PLURAL = "inferenceobjectives"
HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
# The CRDs mode Gateway needs (kind, group, version, plural): the controller checks they are installed.
REQUIRED_CRDS = (
    ("InferencePool", INFERENCE_GROUP, "v1", INFERENCE_POOL_PLURAL),
    ("InferenceObjective", INFERENCE_OBJECTIVE_GROUP, "v1alpha2", INFERENCE_OBJECTIVE_PLURAL),
)
HTTPROUTE_CRD = ("HTTPRoute", "gateway.networking.k8s.io", "v1", "httproutes")

EPP = "epp"  # component / name suffix of the endpoint picker's objects
POOL = "pool"  # name suffix of the InferencePool
ROUTE = "route"  # name suffix of the HTTPRoute
EPP_GRPC_PORT = 9002  # ext-proc (the Gateway's gRPC client); TLS with the EPP's own certificate
EPP_HEALTH_PORT = 9003  # gRPC health (probes)
EPP_METRICS_PORT = 9090
EPP_CONFIG_KEY = "epp-config.yaml"
EPP_CONFIG_DIR = "/etc/epp"
VLLM_BEHIND_SIDECAR_PORT = 8200  # a decode pod's vLLM when the routing sidecar owns the serving port
SIDECAR_CONNECTOR = "nixlv2"  # pd-sidecar's NIXL flow: kv_transfer_params as vLLM 0.33.0's NixlConnector wants
KV_CACHE_USAGE_METRIC = "vllm:kv_cache_usage_perc"  # vLLM 0.33.0's name (the EPP's default is the old one)
QUEUED_REQUESTS_METRIC = "vllm:num_requests_waiting"
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")
PREFILL_PROFILE, DECODE_PROFILE, DEFAULT_PROFILE = "prefill", "decode", "default"


def gateway_settings(spec: api.V41FlashDeploymentSpec) -> api.GatewayRoutingSpec:
    """spec.routing.gateway, or its defaults when unset."""
    return spec.routing.gateway or api.GatewayRoutingSpec()


def is_gateway(spec: api.V41FlashDeploymentSpec) -> bool:
    return spec.routing.mode == "Gateway"


def uses_sidecar(spec: api.V41FlashDeploymentSpec, res: Resolved) -> bool:
    """Decode pods carry the routing sidecar: mode Gateway with prefill enabled (the EPP's P/D flow needs it)."""
    return is_gateway(spec) and res.disaggregated


def pool_name(cr_name: str) -> str:
    return L.child_name(cr_name, POOL)


def epp_name(cr_name: str) -> str:
    return L.child_name(cr_name, EPP)


def pool_selector(cr_name: str, revision: str = "") -> dict[str, str]:
    """The pool's pods: every serving engine pod of the deployment, or of one serving revision (a pool per
    revision: prefill and decode of one request always come from the same revision)."""
    selector = L.serving_pods_selector(cr_name)
    if revision:
        selector[L.REVISION_LABEL] = revision
    return selector


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def epp_config(spec: api.V41FlashDeploymentSpec, res: Resolved) -> dict[str, Any]:
    """The EPP's plugins config (EndpointPickerConfig): role filters on the operator's own role label, the
    prefix-cache, queue and KV-cache-utilization scorers, a max-score picker; P/D adds the prefill profile, the
    pd-profile-handler and the prefill-header-handler that names the chosen prefill pod to the sidecar."""
    gw = gateway_settings(spec)
    scorers = [("prefix-cache-scorer", gw.prefix_cache_weight), ("queue-scorer", gw.queue_weight),
               ("kv-cache-utilization-scorer", gw.kv_cache_utilization_weight)]
    scorers = [(name, w) for name, w in scorers if w > 0]

    def role_filter(role: str) -> dict[str, Any]:
        return {"type": "by-label", "name": f"{role}-pods",
                "parameters": {"label": L.ROLE_LABEL, "validValues": [role], "allowsNoLabel": False}}

    def profile(name: str, role: str) -> dict[str, Any]:
        return {"name": name, "plugins": [
            {"pluginRef": f"{role}-pods"},
            *({"pluginRef": n, "weight": _num(w)} for n, w in scorers),
            {"pluginRef": "max-score-picker"}]}

    plugins: list[dict[str, Any]] = [role_filter("decode")]
    if res.disaggregated:
        plugins.append(role_filter("prefill"))
    plugins += [{"type": n} for n, _ in scorers]
    plugins.append({"type": "max-score-picker"})
    if res.disaggregated:
        plugins += [
            {"type": "prefill-header-handler", "parameters": {"prefillProfile": PREFILL_PROFILE}},
            {"type": "pd-profile-handler", "parameters": {
                "prefillProfile": PREFILL_PROFILE, "decodeProfile": DECODE_PROFILE,
                "threshold": gw.prefill_threshold_tokens,
                **({"prefixPluginName": "prefix-cache-scorer"} if gw.prefix_cache_weight > 0 else {})}},
        ]
        profiles = [profile(PREFILL_PROFILE, "prefill"), profile(DECODE_PROFILE, "decode")]
    else:
        plugins.append({"type": "single-profile-handler"})
        profiles = [profile(DEFAULT_PROFILE, "decode")]
    return {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
            "plugins": plugins, "schedulingProfiles": profiles}


def epp_args(cr_name: str, namespace: str, *, pool: str | None = None,
             config_file: str = f"{EPP_CONFIG_DIR}/{EPP_CONFIG_KEY}") -> list[str]:
    args = ["--pool-name", pool or pool_name(cr_name), "--pool-namespace", namespace,
            "--pool-group", INFERENCE_GROUP, "--config-file", config_file,
            "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT),
            # the metrics port is fenced by the NetworkPolicy (operator / Prometheus only), as the router's is
            "--metrics-endpoint-auth=false",
            "--kv-cache-usage-percentage-metric", KV_CACHE_USAGE_METRIC,
            "--total-queued-requests-metric", QUEUED_REQUESTS_METRIC,
            "--tracing=false", "--enable-pprof=false"]
    return args


def sidecar_args() -> list[str]:
    """No --data-parallel-size: a DEP pod's vLLM API server balances its DP ranks itself behind one port, so
    the sidecar talks to that one port (its per-rank listeners are for one API server per rank)."""
    return ["--port", str(ENGINE_PORT), "--vllm-port", str(VLLM_BEHIND_SIDECAR_PORT),
            "--connector", SIDECAR_CONNECTOR,
            # plain HTTP inside the pod network, as vLLM itself serves (the Gateway speaks HTTP to the pool)
            "--secure-proxy=false"]


def sidecar_container(spec: api.V41FlashDeploymentSpec, res: Resolved) -> dict[str, Any]:
    """The decode pod's routing sidecar: it owns the serving port ("http"); vLLM listens behind it."""
    return {
        "name": "routing-sidecar",
        "image": gateway_settings(spec).sidecar_image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": sidecar_args(),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 3, "failureThreshold": 3},
        # vLLM's preStop waits out the drain deadline from the ConfigMap (a shell reads it); this image has no
        # shell, so the sidecar waits the default deadline, then shuts down gracefully (60 s for requests in flight)
        "lifecycle": {"preStop": {"sleep": {"seconds": DEFAULT_DRAIN_SECONDS}}},
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": 65532, "readOnlyRootFilesystem": True},
    }


def inference_pool(cr_name: str, namespace: str, owner: dict[str, Any] | None, *, name: str | None = None,
                   epp: str | None = None, revision: str = "") -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": L.metadata(cr_name, namespace, name or pool_name(cr_name), POOL, owner),
        "spec": {
            "selector": {"matchLabels": pool_selector(cr_name, revision)},
            "targetPorts": [{"number": ENGINE_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp or epp_name(cr_name),
                                  "port": {"number": EPP_GRPC_PORT}, "failureMode": "FailClose"},
        },
    }


def gateway_duration(seconds: int) -> str:
    """A Gateway API Duration (at most 5 digits per unit): 14400 -> '4h', 3725 -> '1h2m5s', 0 -> '0s'."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    out = "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)
    return out or "0s"


def http_route(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, owner: dict[str, Any] | None,
               pools: list[tuple[str, int]] | None = None) -> dict[str, Any] | None:
    """The HTTPRoute to the user's Gateway, or None when gateway.httpRoute is unset. ``pools``: (InferencePool,
    weight) backends, default the deployment's one pool."""
    parent = gateway_settings(spec).http_route
    if parent is None:
        return None
    ref: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": parent.name}
    if parent.namespace:
        ref["namespace"] = parent.namespace
    if parent.section_name:
        ref["sectionName"] = parent.section_name
    backends = [{"group": INFERENCE_GROUP, "kind": "InferencePool", "name": name, "weight": weight}
                for name, weight in (pools or [(pool_name(cr_name), 1)])]
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": L.metadata(cr_name, namespace, L.child_name(cr_name, ROUTE), ROUTE, owner),
        "spec": {
            "parentRefs": [ref],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": p}} for p in OPENAI_PATHS],
                       "backendRefs": backends,
                       # a P/D request waits for prefill and decode; the route must not cut it at the default
                       "timeouts": {"request": gateway_duration(spec.routing.request_timeout_seconds)}}],
        },
    }


def epp_objects(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
                owner: dict[str, Any] | None, *, name: str | None = None, pool: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service of one endpoint picker."""
    name = name or epp_name(cr_name)
    gw = gateway_settings(spec)

    def meta() -> dict[str, Any]:
        return L.metadata(cr_name, namespace, name, EPP, owner)

    selector = L.selector_labels(cr_name, EPP)
    pod_labels = L.common_labels(cr_name, EPP)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(),
              "data": {EPP_CONFIG_KEY: to_yaml_doc(epp_config(spec, res))}}
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [INFERENCE_GROUP], "resources": [INFERENCE_POOL_PLURAL], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [INFERENCE_OBJECTIVE_GROUP], "resources": [INFERENCE_OBJECTIVE_PLURAL],
         "verbs": ["get", "list", "watch"]},
    ]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(), "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    def grpc_health() -> dict[str, Any]:  # fresh each use: no shared subtrees (YAML anchors) in the output
        return {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": EPP,
        "image": gw.epp_image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": epp_args(cr_name, namespace, pool=pool),
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": {**grpc_health(), "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**grpc_health(), "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [{"name": "config", "mountPath": EPP_CONFIG_DIR, "readOnly": True}],
        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "readOnlyRootFilesystem": True},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(),
        "spec": {
            # one picker: its prefix index lives in its memory, and more than one would need leader election
            # (Leases the operator would have to hold in every watched namespace to grant them)
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 130,
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta(),
               "spec": {"type": "ClusterIP", "selector": dict(selector),
                        "ports": [{"name": "grpc", "port": EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
                                   "appProtocol": "http2"},
                                  {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics",
                                   "protocol": "TCP"}]}}
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}
    return [sa, role, binding, config, deployment, service]


def gateway_objects(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
                    owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Everything mode Gateway renders for a deployment that has not rolled out (one pool)."""
    out = [*epp_objects(cr_name, namespace, spec, res, owner), inference_pool(cr_name, namespace, owner)]
    route = http_route(cr_name, namespace, spec, owner)
    return out + ([route] if route is not None else [])
