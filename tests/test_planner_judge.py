"""Step 1, judge (planner/judge.py): the data's trust, what users saw, and whose breach it is."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_kit import BUDGETS, CFG, T, aggregated, observe
from planner_sim import PROFILE, SLO, truth
from v41flash.figures import RouterFigures
from v41flash.planner.judge import data_status, judge


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
