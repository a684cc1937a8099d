"""spec.rollout: defaults, descriptions, admission rules (CEL, evaluated offline by validate()) and the
kubectl action annotation's format."""
from __future__ import annotations

import copy

import pytest

from v41flash.api import v1alpha1 as api
from v41flash.api.crd import crd
from v41flash.api.validation import validate

DOC = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": "r"}, "spec": {}}


def with_rollout(**rollout):
    doc = copy.deepcopy(DOC)
    doc["spec"]["rollout"] = rollout
    return doc


def paths(problems):
    return [p.path for p in problems]


def test_defaults():
    r = api.V41FlashDeploymentSpec().rollout
    assert r.strategy == "Canary"
    assert r.steps == [5, 25, 50, 100]
    assert r.step_seconds == 300 and r.min_requests_per_step == 50
    assert r.max_surge_gpus == 0 and r.progress_deadline_seconds == 0
    assert r.when_no_surge_room == "Wait" and r.drain_deadline_seconds == 1800
    assert (r.gate.ttft_tolerance, r.gate.e2e_tolerance, r.gate.max_error_ratio) == (0.0, 0.0, 0.01)
    assert (r.paused, r.promote, r.abort) == (False, "", "")
    assert validate(DOC) == []


def test_every_rollout_field_has_a_description_in_the_crd():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rollout"]
    assert schema.get("description")

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            assert sub.get("description"), f"{path}.{name} has no description"
            walk(sub, f"{path}.{name}")
    walk(schema, "spec.rollout")
    assert set(schema["properties"]) >= {"strategy", "steps", "stepSeconds", "minRequestsPerStep", "maxSurgeGPUs",
                                         "progressDeadlineSeconds", "whenNoSurgeRoom", "drainDeadlineSeconds", "gate",
                                         "paused", "promote", "abort"}


@pytest.mark.parametrize("rollout", [
    {"strategy": "Recreate"},
    {"steps": [100]},
    {"steps": [1, 2, 3, 4, 5, 10, 20, 40, 80, 100]},
    {"whenNoSurgeRoom": "InPlace", "maxSurgeGPUs": 8, "progressDeadlineSeconds": 120, "stepSeconds": 10,
     "minRequestsPerStep": 0, "drainDeadlineSeconds": 0},
    {"paused": True, "promote": "0123456789", "abort": ""},
    {"abort": "abcdef0123"},
    {"gate": {"ttftTolerance": 0.2, "e2eTolerance": 1.5, "maxErrorRatio": 0}},
])
def test_accepted(rollout):
    assert validate(with_rollout(**rollout)) == []


@pytest.mark.parametrize("rollout, path", [
    ({"strategy": "BlueGreen"}, "spec.rollout.strategy"),
    ({"steps": []}, "spec.rollout.steps"),
    ({"steps": [5, 25, 50]}, "spec.rollout.steps"),
    ({"steps": [5, 50, 25, 100]}, "spec.rollout.steps"),
    ({"steps": [5, 5, 100]}, "spec.rollout.steps"),
    ({"steps": [0, 100]}, "spec.rollout.steps[0]"),
    ({"steps": [5, 101]}, "spec.rollout.steps[1]"),
    ({"steps": list(range(1, 12)) + [100]}, "spec.rollout.steps"),
    ({"stepSeconds": 0}, "spec.rollout.stepSeconds"),
    ({"minRequestsPerStep": -1}, "spec.rollout.minRequestsPerStep"),
    ({"maxSurgeGPUs": -1}, "spec.rollout.maxSurgeGPUs"),
    ({"progressDeadlineSeconds": -5}, "spec.rollout.progressDeadlineSeconds"),
    ({"whenNoSurgeRoom": "Evict"}, "spec.rollout.whenNoSurgeRoom"),
    ({"drainDeadlineSeconds": -1}, "spec.rollout.drainDeadlineSeconds"),
    ({"gate": {"maxErrorRatio": 1.5}}, "spec.rollout.gate.maxErrorRatio"),
    ({"gate": {"ttftTolerance": -0.1}}, "spec.rollout.gate.ttftTolerance"),
    ({"promote": "latest"}, "spec.rollout.promote"),
    ({"promote": "0123456789abc"}, "spec.rollout.promote"),
    ({"abort": "ABCDEF0123"}, "spec.rollout.abort"),
    ({"promote": "0123456789", "abort": "0123456789"}, "spec.rollout.abort"),
    ({"pause": True}, "spec.rollout.pause"),
])
def test_refused_naming_the_field(rollout, path):
    problems = validate(with_rollout(**rollout))
    assert problems, rollout
    assert any(p.startswith(path) for p in paths(problems)), problems


@pytest.mark.parametrize("value, want", [
    ("pause/0123456789", ("pause", "0123456789")),
    ("resume/0123456789", ("resume", "0123456789")),
    ("abort/abcdefabcd", ("abort", "abcdefabcd")),
    (" promote/abcdefabcd ", ("promote", "abcdefabcd")),
])
def test_rollout_action_annotation(value, want):
    assert api.parse_rollout_action(value) == want


@pytest.mark.parametrize("value", ["pause", "stop/0123456789", "pause/", "pause/xyz", "promote/0123456789/x", ""])
def test_bad_rollout_action_annotation_names_the_annotation(value):
    with pytest.raises(ValueError, match=api.ROLLOUT_ACTION_ANNOTATION):
        api.parse_rollout_action(value)


def _checked(**spec):
    from v41flash.render.checks import operator_checks
    doc = copy.deepcopy(DOC)
    doc["spec"] = spec
    return validate(doc, operator_checks())


def test_surge_below_the_minimum_canary_without_a_budget_is_stalled_naming_the_field():
    problems = _checked(rollout={"maxSurgeGPUs": 4})
    assert paths(problems) == ["spec.rollout.maxSurgeGPUs"]
    assert "8 GPUs" in problems[0].message and "InPlace" in problems[0].message
    assert _checked(rollout={"maxSurgeGPUs": 8}) == []
    assert _checked(rollout={"maxSurgeGPUs": 4, "whenNoSurgeRoom": "InPlace"}) == []
    assert _checked(rollout={"maxSurgeGPUs": 4, "strategy": "Recreate"}) == []
    # with a budget the room depends on what serves: decided at rollout time (WaitingForSurgeRoom)
    assert _checked(rollout={"maxSurgeGPUs": 4}, autoscaling={"gpuBudget": 32}) == []


def test_turning_off_vllms_kv_handshake_check_is_stalled():
    problems = _checked(kvTransfer={"extraConfig": {"enforce_handshake_compat": False}})
    assert paths(problems) == ["spec.kvTransfer.extraConfig.enforce_handshake_compat"]
    assert _checked(kvTransfer={"extraConfig": {"enforce_handshake_compat": True}}) == []
