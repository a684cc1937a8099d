"""The planner's steps one by one (plan() composes them; tests/test_planner.py tests the composition)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner_sim import ISL, OSL, OSL95, PROFILE, SLO, truth, windows
from v41flash.metrics.figures import RouterFigures
from v41flash.planner import capacity
from v41flash.planner.datatypes import (
    Observation,
    PlannerConfig,
    PlannerState,
    RoleBounds,
    RoleObservation,
    RoleReplicas,
    RoleState,
    Slo,
)
from v41flash.planner.steps import (
    ASSUMED_OUTPUT_TOKENS,
    Budgets,
    Claim,
    Demand,
    Judgement,
    Learned,
    RoleJudgement,
    Sizing,
    Verdict,
    act,
    clamp,
    data_status,
    down_fraction,
    forecast,
    judge,
    learn,
    predict,
    size,
    split_slo,
    workload_demand,
)

T = 1_000_000.0
CFG = PlannerConfig()


def observe(rate, prefill=2, decode=1, t=T, kp=1.0, kd=1.0, pw=None, dw=None, rolling=False, prefill_starting=0,
            starting_for_s=()):
    p, d = windows(rate, prefill, decode, t, kp, kd)
    return Observation(
        prefill=RoleObservation(RoleReplicas(prefill + prefill_starting, prefill, prefill_starting, starting_for_s),
                                replace(p, **(pw or {})), rolling),
        decode=RoleObservation(RoleReplicas(decode, decode), replace(d, **(dw or {}))),
    )


def aggregated(rate, replicas=2, t=T, **dw):
    p, d = windows(rate, replicas, replicas, t)
    d = replace(d, ttft_s=p.ttft_s, prefix_cache_hit_rate=0.5, **dw)
    return Observation(decode=RoleObservation(RoleReplicas(replicas, replicas), d))


def steps_to_learned(obs, state=PlannerState(), cfg=CFG):
    demand = workload_demand(obs)
    budgets = split_slo(demand, SLO, PROFILE, obs.prefill is not None)
    judged = judge(obs, PROFILE, SLO, budgets, T, cfg)
    return demand, budgets, judged, learn(obs, judged, demand, budgets, PROFILE, state, cfg, T)


OK = RoleJudgement("prefill", "ok", "", breached=False)
BUDGETS = Budgets(itl_s=(SLO.e2e_p95_s - SLO.ttft_s) / OSL95, handover_s=0.02, prefill_ttft_s=1.48)


# ------------------------------------------------------------------ demand and the SLO split
def test_demand_scales_the_rate_up_for_pods_that_did_not_report():
    obs = observe(10, prefill=4, pw={"pods_observed": 3, "missing_pods": ("p-3",)})
    d = workload_demand(obs)
    assert d.prefill_rate == pytest.approx(10 * 4 / 3) and d.decode_rate == 10
    assert (d.isl, d.hit_rate, d.osl, d.osl_p95) == (ISL, 0.5, OSL, OSL95)
    assert d.new_tokens == d.cached_tokens == ISL / 2 and d.context == ISL + OSL / 2


def test_demand_of_an_aggregated_deployment_comes_from_its_one_role():
    d = workload_demand(aggregated(6, waiting=12.0))
    assert d.prefill_rate == d.decode_rate == 6 and d.hit_rate == 0.5
    assert d.prefill_backlog == d.decode_backlog == 12.0


def test_demand_without_a_p95_output_length_assumes_twice_the_mean():
    d = workload_demand(observe(10, dw={"output_tokens_p95": None}))
    assert d.osl_p95 == 2 * OSL


def test_the_slo_split_gives_decode_the_e2e_headroom_per_token_and_prefill_the_rest():
    d = workload_demand(observe(10))
    b = split_slo(d, SLO, PROFILE, disaggregated=True)
    assert b.itl_s == pytest.approx((SLO.e2e_p95_s - SLO.ttft_s) / OSL95)
    assert b.handover_s == pytest.approx(PROFILE.kv_transfer.seconds(ISL) + b.itl_s)
    assert b.prefill_ttft_s == pytest.approx(SLO.ttft_s - b.handover_s)
    agg = split_slo(d, SLO, PROFILE, disaggregated=False)
    assert agg.handover_s == 0.0 and agg.prefill_ttft_s == SLO.ttft_s and agg.itl_s == b.itl_s


def test_the_slo_split_of_an_empty_window_assumes_a_typical_answer():
    empty = Demand(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    b = split_slo(empty, SLO, PROFILE, disaggregated=True)
    assert b.itl_s == pytest.approx((SLO.e2e_p95_s - SLO.ttft_s) / (2 * ASSUMED_OUTPUT_TOKENS))
    assert split_slo(empty, replace(SLO, itl_s=0.05), PROFILE, True).itl_s == 0.05  # an explicit target wins
    tight = split_slo(empty, Slo(ttft_s=0.001, e2e_p95_s=20.0), PROFILE, True)
    assert tight.prefill_ttft_s == 1e-3  # never a zero or negative budget


# ------------------------------------------------------------------ 1. judge
def test_data_status_names_what_is_wrong():
    obs = observe(10, prefill=3).prefill
    assert data_status(obs, T, CFG) == ("ok", "")
    assert data_status(replace(obs, window=None), T, CFG) == ("missing", "no metrics for this role")
    assert data_status(obs, T + 600, CFG) == ("stale", "metrics are 600s old (> 120s)")
    silent = replace(obs, window=replace(obs.window, pods_observed=0))
    assert data_status(silent, T, CFG) == ("missing", "no pod of 3 answered its metrics scrape")
    partial = replace(obs, window=replace(obs.window, pods_observed=2, missing_pods=("p-2",)))
    assert data_status(partial, T, CFG) == ("partial", "1 pod(s) missing (p-2)")


def test_data_status_says_why_a_pod_is_missing():
    """The scrape's error (byte cap, deadline) reaches the hold's reason: a flooding or dripping pod is named."""
    obs = observe(10, prefill=2).prefill
    cap = "p-0: http://127.1.1.5:8000/metrics: body over 8388608 bytes"
    late = "p-1: timeout: no whole page from http://127.1.1.6:8000/metrics within 5 s"
    silent = replace(obs, window=replace(obs.window, pods_observed=0, missing_pods=("p-0", "p-1"),
                                         notes=("p-2: appeared mid-window", cap, late)))
    assert data_status(silent, T, CFG) == ("missing", f"no pod of 2 answered its metrics scrape ({cap}; {late})")
    partial = replace(obs, window=replace(obs.window, pods_observed=1, missing_pods=("p-0",), notes=(cap,)))
    assert data_status(partial, T, CFG) == ("partial", f"1 pod(s) missing ({cap})")


def test_a_ttft_breach_is_prefill_s_to_fix():
    obs = observe(14, prefill=2)
    assert truth(14, 2, 1)["ttft"] > SLO.ttft_s
    j = judge(obs, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.prefill.breached and not j.decode.breached
    assert j.prefill.observed_ttft_s == pytest.approx(obs.prefill.window.ttft_s + obs.decode.window.ttft_mean_s)
    assert j.prefill.observed_e2e_p95_s is None and j.decode.observed_ttft_s is None
    assert j.decode.observed_itl_s == obs.decode.window.itl_mean_s
    assert j.role("prefill") is j.prefill and j.notes == ()


def test_an_e2e_breach_goes_to_decode_when_its_itl_is_over_budget_else_to_prefill():
    slow_decode = observe(8, prefill=3, dw={"e2e_p95_s": 30.0, "itl_mean_s": 0.05})
    j = judge(slow_decode, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.decode.breached and not j.prefill.breached
    fast_decode = observe(8, prefill=3, dw={"e2e_p95_s": 30.0, "itl_mean_s": 0.001})
    j = judge(fast_decode, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.prefill.breached  # the time went before the first token


def test_router_latency_replaces_the_summed_e2e_and_too_few_requests_are_not_judged():
    obs = replace(observe(8, prefill=3), router=RouterFigures(start=T - 60, end=T, requests=100, e2e_p95_s=31.0))
    assert judge(obs, PROFILE, SLO, BUDGETS, T, CFG).decode.observed_e2e_p95_s == 31.0
    few = observe(14, prefill=2, pw={"requests": 5.0}, dw={"requests": 5.0})
    j = judge(few, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.prefill.observed_ttft_s is None and j.decode.observed_itl_s is None and not j.prefill.breached


def test_aggregated_breaches_are_the_one_role_s():
    obs = aggregated(14)
    j = judge(obs, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.prefill is None and j.decode.breached and j.decode.observed_ttft_s == obs.decode.window.ttft_s


def test_replicas_stuck_starting_become_a_note():
    obs = observe(8, prefill=2, prefill_starting=2, starting_for_s=(30.0, 1300.0))
    j = judge(obs, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.notes == ("1 prefill replica(s) starting for over 1300s (> 2× the profile's 600s cold start): check their pods",)


# ------------------------------------------------------------------ 2. learn
def test_learning_moves_the_corrections_towards_the_truth_and_floors_prefill_by_its_service_time():
    _, _, _, learned = steps_to_learned(observe(14, prefill=4, kp=1.3, kd=0.7))
    p, d = learned.state.prefill, learned.state.decode
    assert 1.0 < p.correction < 1.3 and 0.7 < d.correction < 1.0  # one smoothed step, not the whole way
    assert p.corrections_learned == d.corrections_learned == 1
    assert p.service_correction == pytest.approx(1.3)  # measured prefill time: taken whole at first
    assert learned.prefill_correction == pytest.approx(1.3)  # floored by the measured service time
    assert learned.decode_correction == d.correction


def test_learning_is_bounded():
    _, _, _, learned = steps_to_learned(observe(8, prefill=4, kp=5.0), PlannerState(prefill=RoleState(correction=1.9)))
    assert learned.state.prefill.correction == CFG.correction_max


@pytest.mark.parametrize("spoil", ["rolling", "partial", "few"])
def test_nothing_is_learned_from_untrustworthy_windows(spoil):
    obs = {"rolling": observe(14, prefill=4, kp=1.3, rolling=True),
           "partial": observe(14, prefill=4, kp=1.3, pw={"partial_pods": ("p-0",)}),
           "few": observe(0.2, prefill=4, kp=1.3)}[spoil]
    state = PlannerState(prefill=RoleState(correction=1.1, hit_level=0.3))
    _, _, _, learned = steps_to_learned(obs, state)
    assert learned.state.prefill == state.prefill
    assert learned.sized.hit_rate == 0.3  # sized at the remembered hit level, not this window's 50 %


def test_the_hit_level_is_smoothed_and_sizing_uses_it():
    _, _, _, learned = steps_to_learned(observe(10, prefill=3), PlannerState(prefill=RoleState(hit_level=0.8)))
    assert learned.state.prefill.hit_level == pytest.approx(0.2 * 0.5 + 0.8 * 0.8)
    assert learned.sized.hit_rate == pytest.approx(0.74)
    demand, _, _, fresh = steps_to_learned(observe(10, prefill=3))
    assert fresh.sized == demand  # the first level is the window's own


def test_a_breach_sizes_at_the_window_s_hit_level_when_it_is_lower_and_remembers_the_smoothed_one():
    hurt = {"ttft_s": SLO.ttft_s * 2}
    _, _, judged, learned = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.8)))
    assert judged.prefill.breached
    assert learned.state.prefill.hit_level == pytest.approx(0.74)  # the level learns as always
    assert learned.sized.hit_rate == 0.5  # but this window's misses are sized while users wait
    _, _, _, higher = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.3)))
    assert higher.sized.hit_rate == pytest.approx(0.34)  # a better window than the level: still the level
    off = replace(CFG, breach_hit_level=False)
    _, _, _, was = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.8)), off)
    assert was.sized.hit_rate == pytest.approx(0.74)


def test_after_a_scale_down_a_breach_sizes_at_the_window_s_hit_level_only_in_a_wave_of_new_sessions():
    hurt = {"ttft_s": SLO.ttft_s * 2}
    shed = RoleState(hit_level=0.8, share_level=0.1, last_action="scale_down", last_scale_time=T - 120)

    def learned_at(new_per_s, rs=shed, cfg=CFG):
        obs = replace(observe(10, prefill=3, pw=hurt),
                      router=RouterFigures(start=T - 60, end=T, arrival_rate=10.0, new_session_rate=new_per_s))
        return steps_to_learned(obs, PlannerState(prefill=rs), cfg)[3]

    moved = learned_at(1.0)  # the usual share of new sessions: the misses are the sessions the scale-down moved
    assert moved.sized.hit_rate == pytest.approx(0.74) and moved.state.prefill.share_level == pytest.approx(0.1)
    wave = learned_at(2.0)  # a fifth of arrivals are new sessions where a tenth were: a wave
    assert wave.sized.hit_rate == 0.5
    assert wave.state.prefill.share_level == pytest.approx(0.8 * 0.1 + 0.2 * 0.2)  # it learns with the hit level
    # a wave is a share above its level × (1 + proven_share_slack) + 0.01: 0.135 here
    assert learned_at(1.4).sized.hit_rate == 0.5 and learned_at(1.3).sized.hit_rate == pytest.approx(0.74)
    # no scale-down within down_breach_window_s, a scale-up, no level learned yet, the gate off: the window's own
    assert learned_at(1.0, replace(shed, last_scale_time=T - CFG.down_breach_window_s)).sized.hit_rate == 0.5
    assert learned_at(1.0, replace(shed, last_action="scale_up")).sized.hit_rate == 0.5
    assert learned_at(1.0, replace(shed, share_level=None)).sized.hit_rate == 0.5
    assert learned_at(1.0, cfg=replace(CFG, breach_share_gate=False)).sized.hit_rate == 0.5
    unknown = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=shed))[3]
    assert unknown.sized.hit_rate == 0.5 and unknown.state.prefill.share_level == 0.1  # no proxy: no gate, no learning


def test_aggregated_learning_puts_the_prefill_correction_in_prefill_state_and_the_hit_level_in_decode_s():
    _, _, _, learned = steps_to_learned(aggregated(10, replicas=3))
    assert learned.state.prefill.corrections_learned == 1 and learned.state.decode.corrections_learned == 1
    assert learned.state.decode.hit_level == 0.5 and learned.state.prefill.hit_level is None


# ------------------------------------------------------------------ 3. forecast
def demand(rate=10.0, backlog=0.0):
    return Demand(rate, rate, ISL, 0.5, OSL, OSL95, backlog, backlog)


def test_the_first_forecast_is_the_observed_rate_plus_the_backlog_to_drain():
    fc = forecast(OK, demand(10.0, backlog=30.0), True, 600.0, RoleState(), T, CFG)
    assert fc.demand_rate == pytest.approx(10.0 + 30.0 / CFG.backlog_drain_s)
    assert (fc.state.rate_level, fc.state.rate_trend, fc.state.rate_time, fc.state.last_waiting) == (10.0, 0.0, T, 30.0)


def test_a_rising_rate_is_forecast_ahead_but_capped():
    rs = RoleState(rate_level=8.0, rate_trend=0.05, rate_time=T - 30)
    fc = forecast(OK, demand(12.0), True, 600.0, rs, T, CFG)
    level = fc.state.rate_level
    assert 8.0 < level < 12.0 and fc.state.rate_trend > 0.05
    assert level < fc.demand_rate <= level * CFG.max_forecast_growth


def test_a_breach_sizes_for_the_raw_rate_when_the_smoothed_one_lags():
    rs = RoleState(rate_level=4.0, rate_time=T - 30)
    calm = forecast(OK, demand(12.0), True, 600.0, rs, T, CFG)
    hurt = forecast(replace(OK, breached=True), demand(12.0), True, 600.0, rs, T, CFG)
    assert calm.demand_rate < 12.0 and hurt.demand_rate == 12.0 and hurt.state == calm.state


def test_decode_forecasts_its_own_rate_and_backlog():
    d = Demand(10.0, 7.0, ISL, 0.5, OSL, OSL95, 100.0, 14.0)
    fc = forecast(replace(OK, role="decode"), d, False, 600.0, RoleState(), T, CFG)
    assert fc.demand_rate == pytest.approx(7.0 + 14.0 / CFG.backlog_drain_s)


def test_unusable_data_forecasts_nothing_and_forgets_the_queue():
    rs = RoleState(rate_level=8.0, rate_trend=0.01, rate_time=T - 30, last_waiting=5.0)
    fc = forecast(replace(OK, data="stale"), demand(12.0), True, 600.0, rs, T, CFG)
    assert fc.demand_rate is None and fc.state == replace(rs, last_waiting=None)


# ------------------------------------------------------------------ 4. size
def learned_for(obs):
    return steps_to_learned(obs)[3]


def test_sizing_prefill_and_decode_meets_their_budgets_at_the_demand():
    obs = observe(14, prefill=2)
    lrn = learned_for(obs)
    budgets = split_slo(workload_demand(obs), SLO, PROFILE, True)
    p = size("prefill", 14.0, obs.prefill, True, lrn, budgets, PROFILE, SLO, CFG).need
    d = size("decode", 14.0, obs.decode, True, lrn, budgets, PROFILE, SLO, CFG).need
    assert p.feasible and d.feasible and 2.0 < p.replicas < 3.0 and 0.0 < d.replicas < 1.0
    s = lrn.sized
    assert capacity.prefill_ttft(PROFILE.prefill, 14.0, p.replicas, s.new_tokens, s.cached_tokens, 0.9,
                                 lrn.prefill_correction, cs2=CFG.service_cv2) <= budgets.prefill_ttft_s + 1e-9
    assert capacity.decode_itl(PROFILE.decode, 14.0, d.replicas, OSL, s.context, lrn.decode_correction) <= budgets.itl_s
    assert size("prefill", None, obs.prefill, True, lrn, budgets, PROFILE, SLO, CFG) == Sizing(need=None)


def test_a_full_kv_cache_sizes_decode_by_memory():
    obs = observe(8, prefill=3, decode=2, dw={"kv_cache_usage": 0.97})
    lrn = learned_for(obs)
    s = size("decode", 8.0, obs.decode, True, lrn, BUDGETS, PROFILE, SLO, CFG)
    assert s.need.replicas == pytest.approx(2 * 0.97 / CFG.kv_cache_target)
    assert s.kv_note == "KV cache 97% full (85% target)"


def test_an_aggregated_role_is_sized_for_both_phases():
    obs = aggregated(14, replicas=2)
    lrn = learned_for(obs)
    budgets = split_slo(workload_demand(obs), SLO, PROFILE, False)
    both = size("decode", 14.0, obs.decode, False, lrn, budgets, PROFILE, SLO, CFG).need
    decode_only = size("decode", 14.0, obs.decode, True, lrn, budgets, PROFILE, SLO, CFG).need
    assert both.replicas > decode_only.replicas + 2.0  # the prompts' share comes on top


# ------------------------------------------------------------------ 5. act
def act_on(need, cur=3, judged=OK, bounds=RoleBounds(1, 10), state=RoleState(), now=T, starting=0, rolling=False,
           cfg=CFG, role="prefill"):
    obs = RoleObservation(RoleReplicas(cur, cur - starting, starting), observe(10, prefill=cur).prefill.window, rolling)
    lrn = Learned(PlannerState(), 1.0, 1.0, demand())
    sizing = Sizing(None if need is None else capacity.Need(need, True))
    return act(role, obs, bounds, replace(judged, role=role), 10.0, sizing, lrn, True, SLO, BUDGETS, state, now, cfg)


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


STABLE = CFG.scale_down_stabilization_s


def test_act_steps_down_only_after_a_full_stabilization_window():
    early = act_on(1.0, cur=4)
    assert early.verdict.action == "hold" and f"stabilizing (0/{STABLE:.0f}s of lower need)" in early.verdict.why
    rs = RoleState(recommendations=((T - 200, 2),), tracking_since=T - STABLE - 10)
    a = act_on(1.0, cur=4, state=rs)
    assert (a.verdict.desired, a.verdict.action) == (3, "scale_down")  # prefill: one replica per step
    assert a.verdict.why.endswith(f"4 → 3 after {STABLE:.0f}s below")
    assert a.state.recommendations == ((T - 200, 2), (T, 2))
    cooling = act_on(1.0, cur=4, state=replace(rs, last_scale_time=T - 60, last_action="scale_up"))
    assert f"cooldown (60/{CFG.scale_down_cooldown_s:.0f}s since the last scale-up)" in cooling.verdict.why
    old = RoleState(recommendations=((T - STABLE - 1, 4),), tracking_since=T - STABLE - 10)
    assert act_on(1.0, cur=4, state=old).state.recommendations == ((T, 2),)  # out of the window: forgotten


def test_decode_may_shed_a_share_of_its_replicas_at_once():
    rs = RoleState(recommendations=((T - 200, 1),), tracking_since=T - STABLE - 10)
    a = act_on(0.5, cur=12, state=rs, role="decode", bounds=RoleBounds(1, 20))
    assert a.verdict.desired == 12 - math.floor(12 * CFG.max_scale_down_fraction)
    assert down_fraction("prefill", True, CFG) == down_fraction("decode", False, CFG) == CFG.prompt_scale_down_fraction


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
    stuck = Learned(PlannerState(), CFG.correction_max, 1.0, demand())
    obs = RoleObservation(RoleReplicas(3, 3), observe(10, prefill=3).prefill.window)
    a = act("prefill", obs, RoleBounds(1, 10), replace(OK, breached=True), 10.0, Sizing(capacity.Need(2.0, True)),
            stuck, True, SLO, BUDGETS, RoleState(), T, CFG)
    assert a.verdict.desired == 4 and "(model at its correction limit; +1 on the observed breach)" in a.verdict.why


# ------------------------------------------------------------------ 6. clamp
def claim(role, desired, current, bounds=RoleBounds(1, 20), need=None):
    action = "scale_up" if desired > current else "scale_down" if desired < current else "hold"
    return Claim(role, Verdict(desired, action, "why"), current, bounds, 4, need if need is not None else float(desired))


def test_clamp_applies_bounds_and_says_so():
    out = clamp((claim("prefill", 7, 2, RoleBounds(1, 4)), claim("decode", 1, 1, RoleBounds(2, 8))), None)
    p, d = out.verdicts
    assert (p.desired, p.action, p.clamped) == (4, "scale_up", "max replicas 4 (wanted 7)")
    assert p.why == "why; clamped to max replicas 4 (wanted 7)"
    assert (d.desired, d.action, d.clamped) == (2, "scale_up", "min replicas 2 (wanted 1)")
    assert out.notes == ()


def test_clamp_leaves_a_role_without_autoscaling_as_it_is():
    off = claim("prefill", 3, 3, RoleBounds(5, 8, autoscale=False))
    assert clamp((off,), None).verdicts == (off.verdict,)


def test_the_gpu_budget_goes_replica_by_replica_to_the_role_under_most_pressure():
    out = clamp((claim("prefill", 7, 2, need=6.5), claim("decode", 2, 1, need=1.8)), 28)
    p, d = out.verdicts
    assert (p.desired + d.desired) * 4 == 28 and d.desired == 2 and p.desired == 5
    assert p.clamped == "GPU budget 28 (model wanted 7 prefill replicas, got 5)" and d.clamped is None
    assert p.why.endswith("; clamped by GPU budget 28 (model wanted 7 prefill replicas, got 5)")
    # room for one more replica: the role furthest below its need (6.5 on 2 vs 1.8 on 1) gets it
    p, d = clamp((claim("prefill", 7, 2, need=6.5), claim("decode", 2, 1, need=1.8)), 16).verdicts
    assert (p.desired, d.desired) == (3, 1) and d.clamped == "GPU budget 16 (model wanted 2 decode replicas, got 1)"


def test_the_gpu_budget_never_scales_down_what_already_runs():
    out = clamp((claim("prefill", 7, 6), claim("decode", 3, 3)), 16)
    assert [v.desired for v in out.verdicts] == [6, 3] and out.verdicts[0].action == "hold"
    assert out.notes == ("current replicas already use 36 GPUs > budget 16; no scale-up",)


# ------------------------------------------------------------------ predictions
def test_predictions_at_the_decided_replicas():
    obs = observe(14, prefill=2)
    dem, budgets, _, lrn = steps_to_learned(obs)
    out = predict((14.0, 3), 14.0, 1, lrn, budgets, PROFILE, SLO, CFG)
    assert out.prefill.ttft_s < SLO.ttft_s < predict((14.0, 2), 14.0, 1, lrn, budgets, PROFILE, SLO, CFG).prefill.ttft_s
    assert out.decode.ttft_s is None and out.prefill.itl_s is None
    s = lrn.sized
    assert out.prefill.ttft_s == capacity.prefill_ttft(PROFILE.prefill, 14.0, 3, s.new_tokens, s.cached_tokens, 0.9,
                                                       lrn.prefill_correction, cs2=CFG.service_cv2) + budgets.handover_s
    assert out.decode.e2e_p95_s == pytest.approx(out.prefill.ttft_s + OSL95 * out.decode.itl_s)
    agg = predict(None, 14.0, 4, learned_for(aggregated(14)), budgets, PROFILE, SLO, CFG)
    assert agg.prefill is None and agg.decode.ttft_s is not None
    assert agg.decode.e2e_p95_s == pytest.approx(agg.decode.ttft_s + OSL95 * agg.decode.itl_s)


def test_steps_exchange_frozen_data():
    j = judge(observe(10), PROFILE, SLO, BUDGETS, T, CFG)
    for value in (j, j.decode, BUDGETS, demand(), Sizing(None), Verdict(1, "hold", ""), claim("decode", 1, 1)):
        with pytest.raises(AttributeError):
            value.__setattr__("x", 1)
    assert isinstance(j, Judgement)
