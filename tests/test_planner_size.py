"""Step 4, size (planner/size.py): the replicas one role needs at the forecast demand."""
from __future__ import annotations

import pytest

from planner_kit import BUDGETS, CFG, aggregated, learned_for, observe
from planner_sim import OSL, PROFILE, SLO
from v41flash.planner import capacity
from v41flash.planner.demand import split_slo, workload_demand
from v41flash.planner.size import Sizing, size


def test_sizing_prefill_and_decode_meets_their_budgets_at_the_demand():
    obs = observe(14, prefill=2)
    lrn = learned_for(obs)
    budgets = split_slo(workload_demand(obs), SLO, PROFILE, True)
    p = size("prefill", 14.0, obs.prefill, True, lrn, budgets, PROFILE, SLO, CFG).need
    d = size("decode", 14.0, obs.decode, True, lrn, budgets, PROFILE, SLO, CFG).need
    assert p.feasible and d.feasible and 2.0 < p.replicas < 3.0 and 0.0 < d.replicas < 1.0
    s = lrn.sized
    assert capacity.prefill_ttft(PROFILE.prefill, 14.0, p.replicas, s.new_tokens, s.cached_tokens, 0.9,
                                 lrn.prefill_correction, cs2=CFG.size.service_cv2) <= budgets.prefill_ttft_s + 1e-9
    assert capacity.decode_itl(PROFILE.decode, 14.0, d.replicas, OSL, s.context, lrn.decode_correction) <= budgets.itl_s
    assert size("prefill", None, obs.prefill, True, lrn, budgets, PROFILE, SLO, CFG) == Sizing(need=None)


def test_a_full_kv_cache_sizes_decode_by_memory():
    obs = observe(8, prefill=3, decode=2, dw={"kv_cache_usage": 0.97})
    lrn = learned_for(obs)
    s = size("decode", 8.0, obs.decode, True, lrn, BUDGETS, PROFILE, SLO, CFG)
    assert s.need.replicas == pytest.approx(2 * 0.97 / CFG.size.kv_cache_target)
    assert s.kv_note == "KV cache 97% full (85% target)"


def test_an_aggregated_role_is_sized_for_both_phases():
    obs = aggregated(14, replicas=2)
    lrn, budgets = learned_for(obs), split_slo(workload_demand(obs), SLO, PROFILE, False)
    both, decode_only = (size("decode", 14.0, obs.decode, disagg, lrn, budgets, PROFILE, SLO, CFG).need
                         for disagg in (False, True))
    assert both.replicas > decode_only.replicas + 2.0  # the prompts' share comes on top
