"""The scenario suite's generator: deterministic from the seed, every family, parameters within RANGES."""
from __future__ import annotations

import math

import pytest

from v41flash.cli.main import main
from v41flash_bench.sim import suite, traces
from v41flash_bench.sim.scenario import profiles
from v41flash_bench.sim.workload import _shape

SEEDS = list(range(1, 49)) + list(range(101, 125)) + list(range(401, 457))


def within(key: str, value: float) -> bool:
    lo, hi = suite.RANGES[key]
    return lo - 1e-6 <= value <= hi + 1e-6


def test_same_seed_same_scenario_and_different_seeds_differ():
    a = [suite.draw_scenario(s)[1].model_dump() for s in SEEDS]
    b = [suite.draw_scenario(s)[1].model_dump() for s in SEEDS]
    assert a == b
    assert len({(d["arrivals"]["peak_rps"], d["deployment"]["cold_start_s"]) for d in a}) == len(a)


def test_consecutive_seeds_cover_every_family_and_the_trace_family_starts_at_its_seed():
    for start in (1, 7, 101, 119, 201, 343):  # before TRACE_FAMILY_FROM: the first six, as they always were
        fams = {suite.draw_scenario(s)[0] for s in range(start, start + 6)}
        assert fams == set(suite.FAMILIES[:6])
    for start in (401, 410, 450, 650):  # from it on: all seven
        fams = {suite.draw_scenario(s)[0] for s in range(start, start + 7)}
        assert fams == set(suite.FAMILIES[:7])
    for start in (701, 733, 1001):  # from FORESIGHT_FAMILY_FROM on: all ten
        assert {suite.family_of(s) for s in range(start, start + 10)} == set(suite.FAMILIES)
    assert "trace" not in {suite.family_of(s) for s in range(1, suite.TRACE_FAMILY_FROM)}
    assert not set(suite.FORECASTABLE) & {suite.family_of(s) for s in range(1, suite.FORESIGHT_FAMILY_FROM)}


def test_seeds_drawn_before_the_trace_family_still_draw_the_scenarios_the_docs_report():
    # docs/decisions/2026-12-01-autoscale-suite.md, tenth pass: held-out seed 336
    assert suite.draw_scenario(336, "heldout")[1].description == (
        "steady at 0.93 of peak; B200 low-latency; peak 19.8 req/s; TTFT p95 ≤ 5.63s, e2e p95 ≤ 21s; "
        "profile error ×1.10; cold start 299s")


def test_tuning_and_held_out_seeds_are_disjoint():
    assert not set(suite.TUNING_SEEDS) & set(suite.HELD_OUT_SEEDS)


def test_seed_sets_print_as_the_ranges_parse_seeds_reads():
    for seeds in (suite.TUNING_SEEDS, suite.HELD_OUT_SEEDS, (1, 2, 3, 7), (5,)):
        assert suite.parse_seeds(suite.seeds_text(seeds)) == sorted(seeds)
    assert suite.seeds_text(suite.TUNING_SEEDS) == "1-48,101-124,1001-1080,2001-2100"
    assert suite.seeds_text((1, 2, 3, 7)) == "1-3,7"


def test_drawn_parameters_are_within_their_ranges_and_span_products_and_profiles():
    products, servings, errors, colds, ttfts, traces_drawn = set(), set(), [], [], [], set()
    for s in SEEDS:
        family, sc = suite.draw_scenario(s)
        dep, slo, arr = sc.deployment, sc.slo, sc.arrivals
        products.add(dep.gpu_product)
        servings.add(dep.serving_profile)
        errors.append(dep.planner_profile_error)
        colds.append(dep.cold_start_s)
        ttfts.append(slo.ttft_s)
        assert within("planner_profile_error", dep.planner_profile_error)
        assert within("cold_start_s", dep.cold_start_s)
        assert within("ttft_s", slo.ttft_s) and within("e2e_p95_s", slo.e2e_p95_s)
        assert within("ttft_percentile", slo.ttft_percentile)
        on_off = arr.pattern == "bursty" or (arr.pattern == "trace" and traces.peak_to_mean(arr.trace) > 2.0)
        peak = arr.peak_rps / (suite.BURST_PEAK_FACTOR if on_off else 1.0)
        assert within("peak_rps", peak)
        assert within("duration_s", sc.duration_s) and within("warmup_s", sc.warmup_s)
        truth, planner = profiles(sc)  # every drawn product/profile pair exists
        assert truth.prefill.cold_start_seconds == dep.cold_start_s
        assert planner.prefill.cold_start_seconds == 600.0  # the planner has to measure it
        if family == "steady":
            assert arr.pattern == "steady" and within("steady_level", arr.level)
        elif family == "diurnal":
            assert arr.pattern == "diurnal" and within("diurnal_trough", arr.trough)
            assert 0 < arr.period_s <= suite.MAX_SIM_PERIOD_S
        elif family.startswith("surge"):
            assert arr.pattern == "surge" and within("surge_base", arr.base) and within("surge_at_s", arr.surge_at_s)
            assert within("surge_ramp_s", arr.surge_ramp_s)
            if family == "surge_ends":
                assert within("surge_length_s", arr.surge_end_s - arr.surge_at_s)
            else:
                assert arr.surge_end_s is None
        elif family == "trace":
            assert arr.pattern == "trace" and arr.trace in traces.shapes()
            assert within("trace_time_scale", arr.trace_time_scale)
            assert arr.trace_offset_s + sc.duration_s * arr.trace_time_scale <= traces.span_s(arr.trace)
            traces_drawn.add(arr.trace)
        else:
            assert arr.pattern == "bursty" and within("burst_every_s", arr.burst_every_s) and within("burst_cv", arr.cv)
            frac = arr.burst_s / dep.cold_start_s
            assert within("burst_short_fraction" if family == "burst_short" else "burst_long_fraction", frac)
    assert products == set(suite.GPU_PRODUCTS) and servings == set(suite.SERVING_PROFILES)
    assert traces_drawn == set(traces.shapes())
    # the ranges are actually spanned, not one corner of them
    assert min(errors) < 0.8 and max(errors) > 1.25
    assert min(colds) < 300 and max(colds) > 800
    assert min(ttfts) < 4 and max(ttfts) > 7


def test_diurnal_phase_shifts_the_cosine():
    sc = suite.draw_scenario(1)[1]
    arr = sc.arrivals.model_copy(update={"pattern": "diurnal", "trough": 0.5, "period_s": 1000.0, "phase": 0.5})
    assert float(_shape(arr, 2000, None)(0.0)) == pytest.approx(1.0)
    assert float(_shape(arr.model_copy(update={"phase": 0.0}), 2000, None)(0.0)) == pytest.approx(0.5)


def test_parse_seeds():
    assert suite.parse_seeds("101-103,7") == [7, 101, 102, 103]
    with pytest.raises(ValueError):
        suite.parse_seeds("5-3")


def test_summary_distribution_and_targets():
    rows = []
    for i, (att, gh) in enumerate([(1.0, 100), (0.9, 120), (0.98, 90)]):
        rows.append({"family": "steady", "scenario": f"s{i}", "policies": {
            "ours": {"window_attainment": att, "gpu_hours": gh},
            "oracle": {"window_attainment": 1.0, "gpu_hours": 100.0},
            "static": {"window_attainment": 1.0, "gpu_hours": 150.0}}})
    s = suite.summarize(rows, ("ours", "oracle", "static"))
    d = s["overall"]["ours"]["window_attainment"]
    assert d["median"] == pytest.approx(0.98) and d["worst"] == pytest.approx(0.9)
    assert s["steady"]["ours"]["gpu_hours_vs_oracle"]["worst"] == pytest.approx(1.2)
    t = suite.targets(rows, s)
    assert t["median_windows_ge_99"] is False and t["median_gpu_hours_le_1.10_oracle"] is True
    assert t["median_gpu_hours_below_static_where_static_holds"] == {"steady": True}
    assert t["scenarios_more_than_1pt_below_static"] == ["s1", "s2"]
    assert "of_which_the_ceiling_misses_too" not in t  # no ceiling in the run
    for r, c in zip(rows, (1.0, 0.95, 0.995)):
        r["policies"]["ceiling"] = {"window_attainment": c, "gpu_hours": 100.0}
    t = suite.targets(rows, suite.summarize(rows, ("ours", "oracle", "static", "ceiling")))
    assert t["scenarios_more_than_1pt_below_static"] == ["s1", "s2"]
    assert t["of_which_the_ceiling_misses_too"] == ["s1"]  # s2's 99.5 % is within a point


def test_suite_plots_without_an_oracle_in_the_run(tmp_path):
    rows = [{"family": "steady", "scenario": f"s{i}",
             "policies": {"ours": {"window_attainment": 1.0, "gpu_hours": 10.0 + i}}} for i in range(3)]
    suite.write_suite_plots(tmp_path, rows, ("ours",))  # no ratio to the oracle to put on a log axis
    assert (tmp_path / "suite.png").stat().st_size > 0


def test_cli_suite_names_a_bad_planner_set_and_nothing_else_as_one(tmp_path, capsys, monkeypatch):
    assert main(["bench", "autoscale", "--suite", "x", "--seeds", "1", "--out", str(tmp_path),
                 "--planner-set", "no_such_field=1"]) == 2
    assert "--planner-set" in capsys.readouterr().err

    def broken(*args, **kwargs):
        raise ValueError("something inside the run")

    monkeypatch.setattr(suite, "run_suite", broken)
    with pytest.raises(ValueError, match="inside the run"):  # a fault of the run, not of the user's --planner-set
        main(["bench", "autoscale", "--suite", "x", "--seeds", "1", "--out", str(tmp_path), "--policies", "ours"])


def test_cli_refuses_suite_without_seeds_and_both_modes(tmp_path, capsys):
    assert main(["bench", "autoscale", "--suite", "x", "--out", str(tmp_path)]) == 2
    assert main(["bench", "autoscale", "--suite", "x", "--scenario", "a.yaml", "--seeds", "1", "--out", str(tmp_path)]) == 2
    assert main(["bench", "autoscale", "--suite", "x", "--seeds", "1", "--seed", "3", "--out", str(tmp_path)]) == 2
    assert math.isfinite(1.0)
