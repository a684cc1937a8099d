"""The planner's edge without I/O: pods, snapshots, status and time → Observation (controller/observation.py),
a Decision → status, Events and deletion costs (controller/autoscale.py), and the thin I/O layer's handling
of a pod it cannot annotate."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodStatus
from kubernetes.client.exceptions import ApiException

from fake_kube import FakeKube
from v41flash.render import labels as L
from v41flash.api import v1alpha1 as api
from v41flash.controller.autoscale import (
    Autoscaler, no_profile_outcome, planner_due, planner_outcome, removal_annotations,
)
from v41flash.controller.observation import (
    PodView, observe, planner_bounds, planner_slo, pod_view, scrape_targets, serving,
)
from v41flash.metrics.parse import parse_metrics
from v41flash.metrics.window import PodSnapshot, SnapshotHistory
from v41flash.planner import drain
from v41flash.planner.datatypes import Decision, PlannerState, RoleDecision, RoleState
from v41flash.render.resolve import resolve
from vllm_exposition import E2E_LE, TTFT_LE, page

T = 1_800_000_000.0
SPEC = api.V41FlashDeploymentSpec.model_validate({
    "gpu": {"product": "H200"}, "prefill": {"minReplicas": 1, "maxReplicas": 4},
    "decode": {"minReplicas": 2, "maxReplicas": 6, "replicasManagedBy": "external"},
    "slo": {"ttft": {"targetSeconds": 0.5, "percentile": 90}, "e2eP95Seconds": 60, "windowSeconds": 60},
    "autoscaling": {"intervalSeconds": 30, "gpuBudget": 48}})
AGGREGATED = SPEC.model_copy(update={"prefill": SPEC.prefill.model_copy(update={"enabled": False})})


def served(requests: float, ttft_s: float, running: float = 4.0) -> str:
    ttft = [requests if ttft_s <= le else 0.0 for le in TTFT_LE] + [requests]
    e2e = [requests if 20.0 <= le else 0.0 for le in E2E_LE] + [requests]
    return page({"0": {"ttft": (ttft, ttft_s * requests), "e2e": (e2e, 20.0 * requests), "running": running,
                       "prompt_tokens": 8000 * requests, "queries": 8000 * requests, "hits": 6000 * requests}})


def history(*snaps: tuple[str, str, float, str]) -> SnapshotHistory:
    h = SnapshotHistory()
    h.add([PodSnapshot(pod, role, t, parse_metrics(text)) for pod, role, t, text in snaps])
    return h


def view(name, role, ready=True, ip="10.0.0.1", created=None, **kw) -> PodView:
    return PodView(name=name, role=role, ready=ready, ip=ip, created=created, **kw)


# ------------------------------------------------------------------ pods
def test_pod_view_reads_what_the_planner_needs_from_a_kubernetes_pod():
    created = datetime(2027, 1, 15, 8, 0, tzinfo=timezone.utc)
    pod = V1Pod(metadata=V1ObjectMeta(name="x-prefill-0", labels={"v41flash.io/role": "prefill"},
                                      annotations={drain.POD_DELETION_COST: "-2"}, creation_timestamp=created),
                status=V1PodStatus(pod_ip="10.1.2.3", conditions=[V1PodCondition(type="Ready", status="True")]))
    assert pod_view(pod) == PodView("x-prefill-0", "prefill", True, "10.1.2.3", False, created.timestamp(), -2)
    pod.metadata.annotations = {drain.POD_DELETION_COST: "cheap"}
    pod.metadata.deletion_timestamp = created
    pod.status.conditions = [V1PodCondition(type="Ready", status="False")]
    v = pod_view(pod)
    assert (v.ready, v.deleting, v.deletion_cost) == (False, True, None)
    bare = pod_view(V1Pod(metadata=V1ObjectMeta(name="p"), status=V1PodStatus()))
    assert bare == PodView("p", None, False, None)


def test_only_ready_live_pods_with_an_ip_are_scraped():
    pods = [view("p-0", "prefill"), view("p-1", "prefill", ready=False), view("p-2", "prefill", ip=None),
            view("p-3", "prefill", deleting=True), view("d-0", "decode", ip="10.0.0.2"),
            view("r-0", "router", ip="10.0.0.3")]
    assert [p.name for p in serving(pods)["prefill"]] == ["p-0"]
    assert [(t.pod, t.role, t.url) for t in scrape_targets(pods)] == [
        ("p-0", "prefill", "http://10.0.0.1:8000/metrics"), ("d-0", "decode", "http://10.0.0.2:8000/metrics"),
        ("r-0", "router", "http://10.0.0.3:29000/metrics"),
        ("r-0/proxy", "router", "http://10.0.0.3:30000/proxy/metrics")]  # every router pod runs the proxy


# ------------------------------------------------------------------ observation
def test_observe_builds_each_role_s_window_and_replicas():
    h = history(("p-0", "prefill", T - 60, served(100, 0.05)), ("p-0", "prefill", T, served(700, 2.0)),
                ("d-0", "decode", T - 60, served(100, 0.05)), ("d-0", "decode", T, served(700, 0.05)))
    pods = [view("p-0", "prefill"), view("p-1", "prefill", ready=False, created=T - 90),
            view("p-2", "prefill", ready=False, deleting=True, created=T - 500), view("d-0", "decode")]
    status = {"prefill": {"desiredReplicas": 2, "readyReplicas": 1, "replicas": 2},
              "decode": {"desiredReplicas": 1, "readyReplicas": 1, "replicas": 2}}
    out = observe(SPEC, resolve(SPEC), pods, h, status, T)
    o = out.observation
    assert o.prefill.replicas.desired == 2 and o.prefill.replicas.ready == 1 and o.prefill.replicas.starting == 1
    assert o.prefill.replicas.starting_for_s == (90.0,)  # the deleting pod is not starting
    assert not o.prefill.rolling_out and o.decode.rolling_out  # 2 replicas for 1 desired: a rollout
    assert o.prefill.window.requests == 600 and o.prefill.window.complete
    assert o.prefill.window.ttft_s > 0.5 and o.router is None
    assert out.slo_status["ttftSeconds"] == o.prefill.window.ttft_s and out.slo_status["requestRate"] == 10.0
    assert out.slo_status["prefixCacheHitRate"] == 0.75


def test_observe_without_status_falls_back_to_min_replicas_and_counts_missing_pods():
    h = history(("p-0", "prefill", T - 60, served(0, 0.05)), ("p-0", "prefill", T, served(0, 0.05)))
    pods = [view("p-0", "prefill"), view("p-1", "prefill"), view("d-0", "decode"), view("d-1", "decode")]
    o = observe(SPEC, resolve(SPEC), pods, h, {}, T).observation
    assert (o.prefill.replicas.desired, o.prefill.replicas.ready, o.prefill.replicas.starting) == (1, 2, 1)
    assert o.decode.replicas.desired == 2  # decode's minReplicas
    assert o.prefill.window.missing_pods == ("p-1",) and not o.prefill.window.complete
    assert o.decode.window.pods_observed == 0


def test_observe_an_aggregated_deployment_has_no_prefill_and_reads_the_router():
    router_page = ("# TYPE vllm_router_request_duration_seconds histogram\n"
                   + "".join(f'vllm_router_request_duration_seconds_bucket{{le="{le}"}} {n}\n'
                             for le, n in (("10.0", 0), ("30.0", 200), ("+Inf", 200)))
                   + "vllm_router_request_duration_seconds_count 200\nvllm_router_request_duration_seconds_sum 4000\n")
    start = router_page.replace(" 200\n", " 0\n").replace("_sum 4000", "_sum 0")
    h = history(("d-0", "decode", T - 60, served(0, 0.05)), ("d-0", "decode", T, served(100, 0.05)),
                ("r-0", "router", T - 60, start), ("r-0", "router", T, router_page))
    out = observe(AGGREGATED, resolve(AGGREGATED), [view("d-0", "decode"), view("r-0", "router")], h, {}, T)
    assert out.observation.prefill is None
    assert out.observation.router.requests == 200 and 10.0 < out.observation.router.e2e_p95_s <= 30.0
    assert out.slo_status["e2eP95Seconds"] == pytest.approx(out.observation.router.e2e_p95_s, rel=1e-3)


def test_bounds_and_slo_come_from_the_spec():
    b = planner_bounds(SPEC)
    assert (b.prefill.min_replicas, b.prefill.max_replicas, b.prefill.autoscale) == (1, 4, True)
    assert (b.decode.min_replicas, b.decode.max_replicas, b.decode.autoscale) == (2, 6, False)
    assert b.gpu_budget == 48
    s = planner_slo(SPEC)
    assert (s.ttft_s, s.e2e_p95_s, s.ttft_percentile, s.window_s) == (0.5, 60.0, 0.9, 60.0)


def test_the_planner_is_due_every_interval_from_memory_else_from_status():
    assert planner_due(None, {}, T, 30)
    recorded = {"lastDecision": {"time": datetime.fromtimestamp(T - 20, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    assert not planner_due(None, recorded, T, 30) and planner_due(None, recorded, T + 10, 30)
    assert planner_due(PlannerState(last_decision_time=T - 31), recorded, T, 30)  # memory wins
    assert planner_due(None, {"lastDecision": {"time": "garbage"}}, T, 30)


# ------------------------------------------------------------------ decision → outcome
def decision(prefill=(2, 2, "hold"), decode=(3, 3, "hold"), reason="demand 1.23 req/s") -> Decision:
    def rd(role, cur, want, action):
        return RoleDecision(role=role, current=cur, desired=want, action=action, reason=reason)
    return Decision(time=T, prefill=rd("prefill", *prefill), decode=rd("decode", *decode),
                    state=PlannerState(prefill=RoleState(correction=1.23456, last_scale_time=T, last_action="scale_up")))


def test_a_decision_becomes_replicas_status_and_an_event_when_something_moved():
    out = planner_outcome(decision(prefill=(2, 3, "scale_up")), {"ttft": "1.00s"}, T, {})
    assert out.desired == {"prefill": 3, "decode": 3}
    last = out.status["lastDecision"]
    assert last["action"] == "scale_up" and (last["prefill"], last["decode"]) == (3, 3)
    assert last["reason"] == "prefill 2->3: demand 1.23 req/s; decode 3->3: demand 1.23 req/s"
    assert out.status["plannerState"]["prefill"] == {"correction": 1.235, "corrections_learned": 0,
                                                     "service_correction": None, "last_scale_time": T,
                                                     "last_action": "scale_up", "headroom_rise": None,
                                                     "headroom_peak": None}
    assert out.events == [("Normal", "Scaled", last["reason"])]


def test_the_same_hold_again_keeps_the_recorded_decision():
    first = planner_outcome(decision(), {}, T, {}).status["lastDecision"]
    again = planner_outcome(decision(reason="demand 1.31 req/s"), {}, T + 30, first)
    assert again.status["lastDecision"] is first and again.events == []
    other = planner_outcome(decision(reason="stabilizing"), {}, T + 60, first)
    assert other.status["lastDecision"] is not first


def test_no_profile_warns_once():
    first = no_profile_outcome(SPEC, {}, {}, T)
    assert first.desired == {} and [e[1] for e in first.events] == ["NoCapacityProfile"]
    again = no_profile_outcome(SPEC, {}, first.status["lastDecision"], T + 30)
    assert again.events == [] and again.status["lastDecision"] is first.status["lastDecision"]


def test_a_scale_down_marks_the_least_loaded_pods_and_resets_stale_marks():
    pods = [view("d-0", "decode"), view("d-1", "decode"), view("d-2", "decode", deletion_cost=-1),
            view("d-3", "decode", deleting=True), view("p-0", "prefill", deletion_cost=-1)]
    # running per pod as the window reports it (both sources): here cut from scraped snapshots, two engines each
    h = SnapshotHistory()
    for t in (T - 60, T):
        h.add([PodSnapshot(n, "decode", t, parse_metrics(page({"0": {"running": r}, "1": {"running": 1.0}})))
               for n, r in (("d-0", 8.0), ("d-1", 0.0), ("d-2", 4.0))])
    running = dict(h.window("decode", T, 60.0, ["d-0", "d-1", "d-2"]).pod_running)
    assert running == {"d-0": 9.0, "d-1": 1.0, "d-2": 5.0}
    marks = removal_annotations(decision(decode=(3, 2, "scale_down")), pods, running)
    assert marks == [("d-1", {drain.POD_DELETION_COST: "-1"}), ("d-2", {drain.POD_DELETION_COST: "0"})]
    assert removal_annotations(decision(), pods, running) == []  # nobody scales down: nothing written


# ------------------------------------------------------------------ the I/O layer
def failing(pod: str, exc: Exception | None, pods: list[V1Pod] | None = None) -> FakeKube:
    """An apiserver whose annotation of `pod` fails with `exc` (None: succeeds)."""
    kube = FakeKube(pods=pods or [])
    if exc is not None:
        kube.fail[("patch_pod_annotations", pod)] = exc
    return kube


def annotated(kube: FakeKube) -> list[str]:
    return [name for name, _ in kube.annotated]


def test_a_vanished_pod_is_logged_as_such_and_other_api_errors_with_the_error(caplog):
    caplog.set_level(logging.INFO, logger="v41flash.controller.autoscale")
    marks = [("d-1", {drain.POD_DELETION_COST: "-1"})]
    Autoscaler(failing("d-1", ApiException(status=404, reason="Not Found")))._annotate("ns", marks)
    assert [r.levelname for r in caplog.records] == ["INFO"] and "vanished" in caplog.records[0].getMessage()
    caplog.clear()
    Autoscaler(failing("d-1", ApiException(status=403, reason="Forbidden")))._annotate("ns", marks)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "403 Forbidden" in caplog.records[0].getMessage() and "vanished" not in caplog.records[0].getMessage()
    with pytest.raises(TypeError):  # a bug is not a vanished pod
        Autoscaler(failing("d-1", TypeError("boom")))._annotate("ns", marks)
    ok = failing("d-1", None)
    Autoscaler(ok)._annotate("ns", marks)
    assert annotated(ok) == ["d-1"]


def cluster(exc: Exception | None = None) -> FakeKube:
    """Two decode pods starting (nothing to scrape); annotating d-0 fails with `exc` (None: succeeds)."""
    return failing("d-0", exc, [V1Pod(metadata=V1ObjectMeta(name=f"d-{i}", namespace="ns", labels={
        "v41flash.io/role": "decode", **L.serving_pods_selector("x")}), status=V1PodStatus(conditions=[]))
        for i in range(2)])


def scale_down(monkeypatch):
    down = decision(decode=(2, 1, "scale_down"))
    monkeypatch.setattr("v41flash.controller.autoscale.plan", lambda *args: down)
    return down


# a deployment the planner has decided for before (no engine pod Ready and no decision yet: nothing is planned)
BODY = {"metadata": {"name": "x", "namespace": "ns", "uid": "u1"},
        "status": {"decode": {"desiredReplicas": 2, "readyReplicas": 0, "replicas": 2},
                   "lastDecision": {"time": "2020-01-01T00:00:00Z", "action": "hold", "reason": "earlier"}}}


def test_the_decision_is_remembered_only_once_its_deletion_costs_are_written(monkeypatch):
    down = scale_down(monkeypatch)
    broken = Autoscaler(cluster(ConnectionError("apiserver unreachable")))
    with pytest.raises(ConnectionError):
        broken.step(BODY, SPEC, now=T)
    assert "u1" not in broken.states  # the next pass decides again instead of waiting a whole interval
    vanished = Autoscaler(cluster(ApiException(status=404, reason="Not Found")))
    out = vanished.step(BODY, SPEC, now=T)
    assert out.desired["decode"] == 1 and vanished.states["u1"] == down.state
    ok = cluster()
    Autoscaler(ok).step(BODY, SPEC, now=T)
    assert annotated(ok) == ["d-0"]  # one of the two starting pods is marked to go first
