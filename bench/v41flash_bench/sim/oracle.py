"""Hindsight oracle: per interval, the fewest replicas per role that meet the SLO for the load that
actually came — an estimate of the best any online policy could do.

Method (each step uses the simulator's *truth* profile, never the planner's):

1. Demand: a reference run with generous static capacity records every request (arrival, prompt,
   cached and output tokens). In a closed loop that is the most load the sessions can generate.
2. Prefill, per interval: replay the interval's prefill jobs (truth service times, the reference
   run's cache hits) through one FIFO queue over n·DP servers, plus the observed hand-over time;
   the smallest n whose TTFT percentile meets the target (binary search) is the *shape* of the need.
   Perfect pooling undershoots a real cache-affine router (sessions stay where their prefix is, so
   per-replica queues see the heavy tail of cache misses), so the shape is then *scaled*: the
   smallest factor f (bisection over full simulations) with which the schedule meets the SLO.
3. Decode, per interval: the steady-state batch per rank at the interval's request rate is the
   Little's-law fixed point b = λ·OSL·step(b)/tokensPerStep; the need is the smallest n with b within
   max-num-seqs/KV and p95(TTFT + OSL·ITL(b)) ≤ the e2e target over the interval's requests.
4. Cold starts and caches: a replica needed again within one cold start of being released is kept
   (restarting it would cost a whole cold start of GPU time), and a replica is only released if it
   is not needed for the next 5 minutes (releasing a prefill replica throws its prefix cache away);
   each replica is requested one cold start ahead.
5. Fix-up: simulate the schedule; for every scored 1-minute window that misses the SLO, add ~10 %
   (at least one replica) to the role that missed (prefill for TTFT, decode for the e2e rest) in that
   window and the two before, and simulate again (a few rounds). The last simulation is the oracle's result.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from v41flash.planner.profile import CapacityProfile
from v41flash.planner.datatypes import Slo


@dataclass(frozen=True)
class Demand:
    """Per-request figures from a reference run (arrays aligned by request)."""

    arrive: np.ndarray
    sid: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    out: np.ndarray
    handover: float  # mean prefill-done → first-token time (KV transfer + first step)


def demand_from_telemetry(tel) -> Demand:
    ho = float(np.mean(tel.ft_decode_ttft)) if tel.ft_decode_ttft else 0.0
    order = np.argsort(np.asarray(tel.arrive_t), kind="stable")
    return Demand(
        arrive=np.asarray(tel.arrive_t)[order], sid=np.asarray(tel.sid, dtype=np.int64)[order], prompt=np.asarray(tel.prompt, dtype=float)[order],
        cached=np.asarray(tel.cached, dtype=float)[order], out=np.asarray(tel.out, dtype=float)[order],
        handover=ho,
    )


def _pooled_fifo_latencies(arrive: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    """Latency through one FIFO queue feeding ``servers`` servers (perfect load balancing)."""
    free = [0.0] * servers
    out = np.empty(len(arrive))
    for i, (a, s) in enumerate(zip(arrive.tolist(), service.tolist())):
        t = heapq.heappop(free)
        done = (t if t > a else a) + s
        heapq.heappush(free, done)
        out[i] = done - a
    return out


def prefill_need(truth: CapacityProfile, d: Demand, t0: float, t1: float, slo: Slo,
                 lo_bound: int, hi_bound: int) -> int:
    m = (d.arrive >= t0) & (d.arrive < t1)
    if not m.any():
        return lo_bound
    arrive, prompt, cached, sid = d.arrive[m], d.prompt[m], d.cached[m], d.sid[m]
    pp = truth.prefill
    new = prompt - cached
    c = pp.curve
    # as in the engine: one step overhead per token-budget chunk (at least one step)
    service = c.overhead * np.maximum(1.0, new / pp.max_num_batched_tokens) + c.per_token * new \
        + c.per_token_context * new * (new + 2.0 * cached)
    target = slo.ttft_s - d.handover

    def ok(n: int) -> bool:
        lat = _pooled_fifo_latencies(arrive, service, n * pp.data_parallel_size)
        return float(np.percentile(lat, slo.ttft_percentile * 100)) <= target

    a, b = lo_bound, hi_bound
    if not ok(b):
        return b
    while a < b:
        mid = (a + b) // 2
        if ok(mid):
            b = mid
        else:
            a = mid + 1
    return a


def decode_need(truth: CapacityProfile, d: Demand, t0: float, t1: float, slo: Slo, ttft_est: float,
                lo_bound: int, hi_bound: int) -> int:
    m = (d.arrive >= t0) & (d.arrive < t1)
    if not m.any():
        return lo_bound
    out, prompt = d.out[m], d.prompt[m]
    rate = m.sum() / (t1 - t0)
    dp = truth.decode
    osl = float(out.mean())
    ctx = float(prompt.mean() + osl / 2)
    c = dp.curve
    slope = c.per_sequence + c.per_sequence_context * ctx
    for n in range(lo_bound, hi_bound + 1):
        ranks = n * dp.data_parallel_size
        a = rate / ranks * osl / dp.tokens_per_step
        if a * slope >= 1.0:
            continue
        b = a * c.overhead / (1.0 - a * slope)
        if b > dp.max_batch_per_rank(ctx):
            continue
        itl = dp.itl_seconds(max(1.0, b), ctx)
        if float(np.percentile(ttft_est + out * itl, 95)) <= slo.e2e_p95_s:
            return n
    return hi_bound


def keep_through_gaps(need: list[int], interval_s: float, cold_start_s: float) -> list[int]:
    """Raise the schedule so no replica is released and re-requested within one cold start."""
    s = list(need)
    max_gap = int(math.ceil(cold_start_s / interval_s))
    top = max(s) if s else 0
    for level in range(1, top + 1):
        idx = [i for i, v in enumerate(s) if v >= level]
        for a, b in zip(idx, idx[1:]):
            if 1 < b - a <= max_gap + 1:
                for i in range(a + 1, b):
                    s[i] = max(s[i], level)
    return s


def present_need(truth: CapacityProfile, d: Demand, slo: Slo, duration: float, interval_s: float,
                 bounds: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    """Per interval, each role's need for that interval's load alone (steps 2 and 3, no hold, no look-ahead)."""
    n = int(math.ceil(duration / interval_s))
    pre, dec = [], []
    for i in range(n):
        t0, t1 = i * interval_s, (i + 1) * interval_s
        pre.append(prefill_need(truth, d, t0, t1, slo, *bounds["prefill"]))
        dec.append(decode_need(truth, d, t0, t1, slo, slo.ttft_s, *bounds["decode"]))
    return {"prefill": pre, "decode": dec}


def initial_schedule(need: dict[str, list[int]], truth: CapacityProfile, interval_s: float,
                     hold_s: float = 300.0) -> dict[str, list[int]]:
    """The schedule's shape from ``present_need``: released only when not needed for ``hold_s``, cold-start
    gaps kept (step 4)."""
    hold = max(1, int(math.ceil(hold_s / interval_s)))
    return {r: keep_through_gaps(forward_max(need[r], hold), interval_s, getattr(truth, r).cold_start_seconds)
            for r in need}


def check_headroom(headroom: float) -> float:
    """The ceiling's headroom, or ValueError: a standing headroom below 1 would hold less than the need seen."""
    if not (math.isfinite(headroom) and headroom >= 1.0):
        raise ValueError(f"ceiling headroom {headroom:g}: give a number ≥ 1")
    return headroom


def no_foresight(need: dict[str, list[int]], factor: dict[str, float], headroom: float,
                 bounds: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    """The no-foresight ceiling's schedule: at every interval, ``headroom`` × the most that ``need`` × ``factor``
    (the oracle's scale) has asked for so far, within bounds; never released. Requested as each interval
    starts (no lead), so a replica for a new high arrives one cold start after the load that needs it."""
    return {role: [_times(v, factor.get(role, 1.0) * headroom, bounds[role]) for v in itertools.accumulate(s, max)]
            for role, s in need.items()}


def _times(replicas: float, factor: float, bounds: tuple[int, int]) -> int:
    """⌈replicas × factor⌉ within (min, max)."""
    return max(bounds[0], min(bounds[1], math.ceil(replicas * factor - 1e-9)))


def forward_max(need: list[int], k: int) -> list[int]:
    """s[i] = max(need[i:i+k]): a replica is released only if it is not needed for k intervals
    (releasing a prefill replica also throws away its prefix cache)."""
    return [max(need[i:i + k]) for i in range(len(need))]


def bump_failures(schedule: dict[str, list[int]], failed: list[tuple[int, bool, bool]],
                  bounds: dict[str, tuple[int, int]], factor: float = 1.1) -> int:
    """Add ~10 % (at least one replica) where 1-minute windows failed, in the window and the two
    before it (queues build up before they show): (interval index, ttft failed, e2e failed)."""
    changed = 0
    for i, ttft_bad, e2e_bad in failed:
        roles = (["prefill"] if ttft_bad else []) + (["decode"] if e2e_bad and not ttft_bad else [])
        if e2e_bad and ttft_bad:
            roles.append("decode")
        for role in roles:
            s = schedule[role]
            for j in (i - 2, i - 1, i):
                if 0 <= j < len(s) and s[j] < bounds[role][1]:
                    s[j] = min(bounds[role][1], max(s[j] + 1, math.ceil(s[j] * factor)))
                    changed += 1
    return changed


def scaled(schedule: dict[str, list[int]], factor: dict[str, float], bounds: dict[str, tuple[int, int]],
           interval_s: float, cold_start: dict[str, float]) -> dict[str, list[int]]:
    """The schedule × factor per role (rounded up, within bounds), cold-start gaps kept."""
    out = {}
    for role, s in schedule.items():
        raw = [_times(v, factor.get(role, 1.0), bounds[role]) for v in s]
        out[role] = keep_through_gaps(raw, interval_s, cold_start[role])
    return out


def settle_factor(attainment: Callable[[float], float], grid: tuple[float, ...], target: float,
                  max_factor: float = 5.0, tolerance: float = 0.05) -> float:
    """The smallest prefill scale factor whose schedule reaches ``target`` of windows, found so that it does not
    depend on the grid it starts from: the grid first (``attainment`` is a full simulation; its results are
    cached), then, if none passes, ×1.5 steps above it up to ``max_factor`` (the largest tried when none passes),
    then bisection between the largest failing and the smallest passing factor until they are within
    ``tolerance`` (relative). Two grids that both bracket the answer end within ``tolerance`` of each other."""
    seen: dict[float, float] = {}

    def ok(f: float) -> bool:
        f = round(f, 4)
        if f not in seen:
            seen[f] = attainment(f)
        return seen[f] >= target

    fs = sorted(grid)
    for f in fs:
        ok(f)
    passing = [f for f in seen if seen[f] >= target]
    f = fs[-1]
    while not passing and f < max_factor:
        f = min(max_factor, f * 1.5)
        if ok(f):
            passing.append(f)
    if not passing:
        return max(seen)
    hi = min(passing)
    failing = [x for x in seen if x < hi and seen[x] < target]
    if failing:
        lo = max(failing)
    else:  # the smallest tried passes: look below it, down to 1.0 (the pooled shape itself)
        lo = 1.0
        if hi <= lo:
            return hi
        if ok(lo):
            return lo
    while hi / lo > 1 + tolerance:
        mid = round((hi * lo) ** 0.5, 4)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
