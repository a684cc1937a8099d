"""Headroom the deployment's own traffic calls for: an upper-quantile forecast of its demand.

A replica ordered now serves only after the cold start, so capacity has to cover the highest demand
the next cold start will bring, not the last window's. The planner keeps a compact history of the
demand it has seen (one mean per ``bucket_s``, ``keep_s`` back) and asks, for every past moment, how
far demand rose above that moment's level within one horizon (the measured cold start plus one
decision interval): ``rise = max(demand over (t, t + H]) / demand(t)``. The ``quantile`` of those
rises, times the current demand, is the forecast sizing uses — and scale-down is sized by it too, so
capacity is only given back when even the upper forecast fits in fewer replicas.

Traffic that never rose (steady) learns a rise near 1 (its noise); bursts shorter than the cold start
that recur learn the burst height as standing headroom; a diurnal ramp learns how much it climbs per
cold start. The first surge of a kind cannot be foreseen (there is no history of it yet).
"""
from __future__ import annotations

import math

History = tuple[tuple[float, float, int], ...]  # (bucket start, mean demand, samples)


def record(history: History, now: float, demand: float, bucket_s: float, keep_s: float) -> History:
    """Add one demand sample (req/s) at ``now``; buckets older than ``keep_s`` are dropped."""
    start = math.floor(now / bucket_s) * bucket_s
    items = [h for h in history if h[0] > now - keep_s]
    if items and items[-1][0] == start:
        t, mean, n = items[-1]
        items[-1] = (t, (mean * n + demand) / (n + 1), n + 1)
    else:
        items.append((start, demand, 1))
    return tuple(items)


def rise_quantile(history: History, horizon_s: float, quantile: float, floor_rate: float = 1e-6
                  ) -> tuple[float, int]:
    """(the ``quantile`` of demand rises over ``horizon_s`` seen in the history, number of samples).

    A moment counts once at least half a horizon after it has been seen; its rise is measured over
    what has been seen of the horizon (a young history underestimates, never invents, a rise).
    Returns (1.0, 0) without samples.
    """
    if len(history) < 2:
        return 1.0, 0
    last = history[-1][0]
    rises = []
    for i, (t, d, _) in enumerate(history):
        if t > last - horizon_s / 2:
            break
        peak = max((h[1] for h in history[i + 1:] if h[0] <= t + horizon_s), default=d)
        rises.append(max(1.0, peak / max(d, floor_rate)))
    if not rises:
        return 1.0, 0
    rises.sort()
    k = min(len(rises) - 1, max(0, math.ceil(quantile * len(rises)) - 1))
    return rises[k], len(rises)


def coarse_rise(rise: float) -> float:
    """The rise to 0.05: what status keeps (a finer one would rewrite status at every decision)."""
    return round(round(rise * 20) / 20, 2)


def coarse_rate(rate: float) -> float:
    """A demand rate to 3 significant digits, for status."""
    return float(f"{rate:.3g}")


def measured_cold_start(samples: list[tuple[float, float]], keep: int = 5) -> float | None:
    """Median of the newest ``keep`` (created, seconds to Ready) samples; None without any."""
    recent = sorted(samples)[-keep:]
    if not recent:
        return None
    vals = sorted(s for _, s in recent)
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])
