"""The queueing tail's shape (cs²) learned where prefill's service time is measured (steps.learn_tail_shape)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from test_planner import T, decide, observe
from v41flash.planner.datatypes import PlannerConfig, PlannerState, RoleState
from v41flash.planner.steps import learn_tail_shape

CFG = PlannerConfig()
OFF = replace(CFG, learn_tail_shape=False)


def _wait(service, rho, p, cs2):
    return service * (1 + cs2) / (2 * (1 - rho)) * math.log(rho / (1 - p))


def _slow_prefill(t=T):
    # vllm:request_prefill_time says prefill costs 1.4x the profile (the floor of the correction), while the TTFT
    # tail is what the profile's own service time predicts: the queue is lighter than cs² = 2 says
    obs = observe(14, prefill=4, t=t)
    pw = obs.prefill.window
    return replace(obs, prefill=replace(obs.prefill, window=replace(pw, prefill_time_mean_s=pw.prefill_time_mean_s * 1.4)))


def _learned(rho, samples=10):
    return PlannerState(prefill=RoleState(correction=1.0, corrections_learned=20, service_correction=1.4,
                                          tail_cs2=1.0, tail_rho=rho, tail_samples=samples))


def test_a_light_queue_at_a_measured_service_time_sizes_prefill_leaner():
    # a shape learned at up to 90 % utilisation: prefill is sized at the measured service time with the lighter
    # tail it showed, not with both pessimisms (service time floor and cs² = 2) at once
    slow = _slow_prefill()
    learned, fixed = decide(slow, _learned(0.9)), decide(slow, _learned(0.9), config=OFF)
    assert learned.prefill.correction == fixed.prefill.correction == pytest.approx(1.4, rel=0.01)
    assert learned.prefill.needed < 0.9 * fixed.prefill.needed
    assert "queueing tail cs² 1.00 learned" in learned.prefill.reason
    assert "queueing tail" not in fixed.prefill.reason


def test_the_learned_tail_is_not_used_beyond_the_load_it_was_learned_at():
    # learned at up to 50 % utilisation (this window: 61 %): a plan never assumes a busier queue than that, so at
    # 14 req/s it keeps the ~4 replicas that run 61 % busy now (the default shape's 3.9 is less: that one counts)
    slow = _slow_prefill()
    fixed = decide(slow, _learned(0.9), config=OFF).prefill.needed
    lean = decide(slow, _learned(0.9)).prefill.needed
    at_half = decide(slow, _learned(0.5))
    assert at_half.state.prefill.tail_rho == pytest.approx(0.61, abs=0.01)
    assert at_half.prefill.needed == pytest.approx(fixed) and fixed > lean
    # too few windows taught it (8 + this one < 10): the default shape
    assert decide(slow, _learned(0.9, samples=8)).prefill.needed == pytest.approx(fixed)


def test_windows_teach_the_shape_and_how_busy_they_were():
    state = PlannerState()
    for i in range(12):
        slow = _slow_prefill(T + 30 * i)
        state = decide(slow, state, now=T + 30 * i).state
    rs = state.prefill
    assert rs.tail_cs2 == pytest.approx(1.0) and rs.tail_samples == 12
    assert rs.tail_rho == pytest.approx(14 * slow.prefill.window.prefill_time_mean_s / 4, rel=0.05)
    assert decide(slow, PlannerState(), config=OFF).state.prefill.tail_cs2 is None


def test_the_tail_shape_solves_the_queueing_tail_for_cs2():
    s, rho, p = 2.0, 0.6, 0.9
    ttft = s + _wait(s, rho, p, 1.5)
    rs = learn_tail_shape(RoleState(), s, rho * 8 / s, 8, ttft, p, CFG)
    assert rs.tail_cs2 == pytest.approx(1.5) and rs.tail_rho == pytest.approx(rho) and rs.tail_samples == 1


def test_a_heavier_tail_is_taken_at_once_a_lighter_one_smoothed_in():
    s, rho, p = 2.0, 0.6, 0.9
    rate = rho * 8 / s
    heavy = s + _wait(s, rho, p, 5.0)  # beyond service_cv2: capped there
    assert learn_tail_shape(RoleState(tail_cs2=1.0), s, rate, 8, heavy, p, CFG).tail_cs2 == CFG.service_cv2
    light = s  # no queue at all: the floor, smoothed in from 2.0
    w = CFG.tail_shape_smoothing
    assert learn_tail_shape(RoleState(tail_cs2=2.0), s, rate, 8, light, p, CFG).tail_cs2 == \
        pytest.approx((1 - w) * 2.0 + w * CFG.tail_shape_min_cs2)


def test_a_quiet_queue_teaches_no_tail_shape():
    # at 10 % utilisation the percentile sees almost no queue: a light tail there says nothing about a busy one
    s = 2.0
    quiet = RoleState(tail_cs2=1.7, tail_rho=0.6, tail_samples=3)
    assert learn_tail_shape(RoleState(), s, 0.1 * 8 / s, 8, s, 0.9, CFG) == RoleState()
    assert learn_tail_shape(quiet, s, 0.1 * 8 / s, 8, s, 0.9, CFG) == quiet
    over = learn_tail_shape(quiet, s, 1.2 * 8 / s, 8, 100.0, 0.9, CFG)  # overloaded: back to the default shape
    assert over.tail_cs2 == CFG.service_cv2 and over.tail_rho == 1.0
