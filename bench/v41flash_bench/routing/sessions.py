"""AgentX-like multi-turn agent sessions, scaled down for a 2-core loopback benchmark, and their oracle.

A session resends its whole context every turn (system prefix shared by all sessions, then its own
turns) and appends the new tokens of the latest tool result; some sessions spawn one sub-agent that
starts from the parent's context at that turn (AgentX: ~44 % of sessions spawn sub-agents sharing the
parent's prefix) and the parent waits for it. Text is made of unique words so that one word is one
token for llm-d-inference-sim's dummy tokenizer and no two sessions share anything but the system
prefix (AgentX replay rule: each session's first turn carries a unique marker).

The sessions' shape (turns, token counts, think times, which turn spawns the sub-agent) comes from the
shared AgentX generator (v41flash_bench.agentx, ScaledDraws); this module renders it as chat messages.
Everything here is pure and seeded: the same RoutingScenario gives the same trace on every run.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from v41flash_bench.agentx import AgentSession, ScaledDraws, agent_session


ARRIVAL_KINDS = ("poisson",)


@dataclass(frozen=True)
class Arrivals:
    """Open-loop arrivals (``scenario: arrivals: {kind: poisson, sessionsPerSecond: R, durationS: D}``): root
    sessions start at the times of a Poisson process of rate R over D seconds instead of all at t = 0. The figures
    are taken over the steady window [steadyAfterS, D]: after the live sessions have built up (default: the first
    30 % of D), until arrivals stop (the tail that drains after it is left out)."""
    kind: str = "poisson"
    sessions_per_second: float = 1.0
    duration_s: float = 60.0
    steady_after_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrivals.kind must be one of {', '.join(ARRIVAL_KINDS)}, not {self.kind!r}")
        if not self.sessions_per_second > 0 or not self.duration_s > 0:
            raise ValueError("arrivals: sessionsPerSecond and durationS must be > 0")
        if self.steady_after_s is not None and not 0 <= self.steady_after_s < self.duration_s:
            raise ValueError("arrivals.steadyAfterS must be within [0, durationS)")

    @property
    def window(self) -> tuple[float, float]:
        """The steady window (s after the first arrival's start)."""
        start = self.duration_s * 0.3 if self.steady_after_s is None else self.steady_after_s
        return start, self.duration_s

    @classmethod
    def from_doc(cls, doc: dict) -> Arrivals:
        """From the scenario file's camelCase keys (the names traces from elsewhere use)."""
        names = {"kind": "kind", "sessionsPerSecond": "sessions_per_second", "durationS": "duration_s",
                 "steadyAfterS": "steady_after_s"}
        unknown = set(doc) - set(names)
        if unknown:
            raise ValueError(f"arrivals: unknown keys {sorted(unknown)} (known: {', '.join(names)})")
        return cls(**{names[k]: v for k, v in doc.items()})

    def times(self, seed: int) -> list[float]:
        """The root sessions' start times (seeded)."""
        rng = random.Random(seed * 7919 + 1)
        out, t = [], 0.0
        while True:
            t += rng.expovariate(self.sessions_per_second)
            if t >= self.duration_s:
                return out
            out.append(t)


@dataclass(frozen=True)
class RoutingScenario:
    """Workload shape. Token figures are AgentX's divided by ``token_scale`` (see docs/*-routing.md)."""
    name: str = "agentx-small"
    seed: int = 41
    engines: int = 4
    sessions: int = 16  # root sessions, all live at once (closed loop: concurrency = live sessions)
    turns_min: int = 6
    turns_max: int = 12
    system_tokens: int = 1000  # shared by every session (AgentX: 32k global shared prefix)
    first_turn_tokens: int = 150  # per-session prefix (AgentX: ~5k)
    new_tokens_median: int = 125  # lognormal new tokens per turn (AgentX: median 4k, mean 6k)
    new_tokens_mean: int = 190
    new_tokens_max: int = 1500
    output_tokens_median: int = 25  # lognormal output (AgentX: median 800, mean 1k)
    output_tokens_mean: int = 32
    output_tokens_max: int = 200
    subagent_fraction: float = 0.44  # sessions that spawn one sub-agent sharing the parent's prefix
    subagent_turns_min: int = 3
    subagent_turns_max: int = 5
    subagent_task_tokens: int = 100
    agentic_think_fraction: float = 0.7  # 70 % agentic (mean 5 s) / 30 % human (mean 30 s) gaps
    agentic_think_mean_s: float = 5.0
    human_think_mean_s: float = 30.0
    think_cap_s: float = 10.0  # AgentX replay caps idle gaps at 10 s
    time_scale: float = 0.02  # think times are multiplied by this (10 s cap -> 0.2 s)
    block_size: int = 16  # engine KV block size (tokens); hits are counted in whole blocks
    kv_cache_blocks: int = 40000  # per engine: 20M tokens per H200 / token_scale 32 / 16-token blocks
    token_scale: int = 32  # documentation only: how far token sizes were divided
    arrivals: Arrivals | None = None  # None: closed loop (every session live from t = 0); else open loop

    def __post_init__(self) -> None:
        if isinstance(self.arrivals, dict):
            object.__setattr__(self, "arrivals", Arrivals.from_doc(self.arrivals))
        if self.engines < 1 or self.sessions < 1:
            raise ValueError("engines and sessions must be >= 1")
        if not 1 <= self.turns_min <= self.turns_max:
            raise ValueError("need 1 <= turns_min <= turns_max")
        if not 1 <= self.subagent_turns_min <= self.subagent_turns_max:
            raise ValueError("need 1 <= subagent_turns_min <= subagent_turns_max")
        if not 0.0 <= self.subagent_fraction <= 1.0:
            raise ValueError("subagent_fraction must be within [0, 1]")


@dataclass(frozen=True)
class Turn:
    messages: tuple[tuple[str, str], ...]  # (role, content), the whole context sent this turn
    max_tokens: int
    think_s: float  # pause before this turn is sent (0 for a session's first turn)


@dataclass(frozen=True)
class Session:
    id: str  # what a client would send as its session id (x-session-id)
    root: str  # the root session this one belongs to (itself, or the parent of a sub-agent)
    turns: tuple[Turn, ...]
    subagent: Session | None = None
    spawn_after_turn: int = -1  # the parent runs its sub-agent after this turn index, then goes on
    start_s: float = 0.0  # open loop: when the session's first turn is sent (s after the replay's start)

    def requests(self) -> Iterable[tuple[Session, Turn]]:
        """This session's requests in the order one client sends them (sub-agent inline)."""
        for i, turn in enumerate(self.turns):
            yield self, turn
            if self.subagent is not None and i == self.spawn_after_turn:
                yield from self.subagent.requests()


@dataclass(frozen=True)
class Trace:
    scenario: RoutingScenario
    sessions: tuple[Session, ...] = field(default=())

    def requests(self) -> list[tuple[Session, Turn]]:
        return [r for s in self.sessions for r in s.requests()]


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def _conversation(s: AgentSession, name: str,
                  start: list[tuple[str, str]]) -> tuple[list[Turn], list[list[tuple[str, str]]]]:
    """A generated session's turns as chat requests; also returns the context sent at each turn (for
    sub-agents). Turn 0's user message is the task; each later turn appends the previous answer and
    the new tool result to the whole context it resends."""
    context = [*start, ("user", _words(f"{name}u", s.new_tokens[0]))]
    turns: list[Turn] = []
    contexts: list[list[tuple[str, str]]] = []
    for t in range(s.turns):
        if t > 0:
            context = [*context, ("assistant", _words(f"{name}a{t}w", s.output_tokens[t - 1])),
                       ("user", _words(f"{name}t{t}w", s.new_tokens[t]))]
        turns.append(Turn(tuple(context), s.output_tokens[t], 0.0 if t == 0 else s.think_s[t - 1]))
        contexts.append(list(context))
    return turns, contexts


def build_trace(sc: RoutingScenario, prefix: str = "") -> Trace:
    """The scenario's root sessions (from the shared AgentX generator, ScaledDraws) as chat requests; ``prefix``
    starts every session's name (and so its words: sessions of two prefixes share only the system prompt)."""
    draws = ScaledDraws(random.Random(sc.seed), sc)
    system = ("system", _words("sys", sc.system_tokens))
    sessions: list[Session] = []
    starts = sc.arrivals.times(sc.seed) if sc.arrivals is not None else [0.0] * sc.sessions
    sub_ids = itertools.count(len(starts))  # the tree's numbers; requests carry the names s<i>, s<i>.sub
    for i, start in enumerate(starts):
        sid = f"{prefix}s{i}"
        tree = agent_session(draws, i, sub_ids.__next__)
        turns, contexts = _conversation(tree, sid, [system])
        sub, spawn = None, -1
        if tree.subagents:
            ((spawn, child),) = tree.subagents  # ScaledDraws spawns at most one
            sub_id = f"{sid}.sub"
            # The sub-agent inherits the parent's context (shared prefix) and gets its own task.
            parent_ctx = [*contexts[spawn], ("assistant", _words(f"{sid}a{spawn}sw", turns[spawn].max_tokens))]
            sub_turns, _ = _conversation(child, sub_id, parent_ctx)
            sub = Session(sub_id, sid, tuple(sub_turns))
        sessions.append(Session(sid, sid, tuple(turns), sub, spawn, start))
    return Trace(sc, tuple(sessions))


def block_chain(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a token sequence (block i's hash covers tokens 0..i)."""
    out: list[int] = []
    h = 0
    for b in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[b * block_size:(b + 1) * block_size])))
        out.append(h)
    return out


@dataclass(frozen=True)
class OracleResult:
    hit_tokens: int
    prompt_tokens: int
    placement: dict[str, int]  # root session -> engine
    per_request: tuple[int, ...] = ()  # hit tokens of each request, in order

    def rate_of(self, requests: Sequence[int], tokens: Sequence[int]) -> float:
        """The oracle's hit rate over some of the requests (indices; tokens: every request's prompt length)."""
        total = sum(tokens[i] for i in requests)
        return sum(self.per_request[i] for i in requests) / total if total else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def oracle(requests: Sequence[tuple[str, Sequence[int]]], engines: int, block_size: int) -> OracleResult:
    """Best hit rate routing can reach: each root session (with its sub-agents) on one engine, cache infinite.

    ``requests`` are (root session id, prompt token ids) in send order. Roots are placed round-robin in
    order of first appearance (even spread); a request hits the longest run of leading full blocks
    already stored on its engine, the way the engines count prefix-cache hits.
    """
    placement: dict[str, int] = {}
    stored: list[set[int]] = [set() for _ in range(engines)]
    hits = total = 0
    per: list[int] = []
    for root, tokens in requests:
        engine = placement.setdefault(root, len(placement) % engines)
        chain = block_chain(tokens, block_size)
        n = 0
        while n < len(chain) and chain[n] in stored[engine]:
            n += 1
        hits += n * block_size
        per.append(n * block_size)
        total += len(tokens)
        stored[engine].update(chain)
    return OracleResult(hits, total, placement, tuple(per))


def pinned_uncached(requests: Sequence[tuple[str, Sequence[int]]], block_size: int) -> list[int]:
    """Prompt tokens each request computes when every root session keeps one engine of its own (cache
    infinite): its tokens less the leading full blocks its root already stored. The shared system
    prefix counts as computed once per root, which is what a spread-out placement pays."""
    stored: dict[str, set[int]] = {}
    out = []
    for root, tokens in requests:
        seen = stored.setdefault(root, set())
        chain = block_chain(tokens, block_size)
        n = 0
        while n < len(chain) and chain[n] in seen:
            n += 1
        out.append(len(tokens) - n * block_size)
        seen.update(chain)
    return out


def balanced_placement(work: dict[str, float], engines: int) -> dict[str, int]:
    """Clairvoyant whole-session placement: longest-processing-time first, each root session (with its
    sub-agents) onto the engine with the least work so far. In a closed loop an engine's time-averaged
    running requests are the busy time of its sessions over the run, so this bounds the load spread any
    router can reach while keeping sessions whole (LPT is within 4/3 of the best packing)."""
    load = [0.0] * engines
    placement: dict[str, int] = {}
    for root in sorted(work, key=lambda r: (-work[r], r)):
        e = min(range(engines), key=lambda i: (load[i], i))
        placement[root] = e
        load[e] += work[root]
    return placement
