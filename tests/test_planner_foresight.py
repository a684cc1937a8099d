"""Foresight inside plan(): the schedules' floors and the season's forecast, a measured cold start ahead."""
from __future__ import annotations

import json
from dataclasses import replace
import math
from datetime import datetime, timezone

from planner_sim import PROFILE, SLO, windows
from v41flash.planner import seasonal
from v41flash.planner.datatypes import (
    Bounds, Observation, PlannerConfig, PlannerState, RoleBounds, RoleObservation, RoleReplicas,
)
from v41flash.planner.caps import foreseen_cap
from v41flash.planner.plan import plan
from v41flash.planner.schedule import Window

WIDE = Bounds(prefill=RoleBounds(1, 40), decode=RoleBounds(1, 20))
MONDAY_9 = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc).timestamp()
COLD = 600.0
WINDOW = Window("business-hours", "0 9 * * 1-5", 3600, "UTC", (("prefill", 6), ("decode", 5)))
CFG = PlannerConfig().with_knobs(schedules=(WINDOW,), headroom_quantile=0.0, scale_down_stabilization_s=60.0,
                    scale_down_cooldown_s=0.0, scale_down_interval_s=0.0)


def decide(t, state=PlannerState(), p=2, d=1, rate=4.0, cfg=CFG):
    pw, dw = windows(rate, p, d, t)
    obs = Observation(prefill=RoleObservation(RoleReplicas(p, p), pw, cold_start_s=COLD),
                      decode=RoleObservation(RoleReplicas(d, d), dw, cold_start_s=COLD))
    return plan(obs, PROFILE, SLO, WIDE, state, t, cfg)


def test_a_schedule_orders_its_floor_one_measured_cold_start_ahead():
    before = decide(MONDAY_9 - COLD - 31)
    assert (before.prefill.desired, before.decode.desired) == (2, 1)
    ahead = decide(MONDAY_9 - COLD - 29)
    assert (ahead.prefill.desired, ahead.decode.desired) == (6, 5)
    assert "schedule 'business-hours'" in ahead.prefill.reason and "ordered one cold start (600s) ahead" in \
        ahead.prefill.reason
    assert ahead.prefill.clamped == "min replicas 6 (wanted 2)"


def test_the_floor_holds_while_the_window_runs_and_is_gone_at_its_end():
    # the demand needs 2 prefill / 1 decode; the floor is 6 / 5 until 10:00
    state = PlannerState()
    for t in (MONDAY_9, MONDAY_9 + 1800, MONDAY_9 + 3599):
        d = decide(t, state, p=6, d=5)
        state = d.state
        assert (d.prefill.desired, d.decode.desired) == (6, 5)
    end = decide(MONDAY_9 + 3600, state, p=6, d=5)
    assert end.decode.desired < 5 and end.decode.action == "scale_down"  # not held past its end
    assert "schedule" not in end.decode.reason


def test_a_restarted_planner_keeps_the_floor_mid_window():
    d = decide(MONDAY_9 + 1200, PlannerState(), p=6, d=5)  # nothing in memory: the clock says the window runs
    assert (d.prefill.desired, d.decode.desired) == (6, 5)


def test_a_capacity_window_sizes_for_its_request_rate():
    w = Window("launch", "0 9 * * *", 3600, "UTC", requests_per_second=20.0)
    cfg = PlannerConfig().with_knobs(schedules=(w,), headroom_quantile=0.0)
    d = decide(MONDAY_9 + 60, cfg=cfg)
    assert d.prefill.demand_rate >= 20.0 and d.decode.demand_rate >= 20.0
    assert d.prefill.desired > decide(MONDAY_9 - 3600, cfg=cfg).prefill.desired


def test_the_simulator_clock_maps_onto_the_wall_clock_by_epoch():
    cfg = PlannerConfig().with_knobs(schedules=(WINDOW,), epoch_s=MONDAY_9 - 10_000, headroom_quantile=0.0)
    assert decide(10_000 + 60, cfg=cfg).prefill.desired == 6  # planner time 10 060 s = Monday 09:01


# ------------------------------------------------------------------ the learned season
DAY = 1800.0
SEASON_CFG = PlannerConfig().with_knobs(season_bucket_s=60.0, season_periods_s=(DAY,), season_keep=400, headroom_quantile=0.0,
                                        breach_step_ratio=0.0)


def daily(t):
    return 3.0 + 30.0 * 0.5 * (1 - math.cos(2 * math.pi * t / DAY))  # 3 → 33 req/s and back, every 30 min


def seeded_state(days=4):
    rates = [daily(i * 60.0) for i in range(int(days * DAY / 60))]
    return PlannerState(season=seasonal.seeded(60.0, -days * DAY, rates))


def test_a_season_in_the_history_orders_the_coming_rise_a_cold_start_ahead():
    d = decide(0.0, seeded_state(), rate=daily(0.0), cfg=SEASON_CFG)  # the trough; the rise comes within 630 s
    assert d.prefill.demand_rate >= 0.95 * daily(COLD)
    assert "forecast" in d.prefill.reason and "1800s season" in d.prefill.reason
    flat = decide(0.0, PlannerState(), rate=daily(0.0), cfg=SEASON_CFG)
    assert d.prefill.desired > flat.prefill.desired


def test_the_forecast_can_be_turned_off():
    d = decide(0.0, seeded_state(), rate=daily(0.0),
               cfg=PlannerConfig().with_knobs(season_bucket_s=60.0, season_periods_s=(DAY,), season_keep=400,
                                 headroom_quantile=0.0, forecast_quantile=0.0))
    assert "forecast" not in d.prefill.reason and d.prefill.demand_rate < 4.0


def test_the_history_is_recorded_and_survives_a_restart_through_status():
    state = seeded_state()
    for i in range(4):  # two more buckets
        state = decide(30.0 * i, state, rate=daily(30.0 * i), cfg=SEASON_CFG).state
    assert state.season.last == 0 and state.season.open_index == 1
    back = PlannerState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back.season == state.season
    durable = seasonal.from_status(json.loads(json.dumps(seasonal.to_status(state.season, 16384))), 60.0)
    restarted = decide(120.0, PlannerState(season=durable), rate=daily(120.0), cfg=SEASON_CFG)
    assert "forecast" in restarted.prefill.reason


def test_a_history_of_another_bucket_size_starts_again():
    state = decide(0.0, seeded_state(), rate=5.0, cfg=PlannerConfig()).state  # the operator's 900-s buckets
    assert state.season.bucket_s == 900.0 and state.season.values == ()


def test_a_season_replaces_the_hour_scale_headroom_it_would_count_twice():
    cfg = SEASON_CFG.with_knobs(headroom_quantile=0.9, headroom_min_samples=2)
    state = seeded_state()
    for i in range(40):  # bursts within the last 20 minutes: the hour-scale headroom learns a rise
        state = decide(30.0 * i - 1200.0, state, rate=30.0 if i % 8 < 2 else 10.0, cfg=cfg).state
    with_season = decide(0.0, state, rate=daily(0.0), cfg=cfg)
    assert "forecast" in with_season.prefill.reason and "headroom ×" not in with_season.prefill.reason
    without = decide(0.0, replace(state, season=seasonal.History(60.0)), rate=daily(0.0), cfg=cfg)
    assert "headroom ×" in without.prefill.reason


def test_foreseen_cap_scales_what_holds_by_the_seasons_rise_and_steps_up_in_a_modest_foreseen_breach():
    cfg = PlannerConfig()
    # the SLO holds at 10 req/s with 8 Ready; the season says 15 comes: 8 × 1.5 × 1.2 = 14.4 → 15
    assert foreseen_cap(8, None, (10.0, 15.0), cfg)[0] == 15
    assert foreseen_cap(8, None, (10.0, 8.0), cfg)[0] == 10  # no rise: the margin alone
    # a breach (TTFT 1.3× its target) at a demand the season foresaw: × 1.5 the Ready
    assert foreseen_cap(8, 1.3, (10.0, 12.0), cfg)[0] == 12
    assert foreseen_cap(8, 1.3, (13.0, 12.0), cfg)[0] is None  # above the forecast: a surprise
    assert foreseen_cap(8, 2.5, (10.0, 12.0), cfg)[0] is None  # a queue that grows: short of capacity
    assert foreseen_cap(0, 1.3, (10.0, 12.0), cfg)[0] is None  # nothing Ready proves anything
    off = cfg.with_knobs(foreseen_margin=0.0, foreseen_breach_up_ratio=0.0)
    assert foreseen_cap(8, None, (10.0, 15.0), off)[0] is None and foreseen_cap(8, 1.3, (10.0, 12.0), off)[0] is None


def test_a_season_caps_a_prefill_scale_up_only_where_the_ready_replicas_prove_something():
    loose = SEASON_CFG.with_knobs(foreseen_margin=0.0, foreseen_breach_up_ratio=0.0)
    # while the SLO holds, 3 Ready replicas at the observed demand × the season's rise × 1.2 is more than the need
    for t, p in ((0.0, 2), (DAY / 2 - 600, 3)):
        free = decide(t, seeded_state(), p=p, rate=daily(t), cfg=loose)
        capped = decide(t, seeded_state(), p=p, rate=daily(t), cfg=SEASON_CFG)
        assert capped.prefill.desired == free.prefill.desired > p
    # 2 replicas at the peak: TTFT far past its target is a fleet short of capacity, not the model's error: no cap
    free = decide(DAY / 2, seeded_state(), p=2, rate=daily(DAY / 2), cfg=loose)
    capped = decide(DAY / 2, seeded_state(), p=2, rate=daily(DAY / 2), cfg=SEASON_CFG)
    assert capped.prefill.slo_breached and capped.prefill.desired == free.prefill.desired == 6
    # without a season nothing changes
    flat_free = decide(0.0, PlannerState(), rate=daily(0.0), cfg=loose)
    flat = decide(0.0, PlannerState(), rate=daily(0.0), cfg=SEASON_CFG)
    assert flat.prefill.desired == flat_free.prefill.desired and flat.prefill.reason == flat_free.prefill.reason
