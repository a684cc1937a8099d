"""The one AgentX session generator (v41flash_bench.agentx) both benchmarks draw their sessions from."""
from __future__ import annotations

import random

import numpy as np

from v41flash_bench.agentx import AgentSession, ScaledDraws, SpecDraws, agent_session
from v41flash_bench.routing.sessions import RoutingScenario
from v41flash_bench.sim.workload import AgentSessionSpec, LogNormalSpec


class Scripted:
    """Draws from fixed lists, recording the order in which the generator asks."""

    def __init__(self, root_turns, turns, spawns, sub_turns):
        self.root, self.turn_lists = list(root_turns), list(turns)
        self.spawn_lists, self.sub = list(spawns), list(sub_turns)
        self.calls: list[tuple] = []

    def root_turns(self):
        self.calls.append(("root",))
        return self.root.pop(0)

    def turns(self, n, subagent):
        self.calls.append(("turns", n, subagent))
        new, out, think = self.turn_lists.pop(0)
        assert len(new) == len(out) == len(think) == n
        return new, out, think

    def spawns(self, turns):
        self.calls.append(("spawns", turns))
        return self.spawn_lists.pop(0)

    def subagent_turns(self):
        self.calls.append(("sub",))
        return self.sub.pop(0)


def counter(start=100):
    n = [start]

    def take():
        n[0] += 1
        return n[0] - 1
    return take


def test_sub_agents_spawn_after_their_turns_in_order_and_spawn_nothing():
    d = Scripted([3], [([10, 20, 30], [1, 2, 3], [0.5, 0.6, 0.7]), ([5], [6], [0.1]), ([7, 8], [9, 9], [0.2, 0.3])],
                 [[0, 1]], [1, 2])
    s = agent_session(d, 7, counter())
    assert s == AgentSession(7, (10, 20, 30), (1, 2, 3), (0.5, 0.6, 0.7), (
        (0, AgentSession(100, (5,), (6,), (0.1,))), (1, AgentSession(101, (7, 8), (9, 9), (0.2, 0.3)))))
    # the parent's turns, then where it spawns, then each sub-agent's length and turns; none asks to spawn
    assert d.calls == [("root",), ("turns", 3, False), ("spawns", 3), ("sub",), ("turns", 1, True),
                       ("sub",), ("turns", 2, True)]


def test_the_context_limit_ends_a_session_at_the_last_turn_that_fits():
    turns = ([100, 100, 100, 100], [10, 10, 10, 10], [1.0, 1.0, 1.0, 1.0])
    # context after turn j's answer: 1000 + 110 (j + 1): 1110, 1220, 1330, 1440
    s = agent_session(Scripted([4], [turns], [[]], []), 0, counter(), prefix_tokens=1000, max_context_tokens=1330)
    assert s.turns == 3 and s.new_tokens == (100, 100, 100) and s.think_s == (1.0, 1.0, 1.0)
    # a first turn that does not fit is still sent; a one-turn session asks for no sub-agents
    d = Scripted([4], [turns], [], [])
    assert agent_session(d, 0, counter(), prefix_tokens=5000, max_context_tokens=1330).turns == 1
    assert ("spawns", 1) not in d.calls


def test_scaled_draws_task_tokens_and_think_before_each_later_turn():
    sc = RoutingScenario(first_turn_tokens=11, subagent_task_tokens=22, time_scale=1.0, think_cap_s=10.0)
    new, out, think = ScaledDraws(random.Random(1), sc).turns(4, subagent=False)
    assert new[0] == 11 and len(new) == len(out) == len(think) == 4
    assert think[-1] == 0.0 and all(0.0 <= t <= 10.0 for t in think)
    assert all(1 <= o <= sc.output_tokens_max for o in out) and all(1 <= n <= sc.new_tokens_max for n in new[1:])
    assert ScaledDraws(random.Random(1), sc).turns(1, subagent=True)[0] == [22]
    spawns = ScaledDraws(random.Random(2), RoutingScenario(subagent_fraction=1.0))
    assert all(0 <= j <= 3 and len(js) == 1 for js in [spawns.spawns(5) for _ in range(50)] for j in js)


def test_spec_draws_follow_the_spec_and_spawn_a_poisson_number_of_sub_agents():
    spec = AgentSessionSpec(new_tokens=LogNormalSpec(median=100, sigma=0.0), subagent_probability=1.0,
                            subagents_per_session=3.0)
    d = SpecDraws(np.random.default_rng(5), spec)
    new, out, think = d.turns(6, subagent=False)
    assert new == [100] * 6 and all(isinstance(x, int) for x in new + out) and len(think) == 6
    counts = [len(d.spawns(10)) for _ in range(400)]
    assert min(counts) >= 1 and 2.7 < np.mean(counts) < 3.3  # 1 + Poisson(2)
    assert all(0 <= j <= 8 for _ in range(50) for j in d.spawns(10))
