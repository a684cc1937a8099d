"""Trend foresight: the demand one cold start ahead from its recent slope, used only while it forecasts better
than "demand stays where it is" on its own recent backtest.

A slow ramp (0.3 → 1.0 over 40 minutes) is not a surprise to a planner that looks at its slope: a replica ordered
now serves one cold start later, so the demand to size for is the demand then. But a slope fitted to noise
extrapolates noise, so the trend forecasts only where its own skill shows: for each of the last ``backtest_s`` of
minutes, the trend fitted ``check_s`` before it (over ``window_s``) forecasts that minute, and so does its level
alone ("demand stays"); the trend is used only when its mean |log actual ÷ forecast| is at most ``skill`` × the
other's. Then it extrapolates the slope over the horizon, damped (× ``damping``: the slope of the last ten minutes
is not a promise for the next twenty), never above ``max_growth`` × the level and never down (a falling trend
never speeds a scale-down).

The input is the role's demand history (``RoleState.demand_history``: one mean per minute, ``headroom.record``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from v41flash.planner.headroom import History


@dataclass(frozen=True)
class SlopeSettings:
    window_s: float = 600.0  # the slope is fitted over this much of the history
    check_s: float = 300.0  # the backtest forecasts this far ahead (short: a ramp qualifies within minutes)
    backtest_s: float = 600.0  # the minutes the backtest scores
    min_points: int = 5  # fewer backtest points, or fewer than this many buckets in a fit: no trend
    skill: float = 0.8  # the trend's backtest error must be at most this × "demand stays"'s
    damping: float = 0.5  # × on the slope's extrapolation over the horizon (0: trend foresight off)
    max_growth: float = 2.0  # never above this × the level


def fit(history: History, upto: float, window_s: float, min_points: int) -> tuple[float, float] | None:
    """(the demand at ``upto`` on the least-squares line through the buckets of (upto − window_s, upto], its slope
    per second); None with fewer than ``min_points`` buckets."""
    pts = [(t, r) for t, r, _ in history if upto - window_s < t <= upto]
    if len(pts) < min_points:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mr = sum(r for _, r in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var <= 0:
        return mr, 0.0
    slope = sum((t - mt) * (r - mr) for t, r in pts) / var
    return mr + slope * (upto - mt), slope


def _err(actual: float, forecast: float) -> float:
    return abs(math.log(max(actual, 1e-6) / max(forecast, 1e-6)))


def backtest(history: History, now: float, s: SlopeSettings) -> tuple[float, float, int]:
    """(the trend's mean error, "demand stays"'s, points) over the buckets of the last ``backtest_s``, each forecast
    from the fit ``check_s`` before it."""
    trend_e, stay_e = [], []
    for t, actual, _ in history:
        if t <= now - s.backtest_s or t > now:
            continue
        f = fit(history, t - s.check_s, s.window_s, s.min_points)
        if f is None:
            continue
        level, slope = f
        level = max(level, 1e-6)
        trend_e.append(_err(actual, min(level * s.max_growth, max(level, level + slope * s.check_s))))
        stay_e.append(_err(actual, level))
    if not trend_e:
        return math.inf, math.inf, 0
    return sum(trend_e) / len(trend_e), sum(stay_e) / len(stay_e), len(trend_e)


def forecast(history: History, now: float, horizon_s: float, s: SlopeSettings) -> tuple[float | None, str]:
    """(the demand ``horizon_s`` ahead on the damped trend, why); None while the trend is off, falling or without
    the skill its backtest asks for."""
    if s.damping <= 0:
        return None, ""
    f = fit(history, now, s.window_s, s.min_points)
    if f is None or f[1] <= 0 or f[0] <= 0:
        return None, ""
    level, slope = f
    err_trend, err_stay, n = backtest(history, now, s)
    if n < s.min_points or not err_trend <= s.skill * err_stay:
        return None, ""
    rate = min(level * s.max_growth, level + slope * horizon_s * s.damping)
    return rate, (f"trend {rate:.2f} req/s within {horizon_s:.0f}s ({slope * 60:+.2f} req/s a minute, ×{s.damping:g} "
                  f"damped; backtest error {err_trend:.2f} vs {err_stay:.2f} without it, {n} points)")
