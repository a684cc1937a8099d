"""Step 3, ``forecast``: one role's demand over its cold-start horizon (damped Holt trend, backlog, the learned
headroom and what foresight says)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from v41flash.planner import headroom
from v41flash.planner.datatypes import PlannerConfig, RoleState
from v41flash.planner.demand import Demand
from v41flash.planner.judge import RoleJudgement


@dataclass(frozen=True)
class RoleForecast:
    state: RoleState  # Holt level and trend, the queue length and the demand history, updated
    demand_rate: float | None  # req/s to size for; None when the data cannot be used
    headroom_note: str = ""  # set when the learned headroom raised the demand
    # what set demand_rate: "level" (the smoothed rate), "trend" (its damped trend), "observed" (the raw rate in a
    # breach), "headroom" (the learned rises), "foresight" (a schedule, the season or the slope); "+backlog" when a queue added
    source: str = ""


def _holt(rs: RoleState, rate: float | None, now: float, horizon: float, cfg: PlannerConfig) -> tuple[RoleState, float]:
    """Damped Holt update with this window's rate (None: no update); returns (state, forecast)."""
    level, trend = rs.rate_level, rs.rate_trend
    if rate is not None:
        if level is None or rs.rate_time is None or now <= rs.rate_time:
            level, trend = rate, 0.0
        else:
            dt = now - rs.rate_time
            predicted = level + trend * dt
            new_level = cfg.forecast.trend_alpha * rate + (1 - cfg.forecast.trend_alpha) * predicted
            trend = cfg.forecast.trend_beta * (new_level - level) / dt + (1 - cfg.forecast.trend_beta) * trend
            level = max(0.0, new_level)
        rs = replace(rs, rate_level=level, rate_trend=trend, rate_time=now)
    if level is None:
        return rs, 0.0
    # damped trend: the sum of phi^i over the horizon's intervals caps how far noise is extrapolated
    phi, steps = cfg.forecast.trend_damping, horizon / max(cfg.interval_s, 1e-9)
    damped_steps = phi * (1 - phi**steps) / (1 - phi) if phi < 1 else steps
    growth = max(0.0, trend) * cfg.interval_s * damped_steps  # falling trends never speed a scale-down
    return rs, min(level + growth, level * cfg.forecast.max_forecast_growth if level > 0 else growth)


def forecast(judged: RoleJudgement, demand: Demand, computes_prompts: bool, cold_start_s: float, state: RoleState,
             now: float, config: PlannerConfig, arrival_rate: float | None = None,
             foreseen: tuple[float | None, str] = (None, ""), seasonal: bool = False) -> RoleForecast:
    """Demand over the role's cold-start horizon: damped Holt trend of the rate plus the backlog, never
    below what is observed now while users suffer. ``computes_prompts``: prefill, or an aggregated role.
    ``foreseen``: (the rate the schedules and the season say the horizon brings, why) — a floor on the demand;
    ``seasonal``: a season forecasts it, with its own learned headroom — the hour-scale rises are not added again
    (they are the same rises, seen without the time of day; the history still learns them)."""
    cfg = config
    usable = judged.usable
    horizon = cfg.forecast.forecast_horizon_s if cfg.forecast.forecast_horizon_s is not None else cold_start_s
    completed = demand.prefill_rate if computes_prompts else demand.decode_rate
    backlog = demand.prefill_backlog if computes_prompts else demand.decode_backlog
    rs = state
    # arrivals = completions + queue growth (completions alone understate demand when saturated)
    observed_rate = completed
    if cfg.forecast.use_arrivals and computes_prompts and arrival_rate is not None:
        # the session proxy counts requests as they arrive: ahead of completions, which cap when saturated
        observed_rate = max(observed_rate, arrival_rate)
    if cfg.forecast.arrivals_from_queue_growth and usable and rs.last_waiting is not None and rs.rate_time is not None and now > rs.rate_time:
        observed_rate = max(0.0, completed + (backlog - rs.last_waiting) / (now - rs.rate_time))
    rs, predicted = _holt(rs, observed_rate if usable else None, now, horizon, cfg)
    rs = replace(rs, last_waiting=backlog if usable else None)
    rise, note = 1.0, ""
    if usable and cfg.forecast.headroom_quantile > 0:
        # what this deployment's demand has done within one cold start before (headroom.py); demand only:
        # a backlog is what too little capacity did, not what the traffic does
        rs = replace(rs, demand_history=headroom.record(
            rs.demand_history, now, observed_rate, cfg.forecast.headroom_bucket_s, cfg.forecast.headroom_history_s))
        within = cold_start_s + cfg.interval_s
        rise, samples = headroom.rise_quantile(rs.demand_history, within, cfg.forecast.headroom_quantile)
        if seasonal:
            rise = 1.0
        elif samples >= cfg.forecast.headroom_min_samples:
            rise = min(rise, cfg.forecast.headroom_max)
            rs = replace(rs, headroom_rise=headroom.coarse_rise(rise),
                         headroom_peak=headroom.coarse_rate(max(h[1] for h in rs.demand_history)))
            if rise > 1.0:
                note = (f"headroom ×{rise:.2f} (p{cfg.forecast.headroom_quantile * 100:g} of demand rises within {within:.0f}s, "
                        f"{samples} samples)")
        elif rs.headroom_rise is not None and rs.headroom_rise > 1.0:
            # a restarted planner: the history is young, the headroom learned before the restart still holds
            rise = rs.headroom_rise
            note = (f"headroom ×{rise:.2f} carried over a restart (the new demand history has {samples} of the "
                    f"{cfg.forecast.headroom_min_samples} samples it needs)")
        else:
            rise = 1.0
    if not usable:
        return RoleForecast(state=rs, demand_rate=None)
    # smoothed demand normally (noise must not scale); the raw rate too when users already suffer
    level_now = rs.rate_level if rs.rate_level is not None else predicted
    source = "observed" if judged.breached and observed_rate > predicted else \
        "trend" if predicted > level_now * 1.001 else "level"
    rate = (max(observed_rate, predicted) if judged.breached else predicted) + backlog / cfg.forecast.backlog_drain_s
    if rise > 1.0:
        # the upper forecast: the smoothed demand level (not the trend forecast: the learned rises already
        # include trends) times the rise this deployment has shown, never above the highest demand it has seen
        level = rs.rate_level if rs.rate_level is not None else predicted
        seen = max((h[1] for h in rs.demand_history), default=level)
        if samples < cfg.forecast.headroom_min_samples:  # the carried headroom: capped by the peak seen before the restart
            seen = max(seen, rs.headroom_peak or 0.0)
        up = min(level * rise, max(level, seen)) + backlog / cfg.forecast.backlog_drain_s
        if up > rate:
            rate, source = up, "headroom"
    foreseen_rate, why = foreseen
    if foreseen_rate is not None and foreseen_rate + backlog / cfg.forecast.backlog_drain_s > rate:
        rate, source = foreseen_rate + backlog / cfg.forecast.backlog_drain_s, "foresight"
    if why:
        note = f"{note}; {why}" if note else why
    if backlog > 0:
        source += "+backlog"
    return RoleForecast(state=rs, demand_rate=rate, headroom_note=note, source=source)
