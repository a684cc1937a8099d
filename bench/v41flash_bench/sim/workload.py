"""Workloads for the autoscaling simulator: AgentX-like agent sessions (from v41flash_bench.agentx, the
generator the routing benchmark uses too), arrival patterns, trace replay.

Everything here is decided before the simulation starts and from the scenario seed only, so every
policy sees the same sessions (same turns, prompts, outputs, think times, sub-agents, start times).
Only the pacing of a session's later turns depends on the policy (closed loop: the next turn is sent
``think`` seconds after the previous answer finished).

Prompts are paths of prefix *segments* (global system prompt, group prompt, session prompt, then one
segment per turn holding the previous answer + the new tool/user tokens). A segment is the unit the
prefix caches hold; a path shares its leading segments with every other request of the same session,
group or deployment, which is what makes agent traffic cache-friendly. Replayed traces with block
hashes are turned into segments by compressing runs of blocks that always occur together
(see ``segments_from_hash_paths``).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from v41flash_bench.agentx import AgentSession, SpecDraws, agent_session

# -------------------------------------------------------------------------------------------- specs


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogNormalSpec(_Spec):
    """Lognormal given by its median and sigma (of the log), clipped to [min, max]."""

    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: float = 1.0
    max: float = math.inf

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(x, self.min, self.max)


class QuantileSpec(_Spec):
    """A distribution given by quantiles, interpolated log-linearly (matches the given p50/p90/p99)."""

    quantiles: tuple[tuple[float, float], ...] = Field(
        description="(probability, value) pairs, increasing in both; must cover 0 and 1."
    )
    cap: float | None = Field(default=None, description="Values above this are cut to it.")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = np.array([q for q, _ in self.quantiles])
        v = np.log(np.array([max(x, 1e-9) for _, x in self.quantiles]))
        x = np.exp(np.interp(rng.random(n), p, v))
        return np.minimum(x, self.cap) if self.cap is not None else x


# AgentX think/tool time between turns: p50 2.3 s, p90 37.5 s, p99 ~1,400 s (public trace scan).
AGENTX_THINK = QuantileSpec(
    quantiles=((0.0, 0.2), (0.5, 2.3), (0.9, 37.5), (0.99, 1400.0), (1.0, 3600.0)), cap=60.0
)


class AgentSessionSpec(_Spec):
    """Synthetic AgentX-like coding-agent sessions (numbers from the reference, see the bench doc)."""

    kind: Literal["agentx"] = "agentx"
    turns: LogNormalSpec = LogNormalSpec(median=43, sigma=0.8, min=2, max=400)
    new_tokens: LogNormalSpec = LogNormalSpec(median=4000, sigma=0.9, min=64, max=50000)
    output_tokens: LogNormalSpec = LogNormalSpec(median=444, sigma=1.0, min=16, max=16000)
    think_s: QuantileSpec = AGENTX_THINK
    global_prefix_tokens: int = Field(default=32000, ge=0, description="System prompt shared by all.")
    group_prefix_tokens: int = Field(default=10000, ge=0, description="Prompt shared by a group.")
    groups: int = Field(default=100, ge=1)
    group_zipf: float = Field(default=0.6, ge=0, description="Zipf exponent of group popularity.")
    session_prefix_tokens: int = Field(default=5000, ge=0, description="Per-session instructions.")
    subagent_probability: float = Field(default=0.44, ge=0, le=1)
    subagents_per_session: float = Field(default=1.5, ge=1, description="Mean, when a session spawns.")
    subagent_turns: LogNormalSpec = LogNormalSpec(median=8, sigma=0.7, min=1, max=100)
    max_context_tokens: int = Field(default=1_000_000, ge=1, description="A session ends here.")


class AgentxTraceSpec(_Spec):
    """Replay of SemiAnalysis cc-traces sessions: JSON list or JSONL of {id, block_size, requests}."""

    kind: Literal["agentx_trace"] = "agentx_trace"
    path: str
    think_cap_s: float = Field(default=10.0, gt=0, description="Harness rule: idle gaps capped.")
    time_scale: float = Field(default=1.0, gt=0, description="Session start times are multiplied.")
    repeat: int = Field(default=1, ge=1, description="Replay the trace this many times back to back.")


class MooncakeTraceSpec(_Spec):
    """Open-loop replay of Mooncake JSONL {timestamp_ms, input_length, output_length, hash_ids}."""

    kind: Literal["mooncake_trace"] = "mooncake_trace"
    path: str
    block_size: int = 512
    time_scale: float = Field(default=1.0, gt=0)


WorkloadSpec = AgentSessionSpec | AgentxTraceSpec | MooncakeTraceSpec


class ArrivalSpec(_Spec):
    """How many agent sessions are live over time (closed loop: concurrency = live sessions).

    The target concurrency is ``peak_rps × cycle`` scaled by the pattern's shape (1.0 at peak), where
    ``cycle`` is the mean seconds between two requests of one session (think time + a nominal turn
    latency). Sessions start as a renewal process whose rate keeps the live count on target.
    """

    pattern: Literal["steady", "diurnal", "bursty", "surge", "trace", "batch", "outage"] = "steady"
    peak_rps: float = Field(default=100.0, gt=0, description="Requests/s at the pattern's peak.")
    nominal_turn_latency_s: float = Field(
        default=8.0, gt=0, description="Assumed answer time per turn, used only to size concurrency."
    )
    cv: float = Field(default=1.0, gt=0, description="Inter-arrival CV of session starts (Gamma).")
    # steady
    level: float = Field(default=0.8, gt=0, le=1, description="steady: fraction of peak.")
    # diurnal: a cosine between trough and 1.0, lowest at t=0 and t=period
    trough: float = Field(default=0.55, gt=0, le=1, description="diurnal: lowest fraction of peak.")
    period_s: float | None = Field(default=None, description="diurnal period; default = duration.")
    phase: float = Field(default=0.0, ge=0, lt=1, description="diurnal: fraction of the period at t=0 (0 = trough).")
    weekend: float = Field(default=1.0, gt=0, le=1, description="diurnal: × on the 6th and 7th period of every 7 "
                                                                 "(a weekly shape: the period is a day).")
    weekday_at_0: int = Field(default=0, ge=0, le=6, description="diurnal: the day of the week at t=0 (0 = Monday).")
    # bursty: base level plus random bursts
    burst_every_s: float = Field(default=600.0, gt=0, description="bursty: mean gap between bursts.")
    burst_s: float = Field(default=120.0, gt=0, description="bursty: burst length.")
    burst_level: float = Field(default=1.0, gt=0, le=1, description="bursty: level during a burst.")
    # batch: bursts of burst_s every burst_every_s exactly (a scheduled job), the first at burst_offset_s
    burst_offset_s: float = Field(default=0.0, ge=0, description="batch: when the first job starts (t=0 is 00:00).")
    # surge: base → 1.0 at surge_at_s (within surge_ramp_s), back at surge_end_s (optional)
    base: float = Field(default=0.5, gt=0, le=1, description="bursty/surge: level outside a burst.")
    surge_at_s: float = 1200.0
    surge_ramp_s: float = Field(default=60.0, gt=0)
    surge_end_s: float | None = None
    # outage: ``level``, down to ``base`` at surge_at_s (within 30 s), back at surge_end_s within surge_ramp_s
    # trace: a public trace's requests per minute (v41flash_bench.sim.traces), 1.0 at the played part's peak
    trace: str | None = Field(default=None, description="trace: a shape in sim/traces/arrival-shapes.json, or the "
                              "path of a JSON file `v41flash bench trace-shape` wrote.")
    trace_offset_s: float = Field(default=0.0, ge=0, description="trace: trace second played at t = 0.")
    trace_time_scale: float = Field(default=1.0, gt=0, description="trace: trace seconds per simulated second.")

    @model_validator(mode="after")
    def _trace_named(self) -> ArrivalSpec:
        from v41flash_bench.sim import traces
        if self.pattern == "trace":
            try:
                traces.shape(self.trace or "")
            except ValueError as e:
                raise ValueError(f"arrivals.trace: {e}") from None
        if self.pattern != "trace" and self.trace is not None:
            raise ValueError("arrivals.trace is read only with pattern: trace")
        return self


# ------------------------------------------------------------------------------------------ sessions


@dataclass
class SessionPlan:
    """One agent session: its prompts are ``prefix`` + one segment per turn.

    ``children[j]`` are sub-agent sessions started when turn ``j`` finishes; the parent waits for all
    of them (a tool call) before its think time and next turn.
    """

    sid: int
    start: float  # seconds; sub-agents: ignored (started by the parent)
    prefix_ids: list[int]
    prefix_tokens: list[int]
    turn_seg_base: int  # segment id of turn 0; turn j is turn_seg_base + j
    turn_seg_tokens: list[int]  # tokens of turn j's segment (previous answer + new tokens)
    output_tokens: list[int]
    think_s: list[float]  # after turn j's answer (and its sub-agents), before turn j+1
    children: dict[int, list[SessionPlan]] = field(default_factory=dict)
    first_turn: int = 0  # pre-warmed sessions join mid-way
    explicit_paths: list[tuple[list[int], list[int]]] | None = None  # replay: (ids, tokens) per turn
    explicit_prompt: list[int] | None = None  # replay: prompt length per turn

    @property
    def turns(self) -> int:
        return len(self.output_tokens)

    def path(self, j: int) -> tuple[list[int], list[int]]:
        """Segment ids and their token counts of turn ``j``'s prompt."""
        if self.explicit_paths is not None:
            return self.explicit_paths[j]
        ids = self.prefix_ids + list(range(self.turn_seg_base, self.turn_seg_base + j + 1))
        return ids, self.prefix_tokens + self.turn_seg_tokens[: j + 1]

    def prompt_tokens(self, j: int) -> int:
        if self.explicit_prompt is not None:
            return self.explicit_prompt[j]
        return sum(self.prefix_tokens) + sum(self.turn_seg_tokens[: j + 1])

    def requests(self) -> int:
        """Requests this session and its sub-agents send from ``first_turn`` on."""
        own = self.turns - self.first_turn
        return own + sum(c.requests() for j, cs in self.children.items() if j >= self.first_turn for c in cs)


@dataclass
class Workload:
    """All sessions of a run, sorted by start time, plus figures for the report."""

    sessions: list[SessionPlan]
    open_loop: bool = False  # Mooncake replay: every request is its own one-turn session
    concurrency_target: float | None = None  # live sessions at peak (synthetic closed loop)
    notes: tuple[str, ...] = ()

    def total_requests(self) -> int:
        return sum(s.requests() for s in self.sessions)


class _Ids:
    """Segment id allocator (0 = the global system prompt, then groups, then everything else)."""

    def __init__(self, start: int) -> None:
        self.next = start

    def take(self, n: int) -> int:
        base = self.next
        self.next += n
        return base


def _zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _plan(s: AgentSession, ids: _Ids, start: float, prefix_ids: list[int], prefix_tokens: list[int]) -> SessionPlan:
    """A generated session as prefix-cache segments: the session's prefix, then one segment per turn
    holding the previous answer and the new tokens; sub-agents share the parent's prefix only."""
    seg = [s.new_tokens[0]] + [n + o for n, o in zip(s.new_tokens[1:], s.output_tokens)]
    plan = SessionPlan(
        sid=s.sid,
        start=start,
        prefix_ids=prefix_ids,
        prefix_tokens=prefix_tokens,
        turn_seg_base=ids.take(s.turns),
        turn_seg_tokens=seg,
        output_tokens=list(s.output_tokens),
        think_s=list(s.think_s),
    )
    for j, child in s.subagents:
        plan.children.setdefault(j, []).append(_plan(child, ids, math.nan, prefix_ids, prefix_tokens))
    return plan


def _new_sid(counter: list[int]) -> Callable[[], int]:
    def take() -> int:
        counter[0] += 1
        return counter[0] - 1
    return take


def _shape(arr: ArrivalSpec, duration: float, rng: np.random.Generator, start: float = 0.0):
    """The pattern's level (fraction of peak) as a vectorised function of time over [``start``, ``duration``): the
    run's shape, and its past from a negative ``start`` (a trace is scaled to the run's played part either way, and
    bursts are drawn from ``start`` on, so a past has bursts too)."""
    if arr.pattern == "steady":
        return lambda t: np.full_like(np.asarray(t, dtype=float), arr.level)
    if arr.pattern == "diurnal":
        period = arr.period_s or duration
        amp = 1.0 - arr.trough

        def diurnal(t):
            x = np.asarray(t, dtype=float) / period + arr.phase
            level = arr.trough + amp * 0.5 * (1.0 - np.cos(2.0 * np.pi * x))
            if arr.weekend < 1.0:  # days start at the trough (phase 0): the weekend's step is where load is lowest
                weekday = np.mod(np.floor(x) + arr.weekday_at_0, 7)
                level = np.where(weekday >= 5, level * arr.weekend, level)
            return level

        return diurnal
    if arr.pattern == "batch":

        def batch(t):
            t = np.asarray(t, dtype=float)
            since = np.mod(t - arr.burst_offset_s, arr.burst_every_s)  # seconds into the current job's cycle
            on = np.clip(since / 30.0, 0, 1) * np.clip((arr.burst_s - since) / 30.0, 0, 1)
            return arr.base + (arr.burst_level - arr.base) * on

        return batch
    if arr.pattern == "surge":

        def surge(t):
            t = np.asarray(t, dtype=float)
            up = np.clip((t - arr.surge_at_s) / arr.surge_ramp_s, 0.0, 1.0)
            level = arr.base + (1.0 - arr.base) * up
            if arr.surge_end_s is not None:
                down = np.clip((t - arr.surge_end_s) / arr.surge_ramp_s, 0.0, 1.0)
                level = level - (1.0 - arr.base) * down
            return level

        return surge
    if arr.pattern == "outage":

        def outage(t):
            t = np.asarray(t, dtype=float)
            down = np.clip((t - arr.surge_at_s) / 30.0, 0.0, 1.0)
            end = arr.surge_end_s if arr.surge_end_s is not None else math.inf
            back = np.clip((t - end) / arr.surge_ramp_s, 0.0, 1.0)
            return arr.level - (arr.level - arr.base) * down * (1.0 - back)

        return outage
    if arr.pattern == "trace":
        from v41flash_bench.sim import traces
        return traces.level(arr.trace, arr.trace_offset_s, arr.trace_time_scale, duration)
    # bursty: bursts at exponential gaps; levels ramp over 30 s so the rate has no infinite jumps
    starts, t = [], start + float(rng.exponential(arr.burst_every_s))
    while t < duration:
        starts.append(t)
        t += arr.burst_s + float(rng.exponential(arr.burst_every_s))
    bursts = np.array(starts)

    def bursty(tt):
        tt = np.asarray(tt, dtype=float)
        level = np.full_like(tt, arr.base)
        for b in bursts:
            on = np.clip((tt - b) / 30.0, 0, 1) * np.clip((b + arr.burst_s - tt) / 30.0, 0, 1)
            level = np.maximum(level, arr.base + (arr.burst_level - arr.base) * on)
        return level

    return bursty


def _closed_loop_calibration(spec: AgentSessionSpec, arrivals: ArrivalSpec, seed: int) -> tuple[float, float]:
    """(seconds between two requests of one session, mean session lifetime), from a calibration sample drawn from
    its own stream (keeps the seed's sessions)."""
    cal_rng = np.random.default_rng([seed, 1])
    think = spec.think_s.sample(cal_rng, 20000)
    cycle = float(think.mean()) + arrivals.nominal_turn_latency_s
    cal_draws, cal_sid = SpecDraws(cal_rng, spec), _new_sid([0])
    reqs = []
    for _ in range(400):
        tree = agent_session(cal_draws, 0, cal_sid, prefix_tokens=spec.global_prefix_tokens,
                             max_context_tokens=spec.max_context_tokens)
        reqs.append(tree.turns + sum(c.turns for _, c in tree.subagents))
    return cycle, float(np.mean(reqs)) * cycle


def past_demand(spec: AgentSessionSpec, arrivals: ArrivalSpec, seed: int, start_s: float, bucket_s: float,
                noise_cv: float, duration_s: float = 1.0, shift_s: float = 0.0) -> list[float]:
    """The request rate (req/s) the planner would have recorded over [start_s, 0), one mean per bucket: what its
    status holds when the run starts. Sessions start at the rate the workload uses (live target ÷ lifetime + its
    growth) and end after a lifetime on average (an exponential survival), so the live count lags the target as
    in the run; each bucket's mean carries lognormal noise of ``noise_cv`` (seeded from the scenario's seed).
    ``duration_s``: the run's length, which a trace's scale (1.0 at the played part's busiest minute) is taken over,
    as in the run — not over the past's first second. ``shift_s``: the past follows the shape ``shift_s`` later
    than the run does (an hour's clock change: the day's own data is the only witness)."""
    cycle, lifetime = _closed_loop_calibration(spec, arrivals, seed)
    peak_live = arrivals.peak_rps * cycle
    burn = 5.0 * lifetime
    shape = _shape(arrivals, duration_s, np.random.default_rng([seed, 2]), start=start_s - burn)
    grid = np.arange(start_s - burn, 0.0, 1.0)
    target = peak_live * shape(grid + shift_s)
    lam = target / lifetime + np.maximum(0.0, np.gradient(target, grid))
    live = np.empty_like(grid)
    x = float(target[0])
    for i in range(len(grid)):  # dL/dt = starts − L / lifetime
        live[i] = x
        x += lam[i] - x / lifetime
    rate = live / cycle
    keep = grid >= start_s
    rate, t = rate[keep], grid[keep]
    n = int(round(-start_s / bucket_s))
    idx = np.floor((t - start_s) / bucket_s).astype(int)
    means = np.bincount(idx, weights=rate, minlength=n)[:n] / np.maximum(1, np.bincount(idx, minlength=n)[:n])
    rng = np.random.default_rng([seed, 3])
    sigma = math.sqrt(math.log(1 + noise_cv**2))
    return [float(m * math.exp(sigma * rng.standard_normal() - sigma**2 / 2)) for m in means]


def build_agentx_workload(
    spec: AgentSessionSpec, arrivals: ArrivalSpec, duration: float, seed: int
) -> Workload:
    """Sessions whose live count follows ``arrivals`` (closed loop), with a warm population at t=0.

    Start rate λ(t) = L(t)/T + max(0, dL/dt) (Little's law plus growth), T the mean session lifetime;
    inter-arrival times are Gamma with the pattern's CV on the time axis warped by λ.
    """
    rng = np.random.default_rng(seed)
    ids = _Ids(1 + spec.groups + 1)
    group_w = _zipf_weights(spec.groups, spec.group_zipf)

    draws = SpecDraws(rng, spec)
    new_sid = _new_sid([0])

    def new_root(start: float) -> SessionPlan:
        g = int(rng.choice(spec.groups, p=group_w))
        sp = ids.take(1)
        prefix_ids = [0, 1 + g, sp]
        prefix_tokens = [spec.global_prefix_tokens, spec.group_prefix_tokens, spec.session_prefix_tokens]
        tree = agent_session(draws, new_sid(), new_sid, prefix_tokens=sum(prefix_tokens),
                             max_context_tokens=spec.max_context_tokens)
        return _plan(tree, ids, start, prefix_ids, prefix_tokens)

    # Size concurrency from a calibration sample drawn from its own stream (keeps the seed's sessions).
    cycle, lifetime = _closed_loop_calibration(spec, arrivals, seed)
    peak_live = arrivals.peak_rps * cycle
    shape = _shape(arrivals, duration, rng)

    # Warm start: the live population at t=0, each joined at a random turn (its earlier turns happened
    # before the run; the simulator puts their context in a prefix cache). Each one's first request
    # comes at a uniform point of its own gap (think + a nominal answer time), not all in one cycle.
    sessions: list[SessionPlan] = []
    n0 = int(round(peak_live * float(shape(0.0))))
    for _ in range(n0):
        s = new_root(0.0)
        s.first_turn = int(rng.integers(0, s.turns))
        gap = s.think_s[max(0, s.first_turn - 1)] + arrivals.nominal_turn_latency_s
        s.start = float(rng.uniform(0.0, gap))
        sessions.append(s)

    # Starts: integrate λ on a 1-s grid, then place Gamma renewal points on the cumulative intensity.
    grid = np.arange(0.0, duration + 1.0, 1.0)
    live = peak_live * shape(grid)
    lam = live / lifetime + np.maximum(0.0, np.gradient(live, grid))
    cum = np.concatenate([[0.0], np.cumsum(lam[:-1] * np.diff(grid))])
    k = 1.0 / arrivals.cv**2
    u = 0.0
    while True:
        u += float(rng.gamma(k, 1.0 / k))
        if u >= cum[-1]:
            break
        sessions.append(new_root(float(np.interp(u, cum, grid))))
    sessions.sort(key=lambda s: (s.start, s.sid))
    notes = (
        f"closed loop: {peak_live:.0f} live sessions at peak (cycle {cycle:.1f} s/turn, "
        f"mean lifetime {lifetime:.0f} s), {n0} live at t=0",
    )
    return Workload(sessions=sessions, concurrency_target=peak_live, notes=notes)


# -------------------------------------------------------------------------------------------- traces


def segments_from_hash_paths(
    paths: Sequence[Sequence[int]], block_size: int, id_base: int = 0
) -> list[tuple[list[int], list[int]]]:
    """Compress block-hash paths into segment paths (radix-tree edges) with token counts.

    Blocks are identified by their whole prefix (a trie), like vLLM's chained block hashes. A segment
    ends where the trie branches or a request's prompt ends, so a segment is cached or not as a whole
    exactly when its blocks would be under LRU-with-path-touch; this keeps replay cost per request
    proportional to the number of turns, not of blocks.
    """
    children: dict[int, int] = {}  # trie node → number of distinct children
    ends: set[int] = set()
    node_of: dict[tuple[int, int], int] = {}
    node_paths: list[list[int]] = []
    for p in paths:
        parent, nodes = -1, []
        for h in p:
            key = (parent, int(h))
            node = node_of.get(key)
            if node is None:
                node = node_of[key] = len(node_of)
                children[parent] = children.get(parent, 0) + 1
            nodes.append(node)
            parent = node
        if nodes:
            ends.add(nodes[-1])
        node_paths.append(nodes)
    out = []
    for nodes in node_paths:
        ids, toks, run = [], [], 0
        for node in nodes:
            run += 1
            if node in ends or children.get(node, 0) != 1:
                ids.append(id_base + node)
                toks.append(run * block_size)
                run = 0
        out.append((ids, toks))
    return out


def _read_json_records(path: str | Path) -> list[dict]:
    text = Path(path).read_text(encoding="utf-8").strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_agentx_trace(spec: AgentxTraceSpec, seed: int = 0) -> Workload:
    """Closed-loop replay: each session's requests in order, idle gaps = think_time (capped).

    Only the session's first request time is taken from the trace; later ones follow the previous
    answer (the harness's closed loop). Cache sharing is exactly the trace's block hashes; a later
    repetition gets its own segment ids (its sessions are new sessions).
    """
    records = _read_json_records(spec.path)
    flat, meta = [], []
    for rec in records:
        bs = int(rec.get("block_size", 64))
        reqs = sorted(rec["requests"], key=lambda r: float(r.get("t", 0.0)))
        for r in reqs:
            flat.append([int(h) for h in r.get("hash_ids", [])])
        meta.append((rec, bs, reqs))
    bss = {bs for _, bs, _ in meta}
    if len(bss) > 1:
        raise ValueError(f"{spec.path}: mixed block sizes {sorted(bss)} are not supported")
    bs = bss.pop() if bss else 64
    segs = segments_from_hash_paths(flat, bs, id_base=1)
    t0 = min((float(reqs[0].get("t", 0.0)) for _, _, reqs in meta if reqs), default=0.0)
    sessions: list[SessionPlan] = []
    span = max((float(reqs[0].get("t", 0.0)) - t0 for _, _, reqs in meta if reqs), default=0.0) + 1.0
    stride = 1 + sum(len(p) for p in flat)  # above every trie node id
    sid = 0
    for rep in range(spec.repeat):
        i = 0
        for rec, _, reqs in meta:
            if not reqs:
                continue
            paths, prompts, outs, thinks = [], [], [], []
            for k, r in enumerate(reqs):
                ids, toks = segs[i + k]
                shift = rep * stride
                paths.append(([x + shift for x in ids], list(toks)))
                prompts.append(int(r.get("in", sum(toks))))
                outs.append(max(1, int(r.get("out", 1))))
                nxt = reqs[k + 1] if k + 1 < len(reqs) else None
                think = float(nxt.get("think_time", 0.0)) if nxt is not None else 0.0
                thinks.append(min(max(0.0, think), spec.think_cap_s))
            i += len(reqs)
            start = (float(reqs[0].get("t", 0.0)) - t0) * spec.time_scale + rep * span * spec.time_scale
            sessions.append(
                SessionPlan(
                    sid=sid, start=start, prefix_ids=[], prefix_tokens=[], turn_seg_base=0,
                    turn_seg_tokens=[], output_tokens=outs, think_s=thinks,
                    explicit_paths=paths, explicit_prompt=prompts,
                )
            )
            sid += 1
    sessions.sort(key=lambda s: (s.start, s.sid))
    return Workload(sessions=sessions, notes=(f"AgentX trace replay: {spec.path} × {spec.repeat}",))


def load_mooncake_trace(spec: MooncakeTraceSpec) -> Workload:
    """Open-loop replay: each line is one request at ``timestamp_ms``."""
    records = _read_json_records(spec.path)
    records.sort(key=lambda r: float(r["timestamp_ms"]))
    segs = segments_from_hash_paths([r.get("hash_ids", []) for r in records], spec.block_size)
    t0 = float(records[0]["timestamp_ms"]) if records else 0.0
    sessions = []
    for sid, (r, (ids, toks)) in enumerate(zip(records, segs)):
        sessions.append(
            SessionPlan(
                sid=sid, start=(float(r["timestamp_ms"]) - t0) / 1000.0 * spec.time_scale,
                prefix_ids=[], prefix_tokens=[], turn_seg_base=0, turn_seg_tokens=[],
                output_tokens=[max(1, int(r["output_length"]))], think_s=[0.0],
                explicit_paths=[(ids, toks)], explicit_prompt=[int(r["input_length"])],
            )
        )
    return Workload(sessions=sessions, open_loop=True, notes=(f"Mooncake replay: {spec.path}",))


def build_workload(spec: WorkloadSpec, arrivals: ArrivalSpec, duration: float, seed: int) -> Workload:
    if isinstance(spec, AgentSessionSpec):
        return build_agentx_workload(spec, arrivals, duration, seed)
    if isinstance(spec, AgentxTraceSpec):
        return load_agentx_trace(spec, seed)
    return load_mooncake_trace(spec)
