"""reconcile() itself, against an in-memory apiserver (tests/fake_kube.py): stall before apply, prune,
status written only on change, conflicts, kinds the cluster does not serve."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from fake_kube import LWS, FakeKube, api_error
from process_memory import reconcile
from v41flash.controller.autoscale import PlannerOutcome
from v41flash.controller.kube import CHILD_KINDS
from v41flash.render import labels as L
from v41flash.render.gateway import WATCHED_KINDS

ROOT = Path(__file__).resolve().parents[1]
NOW, LATER = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"


def example(name: str) -> dict:
    return yaml.safe_load((ROOT / "manifests/examples" / f"{name}.yaml").read_text())


class Events(list):
    def __call__(self, type_: str, reason: str, message: str) -> None:
        self.append((type_, reason, message))


def run(kube: FakeKube, name: str, now: str = NOW, **kw):
    events = Events()
    out = reconcile(kube, kube.cr(name), events, now=now, **kw)
    return out, events


def cond(status: dict, type_: str) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def converged(example_name: str = "tp4-h200-low-latency") -> tuple[FakeKube, str]:
    """A deployment whose children exist and are Ready, with that status recorded."""
    kube = FakeKube()
    name = kube.add_cr(example(example_name))["metadata"]["name"]
    run(kube, name)
    kube.settle()
    out, _ = run(kube, name)
    assert out.status_written and cond(kube.cr(name)["status"], "Ready")["status"] == "True"
    kube.calls.clear()
    kube.writes.clear()
    return kube, name


# ------------------------------------------------------------------ the happy path, and a no-op
def test_first_reconcile_creates_every_child_owned_by_the_cr_and_says_it_is_progressing():
    kube = FakeKube()
    cr = kube.add_cr(example("tp4-h200-low-latency"))
    out, events = run(kube, "tp4-h200-low-latency")
    assert out.stall is None and out.status_written and out.pruned == []
    # 19: with the front (Envoy) and its autoscaler, slot ""'s router, the serving router's Service, 2 NetworkPolicies
    assert len(out.applied) == 19 and {v for v, _ in kube.writes} == {"create", "status"}
    for obj in kube.objects.values():
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [cr["metadata"]["uid"]]
    status = kube.cr("tp4-h200-low-latency")["status"]
    assert status["observedGeneration"] == 1
    assert cond(status, "Ready")["status"] == "False" and cond(status, "Reconciling")["status"] == "True"
    assert [e[1] for e in events] == ["Applied"]


def test_a_second_reconcile_of_a_converged_deployment_writes_nothing():
    kube, name = converged()
    before = copy.deepcopy((kube.objects, kube.crs))
    out, events = run(kube, name, now=LATER)
    assert kube.writes == [] and not any(m in ("delete", "patch_status") for m, _ in kube.calls)
    assert out.applied == [] and out.pruned == [] and not out.status_written and events == []
    assert (kube.objects, kube.crs) == before  # not even a resourceVersion moved
    assert cond(out.status, "Ready")["lastTransitionTime"] == NOW  # the condition kept its transition time


def test_an_unchanged_planner_decision_writes_nothing_either():
    kube, name = converged()
    status = kube.cr(name)["status"]
    planned = PlannerOutcome(desired={"prefill": 1, "decode": 1},
                             status={"slo": {"ttft": "0.40s"}, "lastDecision": {"action": "hold", "reason": "fits"}})
    out, _ = run(kube, name, planner=planned)
    assert out.status_written and out.status["slo"] == {"ttft": "0.40s"}
    kube.writes.clear()
    out, events = run(kube, name, now=LATER, planner=planned)
    assert kube.writes == [] and not out.status_written and events == []
    assert {k: v for k, v in out.status.items() if k not in ("slo", "lastDecision")} == status


def test_a_planner_decision_is_applied_and_its_event_posted():
    kube, name = converged()
    planned = PlannerOutcome(desired={"prefill": 2, "decode": 1}, status={"lastDecision": {"action": "scale_up"}},
                             events=[("Normal", "Scaled", "prefill 1->2")])
    out, events = run(kube, name, planner=planned)
    # the prefill workload, and the resolved-config ConfigMap that records each role's replicas
    assert out.applied == ["ConfigMap/tp4-h200-low-latency-config", "Deployment/tp4-h200-low-latency-prefill"]
    assert kube.get("Deployment", "tp4-h200-low-latency-prefill")["spec"]["replicas"] == 2
    assert [e[1] for e in events] == ["Applied", "Scaled"]
    status = kube.cr(name)["status"]
    assert status["prefill"]["desiredReplicas"] == 2 and status["lastDecision"] == {"action": "scale_up"}
    assert cond(status, "Reconciling")["message"] == "prefill: rollout of the new spec not yet observed"


# ------------------------------------------------------------------ stall before apply
def test_an_invalid_spec_applies_nothing_and_is_stalled_naming_the_field():
    kube, name = converged()
    running = copy.deepcopy(kube.objects)
    spec = kube.cr(name)["spec"]
    spec["autoscaling"]["gpuBudget"] = 4  # only the operator can tell: one replica needs 4 GPUs per role
    kube.update_spec(name, spec)
    out, events = run(kube, name, now=LATER)
    assert out.stall is not None and out.stall.reason == "InvalidSpec"
    assert "spec.autoscaling.gpuBudget" in out.stall.message
    assert [m for m, _ in kube.calls if m in ("apply", "delete")] == []
    assert kube.objects == running  # the running stack keeps running on its last good spec
    status = kube.cr(name)["status"]
    stalled = cond(status, "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec" and stalled["observedGeneration"] == 2
    assert "spec.autoscaling.gpuBudget" in stalled["message"]
    assert cond(status, "Ready")["status"] == "False"
    assert status["prefill"]["readyReplicas"] == 1 and status["prefill"]["gpus"] == 4  # what runs, as it runs
    assert [e[:2] for e in events] == [("Warning", "InvalidSpec")]
    # the same stall again: no second Warning, no status write
    kube.writes.clear()
    out, events = run(kube, name, now=LATER)
    assert events == [] and kube.writes == [] and not out.status_written


def test_an_invalid_new_deployment_creates_nothing():
    kube = FakeKube()
    doc = example("tp4-h200-low-latency")
    doc["spec"]["autoscaling"]["gpuBudget"] = 4
    kube.add_cr(doc)
    out, _ = run(kube, "tp4-h200-low-latency")
    assert out.stall.reason == "InvalidSpec" and kube.objects == {}
    assert [w[0] for w in kube.writes] == ["status"]


def test_a_planner_outcome_is_not_applied_while_stalled():
    kube, name = converged()
    spec = kube.cr(name)["spec"]
    spec["autoscaling"]["gpuBudget"] = 4
    kube.update_spec(name, spec)
    planned = PlannerOutcome(desired={"prefill": 2}, status={"lastDecision": {"action": "scale_up"}},
                             events=[("Normal", "Scaled", "prefill 1->2")])
    out, events = run(kube, name, planner=planned)
    assert "lastDecision" not in out.status and [e[1] for e in events] == ["InvalidSpec"]


# ------------------------------------------------------------------ prune
def test_a_child_no_longer_desired_is_deleted():
    # before a first revision served (no status.servingRevision): no rollout, the plain path (tests of a
    # rollout: tests/test_controller_rollout.py)
    kube = FakeKube()
    name = kube.add_cr(example("tp4-h200-low-latency"))["metadata"]["name"]
    run(kube, name)
    spec = kube.cr(name)["spec"]
    spec["prefill"] = {"enabled": False}  # aggregated from now on
    kube.update_spec(name, spec)
    out, events = run(kube, name, now=LATER)
    gone = {"Deployment/tp4-h200-low-latency-prefill", "Service/tp4-h200-low-latency-prefill",
            "PodDisruptionBudget/tp4-h200-low-latency-prefill"}
    assert set(out.pruned) == gone and not gone & kube.names()
    assert ("Normal", "Pruned") in [e[:2] for e in events]
    assert out.status["prefill"]["ready"] == "off"


def test_only_owned_children_are_pruned():
    kube, name = converged()
    uid = kube.cr(name)["metadata"]["uid"]
    labels = L.owned_selector(name)
    owned_by = lambda u: [{"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "name": name, "uid": u}]  # noqa: E731
    leftover = {"apiVersion": "v1", "kind": "ConfigMap", "data": {},
                "metadata": {"name": f"{name}-old", "labels": labels, "ownerReferences": owned_by(uid)}}
    namesake = copy.deepcopy(leftover)  # same labels, but another deployment of that name owns it (recreated CR)
    namesake["metadata"].update(name=f"{name}-other", ownerReferences=owned_by("some-other-uid"))
    users = copy.deepcopy(leftover)  # the user's own object, labelled like ours but never owned by us
    users["metadata"].update(name=f"{name}-notes", labels={L.INSTANCE_LABEL: name})
    del users["metadata"]["ownerReferences"]
    for obj in (leftover, namesake, users):
        kube.put(obj)
    out, _ = run(kube, name, now=LATER)
    assert out.pruned == [f"ConfigMap/{name}-old"]
    assert {f"ConfigMap/{name}-other", f"ConfigMap/{name}-notes"} <= kube.names()
    assert f"ConfigMap/{name}-old" not in kube.names()


# ------------------------------------------------------------------ conflicts and refusals
def test_a_status_conflict_is_left_to_the_next_pass():
    kube = FakeKube()
    kube.add_cr(example("tp4-h200-low-latency"))
    stale = kube.cr("tp4-h200-low-latency")
    kube.update_spec("tp4-h200-low-latency", stale["spec"])  # someone wrote the CR after our read
    events = Events()
    out = reconcile(kube, stale, events, now=NOW)
    assert not out.status_written and "status" not in kube.cr("tp4-h200-low-latency")
    assert len(out.applied) == 19  # the children were applied all the same
    out, _ = run(kube, "tp4-h200-low-latency")  # the next pass, from a fresh read
    assert out.status_written and kube.cr("tp4-h200-low-latency")["status"]["observedGeneration"] == 2


@pytest.mark.parametrize("code", [409, 422])
def test_a_status_patch_refused_as_stale_is_not_an_error(code):
    kube = FakeKube()
    kube.add_cr(example("tp4-h200-low-latency"))
    kube.fail[("patch_status", "tp4-h200-low-latency")] = api_error(code, "Conflict")
    out, _ = run(kube, "tp4-h200-low-latency")
    assert not out.status_written


def test_any_other_status_error_is_raised_for_kopf_to_retry():
    kube = FakeKube()
    kube.add_cr(example("tp4-h200-low-latency"))
    kube.fail[("patch_status", "tp4-h200-low-latency")] = api_error(500, "Internal Server Error")
    with pytest.raises(Exception) as err:
        run(kube, "tp4-h200-low-latency")
    assert getattr(err.value, "status", None) == 500


def test_a_conflict_on_apply_is_raised_before_anything_is_pruned_or_written():
    kube, name = converged()
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "data": {}, "metadata": {
        "name": f"{name}-old", "labels": L.owned_selector(name),
        "ownerReferences": [{"uid": kube.cr(name)["metadata"]["uid"]}]}})
    kube.fail[("apply", f"Deployment/{name}-decode")] = api_error(409, "Conflict")
    with pytest.raises(Exception) as err:
        run(kube, name)
    assert getattr(err.value, "status", None) == 409
    assert kube.writes == [] and f"ConfigMap/{name}-old" in kube.names()  # retried by kopf from scratch


def test_an_object_the_apiserver_refuses_stalls_with_its_message():
    kube, name = converged()
    kube.fail[("apply", f"Deployment/{name}-decode")] = api_error(
        422, "Unprocessable Entity", "spec.template.spec.containers[0].resources: Invalid value")
    out, events = run(kube, name, now=LATER)
    assert out.stall.reason == "ApplyRejected"
    assert out.stall.message == (f"Deployment/{name}-decode: Unprocessable Entity: "
                                 "spec.template.spec.containers[0].resources: Invalid value")
    assert cond(kube.cr(name)["status"], "Stalled")["reason"] == "ApplyRejected"
    assert [e[:2] for e in events] == [("Warning", "ApplyRejected")]
    assert not [w for w in kube.writes if w[0] == "delete"]


# ------------------------------------------------------------------ kinds the cluster does not serve
def test_a_missing_kind_stalls_before_anything_is_applied():
    kube = FakeKube(kinds=[k for k in CHILD_KINDS if k != LWS])
    kube.add_cr(example("gb300-pd-dep4-dep16"))
    out, events = run(kube, "gb300-pd-dep4-dep16")
    assert out.stall.reason == "KindNotInstalled"
    assert "LeaderWorkerSet.leaderworkerset.x-k8s.io/v1" in out.stall.message
    assert [m for m, _ in kube.calls if m == "apply"] == [] and kube.objects == {}
    assert cond(kube.cr("gb300-pd-dep4-dep16")["status"], "Stalled")["reason"] == "KindNotInstalled"
    assert [e[:2] for e in events] == [("Warning", "KindNotInstalled")]
    # the CRD gets installed: the next pass applies everything
    kube.kinds.add(LWS)
    out, _ = run(kube, "gb300-pd-dep4-dep16")
    assert out.stall is None and kube.get("LeaderWorkerSet", "gb300-pd-dep4-dep16-decode") is not None
    assert cond(kube.cr("gb300-pd-dep4-dep16")["status"], "Stalled") is None


@pytest.mark.parametrize("missing", [("inference.networking.k8s.io/v1", "InferencePool"),
                                     ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective")],
                         ids=lambda k: k[1])
def test_mode_gateway_without_the_inference_extension_crds_stalls_naming_them(missing):
    """The picker watches InferenceObjectives it never renders: their CRD missing is a stall too (the picker
    would crash-loop), with what to install."""
    kube = FakeKube(kinds=[k for k in (*CHILD_KINDS, *WATCHED_KINDS) if k != missing])
    name = kube.add_cr(example("tp4-h200-pd-gateway"))["metadata"]["name"]
    out, events = run(kube, name)
    assert out.stall.reason == "KindNotInstalled"
    assert out.stall.message == (f"the cluster does not serve {missing[1]}.{missing[0]}: install the Gateway API "
                                 "Inference Extension v1.2.0 CRDs (InferencePool, InferenceObjective)")
    assert [m for m, _ in kube.calls if m == "apply"] == [] and kube.objects == {}
    assert [e[:2] for e in events] == [("Warning", "KindNotInstalled")]
    kube.kinds.add(missing)
    out, _ = run(kube, name)
    assert out.stall is None and kube.get("InferencePool", f"{name}-pool") is not None


def test_a_kind_that_vanishes_between_discovery_and_apply_stalls_without_pruning():
    # discovery still says a kind is served that the apiserver no longer serves (a CRD removed meanwhile)
    kube = FakeKube(kinds=[k for k in CHILD_KINDS if k != LWS], discovered=CHILD_KINDS)
    name = kube.add_cr(example("gb300-pd-dep4-dep16"))["metadata"]["name"]
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "data": {}, "metadata": {
        "name": f"{name}-old", "labels": L.owned_selector(name),
        "ownerReferences": [{"uid": kube.cr(name)["metadata"]["uid"]}]}})
    out, _ = run(kube, name)
    assert out.stall.reason == "KindNotInstalled"
    assert out.stall.message == "LeaderWorkerSet.leaderworkerset.x-k8s.io/v1 is not served by this cluster"
    assert out.pruned == [] and f"ConfigMap/{name}-old" in kube.names()
    assert cond(kube.cr(name)["status"], "Stalled")["reason"] == "KindNotInstalled"


def test_while_stalled_the_gpus_of_what_runs_follow_its_replicas():
    """Regression: with an invalid spec, GPUs per replica were the previous status's GPU total divided by the
    replicas running NOW, so a scale-up still rolling out when the spec went bad halved the reported GPUs."""
    kube, name = converged()
    planned = PlannerOutcome(desired={"prefill": 2, "decode": 1}, status={})
    run(kube, name, planner=planned)  # prefill 1 → 2; the status still counts 1 replica's 4 GPUs
    assert kube.cr(name)["status"]["prefill"]["gpus"] == 4
    spec = kube.cr(name)["spec"]
    spec["autoscaling"]["gpuBudget"] = 4
    kube.update_spec(name, spec)
    kube.settle()  # the second prefill replica comes up while the spec is invalid
    out, _ = run(kube, name, now=LATER)
    assert out.stall.reason == "InvalidSpec"
    assert out.status["prefill"]["replicas"] == 2 and out.status["prefill"]["gpus"] == 8
    run(kube, name, now=LATER)  # and it stays right on the next pass
    assert kube.cr(name)["status"]["prefill"]["gpus"] == 8


def test_a_fixed_spec_recovers_from_a_stall():
    kube, name = converged()
    good = kube.cr(name)["spec"]
    bad = copy.deepcopy(good)
    bad["autoscaling"]["gpuBudget"] = 4
    kube.update_spec(name, bad)
    run(kube, name, now=LATER)
    kube.update_spec(name, good)
    out, events = run(kube, name, now=LATER)
    status = kube.cr(name)["status"]
    assert out.stall is None and out.applied == [] and cond(status, "Stalled") is None
    assert cond(status, "Ready")["status"] == "True" and status["observedGeneration"] == 3
    assert events == []


# ------------------------------------------------------------------ serving revision, what restarts engines
def engine_workloads(kube: FakeKube) -> dict[str, dict]:
    return {n: copy.deepcopy(o) for (_, k, _, n), o in kube.objects.items()
            if k in ("Deployment", "LeaderWorkerSet") and (o["metadata"]["labels"].get(L.ROLE_LABEL) != L.ROUTER)}


def test_an_slo_and_router_edit_rewrites_the_configmap_and_router_but_no_engine_workload():
    kube, name = converged()
    revision = kube.cr(name)["status"]["servingRevision"]
    before = engine_workloads(kube)
    spec = kube.cr(name)["spec"]
    spec["slo"]["e2eP95Seconds"] = 120
    spec["routing"] = {"policy": "round_robin"}
    kube.update_spec(name, spec)
    out, _ = run(kube, name, now=LATER)
    assert sorted(w for v, w in kube.writes if v == "update") == [  # the slot's vllm-router takes the policy
        f"ConfigMap/{name}-config", f"Deployment/{name}-router-0"]
    assert engine_workloads(kube) == before
    assert kube.get("ConfigMap", f"{name}-config")["data"]["engine-drain-seconds"] == "190"
    assert out.status["servingRevision"] == revision


def test_an_engine_edit_starts_a_rollout_beside_the_untouched_serving_engines():
    kube, name = converged()
    old = kube.cr(name)["status"]["servingRevision"]
    assert {p.metadata.labels[L.REVISION_LABEL] for p in kube.pods
            if p.metadata.labels.get(L.ROLE_LABEL) != L.ROUTER} == {old}
    before = engine_workloads(kube)
    spec = kube.cr(name)["spec"]
    spec["decode"]["maxNumSeqs"] = 48
    kube.update_spec(name, spec)
    out, events = run(kube, name, now=LATER)
    assert out.status["servingRevision"] == old and out.status["rollout"]["candidateSlot"] == "a"
    new = out.status["rollout"]["candidateRevision"]
    assert new != old
    # both roles of the candidate, in their own slot; the serving ones as they were (one revision per pair)
    assert {n: w for n, w in engine_workloads(kube).items() if n in before} == before
    assert {kube.get("Deployment", f"{name}-{r}-a")["metadata"]["labels"][L.REVISION_LABEL]
            for r in ("prefill", "decode")} == {new}
    assert cond(out.status, "Reconciling")["status"] == "True" and cond(out.status, "Ready")["status"] == "False"
    assert ("Normal", "RolloutStarted") in [e[:2] for e in events]


def test_pods_are_listed_only_while_engine_pods_of_another_revision_may_run():
    kube, name = converged()
    run(kube, name, now=LATER)
    assert not [c for c in kube.calls if c[0] == "list_pods"]  # at rest: no pod list per pass
    fresh = FakeKube()
    pending = fresh.add_cr(example("tp4-h200-low-latency"))["metadata"]["name"]
    run(fresh, pending)
    fresh.calls.clear()
    run(fresh, pending, now=LATER)  # the workload controllers have reported nothing yet: no pod exists to list
    assert not [c for c in fresh.calls if c[0] == "list_pods"]
    fresh.settle(ready=False)  # nodes full: pods never Ready, every replica of the current template
    fresh.calls.clear()
    run(fresh, pending, now=LATER)
    assert not [c for c in fresh.calls if c[0] == "list_pods"]
    spec = kube.cr(name)["spec"]
    spec["decode"]["maxNumSeqs"] = 48
    kube.update_spec(name, spec)
    kube.calls.clear()
    out, _ = run(kube, name, now=LATER)
    assert [c for c in kube.calls if c[0] == "list_pods"] and out.status["servingRevision"] != \
        out.status["rollout"]["candidateRevision"]
