"""Throughput and failure handling of the controller without a cluster: which calls a pass makes (no list on
create, concurrent waves, observe passes from the watch cache), a refused-for-capacity apply as a condition,
and the scheduler (one stuck deployment never blocks another; backoff with one log line per step)."""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
from pathlib import Path

import kopf
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

import process_memory
from fake_kube import FakeKube, api_error
from process_memory import reconcile
from v41flash.controller import apply as apply_mod
from v41flash.controller import desired as desired_mod
from v41flash.controller import handlers, planners, scheduler
from v41flash.controller import passes as passes_mod
from v41flash.controller import reconcile as rec
from v41flash.controller.apply import capacity_refusal
from v41flash.controller.children import ChildCache
from v41flash.controller.config import OperatorConfig
from v41flash.controller.kube import ChildRef
from v41flash.controller.passes import run_pass
from v41flash.controller.periodic import periodic_work
from v41flash.controller.reconcile import Pass
from v41flash.controller.runtime import Runtime
from v41flash.controller.scheduler import CapacityRefused, Scheduler, Work
from v41flash.render import labels as L

EXAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "examples" / "tp4-h200-low-latency.yaml"
NAME = "tp4-h200-low-latency"


def body(uid: str = "u1", generation: int = 1) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"].update(namespace="ns", uid=uid, generation=generation, resourceVersion="10")
    return doc


def cluster(**kw) -> FakeKube:
    """An apiserver holding the CR of body()."""
    kube = FakeKube(**kw)
    kube.add_cr(body())
    return kube


def called(kube: FakeKube, method: str) -> list:
    return [what for m, what in kube.calls if m == method]


def api_calls(kube: FakeKube) -> list:
    """The calls that reach the apiserver (has_kind is answered from Kube's discovery cache)."""
    return [c for c in kube.calls if c[0] != "has_kind"]


def status_writes(kube: FakeKube) -> list:
    return [w for w in kube.writes if w[0] == "status"]


def no_events(*_):
    pass


def runtime(kube=None, **config) -> Runtime:
    return Runtime(kube=kube, config=OperatorConfig(**config), memory=process_memory.MEMORY)


def memo(rt: Runtime) -> kopf.Memo:
    """What kopf hands every handler (cli/operator.py passes the runtime to kopf.run)."""
    return kopf.Memo(runtime=rt)


def schedule(run, **config) -> Scheduler:
    """A scheduler running `run` as each pass, on this test's memory."""
    return Scheduler(run, process_memory.MEMORY, OperatorConfig(**config))


def known(uid: str, body: dict) -> None:
    """The watch delivered this body."""
    process_memory.MEMORY.of(uid).body = body


def kinds(calls, verb):
    return [what.split("/")[0] for m, what in calls if m == verb]


def test_create_lists_nothing_and_applies_references_before_workloads():
    kube = cluster()
    out = reconcile(kube, body(), no_events, how=Pass(prune=False))
    assert not called(kube, "list_children")  # a new uid owns nothing: nothing to prune
    applied = kinds(kube.calls, "apply")
    workloads = [i for i, k in enumerate(applied) if k == "Deployment"]
    others = [i for i, k in enumerate(applied) if k not in ("Deployment", "RoleBinding")]
    assert workloads and others and max(others) < min(workloads)  # ServiceAccount, Role, ... first
    assert out.status_written and out.stall is None
    assert out.desired == frozenset(kube.children())


def test_a_rolebinding_is_applied_after_its_role():
    """The RBAC escalation check resolves the Role when a binding is written (404 before it exists, for any
    writer short of cluster-admin): the binding goes in the second wave."""
    kube = cluster()
    reconcile(kube, body(), no_events, how=Pass(prune=False))
    waves = apply_mod._waves([{"kind": k} for k in kinds(kube.calls, "apply")])
    first, second = ({o["kind"] for o in w} for w in waves)
    assert "Role" in first and "ServiceAccount" in first and "RoleBinding" in second and "Role" not in second


def test_a_namespace_being_deleted_ends_the_pass_without_a_retry():
    terminating = ApiException(status=403, reason="Forbidden")
    terminating.body = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden", "message": "is forbidden: "
                                   "unable to create new content in namespace ns because it is being terminated",
                                   "details": {"causes": [{"reason": "NamespaceTerminating"}]}})
    with pytest.raises(apply_mod.NamespaceTerminating):
        reconcile(cluster(refuse={"Deployment": terminating}), body(), no_events, how=Pass(prune=False))
    plain = ApiException(status=403, reason="Forbidden")
    plain.body = json.dumps({"kind": "Status", "code": 403, "message": "forbidden: no RBAC"})
    with pytest.raises(ApiException):  # any other refusal is a failure: retried with backoff, logged
        reconcile(cluster(refuse={"Deployment": plain}), body(), no_events, how=Pass(prune=False))


def test_an_unchanged_desired_set_is_not_listed_again_and_a_changed_one_is_pruned():
    kube = cluster()
    first = reconcile(kube, body(), no_events, how=Pass(prune=False))
    kube.calls.clear()
    reconcile(kube, kube.cr(NAME), no_events, how=Pass(prune=first.desired))
    assert not called(kube, "list_children") and not status_writes(kube)[1:]  # nothing changed: no list, no write
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {  # a child of ours the desired set lost
        "name": "left-over", "labels": L.owned_selector(NAME), "ownerReferences": [{"uid": "u1"}]}})
    reconcile(kube, kube.cr(NAME), no_events, how=Pass(prune=first.desired - {next(iter(first.desired))}))
    assert called(kube, "list_children") and ("delete", "ConfigMap/left-over") in kube.calls


def test_an_observe_pass_reads_the_cache_applies_nothing_and_writes_only_a_change():
    kube = cluster()
    first = reconcile(kube, body(), no_events, how=Pass(prune=False))
    workloads = {ref: obj for ref, obj in kube.children().items() if ref.kind == "Deployment"}
    kube.calls.clear()
    seen = []

    def cache(namespace, uid):
        seen.append(uid)
        return workloads

    same = reconcile(kube, kube.cr(NAME), no_events, how=Pass(apply=False, workloads=cache))
    assert seen == ["u1"] and api_calls(kube) == []  # no API call at all
    assert not same.status_written
    for obj in workloads.values():  # the workload controller caught up and one replica became ready
        obj["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    moved = reconcile(kube, kube.cr(NAME), no_events, how=Pass(apply=False, workloads=cache))
    assert api_calls(kube) == [("patch_status", NAME)] and moved.status_written


def test_a_full_service_range_becomes_a_condition_naming_it_and_nothing_after_it_is_applied():
    message = "Internal error occurred: failed to allocate a serviceIP: range is full"
    kube = cluster(refuse={"Service": api_error(500, "Internal Server Error", message)})
    events = []
    out = reconcile(kube, body(), lambda *e: events.append(e), how=Pass(prune=False))
    assert out.capacity and out.stall.reason == "CapacityExhausted"
    assert "range is full" in out.stall.message and "Service/" in out.stall.message
    stalled = next(c for c in out.status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and "range is full" in stalled["message"]
    assert "Deployment" not in kinds(kube.calls, "apply")  # the workloads wait for their Services
    assert [e[1] for e in events if e[1] != "Applied"] == ["CapacityExhausted"]
    # the retry refused the same way: the same status (no write) and no second Event
    events.clear()
    kube.writes.clear()
    again = reconcile(kube, kube.cr(NAME), lambda *e: events.append(e), how=Pass(prune=False))
    assert again.capacity and not status_writes(kube) and events == []


def test_capacity_signs():
    assert capacity_refusal(api_error(500, "Internal Server Error", "failed to allocate a serviceIP: range is full"))
    assert capacity_refusal(api_error(403, "Forbidden",
                                      'services "x" is forbidden: exceeded quota: q, requested: services=1'))
    assert not capacity_refusal(api_error(422, "Unprocessable Entity", "spec.replicas: Invalid value: -1"))
    assert not capacity_refusal(api_error(500, "Internal Server Error", "etcdserver: request timed out"))


# -- the scheduler ---------------------------------------------------------------------------------------------

def test_one_stuck_deployment_never_delays_another(monkeypatch):
    release = threading.Event()
    other_done = threading.Event()

    def fake_pass(uid, work):
        if uid == "stuck":
            assert release.wait(30), "the other deployment's pass never ran"
        else:
            other_done.set()
            release.set()


    async def main():
        # ONE worker: only the deadline frees it
        sched = schedule(fake_pass, pass_workers=1, pass_deadline_seconds=0.05, urgent_workers=0)
        sched.start()
        sched.request("stuck", Work(trigger="create", full=True))
        sched.request("other", Work(trigger="create", full=True))
        while not other_done.is_set() or sched.running:  # both passes finished (their callbacks ran)
            await asyncio.sleep(0.01)
        sched.stop()
        return sched

    sched = asyncio.run(asyncio.wait_for(main(), 30))
    assert other_done.is_set() and not sched.running


def test_a_capacity_refusal_backs_off_with_one_line_per_step_and_skips_ticks(monkeypatch, caplog):
    attempts = []

    def refused(uid, work):
        attempts.append(work.trigger)
        raise CapacityRefused("the cluster refused Service/x-router for capacity: range is full")

    known("u1", body())

    async def main():
        sched = schedule(refused, pass_workers=2, urgent_workers=0, backoff_seconds=(0.05, 0.1, 0.2))
        sched.start()
        sched.request("u1", Work(trigger="create", full=True))
        while len(attempts) < 3:
            await asyncio.sleep(0.01)
        assert sched.not_before["u1"] > 0
        sched.request("u1", Work(trigger="periodic"))  # a tick during backoff: dropped
        assert "u1" not in sched.pending
        sched.stop()
        return sched

    with caplog.at_level(logging.WARNING, logger=scheduler.log.name):
        sched = asyncio.run(asyncio.wait_for(main(), 30))
    assert attempts[:3] == ["create", "retry", "retry"]
    lines = [r for r in caplog.records if "range is full" in r.getMessage()]
    assert len(lines) >= 2 and all(r.exc_info is None for r in lines)  # no traceback for a full cluster
    assert [int(r.getMessage().split("retry ")[1].split()[0]) for r in lines[:3]] == [1, 2, 3][:len(lines[:3])]
    assert sched.failures["u1"] >= 3


def test_work_for_one_deployment_coalesces():
    a = Work(trigger="periodic", requested=2.0)
    b = Work(trigger="child", full=False, requested=1.0)
    c = Work(trigger="update", full=True, prune=True)
    merged = a.merge(b).merge(c)
    assert merged.trigger == "child" and merged.full and merged.prune


def test_the_child_cache_reports_only_what_status_reads():
    cache = ChildCache()
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "x-decode", "generation": 1, "resourceVersion": "5",
                        "ownerReferences": [{"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                             "uid": "u1"}]},
           "spec": {"replicas": 1, "template": {}}, "status": {"replicas": 1}}
    assert cache.update("ADDED", dep) == ("u1", True)
    assert cache.update("MODIFIED", {**dep, "metadata": {**dep["metadata"], "resourceVersion": "6"}}) == ("u1", False)
    assert cache.update("MODIFIED", {**dep, "status": {"replicas": 1, "readyReplicas": 1}}) == ("u1", True)
    assert cache.of("ns", "u1")[ChildRef("apps/v1", "Deployment", "x-decode")]["status"]["readyReplicas"] == 1
    assert cache.update("DELETED", dep) == ("u1", True) and cache.of("ns", "u1") == {}
    assert cache.update("ADDED", {**dep, "metadata": {"name": "foreign"}}) == (None, False)


def test_a_workload_changed_by_someone_else_is_reapplied_at_once_and_our_own_change_only_observed(monkeypatch):
    asked = []
    rt = runtime()
    monkeypatch.setattr(rt, "request", lambda uid, work: asked.append((uid, work.full)))
    known("u1", body())
    owner = [{"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "uid": "u1"}]

    def dep(generation, rv, ready=0):
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "x-decode", "generation": generation, "resourceVersion": rv,
                             "ownerReferences": owner},
                "spec": {"replicas": 1}, "status": {"readyReplicas": ready}}
    run = lambda kind, obj: asyncio.run(handlers.child_event({"type": kind}, obj, memo(rt)))  # noqa: E731
    run("ADDED", dep(1, "5"))
    process_memory.MEMORY.of("u1").applied_rv.update({ChildRef("apps/v1", "Deployment", "x-decode"): "7"})
    run("MODIFIED", dep(2, "7"))  # our own apply (the version it returned): status only
    run("MODIFIED", dep(2, "8", ready=1))  # the workload controller's status: status only
    run("MODIFIED", dep(3, "9", ready=1))  # someone edited its spec: re-apply
    run("DELETED", dep(3, "9", ready=1))
    assert asked == [("u1", False), ("u1", False), ("u1", False), ("u1", True), ("u1", True)]


def test_the_workloads_a_pass_applied_are_known_before_their_watch_events_arrive(monkeypatch):
    """After a burst the Deployment watch lags (kopf parses 1,000 ADDED events on a busy interpreter): each event
    of a workload we had just created asked for one more pass, and a pass before the event read the workload
    from the apiserver. What our apply returned is recorded: its own ADDED event asks for nothing, an observe
    pass reads nothing, and a later change by the workload controller still asks for an observe pass."""
    asked = []
    kube = cluster()
    rt = runtime(kube)
    monkeypatch.setattr(rt, "request", lambda uid, work: asked.append((uid, work.trigger, work.full)))
    known("u1", body())
    run_pass(rt, "u1", Work(trigger="create", full=True))
    workloads = {ref: o for ref, o in kube.children().items() if ref.kind == "Deployment"}
    # prefill, decode, the front and slot ""'s router
    assert len(workloads) == 4 and set(process_memory.MEMORY.children.of("ns", "u1")) == set(workloads)
    for obj in workloads.values():  # the watch delivers our own creations, late
        asyncio.run(handlers.child_event({"type": "ADDED"}, copy.deepcopy(obj), memo(rt)))
    assert asked == []
    kube.calls.clear()
    run_pass(rt, "u1", Work(trigger="periodic"))  # observe: from the cache alone
    assert [c for c in kube.calls if c[0] in ("read", "apply", "list_children")] == []
    ref, obj = next(iter(workloads.items()))
    moved = copy.deepcopy(obj)
    moved["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    moved["status"] = {"observedGeneration": 1, "replicas": 1}
    asyncio.run(handlers.child_event({"type": "MODIFIED"}, moved, memo(rt)))
    assert asked == [("u1", "child", False)]
    # an apply's result older than what the watch delivered meanwhile does not replace it
    process_memory.MEMORY.children.seen(copy.deepcopy(obj))
    assert process_memory.MEMORY.children.of("ns", "u1")[ref]["status"] == moved["status"]


def test_a_planner_hold_decided_on_an_older_body_keeps_the_recorded_decision(monkeypatch):
    """The planner decides from the body at its start; if status meanwhile recorded the same decision (only
    its time moved), the pass must not write the older record back (it did: a status write per decision)."""
    from v41flash.controller.autoscale import PlannerOutcome
    recorded = {"time": "2026-12-01T10:00:30Z", "action": "hold", "reason": "decode 1->1: no metrics", "decode": 1}
    older = {**recorded, "time": "2026-12-01T10:00:00Z"}
    seen = []

    def fake_reconcile(kube, body, emit, *, memory, planner=None, how=None, now=None):
        seen.append(planner.status["lastDecision"])
        return rec.Outcome(status={"conditions": []})
    monkeypatch.setattr(passes_mod, "reconcile", fake_reconcile)
    b = body()
    b["status"] = {"lastDecision": recorded}
    known("u1", b)
    process_memory.MEMORY.of("u1").applied_generation = 1
    run_pass(runtime(FakeKube()), "u1", Work(trigger="planner", planner=PlannerOutcome(status={"lastDecision": older})))
    assert seen == [recorded]


def test_a_new_cr_goes_before_the_periodic_refreshes_already_queued(monkeypatch):
    order = []
    gate = threading.Event()

    def fake_pass(uid, work):
        if uid == "busy":
            assert gate.wait(30)
        order.append(uid)


    async def main():
        sched = schedule(fake_pass, pass_workers=1, urgent_workers=0)  # the shared queue's order alone
        sched.start()
        sched.request("busy", Work(trigger="periodic"))
        await asyncio.sleep(0.05)  # the one worker is now busy
        for uid in ("a", "b", "c"):
            sched.request(uid, Work(trigger="periodic"))
        sched.request("b", Work(trigger="child"))  # merged, still background
        sched.request("new", Work(trigger="create", full=True))
        gate.set()
        while len(order) < 5:
            await asyncio.sleep(0.01)
        sched.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert order == ["busy", "new", "a", "b", "c"]


def test_a_holding_planner_pass_and_the_periodic_pass_share_one_prepared_render(monkeypatch):
    """Validating and rendering is the costly part of a pass (~25 ms): a planner pass whose replicas equal what
    status records must reuse the periodic pass's result, and vice versa (at 500 deployments, alternating
    misses cost most of a core)."""
    from v41flash.controller.autoscale import PlannerOutcome
    kube = cluster()
    first = reconcile(kube, body(), no_events, how=Pass(prune=False))
    calls = []
    real = desired_mod.validate
    monkeypatch.setattr(desired_mod, "validate", lambda *a, **k: calls.append(1) or real(*a, **k))
    settled = kube.cr(NAME)
    held = PlannerOutcome(desired={"prefill": first.status["prefill"]["desiredReplicas"],
                                   "decode": first.status["decode"]["desiredReplicas"]})
    for _ in range(3):
        reconcile(kube, settled, no_events, how=Pass(apply=False))
        reconcile(kube, settled, no_events, how=Pass(apply=False), planner=held)
    # the first pass (no replicas recorded yet) is kept under the replicas it rendered, which its status records:
    # no pass after it validates again (a new CR's first observe pass did; after a burst: 500 renders of ~25 ms
    # and more of CEL checks on a busy interpreter)
    assert len(calls) == 0
    moved = PlannerOutcome(desired={"prefill": 2, "decode": first.status["decode"]["desiredReplicas"]})
    reconcile(kube, settled, no_events, how=Pass(apply=False), planner=moved)
    assert len(calls) == 1  # a new replica count renders anew


def test_a_role_turned_off_shares_the_prepared_render_whatever_status_records_for_it(monkeypatch):
    kube = FakeKube()
    agg = body()
    agg["spec"]["prefill"] = {"enabled": False}
    kube.add_cr(agg)
    first = reconcile(kube, agg, no_events, how=Pass(prune=False))
    assert first.status["prefill"]["desiredReplicas"] == 0  # status records 0 for it; the render has none
    calls = []
    real = desired_mod.validate
    monkeypatch.setattr(desired_mod, "validate", lambda *a, **k: calls.append(1) or real(*a, **k))
    reconcile(kube, kube.cr(NAME), no_events, how=Pass(apply=False))
    assert calls == []


def test_a_deleted_workload_is_no_longer_known_so_its_name_is_checked_again_before_it_is_recreated(monkeypatch):
    """A child we applied is known (its collision read is skipped). Once its watch reports it DELETED, the name
    may be taken by someone else's object before the next pass: that pass must read the name again and refuse
    to adopt it, not force-apply over it as "ours"."""
    rt = runtime()
    monkeypatch.setattr(rt, "request", lambda uid, work: None)
    b = body()
    known("u1", b)
    kube = cluster()
    reconcile(kube, b, no_events, how=Pass(prune=False))
    ref = next(r for r in kube.children() if r.kind == "Deployment")
    assert ref in process_memory.MEMORY.of("u1").applied_rv
    ours = kube.children()[ref]
    kube.delete(ref, "ns")  # deleted by someone ...
    asyncio.run(handlers.child_event({"type": "DELETED"}, ours, memo(rt)))
    assert ref not in process_memory.MEMORY.of("u1").applied_rv
    foreign = {**copy.deepcopy(ours), "metadata": {"name": ref.name, "resourceVersion": "99",
                                                   "ownerReferences": [{"kind": "Deployment", "name": "other"}]}}
    kube.put(foreign)  # ... and the name taken by another object
    taken = copy.deepcopy(kube.get(ref.kind, ref.name))
    kube.calls.clear()
    out = reconcile(kube, kube.cr(NAME), no_events, how=Pass(prune=False))
    assert ("read", f"{ref.kind}/{ref.name}") in kube.calls
    assert out.stall is not None and out.stall.reason == "NameCollision" and ref.name in out.stall.message
    assert kube.get(ref.kind, ref.name) == taken and not kinds(kube.calls, "apply")


def test_a_delete_event_older_than_our_recreation_keeps_the_recreated_version(monkeypatch):
    """A pass may re-apply a deleted child before its DELETED event is handled: that stale event must not forget
    the version the recreation returned (it would only cost a read, but the record would be wrong)."""
    rt = runtime()
    monkeypatch.setattr(rt, "request", lambda uid, work: None)
    known("u1", body())
    owner = [{"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "uid": "u1"}]
    ref = ChildRef("apps/v1", "Deployment", "x-decode")
    process_memory.MEMORY.of("u1").applied_rv[ref] = "20"  # recreated at 20
    gone = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}, "status": {},
            "metadata": {"name": "x-decode", "generation": 1, "resourceVersion": "12", "ownerReferences": owner}}
    asyncio.run(handlers.child_event({"type": "DELETED"}, gone, memo(rt)))
    assert process_memory.MEMORY.of("u1").applied_rv[ref] == "20"


def test_a_new_cr_runs_at_once_while_every_shared_worker_is_busy_with_background_passes(monkeypatch):
    """At 500 deployments the workers are busy most of the time with periodic, child and planner passes; a new
    CR (or a spec change) must not wait for one of them to finish: reserved workers take only urgent passes."""
    started = {}
    gate = threading.Event()

    def fake_pass(uid, work):
        started[uid] = work.trigger
        if uid.startswith("bg"):
            assert gate.wait(30)


    async def main():
        sched = schedule(fake_pass, pass_workers=4, urgent_workers=1)
        sched.start()
        for i in range(6):
            sched.request(f"bg{i}", Work(trigger="periodic"))
        await asyncio.sleep(0.1)
        assert sorted(started) == ["bg0", "bg1", "bg2"]  # background never takes the reserved worker
        sched.request("new", Work(trigger="create", full=True))
        sched.request("edited", Work(trigger="update", full=True))
        for _ in range(100):
            if "edited" in started:
                break
            await asyncio.sleep(0.01)
        ran_urgent = {u for u in started if not u.startswith("bg")}
        gate.set()
        while len(started) < 8:
            await asyncio.sleep(0.01)
        sched.stop()
        return ran_urgent

    assert asyncio.run(asyncio.wait_for(main(), 30)) == {"new", "edited"}
    assert started == {**{f"bg{i}": "periodic" for i in range(6)}, "new": "create", "edited": "update"}


def test_a_stale_urgent_entry_does_not_run_background_work_on_a_reserved_worker(monkeypatch):
    """An urgent entry sits in both queues; when a shared worker took it, the reserved worker later finds the
    copy. If background work for that CR is pending by then, it is not the reserved worker's to run."""
    ran = []
    gates = {uid: threading.Event() for uid in ("bg", "u0", "bg2")}

    def fake_pass(uid, work):
        ran.append((uid, work.trigger))
        if uid in gates:
            assert gates[uid].wait(30)


    async def until(cond):
        for _ in range(300):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(ran)

    async def main():
        sched = schedule(fake_pass, pass_workers=2, urgent_workers=1)
        sched.start()
        sched.request("bg", Work(trigger="periodic"))  # the shared worker
        await until(lambda: ("bg", "periodic") in ran)
        sched.request("u0", Work(trigger="create", full=True))  # the reserved worker
        await until(lambda: ("u0", "create") in ran)
        sched.request("a", Work(trigger="create", full=True))  # in both queues
        gates["bg"].set()  # the shared worker takes "a"; its copy stays in the urgent queue
        await until(lambda: ("a", "create") in ran and "a" not in sched.running)
        sched.request("bg2", Work(trigger="periodic"))  # the shared worker is busy again
        await until(lambda: ("bg2", "periodic") in ran)
        sched.request("a", Work(trigger="child"))  # background work for "a"
        gates["u0"].set()  # the reserved worker is free and finds the stale copy of "a"
        await asyncio.sleep(0.2)
        assert ("a", "child") not in ran  # it waits for a shared worker
        gates["bg2"].set()
        await until(lambda: ("a", "child") in ran)
        sched.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("reserved, workers", [(-1, 4), (4, 4), (5, 4)])
def test_reserved_workers_must_leave_one_for_background_passes(reserved, workers):
    with pytest.raises(ValueError, match="reserved"):
        schedule(lambda uid, work: None, pass_workers=workers, urgent_workers=reserved)


def test_urgent_passes_call_the_apiserver_on_their_own_pool_not_behind_the_shared_one(monkeypatch):
    """The shared pool (applies, reads, lists of every pass) can hold a backlog; an urgent pass's calls go to
    their own pool, and only within Kube.urgent() on the calling thread."""
    from v41flash.controller import kube as kube_mod
    DEFAULTS = OperatorConfig()
    kube = kube_mod.Kube()
    gate = threading.Event()
    seen = []
    in_flight = {"bg": 0, "bg_max": 0}
    lock = threading.Lock()

    def fake_apply(obj, namespace):
        seen.append((obj["metadata"]["name"], threading.current_thread().name))
        if obj["metadata"]["name"].startswith("bg"):
            with lock:
                in_flight["bg"] += 1
                in_flight["bg_max"] = max(in_flight["bg_max"], in_flight["bg"])
            assert gate.wait(30)
            with lock:
                in_flight["bg"] -= 1
        return obj

    monkeypatch.setattr(kube, "apply", fake_apply)
    obj = lambda n: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}}  # noqa: E731
    backlog = threading.Thread(target=kube.apply_many, args=([obj(f"bg{i}") for i in range(40)], "ns"))
    backlog.start()  # 40 blocked applies: every shared thread is taken
    try:
        for _ in range(500):
            if in_flight["bg"] >= DEFAULTS.apply_workers:
                break
            threading.Event().wait(0.01)
        with kube.urgent():
            out = kube.apply_many([obj("new-a"), obj("new-b")], "ns")
        assert [o["metadata"]["name"] for o in out] == ["new-a", "new-b"]
        assert {t for n, t in seen if n.startswith("new")} <= {f"apply-urgent_{i}"
                                                                for i in range(DEFAULTS.urgent_apply_workers)}
        assert all(t.startswith("apply_") for n, t in seen if n.startswith("bg"))
        # background calls in flight are bounded by the smaller pool (what an urgent call waits behind)
        assert in_flight["bg_max"] == DEFAULTS.apply_workers < DEFAULTS.urgent_apply_workers
    finally:
        gate.set()
        backlog.join(30)


def test_a_pass_is_urgent_on_the_kube_pools_exactly_when_its_trigger_is(monkeypatch):
    kube = cluster()
    rt = runtime(kube)
    known("u1", body())
    for trigger, urgent in (("create", True), ("update", True), ("periodic", False), ("planner", False)):
        kube.calls.clear()
        run_pass(rt, "u1", Work(trigger=trigger, full=True))
        assert kube.calls[0] == ("urgent", urgent)


def _slot_tick(uid: str, every: int) -> int:
    import zlib
    return next(t for t in range(1, every + 1) if (zlib.crc32(uid.encode()) + t) % every == 0)


def test_a_drift_slot_right_after_a_full_pass_only_observes(monkeypatch):
    """After a burst of new CRs their staggered drift slots came up while their create passes were barely done:
    each re-applied and listed everything again (hundreds of full passes queued behind the burst)."""
    config = OperatorConfig()
    interval = config.timer_interval_seconds
    tick = _slot_tick("u1", config.drift_every)
    off_slot = periodic_work("u1", tick + 1, float("-inf"), config, now=1000.0)
    assert (off_slot.full, off_slot.prune) == (False, False)
    never = periodic_work("u1", tick, float("-inf"), config, now=1000.0)  # never applied by this process
    assert (never.full, never.prune) == (True, True)
    just = periodic_work("u1", tick, 1000.0 - interval, config, now=1000.0)  # the create pass, one tick ago
    assert (just.full, just.prune, just.trigger) == (False, False, "periodic")
    due = periodic_work("u1", tick, 1000.0 - config.drift_recent_ticks * interval, config,  # long enough ago
                        now=1000.0)
    assert (due.full, due.prune) == (True, True)


def test_a_full_pass_records_when_it_applied_and_forgetting_a_cr_drops_it(monkeypatch):
    kube = cluster()
    known("u1", body())
    run_pass(runtime(kube), "u1", Work(trigger="create", full=True))
    assert process_memory.MEMORY.of("u1").applied_at > float("-inf")
    process_memory.MEMORY.forget("u1", "ns", "x")
    assert process_memory.MEMORY.body("u1") is None and process_memory.MEMORY.of("u1").applied_at == float("-inf")


def test_the_planner_waits_until_the_current_generation_was_applied(monkeypatch):
    """A planner pass for a CR whose first pass has not run compared its decision with a status that has no
    replicas yet: 'moved', one more full pass queued behind the burst, for every new CR."""
    planned, asked = [], []
    monkeypatch.setattr(planners, "plan", lambda rt, body: planned.append(body["metadata"]["uid"]) or None)
    rt = runtime(planner_workers=1)
    monkeypatch.setattr(rt, "request", lambda uid, work: asked.append(uid))
    known("u1", body(generation=2))

    async def main():
        each = planners.Planners(rt)
        await each.run("u1")  # never applied
        process_memory.MEMORY.of("u1").applied_generation = 1
        await each.run("u1")  # generation 2 not applied yet
        process_memory.MEMORY.of("u1").applied_generation = 2
        await each.run("u1")
    asyncio.run(asyncio.wait_for(main(), 30))
    assert planned == ["u1"] and asked == []


def test_a_cr_whose_pods_do_not_exist_yet_gets_no_planner_pass_or_status_write(monkeypatch):
    """After a burst the planner's first decision for each new CR was "hold, waiting for pods", one status write
    per CR while its pods were Pending (the benchmark: 460 of them in the one-more phase). With no engine pod
    Ready and no decision recorded there is nothing to observe: no planner pass is queued, nothing written."""
    kube = FakeKube()
    asked = []
    rt = runtime(kube, planner_workers=1)  # its Autoscaler is made on this kube
    monkeypatch.setattr(rt, "request", lambda uid, work: asked.append(work))
    cr = body()
    cr["spec"]["autoscaling"]["enabled"] = True  # as the apiserver stores it (the CRD's default)
    known("u1", cr)
    process_memory.MEMORY.of("u1").applied_generation = 1

    async def main():
        await planners.Planners(rt).run("u1")
    asyncio.run(asyncio.wait_for(main(), 30))
    assert asked == [] and status_writes(kube) == []
    assert not called(kube, "list_pods")  # its workloads report no pod yet (no status): nothing to list either


def test_the_wait_for_a_worker_is_measured_by_priority(monkeypatch):
    from prometheus_client import REGISTRY
    gate = threading.Event()
    fake_pass = lambda uid, work: gate.wait(30) if uid == "busy" else None  # noqa: E731
    count = lambda p: REGISTRY.get_sample_value("v41flash_pass_wait_seconds_count", {"priority": p}) or 0  # noqa: E731
    slow = lambda p: count(p) - (REGISTRY.get_sample_value(  # noqa: E731
        "v41flash_pass_wait_seconds_bucket", {"priority": p, "le": "0.1"}) or 0)
    before = {p: (count(p), slow(p)) for p in ("urgent", "background")}

    async def main():
        sched = schedule(fake_pass, pass_workers=2, urgent_workers=1)
        sched.start()
        sched.request("busy", Work(trigger="periodic"))
        await asyncio.sleep(0.05)
        sched.request("late", Work(trigger="child"))  # waits for the one shared worker
        sched.request("new", Work(trigger="create", full=True))  # the reserved worker at once
        await asyncio.sleep(0.3)
        gate.set()
        await asyncio.sleep(0.1)
        sched.stop()
    asyncio.run(asyncio.wait_for(main(), 30))
    assert count("urgent") - before["urgent"][0] == 1 and slow("urgent") == before["urgent"][1]
    assert count("background") - before["background"][0] == 2 and slow("background") - before["background"][1] == 1


def test_the_passes_running_and_waiting_are_gauges(monkeypatch):
    """What `v41flash bench operator` reads to tell an operator at rest (nothing queued, nothing running)."""
    from prometheus_client import REGISTRY
    gate = threading.Event()
    fake_pass = lambda uid, work: gate.wait(30)  # noqa: E731
    gauge = lambda name: REGISTRY.get_sample_value(name)  # noqa: E731
    seen = {}

    async def main():
        sched = schedule(fake_pass, pass_workers=2, urgent_workers=1)
        sched.start()
        for uid in ("a", "b", "c"):
            sched.request(uid, Work(trigger="periodic"))
        await asyncio.sleep(0.1)
        seen["busy"] = (gauge("v41flash_passes_running"), gauge("v41flash_pass_queue_depth"))
        gate.set()
        await asyncio.sleep(0.3)
        seen["rest"] = (gauge("v41flash_passes_running"), gauge("v41flash_pass_queue_depth"))
        sched.stop()
    asyncio.run(asyncio.wait_for(main(), 30))
    assert seen == {"busy": (1, 2), "rest": (0, 0)}  # one shared worker: one runs, two wait


def test_an_active_rollout_gets_its_next_pass_soon_and_one_at_rest_waits_for_the_tick(monkeypatch):
    passes = []

    def fake_pass(uid, work):
        passes.append((uid, work.trigger))
        phase = "Canary" if uid == "rolling" else "Complete"
        return rec.Outcome(status={"conditions": [], "rollout": {"phase": phase}})

    known("rolling", {"metadata": {}})
    known("rest", {"metadata": {}})

    async def main():
        sched = schedule(fake_pass, pass_workers=2, urgent_workers=1, rollout_pass_seconds=0.05)
        sched.start()
        sched.request("rolling", Work(trigger="update", full=True))
        sched.request("rest", Work(trigger="update", full=True))
        await asyncio.sleep(0.4)
        sched.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    rolling = [t for u, t in passes if u == "rolling"]
    assert rolling[0] == "update" and rolling.count("rollout") >= 3  # one follow-up at a time, each soon
    assert [t for u, t in passes if u == "rest"] == ["update"]


def test_a_changed_rollout_action_annotation_asks_for_a_pass_and_other_metadata_does_not(monkeypatch):
    asked = []
    rt = runtime()
    monkeypatch.setattr(rt, "request", lambda uid, work: asked.append(work.trigger))

    def body(rv, annotations=None, generation=1):
        return {"metadata": {"uid": "u9", "name": "x", "namespace": "ns", "resourceVersion": str(rv),
                             "generation": generation, "annotations": annotations or {}}, "spec": {}}
    asyncio.run(handlers.track(event={"type": "ADDED"}, body=body(1), memo=memo(rt)))
    asyncio.run(handlers.track(event={"type": "MODIFIED"}, body=body(2, {"other": "x"}), memo=memo(rt)))
    asyncio.run(handlers.track(event={"type": "MODIFIED"},
                               body=body(3, {"v41flash.io/rollout-action": "pause/0123456789"}), memo=memo(rt)))
    assert asked == ["create", "update"]
