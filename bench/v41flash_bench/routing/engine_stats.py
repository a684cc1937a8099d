"""What routing did, seen from the engines: prefix-cache hit rate and per-engine load spread (pure).

Input is what the engines' /metrics say (already parsed by ``v41flash.metrics.parse``) at the start and
at the end of a period, and the period's length. The operator's
status uses ``v41flash.metrics.window`` for the same two headline figures (hit rate, running spread);
this module adds the per-engine breakdown a routing benchmark needs (uncached tokens, requests).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from v41flash.metrics import parse as m
from v41flash.metrics.parse import EngineMetrics


def spread(values: Sequence[float]) -> float | None:
    """max / mean (1.0 = perfectly even); None when there is nothing to spread (mean 0 or no engines)."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def _increase(after: float, before: float) -> float:
    """Counter increase; a decrease means the engine restarted, so the new value is all of it."""
    return after - before if after >= before else after


def _counter(metrics: Mapping[str, EngineMetrics], name: str) -> float:
    return sum(e.counters.get(name, 0.0) for e in metrics.values())


@dataclass(frozen=True)
class EngineUsage:
    """One engine's share of a period (all DP ranks behind its URL summed)."""
    engine: str
    prompt_tokens: float  # prefix-cache queries (tokens checked against the cache)
    hit_tokens: float  # of which were already cached
    requests: float  # finished requests
    mean_running: float | None  # time-averaged requests in the engine; None without a period length

    @property
    def uncached_tokens(self) -> float:
        return self.prompt_tokens - self.hit_tokens


def _e2e_seconds(metrics: Mapping[str, EngineMetrics]) -> float:
    return sum(e.histograms[m.E2E].sum for e in metrics.values() if m.E2E in e.histograms)


def engine_usage(engine: str, before: Mapping[str, EngineMetrics], after: Mapping[str, EngineMetrics],
                 period_s: float | None = None) -> EngineUsage:
    """Counter increases over a period; mean running requests by Little's law.

    The sum of finished requests' end-to-end latencies over the period, divided by its length, is the
    time-averaged number of requests the engine held: exact where sampling the running gauge every few
    hundred milliseconds misses short requests.
    """
    busy = _increase(_e2e_seconds(after), _e2e_seconds(before))
    return EngineUsage(
        engine=engine,
        prompt_tokens=_increase(_counter(after, m.PREFIX_QUERIES), _counter(before, m.PREFIX_QUERIES)),
        hit_tokens=_increase(_counter(after, m.PREFIX_HITS), _counter(before, m.PREFIX_HITS)),
        requests=_increase(_counter(after, m.SUCCESS), _counter(before, m.SUCCESS)),
        mean_running=busy / period_s if period_s and period_s > 0 else None,
    )


@dataclass(frozen=True)
class RoutingObservation:
    hit_rate: float | None  # token-weighted: cached prompt tokens / prompt tokens, all engines
    running_spread: float | None  # max/mean of time-averaged running requests per engine
    uncached_spread: float | None  # max/mean of uncached (computed) prompt tokens per engine
    request_spread: float | None  # max/mean of finished requests per engine
    engines: int


def observe(usage: Sequence[EngineUsage]) -> RoutingObservation:
    prompt = sum(u.prompt_tokens for u in usage)
    running = [u.mean_running for u in usage if u.mean_running is not None]
    return RoutingObservation(
        hit_rate=sum(u.hit_tokens for u in usage) / prompt if prompt > 0 else None,
        running_spread=spread(running) if len(running) == len(usage) else None,
        uncached_spread=spread([u.uncached_tokens for u in usage]),
        request_spread=spread([u.requests for u in usage]),
        engines=len(usage),
    )
