"""Closed-form latency/capacity model built on a CapacityProfile (pure math, no state).

Prefill: each DP rank is modelled as an M/G/1 queue whose service time is the profile's prefill time
for the mean request (times the learned correction ``k``). The waiting-time tail uses the usual
heavy-traffic exponential approximation (Kingman mean, P(wait > 0) ≈ ρ)::

    W_p = 0                                                   if ρ ≤ 1 - p
    W_p = s (1 + cs²) / (2 (1 - ρ)) · ln(ρ / (1 - p))         otherwise
    TTFT_p(prefill part) = s + W_p

Decode: one rank at ``b`` running sequences emits a token every ``k · step(b, ctx) / tokensPerStep``
seconds; by Little's law the batch a rank holds at request rate λ_r is ``b = λ_r · OSL · ITL(b)``, a
linear fixed point solved exactly below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from v41flash.planner.profile import DecodeProfile, PrefillProfile

INF = math.inf


# ---------------------------------------------------------------- prefill
def prefill_wait_quantile(service_s: float, rho: float, percentile: float, cs2: float = 1.0) -> float:
    """p-quantile of the queueing delay of an M/G/1 server at utilization ``rho``."""
    if rho >= 1.0:
        return INF
    tail = 1.0 - percentile
    if rho <= tail or rho <= 0.0:
        return 0.0
    return service_s * (1.0 + cs2) / (2.0 * (1.0 - rho)) * math.log(rho / tail)


def prefill_ttft(
    prefill: PrefillProfile,
    rate: float,
    replicas: float,
    new_tokens: float,
    cached_tokens: float,
    percentile: float,
    correction: float = 1.0,
    ranks_per_replica: int | None = None,
    cs2: float = 1.0,
) -> float:
    """Predicted prefill-side TTFT (queue + prefill) at ``percentile`` with ``replicas`` serving."""
    service = prefill.request_seconds(new_tokens, cached_tokens) * correction
    ranks = replicas * (ranks_per_replica or prefill.data_parallel_size)
    if rate <= 0:
        return service
    if ranks <= 0:
        return INF
    rho = rate * service / ranks
    return service + prefill_wait_quantile(service, rho, percentile, cs2)


@dataclass(frozen=True)
class Need:
    replicas: float  # fractional replicas needed (0 when there is no demand)
    feasible: bool  # False: the target cannot be met at any replica count (sized for a sane level)


def prefill_replicas_needed(
    prefill: PrefillProfile,
    rate: float,
    new_tokens: float,
    cached_tokens: float,
    ttft_budget_s: float,
    percentile: float,
    correction: float = 1.0,
    target_utilization: float = 0.9,
    ranks_per_replica: int | None = None,
    cs2: float = 1.0,
) -> Need:
    """Fewest (fractional) replicas whose predicted prefill TTFT_p stays within ``ttft_budget_s``.

    ``correction`` scales the service time in both the queueing tail and the utilisation bound; the
    planner never passes one below the measured prefill-time ratio (or 1 while that is unmeasured).
    """
    if rate <= 0:
        return Need(0.0, True)
    dp = ranks_per_replica or prefill.data_parallel_size
    service = prefill.request_seconds(new_tokens, cached_tokens) * correction
    work = rate * service / dp  # replicas' worth of busy time per second
    lo = work / target_utilization

    def ttft(n: float) -> float:
        return prefill_ttft(prefill, rate, n, new_tokens, cached_tokens, percentile, correction, dp, cs2)

    if ttft(lo) <= ttft_budget_s:
        return Need(lo, True)
    hi = work / max(1e-9, 1.0 - percentile)  # ρ = 1 - p: no queueing at the percentile any more
    if ttft(hi) > ttft_budget_s:
        # unloaded prefill alone misses the budget: more replicas do not help beyond ρ ≈ 0.5
        return Need(max(lo, work / 0.5), False)
    for _ in range(60):  # TTFT is monotone decreasing in n: bisection is exact enough
        mid = 0.5 * (lo + hi)
        if ttft(mid) <= ttft_budget_s:
            hi = mid
        else:
            lo = mid
    return Need(hi, True)


# ---------------------------------------------------------------- decode
def decode_batch(decode: DecodeProfile, rate_per_rank: float, output_tokens: float, context: float, correction: float = 1.0) -> float:
    """Running sequences per rank at steady state (Little's law fixed point); inf when overloaded."""
    if rate_per_rank <= 0 or output_tokens <= 0:
        return 0.0
    c = decode.curve
    a = rate_per_rank * output_tokens * correction / decode.tokens_per_step
    slope = c.per_sequence + c.per_sequence_context * max(0.0, context)
    denom = 1.0 - a * slope
    if denom <= 0:
        return INF
    return a * c.overhead / denom


def decode_itl(
    decode: DecodeProfile, rate: float, replicas: float, output_tokens: float, context: float, correction: float = 1.0
) -> float:
    """Predicted mean ITL with ``replicas`` decoding ``rate`` req/s; inf when overloaded or KV-bound."""
    ranks = replicas * decode.data_parallel_size
    if rate > 0 and ranks <= 0:
        return INF
    b = decode_batch(decode, rate / ranks if ranks else 0.0, output_tokens, context, correction)
    if b > decode.max_batch_per_rank(context):
        return INF
    return decode.itl_seconds(b, context) * correction


def decode_replicas_needed(
    decode: DecodeProfile,
    rate: float,
    output_tokens: float,
    context: float,
    itl_budget_s: float,
    correction: float = 1.0,
    target_utilization: float = 0.9,
) -> Need:
    """Fewest (fractional) replicas whose ITL stays within budget: demand tokens/s ÷ per-replica tokens/s."""
    if rate <= 0 or output_tokens <= 0:
        return Need(0.0, True)
    batch = decode.batch_at_itl(itl_budget_s, context, correction)
    feasible = batch >= 1.0
    if not feasible:
        # even a lone sequence misses the ITL budget: size for light batches rather than give up
        batch = max(1.0, decode.batch_at_itl(decode.itl_seconds(1, context) * correction * 2, context, correction))
        itl = decode.itl_seconds(batch, context) * correction
    else:
        # a batch capped by max-num-seqs or the KV cache runs faster than the budget: use its own ITL
        itl = min(itl_budget_s, decode.itl_seconds(batch, context) * correction)
    tokens_per_s_per_replica = decode.data_parallel_size * batch / itl
    return Need(rate * output_tokens / tokens_per_s_per_replica / target_utilization, feasible)


def decode_slots_needed(
    decode: DecodeProfile,
    rate: float,
    output_tokens: float,
    context: float,
    itl_budget_s: float,
    percentile: float,
    correction: float = 1.0,
) -> Need:
    """Fewest (fractional) replicas whose sequence slots leave a request waiting for one rarely enough.

    A decode rank runs at most ``batch`` sequences (max-num-seqs, the KV cache, or the batch that meets the ITL
    budget); a request that finds every slot busy waits, and that wait is part of its TTFT. With ``a`` slots'
    worth of work in flight (rate × output tokens × ITL: Little's law), square-root staffing
    (Halfin–Whitt) keeps P(wait) near the TTFT percentile's tail with ``a + z·√a`` slots, z the normal
    quantile of the percentile: the queueing slack a 90 % utilisation target gives large fleets and denies
    small ones (a = 30 sequences needs 39 slots at p95, not 33).
    """
    if rate <= 0 or output_tokens <= 0:
        return Need(0.0, True)
    batch = max(1.0, decode.batch_at_itl(itl_budget_s, context, correction))
    itl = decode.itl_seconds(batch, context) * correction
    busy = rate * output_tokens * itl  # sequences in flight (Little's law) at that batch's ITL
    z = NormalDist().inv_cdf(min(0.999, max(0.5, percentile)))
    slots = busy + z * math.sqrt(busy)
    return Need(slots / (batch * decode.data_parallel_size), True)


# ---------------------------------------------------------------- feedback
def solve_correction(predict, observed: float, lo: float, hi: float) -> float:
    """k in [lo, hi] with predict(k) == observed, for predict increasing in k (bisection in log space)."""
    if predict(lo) >= observed:
        return lo
    if predict(hi) <= observed:
        return hi
    a, b = math.log(lo), math.log(hi)
    for _ in range(50):
        m = 0.5 * (a + b)
        if predict(math.exp(m)) < observed:
            a = m
        else:
            b = m
    return math.exp(0.5 * (a + b))
