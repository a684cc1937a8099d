"""spec.routing.mode: Gateway (render/gateway.py): the InferencePool, llm-d's endpoint picker, the P/D sidecar, the
HTTPRoute, their RBAC and NetworkPolicies, and what the CRD refuses. The rendered InferencePool and HTTPRoute are
checked against the CRDs of the pinned modules (copied into the tool cache by `bash e2e/build-tools.sh gie
gateway-api`; absent: skipped locally, failed under CI)."""
from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path

import pytest
import yaml

from prereq import require_tool, tool_cache, versions
from v41flash.api import v1alpha1 as api
from v41flash.api.validation import validate
from v41flash.render import gateway as gw
from v41flash.render import labels as L
from v41flash.render import render
from v41flash.render.ports import ENGINE_PORT
from v41flash.render.revision import revision_of
from v41flash.vllm.flags import check_serve_args

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "tp4-h200-pd-gateway.yaml"
V = versions()


def deployment(routing: dict | None = None, **spec) -> api.V41FlashDeployment:
    if "httpRoute" not in (routing or {}).get("gateway", {}):
        spec.setdefault("rollout", {"steps": [100]})  # a canary through the user's own route: blue/green (CRD)
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "demo", "namespace": "ns"},
           "spec": {"gpu": {"product": "H200"}, "routing": {"mode": "Gateway", **(routing or {})}, **spec}}
    assert validate(doc) == [], validate(doc)
    return api.V41FlashDeployment.model_validate(doc)


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def one(objs, kind, name=None):
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in by_kind(objs, kind)])
    return found[0]


def containers(workload):
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


# --- what is rendered ------------------------------------------------------------------------------

def test_default_mode_renders_no_gateway_objects():
    objs = render(deployment({"mode": "VllmRouter"}))
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"InferencePool", "HTTPRoute"}
    assert one(objs, "Deployment", "demo-router")
    assert not [o for o in objs if o["metadata"]["name"].startswith("demo-epp")]


def test_gateway_mode_replaces_the_router_with_pool_and_endpoint_picker():
    objs = render(deployment())
    names = [o["metadata"]["name"] for o in objs]
    assert not [n for n in names if n.startswith("demo-router")]  # no router Deployment, Service, PDB, RBAC
    front, slot = one(objs, "InferencePool", "demo-pool"), one(objs, "InferencePool", "demo-pool-0")
    for pool, picker in ((front, "demo-epp"), (slot, "demo-epp-0")):
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        # the serving pods of its revision, prefill and decode: the picker's filters split the roles
        assert pool["spec"]["selector"]["matchLabels"] == {**L.serving_pods_selector("demo"),
                                                           L.REVISION_LABEL: revision_of(objs)}
        assert pool["spec"]["targetPorts"] == [{"number": ENGINE_PORT}]
        ref = pool["spec"]["endpointPickerRef"]
        assert (ref["kind"], ref["name"], ref["port"]["number"]) == ("Service", picker, gw.EPP_GRPC_PORT)
    epp = one(objs, "Deployment", "demo-epp-0")
    # the front Service and the slot's Service select exactly the slot's picker pods
    for svc in (one(objs, "Service", "demo-epp"), one(objs, "Service", "demo-epp-0")):
        assert svc["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
        assert epp["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert epp["spec"]["template"]["metadata"]["labels"][L.SLOT_LABEL] == "0"
    # scoped to its revision from the first pass (on the Deployment only: a rollout relabels it, no pod restarts)
    assert epp["metadata"]["labels"][L.REVISION_LABEL] == revision_of(objs)
    assert L.REVISION_LABEL not in epp["spec"]["template"]["metadata"]["labels"]
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == "demo-epp"  # shared by every slot's picker
    assert not by_kind(objs, "HTTPRoute")  # only when gateway.httpRoute names a Gateway
    assert not [p for p in by_kind(objs, "PodDisruptionBudget") if p["metadata"]["name"].startswith("demo-epp")]


def test_the_pool_selects_the_serving_pods_of_both_roles():
    objs = render(deployment())
    for pool in by_kind(objs, "InferencePool"):
        selector = pool["spec"]["selector"]["matchLabels"]
        for role in ("prefill", "decode"):
            labels = one(objs, "Deployment", f"demo-{role}")["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), role


def test_endpoint_picker_args_point_at_its_pool_and_config():
    objs = render(deployment())
    epp = one(objs, "Deployment", "demo-epp-0")
    args = containers(epp)["epp"]["args"]
    flag = lambda f: args[args.index(f) + 1]  # noqa: E731
    assert flag("--pool-name") == "demo-pool-0" and flag("--pool-namespace") == "ns"
    assert flag("--pool-group") == "inference.networking.k8s.io"
    cm = one(objs, "ConfigMap", "demo-epp-0")
    mount = containers(epp)["epp"]["volumeMounts"][0]
    assert flag("--config-file") == f"{mount['mountPath']}/{gw.EPP_CONFIG_KEY}"
    assert gw.EPP_CONFIG_KEY in cm["data"]
    assert epp["spec"]["template"]["spec"]["volumes"] == [{"name": "config", "configMap": {"name": "demo-epp-0"}}]
    # vLLM 0.33.0 exposes vllm:kv_cache_usage_perc; the picker's default is the old name
    assert flag("--kv-cache-usage-percentage-metric") == "vllm:kv_cache_usage_perc"
    assert "--ha-enable-leader-election" not in args


def test_pd_config_has_both_profiles_and_the_prefill_header():
    cfg = yaml.safe_load(one(render(deployment()), "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY])
    assert cfg["kind"] == "EndpointPickerConfig"
    types = [p["type"] for p in cfg["plugins"]]
    assert {"pd-profile-handler", "prefill-header-handler", "prefix-cache-scorer", "max-score-picker"} <= set(types)
    assert [p["name"] for p in cfg["schedulingProfiles"]] == ["prefill", "decode"]
    filters = {p["name"]: p["parameters"] for p in cfg["plugins"] if p["type"] == "by-label"}
    assert filters["prefill-pods"] == {"label": L.ROLE_LABEL, "validValues": ["prefill"], "allowsNoLabel": False}
    assert filters["decode-pods"]["validValues"] == ["decode"]
    declared = {p.get("name", p["type"]) for p in cfg["plugins"]}
    for profile in cfg["schedulingProfiles"]:
        refs = [r["pluginRef"] for r in profile["plugins"]]
        assert set(refs) <= declared  # every reference resolves
        assert refs[0] == f"{profile['name']}-pods" and refs[-1] == "max-score-picker"


def test_aggregated_config_has_one_profile_and_no_sidecar():
    objs = render(deployment(prefill={"enabled": False}))
    cfg = yaml.safe_load(one(objs, "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY])
    types = [p["type"] for p in cfg["plugins"]]
    assert "single-profile-handler" in types and "pd-profile-handler" not in types
    assert [p["name"] for p in cfg["schedulingProfiles"]] == ["default"]
    assert list(containers(one(objs, "Deployment", "demo-decode"))) == ["vllm"]


def test_aggregated_gateway_mode_keeps_the_engine_pods_and_their_revision():
    """Switching an aggregated deployment to mode Gateway replaces only the router: no engine restarts."""
    router = render(deployment({"mode": "VllmRouter"}, prefill={"enabled": False}))
    gateway = render(deployment(prefill={"enabled": False}))
    assert one(router, "Deployment", "demo-decode") == one(gateway, "Deployment", "demo-decode")


def test_pd_decode_pods_carry_the_sidecar_on_the_serving_port_and_vllm_behind_it():
    objs = render(deployment())
    decode = containers(one(objs, "Deployment", "demo-decode"))
    assert list(decode) == ["routing-sidecar", "vllm"]
    sidecar, vllm = decode["routing-sidecar"], decode["vllm"]
    assert sidecar["ports"] == [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    args = sidecar["args"]
    assert args[args.index("--port") + 1] == str(ENGINE_PORT)
    assert args[args.index("--vllm-port") + 1] == str(gw.VLLM_BEHIND_SIDECAR_PORT)
    assert args[args.index("--connector") + 1] == "nixlv2" and "--secure-proxy=false" in args
    assert vllm["args"][vllm["args"].index("--port") + 1] == str(gw.VLLM_BEHIND_SIDECAR_PORT)
    assert vllm["ports"][0] == {"name": "vllm", "containerPort": gw.VLLM_BEHIND_SIDECAR_PORT, "protocol": "TCP"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"]["port"] == gw.VLLM_BEHIND_SIDECAR_PORT, probe
    assert check_serve_args(vllm["args"]) == []  # vLLM 0.33.0's parser takes the moved port
    prefill = containers(one(objs, "Deployment", "demo-prefill"))
    assert list(prefill) == ["vllm"] and prefill["vllm"]["ports"][0]["containerPort"] == ENGINE_PORT


def test_pd_gateway_mode_changes_only_the_decode_revision_inputs():
    router = render(deployment({"mode": "VllmRouter"}))
    gateway = render(deployment())
    assert one(router, "Deployment", "demo-prefill")["spec"]["template"]["spec"] == \
        one(gateway, "Deployment", "demo-prefill")["spec"]["template"]["spec"]
    assert one(router, "Deployment", "demo-decode") != one(gateway, "Deployment", "demo-decode")


def test_multi_node_decode_gets_the_sidecar_on_the_leader_only():
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "gb300-pd-dep4-dep16.yaml").read_text())
    doc["spec"]["routing"] = {"mode": "Gateway", "gateway": {"httpRoute": {"name": "gw"}}}
    assert validate(doc) == []
    objs = render(api.V41FlashDeployment.model_validate(doc))
    lws = one(objs, "LeaderWorkerSet", f"{doc['metadata']['name']}-decode")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert [c["name"] for c in tmpl["leaderTemplate"]["spec"]["containers"]] == ["routing-sidecar", "vllm"]
    assert [c["name"] for c in tmpl["workerTemplate"]["spec"]["containers"]] == ["vllm"]
    # a DEP pod's API server balances its ranks behind one port: the sidecar is not told the DP size
    assert "--data-parallel-size" not in tmpl["leaderTemplate"]["spec"]["containers"][0]["args"]


def test_http_route_attaches_the_pool_to_the_named_gateway():
    objs = render(deployment({"gateway": {"httpRoute": {"name": "gw", "namespace": "infra",
                                                        "sectionName": "https"}}}))
    route = one(objs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw",
                                            "namespace": "infra", "sectionName": "https"}]
    rule = route["spec"]["rules"][0]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                    "name": "demo-pool", "weight": 100}]
    assert {m["path"]["value"] for m in rule["matches"]} >= {"/v1/chat/completions", "/v1/completions"}
    assert rule["timeouts"]["request"] == "4h"  # the routing request timeout, 14400 s


@pytest.mark.parametrize("seconds, text", [(14400, "4h"), (3725, "1h2m5s"), (59, "59s"), (604800, "168h"),
                                           (0, "0s"), (61, "1m1s")])
def test_gateway_duration_fits_the_gateway_api_pattern(seconds, text):
    import re
    assert gw.gateway_duration(seconds) == text
    assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", text)


def test_rbac_lets_the_picker_read_pods_and_pools_only():
    objs = render(deployment())
    role = one(objs, "Role", "demo-epp")
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"]}
    assert granted == {("", "pods"): {"get", "list", "watch"},
                       ("inference.networking.k8s.io", "inferencepools"): {"get", "list", "watch"},
                       ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "list", "watch"}}
    binding = one(objs, "RoleBinding", "demo-epp")
    epp = one(objs, "Deployment", "demo-epp-0")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-epp", "namespace": "ns"}]
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == "demo-epp"


def test_one_picker_without_leader_election():
    epp = one(render(deployment()), "Deployment", "demo-epp-0")
    assert epp["spec"]["replicas"] == 1 and "--ha-enable-leader-election" not in containers(epp)["epp"]["args"]


def test_scorer_weights_reach_the_config_and_a_zero_weight_drops_the_scorer():
    objs = render(deployment({"gateway": {"prefixCacheWeight": 5, "queueWeight": 0, "kvCacheUtilizationWeight": 1.0}}))
    cfg = yaml.safe_load(one(objs, "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY])
    weights = {r["pluginRef"]: r.get("weight") for r in cfg["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] == 5 and weights["kv-cache-utilization-scorer"] == 1
    assert all(type(w) is int for n, w in weights.items() if n.endswith("-scorer"))  # "1", never "1.0"
    assert "queue-scorer" not in weights and "queue-scorer" not in [p["type"] for p in cfg["plugins"]]


def test_without_the_prefix_scorer_the_pd_handler_is_not_pointed_at_it():
    objs = render(deployment({"gateway": {"prefixCacheWeight": 0}}))
    cfg = yaml.safe_load(one(objs, "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY])
    handler = next(p for p in cfg["plugins"] if p["type"] == "pd-profile-handler")
    assert "prefixPluginName" not in handler["parameters"]


# --- network policies ------------------------------------------------------------------------------

def _ingress(policy):
    return policy["spec"]["ingress"]


def test_network_policies_admit_the_data_plane_and_the_picker_only_where_needed():
    objs = render(deployment({"gateway": {"dataPlanePods": {"namespaceLabels": {"kubernetes.io/metadata.name": "eg"},
                                                            "podLabels": {"app": "envoy"}}}}))
    names = {p["metadata"]["name"] for p in by_kind(objs, "NetworkPolicy")}
    assert names == {"demo-engines", "demo-epp-ingress"}
    peer = {"podSelector": {"matchLabels": {"app": "envoy"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "eg"}}}
    engines = _ingress(one(objs, "NetworkPolicy", "demo-engines"))
    assert {"from": [peer], "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]} in engines
    epp_pods = {"podSelector": {"matchLabels": L.selector_labels("demo", gw.EPP)}}
    assert {"from": [epp_pods], "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]} in engines
    epp = one(objs, "NetworkPolicy", "demo-epp-ingress")
    assert epp["spec"]["podSelector"] == {"matchLabels": L.selector_labels("demo", gw.EPP)}
    assert {"from": [peer], "ports": [{"protocol": "TCP", "port": gw.EPP_GRPC_PORT}]} in _ingress(epp)
    # the picker's pods match its policy's selector
    labels = one(objs, "Deployment", "demo-epp-0")["spec"]["template"]["metadata"]["labels"]
    assert epp["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def _peers(policy):
    return [peer for rule in _ingress(policy) for peer in rule["from"]]


@pytest.mark.parametrize("routing", [
    None, {"gateway": {"httpRoute": {"name": "gw", "namespace": "infra"}}},
    {"gateway": {"dataPlanePods": {"podLabels": {"app": "envoy"}}}}])
def test_no_rule_admits_every_pod(routing):
    """Issue 39: the engines' serving port was open to any pod of the cluster in mode Gateway, so the Gateway's
    authentication could be walked around. Every rule now names its peers: the picker, the named data plane, the
    deployment's own engines, the operator."""
    objs = render(deployment(routing))
    for policy in by_kind(objs, "NetworkPolicy"):
        for rule in _ingress(policy):
            assert rule.get("from"), (policy["metadata"]["name"], rule)
            assert all(peer.get("podSelector", {}).get("matchLabels") for peer in rule["from"]), rule


def test_without_data_plane_pods_the_gateway_named_by_the_route_or_no_pod():
    engines = one(render(deployment()), "NetworkPolicy", "demo-engines")
    epp_pods = {"podSelector": {"matchLabels": L.selector_labels("demo", gw.EPP)}}
    assert epp_pods in _peers(engines)
    assert all(p == epp_pods or L.DEPLOYMENT_LABEL in str(p) or "operator" in str(p) for p in _peers(engines))
    assert _ingress(one(render(deployment()), "NetworkPolicy", "demo-epp-ingress"))[0]["ports"] == [
        {"protocol": "TCP", "port": gw.EPP_METRICS_PORT}]  # the scrapers only
    routed = render(deployment({"gateway": {"httpRoute": {"name": "gw", "namespace": "infra"}}}))
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "infra"}},
            "podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "gw"}}}
    assert {"from": [peer], "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]} in _ingress(
        one(routed, "NetworkPolicy", "demo-engines"))
    assert {"from": [peer], "ports": [{"protocol": "TCP", "port": gw.EPP_GRPC_PORT}]} in _ingress(
        one(routed, "NetworkPolicy", "demo-epp-ingress"))


# --- admission --------------------------------------------------------------------------------------

def _problems(routing: dict, **spec) -> list[str]:
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x"},
           "spec": {"routing": routing, **spec}}
    return [str(p) for p in validate(doc)]


@pytest.mark.parametrize("routing, spec, field", [
    ({"gateway": {}}, {}, "spec.routing.gateway"),  # settings of a mode not chosen
    ({"mode": "Gateway", "policy": "cache_aware"}, {}, "spec.routing.policy"),
    ({"mode": "Gateway", "kvEvents": True}, {}, "spec.routing.kvEvents"),
    ({"mode": "Gateway", "sessionKey": "client"}, {}, "spec.routing.sessionKey"),
    ({"mode": "Gateway", "replicas": 2}, {}, "spec.routing.replicas"),
    ({"mode": "Gateway", "image": "other:1"}, {}, "spec.routing.image"),
    ({"mode": "Gateway", "apiKeySecretRef": {"name": "keys"}}, {}, "spec.routing.apiKeySecretRef"),
    ({"mode": "Gateway", "gateway": {"prefixCacheWeight": 0, "queueWeight": 0, "kvCacheUtilizationWeight": 0,
                                     "activeRequestWeight": 0}}, {},
     "spec.routing.gateway.prefixCacheWeight"),
    ({"mode": "Gateway", "gateway": {"prefillThresholdTokens": 100}}, {"prefill": {"enabled": False}},
     "spec.routing.gateway.prefillThresholdTokens"),
    ({"mode": "Gateway", "gateway": {"eppReplicas": 2}}, {}, "spec.routing.gateway"),  # one picker (no field)
    ({"mode": "Gateway", "gateway": {"httpRoute": {"name": "Bad_Name"}}}, {}, "spec.routing.gateway.httpRoute.name"),
    ({"mode": "Gateway", "gateway": {"eppImage": "has space"}}, {}, "spec.routing.gateway.eppImage"),
    ({"mode": "gateway"}, {}, "spec.routing.mode"),
    # the pinned picker reads weights into a Go int: a fraction or a denormal crash-loops it (issue 39)
    ({"mode": "Gateway", "gateway": {"queueWeight": 1.5}}, {}, "spec.routing.gateway.queueWeight"),
    ({"mode": "Gateway", "gateway": {"prefixCacheWeight": 0, "queueWeight": 5e-324, "kvCacheUtilizationWeight": 0,
                                     "activeRequestWeight": 0}}, {}, "spec.routing.gateway.queueWeight"),
    ({"mode": "Gateway", "gateway": {"activeRequestWeight": "2"}}, {}, "spec.routing.gateway.activeRequestWeight"),
    ({"mode": "Gateway", "gateway": {"dataPlanePods": {}}}, {}, "spec.routing.gateway.dataPlanePods"),
])
def test_admission_refuses_naming_the_field(routing, spec, field):
    problems = _problems(routing, **spec)
    assert problems and any(p.startswith(field) for p in problems), problems


@pytest.mark.parametrize("routing, spec", [
    ({"mode": "Gateway"}, {"rollout": {"steps": [100]}}),
    ({"mode": "Gateway", "requestTimeoutSeconds": 600, "sessionAffinityTtlSeconds": 60},  # both modes use them
     {"rollout": {"strategy": "Recreate"}}),
    ({"mode": "Gateway", "gateway": {"prefillThresholdTokens": 100, "httpRoute": {"name": "gw"}}}, {}),
    ({"mode": "VllmRouter", "policy": "cache_aware"}, {}),
])
def test_admission_allows(routing, spec):
    assert _problems(routing, **spec) == []


def test_example_is_valid_and_renders_an_http_route():
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert validate(doc) == []
    objs = render(api.V41FlashDeployment.model_validate(doc))
    assert one(objs, "HTTPRoute")["spec"]["parentRefs"][0]["name"] == "inference-gateway"


def test_default_images_carry_the_pinned_scheduler_release():
    tag = V["LLM_D_INFERENCE_SCHEDULER_VERSION"]
    assert api.DEFAULT_EPP_IMAGE.endswith(f":{tag}") and api.DEFAULT_ROUTING_SIDECAR_IMAGE.endswith(f":{tag}")


# --- the pinned CRDs and binaries -------------------------------------------------------------------

@functools.cache
def _crd_validator(component: str, version_key: str, filename: str, kind_version: str):
    import jsonschema
    from test_render import _structural_to_jsonschema

    path = require_tool(tool_cache() / f"{component}-{V[version_key]}" / "assets" / filename,
                        f"bash e2e/build-tools.sh {component}")
    crd = yaml.safe_load(path.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == kind_version)["schema"]["openAPIV3Schema"]
    schema = _structural_to_jsonschema(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def _pool_validator():
    return _crd_validator("gie", "GATEWAY_API_INFERENCE_EXTENSION_VERSION",
                          "inference.networking.k8s.io_inferencepools.yaml", "v1")


def _route_validator():
    return _crd_validator("gateway-api", "GATEWAY_API_VERSION", "gateway.networking.k8s.io_httproutes.yaml", "v1")


def test_example_pool_and_route_validate_against_the_pinned_crds():
    objs = render(api.V41FlashDeployment.model_validate(yaml.safe_load(EXAMPLE.read_text())))
    for pool in by_kind(objs, "InferencePool"):
        _pool_validator().validate(pool)
    _route_validator().validate(one(objs, "HTTPRoute"))


def test_crd_check_catches_a_bad_pool():
    import jsonschema
    pool = copy.deepcopy(one(render(deployment()), "InferencePool", "demo-pool"))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        _pool_validator().validate(pool)


def test_gateway_objects_of_builtin_kinds_validate_against_kubernetes():
    import kubernetes_validate
    for obj in render(deployment()):
        if obj["apiVersion"].startswith(("inference.networking", "gateway.networking")):
            continue
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def _help(binary: Path) -> str:
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def _flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0].lstrip("-") for a in args if a.startswith("--")}


def test_every_endpoint_picker_flag_exists_in_the_pinned_epp():
    binary = require_tool(tool_cache() / f"epp-{V['LLM_D_INFERENCE_SCHEDULER_VERSION']}" / "epp",
                          "bash e2e/build-tools.sh epp")
    text = _help(binary)
    args = containers(one(render(deployment()), "Deployment", "demo-epp-0"))["epp"]["args"]
    missing = [f for f in _flags(args) if f"-{f}" not in text]
    assert not missing, missing


def _picker_config_types() -> str:
    """The pinned picker's EndpointPickerConfig types (GIE's apix/config/v1alpha1), from the Go module cache the
    tool build fills (e2e/build-tools.sh epp downloads llm-d-inference-scheduler's requirements)."""
    gopath = tool_cache().parent / "gopath" / "pkg" / "mod" / "sigs.k8s.io"
    module = require_tool(gopath / f"gateway-api-inference-extension@{V['GATEWAY_API_INFERENCE_EXTENSION_VERSION']}",
                          "bash e2e/build-tools.sh epp")
    found = [p.read_text() for p in sorted(module.rglob("*types.go"))
             if "type SchedulingPlugin struct" in p.read_text()]
    assert len(found) == 1, "the picker's SchedulingPlugin type moved"
    return found[0]


def test_scorer_weights_are_the_integers_the_pinned_picker_parses():
    """The picker decodes a profile plugin's weight into a Go *int (encoding/json refuses 1.5 or 1e-300 there, and
    the picker exits): the API takes whole numbers only and renders them as YAML integers."""
    import re
    source = _picker_config_types()
    struct = re.search(r"type SchedulingPlugin struct \{(.*?)\n\}", source, re.S).group(1)
    assert re.search(r"\bWeight\s+\*int\b", struct), struct
    assert all(api.GatewayRoutingSpec.model_fields[f].annotation in (int, "int") for f in (
        "prefix_cache_weight", "queue_weight", "kv_cache_utilization_weight", "active_request_weight"))
    objs = render(deployment({"gateway": {"prefixCacheWeight": 7, "queueWeight": 1}}))
    text = one(objs, "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY]
    assert re.findall(r"weight: (\S+)", text) and all(re.fullmatch(r"[1-9][0-9]*", w)
                                                      for w in re.findall(r"weight: (\S+)", text))


def test_every_sidecar_flag_exists_in_the_pinned_sidecar():
    key = f"{V['LLM_D_INFERENCE_SCHEDULER_VERSION']}-v41f1"
    binary = require_tool(tool_cache() / f"pd-sidecar-{key}" / "pd-sidecar", "bash e2e/build-tools.sh pd-sidecar")
    text = _help(binary)
    missing = [f for f in _flags(gw.sidecar_args()) if f"-{f}" not in text]
    assert not missing, missing


# --- a rollout (rollout/slots.render_slots) --------------------------------------------------------

def _rolling(shares=(75, 25), httproute=True, candidate_takes_new=True):
    from v41flash.render import SlotSpec, render
    routing = {"gateway": {"httpRoute": {"name": "shared-gw", "namespace": "infra"}}} if httproute else None
    old = deployment(routing)
    doc = old.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["model"]["revision"] = "next"
    new = api.V41FlashDeployment.model_validate(doc)
    slots = [SlotSpec("", old.spec, share=shares[0], accept_new=shares[0] > 0),
             SlotSpec("a", new.spec, replicas={"prefill": 1, "decode": 1}, share=shares[1],
                      accept_new=candidate_takes_new)]
    return render(new, slots)


def _revision(objs, role, slot):
    name = f"demo-{role}-{slot}" if slot else f"demo-{role}"
    return one(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"][L.REVISION_LABEL]


def test_a_rollout_runs_a_picker_and_a_pool_per_revision_and_the_route_splits_by_share():
    objs = _rolling()
    old_rev, new_rev = _revision(objs, "decode", ""), _revision(objs, "decode", "a")
    assert old_rev != new_rev and _revision(objs, "prefill", "a") == new_rev
    for slot, rev in (("0", old_rev), ("a", new_rev)):
        pool = one(objs, "InferencePool", f"demo-pool-{slot}")
        # a picker sees one revision's pods only: a prefill and a decode of one request share a revision
        assert pool["spec"]["selector"]["matchLabels"] == {**L.serving_pods_selector("demo"), L.REVISION_LABEL: rev}
        assert pool["spec"]["endpointPickerRef"]["name"] == f"demo-epp-{slot}"
        epp = one(objs, "Deployment", f"demo-epp-{slot}")
        args = containers(epp)["epp"]["args"]
        assert args[args.index("--pool-name") + 1] == f"demo-pool-{slot}"
        assert epp["metadata"]["labels"][L.REVISION_LABEL] == rev
        assert one(objs, "Service", f"demo-epp-{slot}")["spec"]["selector"] == epp["spec"]["selector"]["matchLabels"]
    # the front pool (what a user's own HTTPRoute names) serves the serving revision through its picker
    front = one(objs, "InferencePool", "demo-pool")
    assert front["spec"]["selector"]["matchLabels"][L.REVISION_LABEL] == old_rev
    assert one(objs, "Service", "demo-epp")["spec"]["selector"] == \
        one(objs, "Deployment", "demo-epp-0")["spec"]["selector"]["matchLabels"]
    backends = one(objs, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert [(b["name"], b["weight"]) for b in backends] == [("demo-pool", 75), ("demo-pool-a", 25)]
    assert not [o for o in objs if o["metadata"]["name"].startswith("demo-router")]
    assert ROUTES_KEY not in one(objs, "ConfigMap", "demo-config")["data"]  # no session proxy to read it
    assert len(by_kind(objs, "ServiceAccount")) == 1  # the pickers share one identity


ROUTES_KEY = "routes.json"


def test_once_promoted_the_front_follows_the_new_revision_and_the_old_slot_takes_no_new_requests():
    from v41flash.render import SlotSpec, render
    objs = _rolling()
    new_rev = _revision(objs, "decode", "a")
    old = deployment({"gateway": {"httpRoute": {"name": "shared-gw"}}})
    doc = old.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["model"]["revision"] = "next"
    new = api.V41FlashDeployment.model_validate(doc)
    draining = render(new, [SlotSpec("a", new.spec, share=100), SlotSpec("", old.spec, share=0,
                                                                                accept_new=False)])
    assert one(draining, "InferencePool", "demo-pool")["spec"]["selector"]["matchLabels"][L.REVISION_LABEL] == new_rev
    assert one(draining, "Service", "demo-epp")["spec"]["selector"][L.SLOT_LABEL] == "a"
    backends = one(draining, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert [(b["name"], b["weight"]) for b in backends] == [("demo-pool", 100), ("demo-pool-0", 0)]
    for pool in by_kind(draining, "InferencePool"):
        _pool_validator().validate(pool)
    _route_validator().validate(one(draining, "HTTPRoute"))


def test_a_rollout_keeps_the_never_rolled_picker_under_its_name():
    """Slot "" of a rollout renders the picker render() made: the same Deployment (no restart but its labels),
    so the serving revision keeps its picker (and its prefix index) when a rollout starts."""
    before = one(render(deployment()), "Deployment", "demo-epp-0")
    during = one(_rolling(httproute=False), "Deployment", "demo-epp-0")
    assert during["spec"]["template"] == before["spec"]["template"]
    assert during["spec"]["selector"] == before["spec"]["selector"]


def test_the_active_request_scorer_gives_the_picker_a_load_signal_below_saturation():
    """Below saturation queues are empty and KV caches mostly free: only the requests the picker has in flight
    tell engines apart by load (the routing benchmark: without it one engine of 8 took ~90 % of the requests)."""
    def weights(routing=None):
        cfg = yaml.safe_load(one(render(deployment(routing)), "ConfigMap", "demo-epp-0")["data"][gw.EPP_CONFIG_KEY])
        return {r["pluginRef"]: r.get("weight") for p in cfg["schedulingProfiles"] for r in p["plugins"]}, cfg
    refs, cfg = weights()
    assert refs["active-request-scorer"] == 2 and {"type": "active-request-scorer"} in cfg["plugins"]
    refs, cfg = weights({"gateway": {"activeRequestWeight": 0}})
    assert "active-request-scorer" not in refs and {"type": "active-request-scorer"} not in cfg["plugins"]


def test_a_scorer_weight_change_rolls_the_picker_and_nothing_else():
    """The picker reads its plugins file once, at start: the pod template carries a hash of it, so a new weight
    replaces the picker pod (surge first) instead of sitting in the ConfigMap until some later restart."""
    def picker_and_engines(**gw_fields):
        objs = render(deployment({"gateway": gw_fields} if gw_fields else None))
        picker = one(objs, "Deployment", "demo-epp-0")
        engines = [o["spec"]["template"] for o in by_kind(objs, "Deployment")
                   if o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")]
        return picker, engines

    base, engines = picker_and_engines()
    same, _ = picker_and_engines()
    changed, engines2 = picker_and_engines(activeRequestWeight=3)
    key = L.CONFIG_HASH_ANNOTATION
    assert base["spec"]["template"]["metadata"]["annotations"][key] == \
        same["spec"]["template"]["metadata"]["annotations"][key]
    assert base["spec"]["template"]["metadata"]["annotations"][key] != \
        changed["spec"]["template"]["metadata"]["annotations"][key]
    assert engines == engines2  # the engines do not restart for a picker setting
    assert base["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
