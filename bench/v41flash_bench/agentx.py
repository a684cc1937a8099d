"""AgentX-like agent sessions: the one workload generator of the routing benchmark and the autoscaling
simulator.

An agent session is a conversation of turns. Turn 0 sends the task; every later turn resends the whole
context plus the previous answer and the new tool result. Each turn has its new tokens, its answer's
output tokens and a think pause after the answer. Some sessions spawn sub-agents after a turn (AgentX:
~44 % of sessions). A sub-agent shares a prefix with its parent, runs its own turns, and the parent
waits for it before going on; sub-agents spawn nothing. How much it shares is the renderer's: the
routing benchmark gives it the parent's whole context at the spawn turn, the simulator the parent's
system prompts. A session whose context (prefix + every turn's new and output tokens) would pass
``max_context_tokens`` ends at the last turn that fits (a sub-agent counts the parent's prefix).

``agent_session`` builds that tree; the numbers come from a ``SessionDraws``. There are two, one per
benchmark, because their workloads have always been drawn differently (keeping each draw order keeps
each benchmark's workload identical):

* ``ScaledDraws``: AgentX scaled down for a 2-core loopback benchmark (`random.Random`, lognormals given
  by median and mean, a uniform turn count, an agentic/human mixture of exponential think times, at
  most one sub-agent); the routing benchmark renders the sessions as chat messages;
* ``SpecDraws``: AgentX at full size from an ``AgentSessionSpec`` (numpy, lognormals by median and
  sigma, AgentX's quantiles of think time, a Poisson number of sub-agents); the autoscaling
  simulator renders the sessions as prefix-cache segments.
"""
from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from v41flash_bench.routing.sessions import RoutingScenario
    from v41flash_bench.sim.workload import AgentSessionSpec


@dataclass(frozen=True)
class AgentSession:
    """One agent's conversation, token counts only (a benchmark turns it into prompts)."""
    sid: int
    new_tokens: tuple[int, ...]  # turn 0: the task; later turns: the tool result (the previous answer
    #                              is resent too, see output_tokens)
    output_tokens: tuple[int, ...]
    think_s: tuple[float, ...]  # the pause after turn j's answer (and its sub-agents), before turn j+1
    subagents: tuple[tuple[int, AgentSession], ...] = ()  # (after turn j, sub-agent), in spawn order

    @property
    def turns(self) -> int:
        return len(self.output_tokens)


class SessionDraws(Protocol):
    """Where a session's numbers come from, in the order agent_session asks for them."""

    def root_turns(self) -> int: ...

    def turns(self, n: int, subagent: bool) -> tuple[list[int], list[int], list[float]]:
        """new tokens, output tokens and think-after seconds of n turns."""

    def spawns(self, turns: int) -> list[int]:
        """The turns (< turns - 1, ascending) after which a sub-agent starts; [] for none."""

    def subagent_turns(self) -> int: ...


def agent_session(draws: SessionDraws, sid: int, new_sid: Callable[[], int], *, prefix_tokens: int = 0,
                  max_context_tokens: int | None = None) -> AgentSession:
    """A root session and its sub-agents (their ids from new_sid, in spawn order)."""
    return _session(draws, sid, new_sid, draws.root_turns(), True, prefix_tokens, max_context_tokens)


def _session(draws: SessionDraws, sid: int, new_sid: Callable[[], int], n_turns: int, may_spawn: bool,
             prefix_tokens: int, max_context_tokens: int | None) -> AgentSession:
    new, out, think = draws.turns(n_turns, not may_spawn)
    keep = n_turns
    if max_context_tokens is not None:
        # the context after turn j's answer: prefix + all new and output tokens of turns 0..j
        ctx = [prefix_tokens + c for c in accumulate(n + o for n, o in zip(new, out))]
        keep = max(1, bisect.bisect_right(ctx, max_context_tokens))
    subagents = []
    if may_spawn and keep > 1:
        for j in draws.spawns(keep):
            n = draws.subagent_turns()
            # a sub-agent shares its parent's prefix and has the same context limit
            subagents.append((j, _session(draws, new_sid(), new_sid, n, False, prefix_tokens, max_context_tokens)))
    return AgentSession(sid, tuple(new[:keep]), tuple(out[:keep]), tuple(think[:keep]), tuple(subagents))


class ScaledDraws:
    """The routing benchmark's numbers (RoutingScenario), from one random.Random.

    Per turn t: the new tokens (t > 0; turn 0 sends the fixed task), the output tokens, then the think
    pause before the turn (t > 0). A session with at least two turns spawns one sub-agent with
    probability subagent_fraction, after a uniformly chosen turn other than its last."""

    def __init__(self, rng: random.Random, sc: RoutingScenario) -> None:
        self.rng, self.sc = rng, sc

    def _lognormal(self, median: int, mean: int, cap: int) -> int:
        """Lognormal with the given median and mean (mean > median), clipped to [1, cap]."""
        mu = math.log(median)
        sigma = math.sqrt(max(0.0, 2.0 * (math.log(mean) - mu)))
        return max(1, min(cap, int(round(self.rng.lognormvariate(mu, sigma)))))

    def _think(self) -> float:
        sc = self.sc
        mean = sc.agentic_think_mean_s if self.rng.random() < sc.agentic_think_fraction else sc.human_think_mean_s
        return round(min(self.rng.expovariate(1.0 / mean), sc.think_cap_s) * sc.time_scale, 4)

    def root_turns(self) -> int:
        return self.rng.randint(self.sc.turns_min, self.sc.turns_max)

    def turns(self, n: int, subagent: bool) -> tuple[list[int], list[int], list[float]]:
        sc = self.sc
        new = [sc.subagent_task_tokens if subagent else sc.first_turn_tokens]
        out: list[int] = []
        before: list[float] = []  # the pause before turn t (t > 0)
        for t in range(n):
            if t > 0:
                new.append(self._lognormal(sc.new_tokens_median, sc.new_tokens_mean, sc.new_tokens_max))
            out.append(self._lognormal(sc.output_tokens_median, sc.output_tokens_mean, sc.output_tokens_max))
            if t > 0:
                before.append(self._think())
        return new, out, before + [0.0]

    def spawns(self, turns: int) -> list[int]:
        if self.rng.random() < self.sc.subagent_fraction:
            return [self.rng.randint(0, turns - 2)]
        return []

    def subagent_turns(self) -> int:
        return self.rng.randint(self.sc.subagent_turns_min, self.sc.subagent_turns_max)


class SpecDraws:
    """The autoscaling simulator's numbers (AgentSessionSpec), from one numpy Generator.

    Per session: all turns' new tokens, then all output tokens, then all think times (vectorised); a
    session that spawns starts 1 + Poisson(subagents_per_session - 1) sub-agents after turns drawn
    uniformly (repeats allowed) from all but its last."""

    def __init__(self, rng: np.random.Generator, spec: AgentSessionSpec) -> None:
        self.rng, self.spec = rng, spec

    def root_turns(self) -> int:
        return int(self.spec.turns.sample(self.rng, 1)[0])

    def turns(self, n: int, subagent: bool) -> tuple[list[int], list[int], list[float]]:
        import numpy as np
        new = self.spec.new_tokens.sample(self.rng, n).astype(np.int64)
        out = self.spec.output_tokens.sample(self.rng, n).astype(np.int64)
        think = self.spec.think_s.sample(self.rng, n)
        return [int(x) for x in new], [int(x) for x in out], [float(x) for x in think]

    def spawns(self, turns: int) -> list[int]:
        if self.rng.random() < self.spec.subagent_probability:
            k = 1 + self.rng.poisson(self.spec.subagents_per_session - 1.0)
            return sorted(self.rng.integers(0, turns - 1, size=k).tolist())
        return []

    def subagent_turns(self) -> int:
        return int(self.spec.subagent_turns.sample(self.rng, 1)[0])
