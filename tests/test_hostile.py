"""The hostile corpus (issue 12): every spec is refused with its field named, or accepted and proven
harmless by rendering it; none raises. Admission on a real apiserver: e2e."""
from __future__ import annotations

import json
import sys
from collections import Counter

import pytest
import yaml

from e2e.hostile_corpus import hostile_cases
from v41flash.api import endpoints, host_paths
from v41flash.api import v1alpha1 as api
from v41flash.api.admin import AdminPolicy
from v41flash.api.validation import validate
from v41flash.render import render
from v41flash.render.checks import operator_checks

CASES = hostile_cases()
# The operator the corpus meets: its administrator opted in to a weight cache directory (one per namespace), a shared
# one, and the cluster's Prometheus (issue 39); what is refused here is refused with those allowed (the default
# operator allows neither: tests/test_admin_policy.py).
ADMIN = AdminPolicy(host_paths.HostPathAllowlist(private=("/mnt/nvme/v41flash",), shared=("/mnt/shared-weights",)),
                    endpoints.EndpointAllowlist(urls=("http://prometheus-operated.monitoring:9090",),
                                                namespaces=("monitoring",)))


def _doc(case):
    doc = case.doc()
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"].setdefault("namespace", "ns")
    return doc


def _render(doc):
    return render(api.V41FlashDeployment.model_validate(doc),
                  owner={"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "hostile", "uid": "u"})


def _containers(objs, component=None):
    for o in objs:
        if o["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        if component and o["metadata"]["labels"]["app.kubernetes.io/component"] != component:
            continue
        t = o["spec"].get("template") or o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        yield from t["spec"]["containers"]


def _pod_specs(objs):
    for o in objs:
        if o["kind"] == "Deployment":
            yield o["metadata"]["labels"]["app.kubernetes.io/component"], o["spec"]["template"]["spec"]


def _config_text(objs):
    return next(o for o in objs if o["kind"] == "ConfigMap")["data"]["resolved.yaml"]


# --- the harmless checks: each renders the spec and looks at what would run ------------------------------

def tolerations_noschedule_only(doc, objs):
    for role, pod in _pod_specs(objs):
        if role != "router":
            assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]


def probes_int32(doc, objs):
    for c in _containers(objs):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            for k, v in c.get(probe, {}).items():
                if isinstance(v, int):
                    assert 0 < v < 2 ** 31, (probe, k, v)
    startup = next(_containers(objs, "decode"))["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 999999


def kv_transfer_config_is_json(doc, objs):
    args = next(_containers(objs, "decode"))["args"]
    cfg = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert cfg["kv_connector_extra_config"]["a"]["a"]


def extra_args_hidden(doc, objs):
    assert next(_containers(objs, "decode"))["args"][-1] == "--enable-log-requests"
    assert "--enable-log-requests" not in _config_text(objs)


def extra_env_hidden(doc, objs):
    for role in ("prefill", "decode"):
        for e in doc["spec"].get(role, {}).get("extraEnv", []):
            env = {x["name"]: x.get("value") for x in next(_containers(objs, role))["env"]}
            assert env[e["name"]] == e["value"]
            assert e["value"] not in _config_text(objs)


def gpu_limit_kept(doc, objs):
    for c in _containers(objs):
        if c["name"] == "vllm":
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" and c["resources"]["limits"]["rdma/ib"] == "1"


def api_key_from_secret(doc, objs):
    front = next(c for c in _containers(objs, "router") if c["name"] == "front")
    assert front["env"] == [{"name": "V41FLASH_PROXY_API_KEY",
                             "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api-key"}}}]
    router = next(c for c in _containers(objs, "router") if c["name"] == "router")
    # not the Service's port: the router NetworkPolicy opens it to the deployment's router pods only
    assert router["args"][router["args"].index("--port") + 1] == "30001"


def default_is_locked_down(doc, objs):
    kinds = Counter(o["kind"] for o in objs)
    assert kinds["NetworkPolicy"] == 2
    for role, pod in _pod_specs(objs):
        if role != "router":
            assert pod["automountServiceAccountToken"] is False
            assert all("capabilities" not in c["securityContext"] for c in pod["containers"])
    router = [c["name"] for c in _containers(objs, "router")]
    assert router == ["front", "counters", "router"]  # clients meet the front's path allowlist first


def _weight_cache_mounts(objs):
    """(kind, container, hostPath, readOnly) of every weight-cache mount the rendered pods have."""
    for o in objs:
        if o["kind"] not in ("Deployment", "LeaderWorkerSet", "DaemonSet"):
            continue
        t = o["spec"].get("template") or o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        paths = {v["name"]: v["hostPath"]["path"] for v in t["spec"].get("volumes", []) if "hostPath" in v}
        for c in t["spec"]["containers"] + t["spec"].get("initContainers", []):
            for m in c.get("volumeMounts", []):
                if m["name"] in paths:
                    yield o["kind"], c["name"], paths[m["name"]], m.get("readOnly", False)


def _weight_cache_read_only(objs, node_dir):
    mounts = list(_weight_cache_mounts(objs))
    assert mounts and {path for _, _, path, _ in mounts} == {node_dir}, mounts
    writers = [(kind, c) for kind, c, _, read_only in mounts if not read_only]
    assert writers in ([], [("DaemonSet", "download")]), writers  # only the prefetcher writes
    assert any(kind == "Deployment" for kind, *_ in mounts)


def weight_cache_namespaced_read_only(doc, objs):
    cache = doc["spec"]["startup"]["weightCache"]
    _weight_cache_read_only(objs, f"{cache['hostPath']}/{doc['metadata']['namespace']}")
    assert validate(doc, operator_checks(AdminPolicy()))  # the default operator refuses it


def weight_cache_shared_read_only(doc, objs):
    _weight_cache_read_only(objs, doc["spec"]["startup"]["weightCache"]["hostPath"])
    assert validate(doc, operator_checks(AdminPolicy()))


def prometheus_selects_scrape_labels(doc, objs):
    from v41flash.metrics.promapi import PromSource, selector
    obj = api.V41FlashDeployment.model_validate(doc)
    src = PromSource.from_spec(obj.spec.autoscaling.metrics.prometheus, "ns", ADMIN.endpoints)
    sel = selector(src, ["hostile-decode-0"])
    assert sel.startswith(r'namespace="ns",pod=~"hostile\\-decode\\-0"'), sel  # set by the scrape, not the target
    assert validate(doc, operator_checks(AdminPolicy()))  # the default operator queries nothing


def extra_args_passed(doc, objs):
    """A flag no field owns reaches vLLM last, and the operator's own settings are still there."""
    args = next(_containers(objs, "decode"))["args"]
    assert args[-len(doc["spec"]["decode"]["extraArgs"]):] == doc["spec"]["decode"]["extraArgs"]
    assert "--kv-transfer-config" in args and "--served-model-name" in args


def time_zone_pinned(doc, objs):
    """The planner reads the zone from the pinned tzdata package, never the machine's files."""
    from v41flash import cron
    zone = doc["spec"]["autoscaling"]["schedules"][0]["timeZone"]
    assert zone in cron.TIME_ZONES and cron.zone(zone).key == zone
    assert "localtime" not in cron.TIME_ZONES and "America" not in cron.TIME_ZONES


def gateway_engines_closed(doc, objs):
    """Mode Gateway: every ingress rule of every policy names its peers (the picker, the Gateway's pods the spec or
    its HTTPRoute names, the deployment's engines, the operator): none admits any pod of the cluster."""
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {"hostile-engines", "hostile-epp-ingress"}
    for p in policies:
        for rule in p["spec"]["ingress"]:
            assert rule.get("from") and all(peer["podSelector"]["matchLabels"] for peer in rule["from"]), rule
    peers = [peer for rule in policies[0]["spec"]["ingress"] for peer in rule["from"]]
    gateway = doc["spec"]["routing"].get("gateway", {})
    if "dataPlanePods" in gateway:
        assert {"podSelector": {"matchLabels": gateway["dataPlanePods"]["podLabels"]},
                "namespaceSelector": {"matchLabels": gateway["dataPlanePods"]["namespaceLabels"]}} in peers
    elif "httpRoute" in gateway:
        assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "infra"}},
                "podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}}} in peers


CHECKS = {f.__name__: f for f in (tolerations_noschedule_only, probes_int32, kv_transfer_config_is_json,
                                  extra_args_hidden, extra_env_hidden, gpu_limit_kept, api_key_from_secret,
                                  default_is_locked_down, weight_cache_namespaced_read_only,
                                  weight_cache_shared_read_only, prometheus_selects_scrape_labels,
                                  extra_args_passed, time_zone_pinned, gateway_engines_closed)}


def test_the_corpus_is_big_and_well_formed():
    assert len(CASES) >= 60
    for c in CASES:
        assert c.expect in ("refused", "harmless"), c.name
        if c.expect == "refused":
            assert c.field and c.admission in ("refused", "stalled"), c.name
        else:
            assert c.check in CHECKS, c.name


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == "refused"], ids=lambda c: c.name)
def test_refused_with_the_field_named(case):
    problems = validate(_doc(case), operator_checks(ADMIN))  # never raises: a traceback fails this test
    assert problems, f"{case.name} was accepted"
    assert any(p.path == case.field or p.path.startswith((case.field + ".", case.field + "["))
               for p in problems), [str(p) for p in problems]
    assert all(p.message for p in problems)


@pytest.mark.parametrize("case", [c for c in CASES if c.expect == "harmless"], ids=lambda c: c.name)
def test_accepted_and_harmless(case):
    doc = _doc(case)
    assert validate(doc, operator_checks(ADMIN)) == []
    objs = _render(doc)
    CHECKS[case.check](doc, objs)


def test_the_deepest_case_runs_at_the_default_recursion_limit():
    deep = next(c for c in CASES if "3000" in c.name)
    doc = _doc(deep)
    assert sys.getrecursionlimit() < 3000 * 2
    problems = validate(doc, operator_checks())
    assert [p.path for p in problems] == ["spec.kvTransfer.extraConfig"]


def test_summary_figures(capsys):
    refused = [c for c in CASES if c.expect == "refused"]
    by_admission = Counter(c.admission for c in refused)
    print(f"hostile corpus: {len(CASES)} specs, {len(refused)} refused ({by_admission['refused']} at admission, "
          f"{by_admission['stalled']} by the operator), {len(CASES) - len(refused)} accepted and proven harmless")
    assert yaml  # the corpus files are YAML (one, too deep for the serializer, in JSON flow style)
