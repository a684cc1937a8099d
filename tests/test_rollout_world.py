"""One reconcile pass's rollout part (rollout/world.py), walked through a whole rollout with a settled fake
world: pods made from the applied workloads, status carried between passes as the controller does."""
from __future__ import annotations

import json

import copy
from pathlib import Path

import pytest
import yaml

from v41flash.api.v1alpha1 import ROLLOUT_ACTION_ANNOTATION, V41FlashDeployment
from v41flash.render import labels as L
from v41flash.render import render
from v41flash.render.revision import revision_of
from v41flash.rollout import machine as M
from v41flash.rollout.world import World, rollout_pass

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_790_000_000.0


def example(name="tp4-h200-low-latency", **rollout):
    doc = yaml.safe_load((ROOT / f"manifests/examples/{name}.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    doc["spec"]["rollout"] = {"stepSeconds": 10, "minRequestsPerStep": 5, "progressDeadlineSeconds": 120,
                              "drainDeadlineSeconds": 60, **rollout}
    return V41FlashDeployment.model_validate(doc)


def with_revision(obj, rev):
    doc = obj.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["model"]["revision"] = rev
    return V41FlashDeployment.model_validate(doc)


def settle(objects, ready=True, fail_revision=None):
    """Workloads with status, and their pods (Ready unless of fail_revision)."""
    workloads, pods = [], []
    for o in objects:
        if o["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        o = copy.deepcopy(o)
        n = o["spec"].get("replicas", 1)
        tmpl = o["spec"]["template"] if o["kind"] == "Deployment" else o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        labels = tmpl["metadata"]["labels"]
        ok = ready and (fail_revision is None or labels.get(L.REVISION_LABEL) != fail_revision)  # a picker's pods
        #                                                                 carry no revision label
        o["status"] = {"readyReplicas": n if ok else 0, "replicas": n}
        workloads.append(o)
        if labels.get(L.ROLE_LABEL) in ("prefill", "decode"):
            for i in range(n):
                pods.append({"metadata": {"name": f"{o['metadata']['name']}-{i}", "labels": dict(labels)},
                             "status": {"conditions": [{"type": "Ready", "status": "True" if ok else "False"}]}})
    return workloads, pods


class Loop:
    """The controller's part: apply, carry status, keep the ControllerRevisions it created."""

    def __init__(self, obj):
        self.obj, self.status, self.crs, self.objects, self.t = obj, {}, [], [], 0.0
        self.events = []
        self.replicas = None  # the planner's replicas for the serving slot

    def run(self, dt=1.0, figures=None, live=None, fail_revision=None, obj=None, retiring_live=None):
        self.t += dt
        self.obj = obj or self.obj
        workloads, pods = settle(self.objects, fail_revision=fail_revision)
        p = rollout_pass(self.obj, self.status, World(T0 + self.t, workloads, pods, self.crs, figures, live,
                                                                retiring_live_requests=retiring_live),
                         replicas=self.replicas)
        self.objects = p.objects
        self.crs += p.create
        self.status = {"servingRevision": p.serving_revision, **({"rollout": p.rollout_status} if p.rollout_status
                                                                 else {})}
        self.events += [e.reason for e in p.events]
        return p


def names(objs, kind=None):
    return sorted(o["metadata"]["name"] for o in objs if kind is None or o["kind"] == kind)


GOOD = M.Figures(requests=20, ttft_seconds=0.3, e2e_p95_seconds=4.0, error_ratio=0.0)


def test_never_rolled_out_keeps_renders_output_and_records_the_spec():
    obj = example()
    loop = Loop(obj)
    p = loop.run()
    assert p.objects == render(obj) and p.rollout_status is None
    assert [cr["metadata"]["name"] for cr in p.create] == [f"{obj.metadata['name']}-{revision_of(render(obj))}"]
    assert loop.run().create == []  # recorded once


def test_a_whole_canary_rollout():
    old = example()
    name = old.metadata["name"]
    rev_old, new = revision_of(render(old)), with_revision(old, "r2")
    rev_new = revision_of(render(new))
    loop = Loop(old)
    loop.run()
    loop.run()
    serving_engines = {n: o for o in loop.objects for n in [o["metadata"]["name"]]
                       if o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode") and o["kind"] == "Deployment"}
    p = loop.run(obj=new)
    assert p.rollout_status["phase"] == M.STARTING and p.rollout_status["candidateSlot"] == "a"
    got = {o["metadata"]["name"]: o for o in p.objects}
    assert all(got[n] == o for n, o in serving_engines.items())  # no serving engine restarts
    assert {f"{name}-prefill-a", f"{name}-decode-a", f"{name}-router-a", f"{name}-router-0"} <= set(got)
    assert p.serving_revision == rev_old
    assert [cr["metadata"]["labels"][L.REVISION_LABEL] for cr in p.create] == [rev_new]
    p = loop.run()  # the candidate's pods are Ready now
    assert p.rollout_status["phase"] == M.CANARY and p.rollout_status["share"] == 5
    shares = []
    for _ in range(4):
        p = loop.run(dt=11, figures=GOOD)
        shares.append(p.rollout_status.get("share"))
    assert shares == [25, 50, 100, 100] and p.rollout_status["phase"] == M.DRAINING
    assert p.serving_revision == rev_new
    p = loop.run(live=2)
    assert p.rollout_status["phase"] == M.DRAINING and f"{name}-prefill" in names(p.objects, "Deployment")
    p = loop.run(live=0)
    assert p.rollout_status["phase"] == M.COMPLETE and p.rollout_status["servingSlot"] == "a"
    left = names(p.objects, "Deployment") + names(p.objects, "Service")
    assert f"{name}-prefill" not in names(p.objects, "Deployment") and f"{name}-router-0" not in left
    assert {f"{name}-prefill-a", f"{name}-decode-a", f"{name}-router-a", f"{name}-router"} <= set(left)
    assert loop.events.count("StepPassed") == 4 and "Promoted" in loop.events and "RolloutComplete" in loop.events
    # steady after the rollout: the next pass changes nothing
    before = p.objects
    assert loop.run().objects == before


def test_the_candidate_grows_with_its_share_and_is_at_the_serving_size_before_promotion():
    old = example(steps=[50, 100], maxSurgeGPUs=64)
    name = old.metadata["name"]
    loop = Loop(old)
    loop.replicas = {"prefill": 2, "decode": 1}  # the planner sizes the serving slot
    loop.run()
    loop.run()
    size = lambda p, role, slot="a": next(o["spec"]["replicas"] for o in p.objects  # noqa: E731
                                          if o["metadata"]["name"] == f"{name}-{role}-{slot}")
    routes = lambda p: {r["revision"]: r["share"] for r in json.loads(next(  # noqa: E731
        o for o in p.objects if o["kind"] == "ConfigMap")["data"]["routes.json"])["revisions"]}
    p = loop.run(obj=with_revision(old, "r2"))
    rev_new = p.rollout_status["candidateRevision"]
    assert p.rollout_status["phase"] == M.STARTING and (size(p, "prefill"), size(p, "decode")) == (1, 1)
    assert p.rollout_status["candidateReplicas"] == {"prefill": 1, "decode": 1}
    p = loop.run()
    assert (p.rollout_status["phase"], p.rollout_status["share"]) == (M.CANARY, 50)  # ceil(2 x 50%) = 1 prefill
    p = loop.run(dt=11, figures=GOOD)  # step 1 passes; 100 % needs 2 prefill: grown first, at 50 %
    assert (p.rollout_status["phase"], p.rollout_status["step"], p.rollout_status["share"]) == (M.STARTING, 1, 50)
    assert (size(p, "prefill"), size(p, "decode")) == (2, 1) and routes(p)[rev_new] == 50
    assert "candidate prefill 2/2, decode 1/1 replicas" in p.decision.reconciling
    assert "CandidateGrowing" in loop.events
    p = loop.run()  # grown and Ready
    assert (p.rollout_status["phase"], p.rollout_status["share"]) == (M.CANARY, 100)
    p = loop.run(dt=11, figures=GOOD)
    assert p.rollout_status["phase"] == M.DRAINING and p.serving_revision == rev_new
    assert (size(p, "prefill"), size(p, "decode")) == (2, 1)  # promotion resized nothing


def test_a_candidate_that_never_becomes_ready_is_rolled_back_and_the_serving_slot_untouched():
    old = example()
    name = old.metadata["name"]
    new = with_revision(old, "broken")
    rev_new = revision_of(render(new))
    loop = Loop(old)
    loop.run()
    before = {o["metadata"]["name"]: o for o in loop.objects if o["kind"] == "Deployment"
              and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")}
    loop.run(obj=new)
    for _ in range(3):
        p = loop.run(dt=60, fail_revision=rev_new)
    assert p.rollout_status["phase"] == M.ROLLED_BACK and p.rollout_status["reason"] == "CandidateNotReady"
    assert p.decision.stalled[0] == "CandidateNotReady"
    got = {o["metadata"]["name"]: o for o in p.objects}
    assert all(got[n] == o for n, o in before.items())
    # out of the routing table at once; its slot kept while its requests in flight are not known to be done
    assert p.rollout_status["retiringSlot"] == "a" and f"{name}-prefill-a" in got
    table = json.loads(got[f"{name}-config"]["data"]["routes.json"])["revisions"]
    assert [r["revision"] for r in table] == [revision_of(render(old))]
    p = loop.run(dt=5, fail_revision=rev_new, retiring_live=2)  # still busy: kept
    assert f"{name}-prefill-a" in {o["metadata"]["name"] for o in p.objects}
    p = loop.run(dt=5, fail_revision=rev_new, retiring_live=0)  # done: deleted
    got = {o["metadata"]["name"]: o for o in p.objects}
    assert f"{name}-prefill-a" not in got and "retiringSlot" not in p.rollout_status
    assert all(got[n] == o for n, o in before.items())


def test_a_rolled_back_candidate_still_busy_is_deleted_at_the_drain_deadline():
    old = example()
    name = old.metadata["name"]
    new = with_revision(old, "broken")
    rev_new = revision_of(render(new))
    loop = Loop(old)
    loop.run()
    loop.run(obj=new)
    for _ in range(3):
        p = loop.run(dt=60, fail_revision=rev_new, retiring_live=3)
    assert p.rollout_status["phase"] == M.ROLLED_BACK and f"{name}-prefill-a" in {o["metadata"]["name"] for o in p.objects}
    p = loop.run(dt=M.Policy().drain_deadline_seconds, fail_revision=rev_new, retiring_live=3)
    assert f"{name}-prefill-a" not in {o["metadata"]["name"] for o in p.objects}


def test_annotation_actions_and_bad_annotations():
    old = example()
    new = with_revision(old, "r2")
    rev_new = revision_of(render(new))
    loop = Loop(old)
    loop.run()
    loop.run(obj=new)
    loop.run()
    doc = new.model_dump(by_alias=True, exclude_none=True)
    doc["metadata"]["annotations"] = {ROLLOUT_ACTION_ANNOTATION: f"pause/{rev_new}"}
    paused = V41FlashDeployment.model_validate(doc)
    p = loop.run(dt=30, figures=GOOD, obj=paused)
    assert p.rollout_status["phase"] == M.PAUSED
    doc["metadata"]["annotations"] = {ROLLOUT_ACTION_ANNOTATION: "stop/now"}
    p = loop.run(obj=V41FlashDeployment.model_validate(doc))
    assert "RolloutActionIgnored" in [e.reason for e in p.events]


def test_the_serving_spec_must_be_recorded():
    old = example()
    with pytest.raises(ValueError, match="ControllerRevision"):
        rollout_pass(with_revision(old, "r2"), {"servingRevision": revision_of(render(old))}, World(T0))


@pytest.mark.parametrize("example_name", ["gb300-pd-dep4-dep16", "aggregated-h200", "dep2-b200-high-throughput"])
def test_every_example_rolls_out_to_the_other_slot(example_name):
    old = example(example_name)
    name = old.metadata["name"]
    new = with_revision(old, "r2")
    loop = Loop(old)
    loop.run()
    loop.run(obj=new)
    p = loop.run()
    assert p.rollout_status["phase"] == M.CANARY
    for _ in range(4):
        p = loop.run(dt=11, figures=GOOD)
    p = loop.run(live=0)
    assert p.rollout_status["phase"] == M.COMPLETE
    engines = [o for o in p.objects if o["kind"] in ("Deployment", "LeaderWorkerSet")
               and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")]
    assert engines and all(o["metadata"]["name"].endswith("-a") for o in engines)
    assert {o["metadata"]["labels"][L.REVISION_LABEL] for o in engines} == {revision_of(render(new))}
    assert sorted(o["kind"] for o in engines) == sorted(o["kind"] for o in render(new) if o["kind"] in (
        "Deployment", "LeaderWorkerSet") and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode"))
    assert f"{name}-router-a" in names(p.objects, "Deployment")


def test_no_candidate_pod_while_the_never_rolled_router_still_runs():
    """The old layout's router discovers engines of every revision: the candidate is created at 0 replicas until
    the front has replaced that router, so no request can be paired across revisions in between."""
    old = example()
    name = old.metadata["name"]
    new = with_revision(old, "r2")
    loop = Loop(old)
    loop.run()
    workloads, pods = settle(loop.objects)
    legacy_router = {"metadata": {"name": f"{name}-router-x", "labels": L.common_labels(name, L.ROUTER)}}
    p = rollout_pass(new, loop.status, World(T0 + 5, workloads, pods + [legacy_router], loop.crs))
    got = {o["metadata"]["name"]: o for o in p.objects}
    assert got[f"{name}-prefill-a"]["spec"]["replicas"] == 0 and got[f"{name}-decode-a"]["spec"]["replicas"] == 0
    assert got[f"{name}-prefill"]["spec"]["replicas"] == 1  # the serving slot keeps its size
    p = rollout_pass(new, {"servingRevision": p.serving_revision, "rollout": p.rollout_status},
                     World(T0 + 6, workloads, pods, loop.crs + p.create))
    assert {o["metadata"]["name"]: o for o in p.objects}[f"{name}-prefill-a"]["spec"]["replicas"] == 1


def test_recreate_does_not_wait_for_the_old_router():
    old = example(strategy="Recreate")
    name = old.metadata["name"]
    loop = Loop(old)
    loop.run()
    workloads, pods = settle(loop.objects)
    legacy_router = {"metadata": {"name": f"{name}-router-x", "labels": L.common_labels(name, L.ROUTER)}}
    p = rollout_pass(with_revision(old, "r2"), loop.status, World(T0 + 5, workloads, pods + [legacy_router], loop.crs))
    got = {o["metadata"]["name"]: o for o in p.objects}
    assert p.rollout_status["phase"] == M.RECREATING and f"{name}-prefill" not in {
        o["metadata"]["name"] for o in p.objects if o["kind"] == "Deployment"}
    assert got[f"{name}-prefill-a"]["spec"]["replicas"] == 1


def with_mode(obj, mode, strategy=None):
    doc = obj.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["routing"] = {"mode": mode, **({"gateway": {}} if mode == "Gateway" else {})}
    if strategy:
        doc["spec"]["rollout"]["strategy"] = strategy
    return V41FlashDeployment.model_validate(doc)


@pytest.mark.parametrize("start, to", [("VllmRouter", "Gateway"), ("Gateway", "VllmRouter")])
def test_a_routing_mode_change_is_no_canary_and_recreate_carries_it(start, to):
    """A canary from one front door to another would prune the serving one (the router's Service, or the pools
    behind the Gateway) while the old revision still serves, and a split between two doors means nothing: the
    pass refuses it naming the field, whatever the CRD let through; with Recreate it goes."""
    old = with_mode(example("tp4-h200-pd-gateway"), start)
    loop = Loop(old)
    loop.run()
    loop.run()
    serving = loop.status["servingRevision"]
    with pytest.raises(ValueError, match=rf"spec.routing.mode: {start} serves, the spec asks for {to}: .*Recreate"):
        loop.run(obj=with_mode(old, to))
    assert loop.status["servingRevision"] == serving  # nothing moved
    p = loop.run(obj=with_mode(old, to, strategy="Recreate"))
    assert p.rollout_status["phase"] == M.RECREATING
    front = {o["kind"] for o in p.objects if o["metadata"]["labels"].get(L.ROLE_LABEL) in (L.ROUTER, "epp")} | \
        {o["kind"] for o in p.objects if o["kind"] in ("InferencePool", "HTTPRoute")}
    assert ("InferencePool" in front) == (to == "Gateway")
    # the same mode with another engine change stays a canary
    p = Loop(old)
    p.run()
    p.run()
    assert p.run(obj=with_revision(old, "r2")).rollout_status["phase"] == M.STARTING


def test_without_the_operators_route_a_gateway_rollout_is_blue_green_on_the_front_pool():
    """Mode Gateway, the user's own HTTPRoute on the front pool, steps [100] (the CRD's condition for it): the
    front pool and its picker Service follow the candidate for the judged step, back to the serving revision
    when it fails, and stay on it once promoted."""
    doc = yaml.safe_load((ROOT / "manifests/examples/tp4-h200-pd-gateway.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    doc["spec"]["routing"]["gateway"].pop("httpRoute")
    doc["spec"]["rollout"] = {"steps": [100], "stepSeconds": 10, "minRequestsPerStep": 5,
                              "progressDeadlineSeconds": 120, "drainDeadlineSeconds": 60}
    old = V41FlashDeployment.model_validate(doc)
    name = old.metadata["name"]

    def front(p):
        pool = next(o for o in p.objects if o["kind"] == "InferencePool" and o["metadata"]["name"] == f"{name}-pool")
        svc = next(o for o in p.objects if o["kind"] == "Service" and o["metadata"]["name"] == f"{name}-epp")
        assert not [o for o in p.objects if o["kind"] == "HTTPRoute"]
        return pool["spec"]["selector"]["matchLabels"].get(L.REVISION_LABEL), svc["spec"]["selector"].get(L.SLOT_LABEL)

    for fails in (True, False):
        loop = Loop(old)
        loop.run()
        loop.run()
        rev_old = loop.status["servingRevision"]
        new = with_revision(old, "r2" if fails else "r3")
        rev_new = revision_of(render(new))
        p = loop.run(obj=new)
        assert p.rollout_status["phase"] == M.STARTING and front(p)[0] in ("", rev_old)  # nothing moved yet
        p = loop.run()  # the candidate's pods and picker Ready
        assert p.rollout_status["phase"] == M.CANARY and p.rollout_status["share"] == 100, p.rollout_status
        assert front(p) == (rev_new, p.rollout_status["candidateSlot"])  # the judged step has the traffic
        bad = M.Figures(requests=20, ttft_seconds=30.0, e2e_p95_seconds=4.0, error_ratio=0.0)
        p = loop.run(dt=11, figures=bad if fails else GOOD)
        if fails:
            assert p.rollout_status["phase"] == M.ROLLED_BACK and p.serving_revision == rev_old
            assert front(p)[0] in ("", rev_old) and front(p)[1] != "a"
        else:
            assert p.rollout_status["phase"] == M.DRAINING and p.serving_revision == rev_new
            assert front(p) == (rev_new, "a")
