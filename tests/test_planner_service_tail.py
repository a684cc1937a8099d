"""The service-tail model: P/D prefill's TTFT percentile as the percentile's own service time (the longest
contexts: more replicas do not shorten one prefill) plus a queue measured against the M/G/1 tail
(PlannerConfig.service_tail_model, docs/2026-12-01-autoscale-suite.md, fourth pass)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_sim import HIT, ISL, PROFILE, SLO, windows
from v41flash.metrics.figures import WindowFigures
from v41flash.metrics import promapi
from v41flash.planner import capacity, steps
from v41flash.planner.datatypes import (
    Observation, PlannerConfig, PlannerState, RoleObservation, RoleReplicas, RoleState,
)

NEW, CACHED = ISL * (1 - HIT), ISL * HIT
PP = PROFILE.prefill
S = PP.request_seconds(NEW, CACHED)


def test_the_percentiles_service_time_does_not_shrink_with_replicas():
    many = capacity.prefill_ttft(PP, 10.0, 1000, NEW, CACHED, 0.9, tail_s=5 * S)
    assert many == pytest.approx(5 * S)  # the queue is gone; the longest prefill is not
    q1 = capacity.prefill_ttft(PP, 20.0, 4, NEW, CACHED, 0.9, cs2=2.0, tail_s=3 * S) - 3 * S
    q_half = capacity.prefill_ttft(PP, 20.0, 4, NEW, CACHED, 0.9, cs2=2.0, tail_s=3 * S, queue_scale=0.5) - 3 * S
    assert q_half == pytest.approx(q1 / 2)
    # unchanged without a tail: the mean request's service time plus the M/G/1 tail
    assert capacity.prefill_ttft(PP, 20.0, 4, NEW, CACHED, 0.9, cs2=2.0) == pytest.approx(
        S + capacity.prefill_wait_quantile(S, 20.0 * S / 4, 0.9, 2.0))


def test_a_light_queue_behind_a_service_tail_needs_fewer_replicas_and_a_tail_over_budget_none():
    default = capacity.prefill_replicas_needed(PP, 40.0, NEW, CACHED, 1.5, 0.9, cs2=2.0)
    light = capacity.prefill_replicas_needed(PP, 40.0, NEW, CACHED, 1.5, 0.9, cs2=2.0, tail_s=4 * S, queue_scale=0.3)
    assert light.feasible and light.replicas < default.replicas
    assert light.replicas >= 40.0 * S / 0.9  # never above the utilisation target
    over = capacity.prefill_replicas_needed(PP, 40.0, NEW, CACHED, 1.5, 0.9, cs2=2.0, tail_s=2.0)
    assert not over.feasible  # no replica count shortens a 2 s prefill under a 1.5 s budget


def _obs(rate: float, prefill: int, t: float, tail_share: float | None = 0.85, **pw_kw) -> Observation:
    pw, dw = windows(rate, prefill, 2, t)
    p_time = pw.ttft_s * tail_share if tail_share is not None else None
    pw = replace(pw, prefill_time_p_s=p_time, **pw_kw)
    return Observation(prefill=RoleObservation(RoleReplicas(prefill, prefill), pw),
                       decode=RoleObservation(RoleReplicas(2, 2), dw))


def _learn(obs: Observation, state: PlannerState, cfg: PlannerConfig = PlannerConfig()) -> steps.Learned:
    demand = steps.workload_demand(obs)
    budgets = steps.split_slo(demand, SLO, PROFILE, True)
    judged = steps.judge(obs, PROFILE, SLO, budgets, obs.prefill.window.end, cfg)
    return steps.learn(obs, judged, demand, budgets, PROFILE, state, cfg)


def _learned_for(n: int, rate: float = 20.0, prefill: int = 4, **kw) -> steps.Learned:
    state, t = PlannerState(), 1_000_000.0
    for i in range(n):
        learned = _learn(_obs(rate, prefill, t + 30 * i, **kw), state)
        state = learned.state
    return learned


def test_learned_from_windows_where_the_queue_shows_and_only_after_ten():
    nine, ten = _learned_for(9), _learned_for(10)
    assert nine.service_tail is None and ten.service_tail is not None
    ratio, q = ten.service_tail
    w = _obs(20.0, 4, 0.0).prefill.window
    assert ratio == pytest.approx(0.85 * w.ttft_s / S, rel=0.01)
    assert PlannerConfig().queue_scale_min <= q < 1.0  # the queue left of the percentile is lighter than M/G/1
    assert ten.state.prefill.queue_scale_samples == 10
    # at 30 % utilisation and below a queue shows no tail: the service part is learned, the queue share is not
    quiet = _learned_for(12, rate=6.0)
    assert quiet.state.prefill.service_tail_ratio is not None and quiet.state.prefill.queue_scale is None
    assert quiet.service_tail is None
    # nothing without the measured percentile of vllm:request_prefill_time, or with the model off
    assert _learned_for(12, tail_share=None).state.prefill.service_tail_ratio is None
    off = PlannerConfig(service_tail_model=False)
    assert _learn(_obs(20.0, 4, 1_000_000.0), PlannerState(), off).state.prefill.service_tail_ratio is None


def test_a_heavier_sample_is_taken_at_once_a_lighter_one_smoothed_in():
    learned = _learned_for(10)
    ps = learned.state.prefill
    heavy = _learn(_obs(20.0, 4, 2_000_000.0, tail_share=0.2), learned.state).state.prefill
    assert heavy.queue_scale > ps.queue_scale * 2  # most of the percentile was queue: believed now
    light = _learn(_obs(20.0, 4, 2_000_000.0, tail_share=0.95), replace(learned.state, prefill=heavy)).state.prefill
    assert ps.queue_scale <= light.queue_scale < heavy.queue_scale  # a lighter one moves it part of the way


def test_not_used_while_prefill_breaches():
    learned = _learned_for(10)
    breach = _obs(20.0, 4, 2_000_000.0)
    breach = replace(breach, prefill=replace(breach.prefill, window=replace(breach.prefill.window, ttft_s=SLO.ttft_s * 2)))
    assert _learn(breach, learned.state).service_tail is None


def _size(learned: steps.Learned, rate: float, current: int, cfg: PlannerConfig = PlannerConfig()) -> steps.Sizing:
    obs = _obs(20.0, current, 1_000_000.0)
    budgets = steps.split_slo(steps.workload_demand(obs), SLO, PROFILE, True)
    return steps.size("prefill", rate, obs.prefill, True, learned, budgets, PROFILE, SLO, cfg)


def test_it_lowers_a_scale_up_never_below_one_more_replica_and_never_sheds():
    learned = _learned_for(10)
    assert learned.service_tail is not None
    default = _size(replace(learned, service_tail=None), 60.0, 4)
    lowered = _size(learned, 60.0, 4)
    assert 5.0 <= lowered.need.replicas < default.need.replicas
    assert "service tail" in lowered.tail_note and "default model" in lowered.tail_note
    # a tiny need: the default model's answer stands (the service-tail model never makes a scale-down)
    small_default, small = _size(replace(learned, service_tail=None), 4.0, 8), _size(learned, 4.0, 8)
    assert small.need.replicas == pytest.approx(small_default.need.replicas) and small.tail_note == ""
    # whatever the default model asks above what runs, at least one replica more of it is kept
    for rate in (24.0, 28.0, 40.0, 80.0):
        d, t = _size(replace(learned, service_tail=None), rate, 4), _size(learned, rate, 4)
        assert t.need.replicas >= min(d.need.replicas, 5.0) - 1e-9


def test_the_window_reports_prefill_time_at_the_ttft_percentile():
    assert "prefill_time_p_s" in WindowFigures.__dataclass_fields__
    q = promapi._queries('pod=~"a"', "60s", 0.95, "pod")
    assert q["prefill_time_p"].startswith("histogram_quantile(0.95,") and "request_prefill_time" in q["prefill_time_p"]


def test_state_round_trips():
    st = _learned_for(10).state
    back = PlannerState.from_dict(st.to_dict())
    assert back.prefill.service_tail_ratio == st.prefill.service_tail_ratio
    assert back.prefill.queue_scale_samples == 10
    assert isinstance(back.prefill, RoleState)
