"""The serving revision and what restarts engines: a change that needs no engine restart (SLO, router,
replica bounds, autoscaling) leaves every engine pod template byte-identical and the revision unchanged;
an engine change (image, checkpoint, revision, vLLM flags, env, EPLB, KV transfer) is a new revision.
A plain roll surges instead of taking a role's only replica down first."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from v41flash.api import v1alpha1 as api
from v41flash.render import render, revision_of
from v41flash.render import labels as L
from v41flash.render.revision import REVISION_LENGTH, serving_revision
from v41flash.render.timing import DRAIN_CONFIG_KEY, DRAIN_MAX_SECONDS, pre_stop_script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("tp4-h200-low-latency", "gb300-pd-dep4-dep16", "aggregated-h200", "dep2-b200-high-throughput")


def example_doc(stem: str) -> dict:
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / f"{stem}.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    return doc


def rendered(doc: dict) -> list[dict]:
    return render(api.V41FlashDeployment.model_validate(doc))


def engines(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")
            and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")]


def pod_templates(objs: list[dict]) -> str:
    """Every engine pod template (and LWS group shape), serialized: what a restart is decided on."""
    out = {}
    for w in engines(objs):
        part = w["spec"]["template"] if w["kind"] == "Deployment" else w["spec"]["leaderWorkerTemplate"]
        out[w["metadata"]["name"]] = part
    return json.dumps(out, sort_keys=True)


def edit(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *heads, last = path.split(".")
    node = doc["spec"]
    for h in heads:
        node = node.setdefault(h, {})
    node[last] = value
    return doc


NON_ENGINE_CHANGES = [
    ("slo.e2eP95Seconds", 120),
    ("slo.e2eP95Seconds", 2000),
    ("slo.ttft", {"targetSeconds": 0.5, "percentile": 99}),
    ("slo.windowSeconds", 300),
    ("routing.policy", "round_robin"),
    ("routing.decodePolicy", "power_of_two"),
    ("routing.replicas", 3),
    ("routing.sessionAffinityTtlSeconds", 60),
    ("routing.requestTimeoutSeconds", 600),
    ("prefill.minReplicas", 2),
    ("prefill.maxReplicas", 8),
    ("decode.maxReplicas", 9),
    ("autoscaling.enabled", False),
    ("autoscaling.gpuBudget", 64),
    ("autoscaling.intervalSeconds", 60),
    ("autoscaling.scaleDownStabilizationSeconds", 30),
]

ENGINE_CHANGES = [
    ("image", "vllm/vllm-openai:v0.33.0-cu130"),
    ("model.checkpoint", "deepseek-ai/DeepSeek-V4.1-Flash-0909"),
    ("model.revision", "a1b2c3d"),
    ("decode.maxNumSeqs", 48),
    ("prefill.maxNumBatchedTokens", 4096),
    ("decode.extraArgs", ["--enable-prompt-tokens-details"]),
    ("prefill.extraEnv", [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]),
    ("decode.eplb.windowSize", 500),  # on in the GB300 example; the TP4 one has no expert parallelism
    ("kvTransfer.loadFailurePolicy", "recompute"),
    ("kvTransfer.extraConfig", {"enforce_handshake_compat": False}),
    ("kvTransfer.ucxTls", "rc,cuda_copy"),
    ("routing.kvEvents", True),  # engines publish KV events: a vLLM flag
]


@pytest.mark.parametrize("stem", EXAMPLES)
@pytest.mark.parametrize("path,value", NON_ENGINE_CHANGES, ids=lambda v: str(v))
def test_a_non_engine_change_keeps_every_engine_pod_template_and_the_revision(stem, path, value):
    base = example_doc(stem)
    before, after = rendered(base), rendered(edit(base, path, value))
    assert pod_templates(after) == pod_templates(before)
    assert revision_of(after) == revision_of(before)


@pytest.mark.parametrize("stem", ("tp4-h200-low-latency", "gb300-pd-dep4-dep16"))
@pytest.mark.parametrize("path,value", ENGINE_CHANGES, ids=lambda v: str(v))
def test_an_engine_change_is_a_new_revision(stem, path, value):
    base = example_doc(stem)
    if path.startswith("decode.eplb") and stem.startswith("tp4"):  # no expert parallelism there: turn EPLB on
        base = edit(base, "decode.expertParallel", True)
        path, value = "decode.eplb", {"enabled": True}
    before, after = rendered(base), rendered(edit(base, path, value))
    assert pod_templates(after) != pod_templates(before)
    assert revision_of(after) != revision_of(before)


def test_every_engine_pod_and_workload_carries_the_one_revision():
    objs = rendered(example_doc("gb300-pd-dep4-dep16"))  # Deployment prefill, LWS decode (leader + worker)
    rev = revision_of(objs)
    assert rev and len(rev) == REVISION_LENGTH
    seen = 0
    for w in engines(objs):
        assert w["metadata"]["labels"][L.REVISION_LABEL] == rev
        if w["kind"] == "Deployment":
            templates = [w["spec"]["template"]]
        else:
            lwt = w["spec"]["leaderWorkerTemplate"]
            templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
        for t in templates:
            assert t["metadata"]["labels"][L.REVISION_LABEL] == rev
            seen += 1
    assert seen == 3
    # the router is not an engine: no revision on it, so a router change never looks like an engine one
    router = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"][L.ROLE_LABEL] == L.ROUTER)
    assert L.REVISION_LABEL not in router["spec"]["template"]["metadata"]["labels"]
    # the selector never contains the revision (a Deployment's selector is immutable)
    assert all(L.REVISION_LABEL not in (w["spec"].get("selector") or {}).get("matchLabels", {}) for w in engines(objs))


def test_revision_is_stable_and_order_independent():
    objs = rendered(example_doc("tp4-h200-low-latency"))
    assert revision_of(objs) == revision_of(rendered(example_doc("tp4-h200-low-latency")))
    ws = engines(objs)
    assert serving_revision(ws) == serving_revision(list(reversed(ws))) == revision_of(objs)


def test_one_revision_for_the_pair_a_decode_only_change_moves_prefill_too():
    base = example_doc("tp4-h200-low-latency")
    after = rendered(edit(base, "decode.maxNumSeqs", 48))
    prefill = next(w for w in engines(after) if w["metadata"]["labels"][L.ROLE_LABEL] == "prefill")
    assert prefill["spec"]["template"]["metadata"]["labels"][L.REVISION_LABEL] == revision_of(after)
    assert revision_of(after) != revision_of(rendered(base))


def test_drain_deadline_follows_the_slo_through_the_configmap_not_the_template():
    base = example_doc("tp4-h200-low-latency")
    for e2e, want in ((60, "100"), (120, "190"), (10_000, str(DRAIN_MAX_SECONDS))):
        objs = rendered(edit(base, "slo.e2eP95Seconds", e2e))
        cm = next(o for o in objs if o["kind"] == "ConfigMap")
        assert cm["data"][DRAIN_CONFIG_KEY] == want
    w = engines(objs)[0]
    spec = w["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["lifecycle"]["preStop"] == {"exec": {"command": ["/bin/sh", "-c", pre_stop_script()]}}
    vol = next(v for v in spec["volumes"] if v["name"] == "drain")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    assert vol["configMap"]["items"] == [{"key": DRAIN_CONFIG_KEY, "path": DRAIN_CONFIG_KEY}]
    # the fixed grace period covers the largest deadline the hook accepts, plus vLLM's shutdown
    assert spec["terminationGracePeriodSeconds"] > DRAIN_MAX_SECONDS


@pytest.mark.parametrize("content,want", [("190", "190"), ("", "460"), ("abc", "460"), ("99999", "3600"),
                                          (None, "460")])
def test_pre_stop_script_reads_and_clamps_the_file(tmp_path, content, want):
    import subprocess
    from v41flash.render import timing
    path = tmp_path / DRAIN_CONFIG_KEY
    if content is not None:
        path.write_text(content)
    script = pre_stop_script().replace(f"{timing.DRAIN_MOUNT_DIR}/", f"{tmp_path}/").replace("exec sleep", "echo")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == want


def test_plain_roll_surges_and_never_takes_a_replica_down_first():
    objs = rendered(example_doc("gb300-pd-dep4-dep16"))
    by_kind = {w["kind"]: w for w in engines(objs)}
    assert by_kind["Deployment"]["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert by_kind["LeaderWorkerSet"]["spec"]["rolloutStrategy"] == {
        "type": "RollingUpdate", "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}}
