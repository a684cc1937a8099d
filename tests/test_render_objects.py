"""Unit tests of the rendered objects: replicas ownership, owner refs, P/D vs aggregated, KV events,
selectors vs labels, GPU requests, LeaderWorkerSet shape, router args, operator checks."""
import json
from pathlib import Path

import pytest
import yaml
from vllm_router.launch_router import parse_router_args

from v41flash.api import v1alpha1 as api
from v41flash.facts import DEFAULT_CHECKPOINT
from v41flash.api.validation import Problem
from v41flash.render import render
from v41flash.render.checks import (
    engine_problems, gpu_budget_problems, host_memory_problems, operator_checks, spec_path,
)
from v41flash.render.timing import PodTiming
from v41flash.render.revision import revision_of
from v41flash.render.router import SLL_SESSION_EXPIRATION_ENV, intra_node_dp_size
from v41flash.render.resolve import resolve

ROOT = Path(__file__).resolve().parents[1]
OWNER = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "t", "uid": "0000-1111"}


def cr(spec=None, name="t", namespace="ns"):
    return api.V41FlashDeployment.model_validate({
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace}, "spec": spec or {}})


def example(stem):
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / f"{stem}.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    return api.V41FlashDeployment.model_validate(doc)


def by_kind_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def workload(objs, role, name="t"):
    return next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")
                and o["metadata"]["name"] == f"{name}-{role}")


def pod_templates(w):
    if w["kind"] == "Deployment":
        return [w["spec"]["template"]]
    lwt = w["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


def engine(template):
    return next(c for c in template["spec"]["containers"] if c["name"] == "vllm")


def flag(args, name):
    return args[args.index(name) + 1]


def router_containers(objs, name="t"):
    """The front's Envoy and counters and slot ""'s vllm-router, by container name."""
    found = by_kind_name(objs)
    return {c["name"]: c for dep in (found[("Deployment", f"{name}-router")], found[("Deployment", f"{name}-router-0")])
            for c in dep["spec"]["template"]["spec"]["containers"]}


def router_container(objs, name="t"):
    return router_containers(objs, name)["router"]


def env_of(container):
    return {e["name"]: e for e in container["env"]}


# --- names, labels, determinism ---------------------------------------------------------------------

def test_default_pd_objects_names_and_order():
    objs = render(cr())
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("ConfigMap", "t-config"),
        ("Service", "t-prefill"), ("PodDisruptionBudget", "t-prefill"), ("Deployment", "t-prefill"),
        ("Service", "t-decode"), ("PodDisruptionBudget", "t-decode"), ("Deployment", "t-decode"),
        ("ServiceAccount", "t-router"), ("Role", "t-router"), ("RoleBinding", "t-router"),
        ("Deployment", "t-router"), ("Service", "t-router"), ("Service", "t-router-serving"),
        ("HorizontalPodAutoscaler", "t-router"), ("Deployment", "t-router-0"), ("Service", "t-router-0"), ("PodDisruptionBudget", "t-router"),
        ("NetworkPolicy", "t-engines"), ("NetworkPolicy", "t-router-ingress"),
    ]
    assert all(o["metadata"]["namespace"] == "ns" for o in objs)


def test_every_object_carries_the_stable_labels():
    for o in render(example("gb300-pd-dep4-dep16")):
        labels = o["metadata"]["labels"]
        component = "network" if o["kind"] == "NetworkPolicy" else \
            o["metadata"]["name"].removesuffix("-0").removesuffix("-serving").removesuffix("-imex").rsplit("-", 1)[1]
        assert labels["app.kubernetes.io/name"] == "v41flash"
        assert labels["app.kubernetes.io/instance"] == "gb300-pd-dep4-dep16"
        assert labels["app.kubernetes.io/managed-by"] == "v41flash-operator"
        assert labels["app.kubernetes.io/component"] == component
        assert labels["v41flash.io/deployment"] == "gb300-pd-dep4-dep16"
        if component not in ("config", "network"):
            assert labels["v41flash.io/role"] == component


def test_render_is_deterministic_and_independent_of_key_order():
    spec = {"profile": "high-throughput", "gpu": {"product": "B200"},
            "routing": {"policy": "kv_aware", "kvEvents": True}}
    reordered = {"routing": {"kvEvents": True, "policy": "kv_aware"}, "gpu": {"product": "B200"},
                 "profile": "high-throughput"}
    a = render(cr(spec), owner=OWNER)
    assert a == render(cr(spec), owner=OWNER)
    assert yaml.safe_dump_all(a) == yaml.safe_dump_all(render(cr(reordered), owner=OWNER))


# --- replicas and ownership -------------------------------------------------------------------------

def test_replicas_from_controller_else_min_replicas():
    spec = {"prefill": {"minReplicas": 2, "maxReplicas": 4}, "decode": {"minReplicas": 1}}
    objs = render(cr(spec))
    assert workload(objs, "prefill")["spec"]["replicas"] == 2
    assert workload(objs, "decode")["spec"]["replicas"] == 1
    objs = render(cr(spec), replicas={"prefill": 3, "decode": None})
    assert workload(objs, "prefill")["spec"]["replicas"] == 3
    assert workload(objs, "decode")["spec"]["replicas"] == 1


@pytest.mark.parametrize("stem,role", [("tp4-h200-low-latency", "decode"), ("gb300-pd-dep4-dep16", "decode")])
def test_external_replicas_are_never_rendered(stem, role):
    obj = example(stem)
    getattr(obj.spec, role).replicas_managed_by = "external"
    objs = render(obj, replicas={"prefill": 2, "decode": 5})
    w = workload(objs, role, obj.metadata["name"])
    assert "replicas" not in w["spec"]
    other = workload(objs, "prefill", obj.metadata["name"])
    assert other["spec"]["replicas"] == 2
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    assert conf["roles"][role]["replicas"] == "external (HPA/KEDA)"


def test_owner_references_only_with_owner():
    assert all("ownerReferences" not in o["metadata"] for o in render(cr()))
    for o in render(cr(), owner=OWNER):
        assert o["metadata"]["ownerReferences"] == [{
            "apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "name": "t",
            "uid": "0000-1111", "controller": True, "blockOwnerDeletion": True}]


# --- P/D and aggregated -----------------------------------------------------------------------------

def test_pd_engines_are_nixl_producer_and_consumer():
    objs = render(cr())
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        c = engine(pod_templates(workload(objs, role))[0])
        assert json.loads(flag(c["args"], "--kv-transfer-config")) == {
            "kv_connector": "NixlConnector", "kv_role": kv_role, "kv_load_failure_policy": "fail"}
        assert env_of(c)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    args = router_container(objs)["args"]
    assert "--vllm-pd-disaggregation" in args and "--selector" not in args


def test_aggregated_has_no_prefill_objects_and_no_kv_transfer():
    objs = render(example("aggregated-h200"))
    names = [o["metadata"]["name"] for o in objs]
    assert not [n for n in names if n.endswith("-prefill")]
    c = engine(pod_templates(workload(objs, "decode", "aggregated-h200"))[0])
    assert "--kv-transfer-config" not in c["args"]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env_of(c)
    labels = pod_templates(workload(objs, "decode", "aggregated-h200"))[0]["metadata"]["labels"]
    assert labels["v41flash.io/role"] == "decode"
    args = router_container(objs, "aggregated-h200")["args"]
    assert "--vllm-pd-disaggregation" not in args and "--prefill-selector" not in args
    i = args.index("--selector")
    assert args[i + 1:i + 4] == ["v41flash.io/deployment=aggregated-h200", "v41flash.io/role=decode",
                                 "v41flash.io/serving=true"]
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    assert conf["roles"]["prefill"] == {"enabled": False}
    assert conf["roles"]["decode"]["kvRole"] == "none (aggregated)"


# --- KV events and the router ---------------------------------------------------------------------

def test_kv_aware_renders_kv_events_on_engines_and_router_discovery():
    objs = render(example("dep2-b200-high-throughput"))
    name = "dep2-b200-high-throughput"
    for role in ("prefill", "decode"):
        c = engine(pod_templates(workload(objs, role, name))[0])
        events = json.loads(flag(c["args"], "--kv-events-config"))
        assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
        assert events["endpoint"] == "tcp://*:5557"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert (ports["kv-events-0"], ports["kv-events-1"]) == (5557, 5558)  # one per DP rank
    args = router_container(objs, name)["args"]
    assert flag(args, "--prefill-policy") == "kv_aware"
    assert flag(args, "--kv-aware-session-affinity-ttl-secs") == "600"
    assert flag(args, "--intra-node-data-parallel-size") == "2"
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    assert conf["router"]["kvEventSources"].startswith("discovered: GET /kv_event_sources")


def test_no_kv_events_without_kv_events_on():
    objs = render(cr())
    for role in ("prefill", "decode"):
        assert "--kv-events-config" not in engine(pod_templates(workload(objs, role))[0])["args"]
    assert "--kv-aware-session-affinity-ttl-secs" not in router_container(objs)["args"]


def _router_env(objs) -> dict[str, str]:
    return {e["name"]: e["value"] for e in router_container(objs).get("env") or []}


def test_sticky_least_loaded_counts_sessions_for_the_affinity_ttl_not_vllm_routers_two_hours():
    assert _router_env(render(cr())) == {SLL_SESSION_EXPIRATION_ENV: "600"}  # the default policy, P/D
    assert _router_env(render(cr({"routing": {"sessionAffinityTtlSeconds": 90}}))) == {SLL_SESSION_EXPIRATION_ENV: "90"}
    # decode's policy counts too; no sticky policy, or 0 (vllm-router's own default), renders nothing
    assert _router_env(render(cr({"routing": {"policy": "cache_aware", "sessionKey": "client",
                                              "decodePolicy": "sticky_least_loaded"}}))) == \
        {SLL_SESSION_EXPIRATION_ENV: "600"}
    assert _router_env(render(cr({"routing": {"policy": "cache_aware"}}))) == {}
    assert _router_env(render(cr({"routing": {"sessionAffinityTtlSeconds": 0}}))) == {}


def test_cache_aware_thresholds_only_for_cache_aware():
    objs = render(cr({"routing": {"policy": "cache_aware", "cacheThreshold": 0.5}}))
    args = router_container(objs)["args"]
    assert (flag(args, "--cache-threshold"), flag(args, "--balance-abs-threshold"),
            flag(args, "--balance-rel-threshold")) == ("0.5", "4", "1.25")  # the measured defaults
    assert "--cache-threshold" not in router_container(render(cr({"routing": {"policy": "round_robin"}})))["args"]


@pytest.mark.parametrize("stem", ["tp4-h200-low-latency", "dep2-b200-high-throughput", "gb300-pd-dep4-dep16",
                                  "aggregated-h200"])
def test_router_args_parse_with_the_real_router_parser(stem):
    obj = example(stem)
    objs = render(obj)
    c = router_container(objs, obj.metadata["name"])
    assert c["command"] == ["vllm-router"]
    ra = parse_router_args(c["args"])
    ra._validate_router_args()
    # behind the front, on the internal port the router NetworkPolicy opens to the router pods only
    assert (ra.host, ra.port, ra.prometheus_host, ra.prometheus_port) == ("0.0.0.0", 30001, "0.0.0.0", 29000)
    assert ra.service_discovery and ra.service_discovery_port == 8000
    assert ra.service_discovery_namespace == "ns"
    assert ra.request_timeout_secs == 14400 and ra.disable_retries
    res = resolve(obj.spec)
    assert ra.vllm_pd_disaggregation == res.disaggregated
    leader = pod_templates(workload(objs, "decode", obj.metadata["name"]))[0]["metadata"]["labels"]
    selector = ra.decode_selector if res.disaggregated else ra.selector
    assert selector.items() <= leader.items()


def test_intra_node_dp_only_when_all_roles_share_one_dp_size():
    assert intra_node_dp_size(resolve(cr({"profile": "high-throughput", "gpu": {"product": "B200"}}).spec)) == 2
    assert intra_node_dp_size(resolve(example("gb300-pd-dep4-dep16").spec)) == 1
    assert intra_node_dp_size(resolve(cr().spec)) == 1
    assert "--intra-node-data-parallel-size" not in router_container(
        render(example("gb300-pd-dep4-dep16")), "gb300-pd-dep4-dep16")["args"]


def test_retries_flag_follows_spec():
    assert "--disable-retries" not in router_container(render(cr({"routing": {"retries": True}})))["args"]


def test_router_rbac_and_service():
    objs = by_kind_name(render(cr()))
    role = objs[("Role", "t-router")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = objs[("RoleBinding", "t-router")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "t-router", "namespace": "ns"}]
    assert binding["roleRef"]["name"] == "t-router"
    dep = objs[("Deployment", "t-router")]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "t-router"
    assert objs[("Deployment", "t-router-0")]["spec"]["template"]["spec"]["serviceAccountName"] == "t-router"
    assert {(p["port"], p["targetPort"]) for p in objs[("Service", "t-router")]["spec"]["ports"]} == {(8000, "http")}
    assert {(p["port"], p["targetPort"]) for p in objs[("Service", "t-router-0")]["spec"]["ports"]} == {
        (8000, "http"), (29000, "metrics")}


def test_session_key_client_keeps_the_front_in_front():
    # the front is the router admin API's only guard: it runs with sessionKey: client too, forwarding as sent
    objs = render(cr({"routing": {"sessionKey": "client", "policy": "cache_aware",
                                  "apiKeySecretRef": {"name": "keys", "key": "k"}}}))
    cs = router_containers(objs)
    assert list(cs) == ["front", "counters", "router"]
    front, router = cs["front"], cs["router"]
    assert front["env"] == [{"name": "V41FLASH_PROXY_API_KEY",
                             "valueFrom": {"secretKeyRef": {"name": "keys", "key": "k"}}}]
    boot = json.loads(objs[0]["data"]["front-envoy.json"])
    lua = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][1]
    source = lua["typed_config"]["default_source_code"]["inline_string"]
    assert 'SESSION_KEY_MODE = "client"' in source and 'API_KEY_ENV = "V41FLASH_PROXY_API_KEY"' in source
    assert [p["name"] for p in router["ports"]] == ["http", "metrics"]
    ra = parse_router_args(router["args"])
    assert (ra.host, ra.port) == ("0.0.0.0", 30001)  # never the Service's port; the NetworkPolicy opens it to the front
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    assert conf["router"]["front"]["command"] == [*front["command"], *front["args"]]
    assert conf["router"]["sessionKey"].startswith("client")


def test_the_front_is_envoy_on_the_service_port_scaled_by_an_autoscaler():
    objs = render(cr())
    found = by_kind_name(objs)
    cs = router_containers(objs)
    assert list(cs) == ["front", "counters", "router"]
    front, counters, router = cs["front"], cs["counters"], cs["router"]
    # the Service's "http" target is Envoy; slot ""'s router is reached through its own Service
    assert [p["name"] for p in front["ports"]] == ["http"] and front["ports"][0]["containerPort"] == 30000
    assert [(p["name"], p["containerPort"]) for p in router["ports"]] == [("http", 30001), ("metrics", 29000)]
    assert front["image"] == "docker.io/envoyproxy/envoy:v1.40.0" and front["command"] == ["envoy"]
    assert front["args"][:2] == ["-c", "/etc/v41flash/front/front-envoy.json"]
    assert counters["image"] == "v41flash/operator:0.1.0" and counters["args"][0] == "front-counters"
    assert "ports" not in counters  # loopback only: Envoy routes /proxy/metrics to it
    dep = found[("Deployment", "t-router")]
    assert "replicas" not in dep["spec"]  # the autoscaler's
    hpa = found[("HorizontalPodAutoscaler", "t-router")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "t-router"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"][0]["containerResource"]["container"] == "front"
    pod = dep["spec"]["template"]
    assert {i["key"] for i in pod["spec"]["volumes"][0]["configMap"]["items"]} == {
        "front-envoy.json", "front-routes.json", "front-clusters.json"}
    assert all(k in objs[0]["data"] for k in ("front-envoy.json", "front-routes.json", "front-clusters.json"))
    # a routing edit that changes Envoy's bootstrap changes the pod template's hash (Envoy re-reads only routes and
    # clusters in place); one that does not, leaves it
    other = by_kind_name(render(cr({"routing": {"sessionHeader": "x-conversation-id"}})))
    same = by_kind_name(render(cr({"routing": {"sessionAffinityTtlSeconds": 900}})))
    hash_of = lambda o: o[("Deployment", "t-router")]["spec"]["template"]["metadata"]["annotations"]  # noqa: E731
    assert hash_of(other) != hash_of(found) == hash_of(same)
    serving = found[("Service", "t-router-serving")]
    assert serving["spec"]["selector"]["v41flash.io/slot"] == "0" and serving["spec"]["ports"][0]["port"] == 8000
    ra = parse_router_args(router["args"])
    assert ra.port == 30001 and ra.prefill_selector["v41flash.io/serving-revision"] == revision_of(objs)
    assert front["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}  # the serving router's
    assert front["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert front["lifecycle"]["preStop"]["exec"]["command"][0] == "/bin/bash"  # drains before SIGTERM
    assert router["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert router["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}  # 503 without a worker
    for c in (front, counters):
        assert c["securityContext"]["readOnlyRootFilesystem"] and c["resources"]["limits"]["memory"]
    assert flag(router["args"], "--policy" if "--policy" in router["args"] else "--prefill-policy") == \
        "sticky_least_loaded"
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    assert conf["router"]["front"]["command"] == [*front["command"], *front["args"]]
    custom = router_containers(render(cr({"routing": {"sessionProxyImage": "reg/op:1",
                                                      "front": {"image": "reg/envoy:1", "minReplicas": 3}}})))
    assert custom["counters"]["image"] == "reg/op:1" and custom["front"]["image"] == "reg/envoy:1"


# --- selectors, pods, GPUs ----------------------------------------------------------------------------

@pytest.mark.parametrize("stem", ["tp4-h200-low-latency", "gb300-pd-dep4-dep16", "aggregated-h200"])
def test_selectors_match_pod_labels(stem):
    objs = render(example(stem))
    pods = {}  # (role, serving) -> labels
    for w in objs:
        if w["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        templates = pod_templates(w)
        sel = w["spec"]["selector"]["matchLabels"] if w["kind"] == "Deployment" else None
        for t in templates:
            labels = t["metadata"]["labels"]
            if sel:
                assert sel.items() <= labels.items()
            role = labels["v41flash.io/role"]
            pods.setdefault(role, []).append(labels)
    for o in objs:
        role = o["metadata"]["labels"].get("v41flash.io/role")
        if o["kind"] == "Service":
            matched = [p for p in pods[role] if o["spec"]["selector"].items() <= p.items()]
            assert matched, o["metadata"]["name"]
            if o["spec"].get("clusterIP") == "None":  # engine Services select serving pods only
                assert all(p.get("v41flash.io/serving") == "true" for p in matched)
        if o["kind"] == "PodDisruptionBudget":
            assert all(o["spec"]["selector"]["matchLabels"].items() <= p.items() for p in pods[role])
            assert o["spec"]["maxUnavailable"] == 1


def test_gpu_requests_equal_gpus_per_pod_and_limits():
    objs = render(example("gb300-pd-dep4-dep16"))
    res = resolve(example("gb300-pd-dep4-dep16").spec)
    for role in ("prefill", "decode"):
        for t in pod_templates(workload(objs, role, "gb300-pd-dep4-dep16")):
            r = engine(t)["resources"]
            assert r["requests"] == r["limits"]
            assert r["limits"]["nvidia.com/gpu"] == str(res.roles[role].gpus_per_pod) == "4"
    amd = render(cr({"gpu": {"product": "MI355X", "rdmaResource": "rdma/ib"}}))
    r = engine(pod_templates(workload(amd, "decode"))[0])["resources"]["limits"]
    assert (r["amd.com/gpu"], r["rdma/ib"]) == ("4", "1") and "nvidia.com/gpu" not in r


def test_engine_pod_essentials():
    obj = cr({"gpu": {"nodeSelector": {"pool": "gpu"}, "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]},
        "decode": {"resources": {"shmSize": "32Gi"}}})
    t = pod_templates(workload(render(obj), "decode"))[0]
    spec, c = t["spec"], engine(t)
    assert spec["enableServiceLinks"] is False
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"operator": "Equal", "key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                           "values": ["NVIDIA-H200"]}]}]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert vols["cache"]["emptyDir"] == {"sizeLimit": "200Gi"}
    assert env_of(c)["VLLM_CACHE_ROOT"]["value"] == "/cache/vllm"
    assert c["command"] == ["vllm", "serve"] and c["args"][0] == DEFAULT_CHECKPOINT
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    assert "capabilities" not in c["securityContext"]  # IPC_LOCK only with RDMA (tests/test_pod_security.py)
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 3600
    # drain: the preStop hook reads its deadline from the ConfigMap (test_render_revision.py); the grace
    # period is the fixed upper bound (largest deadline + 30 s shutdown)
    assert c["lifecycle"]["preStop"]["exec"]["command"][:2] == ["/bin/sh", "-c"]
    assert {"name": "drain", "mountPath": "/etc/v41flash/drain", "readOnly": True} in c["volumeMounts"]
    assert spec["terminationGracePeriodSeconds"] == 3630
    assert t["metadata"]["labels"]["v41flash.io/serving"] == "true"
    deployment = workload(render(obj), "decode")
    assert deployment["spec"]["progressDeadlineSeconds"] > startup["periodSeconds"] * startup["failureThreshold"]


def test_pod_timing_is_a_parameter():
    t = pod_templates(workload(render(cr(), timing=PodTiming(termination_grace_period_seconds=900)), "decode"))[0]
    assert t["spec"]["terminationGracePeriodSeconds"] == 900


def test_startup_probe_outlasts_the_engine_ready_timeout():
    c = engine(pod_templates(workload(render(example("gb300-pd-dep4-dep16")), "decode", "gb300-pd-dep4-dep16"))[0])
    ready = int(env_of(c)["VLLM_ENGINE_READY_TIMEOUT_S"]["value"])
    assert ready == 7200
    s = c["startupProbe"]
    assert s["periodSeconds"] * s["failureThreshold"] >= ready + 1800


def test_pvc_weights_hub_token_and_persistent_cache():
    pvc = cr({"model": {"source": {"pvc": {"claimName": "weights", "subPath": "v41/1017/"}},
                        "cache": {"claimName": "vllm-cache"}}})
    t = pod_templates(workload(render(pvc), "decode"))[0]
    c, vols = engine(t), {v["name"]: v for v in t["spec"]["volumes"]}
    assert vols["weights"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert {"name": "weights", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert c["args"][0] == "/models/v41/1017"
    assert flag(c["args"], "--served-model-name") == DEFAULT_CHECKPOINT
    assert vols["cache"]["persistentVolumeClaim"] == {"claimName": "vllm-cache"}
    assert "HF_TOKEN" not in env_of(c) and "HF_HOME" not in env_of(c)

    hub = cr({"model": {"source": {"hub": {"tokenSecretRef": {"name": "hf"}}}, "revision": "abc123",
                        "cache": {"claimName": "vllm-cache"}}})
    c = engine(pod_templates(workload(render(hub), "decode"))[0])
    env = env_of(c)
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_HOME"]["value"] == "/cache/huggingface"
    assert flag(c["args"], "--revision") == "abc123"


def test_extra_env_overrides_without_duplicate_names():
    c = engine(pod_templates(workload(render(cr({"decode": {"extraEnv": [
        {"name": "VLLM_CACHE_ROOT", "value": "/x"}, {"name": "NCCL_DEBUG", "value": "INFO"}]}})), "decode"))[0])
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names))
    assert env_of(c)["VLLM_CACHE_ROOT"]["value"] == "/x" and env_of(c)["NCCL_DEBUG"]["value"] == "INFO"


def test_leader_worker_set_shape():
    objs = render(example("gb300-pd-dep4-dep16"), replicas={"decode": 2})
    lws = workload(objs, "decode", "gb300-pd-dep4-dep16")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["spec"]["replicas"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert (lwt["size"], lwt["restartPolicy"]) == (4, "RecreateGroupOnPodRestart")
    leader, worker = lwt["leaderTemplate"], lwt["workerTemplate"]
    assert leader["metadata"]["labels"]["v41flash.io/serving"] == "true"
    assert "v41flash.io/serving" not in worker["metadata"]["labels"]
    la, wa = engine(leader)["args"], engine(worker)["args"]
    assert "--headless" in wa and "--headless" not in la
    assert flag(la, "--data-parallel-address") == flag(wa, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
    assert (flag(la, "--data-parallel-size"), flag(la, "--data-parallel-size-local")) == ("16", "4")
    assert json.loads(flag(la, "--eplb-config"))["num_redundant_experts"] == 16
    assert "ports" not in engine(worker) and "readinessProbe" not in engine(worker)
    for t in (leader, worker):
        (term,) = t["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["labelSelector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
    prefill = workload(objs, "prefill", "gb300-pd-dep4-dep16")
    assert prefill["kind"] == "Deployment"
    assert "podAffinity" not in pod_templates(prefill)[0]["spec"]["affinity"]


def test_config_map_holds_the_exact_commands():
    objs = render(example("gb300-pd-dep4-dep16"))
    conf = yaml.safe_load(objs[0]["data"]["resolved.yaml"])
    lws = workload(objs, "decode", "gb300-pd-dep4-dep16")["spec"]["leaderWorkerTemplate"]
    for kind, tmpl in (("leader", lws["leaderTemplate"]), ("worker", lws["workerTemplate"])):
        c = engine(tmpl)
        assert conf["roles"]["decode"]["commands"][kind]["command"] == [*c["command"], *c["args"]]
    assert conf["router"]["command"] == ["vllm-router", *router_container(objs, "gb300-pd-dep4-dep16")["args"]]
    assert (conf["roles"]["decode"]["gpusPerReplica"], conf["gpusAtMinReplicas"]) == (16, 20)


# --- operator checks ------------------------------------------------------------------------------

def test_operator_checks_are_registered():
    from v41flash.render.checks import rollout_problems, schedule_problems
    from v41flash.render.preflight import node_selector_problems, rendered_problems
    assert operator_checks() == [engine_problems, gpu_budget_problems, schedule_problems, host_memory_problems,
                                 rollout_problems, node_selector_problems, rendered_problems]


def test_gpu_budget_problem():
    assert gpu_budget_problems(cr({"autoscaling": {"gpuBudget": 8}})) == []
    assert gpu_budget_problems(cr({"autoscaling": {"gpuBudget": 0}})) == []
    assert gpu_budget_problems(cr({"autoscaling": {"gpuBudget": 7}})) == [Problem(
        "spec.autoscaling.gpuBudget",
        "gpuBudget 7 is below the 8 GPUs the roles hold at minReplicas (prefill 1 x 4 + decode 1 x 4); "
        "raise gpuBudget to at least 8 or lower minReplicas")]


def test_bad_extra_arg_names_the_role_field():
    problems = engine_problems(cr({"prefill": {"extraArgs": ["--no-such-flag"]}}))
    assert problems and {p.path for p in problems} == {"spec.prefill.extraArgs"}
    assert engine_problems(cr({"decode": {"extraArgs": ["--enable-chunked-prefill"]}})) == []


def test_engine_problem_paths():
    assert spec_path("decode", "eplb.num_redundant_experts") == "spec.decode.eplb.numRedundantExperts"
    assert spec_path("prefill", "tensor_parallel_size") == "spec.prefill.tensorParallelSize"
    assert spec_path("decode", "kv_transfer.load_failure_policy") == "spec.kvTransfer.loadFailurePolicy"
    assert spec_path("decode", "kv_events.port_base") == "spec.routing.kvEvents"
    assert spec_path("decode", "data_parallel_size_local") == "spec.decode.nodesPerReplica"
    assert spec_path("decode", "gpu_product") == "spec.gpu.product"
    assert spec_path("prefill", "args") == "spec.prefill"
    assert spec_path("prefill", "extra_env") == "spec.prefill.extraEnv"


@pytest.mark.parametrize("path", sorted((ROOT / "manifests" / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_pass_operator_checks(path):
    obj = example(path.stem)
    assert [p for check in operator_checks() for p in check(obj)] == []
    assert len(obj.metadata["name"]) <= 40
    for role in ("prefill", "decode"):
        assert getattr(obj.spec, role).min_replicas <= 2


@pytest.mark.parametrize("path", sorted((ROOT / "manifests" / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_rendered_engine_container_passes_the_vllm_parser(path):
    from v41flash.vllm.args import expand_k8s_vars
    from v41flash.vllm.flags import check_serve_args

    lws_env = {"LWS_LEADER_ADDRESS": "leader.ns", "LWS_WORKER_INDEX": "1"}  # what LWS injects
    checked = 0
    for w in render(example(path.stem)):
        if w["kind"] in ("Deployment", "LeaderWorkerSet") and w["metadata"]["labels"].get("v41flash.io/role") in ("prefill", "decode"):
            for t in pod_templates(w):
                c = engine(t)
                argv = expand_k8s_vars([*c["command"], *c["args"]], lws_env)
                assert not [a for a in argv if "$(" in a]
                assert check_serve_args(argv) == [], (w["metadata"]["name"], argv)
                checked += 1
    assert checked >= 1


@pytest.mark.parametrize("path", sorted((ROOT / "manifests" / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_shared_subtrees(path):
    """A dict used twice would print as a YAML anchor (&id001) in `v41flash render` output."""
    assert "&id" not in yaml.safe_dump_all(render(example(path.stem)))


def test_every_rendered_kind_is_one_the_controller_prunes():
    from v41flash.controller.kube import CHILD_KINDS

    kinds = {(o["apiVersion"], o["kind"]) for p in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
             for o in render(example(p.stem))}
    assert kinds <= set(CHILD_KINDS)
