"""The planner's foresight step: what the user's schedules and the learned season say the next cold start brings.

``remember_demand`` keeps the deployment's demand history (the seasonal forecaster's input); ``foresee`` turns
the schedules in force and the season's forecast into, per role, a request rate to size for at least and a
replica floor to clamp to (``plan`` passes the rate to ``forecast`` and the floor to ``clamp``, never to the
scale-down's stabilization: a floor gone at the window's end holds nothing).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from v41flash.planner import schedule, seasonal, trend
from v41flash.planner.datatypes import PlannerConfig, PlannerState
from v41flash.roles import Role


@dataclass(frozen=True)
class Foresight:
    """One role's foresight now."""

    rate: float | None = None  # size for at least this request rate (None: nothing foreseen)
    replicas: int = 0  # never fewer replicas (a schedule's floor; 0: none)
    note: str = ""  # for the decision's reason
    seasonal: bool = False  # a season forecasts the horizon (its learned headroom replaces the hour-scale one)
    source: str = ""  # which foresight gave the rate: schedule, season or slope (the trend one cold start ahead)


def remember_demand(state: PlannerState, demand_rate: float | None, now: float, cfg: PlannerConfig) -> PlannerState:
    """The demand sample of this decision in the season history (``demand_rate`` None: the window's data cannot be
    used, nothing recorded); a history of another bucket size starts again."""
    season = state.season
    if season.bucket_s != cfg.foresight.season_bucket_s:
        season = seasonal.History(cfg.foresight.season_bucket_s)
    if demand_rate is not None:
        season = seasonal.record(season, now, demand_rate, cfg.foresight.season_keep)
    return replace(state, season=season)


def foresee(state: PlannerState, role: Role, now: float, cold_start_s: float, current: int,
            cfg: PlannerConfig) -> Foresight:
    """The schedules' floor and rate for ``role``, the season's forecast over its next cold start (+ one interval)
    and the role's demand trend over it (each only where its own backtest beats "demand stays"), combined by
    maximum."""
    horizon = cold_start_s + cfg.interval_s
    floor = schedule.role_floor(cfg.foresight.schedules, role, now + cfg.foresight.epoch_s, cold_start_s, cfg.interval_s, current) \
        if cfg.foresight.schedules else schedule.Floor()
    rate, notes, season = floor.rate, [floor.why] if floor.why else [], False
    source = "schedule" if rate is not None else ""
    if cfg.foresight.forecast_quantile > 0:
        model = seasonal.fit(state.season, horizon, cfg.foresight.season)
        got = seasonal.peak(state.season, model, now, horizon, cfg.foresight.season) if model is not None else None
        if got is not None:
            peak, level = got
            notes.append(f"forecast {peak:.2f} req/s within {horizon:.0f}s from a "
                         f"{model.describe(cfg.foresight.forecast_quantile, level)}")
            if rate is None or peak > rate:
                rate, source = peak, "season"
            season = True
    sloped, why = trend.forecast(state.role(role).demand_history, now, horizon, cfg.foresight.slope)
    if sloped is not None:
        notes.append(why)
        if rate is None or sloped > rate:
            rate, source = sloped, "slope"
    return Foresight(rate=rate, replicas=floor.replicas, note="; ".join(notes), seasonal=season, source=source)
