from v41flash.api import v1alpha1 as api
from v41flash.controller.desired import desired_replicas
from v41flash.controller.status import Stall, WorkloadState, compute_status, workload_state

NOW, LATER = "2026-11-30T06:00:00Z", "2026-11-30T06:05:00Z"
READY1 = WorkloadState(exists=True, spec_replicas=1, replicas=1, ready=1, updated=1, up_to_date=True)


def status(workloads, *, desired=None, stall=None, previous=None, now=NOW, router=READY1, enabled=None):
    return compute_status(
        generation=3, enabled=enabled or {"prefill": True, "decode": True},
        desired=desired or {"prefill": 1, "decode": 1}, workloads=workloads, router=router, router_desired=1,
        gpus_per_replica={"prefill": 4, "decode": 4}, router_service="x-router.ns.svc:8000", stall=stall,
        previous=previous, now=now)


def cond(st, type_):
    return next((c for c in st["conditions"] if c["type"] == type_), None)


def test_all_ready_is_ready_without_abnormal_conditions():
    st = status({"prefill": READY1, "decode": READY1})
    assert st["observedGeneration"] == 3
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "Reconciling") is None and cond(st, "Stalled") is None
    assert st["prefill"] == {"desiredReplicas": 1, "replicas": 1, "readyReplicas": 1, "ready": "1/1", "gpus": 4}
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_waiting_replicas_is_reconciling_with_reason():
    st = status({"prefill": READY1, "decode": WorkloadState(True, 2, 2, 1, 2, True)}, desired={"prefill": 1, "decode": 2})
    assert cond(st, "Ready")["status"] == "False"
    rec = cond(st, "Reconciling")
    assert rec["status"] == "True" and rec["message"] == "decode: 1/2 replicas ready"
    assert st["decode"]["ready"] == "1/2"


def test_unobserved_rollout_and_missing_workload_are_reported():
    st = status({"prefill": WorkloadState(True, 1, 1, 1, 1, False), "decode": WorkloadState()})
    assert cond(st, "Reconciling")["message"] == (
        "prefill: rollout of the new spec not yet observed; decode: workload not created yet")


def test_stalled_keeps_describing_what_runs():
    st = status({"prefill": READY1, "decode": READY1}, stall=Stall("InvalidSpec", "spec.x: bad"))
    assert cond(st, "Stalled")["status"] == "True"
    assert cond(st, "Ready") == {**cond(st, "Ready"), "status": "False", "reason": "InvalidSpec"}
    assert st["decode"]["readyReplicas"] == 1


def test_unchanged_world_gives_identical_status_and_keeps_transition_times():
    first = status({"prefill": READY1, "decode": READY1})
    again = status({"prefill": READY1, "decode": READY1}, previous=first, now=LATER)
    assert again == first
    flipped = status({"prefill": READY1, "decode": WorkloadState()}, previous=first, now=LATER)
    assert cond(flipped, "Ready")["lastTransitionTime"] == LATER


def test_planner_fields_are_carried():
    prev = {"slo": {"ttft": "0.4s"}, "lastDecision": {"action": "hold"}, "plannerState": {"k": 1}}
    st = status({"prefill": READY1, "decode": READY1}, previous=prev)
    assert st["slo"] == prev["slo"] and st["lastDecision"] == prev["lastDecision"] and st["plannerState"] == {"k": 1}


def test_disabled_role_and_external_replicas():
    ext = WorkloadState(True, 3, 3, 3, 3, True)
    st = status({"decode": ext}, enabled={"prefill": False, "decode": True}, desired={"decode": None})
    assert st["prefill"]["ready"] == "off"
    assert st["decode"]["ready"] == "3/3" and cond(st, "Ready")["status"] == "True"


def test_workload_state_from_deployment():
    dep = {"kind": "Deployment", "metadata": {"generation": 4}, "spec": {"replicas": 2},
           "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}}
    assert workload_state(dep) == WorkloadState(True, 2, 2, 2, 2, False)
    assert workload_state(None) == WorkloadState()


def test_desired_replicas_bounds_external_and_planner():
    spec = api.V41FlashDeploymentSpec.model_validate({
        "prefill": {"minReplicas": 1, "maxReplicas": 3},
        "decode": {"minReplicas": 2, "maxReplicas": 4, "replicasManagedBy": "external"}})
    assert desired_replicas(spec, {}) == {"prefill": 1, "decode": None}
    assert desired_replicas(spec, {"prefill": {"desiredReplicas": 7}}) == {"prefill": 3}  | {"decode": None}
    off = spec.model_copy(update={"autoscaling": api.AutoscalingSpec(enabled=False)})
    assert desired_replicas(off, {"prefill": {"desiredReplicas": 3}})["prefill"] == 1
    agg = api.V41FlashDeploymentSpec.model_validate({"prefill": {"enabled": False}})
    assert desired_replicas(agg, {}) == {"decode": 1}


def test_serving_revision_names_the_new_revision_only_once_every_engine_pod_runs_it():
    settled = {"prefill": READY1, "decode": READY1}
    first = compute_status(**_kw(settled), previous=None, revision="new", pod_revisions={"new": (2, 2)})
    assert first["servingRevision"] == "new" and cond(first, "Ready")["status"] == "True"

    # a plain roll: workloads report ready but an old-revision pod still serves
    rolling = compute_status(**_kw(settled), previous={"servingRevision": "old"}, revision="new",
                             pod_revisions={"old": (1, 1), "new": (2, 1)})
    assert rolling["servingRevision"] == "old"
    assert cond(rolling, "Reconciling")["message"] == (
        "engines rolling from revision old to new: 2/3 engine pods on new (1 Ready)")
    assert cond(rolling, "Ready")["status"] == "False"

    # every pod on the new revision but a role still starting: the old name stays until it is ready
    starting = {"prefill": READY1, "decode": WorkloadState(True, 1, 1, 0, 1, True)}
    st = compute_status(**_kw(starting), previous={"servingRevision": "old"}, revision="new",
                        pod_revisions={"new": (1, 0)})
    assert st["servingRevision"] == "old" and cond(st, "Reconciling")["message"] == "decode: 0/1 replicas ready"

    # an invalid spec (nothing rendered): the last serving revision is kept
    stalled = compute_status(**{**_kw(settled), "stall": Stall("InvalidSpec", "spec.x: bad")},
                             previous={"servingRevision": "old"}, revision=None)
    assert stalled["servingRevision"] == "old"
    # none known yet: no field (status stays as before the feature for a stack still coming up)
    assert "servingRevision" not in compute_status(**_kw(starting), previous=None, revision="new",
                                                   pod_revisions={"new": (1, 0)})

    # a surge replica Pending for GPUs beside the old one: the role says so, the old revision serves
    surging = {"prefill": READY1, "decode": WorkloadState(True, 1, 2, 1, 1, True)}
    st = compute_status(**_kw(surging), previous={"servingRevision": "old"}, revision="new",
                        pod_revisions={"old": (1, 1), "new": (1, 0)})
    assert st["servingRevision"] == "old"
    assert cond(st, "Reconciling")["message"] == (
        "decode: 2 replicas for 1 desired (rolling); engines rolling from revision old to new: "
        "1/2 engine pods on new (0 Ready)")


def _kw(workloads):
    return dict(generation=3, enabled={"prefill": True, "decode": True}, desired={"prefill": 1, "decode": 1}, stall=None,
                workloads=workloads, router=READY1, router_desired=1, gpus_per_replica={"prefill": 4, "decode": 4},
                router_service="x-router.ns.svc:8000", now=NOW)
