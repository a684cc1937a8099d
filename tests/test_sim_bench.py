"""Policies, oracle helpers, scoring and the `bench autoscale` command on tiny deterministic scenarios."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from v41flash.cli.main import main
from v41flash_bench.sim import oracle
from v41flash_bench.sim.autoscale_bench import make_policy, run_benchmark, simulate
from v41flash_bench.sim.policies import PolicyContext, _HpaScaler
from v41flash_bench.sim.scenario import load_scenario, profiles, scaled_profile
from v41flash_bench.sim.workload import build_workload

TINY = {
    "name": "tiny",
    "durationS": 420,
    "warmupS": 60,
    "seed": 5,
    "workload": {
        "kind": "agentx",
        "turns": {"median": 5, "sigma": 0.5, "min": 2, "max": 12},
        "new_tokens": {"median": 3000, "sigma": 0.6, "min": 64, "max": 20000},
        "output_tokens": {"median": 300, "sigma": 0.7, "min": 16, "max": 3000},
        "global_prefix_tokens": 8000, "group_prefix_tokens": 2000, "session_prefix_tokens": 500, "groups": 4,
    },
    "arrivals": {"pattern": "surge", "peakRps": 6, "base": 0.4, "surgeAtS": 200, "surgeRampS": 30},
    "deployment": {"gpuProduct": "H200", "servingProfile": "low-latency", "coldStartS": 60},
    "slo": {"ttftS": 3.0, "ttftPercentile": 0.95, "e2eP95S": 30.0},
    "bounds": {"prefill": [1, 4], "decode": [1, 3]},
    "initial": {"prefill": 1, "decode": 1},
    "oracleFactors": [1.0, 1.5],
    "oracleRounds": 1,
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(TINY))
    return p


def test_scenario_loads_camel_case_and_resolves_profiles(tiny):
    sc = load_scenario(tiny)
    assert sc.slo.e2e_p95_s == 30.0 and sc.arrivals.surge_at_s == 200
    truth, planner = profiles(sc)
    assert truth.prefill.cold_start_seconds == 60 == planner.decode.cold_start_seconds
    wrong = scaled_profile(truth, 1.3)
    assert wrong.prefill.request_seconds(4000, 1000) == pytest.approx(1.3 * truth.prefill.request_seconds(4000, 1000))
    assert wrong.decode.step_seconds(8, 5000) == pytest.approx(1.3 * truth.decode.step_seconds(8, 5000))


@pytest.mark.parametrize("name", ["ours", "dynamo", "keda", "hpa", "static"])
def test_policies_stay_within_bounds_and_gpu_budget(tiny, name):
    sc = load_scenario(tiny)
    truth, planner = profiles(sc)
    slo = sc.slo.to_slo()
    bounds = {"prefill": (2, 3), "decode": (1, 2)}
    budget = 4 * 3 + 4 * 1  # binds before both maxima
    ctx = PolicyContext(slo=slo, bounds=bounds, profile=planner, gpu_budget=budget, itl_target_s=0.02)
    pol = make_policy(name, ctx, {"static": {"prefill": 9, "decode": 9}})
    seen = []
    decide = pol.decide

    def spy(now, view):
        d = decide(now, view)
        seen.append(d)
        return d

    pol.decide = spy
    wl = build_workload(sc.workload, sc.arrivals.model_copy(update={"peak_rps": 15.0}), 300.0, sc.seed)
    sc_b = sc.model_copy(update={"bounds": sc.bounds.model_copy(update={"prefill": (2, 3), "decode": (1, 2)})})
    simulate(sc_b, wl, truth, pol, {"prefill": 2, "decode": 1}, 300.0)
    assert seen
    for d in seen:
        assert 2 <= d["prefill"] <= 3 and 1 <= d["decode"] <= 2
        assert 4 * d["prefill"] + 4 * d["decode"] <= budget


def test_hpa_scaler_scales_up_at_once_and_down_only_after_the_window():
    h = _HpaScaler(tolerance=0.1, down_window_s=300.0)
    assert h.desired(0.0, 4, 1.05) == 4  # within tolerance
    assert h.desired(15.0, 4, 2.0) == 8  # up: immediately
    assert h.desired(30.0, 8, 0.25) == 8  # down: the window still holds 8
    assert h.desired(316.0, 8, 0.25) == 2  # the 8 left the window


def test_oracle_schedule_helpers():
    assert oracle.keep_through_gaps([3, 1, 1, 3, 1, 1, 1, 1, 1], 60.0, 120.0) == [3, 3, 3, 3, 1, 1, 1, 1, 1]
    assert oracle.forward_max([1, 5, 2, 2, 3], 2) == [5, 5, 2, 3, 3]
    sch = {"prefill": [2, 2, 2, 2], "decode": [1, 1, 1, 1]}
    oracle.bump_failures(sch, [(3, True, False), (1, False, True)], {"prefill": (1, 3), "decode": (1, 9)})
    assert sch == {"prefill": [2, 3, 3, 3], "decode": [2, 2, 1, 1]}


def test_oracle_shape_is_the_present_need_held_and_gap_filled():
    need = {"prefill": [1, 4, 1, 1, 1, 1, 1, 1, 2], "decode": [2, 1, 1, 1, 1, 1, 1, 1, 1]}
    truth = SimpleNamespace(prefill=SimpleNamespace(cold_start_seconds=120.0),
                            decode=SimpleNamespace(cold_start_seconds=60.0))
    shape = oracle.initial_schedule(need, truth, 60.0, hold_s=120.0)
    assert shape == {r: oracle.keep_through_gaps(oracle.forward_max(need[r], 2), 60.0, truth_cs)
                     for r, truth_cs in (("prefill", 120.0), ("decode", 60.0))}
    assert shape["prefill"][0] == 4  # the hold looks ahead: the oracle orders before the need


def test_no_foresight_ceiling_holds_the_highest_need_so_far_and_never_looks_ahead():
    need = {"prefill": [2, 3, 1, 5, 2, 2], "decode": [1, 1, 4, 1, 1, 9]}
    bounds = {"prefill": (1, 12), "decode": (2, 6)}
    c = oracle.no_foresight(need, {"prefill": 1.3}, 1.0, bounds)
    assert c["prefill"] == [3, 4, 4, 7, 7, 7]  # ceil(1.3 × running max)
    assert c["decode"] == [2, 2, 4, 4, 4, 6]  # within bounds; factor 1 where none is given
    h = oracle.no_foresight(need, {"prefill": 1.3}, 1.5, bounds)
    assert h["prefill"] == [4, 6, 6, 10, 10, 10]
    # what comes later never changes what is held before it
    later = {"prefill": need["prefill"][:3] + [12, 12, 12], "decode": need["decode"]}
    assert oracle.no_foresight(later, {"prefill": 1.3}, 1.0, bounds)["prefill"][:3] == c["prefill"][:3]


def _without_speed(report: dict) -> dict:
    r = dict(report)
    r.pop("simulator_speed")
    return r


def test_same_seed_same_report_and_every_policy_scored(tiny, tmp_path):
    sc = load_scenario(tiny)
    a = run_benchmark(sc, tmp_path / "a", progress=lambda m: None, plots=False, jobs=1)
    b = run_benchmark(sc, tmp_path / "b", progress=lambda m: None, plots=False, jobs=3)  # forked workers
    assert json.dumps(_without_speed(a), sort_keys=True) == json.dumps(_without_speed(b), sort_keys=True)
    assert list(a["policies"]) == ["ours", "dynamo", "keda", "hpa", "static", "oracle", "ceiling"]
    for p, s in a["policies"].items():
        assert 0.0 <= s["window_attainment"] <= 1.0, p
        assert s["gpu_hours"] > 0 and s["tokens_per_dollar"] > 0
        assert s["peak_replicas"]["prefill"] <= 4 and s["peak_replicas"]["decode"] <= 3
    # static runs the oracle's peak all along
    sched = a["oracle"]["schedule"]
    assert a["policies"]["static"]["peak_replicas"] == {"prefill": max(sched["prefill"]), "decode": max(sched["decode"])}
    # the ceiling replays its own schedule, requested with no lead: it never shrinks, and it is recorded
    ceil_ = a["oracle"]["ceiling"]
    assert ceil_["headroom"] == 1.0
    for r in ("prefill", "decode"):
        assert ceil_["schedule"][r] == sorted(ceil_["schedule"][r])
    assert a["policies"]["ceiling"]["peak_replicas"] == {r: max(ceil_["schedule"][r]) for r in ("prefill", "decode")}
    c = run_benchmark(sc.model_copy(update={"seed": 6}), tmp_path / "c", policies=("ours",), progress=lambda m: None,
                      plots=False)
    assert c["policies"]["ours"]["requests"] != a["policies"]["ours"]["requests"]


def test_cli_bench_autoscale_writes_report_and_plots(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--policies", "ours,hpa",
               "--duration", "300"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["policies"]) == {"ours", "hpa"} and rep["duration_s"] == 300
    assert (out / "ours.png").stat().st_size > 0 and (out / "compare.png").exists()
    text = capsys.readouterr().out
    assert "win-SLO" in text and "simulator speed" in text
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--policies", "nope"]) == 2
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--ceiling-headroom", "0.5"]) == 2
    assert "--ceiling-headroom: ceiling headroom 0.5: give a number ≥ 1" in capsys.readouterr().err


def test_ceiling_headroom_reaches_the_ceiling_and_only_it(tiny, tmp_path):
    sc = load_scenario(tiny)
    kw = dict(policies=("static", "oracle", "ceiling"), progress=lambda m: None, plots=False, jobs=1)
    one = run_benchmark(sc, tmp_path / "one", **kw)
    two = run_benchmark(sc, tmp_path / "two", ceiling_headroom=2.0, **kw)
    assert two["oracle"]["ceiling"]["headroom"] == 2.0
    for p in ("static", "oracle"):
        assert two["policies"][p] == one["policies"][p]
    s1, s2 = one["oracle"]["ceiling"]["schedule"], two["oracle"]["ceiling"]["schedule"]
    assert all(b >= a for r in s1 for a, b in zip(s1[r], s2[r])) and s2 != s1
    assert two["policies"]["ceiling"]["gpu_hours"] > one["policies"]["ceiling"]["gpu_hours"]
    with pytest.raises(ValueError, match="ceiling headroom"):
        run_benchmark(sc, tmp_path / "bad", ceiling_headroom=float("nan"), **kw)


def test_planner_set_changes_only_ours_and_is_recorded(tiny, tmp_path, capsys):
    base = tmp_path / "base"
    ablated = tmp_path / "ablated"
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(base), "--policies", "ours,hpa",
                 "--no-plots", "--jobs", "1"]) == 0
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(ablated), "--policies", "ours,hpa",
                 "--no-plots", "--jobs", "1", "--planner-set", "target_utilization=0.3",
                 "--planner-set", "up_tolerance=0"]) == 0
    a, b = (json.loads((d / "report.json").read_text()) for d in (base, ablated))
    assert a["planner_overrides"] == {} and b["planner_overrides"] == {"target_utilization": 0.3, "up_tolerance": 0}
    assert a["policies"]["hpa"] == b["policies"]["hpa"]  # the baselines do not move
    assert b["policies"]["ours"]["gpu_hours"] > a["policies"]["ours"]["gpu_hours"]  # 30 % utilisation: more replicas
    capsys.readouterr()
    for bad in ("nope=1", "service_cv2=fast", "saturation_learning=3", "interval_s"):
        assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(ablated), "--planner-set", bad]) == 2
        assert "--planner-set" in capsys.readouterr().err


def test_router_and_its_session_ttl_reach_the_simulator_and_the_report(tiny, tmp_path, capsys):
    from v41flash.api.v1alpha1 import RoutingSpec
    from v41flash_bench.sim.autoscale_bench import simulator_config
    from v41flash_bench.sim.scenario import with_router

    sc = load_scenario(tiny)
    assert simulator_config(sc).router == "cache_aware"
    sticky = with_router(sc, "sticky_least_loaded")
    cfg = simulator_config(sticky)
    assert (cfg.router, cfg.sticky_session_ttl_s) == ("sticky_least_loaded",
                                                        RoutingSpec().session_affinity_ttl_seconds)  # as rendered
    assert simulator_config(with_router(sticky, session_ttl_s=7200)).sticky_session_ttl_s == 7200
    out = tmp_path / "out"
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--policies", "ours",
                 "--no-plots", "--router", "sticky_least_loaded", "--router-session-ttl", "7200"]) == 0
    dep = json.loads((out / "report.json").read_text())["scenario"]["deployment"]
    assert (dep["router"], dep["routerSessionTtlS"]) == ("sticky_least_loaded", 7200)
    capsys.readouterr()
    assert main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--router-session-ttl", "0"]) == 2
    assert "--router-session-ttl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "autoscale", "--scenario", str(tiny), "--out", str(out), "--router", "nope"])
