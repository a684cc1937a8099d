"""reconcile() running whole rollouts against the in-memory apiserver (tests/fake_kube.py): the controller
calls rollout_pass once a revision served and the spec renders another one, creates and prunes the
ControllerRevisions, writes servingRevision / status.rollout / status.revisions and the kstatus conditions
from the decision, posts its Events; the step's figures come from rollout/progress.StepFigures."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

import process_memory
from fake_kube import FakeKube, api_error
from process_memory import reconcile
from v41flash.controller import reconcile as rec
from v41flash.controller import config as operator_config
from v41flash.controller import revisions
from v41flash.api import v1alpha1 as api
from v41flash.controller.autoscale import PlannerOutcome
from v41flash.controller.desired import owner_reference
from v41flash.render import SlotSpec, render
from v41flash.render import gateway
from v41flash.render import labels as L
from v41flash.rollout import machine as M
from v41flash.rollout import progress
from v41flash.render.slots import slot_workload_name
from v41flash.roles import FIRST_SLOT

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_796_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Events(list):
    def __call__(self, type_: str, reason: str, message: str) -> None:
        self.append((type_, reason, message))


def example(name: str = "tp4-h200-low-latency") -> dict:
    return yaml.safe_load((ROOT / "manifests/examples" / f"{name}.yaml").read_text())


def cond(status: dict, type_: str) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


@pytest.fixture
def world(monkeypatch, memory):
    clock = Clock()
    monkeypatch.setattr(rec.time, "time", clock)
    figures = {"view": progress.StepView(M.Figures(requests=40, ttft_seconds=0.5, e2e_p95_seconds=5.0,
                                                   error_ratio=0.0), serving_requests=100, old_live_requests=0)}
    seen = []

    def observe(uid, state, pods, now, pct, scraper=None):
        seen.append(state.phase)
        return figures["view"]
    monkeypatch.setattr(memory.step_figures, "observe", observe)
    return clock, figures, seen


def converged(doc: dict) -> tuple[FakeKube, str]:
    kube = FakeKube()
    name = kube.add_cr(doc)["metadata"]["name"]
    reconcile(kube, kube.cr(name), Events())
    kube.settle()
    reconcile(kube, kube.cr(name), Events())
    assert cond(kube.cr(name)["status"], "Ready")["status"] == "True"
    return kube, name


def step(kube: FakeKube, name: str, clock: Clock, seconds: float = 0.0, settle: bool = True):
    clock.t += seconds
    events = Events()
    out = reconcile(kube, kube.cr(name), events)
    if settle:
        kube.settle()
    return out, events


def records(kube: FakeKube) -> set[str]:
    return {o["metadata"]["labels"][L.REVISION_LABEL] for (_, k, _, _), o in kube.objects.items()
            if k == "ControllerRevision"}


def engine_names(kube: FakeKube) -> set[str]:
    return {n for (_, k, _, n), o in kube.objects.items() if k in ("Deployment", "LeaderWorkerSet")
            and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")}


def engine_change(kube: FakeKube, name: str, max_num_seqs: int = 48) -> None:
    """A spec change that renders another engine revision (decode's --max-num-seqs): a rollout."""
    spec = kube.cr(name)["spec"]
    spec["decode"]["maxNumSeqs"] = max_num_seqs
    kube.update_spec(name, spec)


def short(doc: dict, **rollout) -> dict:
    doc["spec"]["rollout"] = {"steps": [50, 100], "stepSeconds": 10, "minRequestsPerStep": 5, **rollout}
    return doc


def children(kube: FakeKube) -> set[tuple[str, str]]:
    """(kind, name) of every object the deployment owns but its ControllerRevisions."""
    return {(k, n) for (_, k, _, n), o in kube.objects.items() if k != "ControllerRevision"}


def test_the_serving_spec_is_recorded_once_and_an_slo_edit_starts_no_rollout(world):
    kube, name = converged(example())
    serving = kube.cr(name)["status"]["servingRevision"]
    assert records(kube) == {serving}
    creates = [c for c in kube.calls if c[0] == "create"]
    reconcile(kube, kube.cr(name), Events())
    assert [c for c in kube.calls if c[0] == "create"] == creates  # cached: not created again
    spec = kube.cr(name)["spec"]
    spec["slo"]["e2eP95Seconds"] = 120
    kube.update_spec(name, spec)
    out = reconcile(kube, kube.cr(name), Events())
    assert "rollout" not in out.status and out.status["servingRevision"] == serving
    assert not [c for c in kube.calls if c[0] == "list_controller_revisions"]


def test_an_engine_change_canaries_step_by_step_promotes_drains_and_keeps_the_previous_record(world):
    clock, figures, seen = world
    kube, name = converged(short(example()))
    old = kube.cr(name)["status"]["servingRevision"]
    before = {n: kube.get("Deployment", n)["spec"] for n in engine_names(kube)}
    engine_change(kube, name)
    phases, all_events = [], []
    for _ in range(30):
        out, events = step(kube, name, clock, 6)
        all_events += events
        st = out.status
        phases.append((st.get("rollout") or {}).get("phase"))
        if (st.get("rollout") or {}).get("phase") == M.COMPLETE:
            break
        if (st.get("rollout") or {}).get("candidateSlot") and phases[-1] != M.DRAINING:
            # the serving engines are never touched before the promotion
            assert {n: kube.get("Deployment", n)["spec"] for n in before} == before
            assert st["servingRevision"] == old
            assert cond(st, "Ready")["status"] == "False" and cond(st, "Reconciling")["status"] == "True"
    st = kube.cr(name)["status"]
    new = st["rollout"]["candidateRevision"] if "candidateRevision" in st["rollout"] else st["servingRevision"]
    assert st["rollout"]["phase"] == M.COMPLETE and st["servingRevision"] != old, phases
    assert M.CANARY in phases and M.DRAINING in phases
    assert engine_names(kube) == {f"{name}-prefill-a", f"{name}-decode-a"}  # the old slot pruned
    assert records(kube) == {st["servingRevision"], old}  # the live one and the previous one
    assert cond(st, "Ready")["status"] == "True" and cond(st, "Reconciling") is None
    reasons = [r for _, r, _ in all_events]
    assert {"RolloutStarted", "StepPassed", "Promoted"} <= set(reasons), reasons
    canary = [m for _, r, m in all_events if r == "StepPassed"]
    assert canary and new
    assert M.CANARY in seen  # the figures were asked for during the canary


def test_a_candidate_too_slow_is_rolled_back_at_the_gate_with_figure_and_target_and_stalled(world):
    clock, figures, _ = world
    kube, name = converged(short(example()))
    old = kube.cr(name)["status"]["servingRevision"]
    figures["view"] = progress.StepView(M.Figures(requests=40, ttft_seconds=9.0, e2e_p95_seconds=5.0,
                                                  error_ratio=0.0), serving_requests=100)
    engine_change(kube, name)
    events = Events()
    for _ in range(20):
        out, ev = step(kube, name, clock, 6)
        events += ev
        if (out.status.get("rollout") or {}).get("phase") == M.ROLLED_BACK:
            break
    st = kube.cr(name)["status"]
    assert st["rollout"]["phase"] == M.ROLLED_BACK and st["servingRevision"] == old
    stalled = cond(st, "Stalled")
    assert stalled["status"] == "True" and "TTFT" in stalled["message"] and "9.00s" in stalled["message"] \
        and "2.00s" in stalled["message"], stalled
    assert cond(st, "Ready")["status"] == "False"
    assert ("Warning", "RolledBack") in [e[:2] for e in events]
    # out of the routing table at once, kept while its requests in flight may not be done, then deleted
    assert st["rollout"]["retiringSlot"] == "a" and progress.active(st)
    routes = json.loads(kube.get("ConfigMap", f"{name}-config")["data"]["routes.json"])["revisions"]
    assert [r["revision"] for r in routes] == [old]
    assert engine_names(kube) == {f"{name}-prefill", f"{name}-decode", f"{name}-prefill-a", f"{name}-decode-a"}
    figures["view"] = progress.StepView(retiring_live_requests=0)
    step(kube, name, clock, 5)
    assert engine_names(kube) == {f"{name}-prefill", f"{name}-decode"}  # the candidate slot is gone
    st = kube.cr(name)["status"]
    assert "retiringSlot" not in st["rollout"] and not progress.active(st)
    assert cond(st, "Stalled")["status"] == "True"


def test_a_rollout_without_the_serving_record_stalls_naming_it(world):
    kube, name = converged(example())
    for key in [k for k in kube.objects if k[1] == "ControllerRevision"]:
        del kube.objects[key]
    process_memory.MEMORY.of(kube.cr(name)["metadata"]["uid"]).recorded.clear()
    engine_change(kube, name)
    before = set(kube.objects)
    out = reconcile(kube, kube.cr(name), Events())
    assert out.stall is not None and out.stall.reason == "RolloutBlocked"
    assert "ControllerRevision" in out.stall.message and set(kube.objects) == before


def test_records_to_delete_keeps_the_live_and_the_newest_other():
    def cr(rev, n):
        return {"metadata": {"name": f"x-{rev}", "labels": {L.REVISION_LABEL: rev}}, "revision": n}
    assert progress.records_to_delete([cr("a", 1), cr("b", 2), cr("c", 3), cr("d", 4)], {"d"}) == ["x-a", "x-b"]
    assert progress.records_to_delete([cr("a", 1)], {"a"}) == []


def _until(kube, name, clock, phase: str, n: int = 20, seconds: float = 6):
    for _ in range(n):
        out, _ = step(kube, name, clock, seconds)
        if (out.status.get("rollout") or {}).get("phase") == phase:
            return out
    raise AssertionError(f"never reached {phase}: {kube.cr(name)['status'].get('rollout')}")


def test_a_kubectl_pause_annotation_holds_the_step_and_resume_goes_on(world):
    clock, _, _ = world
    kube, name = converged(short(example()))
    engine_change(kube, name)
    out = _until(kube, name, clock, M.CANARY)
    cand = out.status["rollout"]["candidateRevision"]
    kube.crs[("ns", name)]["metadata"]["annotations"] = {"v41flash.io/rollout-action": f"pause/{cand}"}
    out = _until(kube, name, clock, M.PAUSED, n=3)
    step_at = out.status["rollout"]["step"]
    for _ in range(4):  # held well past stepSeconds
        out, _ = step(kube, name, clock, 6)
        assert out.status["rollout"]["phase"] == M.PAUSED and out.status["rollout"]["step"] == step_at
    kube.crs[("ns", name)]["metadata"]["annotations"] = {"v41flash.io/rollout-action": f"resume/{cand}"}
    _until(kube, name, clock, M.COMPLETE)


def test_an_operator_restart_mid_rollout_resumes_from_status_in_the_same_slot(world):
    clock, _, _ = world
    kube, name = converged(short(example()))
    engine_change(kube, name)
    out = _until(kube, name, clock, M.CANARY)
    before = {k: v for k, v in out.status["rollout"].items() if k in ("candidateRevision", "candidateSlot", "since")}
    names = set(kube.objects)
    meta = kube.cr(name)["metadata"]
    process_memory.MEMORY.forget(meta["uid"], meta["namespace"], name)  # a new process: nothing in memory
    out, _ = step(kube, name, clock, 1)
    assert {k: out.status["rollout"][k] for k in before} == before
    assert set(kube.objects) == names  # no duplicate revision, no third slot, no orphan
    _until(kube, name, clock, M.COMPLETE)
    assert engine_names(kube) == {f"{name}-prefill-a", f"{name}-decode-a"}


def test_the_spec_back_at_the_serving_revision_aborts_the_candidate_and_never_touches_serving(world):
    clock, _, _ = world
    kube, name = converged(short(example()))
    serving = {n: kube.get("Deployment", n)["spec"] for n in engine_names(kube)}
    original = kube.cr(name)["spec"]
    engine_change(kube, name)
    _until(kube, name, clock, M.CANARY)
    kube.update_spec(name, original)
    for _ in range(4):
        out, _ = step(kube, name, clock, 6)
    assert engine_names(kube) == set(serving) and {n: kube.get("Deployment", n)["spec"] for n in serving} == serving
    assert out.status["servingRevision"] == kube.cr(name)["status"]["servingRevision"]
    assert cond(out.status, "Ready")["status"] == "True", out.status.get("rollout")


def test_a_record_the_operator_may_not_create_is_said_once_and_serving_goes_on(world, caplog):
    kube = FakeKube(refuse={"ControllerRevision": api_error(403, "Forbidden", "controllerrevisions is forbidden")})
    name = kube.add_cr(example())["metadata"]["name"]
    out = reconcile(kube, kube.cr(name), Events())
    assert out.stall is None and out.applied  # the children applied all the same
    reconcile(kube, kube.cr(name), Events())
    assert len([c for c in kube.calls if c[0] == "create"]) == 1  # tried once, said once
    assert "cannot record revision" in caplog.text


def test_a_retiring_candidate_is_idle_only_from_a_scrape_after_it_left_the_table():
    from v41flash.metrics.parse import parse_metrics
    from v41flash.metrics.window import PodSnapshot
    figs = progress.StepFigures()
    pod = {"metadata": {"name": "x-prefill-a-1", "labels": {L.ROLE_LABEL: "prefill", L.SERVING_LABEL: "true",
                                                             L.SLOT_LABEL: "a", L.REVISION_LABEL: "c" * 10}},
           "status": {"conditions": [{"type": "Ready", "status": "True"}], "podIP": "127.0.0.1"}}
    state = M.State(phase=M.ROLLED_BACK, candidate_revision="c" * 10, retiring_slot="a", ended_at=T0)
    gauge = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} %d\n'
    pages = iter([(T0 + 1, gauge % 0), (T0 + 4, gauge % 1), (T0 + 9, gauge % 0)])

    def scraper(targets):
        assert [t.pod for t in targets] == ["x-prefill-a-1"]
        t, text = next(pages)
        return [PodSnapshot("x-prefill-a-1", "prefill", t, parse_metrics(text))]
    seen = [figs.observe("u", state, [pod], T0 + 1, 0.9, scraper).retiring_live_requests for _ in range(3)]
    assert seen == [None, 1, 0]  # idle at 1 s counts for nothing: the table may not have been re-read yet
    assert figs.observe("u", state, [], T0 + 10, 0.9, lambda t: []).retiring_live_requests == 0  # no pod left


def test_a_retiring_candidate_that_never_became_ready_is_idle_at_once():
    figs = progress.StepFigures()
    pod = {"metadata": {"name": "x-prefill-a-1", "labels": {L.ROLE_LABEL: "prefill", L.SERVING_LABEL: "true",
                                                             L.SLOT_LABEL: "a", L.REVISION_LABEL: "c" * 10}},
           "status": {"conditions": [{"type": "Ready", "status": "False"}], "podIP": "127.0.0.1"}}
    state = M.State(phase=M.ROLLED_BACK, candidate_revision="c" * 10, retiring_slot="a", ended_at=T0)
    assert figs.observe("u", state, [pod], T0 + 1, 0.9, lambda t: []).retiring_live_requests == 0
    pod["status"]["conditions"][0]["status"] = "True"  # Ready but not scraped yet: unknown
    assert figs.observe("u", state, [pod], T0 + 1, 0.9, lambda t: []).retiring_live_requests is None


def test_no_record_is_attempted_again_nor_warned_about_in_a_namespace_being_deleted(world, caplog):
    exc = api_error(403, "Forbidden", "unable to create new content in namespace ns because it is being terminated")
    exc.body = ('{"kind": "Status", "reason": "Forbidden", "message": "unable to create new content in namespace ns '
                'because it is being terminated", "details": {"causes": [{"reason": "NamespaceTerminating"}]}}')
    kube = FakeKube(refuse={"ControllerRevision": exc})
    name = kube.add_cr(example())["metadata"]["name"]
    from v41flash.controller.kube import namespace_terminating
    assert namespace_terminating(exc)
    mem = process_memory.MEMORY.of(kube.cr(name)["metadata"]["uid"])
    revisions.record(kube, mem, kube.cr(name), rec.api.V41FlashDeployment.model_validate(
        {**kube.cr(name), "apiVersion": rec.api.API_VERSION, "kind": rec.api.KIND}), "0123456789")
    assert "cannot record" not in caplog.text


def test_the_controller_sizes_the_candidate_from_the_serving_slots_replicas(world):
    clock, figures, seen = world
    doc = short(example(), maxSurgeGPUs=12)
    doc["spec"]["prefill"].update(minReplicas=2, maxReplicas=2)
    doc["spec"]["decode"].update(minReplicas=1, maxReplicas=1)
    kube, name = converged(doc)
    spec = kube.cr(name)["spec"]
    spec["model"]["revision"] = "r2"
    kube.update_spec(name, spec)
    rows, reasons, messages = [], [], []
    for _ in range(30):
        out, events = step(kube, name, clock, 6)
        reasons += [r for _, r, _ in events]
        r = out.status.get("rollout") or {}
        try:
            size = kube.get("Deployment", f"{name}-prefill-a")["spec"]["replicas"]
        except Exception:  # noqa: BLE001 - not created yet
            size = None
        rows.append((r.get("phase"), r.get("share", 0), size))
        messages.append((cond(out.status, "Reconciling") or {}).get("message", ""))
        if r.get("phase") == M.COMPLETE:
            break
    assert rows[-1] == (M.COMPLETE, 0, 2), rows
    assert (M.STARTING, 0, 1) in rows and (M.CANARY, 50, 1) in rows and (M.STARTING, 50, 2) in rows, rows
    first_full = next(i for i, row in enumerate(rows) if row[1] == 100)
    assert rows[first_full][2] == 2 and all(row[2] == 2 for row in rows[first_full:]), rows
    assert "CandidateGrowing" in reasons and any("candidate prefill 2/2, decode 1/1 replicas" in m for m in messages)


@pytest.mark.parametrize("example_name", sorted(p.stem for p in (ROOT / "manifests/examples").glob("*.yaml")))
def test_at_rest_after_a_rollout_an_observe_pass_lists_and_applies_nothing_and_agrees_with_a_full_pass(
        world, example_name):
    """After a rollout, status.rollout stays (Complete) and the engines live under a slot's names: an observe
    pass renders them from spec and status (rollout/world.rest_pass) instead of a full rollout pass's lists
    and applies of every child, each tick, for good."""
    from v41flash.controller.kube import ChildRef
    clock, _, _ = world
    kube, name = converged(short(example(example_name)))
    spec = kube.cr(name)["spec"]
    spec["model"]["revision"] = "next"
    kube.update_spec(name, spec)
    for _ in range(30):
        out, _ = step(kube, name, clock, 6)
        if (out.status.get("rollout") or {}).get("phase") == M.COMPLETE:
            break
    full, _ = step(kube, name, clock, 6)  # a full pass at rest: what the observe pass must agree with
    assert full.status["rollout"]["phase"] == M.COMPLETE and not full.status_written
    cache = {ChildRef.of(o): o for (_, k, _, _), o in kube.objects.items() if k in ("Deployment", "LeaderWorkerSet")}
    kube.calls.clear()
    seen = Events()
    body = kube.cr(name)
    observed = reconcile(kube, body, seen, how=rec.Pass(apply=False, workloads=lambda ns, uid: cache))
    assert [c for c in kube.calls if c[0] != "has_kind"] == [], kube.calls  # no list, no read, no apply
    assert not observed.status_written and observed.status == body["status"] and seen == []
    assert observed.desired == full.desired  # the same objects, under the serving slot's names
    # a replica lost between full passes shows in the role's status at once
    dep = next(o for r, o in cache.items() if r.name == f"{name}-decode-a")  # a Deployment or an LWS
    dep["status"] = {**dep.get("status", {}), "readyReplicas": 0}
    lost = reconcile(kube, kube.cr(name), Events(), how=rec.Pass(apply=False, workloads=lambda ns, uid: cache))
    assert lost.status_written and lost.status["decode"]["readyReplicas"] == 0, lost.status["decode"]
    assert cond(lost.status, "Ready")["status"] == "False"
    # the spec moving on is not "at rest": the full rollout pass takes it
    assert not progress.at_rest(body["status"], "0123456789") and progress.at_rest(body["status"],
                                                                                  body["status"]["servingRevision"])


def test_a_stalled_spec_after_a_rollout_keeps_the_serving_slot_and_the_next_change_canaries_beside_it(world):
    """After a rollout promoted slot a, a spec the operator cannot realize stalls: status must still say which slot
    serves (status.rollout) and count that slot's replicas, or the next good spec starts a rollout as if slot ""
    served: it would rebuild the pruned slot from the old record and put the candidate over the serving slot."""
    clock, figures, seen = world
    kube, name = converged(short(example()))
    engine_change(kube, name)
    _until(kube, name, clock, M.COMPLETE)
    st = kube.cr(name)["status"]
    serving, serving_rollout = st["servingRevision"], st["rollout"]
    assert serving_rollout["servingSlot"] == "a"
    serving_objects = {n: kube.get("Deployment", n)["spec"] for n in engine_names(kube)}
    assert set(serving_objects) == {f"{name}-prefill-a", f"{name}-decode-a"}

    bad = kube.cr(name)["spec"]
    bad["decode"]["extraArgs"] = ["--max-num-sequences", "8"]
    kube.update_spec(name, bad)
    out, _ = step(kube, name, clock, 6)
    st = kube.cr(name)["status"]
    assert cond(st, "Stalled")["reason"] == "InvalidSpec"
    assert st["rollout"] == serving_rollout and st["servingRevision"] == serving
    assert st["decode"]["readyReplicas"] == 1 and st["prefill"]["readyReplicas"] == 1, st  # slot a's, not slot ""'s
    assert {n: kube.get("Deployment", n)["spec"] for n in engine_names(kube)} == serving_objects

    good = kube.cr(name)["spec"]
    del good["decode"]["extraArgs"]
    good["prefill"] = {"enabled": False}
    kube.update_spec(name, good)
    out, _ = step(kube, name, clock, 6)
    st = kube.cr(name)["status"]
    assert st["rollout"]["servingSlot"] == "a" and st["rollout"]["candidateSlot"] not in ("a", FIRST_SLOT)
    # the serving slot is untouched by the candidate's start
    assert {n: kube.get("Deployment", n)["spec"] for n in serving_objects} == serving_objects


def test_a_stalled_spec_mid_canary_keeps_the_rollout_and_the_candidate_goes_on_once_the_spec_is_back(world):
    """A spec the operator cannot realize in the middle of a canary: status keeps the rollout (step, slots), the
    serving and candidate workloads stay as they are, and the candidate's spec re-applied goes on from that step
    (not a new rollout that replaces the candidate)."""
    clock, figures, seen = world
    kube, name = converged(short(example()))
    engine_change(kube, name)
    _until(kube, name, clock, M.CANARY)
    canary, revisions = kube.cr(name)["status"]["rollout"], kube.cr(name)["status"]["revisions"]
    workloads = {n: kube.get("Deployment", n)["metadata"]["uid"] for n in engine_names(kube)}
    assert len(workloads) == 4  # both slots' prefill and decode

    bad = kube.cr(name)["spec"]
    bad["decode"]["extraArgs"] = ["--max-num-sequences", "8"]
    kube.update_spec(name, bad)
    out, events = step(kube, name, clock, 1)
    st = kube.cr(name)["status"]
    assert cond(st, "Stalled")["reason"] == "InvalidSpec" and st["rollout"] == canary
    assert st["revisions"] == revisions and len(revisions) == 2
    assert {n: kube.get("Deployment", n)["metadata"]["uid"] for n in engine_names(kube)} == workloads

    good = kube.cr(name)["spec"]
    del good["decode"]["extraArgs"]
    kube.update_spec(name, good)
    out, events = step(kube, name, clock, 1)
    st = kube.cr(name)["status"]["rollout"]
    assert (st["candidateRevision"], st["candidateSlot"]) == (canary["candidateRevision"], canary["candidateSlot"])
    assert st["step"] >= canary["step"] and "CandidateReplaced" not in [r for _, r, _ in events]
    assert {n: kube.get("Deployment", n)["metadata"]["uid"] for n in engine_names(kube)} == workloads
    _until(kube, name, clock, M.COMPLETE)


def _serving(kube: FakeKube, name: str) -> tuple[tuple[str, str], dict[str, dict]]:
    """(serving slot, serving revision) as status says, and the pod templates of that slot's engine workloads (and
    endpoint picker, in mode Gateway), each of which runs at least one replica."""
    st = kube.cr(name)["status"]
    slot = M.State.from_status(st.get("rollout")).serving_slot
    names = {role: slot_workload_name(name, role, slot) for role in ("prefill", "decode")}
    names["epp"] = gateway.epp_name(name, slot)  # mode Gateway: the slot's endpoint picker
    workloads = {role: w for role, n in names.items() if (w := kube.get("Deployment", n))}
    assert all(w["spec"].get("replicas", 1) >= 1 for w in workloads.values()), (slot, st.get("rollout"))  # never 0
    return (slot, st.get("servingRevision", "")), {role: w["spec"]["template"] for role, w in workloads.items()}


@pytest.mark.parametrize("example_name,seed", [(e, s) for e in ("tp4-h200-low-latency", "tp4-h200-pd-gateway")
                                                for s in range(12)])
def test_any_sequence_of_spec_changes_never_touches_what_serves_and_ends_on_one_slot(world, example_name, seed):
    """Random sequences of engine changes, unrealizable specs, reverts, prefill on/off, SLO edits, candidates over
    and within the gate, pause/resume annotations, every pod out of Ready for a pass, operator restarts, a lost
    status write and the planner resizing roles, a pass after each with time passing: status never forgets a
    rollout once one happened; the slot status says serves keeps its engine templates, and at least one replica
    each, as long as it serves that revision; once the spec is good and new, one slot serves it."""
    rnd = random.Random(seed)
    clock, figures, seen = world
    kube, name = converged(short(example(example_name)))  # the Gateway example: the operator's HTTPRoute splits
    rolled_once = False
    key, templates = _serving(kube, name)
    assert {"prefill", "decode"} <= set(templates) and ("epp" in templates) == example_name.endswith("gateway")
    history = []
    for _ in range(16):
        spec = kube.cr(name)["spec"]
        action = rnd.choice(["engine", "engine", "bad", "fix", "slo", "prefill", "slow", "fast", "pause", "resume",
                             "unready", "restart", "lost", "scale", "wait", "wait"])
        history.append(action)
        if action == "engine":
            spec["decode"]["maxNumSeqs"] = rnd.choice([40, 48, 56, 64])
        elif action == "bad":
            spec["decode"]["extraArgs"] = ["--max-num-sequences", "8"]
        elif action == "fix":
            spec["decode"].pop("extraArgs", None)
        elif action == "prefill":  # aggregated <-> P/D: a role comes or goes with the revision
            spec["prefill"]["enabled"] = not spec["prefill"].get("enabled", True)
        elif action == "slo":
            spec["slo"]["e2eP95Seconds"] = rnd.choice([60, 90, 120])
        cand = (kube.cr(name)["status"].get("rollout") or {}).get("candidateRevision", "")
        if action in ("slow", "fast"):  # the candidate's figures over or within the gate
            figures["view"] = progress.StepView(M.Figures(requests=40, ttft_seconds=9.0 if action == "slow" else 0.5,
                                                          e2e_p95_seconds=5.0, error_ratio=0.0), serving_requests=100,
                                                old_live_requests=0)
        elif action in ("pause", "resume"):  # kubectl annotate ... v41flash.io/rollout-action=pause/<candidate>
            kube.crs[("ns", name)]["metadata"]["annotations"] = {"v41flash.io/rollout-action": f"{action}/{cand}"}
        elif action == "restart":  # a new operator process: nothing in memory
            meta = kube.cr(name)["metadata"]
            process_memory.MEMORY.forget(meta["uid"], meta["namespace"], name)
        elif action == "lost":  # the next pass's status write is refused (409): what it applied and pruned stays
            kube.fail[("patch_status", name)] = api_error(409, "Conflict", "the object has been modified")
        elif action not in ("wait", "unready"):
            kube.update_spec(name, spec)
        # "scale": a planner pass sizing each role between its min and max (1-2 in both examples)
        planner = PlannerOutcome(desired={role: rnd.randint(1, 2) for role in ("prefill", "decode")}) \
            if action == "scale" else None
        for _ in range(rnd.randint(1, 3)):
            clock.t += rnd.choice([0.5, 3, 6, 12])
            reconcile(kube, kube.cr(name), Events(), planner=planner)
            kube.settle(ready=action != "unready")  # "unready": every pod out of Ready for a pass (a node blip)
            st = kube.cr(name)["status"]
            rolled_once = rolled_once or "rollout" in st
            assert not rolled_once or "rollout" in st, (history, st)
            now_key, now_templates = _serving(kube, name)
            if now_key == key:
                assert now_templates == templates, (history, key)  # what serves is never re-templated
            key, templates = now_key, now_templates
            assert templates, (history, key, st.get("conditions"))  # the serving slot's engines exist
    # the spec good and new (a rolled-back revision is not tried again), the figures good, nothing paused
    figures["view"] = progress.StepView(M.Figures(requests=40, ttft_seconds=0.5, e2e_p95_seconds=5.0,
                                                  error_ratio=0.0), serving_requests=100, old_live_requests=0)
    kube.crs[("ns", name)]["metadata"]["annotations"] = {}
    spec = kube.cr(name)["spec"]
    spec["decode"].pop("extraArgs", None)
    spec["decode"]["maxNumSeqs"] = 72
    kube.update_spec(name, spec)
    kube.settle()
    for _ in range(40):
        out, _ = step(kube, name, clock, 6)
        st = kube.cr(name)["status"]
        r = st.get("rollout") or {}
        if cond(st, "Ready")["status"] == "True" and st["observedGeneration"] == kube.cr(name)["metadata"][
                "generation"] and not (r.get("candidateSlot") or r.get("drainingSlot") or r.get("retiringSlot")):
            break  # Ready, and nothing left of a rollout (a retired candidate's slot waits out its deadline)
    else:
        raise AssertionError(f"never Ready again after {history}: {st.get('rollout')} {st.get('conditions')}")
    slot = M.State.from_status(st.get("rollout")).serving_slot
    roles = ("prefill", "decode") if spec["prefill"].get("enabled", True) else ("decode",)
    assert engine_names(kube) == {slot_workload_name(name, role, slot) for role in roles}, \
        (history, st.get("rollout"))
    # at rest, the children are exactly render() of the final spec in its final slot, and of the same kinds as a
    # deployment of that spec that never rolled
    final = api.V41FlashDeployment.model_validate({**kube.cr(name), "status": None})
    replicas = {role: (st.get(role) or {}).get("desiredReplicas") for role in roles}
    want = render(final, [SlotSpec(slot, final.spec, replicas)], owner=owner_reference(kube.cr(name)))
    assert children(kube) == {(o["kind"], o["metadata"]["name"]) for o in want}, history
    assert sorted(k for k, _ in children(kube)) == sorted(o["kind"] for o in render(final)), history


def test_a_rolled_deployment_keeps_its_weight_prefetcher(world, monkeypatch):
    """The weight-prefetch DaemonSet is part of the deployment before, during and after its engine rollouts (an
    operator with two renderers pruned it on the first rollout and never rendered it again)."""
    clock, _, _ = world
    monkeypatch.setattr(operator_config, "_installed", operator_config.OperatorConfig(
        weight_cache_host_paths=("/mnt/nvme/v41flash",)))  # the administrator allows the host path
    doc = short(example())
    doc["spec"]["startup"] = {"weightCache": {"hostPath": "/mnt/nvme/v41flash", "prefetch": True}}
    kube, name = converged(doc)
    prefetcher = ("DaemonSet", f"{name}-weight-prefetch")
    assert prefetcher in children(kube)
    for seqs in (48, 56):  # two rollouts: slot "" to "a", then "a" to "b"
        engine_change(kube, name, seqs)
        for _ in range(40):
            step(kube, name, clock, 6)
            assert prefetcher in children(kube)
            r = kube.cr(name)["status"].get("rollout") or {}
            if r.get("phase") == M.COMPLETE and not (r.get("drainingSlot") or r.get("retiringSlot")):
                break
        else:
            raise AssertionError(f"the rollout to maxNumSeqs {seqs} never completed: {r}")
    assert kube.cr(name)["status"]["rollout"]["servingSlot"] == "b"
    reconcile(kube, kube.cr(name), Events(), how=rec.Pass(apply=False))  # an observe pass at rest
    step(kube, name, clock, 6)  # and a full one
    assert prefetcher in children(kube)
