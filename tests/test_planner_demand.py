"""Before the steps (planner/demand.py): the window's demand, and the SLO split between the phases."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_kit import aggregated, observe
from planner_sim import ISL, OSL, OSL95, PROFILE, SLO
from v41flash.planner.datatypes import Slo
from v41flash.planner.demand import ASSUMED_OUTPUT_TOKENS, Demand, split_slo, workload_demand


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
