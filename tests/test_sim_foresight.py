"""The simulator's foresight: forecastable families with their past, scheduled jobs with their schedule, and the
cold starts each spec.startup option gives (sim/startup.py)."""
from __future__ import annotations

import numpy as np
import pytest

from v41flash import cron
from v41flash.planner import seasonal
from v41flash_bench.sim import startup, suite
from v41flash_bench.sim.autoscale_bench import in_schedule
from v41flash_bench.sim.policies import scenario_config, scenario_state
from v41flash_bench.sim.scenario import profiles, with_startup
from v41flash_bench.sim.workload import _shape


def test_each_startup_option_shortens_its_stage_by_its_published_factor():
    c = 1000.0
    assert startup.cold_start(c, startup.Startup()) == pytest.approx(c)
    assert startup.cold_start(c, startup.Startup("runai_streamer")) == pytest.approx(c * (0.1 + 0.6 / 3.35 + 0.3))
    assert startup.cold_start(c, startup.Startup("fastsafetensors")) == pytest.approx(c * (0.1 + 0.6 / 2.55 + 0.3))
    assert startup.cold_start(c, startup.Startup(weight_cache=True)) == pytest.approx(c * (0.1 + 0.6 / 1.1 + 0.3))
    assert startup.cold_start(c, startup.Startup(compile_cache=True)) == pytest.approx(c * (0.1 + 0.6 + 0.06))
    assert startup.cold_start(c, startup.FAST) == pytest.approx(c * (0.1 + 0.6 / (3.35 * 1.9) + 0.06))
    with pytest.raises(ValueError, match="load format 'tensorizer'"):
        startup.cold_start(c, startup.Startup("tensorizer"))


def test_fast_starts_shorten_the_simulated_cold_start_and_the_planner_is_not_told():
    _, sc = suite.draw_scenario(707, "heldout")
    truth, planner = profiles(with_startup(sc, startup.FAST))
    assert truth.prefill.cold_start_seconds == pytest.approx(startup.cold_start(sc.deployment.cold_start_s,
                                                                                startup.FAST))
    assert planner.prefill.cold_start_seconds == 600.0


def test_forecastable_families_come_from_their_own_seed_range_with_their_past_or_schedule():
    for seed in range(701, 731):
        family, sc = suite.draw_scenario(seed, "heldout")
        if family in ("daily", "weekly"):
            h = sc.history
            assert h is not None and not sc.schedules
            day = h.season_periods_s[0]
            assert h.season_periods_s[1] == 7 * day and day % 60 == 0
            assert h.span_s == 4 * (7 * day if family == "weekly" else day)
        elif family == "batch":
            (w,) = sc.schedules
            assert sc.history is None and cron.cron_problem(w.cron) is None
            a = sc.arrivals
            first = a.burst_offset_s
            # the schedule's window is the job: the minute after a job starts is inside it, the minute after it not
            assert in_schedule(sc, first + 60.0, 60.0)
            assert not in_schedule(sc, first + a.burst_s, 60.0)
            assert _shape(a, 2400.0, None)(first + 120.0) == pytest.approx(1.0)
        else:
            assert sc.history is None and not sc.schedules


def test_the_past_in_status_follows_the_shape_and_the_planner_finds_its_season():
    _, sc = suite.draw_scenario(707, "heldout")  # daily
    state = scenario_state(sc)
    h = sc.history
    assert state.season.last == -1 and len(state.season.values) == h.span_s / h.bucket_s
    t = np.arange(-h.span_s, 0, h.bucket_s) + h.bucket_s / 2
    shape = _shape(sc.arrivals, sc.duration_s, None)(t)
    assert np.corrcoef(shape, state.season.values)[0, 1] > 0.7  # sessions outlive the target: the live count lags it
    cfg = scenario_config(sc)
    assert cfg.foresight.season_bucket_s == 60.0 and cfg.foresight.season_periods_s == h.season_periods_s and cfg.foresight.epoch_s == sc.epoch_s
    model = seasonal.fit(state.season, 600.0, cfg.foresight.season)
    assert model is not None and model.period_s == h.season_periods_s[0]


def test_a_batch_scenario_gives_ours_its_schedule_on_the_scenario_clock():
    _, sc = next((f, s) for f, s in (suite.draw_scenario(x, "heldout") for x in range(701, 731)) if f == "batch")
    cfg = scenario_config(sc)
    (w,) = cfg.foresight.schedules
    assert w.cron == sc.schedules[0].cron and w.requests_per_second == sc.schedules[0].requests_per_second
    assert scenario_state(sc).season.values == ()


def test_scenarios_without_foresight_run_the_operator_defaults_as_before():
    _, sc = suite.draw_scenario(336, "heldout")
    cfg = scenario_config(sc)
    assert cfg.foresight.schedules == () and cfg.foresight.season_bucket_s == 900.0 and scenario_state(sc).season.values == ()


def test_policies_with_foresight_start_with_what_they_ordered_before_t0_and_the_rest_with_nothing():
    from v41flash_bench.sim.policies import PlannerPolicy, PolicyContext, SchedulePolicy

    _, sc = suite.draw_scenario(707, "heldout")  # daily, with its past in status
    truth, planner = profiles(sc)
    ctx = PolicyContext(slo=sc.slo.to_slo(), bounds={"prefill": (1, 160), "decode": (1, 40)}, profile=planner)
    initial = {"prefill": 4, "decode": 2}
    cold = {"prefill": 900.0, "decode": 900.0}
    ours = PlannerPolicy(ctx, scenario_config(sc), scenario_state(sc)).prestart(initial, cold)
    for ready in ours.values():  # each ordered at a decision in [−cold, 0), Ready one cold start later
        assert all(0.0 < t <= 900.0 for t in ready) and ready == sorted(ready)
    # without a season (an unforeseeable family) or with the forecast off: nothing ordered before t = 0
    _, flat = suite.draw_scenario(336, "heldout")
    assert PlannerPolicy(ctx, scenario_config(flat), scenario_state(flat)).prestart(initial, cold) == {}
    off = scenario_config(sc, {"forecast_quantile": 0.0})
    assert PlannerPolicy(ctx, off, scenario_state(sc)).prestart(initial, cold) == {}
    # the oracle: what its schedule needs within its lead, Ready as each minute begins, held until then
    oracle = SchedulePolicy(ctx, "oracle", {"prefill": [4, 4, 6, 5, 9, 3], "decode": [2] * 6}, 60.0,
                            {"prefill": 200.0, "decode": 200.0})
    assert oracle.prestart(initial, cold) == {"prefill": [120.0, 120.0]}
    assert oracle.decide(10.0, None)["prefill"] == 6  # the 6 of minute 2 are coming: not cancelled
    assert oracle.decide(40.0, None)["prefill"] == 9  # minute 4's ordered a lead ahead, as during the run
    assert oracle.decide(250.0, None)["prefill"] == 9
    ceiling = SchedulePolicy(ctx, "ceiling", {"prefill": [4, 9], "decode": [2, 2]}, 60.0, {"prefill": 0.0, "decode": 0.0})
    assert ceiling.prestart(initial, cold) == {}
