"""Issue 40's rules (planner/act.py, forecast.py): a breach's step, orders cancelled when the breach clears, outage
memory, a quicker descent from an overshoot, and the decision naming the rule and the forecast that decided."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_kit import BUDGETS, CFG, OK, T, demand, observe
from planner_sim import SLO
from v41flash import defaults
from v41flash.api.v1alpha1 import AutoscalingSpec
from v41flash.planner import capacity
from v41flash.planner.act import ActContext, act
from v41flash.planner.datatypes import PlannerConfig, PlannerState, RoleBounds, RoleObservation, RoleReplicas, RoleState
from v41flash.planner.forecast import forecast
from v41flash.planner.learn import Learned
from v41flash.planner.plan import plan
from v41flash.planner.size import Sizing

BREACH = replace(OK, breached=True, observed_ttft_s=SLO.ttft_s * 3)


def ctx(need, cur, ready=None, starting=0, judged=OK, state=RoleState(), rate=10.0, demand_rate=10.0, waiting=0.0,
        cfg=CFG, role="prefill", bounds=RoleBounds(1, 200)) -> ActContext:
    ready = cur - starting if ready is None else ready
    w = replace(observe(rate, prefill=max(ready, 1)).prefill.window, waiting=waiting)
    obs = RoleObservation(RoleReplicas(cur, ready, starting), w)
    lrn = Learned(PlannerState(), 1.0, 1.0, demand())
    return ActContext(role, obs, bounds, replace(judged, role=role), demand_rate, Sizing(capacity.Need(need, True)),
                      lrn, True, SLO, BUDGETS, state, T, cfg)


# ------------------------------------------------------------------ breach_step
def test_a_breach_doubles_at_most_what_is_ready_or_starting_in_one_reading():
    a = act(ctx(160.0, cur=24, judged=BREACH))
    assert a.verdict.desired == 48 and "breach_step" in a.rules and a.decided_by == "scale_up"
    assert "a breach's step: at most 48, ×2 the 24 Ready or starting" in a.verdict.why
    # the next reading counts what is starting: 48 → 96 if the breach and the need stay
    assert act(ctx(160.0, cur=48, ready=24, starting=24, judged=BREACH)).verdict.desired == 96
    # off, or no breach: the model's need
    assert act(ctx(160.0, cur=24, judged=BREACH, cfg=CFG.with_knobs(breach_step_ratio=0.0))).verdict.desired == 160
    assert act(ctx(160.0, cur=24)).verdict.desired == 160
    # a small fleet still gets +1
    assert act(ctx(5.0, cur=0, ready=0, judged=BREACH)).verdict.desired == 2


def test_a_saturated_breach_is_sized_from_what_each_ready_replica_completed():
    # 4 Ready replicas completed 10 req/s with a queue (waiting ≥ Ready): 2.5 req/s each; 12 req/s × 1.25 needs 6
    a = act(ctx(30.0, cur=4, judged=BREACH, rate=10.0, demand_rate=12.0, waiting=8.0))
    assert a.verdict.desired == 6 and "at the 2.50 req/s each of 4 saturated Ready replicas completed" in a.verdict.why
    # ... also where the model calls the saturated fleet fit (an 8× surge once met +1 at a time), within the step
    b = act(ctx(1.0, cur=1, judged=BREACH, rate=2.0, demand_rate=7.0, waiting=30.0))
    assert b.verdict.desired == 2  # ⌈7 ÷ 2 × 1.25⌉ = 5, at most ×2 the 1 Ready
    # ... and the next reading, one starting, doubles again towards ⌈7 ÷ 2 × 1.25⌉ = 5
    assert act(ctx(1.0, cur=2, ready=1, starting=1, judged=BREACH, rate=2.0, demand_rate=7.0,
                   waiting=30.0)).verdict.desired == 4
    # no queue: the replicas were not at their capacity, so their rate proves nothing (the step bound alone)
    assert act(ctx(30.0, cur=4, judged=BREACH, rate=10.0, demand_rate=12.0, waiting=0.0)).verdict.desired == 8


def test_a_breach_the_model_calls_fit_still_scales_the_ready_replicas():
    # TTFT 3× its target (BREACH) while the model needs 3 of the 4 that run: 4 Ready × √3 → 7
    a = act(ctx(3.0, cur=4, judged=BREACH))
    assert a.verdict.desired == 7 and "breach_proportional" in a.rules
    assert "a breach ×3.00 its target the model calls fit: 4 Ready × 1.73 = 7" in a.verdict.why
    # counted on Ready: during a cold start the next reading asks for the same 7, not more
    assert act(ctx(3.0, cur=7, ready=4, starting=3, judged=BREACH)).verdict.action == "hold"
    # at most ×2 (breach_step_ratio); off at exponent 0
    assert act(ctx(3.0, cur=4, judged=replace(BREACH, observed_ttft_s=SLO.ttft_s * 9))).verdict.desired == 8
    assert act(ctx(3.0, cur=4, judged=BREACH, cfg=CFG.with_knobs(breach_exponent=0.0))).verdict.desired == 4 + 1 * 0


# ------------------------------------------------------------------ cancel_on_clear
def test_orders_a_cleared_breach_no_longer_needs_are_cancelled_at_once():
    up = RoleState(last_action="scale_up", last_scale_time=T - 60, up_in_breach=True)
    clear = replace(OK, observed_ttft_s=SLO.ttft_s * 0.5)
    a = act(ctx(3.0, cur=10, starting=4, judged=clear, state=up))
    assert (a.verdict.desired, a.verdict.action, a.decided_by) == (6, "scale_down", "cancel_on_clear")
    assert "the breach cleared" in a.verdict.why and "cancelling 4 replica(s) still starting" in a.verdict.why
    # a need that still wants them keeps them: only down to the recommendation (need × 1.15) ...
    assert act(ctx(7.5, cur=10, starting=4, judged=clear, state=up)).verdict.desired == 9
    # ... or to the highest of the last two minutes' (a breach that cleared for one window may come back)
    recent = replace(up, recommendations=((T - 60, 8),), tracking_since=T - 60)
    assert act(ctx(3.0, cur=10, starting=4, judged=clear, state=recent)).verdict.desired == 8
    older = replace(up, recommendations=((T - 200, 8),), tracking_since=T - 200)
    assert act(ctx(3.0, cur=10, starting=4, judged=clear, state=older)).verdict.desired == 6
    # not clearly clear, or the last action was no scale-up: they wait as before
    near = replace(OK, observed_ttft_s=SLO.ttft_s * 0.95)
    assert act(ctx(3.0, cur=10, starting=4, judged=near, state=up)).verdict.action == "hold"
    assert act(ctx(3.0, cur=10, starting=4, judged=clear, state=RoleState())).decided_by != "cancel_on_clear"
    forecast_up = replace(up, up_in_breach=False)  # ordered by a forecast, not a breach: the stabilization decides
    assert act(ctx(3.0, cur=10, starting=4, judged=clear, state=forecast_up)).decided_by != "cancel_on_clear"
    off = CFG.with_knobs(cancel_clear_ttft_ratio=0.0)
    assert act(ctx(3.0, cur=10, starting=4, judged=clear, state=up, cfg=off)).decided_by != "cancel_on_clear"


# ------------------------------------------------------------------ outage_memory
def test_after_a_collapse_no_scale_down_goes_below_the_peaks_recommendation_until_the_memory_ends():
    memory = CFG.act.outage_memory_s
    hist = ((T - 900, 20.0, 2), (T - 60, 0.5, 2))
    stable = dict(tracking_since=T - 3600, recommendations=((T - 30, 2),))
    held = RoleState(demand_history=hist, recent_high=((T - 900, 12),), **stable)
    a = act(ctx(1.0, cur=12, state=held, demand_rate=0.5))
    assert a.verdict.action == "hold" and "outage_memory" in a.rules
    assert "outage memory: demand 0.50 req/s < 0.15 × its 20.00" in a.verdict.why and "keeping 12" in a.verdict.why
    # once the memory has passed, the ordinary scale-down
    old = RoleState(demand_history=((T - memory + 10, 20.0, 2),), recent_high=((T - memory - 1, 12),), **stable)
    assert act(ctx(1.0, cur=12, state=old, demand_rate=0.5)).verdict.action == "scale_down"
    # no collapse: the standing demand's recommendation is remembered (each entry above every later one)
    b = act(ctx(5.0, cur=12, state=RoleState(demand_history=hist, recent_high=((T - 900, 4),)), demand_rate=10.0))
    assert b.state.recent_high == ((T, 6),)
    off = CFG.with_knobs(outage_memory_s=0.0)
    assert act(ctx(1.0, cur=12, state=held, demand_rate=0.5, cfg=off)).verdict.action == "scale_down"


def test_outage_memory_is_a_spec_field_with_its_default_and_description():
    field = AutoscalingSpec.model_fields["outage_memory_seconds"]
    assert field.default == defaults.OUTAGE_MEMORY_SECONDS and "outage" in (field.description or "")
    spec = AutoscalingSpec.model_validate({"outageMemorySeconds": 600})
    from v41flash.controller.autoscale import planner_config
    assert planner_config(spec).act.outage_memory_s == 600.0
    assert PlannerConfig.for_spec(30, 600).act.outage_memory_s == defaults.OUTAGE_MEMORY_SECONDS


# ------------------------------------------------------------------ overshoot_down
def test_an_overshoot_sheds_a_quarter_of_the_prefill_fleet_per_step_never_below_the_recommendation():
    stable = RoleState(tracking_since=T - 3600, recommendations=((T - 30, 4),))
    a = act(ctx(3.0, cur=100, state=stable))
    assert (a.verdict.desired, a.decided_by) == (75, "overshoot_down")
    assert act(ctx(3.0, cur=6, state=stable)).verdict.desired == 5  # a quarter of 6 is one replica: step_down
    near = act(ctx(3.0, cur=5, state=stable))
    assert near.decided_by == "step_down" and near.verdict.desired == 4  # 5 ≤ 1.5 × 4: one at a time
    assert act(ctx(3.0, cur=100, state=stable, cfg=CFG.with_knobs(overshoot_ratio=0.0))).verdict.desired == 99


# ------------------------------------------------------------------ which rule and which forecast decided
def test_the_forecast_says_which_term_set_the_demand():
    d = demand(rate=10.0)
    steady = forecast(OK, d, True, 600.0, RoleState(), T, CFG)
    assert steady.source == "level"
    hot = forecast(replace(OK, breached=True), d, True, 600.0, RoleState(rate_level=5.0, rate_time=T - 30), T, CFG)
    assert hot.source == "observed"
    seen = forecast(OK, d, True, 600.0, RoleState(), T, CFG, foreseen=(25.0, "a schedule"))
    assert seen.source == "foresight" and seen.demand_rate == pytest.approx(25.0)


def test_a_decision_names_its_deciding_rule_and_forecast():
    dec = plan(observe(40, prefill=2, decode=1), *_plan_args())
    assert dec.prefill.decided_by == "scale_up" and dec.prefill.forecast_by == "level"  # the first sample is the level
    assert dec.decode.decided_by in ("scale_up", "current_fits", "down_blocked")


def _plan_args():
    from planner_sim import PROFILE
    from v41flash.planner.datatypes import Bounds
    return PROFILE, SLO, Bounds(prefill=RoleBounds(1, 20), decode=RoleBounds(1, 20)), PlannerState(), T, CFG


# ------------------------------------------------------------------ trend foresight (planner/trend.py)
def _history(rates, start=T - 3600):
    return tuple((start + 60 * i, r, 2) for i, r in enumerate(rates))


def test_a_ramp_is_foreseen_one_cold_start_ahead_damped_once_its_backtest_beats_demand_stays():
    from v41flash.planner import trend
    s = trend.SlopeSettings()
    ramp = _history([5.0 + 0.2 * i for i in range(60)])  # +0.2 req/s a minute for an hour
    now = ramp[-1][0]
    rate, why = trend.forecast(ramp, now, 900.0, s)
    level = 5.0 + 0.2 * 59
    assert rate == pytest.approx(level + 0.2 / 60 * 900 * 0.5, rel=0.02) and "trend" in why and "backtest error" in why
    assert trend.forecast(ramp, now, 900.0, trend.SlopeSettings(damping=0.0)) == (None, "")
    assert trend.forecast(ramp, now, 10 * 3600.0, s)[0] == pytest.approx(2 * level, rel=0.02)  # max_growth
    falling = _history([20.0 - 0.2 * i for i in range(60)])
    assert trend.forecast(falling, falling[-1][0], 900.0, s) == (None, "")


def test_noise_and_a_ramp_that_just_began_get_no_trend():
    import numpy as np
    from v41flash.planner import trend
    rng = np.random.default_rng(3)
    noise = _history(list(10.0 * np.exp(0.25 * rng.standard_normal(60))))
    assert trend.forecast(noise, noise[-1][0], 900.0, trend.SlopeSettings())[0] is None
    young = _history([10.0] * 55 + [10.5, 11.0])  # two minutes of rise: no backtest point has seen it yet
    assert trend.forecast(young, young[-1][0], 900.0, trend.SlopeSettings())[0] is None


def test_the_trend_is_foresight_the_decision_names():
    from v41flash.planner.foresight import foresee
    ramp = _history([5.0 + 0.2 * i for i in range(60)])
    state = PlannerState(prefill=RoleState(demand_history=ramp))
    seen = foresee(state, "prefill", ramp[-1][0], 900.0, 3, CFG)
    assert seen.source == "slope" and seen.rate > 16.8 and not seen.seasonal
    assert foresee(state, "prefill", ramp[-1][0], 900.0, 3, CFG.with_knobs(slope_damping=0.0)).rate is None


# ------------------------------------------------------------------ the season's rise gate (planner/seasonal.py)
def _days(job_at_bucket=8, days=4, spike_day=None, seed=5):
    import numpy as np
    from v41flash.planner import seasonal
    rng = np.random.default_rng(seed)
    rates = []
    for d in range(days):
        for b in range(96):
            r = 4.0 * float(np.exp(0.1 * rng.standard_normal()))
            if job_at_bucket is not None and b in (job_at_bucket, job_at_bucket + 1):
                r *= 3.0
            if spike_day == d and b == 40:
                r *= 5.0
            rates.append(r)
    return seasonal.seeded(900.0, -days * 86400.0, rates), seasonal


def test_a_daily_job_too_short_for_the_quantile_gate_passes_on_its_own_buckets():
    h, seasonal = _days()
    s = seasonal.Settings(periods_s=(86400.0,))
    model = seasonal.fit(h, 930.0, s)
    assert model is not None and model.period_s == 86400.0
    assert seasonal.fit(h, 930.0, replace(s, rise_ratio=0.0)) is None  # what the 75th-percentile gate alone says
    # the forecast over the job's start (02:00 on the next day, one horizon ahead) sees it
    rate, _ = seasonal.peak(h, model, 2 * 3600.0 - 900.0, 930.0, s)
    assert rate > 2.0 * 4.0


def test_one_off_spikes_and_noise_do_not_pass_the_rise_gate():
    h, seasonal = _days(job_at_bucket=None, spike_day=2)
    assert seasonal.fit(h, 930.0, seasonal.Settings(periods_s=(86400.0,))) is None


def test_a_ttft_breach_decode_owns_keeps_prefill_on_guard_but_does_not_grow_it():
    from planner_kit import BUDGETS as B
    from planner_sim import PROFILE
    from v41flash.planner.judge import judge
    obs = observe(8, prefill=3, dw={"ttft_mean_s": 1.2})  # decode's slot wait makes the TTFT breach
    j = judge(obs, PROFILE, SLO, B, T, CFG)
    assert j.prefill.breached and not j.prefill.own_breach and j.decode.own_breach
    own = judge(observe(14, prefill=2), PROFILE, SLO, B, T, CFG)  # prefill's own queue
    assert own.prefill.breached and own.prefill.own_breach
    a = act(ctx(6.0, cur=3, judged=replace(j.prefill, observed_ttft_s=SLO.ttft_s * 1.5)))
    assert a.verdict.desired == 3 and "the breach is another role's" in a.verdict.why
