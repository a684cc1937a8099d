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
    return R.Observed(now=T0 + t, spec_revision=spec, serving_revision=serving, gpus_per_replica=GPUS,
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
    assert "needs 8 GPUs: prefill: 0/6 nodes" in d.reconciling
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
    assert k["serving"].minus == 1 and k["candidate"].replicas == {"prefill": 2, "decode": 2}
    one_ready = slot(prefill=(2, 2), decode=(2, 2))
    d = step(d.state, obs(5, serving_replicas=two, cand=one_ready, serving_obs=slot((1, 1), (1, 1))), pol)
    assert d.state.phase == R.CANARY and d.state.step == 1
    # step 1 passes; the serving slot has 1 replica per role left after the hand-over: no second hand-over
    d = step(d.state, obs(16, serving_replicas=two, cand=one_ready, fig=good(), serving_obs=slot((1, 1), (1, 1))), pol)
    assert d.state.phase == R.CANARY and d.state.in_place == 1 and d.state.step == 2
    for p in d.slots:
        if p.kind == "serving":
            assert min(two.values()) - p.minus >= 1


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
                   drain_started_at=T0, in_place=1, reason="r", message="m", gate=(("ttft", "x"),),
                   last_action=d.state.last_action)
    status = full.to_status()
    assert set(status) <= set(schema["properties"]), set(status) - set(schema["properties"])
    assert set(status["lastAction"]) <= set(schema["properties"]["lastAction"]["properties"])
    assert R.State.from_status(status) == full


def test_candidate_figures_from_its_own_windows():
    from v41flash.metrics.figures import RouterFigures, WindowFigures
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
