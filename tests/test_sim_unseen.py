"""Issue 40's simulator side: the unseen families (sim/unseen.py), the past a scenario's status holds (bursty and
trace shapes), fast starts without coldStartS, a duration without a scored window, and an oracle search that settles
whatever grid it starts from (oracle.settle_factor)."""
from __future__ import annotations

import numpy as np
import pytest

from v41flash.cli.main import main
from v41flash_bench.sim import oracle, startup, suite, unseen
from v41flash_bench.sim.scenario import AutoscaleScenario, profiles, with_startup
from v41flash_bench.sim.workload import AgentSessionSpec, ArrivalSpec, _shape, past_demand


def test_eleven_consecutive_seeds_draw_every_unseen_family_within_its_ranges():
    drawn = [suite.draw_scenario(s, "u") for s in range(3001, 3001 + len(unseen.UNSEEN_FAMILIES))]
    assert sorted(f for f, _ in drawn) == sorted(unseen.UNSEEN_FAMILIES)
    for family, sc in drawn:
        lo, hi = unseen.RANGES["cold_start_s"]
        assert lo <= sc.deployment.cold_start_s <= hi, family
        assert family in sc.name and sc.description
    assert set(unseen.UNSEEN_TUNING_SEEDS) <= set(suite.TUNING_SEEDS)
    assert set(unseen.UNSEEN_HELD_OUT_SEEDS) <= set(suite.HELD_OUT_SEEDS)
    assert not set(suite.TUNING_SEEDS) & set(suite.HELD_OUT_SEEDS)
    by = dict(drawn)
    assert by["drift"].history.level < 1.0 and by["clock_shift"].history.shift_s != 0
    assert by["weekend_start"].arrivals.weekday_at_0 == 5
    assert by["daily_job"].history.bucket_s == 900.0 and not by["daily_job"].schedules
    assert by["daily_job_scheduled"].schedules and by["daily_job_scheduled"].history is None
    assert by["outage_return"].arrivals.pattern == "outage"
    err = by["profile_wrong"].deployment.planner_profile_error
    assert err <= unseen.RANGES["profile_optimistic"][1] or err >= unseen.RANGES["profile_pessimistic"][0]


def test_earlier_seeds_draw_what_they_drew():
    assert suite.family_of(805) == "burst_long" and suite.family_of(2001) == "drift"


def test_the_outage_shape_drops_to_its_base_and_comes_back():
    arr = ArrivalSpec(pattern="outage", level=0.8, base=0.03, surge_at_s=900, surge_end_s=1900, surge_ramp_s=100)
    f = _shape(arr, 2400, np.random.default_rng(0))
    assert f(600) == pytest.approx(0.8) and f(1500) == pytest.approx(0.03) and f(2100) == pytest.approx(0.8)


def test_a_bursty_past_has_bursts():
    arr = ArrivalSpec(pattern="bursty", peak_rps=10, base=0.3, burst_every_s=300, burst_s=200, cv=1.5)
    past = past_demand(AgentSessionSpec(), arr, 7, -7200, 60.0, 0.0, 2400.0)
    assert max(past) > 1.5 * min(past)  # was flat: the bursts were drawn from t = 0 on only


def test_a_trace_past_is_scaled_to_the_runs_played_part_not_to_its_first_second():
    # a trough start: the played part's peak is far above the level at t = 0
    arr = ArrivalSpec(pattern="trace", trace="azure-code-2023", trace_offset_s=480.0, trace_time_scale=1.0,
                      peak_rps=10.0)
    run = _shape(arr, 2400.0, np.random.default_rng(0))
    past = past_demand(AgentSessionSpec(), arr, 1, -600, 60.0, 0.0, 2400.0)
    old = past_demand(AgentSessionSpec(), arr, 1, -600, 60.0, 0.0, 1.0)
    assert float(run(0.0)) < 0.1
    assert max(past) <= 10.0 * 1.05 < max(old)  # the old scale put the trough at the peak


def test_fast_starts_shorten_the_shipped_cold_start_when_the_scenario_sets_none():
    sc = AutoscaleScenario.model_validate({"name": "x", "deployment": {"gpuProduct": "H200"}})
    slow, _ = profiles(sc)
    fast, _ = profiles(with_startup(sc, startup.FAST))
    assert fast.prefill.cold_start_seconds == pytest.approx(
        startup.cold_start(slow.prefill.cold_start_seconds, startup.FAST))
    assert fast.prefill.cold_start_seconds < 0.5 * slow.prefill.cold_start_seconds


def test_a_duration_without_a_scored_window_is_refused_naming_the_warm_up(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text("name: s\nwarmupS: 600\n")
    assert main(["bench", "autoscale", "--scenario", str(sc), "--duration", "600", "--out", str(tmp_path / "o")]) == 2
    assert "no scored window after the scenario's 600 s warm-up" in capsys.readouterr().err


@pytest.mark.parametrize("answer", [1.0, 1.45, 2.37, 4.1])
def test_the_oracle_settles_on_the_same_factor_whatever_grid_it_starts_from(answer):
    calls = []

    def attainment(f):
        calls.append(f)
        return 1.0 if f >= answer else 0.8

    found = [oracle.settle_factor(attainment, grid, 0.95) for grid in ((1.3, 1.7), (1.3, 1.6, 2.0), (2.0, 3.0), (1.1,))]
    assert all(f >= answer for f in found)
    assert max(found) / min(found) <= 1.05 + 1e-9 and max(found) <= answer * 1.05 + 1e-9
    assert len(calls) < 40


def test_the_oracle_takes_its_largest_factor_when_none_passes():
    assert oracle.settle_factor(lambda f: 0.5, (1.3, 1.7), 0.95, max_factor=5.0) == 5.0
