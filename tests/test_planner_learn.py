"""Step 2, learn (planner/learn.py): its four learners, and what sizing uses of them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_kit import CFG, T, aggregated, observe, steps_to_learned
from planner_sim import PROFILE, SLO
from v41flash.figures import RouterFigures
from v41flash.planner.datatypes import PlannerState, RoleState
from v41flash.planner.demand import workload_demand
from v41flash.planner.learn import (learn_decode_correction, learn_hit_level, learn_prefill_correction,
                                    learn_service_time, prefill_sizing_correction)


def test_learning_moves_the_corrections_towards_the_truth_and_floors_prefill_by_its_service_time():
    _, _, _, learned = steps_to_learned(observe(14, prefill=4, kp=1.3, kd=0.7))
    p, d = learned.state.prefill, learned.state.decode
    assert 1.0 < p.correction < 1.3 and 0.7 < d.correction < 1.0  # one smoothed step, not the whole way
    assert p.corrections_learned == d.corrections_learned == 1
    assert p.service_correction == pytest.approx(1.3)  # measured prefill time: taken whole at first
    assert learned.prefill_correction == pytest.approx(1.3)  # floored by the measured service time
    assert learned.decode_correction == d.correction


def test_learning_is_bounded():
    _, _, _, learned = steps_to_learned(observe(8, prefill=4, kp=5.0), PlannerState(prefill=RoleState(correction=1.9)))
    assert learned.state.prefill.correction == CFG.learn.correction_max


@pytest.mark.parametrize("spoil", ["rolling", "partial", "few"])
def test_nothing_is_learned_from_untrustworthy_windows(spoil):
    obs = {"rolling": observe(14, prefill=4, kp=1.3, rolling=True),
           "partial": observe(14, prefill=4, kp=1.3, pw={"partial_pods": ("p-0",)}),
           "few": observe(0.2, prefill=4, kp=1.3)}[spoil]
    state = PlannerState(prefill=RoleState(correction=1.1, hit_level=0.3))
    _, _, _, learned = steps_to_learned(obs, state)
    assert learned.state.prefill == state.prefill
    assert learned.sized.hit_rate == 0.3  # sized at the remembered hit level, not this window's 50 %


def test_the_hit_level_is_smoothed_and_sizing_uses_it():
    _, _, _, learned = steps_to_learned(observe(10, prefill=3), PlannerState(prefill=RoleState(hit_level=0.8)))
    assert learned.state.prefill.hit_level == pytest.approx(0.2 * 0.5 + 0.8 * 0.8)
    assert learned.sized.hit_rate == pytest.approx(0.74)
    demand, _, _, fresh = steps_to_learned(observe(10, prefill=3))
    assert fresh.sized == demand  # the first level is the window's own


def test_a_breach_sizes_at_the_window_s_hit_level_when_it_is_lower_and_remembers_the_smoothed_one():
    hurt = {"ttft_s": SLO.ttft_s * 2}
    _, _, judged, learned = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.8)))
    assert judged.prefill.breached
    assert learned.state.prefill.hit_level == pytest.approx(0.74)  # the level learns as always
    assert learned.sized.hit_rate == 0.5  # but this window's misses are sized while users wait
    _, _, _, higher = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.3)))
    assert higher.sized.hit_rate == pytest.approx(0.34)  # a better window than the level: still the level
    off = CFG.with_knobs(breach_hit_level=False)
    _, _, _, was = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=RoleState(hit_level=0.8)), off)
    assert was.sized.hit_rate == pytest.approx(0.74)


def test_after_a_scale_down_a_breach_sizes_at_the_window_s_hit_level_only_in_a_wave_of_new_sessions():
    hurt = {"ttft_s": SLO.ttft_s * 2}
    shed = RoleState(hit_level=0.8, share_level=0.1, last_action="scale_down", last_scale_time=T - 120)

    def learned_at(new_per_s, rs=shed, cfg=CFG):
        obs = replace(observe(10, prefill=3, pw=hurt),
                      router=RouterFigures(start=T - 60, end=T, arrival_rate=10.0, new_session_rate=new_per_s))
        return steps_to_learned(obs, PlannerState(prefill=rs), cfg)[3]

    moved = learned_at(1.0)  # the usual share of new sessions: the misses are the sessions the scale-down moved
    assert moved.sized.hit_rate == pytest.approx(0.74) and moved.state.prefill.share_level == pytest.approx(0.1)
    wave = learned_at(2.0)  # a fifth of arrivals are new sessions where a tenth were: a wave
    assert wave.sized.hit_rate == 0.5
    assert wave.state.prefill.share_level == pytest.approx(0.8 * 0.1 + 0.2 * 0.2)  # it learns with the hit level
    # a wave is a share above its level × (1 + proven_share_slack) + 0.01: 0.135 here
    assert learned_at(1.4).sized.hit_rate == 0.5 and learned_at(1.3).sized.hit_rate == pytest.approx(0.74)
    # no scale-down within down_breach_window_s, a scale-up, no level learned yet, the gate off: the window's own
    assert learned_at(1.0, replace(shed, last_scale_time=T - CFG.act.down_breach_window_s)).sized.hit_rate == 0.5
    assert learned_at(1.0, replace(shed, last_action="scale_up")).sized.hit_rate == 0.5
    assert learned_at(1.0, replace(shed, share_level=None)).sized.hit_rate == 0.5
    assert learned_at(1.0, cfg=CFG.with_knobs(breach_share_gate=False)).sized.hit_rate == 0.5
    unknown = steps_to_learned(observe(10, prefill=3, pw=hurt), PlannerState(prefill=shed))[3]
    assert unknown.sized.hit_rate == 0.5 and unknown.state.prefill.share_level == 0.1  # no proxy: no gate, no learning


def test_aggregated_learning_puts_the_prefill_correction_in_prefill_state_and_the_hit_level_in_decode_s():
    _, _, _, learned = steps_to_learned(aggregated(10, replicas=3))
    assert learned.state.prefill.corrections_learned == 1 and learned.state.decode.corrections_learned == 1
    assert learned.state.decode.hit_level == 0.5 and learned.state.prefill.hit_level is None


# ------------------------------------------------------------------ the four learners one by one
def test_each_learner_updates_only_what_it_learns():
    obs = observe(14, prefill=4, kp=1.3, kd=0.7)
    demand_, _, judged, _ = steps_to_learned(obs)
    rs = RoleState(correction=1.1, hit_level=0.3)
    decode = learn_decode_correction(obs, judged, demand_, PROFILE, rs, CFG)
    assert decode.correction < 1.1 and replace(decode, correction=1.1, corrections_learned=0) == rs
    service = learn_service_time(obs, judged, demand_, PROFILE, rs, CFG)
    assert service.service_correction == pytest.approx(1.3) and replace(service, service_correction=None) == rs
    state = learn_hit_level(obs, judged, demand_, PlannerState(prefill=rs), CFG)
    assert state.prefill.hit_level == pytest.approx(0.2 * 0.5 + 0.8 * 0.3) and state.decode == RoleState()


def test_learners_pass_a_window_that_teaches_nothing():
    obs = observe(14, prefill=4, kp=1.3, rolling=True)
    demand_, budgets, judged, _ = steps_to_learned(obs)
    rs, state = RoleState(correction=1.1), PlannerState(prefill=RoleState(hit_level=0.3))
    assert learn_prefill_correction(obs, judged, demand_, budgets, PROFILE, rs, RoleState(), CFG) is rs
    assert learn_service_time(obs, judged, demand_, PROFILE, rs, CFG) is rs
    assert learn_hit_level(obs, judged, demand_, state, CFG) is state
    agg = aggregated(10, replicas=3)  # aggregated: no prefill service time to measure
    assert learn_service_time(agg, steps_to_learned(agg)[2], workload_demand(agg), PROFILE, rs, CFG) is rs


def test_the_prefill_sizing_correction_is_the_tail_fit_between_its_floor_and_cap():
    assert prefill_sizing_correction(RoleState(correction=0.7), CFG) == 1.0  # unmeasured: floored at 1
    assert prefill_sizing_correction(RoleState(correction=0.7, service_correction=0.8), CFG) == 0.8
    assert prefill_sizing_correction(RoleState(correction=1.9, service_correction=1.0), CFG) == pytest.approx(1.3)
