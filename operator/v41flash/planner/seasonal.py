"""Foresight the planner learns: the demand at this time of day (or week) on past days, a cold start ahead.

The model, in words a platform team can check against its own dashboards:

- **History.** The deployment's request rate, one mean per ``bucket_s`` (15 min in the operator), the newest
  ``keep`` buckets (three weeks and a day); it lives in status (``to_status``), so a restart keeps it.
- **Season.** For a period P (a day, a week), the forecast for time T is the *median* of the demand at T − P,
  T − 2P, ... (up to ``max_periods`` back, at least ``min_periods``): one odd day (an incident, a launch) does not
  move a median of three or more.
- **Today's level.** That shape times how busy today is against it: the last ``level_buckets`` buckets' demand ÷
  the shape's for the same buckets (clamped to ×0.5–×2) — a growing or shrinking service keeps its shape.
- **Headroom.** The ``quantile`` (0.9) of actual ÷ forecast over the history's own past (each point forecast
  from the periods before it, from one horizon earlier, as the planner would have): how much a day exceeds
  what its past said, learned per deployment, 1.0–``max_headroom``.
- **Only when it forecasts.** The season is used only when, over that same backtest, it forecast the demand one
  horizon ahead better than the planner's own "demand stays where it is" (the mean of the last level buckets):
  its error at most ``skill`` × that one's (the 75th percentile of absolute log errors). White noise, a trend
  without a season and one-off spikes do not pass — no standing capacity from them. A recurring rise too short
  to move that quantile (a 30-minute daily job fills 2 of 96 fifteen-minute buckets) passes on its own buckets:
  where the shape stands at least ``rise_ratio`` × the history's median, in at least ``min_rise_backtest`` points,
  the season's mean error at most ``skill`` × "demand stays"'s there. Of the periods that pass, the one with the
  smaller error is used.

The planner sizes for the highest forecast over the next cold start (+ one decision interval): capacity ordered
now is Ready for the rise the season says comes. Pure: plain data in and out.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

# the backtest compares the errors' 75th percentiles: a one-off event spoils a few points (it is the forecast, the
# level and the shape of a few buckets), not a quarter of them
ERROR_QUANTILE = 0.75


@dataclass(frozen=True)
class History:
    """Closed buckets of mean demand (req/s) ending at bucket ``last`` (None: a bucket without samples), and the
    bucket being filled (memory only: status keeps closed buckets, so it changes once per bucket)."""

    bucket_s: float = 900.0
    last: int | None = None  # index (floor(t / bucket_s)) of values[-1]
    values: tuple[float | None, ...] = ()
    open_index: int | None = None
    open_sum: float = 0.0
    open_n: int = 0

    def value(self, i: int) -> float | None:
        if self.last is None:
            return None
        k = len(self.values) - 1 - (self.last - i)
        return self.values[k] if 0 <= k < len(self.values) else None


def record(h: History, now: float, demand: float, keep: int) -> History:
    """Add one demand sample at ``now``; the open bucket closes when a sample of a later bucket comes; at most
    ``keep`` closed buckets are kept (the oldest go first)."""
    i = math.floor(now / h.bucket_s)
    if h.open_index is None or i == h.open_index:
        return replace(h, open_index=i, open_sum=h.open_sum + demand, open_n=h.open_n + 1)
    if i < h.open_index:  # the clock went back: keep what is there
        return h
    closed = h.open_sum / h.open_n
    values = list(h.values)
    if h.last is not None:
        values += [None] * max(0, min(keep, h.open_index - h.last - 1))
    values.append(closed)
    values = values[-keep:]
    return History(h.bucket_s, h.open_index, tuple(values), i, demand, 1)


def seeded(bucket_s: float, start: float, rates: list[float | None]) -> History:
    """A history of closed buckets from ``start`` on (what status held before; the simulator's past)."""
    first = math.floor(start / bucket_s)
    return History(bucket_s, first + len(rates) - 1 if rates else None, tuple(rates))


# ---------------------------------------------------------------- the forecaster
@dataclass(frozen=True)
class SeasonModel:
    period_s: float  # the season used (a day, a week)
    headroom: float  # the quantile of actual ÷ forecast, ≥ 1
    error: float  # the season's backtest error (p75 |log|) ...
    persistence_error: float  # ... and "demand stays": the season is used only when its error is the smaller
    samples: int  # backtest points

    def describe(self, quantile: float, level: float) -> str:
        period = (f"{self.period_s / 86400:g}-day" if self.period_s % 86400 == 0 else f"{self.period_s:g}s")
        return (f"{period} season (p{quantile * 100:g}: ×{self.headroom:.2f} headroom, today ×{level:.2f} its "
                f"median; backtest error {self.error:.2f} vs {self.persistence_error:.2f} without it, "
                f"{self.samples} points)")


@dataclass(frozen=True)
class Settings:
    periods_s: tuple[float, ...] = (86400.0, 7 * 86400.0)
    quantile: float = 0.9
    min_periods: int = 3  # a median of three: one odd day cannot move it
    max_periods: int = 4
    level_buckets: int = 4
    skill: float = 0.7
    max_headroom: float = 2.0
    min_backtest: int = 8  # fewer backtest points: no season yet
    rise_ratio: float = 1.5  # a recurring rise: the shape at least this × the history's median (0: no rise gate)
    min_rise_backtest: int = 2  # backtest points on such rises the rise gate needs


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile (the value at or above which a share 1 − q lies)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _shape(h: History, i: int, p: int, s: Settings, min_periods: int) -> float | None:
    """Median demand at bucket i − kp, k = 1..max_periods; None with fewer than ``min_periods`` values."""
    vals = [v for k in range(1, s.max_periods + 1) if (v := h.value(i - k * p)) is not None and v > 0]
    return _median(vals) if len(vals) >= min_periods else None


def _level(h: History, end: int, p: int, s: Settings, min_periods: int) -> float | None:
    """Demand ÷ shape over the ``level_buckets`` buckets ending at ``end`` (clamped ×0.5–×2)."""
    got = shaped = 0.0
    for i in range(end - s.level_buckets + 1, end + 1):
        v, sh = h.value(i), _shape(h, i, p, s, min_periods)
        if v is not None and sh is not None:
            got, shaped = got + v, shaped + sh
    if shaped <= 0:
        return None
    return min(2.0, max(0.5, got / shaped))


def _recent(h: History, end: int, s: Settings) -> float | None:
    vals = [v for i in range(end - s.level_buckets + 1, end + 1) if (v := h.value(i)) is not None]
    return sum(vals) / len(vals) if vals else None


def _log_err(actual: float, forecast: float) -> float:
    return abs(math.log(max(actual, 1e-6) / max(forecast, 1e-6)))


def fit(h: History, horizon_s: float, s: Settings) -> SeasonModel | None:
    """The season that forecasts this history ``horizon_s`` ahead, or None (no season, or too little history).

    Each past bucket i is forecast as the planner would have from bucket i − h (h = the horizon in buckets): the
    shape from the periods before i, times the level at i − h. Backtest points need two past periods (the shape
    of two is their mean); the live forecast needs ``min_periods``."""
    if h.last is None or not h.values:
        return None
    hb = max(1, math.ceil(horizon_s / h.bucket_s))
    first = h.last - len(h.values) + 1
    best: SeasonModel | None = None
    median = _median([v for v in h.values if v is not None and v > 0] or [0.0])
    for period in s.periods_s:
        p = round(period / h.bucket_s)
        if p < 2 or len(h.values) < 2 * p + hb + s.min_backtest:
            continue
        errs, persist, ratios, rises = [], [], [], []
        for i in range(first + 2 * p, h.last + 1):
            x = h.value(i)
            shape = _shape(h, i, p, s, 2)
            level = _level(h, i - hb, p, s, 2)
            recent = _recent(h, i - hb, s)
            if x is None or x <= 0 or shape is None or level is None or recent is None:
                continue
            f = shape * level
            errs.append(_log_err(x, f))
            persist.append(_log_err(x, recent))
            ratios.append(x / f)
            if s.rise_ratio > 0 and median > 0 and shape >= s.rise_ratio * median:
                rises.append((errs[-1], persist[-1]))
        if len(errs) < s.min_backtest:
            continue
        e, ep = _quantile(errs, ERROR_QUANTILE), _quantile(persist, ERROR_QUANTILE)
        rise_skill = len(rises) >= s.min_rise_backtest and \
            sum(r[0] for r in rises) <= s.skill * sum(r[1] for r in rises)
        if e > s.skill * ep and not rise_skill:
            continue
        model = SeasonModel(period_s=p * h.bucket_s, headroom=min(s.max_headroom, max(1.0, _quantile(ratios, s.quantile))),
                      error=round(e, 3), persistence_error=round(ep, 3), samples=len(errs))
        if best is None or model.error < best.error:
            best = model
    return best


def peak(h: History, model: SeasonModel, now: float, horizon_s: float, s: Settings) -> tuple[float, float] | None:
    """(the highest forecast demand (req/s) over [now, now + horizon_s] at the model's quantile, today's level);
    None without the ``min_periods`` past values it needs."""
    p = round(model.period_s / h.bucket_s)
    i_now = math.floor(now / h.bucket_s)
    end = h.last if h.last is not None else i_now - 1
    level = _level(h, end, p, s, 2)
    if level is None:
        return None
    best = None
    for i in range(i_now, math.floor((now + horizon_s) / h.bucket_s) + 1):
        shape = _shape(h, i, p, s, s.min_periods)
        if shape is not None:
            best = max(best or 0.0, shape * level * model.headroom)
    return None if best is None else (best, level)


# ---------------------------------------------------------------- status
def to_status(h: History, max_bytes: int, exact: bool = False) -> dict:
    """The closed buckets as status keeps them: 3 significant digits, the oldest dropped until the JSON form
    fits ``max_bytes`` (a hard cap: status is one object in etcd). ``exact``: every digit and the open bucket
    too (the planner's whole memory, not what status keeps)."""
    vals = [None if v is None else (v if exact else float(f"{v:.3g}")) for v in h.values]
    while True:
        out = {"bucketSeconds": h.bucket_s, "last": h.last, "values": vals}
        if exact and h.open_index is not None:
            out["open"] = [h.open_index, h.open_sum, h.open_n]
        if len(json.dumps(out, separators=(",", ":"))) <= max_bytes or not vals:
            return out
        vals = vals[max(1, len(vals) // 20):]  # 5 % at a time


def from_status(d: dict | None, bucket_s: float) -> History:
    """The history status kept (empty when absent, malformed or of another bucket size)."""
    try:
        if not d or float(d.get("bucketSeconds")) != bucket_s:
            return History(bucket_s)
        vals = tuple(None if v is None else float(v) for v in d.get("values") or ())
        last = d.get("last")
        index, total, n = d.get("open") or (None, 0.0, 0)
        return History(bucket_s, int(last) if vals and last is not None else None, vals,
                       None if index is None else int(index), float(total), int(n))
    except (TypeError, ValueError):
        return History(bucket_s)
