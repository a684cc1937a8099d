"""NetworkPolicies (issue 12): engines reachable only from their router, their own engines and the
operator; the router's client port from anywhere, its metrics port only from the operator; the session
front's API key wired from the Secret."""
import json

from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.render import render
from v41flash.render import labels as L


def _cr(spec=None, name="demo"):
    return V41FlashDeployment.model_validate({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                              "metadata": {"name": name, "namespace": "ns"}, "spec": spec or {}})


def _policies(objs):
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}


def _selects(selector, labels):
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _pod_labels(objs):
    out = {}
    for o in objs:
        if o["kind"] == "Deployment":
            out[o["metadata"]["name"]] = o["spec"]["template"]["metadata"]["labels"]
    return out


def test_engine_policy_selects_every_engine_pod_and_admits_only_router_engines_operator():
    objs = render(_cr(), operator_namespace="v41flash-system")
    pols = _policies(objs)
    assert set(pols) == {"demo-engines", "demo-router-ingress"}
    eng = pols["demo-engines"]["spec"]
    pods = _pod_labels(objs)
    assert _selects(eng["podSelector"], pods["demo-prefill"]) and _selects(eng["podSelector"], pods["demo-decode"])
    assert not _selects(eng["podSelector"], pods["demo-router"])
    assert eng["policyTypes"] == ["Ingress"]
    peers = [(r["from"][0], r.get("ports")) for r in eng["ingress"]]
    assert all("from" in r for r in eng["ingress"])  # no rule open to everyone
    router_peer, engines_peer, operator_peer = peers
    assert _selects(router_peer[0]["podSelector"], pods["demo-router"]) and router_peer[1] is None  # + KV events
    assert _selects(engines_peer[0]["podSelector"], pods["demo-decode"]) and engines_peer[1] is None
    assert operator_peer[0] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "v41flash-system"}},
                                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator",
                                                                L.SCRAPER_LABEL: "true"}}}
    # another deployment's router is not a peer
    other = _pod_labels(render(_cr(name="other")))["other-router"]
    assert not _selects(router_peer[0]["podSelector"], other)


def test_router_policy_opens_the_client_port_and_keeps_metrics_to_the_operator():
    objs = render(_cr())
    rt = _policies(objs)["demo-router-ingress"]["spec"]
    assert _selects(rt["podSelector"], _pod_labels(objs)["demo-router"])  # the front
    assert _selects(rt["podSelector"], _pod_labels(objs)["demo-router-0"])  # slot ""'s vllm-router
    clients, metrics, routers = rt["ingress"]
    assert clients == {"ports": [{"protocol": "TCP", "port": 30000}]}
    assert metrics["ports"] == [{"protocol": "TCP", "port": 29000}]
    assert metrics["from"][0]["namespaceSelector"] == {}  # operator namespace unknown offline: any namespace
    # vllm-router's port (its admin API has no authentication): from the deployment's router pods only
    assert routers["ports"] == [{"protocol": "TCP", "port": 30001}]
    assert [_selects(routers["from"][0]["podSelector"], labels) for labels in (
        _pod_labels(objs)["demo-router"], _pod_labels(objs)["demo-router-0"], _pod_labels(objs)["demo-decode"])] == [
        True, True, False]


def test_aggregated_engine_policy_covers_decode_only():
    objs = render(_cr({"prefill": {"enabled": False}}))
    expr = _policies(objs)["demo-engines"]["spec"]["podSelector"]["matchExpressions"]
    assert expr == [{"key": L.ROLE_LABEL, "operator": "In", "values": ["decode"]}]


def _lua(objs) -> str:
    """The front's Lua step as its bootstrap carries it."""
    boot = json.loads(next(o for o in objs if o["kind"] == "ConfigMap")["data"]["front-envoy.json"])
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    lua = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.lua")
    return lua["typed_config"]["default_source_code"]["inline_string"]


def test_api_key_secret_reaches_the_front_as_env_not_as_text():
    objs = render(_cr({"routing": {"apiKeySecretRef": {"name": "clients", "key": "key"}}}))
    router = next(o for o in objs if o["metadata"]["name"] == "demo-router" and o["kind"] == "Deployment")
    front = router["spec"]["template"]["spec"]["containers"][0]
    assert front["name"] == "front"
    assert front["env"] == [{"name": "V41FLASH_PROXY_API_KEY",
                             "valueFrom": {"secretKeyRef": {"name": "clients", "key": "key"}}}]
    assert 'API_KEY_ENV = "V41FLASH_PROXY_API_KEY"' in _lua(objs)  # the variable's name, never the key
    no_key = render(_cr())
    front = next(o for o in no_key if o["metadata"]["name"] == "demo-router" and o["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]
    assert "env" not in front and 'API_KEY_ENV = ""' in _lua(no_key)


PROM = {"autoscaling": {"metrics": {"source": "Prometheus", "prometheus": {
    "url": "http://prometheus.monitoring:9090",
    "scrapedBy": {"namespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
                  "podLabels": {"app.kubernetes.io/name": "prometheus"}}}}}}
PROM_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def test_prometheus_source_admits_the_users_prometheus_to_the_metrics_ports_only():
    pols = _policies(render(_cr(PROM), operator_namespace="v41flash-system"))
    scrape = pols["demo-engines"]["spec"]["ingress"][2]
    assert scrape["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert scrape["from"][1] == PROM_PEER and scrape["from"][0]["podSelector"]["matchLabels"][L.SCRAPER_LABEL] == "true"
    metrics = pols["demo-router-ingress"]["spec"]["ingress"][1]
    assert metrics["ports"] == [{"protocol": "TCP", "port": 29000}] and metrics["from"][1] == PROM_PEER
    # the scrape source admits nobody but the operator; a pod selector alone stays in the deployment's namespace
    assert len(_policies(render(_cr()))["demo-engines"]["spec"]["ingress"][2]["from"]) == 1
    same_ns = {"autoscaling": {"metrics": {"source": "Prometheus", "prometheus": {
        "url": "http://prom:9090", "scrapedBy": {"podLabels": {"app": "prometheus"}}}}}}
    peer = _policies(render(_cr(same_ns)))["demo-engines"]["spec"]["ingress"][2]["from"][1]
    assert peer == {"podSelector": {"matchLabels": {"app": "prometheus"}}}
