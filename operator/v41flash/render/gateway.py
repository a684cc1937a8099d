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

Names, so that a rollout never changes what a user's own HTTPRoute names: each slot (render/labels.py SLOT_LABEL;
"0" for a deployment that never rolled out) has its endpoint picker ``<cr>-epp-<slot>`` (Deployment, Service,
ConfigMap) watching its own pool ``<cr>-pool-<slot>`` (the slot's serving pods, of its revision once rolled out),
so a picker pairs a prefill and a decode of one revision only. The front ``<cr>-pool`` (the pool an HTTPRoute
names) always selects the serving slot's pods, its picker reference the Service ``<cr>-epp`` whose selector follows
the serving slot's picker. The operator's HTTPRoute splits a rollout's traffic: the front pool at the serving
share, the candidate's slot pool at the canary share (weight 0 for a draining slot). ServiceAccount, Role and
RoleBinding ``<cr>-epp`` are shared by the pickers.

Every flag below exists in llm-d-inference-scheduler v0.4.0's `epp` and `pd-sidecar` (gateway-api-inference-
extension v1.2.0's runner); the e2e harness runs these args as local processes.
"""
from __future__ import annotations

import hashlib
from typing import Any

from ..api import v1alpha1 as api
from ..vllm import metric_names
from . import labels as L
from .ports import EPP_GRPC_PORT, EPP_HEALTH_PORT, EPP_METRICS_PORT, ENGINE_PORT, VLLM_BEHIND_SIDECAR_PORT
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
# What mode Gateway needs served beyond the kinds it renders: the picker watches InferenceObjectives.
WATCHED_KINDS = ((INFERENCE_OBJECTIVE_API_VERSION, "InferenceObjective"),)
_GIE_CRDS = "the Gateway API Inference Extension v1.2.0 CRDs (InferencePool, InferenceObjective)"
# kind -> what to install when the cluster does not serve it (the controller's KindNotInstalled message)
INSTALL_HINTS = {"InferencePool": _GIE_CRDS, "InferenceObjective": _GIE_CRDS,
                 "HTTPRoute": "the Gateway API v1.4.0 standard CRDs (HTTPRoute)"}

EPP = "epp"  # component / name suffix of the endpoint picker's objects
POOL = "pool"  # name suffix of the InferencePool
ROUTE = "route"  # name suffix of the HTTPRoute
EPP_CONFIG_KEY = "epp-config.yaml"
EPP_ENDPOINT_GRACE_SECONDS = 5  # how long a Gateway may take to see a picker endpoint come or go
EPP_CONFIG_DIR = "/etc/epp"
SIDECAR_CONNECTOR = "nixlv2"  # pd-sidecar's NIXL flow: kv_transfer_params as vLLM 0.33.0's NixlConnector wants
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


slot_tag = L.slot_tag


def pool_name(cr_name: str, slot: str | None = None) -> str:
    """The front pool (slot None: what an HTTPRoute names), or one slot's pool."""
    return L.child_name(cr_name, POOL if slot is None else f"{POOL}-{slot_tag(slot)}")


def epp_name(cr_name: str, slot: str | None = None) -> str:
    """The front Service and the pickers' shared ServiceAccount/Role/RoleBinding (slot None), or one slot's
    picker (Deployment, Service, ConfigMap)."""
    return L.child_name(cr_name, EPP if slot is None else f"{EPP}-{slot_tag(slot)}")


def epp_selector(cr_name: str, slot: str) -> dict[str, str]:
    return {**L.selector_labels(cr_name, EPP), L.SLOT_LABEL: slot_tag(slot)}


def pool_selector(cr_name: str, revision: str = "") -> dict[str, str]:
    """The pool's pods: every serving engine pod of the deployment, or of one serving revision (a pool per
    revision: prefill and decode of one request always come from the same revision)."""
    selector = L.serving_pods_selector(cr_name)
    if revision:
        selector[L.REVISION_LABEL] = revision
    return selector


def epp_config(spec: api.V41FlashDeploymentSpec, res: Resolved) -> dict[str, Any]:
    """The EPP's plugins config (EndpointPickerConfig): role filters on the operator's own role label, the
    prefix-cache, queue, KV-cache-utilization and active-request scorers, a max-score picker; P/D adds the prefill
    profile, the pd-profile-handler and the prefill-header-handler that names the chosen prefill pod to the
    sidecar."""
    gw = gateway_settings(spec)
    scorers = [("prefix-cache-scorer", gw.prefix_cache_weight), ("queue-scorer", gw.queue_weight),
               ("kv-cache-utilization-scorer", gw.kv_cache_utilization_weight),
               ("active-request-scorer", gw.active_request_weight)]
    scorers = [(name, w) for name, w in scorers if w > 0]

    def role_filter(role: str) -> dict[str, Any]:
        return {"type": "by-label", "name": f"{role}-pods",
                "parameters": {"label": L.ROLE_LABEL, "validValues": [role], "allowsNoLabel": False}}

    def profile(name: str, role: str) -> dict[str, Any]:
        return {"name": name, "plugins": [
            {"pluginRef": f"{role}-pods"},
            *({"pluginRef": n, "weight": int(w)} for n, w in scorers),  # the picker reads a Go int
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


def epp_args(cr_name: str, namespace: str, slot: str = "",
             config_file: str = f"{EPP_CONFIG_DIR}/{EPP_CONFIG_KEY}") -> list[str]:
    args = ["--pool-name", pool_name(cr_name, slot), "--pool-namespace", namespace,
            "--pool-group", INFERENCE_GROUP, "--config-file", config_file,
            "--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT),
            "--metrics-port", str(EPP_METRICS_PORT),
            # the metrics port is fenced by the NetworkPolicy (operator / Prometheus only), as the router's is
            "--metrics-endpoint-auth=false",
            "--kv-cache-usage-percentage-metric", metric_names.KV_USAGE,
            "--total-queued-requests-metric", metric_names.WAITING,
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


def inference_pool(cr_name: str, namespace: str, owner: dict[str, Any] | None, *, slot: str | None = None,
                   revision: str = "") -> dict[str, Any]:
    """The front pool (slot None) or one slot's; ``revision``: only that revision's pods ("" = every serving pod,
    a deployment that never rolled out)."""
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": L.metadata(cr_name, namespace, pool_name(cr_name, slot), POOL, owner),
        "spec": {
            "selector": {"matchLabels": pool_selector(cr_name, revision)},
            "targetPorts": [{"number": ENGINE_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp_name(cr_name, slot),
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
               pools: list[tuple[str, int]]) -> dict[str, Any] | None:
    """The HTTPRoute to the user's Gateway, or None when gateway.httpRoute is unset. ``pools``: (InferencePool,
    weight) backends (render/__init__.py: the front pool at the serving share, a candidate's at its share)."""
    parent = gateway_settings(spec).http_route
    if parent is None:
        return None
    ref: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": parent.name}
    if parent.namespace:
        ref["namespace"] = parent.namespace
    if parent.section_name:
        ref["sectionName"] = parent.section_name
    backends = [{"group": INFERENCE_GROUP, "kind": "InferencePool", "name": name, "weight": weight}
                for name, weight in pools]
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


def epp_shared(cr_name: str, namespace: str, owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The pickers' ServiceAccount, Role and RoleBinding (one set for every slot's picker)."""
    name = epp_name(cr_name)

    def meta() -> dict[str, Any]:
        return L.metadata(cr_name, namespace, name, EPP, owner)

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
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}
    return [sa, role, binding]


def _epp_service(cr_name: str, namespace: str, name: str, selector: dict[str, str], owner: dict[str, Any] | None,
                 *, metrics: bool) -> dict[str, Any]:
    ports = [{"name": "grpc", "port": EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "http2"}]
    if metrics:
        ports.append({"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"})
    return {"apiVersion": "v1", "kind": "Service", "metadata": L.metadata(cr_name, namespace, name, EPP, owner),
            "spec": {"type": "ClusterIP", "selector": dict(selector), "ports": ports}}


def epp_slot(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
             owner: dict[str, Any] | None, *, slot: str = "", revision: str = "") -> list[dict[str, Any]]:
    """One slot's picker: ConfigMap, Deployment and Service ``<cr>-epp-<slot>``, and its pool. ``revision`` ("" =
    never rolled out) scopes the pool and labels the picker's Deployment (what a rollout reads as its router)."""
    name = epp_name(cr_name, slot)
    gw = gateway_settings(spec)

    def meta() -> dict[str, Any]:
        m = L.metadata(cr_name, namespace, name, EPP, owner)
        m["labels"][L.SLOT_LABEL] = slot_tag(slot)
        return m

    selector = epp_selector(cr_name, slot)
    pod_labels = {**L.common_labels(cr_name, EPP), L.SLOT_LABEL: slot_tag(slot)}
    config_text = to_yaml_doc(epp_config(spec, res))
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(), "data": {EPP_CONFIG_KEY: config_text}}

    def grpc_health() -> dict[str, Any]:  # fresh each use: no shared subtrees (YAML anchors) in the output
        return {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": EPP,
        "image": gw.epp_image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": epp_args(cr_name, namespace, slot),
        "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"}],
        # The gRPC health service answers SERVING once the pool is synced, seconds before the ext-proc server
        # listens (v0.4.0: 1-4 s in the e2e harness): a Gateway told the picker is Ready in that gap fails the
        # requests it sends (FailClose). Readiness is probed only after the startup probe found the ext-proc
        # port listening (a TCP probe: the port serves TLS, which kubelet's gRPC probe cannot speak).
        "startupProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 1, "failureThreshold": 120},
        "readinessProbe": {**grpc_health(), "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**grpc_health(), "periodSeconds": 10, "failureThreshold": 6},
        # deleted (a rolled picker, a drained node), it keeps answering while the Gateway learns that its endpoint
        # is gone: without the pause, requests still sent to it fail (FailClose)
        "lifecycle": {"preStop": {"sleep": {"seconds": EPP_ENDPOINT_GRACE_SECONDS}}},
        "volumeMounts": [{"name": "config", "mountPath": EPP_CONFIG_DIR, "readOnly": True}],
        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "readOnlyRootFilesystem": True},
    }
    dmeta = meta()
    if revision:
        dmeta["labels"][L.REVISION_LABEL] = revision  # on the Deployment only: a label change restarts no pod
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": dmeta,
        "spec": {
            # one picker per slot: its prefix index lives in its memory, and more than one would need leader
            # election (Leases the operator would have to hold in every watched namespace to grant them)
            "replicas": 1,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            # the old picker goes only once the new one has been Ready this long: the Gateway's view of the
            # picker Service's endpoints catches up first
            "minReadySeconds": EPP_ENDPOINT_GRACE_SECONDS,
            "selector": {"matchLabels": selector},
            "template": {
                # the picker reads its plugins file once, at start (v0.4.0 watches nothing): a new scorer weight
                # rolls the pod (one surge pod, Ready before the old one goes)
                "metadata": {"labels": pod_labels, "annotations": {
                    L.CONFIG_HASH_ANNOTATION: hashlib.sha256(config_text.encode()).hexdigest()[:16]}},
                "spec": {
                    "serviceAccountName": epp_name(cr_name),
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
    service = _epp_service(cr_name, namespace, name, selector, owner, metrics=True)
    service["metadata"]["labels"][L.SLOT_LABEL] = slot_tag(slot)
    return [config, deployment, service, inference_pool(cr_name, namespace, owner, slot=slot, revision=revision)]


def epp_front(cr_name: str, namespace: str, owner: dict[str, Any] | None, *, serving_slot: str = "",
              revision: str = "") -> list[dict[str, Any]]:
    """The front pool ``<cr>-pool`` and its picker Service ``<cr>-epp``, both following the serving slot."""
    service = _epp_service(cr_name, namespace, epp_name(cr_name), epp_selector(cr_name, serving_slot), owner,
                           metrics=False)
    return [service, inference_pool(cr_name, namespace, owner, revision=revision)]
