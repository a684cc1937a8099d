"""The rollout state machine (v41flash/rollout.py): every transition, from frozen inputs, with the state
carried through status (to_status/from_status) between passes as the controller does."""
from __future__ import annotations

from dataclasses import replace

import pytest

from v41flash.rollout import machine as R
from v41flash.api.v1alpha1 import V41FlashDeploymentSpec

OLD, NEW, NEWER = "0ld0ld0ld0", "ca0d1da7e0", "5ec0ndca0d"
GPUS = {"prefill": 4, "decode": 4}
T0 = 1_790_000_000.0
POLICY = R.Policy(steps=(5, 25, 50, 100), step_seconds=10, min_requests_per_step=10, progress_deadline_seconds=120,
                  drain_deadline_seconds=60, ttft_target_seconds=2.0, ttft_percentile=90, e2e_target_seconds=60)


def slot(prefill=(1, 1), decode=(1, 1), router=True, unsched="", problems=()):
    return R.SlotObs({"prefill": R.RoleObs(*prefill, unschedulable=unsched, problems=problems),
                      "decode": R.RoleObs(*decode)}, router_ready=router)


READY = slot()
UNREADY = slot(prefill=(1, 0), decode=(1, 0), problems=("prefill-b-x: not Ready",))


def obs(t=0.0, spec=NEW, serving=OLD, cand=None, fig=None, serving_replicas=None, live=None, action=None,
        serving_obs=None):
    reps = serving_replicas or {"prefill": 1, "decode": 1}
    return R.RolloutObserved(now=T0 + t, spec_revision=spec, serving_revision=serving, gpus_per_replica=GPUS,
                      serving_replicas=reps, candidate=cand, figures=fig, old_live_requests=live, action=action,
                      serving=serving_obs or slot(*[(n, n) for n in (reps["prefill"], reps["decode"])]))


def good(n=20):
    return R.Figures(requests=n, ttft_seconds=0.5, e2e_p95_seconds=5.0, error_ratio=0.0)


def step(state, o, policy=POLICY):
    """One pass, with the state round-tripped through status (what survives a restart)."""
    d = R.decide(R.State.from_status(state.to_status()), o, policy)
    return d


def kinds(d):
    return {p.kind: p for p in d.slots}


def run_to_canary(policy=POLICY):
    d = step(R.State(serving_slot="a"), obs(0))
    d = step(d.state, obs(5, cand=READY))
    assert d.state.phase == R.CANARY
    return d


# --- start --------------------------------------------------------------------------------------

def test_no_change_no_rollout():
    d = step(R.State(), obs(spec=OLD))
    assert d.state.phase == "" and d.serving_revision == OLD and not d.reconciling and not d.stalled
    assert [(p.slot, p.kind, p.share, p.accept_new) for p in d.slots] == [("", "serving", 100, True)]


def test_nothing_served_yet_the_serving_slot_runs_the_spec():
    d = step(R.State(), obs(serving=""))
    assert d.serving_revision == NEW and d.state.phase == ""
    assert [(p.slot, p.revision, p.kind) for p in d.slots] == [("", NEW, "serving")]


def test_start_puts_the_candidate_in_the_other_slot_with_no_sessions():
    d = step(R.State(), obs())
    assert d.state.phase == R.STARTING and d.state.candidate_slot == "a" and d.state.serving_slot == ""
    k = kinds(d)
    assert k["candidate"].replicas == {"prefill": 1, "decode": 1} and not k["candidate"].accept_new
    assert k["candidate"].share == 0 and k["serving"].share == 100 and k["serving"].minus == 0
    assert d.serving_revision == OLD and d.reconciling_reason == "RolloutProgressing"
    assert [e.reason for e in d.events] == ["RolloutStarted"]
    assert step(R.State(serving_slot="a"), obs()).state.candidate_slot == "b"
    assert step(R.State(serving_slot="b"), obs()).state.candidate_slot == "a"


# --- ready / not ready --------------------------------------------------------------------------

def test_candidate_ready_enters_step_one():
    d = run_to_canary()
    assert (d.state.step, d.state.steps, d.state.share) == (1, 4, 5)
    k = kinds(d)
    assert k["candidate"].accept_new and k["candidate"].share == 5 and k["serving"].share == 95
    assert "canary step 1/4: 5% of new sessions on " + NEW in d.reconciling
    assert "CandidateReady" in [e.reason for e in d.events]


def test_candidate_not_ready_by_the_deadline_is_rolled_back_with_the_pod_reasons():
    d = step(R.State(serving_slot="a"), obs(0))
    d = step(d.state, obs(60, cand=UNREADY))
    assert d.state.phase == R.STARTING and not d.stalled
    d = step(d.state, obs(121, cand=UNREADY))
    assert d.state.phase == R.ROLLED_BACK and d.state.reason == "CandidateNotReady"
    assert "prefill: 0/1 Ready" in d.state.message and "prefill-b-x: not Ready" in d.state.message
    assert "progressDeadlineSeconds 120" in d.state.message
    assert d.stalled[0] == "CandidateNotReady" and d.stalled[1].startswith(f"rolled back {NEW}:")
    assert [p.kind for p in d.slots] == ["serving"] and d.slots[0].minus == 0 and d.serving_revision == OLD
    assert d.events[0].reason == "RolledBack" and d.events[0].warning


def test_a_rolled_back_revision_is_not_retried_and_stays_stalled():
    d = step(R.State(serving_slot="a"), obs(0))
    d = step(d.state, obs(200, cand=UNREADY))
    for t in (300, 4000):
        d = step(d.state, obs(t))
        assert d.state.phase == R.ROLLED_BACK and d.stalled and [p.kind for p in d.slots] == ["serving"]
        assert not d.events


def test_after_a_rollback_a_new_spec_starts_again_and_the_old_spec_clears_the_stall():
    d = step(R.State(serving_slot="a"), obs(0))
    rolled = step(d.state, obs(200, cand=UNREADY)).state
    d = step(rolled, obs(300, spec=NEWER))
    assert d.state.phase == R.STARTING and d.state.candidate_revision == NEWER and d.state.candidate_slot == "b"
    d = step(rolled, obs(300, spec=OLD))
    assert d.state.phase == R.COMPLETE and not d.stalled and d.state.serving_slot == "a"


def test_resume_annotation_retries_a_rolled_back_candidate_and_promote_is_ignored_with_reason():
    d = step(R.State(serving_slot="a"), obs(0))
    rolled = step(d.state, obs(200, cand=UNREADY)).state
    d = step(rolled, obs(300, action=R.Action("promote", NEW, "promote/" + NEW)))
    assert d.state.phase == R.ROLLED_BACK and "ignored" in dict(d.state.last_action)["result"]
    d = step(rolled, obs(300, action=R.Action("resume", NEW, "resume/" + NEW)))
    assert d.state.phase == R.STARTING and d.state.since == T0 + 300
    assert dict(d.state.last_action)["result"] == "applied"
    # the same annotation is consumed once: it does not restart the retry on the next pass
    d2 = step(d.state, obs(320, cand=UNREADY, action=R.Action("resume", NEW, "resume/" + NEW)))
    assert d2.state.since == T0 + 300


# --- steps and the gate -------------------------------------------------------------------------

def test_steps_advance_only_after_step_seconds_and_min_requests_then_promote():
    d = run_to_canary()
    t = 5
    d = step(d.state, obs(t + 9, cand=READY, fig=good()))
    assert d.state.step == 1  # held < stepSeconds
    d = step(d.state, obs(t + 11, cand=READY, fig=good(n=9)))
    assert d.state.step == 1  # too few requests: the step is extended
    shares = []
    for _ in range(3):
        t += 11
        d = step(d.state, obs(t, cand=READY, fig=good()))
        shares.append(d.state.share)
        assert "StepPassed" in [e.reason for e in d.events]
    assert shares == [25, 50, 100] and d.state.step == 4
    t += 11
    d = step(d.state, obs(t, cand=READY, fig=good()))
    assert d.state.phase == R.DRAINING and d.serving_revision == NEW
    k = kinds(d)
    assert (k["serving"].slot, k["serving"].revision, k["serving"].share) == ("b", NEW, 100)
    assert (k["draining"].slot, k["draining"].revision, k["draining"].accept_new) == ("a", OLD, False)
    assert [e.reason for e in d.events] == ["StepPassed", "Promoted"]


def test_gate_breach_rolls_back_naming_the_figure_and_the_target():
    d = run_to_canary()
    d = step(d.state, obs(5 + 11, cand=READY, fig=good()))  # step 1 passes
    slow = R.Figures(requests=30, ttft_seconds=2.7, e2e_p95_seconds=5.0, error_ratio=0.0)
    d = step(d.state, obs(5 + 22, cand=READY, fig=slow))
    assert d.state.phase == R.ROLLED_BACK and d.state.reason == "GateFailed"
    assert d.state.message == "TTFT p90 2.70s > 2.00s target at step 2/4 (25%)"
    assert d.stalled == ("GateFailed", f"rolled back {NEW}: TTFT p90 2.70s > 2.00s target at step 2/4 (25%)")
    assert [p.kind for p in d.slots] == ["serving"] and d.slots[0].share == 100


@pytest.mark.parametrize("fig, why", [
    (R.Figures(30, 0.5, 75.0, 0.0), "e2e p95 75.00s > 60.00s target"),
    (R.Figures(30, 0.5, 5.0, 0.05), "error ratio 5.0% > 1.0%"),
    (R.Figures(30, None, 5.0, 0.0), "no TTFT p90 figure"),
])
def test_other_gate_failures(fig, why):
    d = run_to_canary()
    d = step(d.state, obs(5 + 11, cand=READY, fig=fig))
    assert d.state.reason == "GateFailed" and d.state.message.startswith(why)


def test_tolerance_widens_the_gate():
    pol = replace(POLICY, ttft_tolerance=0.5)
    d = run_to_canary(pol)
    d = step(d.state, obs(5 + 11, cand=READY, fig=R.Figures(30, 2.7, 5.0, 0.0)), pol)
    assert d.state.phase == R.CANARY and d.state.step == 2
    assert dict(d.state.gate)["ttft"] == "2.70s / 3.00s p90"


def test_a_step_that_never_gets_enough_requests_rolls_back_at_the_deadline():
    d = run_to_canary()
    d = step(d.state, obs(5 + 100, cand=READY, fig=good(n=3)))
    assert d.state.phase == R.CANARY
    d = step(d.state, obs(5 + 121, cand=READY, fig=good(n=3)))
    assert d.state.reason == "StepNotJudged" and "3 requests" in d.state.message


def test_candidate_losing_readiness_mid_canary_rolls_back():
    d = run_to_canary()
    d = step(d.state, obs(8, cand=slot(decode=(1, 0))))
    assert d.state.phase == R.ROLLED_BACK and d.state.reason == "CandidateUnavailable"
    assert "decode: 0/1 Ready" in d.state.message


def test_the_figures_in_status_and_the_reconciling_message():
    d = run_to_canary()
    d = step(d.state, obs(9, cand=READY, fig=R.Figures(4, 1.42, 31.0, 0.0)))
    g = dict(d.state.gate)
    assert g == {"requests": "4", "ttft": "1.42s / 2.00s p90", "e2e": "31.00s / 60.00s p95", "errors": "0.0% / 1.0%"}
    assert "TTFT 1.42s / 2.00s p90, e2e 31.00s / 60.00s p95" in d.reconciling


# --- drain --------------------------------------------------------------------------------------

def promoted():
    d = run_to_canary()
    return step(d.state, obs(5, cand=READY, action=R.Action("promote", NEW, "promote/" + NEW)))


def test_promote_annotation_skips_the_remaining_steps():
    d = promoted()
    assert d.state.phase == R.DRAINING and d.serving_revision == NEW
    assert "promote annotation" in d.state.message and dict(d.state.last_action)["result"] == "applied"


def test_promote_from_the_spec():
    d = run_to_canary()
    d = step(d.state, obs(6, cand=READY), replace(POLICY, promote=NEW))
    assert d.state.phase == R.DRAINING and "spec.rollout.promote" in d.state.message


def test_promote_of_another_revision_is_ignored_with_the_reason():
    d = run_to_canary()
    d = step(d.state, obs(6, cand=READY), replace(POLICY, promote=NEWER))
    assert d.state.phase == R.CANARY
    la = dict(d.state.last_action)
    assert la["source"] == "spec" and la["revision"] == NEWER and la["result"].startswith("ignored")


def test_drain_waits_for_live_sessions_then_deletes_the_old_slot():
    d = promoted()
    # The serving revision in observation is now the promoted one (status.servingRevision).
    d = step(d.state, obs(20, spec=NEW, serving=NEW, live=3))
    assert d.state.phase == R.DRAINING and "3 live" in d.reconciling and len(d.slots) == 2
    d = step(d.state, obs(30, spec=NEW, serving=NEW, live=0))
    assert d.state.phase == R.COMPLETE and [(p.slot, p.kind) for p in d.slots] == [("b", "serving")]
    assert d.events[0].reason == "RolloutComplete" and not d.reconciling and not d.stalled


def test_drain_ends_at_the_drain_deadline_with_sessions_left():
    d = promoted()
    d = step(d.state, obs(66, spec=NEW, serving=NEW, live=7))
    assert d.state.phase == R.COMPLETE and "drainDeadlineSeconds 60" in d.state.message
    d = promoted()
    d = step(d.state, obs(30, spec=NEW, serving=NEW, live=None))  # unknown is not idle
    assert d.state.phase == R.DRAINING


def test_a_change_during_the_drain_starts_after_it():
    d = promoted()
    d = step(d.state, obs(20, spec=NEWER, serving=NEW, live=1))
    assert d.state.phase == R.DRAINING
    d = step(d.state, obs(25, spec=NEWER, serving=NEW, live=0))
    assert d.state.phase == R.STARTING and d.state.candidate_revision == NEWER and d.state.candidate_slot == "a"
    assert d.state.serving_slot == "b"
    assert [e.reason for e in d.events] == ["RolloutComplete", "RolloutStarted"]


# --- pause / resume / abort / revert ------------------------------------------------------------

def test_pause_from_the_spec_holds_and_resume_judges_the_step_afresh():
    d = run_to_canary()
    paused = replace(POLICY, paused=True)
    d = step(d.state, obs(30, cand=READY, fig=good()), paused)
    assert d.state.phase == R.PAUSED and d.state.step == 1 and d.reconciling.startswith("paused at canary step 1/4")
    d = step(d.state, obs(300, cand=READY, fig=good()), paused)
    assert d.state.phase == R.PAUSED and not d.stalled  # no deadline while paused
    d = step(d.state, obs(301, cand=READY, fig=good()))
    assert d.state.phase == R.CANARY and d.state.step == 1 and d.state.step_started_at == T0 + 301


def test_pause_annotation_holds_while_set_and_resume_annotation_releases():
    d = run_to_canary()
    pause = R.Action("pause", NEW, "pause/" + NEW)
    for t in (30, 60):
        d = step(d.state, obs(t, cand=READY, fig=good(), action=pause))
        assert d.state.phase == R.PAUSED
    d = step(d.state, obs(70, cand=READY, fig=good(), action=R.Action("resume", NEW, "resume/" + NEW)))
    assert d.state.phase == R.CANARY


def test_an_annotation_for_another_revision_is_ignored_with_reason():
    d = run_to_canary()
    d = step(d.state, obs(30, cand=READY, fig=good(), action=R.Action("pause", NEWER, "pause/" + NEWER)))
    assert d.state.phase == R.CANARY and d.state.step == 2
    assert "not the current candidate" in dict(d.state.last_action)["result"]


@pytest.mark.parametrize("how", ["spec", "annotation"])
def test_abort(how):
    d = run_to_canary()
    pol = replace(POLICY, abort=NEW) if how == "spec" else POLICY
    act = R.Action("abort", NEW, "abort/" + NEW) if how == "annotation" else None
    d = step(d.state, obs(7, cand=READY, action=act), pol)
    assert d.state.phase == R.ABORTED and d.state.reason == "Aborted" and not d.stalled
    assert [p.kind for p in d.slots] == ["serving"] and d.events[0].reason == "RolloutAborted"
    # not retried while the spec still renders it
    d = step(d.state, obs(50, action=act), pol)
    assert d.state.phase == R.ABORTED and [p.kind for p in d.slots] == ["serving"]


def test_reverting_the_spec_mid_rollout_aborts_and_never_touches_the_serving_slot():
    d = run_to_canary()
    d = step(d.state, obs(8, spec=OLD, cand=READY))
    assert d.state.phase == R.ABORTED and d.state.reason == "SpecReverted"
    assert [(p.slot, p.kind, p.minus, p.share) for p in d.slots] == [("a", "serving", 0, 100)]
    d = step(d.state, obs(9, spec=OLD))
    assert d.state.phase == R.COMPLETE and not d.reconciling


def test_a_newer_change_mid_canary_replaces_the_candidate_in_the_same_slot():
    d = run_to_canary()
    d = step(d.state, obs(8, spec=NEWER, cand=None))  # no pod of NEWER exists yet
    assert d.state.phase == R.STARTING and d.state.candidate_revision == NEWER and d.state.candidate_slot == "b"
    assert d.state.step == 0 and not kinds(d)["candidate"].accept_new
    assert [e.reason for e in d.events] == ["CandidateReplaced", "RolloutStarted"]


# --- no surge room ------------------------------------------------------------------------------

def test_wait_for_surge_room_says_how_many_gpus_and_stalls_after_the_deadline():
    pol = replace(POLICY, gpu_budget=8)  # the serving pair holds all 8; maxSurgeGPUs 0 = one pair beside it
    assert step(R.State(serving_slot="a"), obs(0), pol).state.phase == R.STARTING
    tight = replace(pol, max_surge_gpus=4)
    d = step(R.State(serving_slot="a"), obs(0), tight)
    assert d.state.phase == R.WAITING
    assert d.reconciling == f"candidate {NEW} needs 8 GPUs (4 decode + 4 prefill); gpuBudget 8 + maxSurgeGPUs 4 leaves 4"
    assert d.events[0].reason == "WaitingForSurgeRoom" and d.reconciling_reason == "WaitingForSurgeRoom"
    d2 = step(d.state, obs(121), tight)
    assert d2.stalled and d2.stalled[0] == "WaitingForSurgeRoom" and d2.state.phase == R.WAITING
    d3 = step(d.state, obs(130), replace(tight, max_surge_gpus=8))  # room appears
    assert d3.state.phase == R.STARTING and d3.state.since == T0 + 130


def test_cluster_without_room_waits_on_pending_candidate_pods_without_rollback():
    d = step(R.State(serving_slot="a"), obs(0))
    pending = slot(prefill=(1, 0), decode=(1, 0), unsched="0/6 nodes are available: 6 Insufficient nvidia.com/gpu")
    d = step(d.state, obs(30, cand=pending))
    assert d.state.phase == R.STARTING and d.reconciling_reason == "WaitingForSurgeRoom"
    assert "needs 8 GPUs for prefill 1/1, decode 1/1 replicas: prefill: 0/6 nodes" in d.reconciling
    d = step(d.state, obs(200, cand=pending))
    assert d.state.phase == R.STARTING and d.stalled[0] == "WaitingForSurgeRoom"


def test_in_place_needs_two_ready_replicas_per_role():
    pol = replace(POLICY, gpu_budget=8, max_surge_gpus=4, when_no_surge_room="InPlace")
    d = step(R.State(serving_slot="a"), obs(0), pol)
    assert d.state.phase == R.WAITING
    assert "in-place needs 2 ready decode replicas or room for one (4 GPUs)" in d.reconciling


def test_in_place_hands_over_pairs_and_never_takes_a_role_to_zero():
    pol = replace(POLICY, gpu_budget=16, max_surge_gpus=4, when_no_surge_room="InPlace")
    two = {"prefill": 2, "decode": 2}
    d = step(R.State(serving_slot="a"), obs(0, serving_replicas=two), pol)
    assert d.state.phase == R.STARTING and d.state.in_place == 1
    k = kinds(d)
    # one pair handed over, the candidate starts at one replica per role in the freed GPUs (8 + 8 <= 16 + 4)
    assert k["serving"].minus == 1 and k["candidate"].replicas == {"prefill": 1, "decode": 1}
    one_ready = slot(prefill=(1, 1), decode=(1, 1))
    handed = slot((1, 1), (1, 1))
    d = step(d.state, obs(5, serving_replicas=two, cand=one_ready, serving_obs=handed), pol)
    assert d.state.phase == R.CANARY and d.state.step == 1
    t = 5
    for _ in range(3):  # 25 % and 50 % of 2 replicas is 1: no growth; 100 % needs 2 but the serving slot keeps 1
        t += 11
        d = step(d.state, obs(t, serving_replicas=two, cand=one_ready, fig=good(), serving_obs=handed), pol)
        assert d.state.phase == R.CANARY and d.state.in_place == 1
        for p in d.slots:
            if p.kind == "serving":
                assert min(two.values()) - p.minus >= 1
    assert d.state.step == 4 and kinds(d)["candidate"].replicas == {"prefill": 1, "decode": 1}
    d = step(d.state, obs(t + 11, serving_replicas=two, cand=one_ready, fig=good(), serving_obs=handed), pol)
    assert d.state.phase == R.DRAINING  # in place: promoted at the size the never-at-zero floor allows


def test_in_place_grows_the_candidate_one_pair_at_a_time_while_the_serving_slot_can_spare_one():
    pol = replace(POLICY, steps=(25, 50, 100), gpu_budget=24, max_surge_gpus=4, when_no_surge_room="InPlace")
    three = {"prefill": 3, "decode": 3}
    o = lambda t, cand, serving_ready, **kw: obs(t, serving_replicas=three, cand=cand,  # noqa: E731
                                                 serving_obs=slot(serving_ready, serving_ready), **kw)
    d = step(R.State(serving_slot="a"), o(0, None, (3, 3)), pol)
    assert d.state.in_place == 1 and kinds(d)["candidate"].replicas == {"prefill": 1, "decode": 1}
    d = step(d.state, o(5, slot(), (2, 2)), pol)
    assert d.state.phase == R.CANARY and d.state.step == 1 and d.state.share == 25
    # 50 % of 3 is 2 per role: 16 GPUs + the serving slot's 16 > 24 + 4, so one more pair is handed over first
    d = step(d.state, o(16, slot(), (2, 2), fig=good()), pol)
    assert (d.state.phase, d.state.step, d.state.share, d.state.in_place) == (R.STARTING, 1, 25, 2)
    k = kinds(d)
    assert k["candidate"].replicas == {"prefill": 2, "decode": 2} and k["serving"].minus == 2
    assert k["candidate"].accept_new and k["candidate"].share == 25 and k["serving"].share == 75
    assert "CandidateGrowing" in [e.reason for e in d.events]
    d = step(d.state, o(20, slot((2, 2), (2, 2)), (1, 1)), pol)
    assert (d.state.phase, d.state.step, d.state.share) == (R.CANARY, 2, 50)
    # 100 % needs 3 per role; the serving slot has 1 left per role: it keeps it, the candidate goes on at 2
    d = step(d.state, o(31, slot((2, 2), (2, 2)), (1, 1), fig=good()), pol)
    assert (d.state.phase, d.state.step, d.state.in_place) == (R.CANARY, 3, 2)
    assert all(3 - p.minus >= 1 for p in d.slots if p.kind == "serving")


def test_in_place_on_a_full_cluster_hands_over_when_pods_are_pending():
    pol = replace(POLICY, when_no_surge_room="InPlace")
    two = {"prefill": 2, "decode": 2}
    d = step(R.State(serving_slot="a"), obs(0, serving_replicas=two), pol)
    assert d.state.in_place == 0
    pending = slot(prefill=(1, 0), decode=(1, 0), unsched="Insufficient nvidia.com/gpu")
    d = step(d.state, obs(10, serving_replicas=two, cand=pending), pol)
    assert d.state.in_place == 1 and kinds(d)["serving"].minus == 1 and not d.stalled


def test_an_in_place_rollback_gives_the_serving_slot_its_replicas_back():
    pol = replace(POLICY, gpu_budget=16, max_surge_gpus=4, when_no_surge_room="InPlace")
    two = {"prefill": 2, "decode": 2}
    d = step(R.State(serving_slot="a"), obs(0, serving_replicas=two), pol)
    d = step(d.state, obs(200, serving_replicas=two, cand=UNREADY), pol)
    assert d.state.phase == R.ROLLED_BACK and kinds(d)["serving"].minus == 0


# --- Recreate -----------------------------------------------------------------------------------

def test_recreate_deletes_the_serving_slot_then_serves_the_candidate():
    pol = replace(POLICY, strategy="Recreate")
    d = step(R.State(serving_slot="a"), obs(0), pol)
    assert d.state.phase == R.RECREATING and [(p.slot, p.kind) for p in d.slots] == [("b", "candidate")]
    assert d.serving_revision == OLD
    d = step(d.state, obs(30, cand=READY), pol)
    assert d.state.phase == R.COMPLETE and d.serving_revision == NEW and d.state.serving_slot == "b"


# --- restart ------------------------------------------------------------------------------------

def test_status_round_trip_is_exact_and_a_restart_resumes_without_a_new_slot():
    d = run_to_canary()
    d = step(d.state, obs(16, cand=READY, fig=good()))
    status = d.state.to_status()
    assert status["candidateSlot"] == "b" and status["step"] == 2 and status["stepStartedAt"].endswith("Z")
    again = R.State.from_status(status)
    assert again == R.State.from_status(again.to_status())
    # a "restarted" operator: same inputs, state only from status
    d1 = R.decide(again, obs(20, cand=READY, fig=good()), POLICY)
    d2 = R.decide(d.state, obs(20, cand=READY, fig=good()), POLICY)
    assert d1.state.candidate_slot == d2.state.candidate_slot == "b" and d1.state.step == d2.state.step == 2
    assert [p.slot for p in d1.slots] == ["a", "b"]


def test_policy_from_the_spec():
    spec = V41FlashDeploymentSpec.model_validate({"rollout": {"steps": [50, 100], "stepSeconds": 10}})
    pol = R.policy_from_spec(spec, startup_seconds=7200)
    assert pol.steps == (50, 100) and pol.step_seconds == 10 and pol.progress_deadline_seconds == 7800
    assert pol.ttft_target_seconds == 2.0 and pol.e2e_target_seconds == 60.0


def test_every_status_field_the_machine_writes_is_in_the_crd_schema():
    """The apiserver prunes unknown status fields: a field missing from the schema would be lost at restart."""
    from v41flash.api.crd import crd
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["rollout"]
    d = promoted()
    full = R.State(phase=R.DRAINING, candidate_revision=NEW, candidate_slot="b", serving_slot="a",
                   draining_revision=OLD, draining_slot="a", step=2, steps=4, share=25, since=T0, step_started_at=T0,
                   drain_started_at=T0, in_place=1, candidate_replicas=(("decode", 1), ("prefill", 2)),
                   waiting_since=T0, reason="r", message="m", gate=(("ttft", "x"),),
                   last_action=d.state.last_action)
    status = full.to_status()
    assert set(status) <= set(schema["properties"]), set(status) - set(schema["properties"])
    assert set(status["lastAction"]) <= set(schema["properties"]["lastAction"]["properties"])
    assert R.State.from_status(status) == full


def test_candidate_figures_from_its_own_windows():
    from v41flash.figures import RouterFigures, WindowFigures
    pre = WindowFigures(0, 10, requests=30, ttft_s=0.8)
    dec = WindowFigures(0, 10, requests=30, ttft_s=0.2, e2e_p95_s=9.0)
    router = RouterFigures(0, 10, requests=40, e2e_p95_s=12.0, errors=2)
    f = R.candidate_figures({"prefill": pre, "decode": dec}, router)
    assert f == R.Figures(requests=40, ttft_seconds=0.8, e2e_p95_seconds=12.0, error_ratio=2 / 42)
    # aggregated (no prefill) and no router figures yet: the decode engines' own
    f = R.candidate_figures({"decode": dec}, RouterFigures(0, 10))
    assert f == R.Figures(requests=30, ttft_seconds=0.2, e2e_p95_seconds=9.0, error_ratio=None)
    assert R.candidate_figures({}, None) == R.Figures()


def test_an_idle_deployment_rolls_out_unjudged_but_a_busy_one_needs_candidate_requests():
    d = run_to_canary()
    idle = replace(obs(5 + 11, cand=READY, fig=R.Figures()), serving_requests=0)
    d2 = step(d.state, idle)
    assert d2.state.step == 2 and dict(d2.state.gate)["note"] == "no traffic: passed unjudged"
    assert "no traffic: passed unjudged" in d2.events[0].message
    busy = replace(obs(5 + 11, cand=READY, fig=R.Figures(requests=2)), serving_requests=300)
    assert step(d.state, busy).state.step == 1  # extended: the candidate must earn its step
    late = replace(obs(5 + 121, cand=READY, fig=R.Figures(requests=2)), serving_requests=300)
    assert step(d.state, late).state.reason == "StepNotJudged"


# --- the candidate sized by its share of sessions --------------------------------------------------------

FOUR_TWO = {"prefill": 4, "decode": 2}
# room for a full second copy of 4 + 2 replicas of 4 GPUs (as the default surge gives: below)
SIZED = replace(POLICY, max_surge_gpus=24)


def gstep(state, o, policy=SIZED):
    return step(state, o, policy)


def sized(t, cand=None, fig=None, reps=FOUR_TWO, **kw):
    return obs(t, serving_replicas=reps, cand=cand, fig=fig, **kw)


def cand_of(d, ready=True):
    size = kinds(d)["candidate"].replicas
    return slot(prefill=(size["prefill"], size["prefill"] if ready else 1),
                decode=(size["decode"], size["decode"] if ready else 1))


def test_the_size_rule():
    o = sized(0)
    assert R.target_replicas(o, 5) == {"prefill": 1, "decode": 1}
    assert R.target_replicas(o, 25) == {"prefill": 1, "decode": 1}
    assert R.target_replicas(o, 50) == {"prefill": 2, "decode": 1}
    assert R.target_replicas(o, 60) == {"prefill": 3, "decode": 2}
    assert R.target_replicas(o, 100) == FOUR_TWO
    one = obs(0)  # one replica per role (the e2e Shows): always one
    assert all(R.target_replicas(one, s) == {"prefill": 1, "decode": 1} for s in (1, 5, 50, 100))


def test_the_candidate_grows_before_each_share_that_needs_more_and_promotes_only_at_the_serving_size():
    d = gstep(R.State(serving_slot="a"), sized(0))
    assert kinds(d)["candidate"].replicas == {"prefill": 1, "decode": 1}
    assert "candidate prefill 1/4, decode 1/2 replicas" in d.reconciling
    assert "at prefill 1/4, decode 1/2 replicas" in d.events[0].message
    d = gstep(d.state, sized(5, cand_of(d)))
    assert (d.state.phase, d.state.step) == (R.CANARY, 1)
    d = gstep(d.state, sized(16, cand_of(d), good()))  # 25 %: still one per role
    assert (d.state.phase, d.state.step, d.state.share) == (R.CANARY, 2, 25)
    d = gstep(d.state, sized(27, cand_of(d), good()))  # 50 % needs 2 prefill: grow first, at 25 %
    assert (d.state.phase, d.state.step, d.state.share) == (R.STARTING, 2, 25)
    k = kinds(d)
    assert k["candidate"].replicas == {"prefill": 2, "decode": 1}
    assert (k["candidate"].share, k["candidate"].accept_new, k["serving"].share) == (25, True, 75)
    assert [e.reason for e in d.events] == ["StepPassed", "CandidateGrowing"]
    assert d.events[1].message == f"{NEW}: growing to prefill 2/4, decode 1/2 replicas for step 3/4 (50%); 25% of " \
                                  "new sessions meanwhile"
    assert "growing; 25% of new sessions meanwhile" in d.reconciling
    assert d.state.to_status()["candidateReplicas"] == {"prefill": 2, "decode": 1}
    d = gstep(d.state, sized(30, cand_of(d, ready=False)))  # the grown replica is not Ready: no step yet
    assert (d.state.phase, d.state.step, d.state.share) == (R.STARTING, 2, 25)
    d = gstep(d.state, sized(40, cand_of(d)))
    assert (d.state.phase, d.state.step, d.state.share, d.state.step_started_at) == (R.CANARY, 3, 50, T0 + 40)
    d = gstep(d.state, sized(51, cand_of(d), good()))  # 100 % needs the serving size
    assert (d.state.phase, d.state.step, d.state.share) == (R.STARTING, 3, 50)
    assert kinds(d)["candidate"].replicas == FOUR_TWO
    d = gstep(d.state, sized(55, cand_of(d)))
    assert (d.state.phase, d.state.step, d.state.share) == (R.CANARY, 4, 100)
    d = gstep(d.state, sized(66, cand_of(d), good()))
    assert d.state.phase == R.DRAINING and d.serving_revision == NEW


def test_a_serving_slot_scaled_up_during_the_last_step_grows_the_candidate_before_promotion():
    d = gstep(R.State(serving_slot="a"), obs(0), replace(SIZED, steps=(100,)))
    d = gstep(d.state, obs(5, cand=READY), replace(SIZED, steps=(100,)))
    assert (d.state.phase, d.state.step) == (R.CANARY, 1)
    two = {"prefill": 2, "decode": 2}  # the planner scaled the serving slot up meanwhile
    d = gstep(d.state, obs(16, cand=READY, fig=good(), serving_replicas=two), replace(SIZED, steps=(100,)))
    assert (d.state.phase, d.state.step, d.state.share) == (R.STARTING, 1, 100)
    assert kinds(d)["candidate"].replicas == two
    d = gstep(d.state, obs(20, cand=slot((2, 2), (2, 2)), serving_replicas=two), replace(SIZED, steps=(100,)))
    assert d.state.phase == R.DRAINING


def test_promote_grows_the_candidate_to_the_serving_size_first():
    d = gstep(R.State(serving_slot="a"), sized(0))
    d = gstep(d.state, sized(5, cand_of(d)))
    act = R.Action("promote", NEW, "promote/" + NEW)
    d = gstep(d.state, sized(6, cand_of(d), action=act))
    assert d.state.phase == R.STARTING and kinds(d)["candidate"].replicas == FOUR_TWO
    assert "for promotion" in [e.message for e in d.events if e.reason == "CandidateGrowing"][0]
    d = gstep(d.state, sized(7, cand_of(d, ready=False), action=act))
    assert d.state.phase == R.STARTING
    d = gstep(d.state, sized(9, cand_of(d), action=act))
    assert d.state.phase == R.DRAINING and "promote annotation" in d.state.message


def test_growth_has_its_own_progress_deadline_and_a_rollback_gives_everything_back():
    pol = replace(SIZED, progress_deadline_seconds=120)
    d = gstep(R.State(serving_slot="a"), sized(0), pol)
    d = gstep(d.state, sized(5, cand_of(d)), pol)
    t = 5
    for _ in range(2):
        t += 100  # slow steps: the rollout is older than the deadline, each step within it
        d = gstep(d.state, sized(t, cand_of(d), good()), pol)
    assert d.state.phase == R.STARTING and d.state.step == 2  # growing for step 3
    grown_at = t
    d = gstep(d.state, sized(t + 100, cand_of(d, ready=False)), pol)
    assert d.state.phase == R.STARTING and not d.stalled  # 100 s into the growth, 305 s into the rollout
    d = gstep(d.state, sized(grown_at + 121, cand_of(d, ready=False)), pol)
    assert d.state.phase == R.ROLLED_BACK and d.state.reason == "CandidateNotReady"
    assert "after growing to prefill 2/4, decode 1/2 replicas" in d.state.message
    assert "prefill: 1/2 Ready" in d.state.message
    assert [p.kind for p in d.slots] == ["serving"] and d.slots[0].minus == 0
    assert "candidateReplicas" not in d.state.to_status() and d.state.retiring_slot == "b"


def test_a_candidate_that_loses_a_role_while_growing_is_rolled_back():
    d = gstep(R.State(serving_slot="a"), sized(0))
    d = gstep(d.state, sized(5, cand_of(d)))
    for t in (16, 27):
        d = gstep(d.state, sized(t, cand_of(d), good()))
    assert d.state.phase == R.STARTING
    d = gstep(d.state, sized(30, slot(prefill=(2, 1), decode=(1, 0))))
    assert d.state.reason == "CandidateUnavailable" and "while growing" in d.state.message


@pytest.mark.parametrize("how", ["abort", "revert"])
def test_abort_or_revert_during_growth(how):
    d = gstep(R.State(serving_slot="a"), sized(0))
    d = gstep(d.state, sized(5, cand_of(d)))
    for t in (16, 27):
        d = gstep(d.state, sized(t, cand_of(d), good()))
    assert d.state.phase == R.STARTING and d.state.step == 2
    if how == "abort":
        d = gstep(d.state, sized(30, cand_of(d, ready=False), action=R.Action("abort", NEW, "abort/" + NEW)))
    else:
        d = gstep(d.state, sized(30, cand_of(d, ready=False), spec=OLD))
    assert d.state.phase == R.ABORTED and [p.kind for p in d.slots] == ["serving"] and not d.state.candidate_replicas


def test_pause_during_growth_lets_it_finish_then_holds_at_the_step():
    d = gstep(R.State(serving_slot="a"), sized(0))
    d = gstep(d.state, sized(5, cand_of(d)))
    for t in (16, 27):
        d = gstep(d.state, sized(t, cand_of(d), good()))
    assert (d.state.phase, d.state.step) == (R.STARTING, 2)
    paused = replace(SIZED, paused=True)
    d = gstep(d.state, sized(30, cand_of(d, ready=False)), paused)
    assert d.state.phase == R.STARTING and kinds(d)["candidate"].replicas == {"prefill": 2, "decode": 1}
    d = gstep(d.state, sized(35, cand_of(d)), paused)
    assert (d.state.phase, d.state.step, d.state.share) == (R.PAUSED, 2, 25)
    d = gstep(d.state, sized(300, cand_of(d), good()), paused)
    assert d.state.phase == R.PAUSED and not d.stalled
    d = gstep(d.state, sized(301, cand_of(d), good()))  # resumed: step 2 judged afresh
    assert (d.state.phase, d.state.step, d.state.step_started_at) == (R.CANARY, 2, T0 + 301)
    d = gstep(d.state, sized(312, cand_of(d), good()))  # passes: already big enough for 50 %
    assert (d.state.phase, d.state.step, d.state.share) == (R.CANARY, 3, 50)


def test_growth_without_surge_room_waits_at_the_passed_step_naming_the_gpus():
    # 2 + 2 replicas of 4 GPUs serve (16 = gpuBudget); maxSurgeGPUs 8 is one pair: enough to start, not to grow
    pol = replace(POLICY, steps=(50, 100), gpu_budget=16, max_surge_gpus=8)
    two = {"prefill": 2, "decode": 2}
    d = gstep(R.State(serving_slot="a"), obs(0, serving_replicas=two), pol)
    assert d.state.phase == R.STARTING and kinds(d)["candidate"].replicas == {"prefill": 1, "decode": 1}
    d = gstep(d.state, obs(5, cand=READY, serving_replicas=two), pol)
    d = gstep(d.state, obs(16, cand=READY, fig=good(), serving_replicas=two), pol)
    msg = (f"candidate {NEW} needs 16 GPUs (8 decode + 8 prefill); gpuBudget 16 + maxSurgeGPUs 8 leaves 8, to grow "
           "to prefill 2/2, decode 2/2 replicas for step 2/2 (100%)")
    assert (d.state.phase, d.state.step, d.state.share, d.state.reason) == (R.CANARY, 1, 50, "WaitingForSurgeRoom")
    assert d.reconciling == msg and d.reconciling_reason == "WaitingForSurgeRoom" and not d.stalled
    assert [e.reason for e in d.events] == ["StepPassed", "WaitingForSurgeRoom"] and d.events[1].warning
    assert kinds(d)["candidate"].replicas == {"prefill": 1, "decode": 1} and kinds(d)["candidate"].share == 50
    d = gstep(d.state, obs(30, cand=READY, fig=good(), serving_replicas=two), pol)
    assert d.state.phase == R.CANARY and d.state.step == 1 and not d.events  # not judged again, no new Event
    d = gstep(d.state, obs(16 + 121, cand=READY, fig=good(), serving_replicas=two), pol)
    assert d.stalled == ("WaitingForSurgeRoom", msg) and d.state.phase == R.CANARY
    d = gstep(d.state, obs(140, cand=READY, serving_replicas=two), replace(pol, max_surge_gpus=16))  # room
    assert (d.state.phase, d.state.step, d.state.waiting_since) == (R.STARTING, 1, 0.0)
    assert kinds(d)["candidate"].replicas == two and not d.stalled
    d = gstep(d.state, obs(150, cand=slot((2, 2), (2, 2)), serving_replicas=two), replace(pol, max_surge_gpus=16))
    assert (d.state.phase, d.state.step, d.state.share) == (R.CANARY, 2, 100)


def test_the_start_is_sized_for_the_first_share_and_waits_when_that_does_not_fit():
    pol = replace(POLICY, steps=(100,), max_surge_gpus=8)
    d = gstep(R.State(serving_slot="a"), sized(0), pol)
    assert d.state.phase == R.WAITING and "needs 24 GPUs (8 decode + 16 prefill); maxSurgeGPUs 8 leaves 8" in d.reconciling
    d = gstep(d.state, sized(5), replace(pol, max_surge_gpus=24))
    assert d.state.phase == R.STARTING and kinds(d)["candidate"].replicas == FOUR_TWO


def test_a_restart_mid_growth_resumes_from_status():
    d = gstep(R.State(serving_slot="a"), sized(0))
    d = gstep(d.state, sized(5, cand_of(d)))
    for t in (16, 27):
        d = gstep(d.state, sized(t, cand_of(d), good()))
    status = d.state.to_status()
    assert status["phase"] == R.STARTING and status["candidateReplicas"] == {"prefill": 2, "decode": 1}
    again = R.State.from_status(status)
    assert again == d.state
    d2 = R.decide(again, sized(30, cand_of(d, ready=False)), SIZED)
    assert kinds(d2)["candidate"].replicas == {"prefill": 2, "decode": 2 - 1} and d2.state.candidate_slot == "b"
    d3 = R.decide(again, sized(31, cand_of(d)), SIZED)
    assert (d3.state.phase, d3.state.step) == (R.CANARY, 3)
    # a status written before candidates were sized by share: one replica per role plus the in-place hand-over
    old = R.State.from_status({k: v for k, v in status.items() if k != "candidateReplicas"} | {"inPlace": 1})
    assert kinds(R.decide(old, sized(30, slot((2, 1), (2, 1))), SIZED))["candidate"].replicas == {"prefill": 2,
                                                                                                "decode": 2}


def _run(d, t, policy=POLICY, reps=FOUR_TWO, until=(R.DRAINING, R.COMPLETE), stop_at=400):
    """Passes every 5.5 s with the candidate Ready at its size and good figures, recording (phase, step, size)."""
    seen = []
    while d.state.phase not in until and t < stop_at:
        t += 5.5
        d = step(d.state, sized(t, cand_of(d), good(), reps=reps), policy)
        seen.append((d.state.phase, d.state.step, dict(d.state.candidate_replicas)))
    return d, t, seen


def test_with_the_default_surge_the_candidate_grows_to_the_serving_size_and_is_promoted_at_it():
    d = step(R.State(serving_slot="a"), sized(0))  # maxSurgeGPUs 0: the full size, 4 + 2 replicas of 4 GPUs
    assert d.state.surge_gpus == 24 and d.state.to_status()["surgeGPUs"] == 24
    d, _, seen = _run(d, 0)
    assert d.state.phase == R.DRAINING, seen
    assert R.WAITING not in [s[0] for s in seen] and "WaitingForSurgeRoom" not in [d.state.reason], seen
    grown = [s[2] for s in seen if s[0] == R.STARTING]
    assert grown[-1] == FOUR_TWO, seen  # promoted at the serving size, grown on the way


def test_the_default_surge_is_fixed_when_the_rollout_starts_so_a_planner_scale_up_waits_for_room():
    d = step(R.State(serving_slot="a"), sized(0))  # 24 GPUs of surge, fixed now
    d, t, _ = _run(d, 0, until=(R.CANARY,))
    d, t, seen = _run(d, t, reps={"prefill": 6, "decode": 2})  # the planner grew serving prefill to 6
    assert (d.state.phase, d.state.reason) == (R.CANARY, "WaitingForSurgeRoom"), seen
    assert "needs 32 GPUs (8 decode + 24 prefill); the surge 24 (maxSurgeGPUs 0: the full size) leaves 24, to grow " \
           "to prefill 6/6, decode 2/2 replicas for step 4/4 (100%)" in d.state.message, d.state.message


def test_a_surge_below_the_full_size_waits_at_the_first_growth_saying_so():
    pol = replace(POLICY, max_surge_gpus=8)  # one replica per role
    d = step(R.State(serving_slot="a"), sized(0), pol)
    d = step(d.state, sized(5, cand_of(d)), pol)
    for t in (16, 27):
        d = step(d.state, sized(t, cand_of(d), good()), pol)
    assert (d.state.phase, d.state.step, d.state.reason) == (R.CANARY, 2, "WaitingForSurgeRoom")
    assert "needs 12 GPUs (4 decode + 8 prefill); maxSurgeGPUs 8 leaves 8, to grow to prefill 2/4, decode 1/2 " \
           "replicas for step 3/4 (50%)" in d.reconciling


def test_a_promote_annotation_left_set_does_not_promote_the_next_candidate():
    d = promoted()
    act = R.Action("promote", NEW, "promote/" + NEW)
    d = step(d.state, obs(20, spec=NEW, serving=NEW, live=0, action=act))
    assert d.state.phase == R.COMPLETE
    d = step(d.state, obs(30, spec=NEWER, serving=NEW, action=act))
    assert d.state.phase == R.STARTING and d.state.candidate_revision == NEWER
    d = step(d.state, obs(35, spec=NEWER, serving=NEW, cand=READY, action=act))
    assert d.state.phase == R.CANARY and d.state.step == 1
