from pathlib import Path

import cel
import pytest
import yaml

from v41flash import gpus
from v41flash.api import v1alpha1 as api
from v41flash.api.crd import crd, crd_yaml
from v41flash.api.validation import validate
from v41flash.cli.manifests import CRD_PATH, _problems
from e2e.corpus import invalid_cases

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def test_checked_in_crd_matches_models():
    assert (ROOT / CRD_PATH).read_text() == crd_yaml(), "run `v41flash crd` to regenerate crds/"


def _walk(node, path="openAPIV3Schema"):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")


def test_crd_schema_is_structural():
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs"):
            assert banned not in node, f"{path} has {banned}"
        if "properties" in node:
            assert "additionalProperties" not in node, path


def test_every_spec_field_has_a_description():
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [p for p, n in _walk(spec, "spec") if p != "spec" and not p.endswith("[]") and not n.get("description")]
    assert missing == []


def test_printer_columns():
    cols = {c["name"]: c["jsonPath"] for c in crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["Prefill"] == ".status.prefill.ready"
    assert cols["Decode"] == ".status.decode.ready"
    assert cols["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert cols["TTFT"] == ".status.slo.ttft"
    assert {"Profile", "Age"} <= cols.keys()


def test_empty_spec_gets_sensible_defaults():
    spec = api.V41FlashDeploymentSpec()
    assert spec.model.checkpoint == "deepseek-ai/DeepSeek-V4.1-Flash-1017"
    assert spec.profile == "low-latency"
    assert spec.vllm_version == "0.33.0"
    assert spec.model.source.hub is not None and spec.model.source.pvc is None
    assert spec.kv_transfer.connector == "NixlConnector"
    assert spec.gpu.tolerations[0].key == "nvidia.com/gpu"
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["slo"]["e2eP95Seconds"] == 60.0
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"}, "spec": {}}
    assert validate(doc) == []


def test_crd_defaults_match_model_defaults():
    """The apiserver defaults from the CRD; offline validation from pydantic: they must agree."""
    spec_schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def apply_defaults(schema, value):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = yaml.safe_load(yaml.safe_dump(sub["default"]))
            if name in value and isinstance(value[name], dict):
                apply_defaults(sub, value[name])
        return value

    assert apply_defaults(spec_schema, {}) == api.V41FlashDeploymentSpec().model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda c: c.name)
def test_invalid_corpus_is_refused_naming_the_field(case):
    problems = _problems(case.doc())
    assert problems, f"{case.name} was accepted"
    assert any(p.startswith(case.field + ":") for p in problems), problems


def test_corpus_is_large_enough():
    cases = invalid_cases()
    assert len(cases) >= 20
    assert sum(c.admission == "refused" for c in cases) >= 20


def test_cel_errors_name_the_field():
    doc = yaml.safe_load((ROOT / "tests/invalid/12-redundant-uneven.yaml").read_text())
    problems = [str(p) for p in validate(doc)]
    assert problems == ["spec.decode.eplb.numRedundantExperts: 384 routed experts + numRedundantExperts must "
                        "split evenly over the expert-parallel ranks (tensor x data parallel size)"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid(path):
    for doc in yaml.safe_load_all(path.read_text()):
        assert _problems(doc) == []


def test_per_gpu_product_cel_gives_each_products_value():
    """The CEL defaults are generated from the GPU table: evaluated per product, they are its values."""
    for value in (lambda p: p.gpus_per_node, lambda p: p.low_latency_tp, gpus.smallest_fitting_dp):
        rule = api.per_gpu_product(value)
        for name, product in gpus.GPU_PRODUCTS.items():
            assert cel.evaluate(rule, {"self": {"gpu": {"product": name}}}) == value(product), (rule, name)


def _routing_problems(routing):
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"}, "spec": {"routing": routing}}
    return [str(p) for p in validate(doc)]


def test_routing_default_is_sticky_behind_the_session_proxy():
    r = api.RoutingSpec()
    assert (r.policy, r.session_key, r.session_header) == ("sticky_least_loaded", "derive", "")
    assert r.session_proxy_image == api.DEFAULT_OPERATOR_IMAGE


@pytest.mark.parametrize("routing, field", [
    ({"sessionKey": "client"}, "spec.routing.policy"),  # the default policy keys on x-session-id
    ({"sessionKey": "client", "policy": "consistent_hash"}, "spec.routing.policy"),
    ({"sessionKey": "client", "policy": "cache_aware", "sessionHeader": "x-conv"}, "spec.routing.sessionHeader"),
    ({"sessionHeader": "x conv"}, "spec.routing.sessionHeader"),
    ({"sessionKey": "sometimes"}, "spec.routing.sessionKey"),
])
def test_session_key_rules_refuse(routing, field):
    problems = _routing_problems(routing)
    assert problems and any(field in p for p in problems), problems


@pytest.mark.parametrize("routing", [
    {"sessionKey": "client", "policy": "cache_aware"},
    {"sessionKey": "client", "policy": "round_robin", "decodePolicy": "sticky_least_loaded"},
    {"policy": "consistent_hash", "sessionHeader": "X-Conversation-Id"},
    {"sessionKey": "derive", "policy": "cache_aware"},
    # the session proxy runs in both modes, so it checks the API key in both
    {"sessionKey": "client", "policy": "cache_aware", "apiKeySecretRef": {"name": "keys", "key": "k"}},
])
def test_session_key_rules_allow(routing):
    assert _routing_problems(routing) == []


def test_prometheus_metrics_source_validates_and_defaults():
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"}, "spec": {"autoscaling": {
        "metrics": {"source": "Prometheus", "prometheus": {
            "url": "https://thanos-query.monitoring.svc:10902/prom", "matchLabels": {"cluster": "prod-1"},
            "scrapedBy": {"namespaceLabels": {"kubernetes.io/metadata.name": "monitoring"}}}}}}}
    assert validate(doc) == []
    p = api.V41FlashDeployment.model_validate(doc).spec.autoscaling.metrics.prometheus
    assert (p.pod_label, p.namespace_label, p.timeout_seconds, p.scraped_by.pod_labels) == ("pod", "namespace", 10.0, {})
    assert api.V41FlashDeploymentSpec().autoscaling.metrics.source == "Scrape"
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    metrics = schema["autoscaling"]["properties"]["metrics"]
    assert metrics["properties"]["source"]["enum"] == ["Scrape", "Prometheus"]
    assert metrics["properties"]["prometheus"]["properties"]["matchLabels"]["maxProperties"] == 16


def test_routing_mode_transition_rule_needs_recreate_and_is_not_checked_on_create():
    """spec.routing.mode changes only with rollout.strategy: Recreate (a transition rule: the apiserver evaluates it
    on updates against the old object; the operator's own validation, which has no old object, skips it)."""
    from v41flash.api.validation import defaulted
    spec_schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    (rule,) = [r for r in spec_schema["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    assert rule["fieldPath"] == ".routing.mode" and rule["message"] == api.ROUTING_MODE_CHANGE

    def spec(mode, strategy="Canary"):
        doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
               "spec": {"routing": {"mode": mode}, "rollout": {"strategy": strategy}}}
        return defaulted(api.V41FlashDeployment.model_validate(doc))["spec"]

    ok = lambda new, old: cel.evaluate(rule["rule"], {"self": new, "oldSelf": old})  # noqa: E731
    assert ok(spec("VllmRouter"), spec("VllmRouter")) and ok(spec("Gateway"), spec("Gateway"))
    assert not ok(spec("Gateway"), spec("VllmRouter")) and not ok(spec("VllmRouter"), spec("Gateway"))
    assert ok(spec("Gateway", "Recreate"), spec("VllmRouter"))
    assert ok(spec("VllmRouter"), spec("VllmRouter", "Recreate"))  # the strategy alone may change back
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
           "spec": {"routing": {"mode": "Gateway", "gateway": {"httpRoute": {"name": "gw"}}}}}
    assert validate(doc) == []


@pytest.mark.parametrize("routing, rollout, refused", [
    ({"mode": "Gateway"}, {}, True),  # default steps 5 -> 25 -> 50 -> 100 through the user's own route
    ({"mode": "Gateway", "gateway": {}}, {"steps": [50, 100]}, True),
    ({"mode": "Gateway"}, {"steps": [100]}, False),  # blue/green: the front pool moves for the judged step
    ({"mode": "Gateway"}, {"strategy": "Recreate"}, False),
    ({"mode": "Gateway", "gateway": {"httpRoute": {"name": "gw"}}}, {}, False),  # the operator splits the route
    ({"mode": "VllmRouter"}, {}, False),
])
def test_a_gateway_canary_below_100_percent_needs_the_operator_s_route(routing, rollout, refused):
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
           "spec": {"routing": routing, "rollout": rollout}}
    problems = [str(p) for p in validate(doc)]
    if refused:
        assert len(problems) == 1 and problems[0].startswith("spec.rollout.steps: in mode Gateway"), problems
        assert "routing.gateway.httpRoute" in problems[0] and "[100]" in problems[0] and "Recreate" in problems[0]
    else:
        assert problems == []
