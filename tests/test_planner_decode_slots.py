"""Decode sequence slots: with --max-num-seqs 32 a rank holds 32 sequences and the next request waits for a
slot inside its TTFT (tuning seeds 8 and 16 of the autoscale suite: seconds of decode admission wait with the
ITL well inside budget). Decode keeps a + z·√a slots for a sequences in flight (square-root staffing at the
TTFT percentile): the slack a 90 % utilisation target gives a large fleet and denies a small one."""
from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import pytest

from planner_sim import PROFILE, SLO, truth
from planner_kit import BUDGETS, CFG, T, demand, observe
from v41flash.planner import capacity
from v41flash.planner.datatypes import PlannerState
from v41flash.planner.judge import judge
from v41flash.planner.profile import find_profile, for_rendered_engines
from v41flash.planner.learn import Learned
from v41flash.planner.size import size

H200 = for_rendered_engines(find_profile("low-latency", "H200"), 5, 0, 32).decode  # as P/D renders it
OSL, CTX, ITL = 1000.0, 100_000.0, 0.03


def in_flight(rate: float) -> float:
    return rate * OSL * H200.itl_seconds(32, CTX)  # sequences in flight at the capped batch (Little's law)


def test_a_small_fleet_gets_square_root_slack_that_a_utilisation_target_does_not_give():
    rate = 30.0 / (OSL * H200.itl_seconds(32, CTX))  # 30 sequences in flight: one replica is 94 % busy
    assert in_flight(rate) == pytest.approx(30.0)
    util = capacity.decode_replicas_needed(H200, rate, OSL, CTX, ITL)
    slots = capacity.decode_slots_needed(H200, rate, OSL, CTX, ITL, 0.95)
    assert math.ceil(util.replicas - 0.1) == 1  # 1.04: within the planner's 10 % up tolerance of one replica
    assert slots.replicas == pytest.approx((30 + NormalDist().inv_cdf(0.95) * math.sqrt(30)) / 32)
    assert math.ceil(slots.replicas) == 2
    assert capacity.decode_slots_needed(H200, rate, OSL, CTX, ITL, 0.9).replicas < slots.replicas  # looser tail


def test_a_large_fleet_is_sized_by_its_utilisation_target_as_before():
    rate = 3000.0 / (OSL * H200.itl_seconds(32, CTX))
    util = capacity.decode_replicas_needed(H200, rate, OSL, CTX, ITL)
    assert capacity.decode_slots_needed(H200, rate, OSL, CTX, ITL, 0.95).replicas < util.replicas


def test_no_demand_needs_no_slots():
    assert capacity.decode_slots_needed(H200, 0.0, OSL, CTX, ITL, 0.95).replicas == 0.0
    assert capacity.decode_slots_needed(H200, 5.0, 0.0, CTX, ITL, 0.95).replicas == 0.0


def sized_decode(rate: float, cfg=CFG, disagg=True):
    profile = PROFILE.model_copy(update={"decode": PROFILE.decode.model_copy(update={"max_num_seqs": 4})})
    lrn = Learned(PlannerState(), 1.0, 1.0, replace(demand(rate), osl=OSL, isl=CTX))
    return size("decode", rate, observe(rate).decode, disagg, lrn, BUDGETS, profile, SLO, cfg).need.replicas


def test_planner_decode_need_is_the_larger_of_the_two_and_the_knob_turns_slots_off():
    on, off = sized_decode(2.0), sized_decode(2.0, cfg=CFG.with_knobs(decode_slot_staffing=False))
    assert on > off > 0
    assert sized_decode(2.0, disagg=False) == pytest.approx(
        sized_decode(2.0, cfg=CFG.with_knobs(decode_slot_staffing=False), disagg=False))  # aggregated: unchanged


# ------------------------------------------------------------------ whose TTFT breach it is


def test_a_ttft_breach_made_by_decode_s_first_token_is_decode_s_to_fix_too():
    # prefill well inside its budget; decode's first token (a wait for a free sequence slot) takes the rest
    obs = observe(8, prefill=3, dw={"ttft_mean_s": 1.2})
    assert obs.prefill.window.ttft_s + BUDGETS.handover_s < SLO.ttft_s < obs.prefill.window.ttft_s + 1.2
    j = judge(obs, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.decode.breached and j.prefill.breached  # prefill stays on guard as before (no scale-down)
    assert not judge(obs, PROFILE, SLO, BUDGETS, T, CFG.with_knobs(decode_owns_its_ttft=False)).decode.breached
    # the control: the same prefill with decode's first token at its nominal step is no breach at all
    calm = judge(observe(8, prefill=3), PROFILE, SLO, BUDGETS, T, CFG)
    assert not calm.decode.breached and not calm.prefill.breached


def test_a_breach_of_prefill_s_own_making_is_not_decode_s():
    obs = observe(14, prefill=2)  # prefill's queue alone is over the target; decode's first step is nominal
    assert truth(14, 2, 1)["ttft"] > SLO.ttft_s and obs.decode.window.ttft_mean_s <= BUDGETS.handover_s
    j = judge(obs, PROFILE, SLO, BUDGETS, T, CFG)
    assert j.prefill.breached and not j.decode.breached
