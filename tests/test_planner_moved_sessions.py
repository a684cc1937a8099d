"""A scale-down of a role that computes prompts moves 1/N of the sessions, and each moved session's next turn
re-prefills its whole context: when that share is above the TTFT percentile's tail and one full-context prefill
is slower than the TTFT budget, the scale-down itself breaks the next window (tuning seeds 12, 13, 18, 21 of the
autoscale suite lost their windows exactly so). The planner holds such scale-downs and says why."""
from __future__ import annotations

from dataclasses import replace

from planner_sim import PROFILE, SLO
from planner_kit import BUDGETS, CFG, OK, STABLE, T, act_on, demand, observe
from v41flash.planner import capacity
from v41flash.planner.datatypes import PlannerState, RoleBounds, RoleState, Slo
from v41flash.planner.act import ActContext, Verdict, act, remember
from v41flash.planner.learn import Learned
from v41flash.planner.size import Sizing, moved_sessions_checks, size

LONG = 150_000.0  # an agent context whose full prefill (~2.9 s on the test profile) exceeds the 1.48 s budget


def learned(isl: float, k: float = 1.0, rate: float = 10.0) -> Learned:
    return Learned(PlannerState(), k, 1.0, replace(demand(rate), isl=isl, hit_rate=0.97))


def guard(cur: int, isl: float = LONG, slo: Slo = SLO, role="prefill", disagg=True, cfg=CFG, k=1.0, rate=10.0) -> str:
    tail, overload = moved_sessions_checks(role, disagg, cur, learned(isl, k, rate), BUDGETS, PROFILE, slo, cfg)
    return tail or overload


def test_the_premise_one_full_context_prefill_is_slower_than_the_budget():
    assert PROFILE.prefill.request_seconds(LONG, 0) > BUDGETS.prefill_ttft_s > PROFILE.prefill.request_seconds(12_000, 0)


def test_a_small_fleet_with_long_contexts_holds_its_replicas_and_says_why():
    why = guard(5)  # 20 % of the sessions move, the p90 tail is 10 %
    assert "move 20% of the sessions" in why and "p90 tail of 10%" in why and "150.0k-token context" in why


def test_a_fleet_large_enough_that_the_moved_share_fits_the_tail_may_shrink():
    assert guard(11) == ""  # 9 % ≤ 10 %
    assert guard(11, slo=replace(SLO, ttft_percentile=0.95)) != ""  # ... but not under a p95 target
    assert guard(21, slo=replace(SLO, ttft_percentile=0.95)) == ""


def test_short_contexts_re_prefill_within_budget_and_shrink():
    assert guard(2, isl=12_000, rate=2.0) == ""
    assert guard(2, isl=12_000, rate=2.0, k=10.0) != ""  # ... unless prefill is measured far slower than the profile


def test_no_scale_down_whose_moved_turns_the_replicas_left_cannot_prefill():
    p95 = replace(SLO, ttft_percentile=0.95)
    # 21 replicas: 4.8 % of the sessions move (within the p90 tail); at 97 % hits a moved turn is ~20× a cached one
    cached = PROFILE.prefill.request_seconds(LONG * 0.03, LONG * 0.97)
    assert PROFILE.prefill.request_seconds(LONG, 0) > 15 * cached
    assert guard(21, rate=10.0) == ""  # 24 % busy during the moved turns
    why = guard(21, rate=45.0)  # 1.7× the ~12.5 replicas the queueing model needs at 45 req/s, but ...
    assert why.startswith("the 20 replicas left would be 107% busy while the 5% of sessions")
    assert guard(19, rate=10.0, slo=p95).startswith("a scale-down would move 5% of the sessions (> the p95 tail")


def test_decode_in_p_d_moves_no_prefix_and_an_aggregated_role_does():
    assert guard(5, role="decode") == ""
    assert guard(5, role="decode", disagg=False) != ""
    assert guard(5, cfg=CFG.with_knobs(guard_moved_sessions=False)) == ""
    assert guard(1) == ""  # nothing to remove


def test_act_holds_the_scale_down_the_guard_names_and_scales_up_as_before():
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10)
    obs = observe(10, prefill=5).prefill
    why = guard(5)

    def run(need, g, state=rs):
        return act(ActContext("prefill", obs, RoleBounds(1, 10), OK, 10.0,
                              Sizing(capacity.Need(need, True), down_guard=g), learned(LONG), True, SLO, BUDGETS,
                              state, T, CFG))

    held = run(1.0, why)
    assert held.verdict.action == "hold" and why in held.verdict.why
    assert run(1.0, "").verdict.action == "scale_down"  # the control: without the guard it shrinks
    assert run(7.2, why).verdict.desired == 8  # the guard never stops a scale-up
    assert act_on(1.0, cur=4, state=rs).verdict.action == "scale_down"  # short test contexts: unchanged


def test_sizing_sets_the_guard_from_the_role_s_current_replicas():
    obs = observe(10, prefill=5)
    s = size("prefill", 10.0, obs.prefill, True, learned(LONG), BUDGETS, PROFILE, SLO, CFG)
    assert s.down_guard == guard(5) != ""
    assert size("prefill", 10.0, obs.prefill, True, learned(12_000), BUDGETS, PROFILE, SLO, CFG).down_guard == ""


def _hold_run(state: RoleState, now: float, cfg=CFG, need: float = 1.0, g: str | None = None, judged=OK,
              overload: bool = False):
    obs = observe(10, prefill=5).prefill
    return act(ActContext("prefill", obs, RoleBounds(1, 10), judged, 10.0,
                          Sizing(capacity.Need(need, True), down_guard=guard(5) if g is None else g,
                                 down_guard_overload=overload),
                          learned(LONG), True, SLO, BUDGETS, state, now, cfg))


def test_the_guard_holds_a_scale_down_for_moved_sessions_hold_s_then_removes_one_replica_and_holds_again():
    """Holding for ever keeps a fleet sized for a peak through every trough (fewer than 1 / (1 − p) replicas
    never shrink): after the hold, one replica goes, and the hold starts again from there."""
    cfg = CFG.with_knobs(moved_sessions_hold_s=3600.0)
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10)
    first = _hold_run(rs, T, cfg)
    assert first.verdict.action == "hold" and "(held 0/3600s)" in first.verdict.why
    assert first.state.guard_held_since == T
    later = _hold_run(replace(first.state, recommendations=((T + 3000, 2),)), T + 3599, cfg)
    assert later.verdict.action == "hold" and "(held 3599/3600s)" in later.verdict.why
    assert later.state.guard_held_since == T  # the hold is counted from when it began
    due = _hold_run(replace(later.state, recommendations=((T + 3500, 2),)), T + 3600, cfg)
    assert (due.verdict.desired, due.verdict.action, due.verdict.moves_sessions) == (4, "scale_down", True)
    assert "after the moved-sessions guard held it 3600s" in due.verdict.why
    assert "may breach for about one turn" in due.verdict.why
    assert due.state.guard_held_since is None  # the next scale-down waits a whole hold again


def test_the_hold_restarts_whenever_the_guard_is_not_what_holds_and_zero_holds_for_ever():
    cfg = CFG.with_knobs(moved_sessions_hold_s=3600.0)
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10, guard_held_since=T - 3000)
    # a breach: the SLO holds the scale-down, not the guard; the hold begins again afterwards
    assert _hold_run(rs, T, cfg, judged=replace(OK, breached=True)).state.guard_held_since is None
    # the need came back up: no scale-down wanted, nothing held
    assert _hold_run(rs, T, cfg, need=4.8).state.guard_held_since is None
    # the guard no longer applies (say, more replicas): a plain scale-down, not one that moves sessions past it
    plain = _hold_run(rs, T, cfg, g="")
    assert plain.verdict.action == "scale_down" and not plain.verdict.moves_sessions
    never = _hold_run(replace(rs, guard_held_since=T - 10 * 86400), T, cfg.with_knobs(moved_sessions_hold_s=0.0))
    assert never.verdict.action == "hold" and "held" not in never.verdict.why.rsplit(":", 1)[-1]


def test_a_breach_after_a_scale_down_past_the_guard_teaches_no_scale_down_margin():
    """That breach was expected (the moved sessions' re-prefill), not the model's error: learning a margin from it
    (replicas before ÷ need, up to ×2) would stop every later scale-down."""
    past = remember(RoleState(), Verdict(4, "scale_down", "", moves_sessions=True), 5, 1.0, T)
    assert (past.last_action, past.last_scale_time, past.last_down_from, past.last_down_need) == ("scale_down", T, 5, None)
    plain = remember(RoleState(), Verdict(4, "scale_down", ""), 5, 1.0, T)
    assert plain.last_down_need == 1.0  # the control: an ordinary scale-down is judged by the breach after it
    rs = RoleState(last_action="scale_down", last_scale_time=T - 60, last_down_from=5, last_down_need=None)
    breach = _hold_run(rs, T, CFG.with_knobs(moved_sessions_hold_s=3600.0), judged=replace(OK, breached=True), need=4.8)
    assert breach.state.down_margin_learned == 0.0 and "scale-down margin" not in breach.verdict.why


def test_a_scale_down_whose_moved_turns_would_overload_the_replicas_left_is_held_however_long():
    cfg = CFG.with_knobs(moved_sessions_hold_s=3600.0)
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10, guard_held_since=T - 86400)
    held = _hold_run(rs, T, cfg, g=guard(21, rate=45.0), overload=True)
    assert held.verdict.action == "hold" and "busy while" in held.verdict.why and "(held" not in held.verdict.why
    # size() tells the two apart: the tail alone (2 req/s on 5 replicas) is holdable, the overload (45 on 21) is not
    tail = size("prefill", 2.0, observe(2, prefill=5).prefill, True, learned(LONG, rate=2.0), BUDGETS, PROFILE, SLO,
                CFG)
    assert tail.down_guard and not tail.down_guard_overload
    over = size("prefill", 45.0, observe(45, prefill=21).prefill, True, learned(LONG, rate=45.0), BUDGETS, PROFILE,
                SLO, CFG)
    assert over.down_guard.startswith("the 20 replicas left") and over.down_guard_overload


def test_a_scale_down_step_as_large_as_the_fleet_leaves_one_replica_to_judge():
    """max_scale_down_step ≥ the replicas (e.g. --planner-set max_scale_down_step=2 at 2 replicas): every session
    moves and one replica is left, never zero (it divided by zero)."""
    cfg = CFG.with_knobs(max_scale_down_step=2)
    assert guard(2, cfg=cfg, rate=10.0).startswith("a scale-down would move 100% of the sessions")
    tail, overload = moved_sessions_checks("prefill", True, 2, learned(LONG, 1.0, 10.0), BUDGETS, PROFILE, SLO, cfg)
    assert overload.startswith("the 1 replicas left would be")
