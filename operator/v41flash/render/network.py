"""NetworkPolicies of one deployment: who may reach its engines and its router.

- Engines (prefill, decode, LWS workers) accept traffic only from the deployment's router pods (HTTP and
  the KV-event publishers kv_aware routing subscribes to), from the deployment's own engine pods (NIXL KV transfer, DP RPC, KV events: any port) and from
  the operator's pods (the planner scrapes /metrics on the serving port). A pod elsewhere cannot send
  prompts to an engine directly, bypassing the proxy's API key, nor talk NIXL to it.
- The router accepts clients on its Service port from anywhere (client authentication is the proxy's
  API key, spec.routing.apiKeySecretRef), and its metrics port only from the operator.
- Mode Gateway: the engines admit only the endpoint picker's pods and the Gateway's data-plane pods on the serving
  port (routing.gateway.dataPlanePods; unset, the pods of the Gateway httpRoute names; else none), their own engine
  pods on any port, and the scrapers; the picker's ext-proc port only the same data plane. No rule admits every pod.
- With spec.autoscaling.metrics.source: Prometheus the user's Prometheus pods (metrics.prometheus.scrapedBy)
  are admitted to the same metrics ports as the operator: the planner reads what Prometheus scraped.

Egress is not restricted (engines download weights; the router watches the apiserver). Kubelet probes
come from the node, which CNIs allow regardless of NetworkPolicy. A cluster without a NetworkPolicy-
enforcing CNI (the local e2e cluster) accepts these objects but does not enforce them.
"""
from __future__ import annotations

from typing import Any

from . import labels as L
from .gateway import EPP
from .ports import ENGINE_PORT, EPP_GRPC_PORT, EPP_METRICS_PORT, METRICS_PORT, ROUTER_INTERNAL_PORT, ROUTER_PORT

# Labels the operator chart puts on the operator's own pods (charts/v41flash-operator/templates/deployment.yaml).
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator", L.SCRAPER_LABEL: "true"}


def _operator_peer(operator_namespace: str | None) -> dict[str, Any]:
    ns = ({"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}} if operator_namespace else {})
    return {"namespaceSelector": ns, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}


def _prometheus_peer(scraped_by: Any) -> dict[str, Any]:
    """The user's Prometheus pods (api.PeerSelector): {} namespaceLabels = the deployment's own namespace."""
    peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(sorted(scraped_by.pod_labels.items()))}}
    if scraped_by.namespace_labels:
        peer["namespaceSelector"] = {"matchLabels": dict(sorted(scraped_by.namespace_labels.items()))}
    return peer


def network_policies(cr_name: str, namespace: str, roles: list[str], owner: dict[str, Any] | None,
                     operator_namespace: str | None = None, prometheus_scraped_by: Any = None,
                     slot_routers: bool = False, gateway: Any = None) -> list[dict[str, Any]]:
    """``prometheus_scraped_by``: the api.PeerSelector of the user's Prometheus (metrics source Prometheus), else None.
    ``slot_routers``: each rollout slot has its own vllm-router on ROUTER_INTERNAL_PORT (rollout/slots.py); only
    the deployment's router pods (the front's session proxy) may reach it there: its admin API has no
    authentication.
    ``gateway``: the api.GatewayRoutingSpec in mode Gateway, else None. Then the Gateway's data plane
    (gateway.dataPlanePods; unset: the pods of the Gateway httpRoute names, else none) reaches the engines' serving
    port and the endpoint picker's ext-proc port, the endpoint picker scrapes the engines' serving port, and no router
    policy is rendered."""
    if gateway is not None:
        return _gateway_policies(cr_name, namespace, roles, owner, operator_namespace, prometheus_scraped_by,
                                 gateway)
    engines = lambda: _engine_pods(cr_name, roles)  # noqa: E731

    def router() -> dict[str, Any]:
        return {"matchLabels": L.selector_labels(cr_name, L.ROUTER)}
    policy = lambda suffix, pods, ingress: _policy(cr_name, namespace, owner, suffix, pods, ingress)  # noqa: E731
    scrapers = lambda: _scrapers(operator_namespace, prometheus_scraped_by)  # noqa: E731
    engine_policy = policy("engines", engines(), [
        # any port: the router also subscribes to the engines' KV-event publishers (ports per DP rank)
        {"from": [{"podSelector": router()}]},
        {"from": [{"podSelector": engines()}]},  # P/D KV transfer and DP ranks: every port
        {"from": scrapers(), "ports": [_tcp(ENGINE_PORT)]},
    ])
    router_policy = policy("router-ingress", router(), [
        {"ports": [_tcp(ROUTER_PORT)]},  # clients, from anywhere (also the session proxy's /proxy/metrics)
        {"from": scrapers(), "ports": [_tcp(METRICS_PORT)]},
        *([{"from": [{"podSelector": router()}], "ports": [_tcp(ROUTER_INTERNAL_PORT)]}] if slot_routers else []),
    ])
    return [engine_policy, router_policy]


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def _engine_pods(cr_name: str, roles: list[str]) -> dict[str, Any]:
    """The deployment's engine pods (fresh each call: no shared subtrees, i.e. YAML anchors, in the output)."""
    return {"matchLabels": {L.DEPLOYMENT_LABEL: cr_name},
            "matchExpressions": [{"key": L.ROLE_LABEL, "operator": "In", "values": sorted(roles)}]}


def _policy(cr_name: str, namespace: str, owner: dict[str, Any] | None, suffix: str, pods: dict[str, Any],
            ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": L.metadata(cr_name, namespace, L.child_name(cr_name, suffix), "network", owner),
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _scrapers(operator_namespace: str | None, prometheus_scraped_by: Any) -> list[dict[str, Any]]:
    """Who may scrape metrics ports: the operator, and the user's Prometheus with metrics source Prometheus."""
    peers = [_operator_peer(operator_namespace)]
    return peers + [_prometheus_peer(prometheus_scraped_by)] if prometheus_scraped_by is not None else peers


# The label Gateway API implementations put on the pods they deploy for a Gateway (GEP-1762: Istio, kgateway, ...).
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"


def _data_plane_peer(namespace: str, gateway: Any) -> dict[str, Any] | None:
    """The Gateway's data-plane pods: gateway.dataPlanePods, else the pods of the Gateway that httpRoute names (by
    the GEP-1762 label, in its namespace), else None (no pod)."""
    if gateway.data_plane_pods is not None:
        return _prometheus_peer(gateway.data_plane_pods)  # the same namespace/pod label shape
    if gateway.http_route is not None:
        return {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": gateway.http_route.namespace or namespace}},
                "podSelector": {"matchLabels": {GATEWAY_NAME_LABEL: gateway.http_route.name}}}
    return None


def _gateway_policies(cr_name: str, namespace: str, roles: list[str], owner: dict[str, Any] | None,
                      operator_namespace: str | None, prometheus_scraped_by: Any, gateway: Any) -> list[dict[str, Any]]:
    """Engines: the Gateway's data plane and the endpoint picker on the serving port, the deployment's own engines
    on any port, the scrapers on the serving port. Never any pod: without a named data plane no rule admits one."""
    def epp() -> dict[str, Any]:
        return {"matchLabels": L.selector_labels(cr_name, EPP)}

    def data_plane(port: int) -> list[dict[str, Any]]:
        peer = _data_plane_peer(namespace, gateway)
        return [] if peer is None else [{"from": [peer], "ports": [_tcp(port)]}]

    return [
        _policy(cr_name, namespace, owner, "engines", _engine_pods(cr_name, roles), [
            *data_plane(ENGINE_PORT),  # requests from the Gateway (the decode pod's sidecar, or vLLM)
            {"from": [{"podSelector": epp()}], "ports": [_tcp(ENGINE_PORT)]},  # the picker scrapes /metrics
            {"from": [{"podSelector": _engine_pods(cr_name, roles)}]},  # P/D KV transfer, the sidecar's prefill call
            {"from": _scrapers(operator_namespace, prometheus_scraped_by), "ports": [_tcp(ENGINE_PORT)]},
        ]),
        _policy(cr_name, namespace, owner, "epp-ingress", epp(), [
            *data_plane(EPP_GRPC_PORT),  # the Gateway's ext-proc calls
            {"from": _scrapers(operator_namespace, prometheus_scraped_by), "ports": [_tcp(EPP_METRICS_PORT)]},
        ]),
    ]
