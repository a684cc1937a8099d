"""The routing benchmark's trace generator and oracle (pure)."""
from __future__ import annotations

import pytest

from v41flash.proxy.session_proxy import derived_session_key
from v41flash_bench.routing.sessions import RoutingScenario, block_chain, build_trace, oracle

SMALL = RoutingScenario(sessions=6, turns_min=3, turns_max=5, system_tokens=40, first_turn_tokens=10,
                 new_tokens_median=8, new_tokens_mean=10, new_tokens_max=50, output_tokens_median=3,
                 output_tokens_mean=4, output_tokens_max=10, subagent_fraction=1.0, subagent_turns_min=2,
                 subagent_turns_max=2)


def test_trace_is_deterministic_and_shaped_by_the_scenario():
    a, b = build_trace(SMALL), build_trace(SMALL)
    assert a == b
    assert len(a.sessions) == 6
    for s in a.sessions:
        assert SMALL.turns_min <= len(s.turns) <= SMALL.turns_max
        assert s.turns[0].think_s == 0.0
        assert all(0.0 <= t.think_s <= SMALL.think_cap_s * SMALL.time_scale for t in s.turns)
    assert build_trace(RoutingScenario(**{**SMALL.__dict__, "seed": 7})) != a


def test_every_turn_resends_the_whole_previous_context():
    for s in build_trace(SMALL).sessions:
        for prev, cur in zip(s.turns, s.turns[1:]):
            assert cur.messages[:len(prev.messages)] == prev.messages
            assert len(cur.messages) == len(prev.messages) + 2  # previous reply + new tool result


def test_sessions_share_only_the_system_prefix():
    trace = build_trace(SMALL)
    system = trace.sessions[0].turns[0].messages[0]
    assert system[0] == "system" and len(system[1].split()) == SMALL.system_tokens
    seen: dict[str, str] = {}
    for s in trace.sessions:
        assert s.turns[0].messages[0] == system
        for msg in {m for t in s.turns for m in t.messages[1:]}:
            assert seen.setdefault(msg[1], s.id) == s.id


def test_subagent_starts_from_the_parents_context_and_runs_inline():
    trace = build_trace(SMALL)
    s = trace.sessions[0]
    assert s.subagent is not None and s.subagent.root == s.id and s.subagent.id == f"{s.id}.sub"
    parent_ctx = s.turns[s.spawn_after_turn].messages
    assert s.subagent.turns[0].messages[:len(parent_ctx)] == parent_ctx
    order = [sess.id for sess, _ in s.requests()]
    k = s.spawn_after_turn + 1
    assert order[:k] == [s.id] * k
    assert order[k:k + len(s.subagent.turns)] == [s.subagent.id] * len(s.subagent.turns)
    assert len(order) == len(s.turns) + len(s.subagent.turns)


def test_no_subagents_when_fraction_is_zero():
    trace = build_trace(RoutingScenario(**{**SMALL.__dict__, "subagent_fraction": 0.0}))
    assert all(s.subagent is None for s in trace.sessions)


def test_derived_key_is_stable_per_conversation_and_distinct_across_sessions():
    trace = build_trace(SMALL)
    keys = {}
    for s in trace.sessions:
        ks = {derived_session_key(t.messages) for _, t in s.requests()}  # parent turns and sub-agent turns
        assert len(ks) == 1
        keys[s.id] = ks.pop()
    assert len(set(keys.values())) == len(trace.sessions)
    assert derived_session_key((("system", "x"),)) == derived_session_key((("system", "x"),))


def test_block_chain_covers_full_blocks_and_chains_prefixes():
    assert block_chain([1, 2, 3, 4, 5], 2) == block_chain([1, 2, 3, 4, 9], 2)
    assert len(block_chain([1, 2, 3, 4, 5], 2)) == 2
    assert block_chain([1, 2], 2)[0] == block_chain([1, 2, 3, 4], 2)[0]
    assert block_chain([9, 2, 3, 4], 2)[1] != block_chain([1, 2, 3, 4], 2)[1]  # block 1 depends on block 0
    assert block_chain([1], 2) == []


def test_oracle_exact_small_case():
    reqs = [("a", [1, 2, 3, 4]), ("b", [1, 2, 5, 6]), ("a", [1, 2, 3, 4, 7, 8, 9]), ("b", [1, 2, 5, 6, 10, 11])]
    r = oracle(reqs, engines=2, block_size=2)
    assert r.placement == {"a": 0, "b": 1}
    # a#2 hits [1,2][3,4] on engine 0; b#2 hits [1,2][5,6] on engine 1; first requests miss
    assert (r.hit_tokens, r.prompt_tokens) == (8, 4 + 4 + 7 + 6)
    assert r.hit_rate == pytest.approx(8 / 21)


def test_oracle_one_engine_shares_the_system_prefix_across_sessions():
    reqs = [("a", [1, 2, 3, 4]), ("b", [1, 2, 5, 6])]
    assert oracle(reqs, engines=1, block_size=2).hit_tokens == 2
    assert oracle([], engines=3, block_size=16).hit_rate == 0.0


def test_scenario_rejects_nonsense():
    with pytest.raises(ValueError):
        RoutingScenario(turns_min=5, turns_max=2)
    with pytest.raises(ValueError):
        RoutingScenario(subagent_fraction=1.5)
    with pytest.raises(ValueError):
        RoutingScenario(engines=0)


def test_pinned_uncached_counts_each_root_s_own_stored_blocks():
    from v41flash_bench.routing.sessions import pinned_uncached
    reqs = [("a", [1, 2, 3, 4]), ("b", [1, 2, 5, 6]), ("a", [1, 2, 3, 4, 7, 8, 9]), ("b", [9, 9])]
    # each root computes the shared [1, 2] itself (its own engine); a#2 reuses a#1's two blocks
    assert pinned_uncached(reqs, block_size=2) == [4, 4, 3, 2]
    assert pinned_uncached([], block_size=16) == []


def test_balanced_placement_packs_longest_first_onto_the_least_loaded_engine():
    from v41flash_bench.routing.sessions import balanced_placement
    work = {"a": 7.0, "b": 5.0, "c": 4.0, "d": 3.0, "e": 1.0}
    p = balanced_placement(work, engines=2)
    loads = [sum(w for r, w in work.items() if p[r] == e) for e in range(2)]
    assert sorted(loads) == [10.0, 10.0]  # a+d / b+c+e: a perfect split where round robin gives 12/8
    assert p["a"] != p["b"]
    assert balanced_placement({}, engines=3) == {}
    assert set(balanced_placement({"x": 1.0, "y": 1.0, "z": 1.0}, engines=3).values()) == {0, 1, 2}
