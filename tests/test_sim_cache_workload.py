"""Prefix cache (LRU over segments) and workload generation / trace replay of the autoscaling simulator."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from v41flash_bench.sim.cache import PrefixCache, PrefixIndex
from v41flash_bench.sim.workload import (
    AgentSessionSpec,
    AgentxTraceSpec,
    ArrivalSpec,
    LogNormalSpec,
    MooncakeTraceSpec,
    QuantileSpec,
    build_agentx_workload,
    load_agentx_trace,
    load_mooncake_trace,
    segments_from_hash_paths,
)

FIX = Path(__file__).parent / "fixtures" / "sim"


# ------------------------------------------------------------------------------------------ cache
def test_cache_matches_longest_cached_leading_run_and_counts_hits():
    c = PrefixCache(capacity_tokens=1000)
    assert c.access([1, 2, 3], [100, 50, 50]) == 0
    assert c.match([1, 2, 3, 4], [100, 50, 50, 10]) == 200
    assert c.match([1, 2, 9], [100, 50, 7]) == 150
    assert c.match([8, 10], [100, 50]) == 0  # a different root shares nothing
    assert c.access([1, 2, 3, 4], [100, 50, 50, 10]) == 200
    assert (c.hits, c.queries, c.used) == (200, 410, 210)


def test_cache_evicts_least_recently_used_leaves_before_shared_prefixes():
    idx = PrefixIndex()
    c = PrefixCache(capacity_tokens=300, index=idx, replica=7)
    c.access([1, 2], [100, 100])  # session A
    c.access([1, 3], [100, 100])  # session B: root 1 touched again, 2 is now the LRU
    assert list(c.lru) == [2, 3, 1]
    c.access([1, 4], [100, 50])  # needs 50 more than the 300 capacity: evicts 2 only
    assert 2 not in c.lru and {1, 3, 4} <= set(c.lru)
    assert c.used == 250 and c.evictions == 1
    assert idx.holders == {1: {7}, 3: {7}, 4: {7}}
    assert c.match([1, 2], [100, 100]) == 100  # A lost its turn, kept the shared root
    c.clear()
    assert idx.holders == {} and c.used == 0


def test_cache_path_larger_than_capacity_does_not_grow_past_it():
    c = PrefixCache(capacity_tokens=100)
    c.access([1, 2, 3], [60, 60, 60])
    assert c.used <= 100


# --------------------------------------------------------------------------------------- workload
def test_quantile_spec_reproduces_its_quantiles():
    q = QuantileSpec(quantiles=((0.0, 0.2), (0.5, 2.3), (0.9, 37.5), (0.99, 1400.0), (1.0, 3600.0)))
    x = q.sample(np.random.default_rng(0), 200_000)
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    assert p50 == pytest.approx(2.3, rel=0.03)
    assert p90 == pytest.approx(37.5, rel=0.05)
    assert p99 == pytest.approx(1400.0, rel=0.1)
    assert QuantileSpec(quantiles=q.quantiles, cap=60.0).sample(np.random.default_rng(0), 1000).max() <= 60.0


def test_lognormal_spec_median_and_clip():
    s = LogNormalSpec(median=444, sigma=1.0, min=16, max=1000)
    x = s.sample(np.random.default_rng(1), 100_000)
    assert np.median(x) == pytest.approx(444, rel=0.03)
    assert x.min() >= 16 and x.max() <= 1000


def _small_spec() -> AgentSessionSpec:
    return AgentSessionSpec(turns=LogNormalSpec(median=6, sigma=0.5, min=2, max=20),
                            new_tokens=LogNormalSpec(median=2000, sigma=0.5, min=64, max=8000),
                            output_tokens=LogNormalSpec(median=200, sigma=0.5, min=16, max=1000),
                            global_prefix_tokens=4000, group_prefix_tokens=1000, session_prefix_tokens=500,
                            groups=5, max_context_tokens=40_000)


def test_agentx_workload_is_deterministic_per_seed():
    arr = ArrivalSpec(pattern="steady", peak_rps=5.0, level=1.0)
    a = build_agentx_workload(_small_spec(), arr, 300.0, seed=3)
    b = build_agentx_workload(_small_spec(), arr, 300.0, seed=3)
    c = build_agentx_workload(_small_spec(), arr, 300.0, seed=4)
    key = lambda w: [(s.sid, s.start, s.first_turn, s.turn_seg_tokens, s.output_tokens, s.think_s) for s in w.sessions]  # noqa: E731
    assert key(a) == key(b)
    assert key(a) != key(c)


def test_agentx_sessions_resend_growing_context_and_respect_the_context_limit():
    w = build_agentx_workload(_small_spec(), ArrivalSpec(pattern="steady", peak_rps=5.0), 300.0, seed=5)
    s = next(x for x in w.sessions if x.turns >= 3)
    ids0, toks0 = s.path(0)
    ids2, toks2 = s.path(2)
    assert ids2[: len(ids0)] == ids0  # each turn extends the previous prompt
    assert ids0[0] == 0  # the global system prompt is every path's root
    assert s.prompt_tokens(2) == sum(toks2) == s.prompt_tokens(1) + s.turn_seg_tokens[2]
    # turn j's new segment carries the previous answer
    assert s.turn_seg_tokens[2] >= s.output_tokens[1]
    for x in w.sessions:
        assert x.prompt_tokens(x.turns - 1) + x.output_tokens[-1] <= 40_000 or x.turns == 1
    subs = [c for x in w.sessions for cs in x.children.values() for c in cs]
    assert subs, "some sessions spawn sub-agents"
    parent = next(x for x in w.sessions if x.children)
    child = next(iter(parent.children.values()))[0]
    assert child.prefix_ids == parent.prefix_ids  # sub-agents share the parent's prefix


def test_surge_pattern_adds_sessions_after_the_surge():
    arr = ArrivalSpec(pattern="surge", peak_rps=5.0, base=0.5, surge_at_s=200.0, surge_ramp_s=20.0)
    w = build_agentx_workload(_small_spec(), arr, 400.0, seed=2)
    starts = np.array([s.start for s in w.sessions if s.first_turn == 0 and s.start > 0])
    before = ((starts > 100) & (starts < 200)).sum()
    after = ((starts > 200) & (starts < 300)).sum()
    assert after > 1.5 * before


def test_segments_from_hash_paths_compresses_unbranched_runs():
    paths = [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, 6]]
    segs = segments_from_hash_paths(paths, block_size=10)
    (a_ids, a_toks), (b_ids, b_toks), (c_ids, c_toks) = segs
    assert a_toks == [20, 10] and b_toks == [20, 10, 20] and c_toks == [20, 10]
    assert b_ids[:2] == a_ids  # shared prefix → same segment ids
    assert c_ids[0] == a_ids[0] and c_ids[1] != a_ids[1]
    assert sum(b_toks) == 50


def test_agentx_trace_replay_is_closed_loop_with_capped_think_times():
    w = load_agentx_trace(AgentxTraceSpec(path=str(FIX / "agentx_sessions.json"), think_cap_s=10.0))
    assert [s.start for s in w.sessions] == [0.0, 1.5]
    s1 = w.sessions[0]
    assert s1.output_tokens == [20, 30, 10]
    assert s1.think_s == [2.0, 10.0, 0.0]  # gap before the next request; 50 s capped to 10 s
    assert [s1.prompt_tokens(j) for j in range(3)] == [256, 384, 512]
    ids0, _ = s1.path(0)
    ids2, toks2 = s1.path(2)
    assert ids2[: len(ids0)] == ids0 and sum(toks2) == 512
    s2 = w.sessions[1]
    # both sessions start with blocks [1, 2]: the trace says they share that prefix
    assert s2.path(0)[0][0] == ids0[0]
    assert w.total_requests() == 5


def test_mooncake_replay_is_open_loop_one_request_per_line():
    w = load_mooncake_trace(MooncakeTraceSpec(path=str(FIX / "mooncake.jsonl")))
    assert w.open_loop
    assert [s.start for s in w.sessions] == [0.0, 0.5, 1.5]
    assert [s.prompt_tokens(0) for s in w.sessions] == [1024, 1500, 600]
    assert [s.output_tokens for s in w.sessions] == [[8], [16], [4]]
    assert w.sessions[1].path(0)[0][0] == w.sessions[0].path(0)[0][0]
