"""Step 5, act (planner/act.py): its rules in order, each (context, proposal) -> proposal; the reason is the words
of the rules that fired."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner_kit import BUDGETS, CFG, OK, STABLE, T, act_on, demand, observe
from planner_sim import PROFILE, SLO
from v41flash.planner import capacity
from v41flash.planner.act import (RULES, ActContext, Proposal, Verdict, act, down_fraction, partial_metrics,
                                  wait_for_capacity_in_flight)
from v41flash.planner.clamp import Claim
from v41flash.planner.datatypes import PlannerState, RoleBounds, RoleObservation, RoleReplicas, RoleState
from v41flash.planner.judge import Judgement, judge
from v41flash.planner.learn import Learned
from v41flash.planner.size import Sizing


def test_act_scales_up_at_once_to_the_need():
    a = act_on(5.3)
    assert (a.verdict.desired, a.verdict.action) == (6, "scale_up") and a.verdict.why.endswith("3 → 6")
    assert a.state.recommendations == ((T, 7),) and a.state.tracking_since == T  # ceil(5.3 × 1.15)


def test_act_ignores_a_need_within_noise_of_what_runs_unless_users_suffer():
    assert act_on(3.2).verdict.action == "hold"
    assert act_on(3.2, judged=replace(OK, breached=True)).verdict.desired == 4


def test_act_waits_for_replicas_in_flight_unless_the_demand_jumped():
    a = act_on(3.6, starting=1)
    assert a.verdict.action == "hold" and "waiting for 1 starting replica(s)" in a.verdict.why
    assert act_on(3.6, rolling=True).verdict.action == "hold"
    assert act_on(5.0, rolling=True).verdict.action == "scale_up"  # 5 > 3 × 1.25


def test_act_steps_down_only_after_a_full_stabilization_window():
    early = act_on(1.0, cur=4)
    assert early.verdict.action == "hold" and f"stabilizing (0/{STABLE:.0f}s of lower need)" in early.verdict.why
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10)
    a = act_on(1.0, cur=4, state=rs)
    assert (a.verdict.desired, a.verdict.action) == (3, "scale_down")  # prefill: one replica per step
    assert a.verdict.why.endswith(f"4 → 3 after {STABLE:.0f}s below")
    assert a.state.recommendations == ((T - 200, 2), (T, 2))
    cooling = act_on(1.0, cur=4, state=replace(rs, last_scale_time=T - 60, last_action="scale_up"))
    assert f"cooldown (60/{CFG.act.scale_down_cooldown_s:.0f}s since the last scale-up)" in cooling.verdict.why
    old = RoleState(recommendations=((T - STABLE - 1, 4),), tracking_since=T - STABLE - 10)
    assert act_on(1.0, cur=4, state=old).state.recommendations == ((T, 2),)  # out of the window: forgotten


def test_decode_may_shed_a_share_of_its_replicas_at_once():
    rs = RoleState(recommendations=((T - 200, 1),), tracking_since=T - STABLE - 10)
    a = act_on(0.5, cur=12, state=rs, role="decode", bounds=RoleBounds(1, 20))
    assert a.verdict.desired == 12 - math.floor(12 * CFG.act.max_scale_down_fraction)
    assert down_fraction("prefill", True, CFG) == down_fraction("decode", False, CFG) == CFG.act.prompt_scale_down_fraction


def test_act_never_scales_down_on_partial_data_and_says_so():
    rs = RoleState(recommendations=((T - 200, 1),), tracking_since=T - STABLE - 10)
    a = act_on(1.0, cur=4, state=rs, judged=replace(OK, data="partial", data_why="1 pod(s) missing (p-3)"))
    assert a.verdict.action == "hold" and "no scale-down on partial metrics" in a.verdict.why
    assert a.verdict.why.endswith("[partial metrics: 1 pod(s) missing (p-3)]")
    assert a.state.recommendations == () and a.state.tracking_since is None  # the window restarts


def test_act_holds_without_a_need_and_when_autoscaling_is_off():
    rs = RoleState(recommendations=((T - 10, 2),), tracking_since=T - 10)
    a = act_on(None, judged=replace(OK, data="stale", data_why="metrics are 600s old (> 120s)"), state=rs)
    assert a.verdict == Verdict(3, "hold", "hold: metrics are 600s old (> 120s); no scaling on stale metrics")
    assert a.state.recommendations == ()
    off = act_on(8.0, bounds=RoleBounds(1, 10, autoscale=False), state=rs)
    assert off.verdict == Verdict(3, "hold", "autoscaling is off for prefill: replicas are left to their owner")


def test_act_steps_up_on_a_breach_the_model_cannot_explain():
    stuck = Learned(PlannerState(), CFG.learn.correction_max, 1.0, demand())
    obs = RoleObservation(RoleReplicas(3, 3), observe(10, prefill=3).prefill.window)
    a = act(ActContext("prefill", obs, RoleBounds(1, 10), replace(OK, breached=True), 10.0,
                       Sizing(capacity.Need(2.0, True)), stuck, True, SLO, BUDGETS, RoleState(), T, CFG))
    assert a.verdict.desired == 4 and "(model at its correction limit; +1 on the observed breach)" in a.verdict.why


# ------------------------------------------------------------------ the rules
def test_the_rules_run_in_the_documented_order():
    assert [r.__name__ for r in RULES] == [
        "autoscaling_off", "no_need",
        "need", "within_noise", "step_up_at_correction_limit", "proven_capacity", "foreseen_capacity",
        "breach_proportional", "breach_step", "scale_up_stabilization",
        "learn_down_margin", "down_recommendation", "proven_down", "outage_memory", "stabilization_window",
        "unattainable",
        "cancel_on_clear", "wait_for_capacity_in_flight", "scale_up", "no_scale_down_on_incomplete_data",
        "current_fits", "down_blocked", "cancel_not_serving", "moved_sessions_guard", "overshoot_down", "step_down",
        "partial_metrics",
    ]
    assert all(f"``{r.__name__}``" in act.__doc__ for r in RULES)  # the docstring lists every rule


def test_the_reason_is_the_words_of_the_rules_that_fired():
    up = act_on(5.3)
    assert up.rules == ("need", "down_recommendation", "stabilization_window", "scale_up")
    assert up.verdict.why == ("no latency samples in window; demand 10.00 req/s × 12.0k ISL (50% cached) needs 5.3 "
                              "prefill replicas at correction 1.00; 3 → 6")  # need's words, then scale_up's
    noise = act_on(3.2)
    assert noise.rules == ("need", "within_noise", "down_recommendation", "stabilization_window", "current_fits")
    assert noise.verdict.why.endswith("; 3 fit")
    off = act_on(8.0, bounds=RoleBounds(1, 10, autoscale=False))
    assert off.rules == ("autoscaling_off",)  # a final rule: nothing after it runs
    partial = act_on(1.0, cur=4, judged=replace(OK, data="partial", data_why="1 pod(s) missing (p-3)"))
    assert partial.rules[-2:] == ("no_scale_down_on_incomplete_data", "partial_metrics")


def test_a_rule_passes_a_proposal_it_does_not_apply_to():
    obs = RoleObservation(RoleReplicas(3, 3), observe(10, prefill=3).prefill.window)
    ctx = ActContext("prefill", obs, RoleBounds(1, 10), OK, 10.0, Sizing(capacity.Need(5.3, True)),
                     Learned(PlannerState(), 1.0, 1.0, demand()), True, SLO, BUDGETS, RoleState(), T, CFG)
    decided = Proposal(desired=3, state=RoleState(), up_target=6, decided=True)
    for rule in RULES[RULES.index(wait_for_capacity_in_flight):RULES.index(partial_metrics)]:  # the deciding rules
        assert rule(ctx, decided) is decided
    assert ctx.current == 3 and ctx.correction == 1.0 and ctx.need.replicas == 5.3


# ------------------------------------------------------------------ frozen data between the steps
def claim(role, desired, current):
    return Claim(role, Verdict(desired, "hold", "why"), current, RoleBounds(1, 20), 4, float(desired))


def test_steps_exchange_frozen_data():
    j = judge(observe(10), PROFILE, SLO, BUDGETS, T, CFG)
    for value in (j, j.decode, BUDGETS, demand(), Sizing(None), Verdict(1, "hold", ""), claim("decode", 1, 1),
                  Proposal(1, RoleState()), CFG, CFG.act):
        with pytest.raises(AttributeError):
            value.__setattr__("x", 1)
    assert isinstance(j, Judgement)
