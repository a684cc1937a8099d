"""The planner's steps, each a pure function with frozen data in and out (``plan`` composes them).

In order: ``workload_demand`` and ``split_slo`` (what the window says users ask for, and how the SLO
divides between the phases), then ``judge``, ``learn``, ``forecast``, ``size``, ``act`` and ``clamp``.
``forecast``, ``size`` and ``act`` work on one role; the others look at both roles at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from v41flash.metrics.figures import WindowFigures
from v41flash.planner import capacity, headroom
from v41flash.planner.datatypes import (
    Action,
    Observation,
    PlannerConfig,
    PlannerState,
    RoleBounds,
    RoleObservation,
    RoleState,
    Slo,
)
from v41flash.planner.profile import CapacityProfile
from v41flash.roles import Role

ASSUMED_OUTPUT_TOKENS = 1000.0  # AgentX mean output (shared/reference/workload-and-performance.md)

DataStatus = Literal["ok", "partial", "stale", "missing"]


# ---------------------------------------------------------------- demand and SLO split
@dataclass(frozen=True)
class Demand:
    """Workload figures the model needs, merged from the roles' windows."""

    prefill_rate: float  # req/s entering prefill (disaggregated) or the engines (aggregated)
    decode_rate: float
    isl: float  # mean prompt tokens
    hit_rate: float  # token-weighted prefix-cache hit rate
    osl: float  # mean output tokens
    osl_p95: float
    prefill_backlog: float  # waiting requests
    decode_backlog: float

    @property
    def new_tokens(self) -> float:
        return self.isl * (1.0 - self.hit_rate)

    @property
    def cached_tokens(self) -> float:
        return self.isl * self.hit_rate

    @property
    def context(self) -> float:
        return self.isl + self.osl / 2.0


def _scaled_rate(w: WindowFigures) -> float:
    """Request rate, scaled up when only some pods reported (never underestimate demand)."""
    if w.pods_observed and w.pods_expected > w.pods_observed:
        return w.request_rate * w.pods_expected / w.pods_observed
    return w.request_rate


def workload_demand(observed: Observation) -> Demand:
    """Rates, lengths, cache hits and backlogs of this window (prompts from the role that computes them)."""
    dw = observed.decode.window
    pw = observed.prefill.window if observed.prefill is not None else None
    front = pw if observed.prefill is not None else dw  # where prompts are computed

    def first(*vals: float | None, default: float = 0.0) -> float:
        for v in vals:
            if v is not None:
                return float(v)
        return default

    isl = first(front.mean_input_tokens if front else None, dw.mean_input_tokens if dw else None)
    osl = first(dw.mean_output_tokens if dw else None)
    return Demand(
        prefill_rate=_scaled_rate(front) if front else 0.0,
        decode_rate=_scaled_rate(dw) if dw else 0.0,
        isl=isl,
        hit_rate=min(0.999, max(0.0, first(front.prefix_cache_hit_rate if front else None))),
        osl=osl,
        osl_p95=first(dw.output_tokens_p95 if dw else None, default=2.0 * osl),
        prefill_backlog=front.waiting if front else 0.0,
        decode_backlog=dw.waiting if dw else 0.0,
    )


@dataclass(frozen=True)
class Budgets:
    """The SLO split between the phases."""

    itl_s: float  # decode's time per output token
    handover_s: float  # KV hand-over plus decode's first step (0 when aggregated)
    prefill_ttft_s: float  # what prefill's own TTFT may use


def split_slo(demand: Demand, slo: Slo, profile: CapacityProfile, disaggregated: bool) -> Budgets:
    # A window where nothing finished says nothing about output lengths: split the SLO as for a typical
    # answer, not for 0 tokens (that would hand the whole e2e headroom to one decode step). Sizing still
    # uses the observed demand, so an empty window never asks for capacity.
    osl_for_budget = demand.osl_p95 if demand.osl_p95 > 0 else 2.0 * ASSUMED_OUTPUT_TOKENS
    itl_budget = slo.itl_s or max(1e-4, (slo.e2e_p95_s - slo.ttft_s) / max(1.0, osl_for_budget))
    # KV hand-over plus decode's first step (at its budget: decode is sized separately to meet it)
    handover = (profile.kv_transfer.seconds(demand.isl) + itl_budget) if disaggregated else 0.0
    return Budgets(itl_s=itl_budget, handover_s=handover, prefill_ttft_s=max(1e-3, slo.ttft_s - handover))


# ---------------------------------------------------------------- 1. judge
@dataclass(frozen=True)
class RoleJudgement:
    """How far one role's data can be trusted, what users saw, and whether this role is to blame."""

    role: Role
    data: DataStatus
    data_why: str  # "" when ok
    breached: bool  # an observed SLO breach this role can fix
    observed_ttft_s: float | None = None  # user-facing figures this role reports on (None: not judged)
    observed_e2e_p95_s: float | None = None
    observed_itl_s: float | None = None

    @property
    def usable(self) -> bool:
        """Data good enough to size on (partial data may scale up, never down)."""
        return self.data in ("ok", "partial")


@dataclass(frozen=True)
class Judgement:
    decode: RoleJudgement
    prefill: RoleJudgement | None  # None: aggregated
    notes: tuple[str, ...] = ()  # for a human (replicas stuck starting)

    def role(self, role: Role) -> RoleJudgement:
        j = self.prefill if role == "prefill" else self.decode
        assert j is not None
        return j


def _missing_why(w) -> list[str]:
    """Each of the first three missing pods: the window's note on it ('pod: body over 8388608 bytes', the
    scrape's error: a flooding or dripping pod is named as such) or else its name."""
    notes = {n.split(": ", 1)[0]: n for n in w.notes if ": " in n}
    return [notes.get(p, p) for p in w.missing_pods[:3]]


def data_status(obs: RoleObservation, now: float, cfg: PlannerConfig) -> tuple[DataStatus, str]:
    """('ok' | 'partial' | 'stale' | 'missing', why)."""
    w = obs.window
    if w is None:
        return "missing", "no metrics for this role"
    if w.error is not None:
        return "missing", w.error
    age = now - w.end
    if age > cfg.max_metrics_age_s:
        return "stale", f"metrics are {age:.0f}s old (> {cfg.max_metrics_age_s:.0f}s)"
    if w.pods_observed == 0 and (w.pods_expected > 0 or obs.replicas.ready > 0):
        why = [n for n in _missing_why(w) if n not in w.missing_pods]  # the scrape errors, when the window has them
        return "missing", f"no pod of {w.pods_expected or obs.replicas.ready} answered its metrics scrape" + \
            (f" ({'; '.join(why)})" if why else "")
    if not w.complete:
        parts = []
        if w.missing_pods:
            parts.append(f"{len(w.missing_pods)} pod(s) missing ({'; '.join(_missing_why(w))})")
        if w.partial_pods:
            parts.append(f"{len(w.partial_pods)} pod(s) with partial data ({', '.join(w.partial_pods[:3])})")
        if not parts:
            parts.append(f"{w.pods_observed}/{w.pods_expected} pods observed")
        return "partial", "; ".join(parts)
    return "ok", ""


def cold_start_of(obs: RoleObservation, role_profile) -> float:
    """Seconds until a replica ordered now serves: measured on this cluster when known, else the profile's."""
    measured = obs.cold_start_s
    return measured if measured is not None and measured > 0 else role_profile.cold_start_seconds


def judge(observed: Observation, profile: CapacityProfile, slo: Slo, budgets: Budgets, now: float,
          config: PlannerConfig) -> Judgement:
    """Judge each role's data, measure the user-facing figures and attribute a breach to the role that can fix it."""
    cfg = config
    disagg = observed.prefill is not None
    dw = observed.decode.window
    pw = observed.prefill.window if observed.prefill is not None else None

    def enough(w: WindowFigures | None) -> bool:
        return w is not None and w.requests >= cfg.min_requests_for_slo

    if disagg:
        # user TTFT ≈ prefill pods' TTFT + decode's first token; user e2e ≈ decode pods' e2e + prefill
        decode_first = (dw.ttft_mean_s or 0.0) if dw is not None else 0.0
        prefill_mean = (pw.ttft_mean_s or 0.0) if pw is not None else 0.0
        obs_ttft = pw.ttft_s + decode_first if enough(pw) and pw.ttft_s is not None else None
        obs_e2e = dw.e2e_p95_s + prefill_mean if enough(dw) and dw.e2e_p95_s is not None else None
    else:
        obs_ttft = dw.ttft_s if enough(dw) else None
        obs_e2e = dw.e2e_p95_s if enough(dw) else None
    rt = observed.router
    if rt is not None and rt.e2e_p95_s is not None and rt.requests >= cfg.min_requests_for_slo:
        obs_e2e = rt.e2e_p95_s  # measured where users are, instead of summed from the roles
    obs_itl = dw.itl_mean_s if enough(dw) else None
    ttft_breach = obs_ttft is not None and obs_ttft > slo.ttft_s
    # decode's own first token (its wait for a sequence slot + one step) took longer than the room prefill left
    # it: the TTFT breach is decode's too (with max-num-seqs 32 a saturated decode queues requests for seconds)
    decode_ttft_breach = (
        disagg and cfg.decode_owns_its_ttft and ttft_breach and pw is not None and pw.ttft_s is not None
        and decode_first > max(budgets.handover_s, slo.ttft_s - pw.ttft_s))
    e2e_breach = obs_e2e is not None and obs_e2e > slo.e2e_p95_s
    itl_breach = obs_itl is not None and obs_itl > budgets.itl_s

    notes: list[str] = []

    def one(role: Role, obs: RoleObservation) -> RoleJudgement:
        status, why = data_status(obs, now, cfg)
        cold_start = cold_start_of(obs, profile.prefill if role == "prefill" else profile.decode)
        stuck = [s for s in obs.replicas.starting_for_s if s > 2 * cold_start]
        if stuck:  # still counted as coming capacity, but a human should look (unschedulable? crash loop?)
            notes.append(
                f"{len(stuck)} {role} replica(s) starting for over {max(stuck):.0f}s "
                f"(> 2× the profile's {cold_start:.0f}s cold start): check their pods"
            )
        if role == "prefill":
            breached = ttft_breach or (e2e_breach and not itl_breach)
        else:
            breached = ((e2e_breach and (itl_breach or not disagg or not ttft_breach)) or (ttft_breach and not disagg)
                        or decode_ttft_breach)
        return RoleJudgement(
            role=role, data=status, data_why=why, breached=breached,
            observed_ttft_s=obs_ttft if (role == "prefill" or not disagg) else None,
            observed_e2e_p95_s=obs_e2e if role == "decode" else None,
            observed_itl_s=obs_itl if role == "decode" else None,
        )

    prefill = one("prefill", observed.prefill) if observed.prefill is not None else None
    decode = one("decode", observed.decode)
    return Judgement(decode=decode, prefill=prefill, notes=tuple(notes))


# ---------------------------------------------------------------- 2. learn
@dataclass(frozen=True)
class Learned:
    """The state after learning, and what sizing uses from it."""

    state: PlannerState  # corrections, measured service time and cache-hit level updated
    prefill_correction: float  # the tail fit, floored by the measured service-time ratio (or its default)
    decode_correction: float
    sized: Demand  # the window's demand at the smoothed cache-hit level


def _smooth_correction(old: float, sample: float, cfg: PlannerConfig) -> float:
    w = cfg.correction_smoothing
    k = math.exp((1 - w) * math.log(old) + w * math.log(sample))
    return min(cfg.correction_max, max(cfg.correction_min, k))


def _ewma(level: float | None, sample: float, weight: float) -> float:
    """The smoothed level after one more sample (the first sample is the level)."""
    return sample if level is None else weight * sample + (1 - weight) * level


def _a_wave(share: float, level: float, cfg: PlannerConfig) -> bool:
    """A share of new sessions well above ``level`` (by ``proven_share_slack`` + 0.01): whole prompts, dearer work
    than the cache-hit level of the windows at ``level`` says."""
    return share > level * (1 + cfg.proven_share_slack) + 0.01


def _after_scale_down(rs: RoleState, now: float, cfg: PlannerConfig) -> bool:
    """The role shed replicas within ``down_breach_window_s``: its moved sessions may still be re-prefilling."""
    return (rs.last_action == "scale_down" and rs.last_scale_time is not None
            and now - rs.last_scale_time < cfg.down_breach_window_s)


def new_session_share(observed: Observation) -> float | None:
    """The window's share of new sessions among arriving requests (the session proxy's counts; None: unknown)."""
    router = observed.router
    if router is None or not router.arrival_rate or router.new_session_rate is None:
        return None
    return router.new_session_rate / router.arrival_rate


def learn(observed: Observation, judgement: Judgement, demand: Demand, budgets: Budgets, profile: CapacityProfile,
          state: PlannerState, config: PlannerConfig, now: float) -> Learned:
    """Move each role's correction towards observed / predicted latency on trustworthy windows (bounded,
    smoothed in log space), measure prefill's service time, smooth the cache-hit level."""
    cfg = config
    disagg = observed.prefill is not None
    pp, dp = profile.prefill, profile.decode
    dw = observed.decode.window
    prefill_state = state.prefill
    decode_state = state.decode
    front_obs = observed.prefill if observed.prefill is not None else observed.decode
    front_status = judgement.role("prefill" if disagg else "decode").data

    def learn_ok(o: RoleObservation, status: DataStatus) -> bool:
        return status == "ok" and not o.rolling_out and o.window.requests >= cfg.min_requests_for_feedback

    decode_need_now = 0.0
    ready_d = observed.decode.replicas.ready
    if learn_ok(observed.decode, judgement.decode.data) and dw.itl_mean_s and ready_d > 0 and demand.osl > 0:
        rate_rank = dw.request_rate / (ready_d * dp.data_parallel_size)
        b_obs = rate_rank * demand.osl * dw.itl_mean_s  # Little's law: measured, not modelled
        model_itl = dp.itl_seconds(b_obs, demand.context)
        sample = min(cfg.correction_max * 2, max(cfg.correction_min / 2, dw.itl_mean_s / model_itl))
        decode_state = replace(
            decode_state,
            correction=_smooth_correction(decode_state.correction, sample, cfg),
            corrections_learned=decode_state.corrections_learned + 1,
        )
    if not disagg and ready_d > 0:
        # aggregated: decode work occupies part of every replica; prefill gets the rest
        decode_need_now = capacity.decode_replicas_needed(
            dp, dw.request_rate if dw else 0.0, demand.osl, demand.context, budgets.itl_s, decode_state.correction, 1.0
        ).replicas
    fw = front_obs.window
    ready_f = front_obs.replicas.ready
    if (
        learn_ok(front_obs, front_status)
        and fw.ttft_s is not None
        and ready_f > 0
        and demand.isl > 0
    ):
        n_eff = max(0.1 * ready_f, ready_f - decode_need_now)
        ranks = dp.data_parallel_size if not disagg else pp.data_parallel_size

        def predict(k: float) -> float:
            return capacity.prefill_ttft(
                pp, fw.request_rate, n_eff, demand.new_tokens, demand.cached_tokens, fw.ttft_percentile, k, ranks, cfg.service_cv2
            )

        sample = capacity.solve_correction(predict, fw.ttft_s, cfg.correction_min / 2, cfg.correction_max * 2)
        service = pp.request_seconds(demand.new_tokens, demand.cached_tokens)
        if fw.request_rate * service * sample / (n_eff * ranks) > 0.9:
            # near saturation a queue of any length fits some k < truth: it may only teach "slower"
            sample = max(sample, prefill_state.correction)
        if cfg.saturation_learning and fw.waiting > n_eff * ranks and fw.request_rate > 0:
            # a backlog means the ranks were busy all window: completions = capacity, so ρ ≥ 1 gives
            # k ≥ ranks / (completions × service) — a lower bound that holds however long the queue
            sample = max(sample, n_eff * ranks / (fw.request_rate * service))
        prefill_state = replace(
            prefill_state,
            correction=_smooth_correction(prefill_state.correction, sample, cfg),
            corrections_learned=prefill_state.corrections_learned + 1,
        )
        if disagg and fw.prefill_time_mean_s and demand.new_tokens > 0:
            # the service time itself, measured without the queue: the floor of the correction (below)
            model_s = pp.request_seconds(demand.new_tokens, demand.cached_tokens)
            s_sample = min(cfg.correction_max * 2, max(cfg.correction_min / 2, fw.prefill_time_mean_s / model_s))
            old = prefill_state.service_correction
            prefill_state = replace(prefill_state, service_correction=s_sample if old is None else _smooth_correction(
                old, s_sample, replace(cfg, correction_smoothing=cfg.service_smoothing)))
    new_state = replace(state, prefill=prefill_state, decode=decode_state)
    # The latency correction fits the queueing tail; below the measured service-time ratio (or 1 when
    # prefill time is not measured) it sized prefill too lean as load rose (agent prefill times are
    # heavy-tailed and session-affine): sizing never assumes prefill cheaper than that floor.
    ks = prefill_state.service_correction
    kp = max(prefill_state.correction, ks if ks is not None else cfg.min_throughput_correction)
    if ks is not None and cfg.max_tail_over_service > 0:
        # ... nor much dearer than measured: when the TTFT tail is the service time of the longest prompts, more
        # replicas do not shorten it, and a tail fit that keeps rising with them orders replicas without end
        kp = min(kp, max(ks, cfg.min_throughput_correction) * cfg.max_tail_over_service)
    # Size for the cache-hit level that will hold when new replicas are Ready, not for one window's miss
    # storm (a scale-down or a wave of new sessions): the smoothed level, when there is one — except while users
    # already wait (the role judged in breach): then the window's own level if lower, the work the tail fit saw.
    front_role: Role = "prefill" if disagg else "decode"
    frs = new_state.role(front_role)
    hit_level, share, share_level = frs.hit_level, new_session_share(observed), frs.share_level
    if learn_ok(front_obs, front_status):
        if fw.prefix_cache_hit_rate is not None:
            hit_level = _ewma(hit_level, demand.hit_rate, cfg.hit_smoothing)
        learned_share = share_level if share is None else _ewma(share_level, share, cfg.hit_smoothing)
        new_state = new_state.with_role(front_role, replace(frs, hit_level=hit_level, share_level=learned_share))
    # ... unless the role shed replicas within down_breach_window_s and the window's share of new sessions is no
    # wave (_a_wave, against the share level before this window): then the misses are the sessions the scale-down
    # moved, which re-prefill for about one turn, not a wave that misses for as long as it lasts
    wave = share is None or share_level is None or _a_wave(share, share_level, cfg)
    if (cfg.breach_hit_level and hit_level is not None and judgement.role(front_role).breached
            and fw.prefix_cache_hit_rate is not None
            and (wave or not cfg.breach_share_gate or not _after_scale_down(frs, now, cfg))):
        hit_level = min(hit_level, demand.hit_rate)
    sized = demand if hit_level is None else replace(demand, hit_rate=min(0.999, max(0.0, hit_level)))
    return Learned(state=new_state, prefill_correction=kp, decode_correction=decode_state.correction, sized=sized)


# ---------------------------------------------------------------- 3. forecast
@dataclass(frozen=True)
class RoleForecast:
    state: RoleState  # Holt level and trend, the queue length and the demand history, updated
    demand_rate: float | None  # req/s to size for; None when the data cannot be used
    headroom_note: str = ""  # set when the learned headroom raised the demand


def _holt(rs: RoleState, rate: float | None, now: float, horizon: float, cfg: PlannerConfig) -> tuple[RoleState, float]:
    """Damped Holt update with this window's rate (None: no update); returns (state, forecast)."""
    level, trend = rs.rate_level, rs.rate_trend
    if rate is not None:
        if level is None or rs.rate_time is None or now <= rs.rate_time:
            level, trend = rate, 0.0
        else:
            dt = now - rs.rate_time
            predicted = level + trend * dt
            new_level = cfg.trend_alpha * rate + (1 - cfg.trend_alpha) * predicted
            trend = cfg.trend_beta * (new_level - level) / dt + (1 - cfg.trend_beta) * trend
            level = max(0.0, new_level)
        rs = replace(rs, rate_level=level, rate_trend=trend, rate_time=now)
    if level is None:
        return rs, 0.0
    # damped trend: the sum of phi^i over the horizon's intervals caps how far noise is extrapolated
    phi, steps = cfg.trend_damping, horizon / max(cfg.interval_s, 1e-9)
    damped_steps = phi * (1 - phi**steps) / (1 - phi) if phi < 1 else steps
    growth = max(0.0, trend) * cfg.interval_s * damped_steps  # falling trends never speed a scale-down
    return rs, min(level + growth, level * cfg.max_forecast_growth if level > 0 else growth)


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
    horizon = cfg.forecast_horizon_s if cfg.forecast_horizon_s is not None else cold_start_s
    completed = demand.prefill_rate if computes_prompts else demand.decode_rate
    backlog = demand.prefill_backlog if computes_prompts else demand.decode_backlog
    rs = state
    # arrivals = completions + queue growth (completions alone understate demand when saturated)
    observed_rate = completed
    if cfg.use_arrivals and computes_prompts and arrival_rate is not None:
        # the session proxy counts requests as they arrive: ahead of completions, which cap when saturated
        observed_rate = max(observed_rate, arrival_rate)
    if cfg.arrivals_from_queue_growth and usable and rs.last_waiting is not None and rs.rate_time is not None and now > rs.rate_time:
        observed_rate = max(0.0, completed + (backlog - rs.last_waiting) / (now - rs.rate_time))
    rs, predicted = _holt(rs, observed_rate if usable else None, now, horizon, cfg)
    rs = replace(rs, last_waiting=backlog if usable else None)
    rise, note = 1.0, ""
    if usable and cfg.headroom_quantile > 0:
        # what this deployment's demand has done within one cold start before (headroom.py); demand only:
        # a backlog is what too little capacity did, not what the traffic does
        rs = replace(rs, demand_history=headroom.record(
            rs.demand_history, now, observed_rate, cfg.headroom_bucket_s, cfg.headroom_history_s))
        within = cold_start_s + cfg.interval_s
        rise, samples = headroom.rise_quantile(rs.demand_history, within, cfg.headroom_quantile)
        if seasonal:
            rise = 1.0
        elif samples >= cfg.headroom_min_samples:
            rise = min(rise, cfg.headroom_max)
            rs = replace(rs, headroom_rise=headroom.coarse_rise(rise),
                         headroom_peak=headroom.coarse_rate(max(h[1] for h in rs.demand_history)))
            if rise > 1.0:
                note = (f"headroom ×{rise:.2f} (p{cfg.headroom_quantile * 100:g} of demand rises within {within:.0f}s, "
                        f"{samples} samples)")
        elif rs.headroom_rise is not None and rs.headroom_rise > 1.0:
            # a restarted planner: the history is young, the headroom learned before the restart still holds
            rise = rs.headroom_rise
            note = (f"headroom ×{rise:.2f} carried over a restart (the new demand history has {samples} of the "
                    f"{cfg.headroom_min_samples} samples it needs)")
        else:
            rise = 1.0
    if not usable:
        return RoleForecast(state=rs, demand_rate=None)
    # smoothed demand normally (noise must not scale); the raw rate too when users already suffer
    rate = (max(observed_rate, predicted) if judged.breached else predicted) + backlog / cfg.backlog_drain_s
    if rise > 1.0:
        # the upper forecast: the smoothed demand level (not the trend forecast: the learned rises already
        # include trends) times the rise this deployment has shown, never above the highest demand it has seen
        level = rs.rate_level if rs.rate_level is not None else predicted
        seen = max((h[1] for h in rs.demand_history), default=level)
        if samples < cfg.headroom_min_samples:  # the carried headroom: capped by the peak seen before the restart
            seen = max(seen, rs.headroom_peak or 0.0)
        rate = max(rate, min(level * rise, max(level, seen)) + backlog / cfg.backlog_drain_s)
    foreseen_rate, why = foreseen
    if foreseen_rate is not None:
        rate = max(rate, foreseen_rate + backlog / cfg.backlog_drain_s)
    if why:
        note = f"{note}; {why}" if note else why
    return RoleForecast(state=rs, demand_rate=rate, headroom_note=note)


# ---------------------------------------------------------------- 4. size
@dataclass(frozen=True)
class Sizing:
    need: capacity.Need | None  # fractional replicas; None: nothing to size on (missing or stale data)
    kv_note: str = ""  # set when KV-cache memory, not compute, decided the need
    down_guard: str = ""  # set when removing a replica would itself break the TTFT percentile (moved sessions)
    # ... because the replicas left could not do the moved turns' work (never passed, however long it holds)
    down_guard_overload: bool = False


def moved_sessions_checks(role: Role, disaggregated: bool, current: int, learned: Learned, budgets: Budgets,
                          profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> tuple[str, str]:
    """Why removing one replica that computes prompts would break the TTFT percentile by itself: (the tail check's
    reason, the overload check's reason), "" where a check passes.

    Session affinity keeps each session's prefix on one replica; removing one of N moves 1/N of the sessions,
    and each moved session's next turn re-prefills its whole context. For about one turn, 1/N of the requests
    are such full prefills. That breaks the window however the queueing model sizes the fleet when

    - the share is above the percentile's tail (1 − p) and one full-context prefill alone takes longer than
      prefill's TTFT budget (the moved turns are slow, not queued), or
    - the N − 1 replicas left cannot do that turn's work: at the window's request rate, with 1/N of the
      requests full prefills and the rest at the cache-hit level, their utilisation reaches 1 (everyone queues
      behind the moved turns; at 97 % hits a full prefill is ~20–30× a cached turn's work).

    ``act`` passes the first after ``moved_sessions_hold_s`` of holding (one replica, then a new hold), never the
    second.
    """
    if not config.guard_moved_sessions or current <= 1 or (role != "prefill" and disaggregated):
        return "", ""
    moved = min(1.0, config.max_scale_down_step / current)
    tail = 1.0 - slo.ttft_percentile
    sized, pp, k = learned.sized, profile.prefill, learned.prefill_correction
    full = pp.request_seconds(sized.isl, 0.0) * k
    tail_why = overload_why = ""
    if moved > tail and full > budgets.prefill_ttft_s:
        tail_why = (f"a scale-down would move {moved:.0%} of the sessions (> the {_pct(slo.ttft_percentile)} tail of "
                    f"{tail:.0%}) and each re-prefills its {_fmt_k(sized.isl)}-token context in ~{full:.1f}s "
                    f"(> the {budgets.prefill_ttft_s:.2f}s TTFT budget)")
    ranks = pp.data_parallel_size if disaggregated else profile.decode.data_parallel_size
    turn = (1 - moved) * pp.request_seconds(sized.new_tokens, sized.cached_tokens) * k + moved * full
    rho = sized.prefill_rate * turn / (ranks * (current - config.max_scale_down_step))
    if rho >= 1.0:
        overload_why = (f"the {current - config.max_scale_down_step} replicas left would be {rho:.0%} busy while the "
                        f"{moved:.0%} of sessions a scale-down moves re-prefill their {_fmt_k(sized.isl)}-token "
                        f"contexts")
    return tail_why, overload_why


def size(role: Role, demand_rate: float | None, observed: RoleObservation, disaggregated: bool, learned: Learned,
         budgets: Budgets, profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> Sizing:
    """Fractional replicas that keep TTFT (prefill) and ITL (decode) within their budgets at the demand, with
    the corrected profile; decode also keeps its KV cache under the target."""
    if demand_rate is None:
        return Sizing(need=None)
    cfg = config
    pp, dp = profile.prefill, profile.decode
    sized = learned.sized

    def size_prefill(rate: float, ranks: int) -> capacity.Need:
        return capacity.prefill_replicas_needed(
            pp, rate, sized.new_tokens, sized.cached_tokens, budgets.prefill_ttft_s, slo.ttft_percentile,
            learned.prefill_correction, cfg.target_utilization, ranks, cfg.service_cv2,
        )

    def size_decode(rate: float) -> capacity.Need:
        need = capacity.decode_replicas_needed(
            dp, rate, sized.osl, sized.context, budgets.itl_s, learned.decode_correction, cfg.target_utilization)
        if cfg.decode_slot_staffing and disaggregated:
            # a request waiting for a free sequence slot waits in its TTFT: enough slots for the percentile
            slots = capacity.decode_slots_needed(dp, rate, sized.osl, sized.context, budgets.itl_s,
                                                 slo.ttft_percentile, learned.decode_correction)
            need = capacity.Need(max(need.replicas, slots.replicas), need.feasible)
        return need

    if role == "prefill":
        need = size_prefill(demand_rate, pp.data_parallel_size)
    elif disaggregated:
        need = size_decode(demand_rate)
    else:
        dn, pn = size_decode(demand_rate), size_prefill(demand_rate, dp.data_parallel_size)
        need = capacity.Need(dn.replicas + pn.replicas, dn.feasible and pn.feasible)
    kv_note = ""
    if role == "decode" and observed.window.kv_cache_usage is not None and observed.replicas.ready > 0:
        # KV memory binds before compute (long agentic contexts): keep usage under the target
        # (also when below target: it stops a scale-down that would push usage over it)
        kv = observed.window.kv_cache_usage
        kv_need = observed.replicas.ready * kv / cfg.kv_cache_target
        if kv_need > need.replicas:
            need = capacity.Need(kv_need, need.feasible)
            kv_note = f"KV cache {kv:.0%} full ({cfg.kv_cache_target:.0%} target)"
    tail, overload = moved_sessions_checks(role, disaggregated, observed.replicas.desired, learned, budgets, profile,
                                           slo, cfg)
    return Sizing(need=need, kv_note=kv_note, down_guard=tail or overload, down_guard_overload=bool(overload))


# ---------------------------------------------------------------- 5. act
@dataclass(frozen=True)
class Verdict:
    """Replicas one role should have, and why in one line."""

    desired: int
    action: Action
    why: str
    clamped: str | None = None  # what bound/budget changed the model's answer, if any
    moves_sessions: bool = False  # a scale-down past the moved-sessions guard (a breach after it teaches nothing)


@dataclass(frozen=True)
class Acted:
    verdict: Verdict  # before bounds and budget
    state: RoleState  # stabilization window updated


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.2f}s")


def _fmt_k(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def _pct(p: float) -> str:
    return f"p{p * 100:g}"


def _observed_head(j: RoleJudgement, slo: Slo, itl_budget: float) -> str:
    p = _pct(slo.ttft_percentile)
    parts = []
    if j.observed_ttft_s is not None:
        op = ">" if j.observed_ttft_s > slo.ttft_s else "≤"
        parts.append(f"TTFT {p} {_fmt_s(j.observed_ttft_s)} {op} {_fmt_s(slo.ttft_s)} target")
    if j.observed_e2e_p95_s is not None:
        op = ">" if j.observed_e2e_p95_s > slo.e2e_p95_s else "≤"
        parts.append(f"e2e p95 {_fmt_s(j.observed_e2e_p95_s)} {op} {_fmt_s(slo.e2e_p95_s)} target")
    if j.observed_itl_s is not None and j.observed_itl_s > itl_budget:
        parts.append(f"ITL {j.observed_itl_s * 1000:.1f}ms > {itl_budget * 1000:.1f}ms budget")
    return ", ".join(parts) if parts else "no latency samples in window"


def _need_text(role: Role, demand_rate: float, need: capacity.Need, d: Demand, k: float, k_prefill: float | None) -> str:
    lengths = f"{_fmt_k(d.isl)} ISL"
    if d.hit_rate > 0:
        lengths += f" ({d.hit_rate:.0%} cached)"
    if role == "decode":
        lengths += f", {_fmt_k(d.osl)} OSL"
    corr = f"correction {k:.2f}" if k_prefill is None else f"corrections prefill {k_prefill:.2f}/decode {k:.2f}"
    return f"demand {demand_rate:.2f} req/s × {lengths} needs {need.replicas:.1f} {role} replicas at {corr}"


def _progress(obs: RoleObservation) -> str:
    rep = obs.replicas
    if rep.starting:
        since = f", longest {max(rep.starting_for_s):.0f}s" if rep.starting_for_s else ""
        return f"{rep.starting} starting replica(s){since}"
    return "the rollout in progress"


def _down_blocker(obs: RoleObservation, j: RoleJudgement, rs: RoleState, now: float, cfg: PlannerConfig,
                  cancel: bool = False) -> str | None:
    """Why a scale-down the model wants must wait, or None when it may happen now (``cancel``: a scale-down
    that only removes replicas still starting or unschedulable, which replicas starting do not block)."""
    if j.data != "ok":
        return f"no scale-down on {j.data} metrics"
    if j.breached:
        return "SLO is breached"
    if obs.rolling_out or (obs.replicas.starting > 0 and not cancel):
        return f"waiting for {_progress(obs)}"
    covered = now - rs.tracking_since if rs.tracking_since is not None else 0.0
    if covered < cfg.scale_down_stabilization_s:
        return f"stabilizing ({covered:.0f}/{cfg.scale_down_stabilization_s:.0f}s of lower need)"
    if rs.last_scale_time is not None:
        wait = cfg.scale_down_cooldown_s if rs.last_action == "scale_up" else cfg.scale_down_interval_s
        if now - rs.last_scale_time < wait:
            return f"cooldown ({now - rs.last_scale_time:.0f}/{wait:.0f}s since the last {rs.last_action.replace('_', '-')})"
    return None


def down_fraction(role: Role, disaggregated: bool, cfg: PlannerConfig) -> float:
    """Share of the role's replicas one scale-down may remove (at least ``max_scale_down_step``).

    Removing a replica that computes prompts throws its prefix cache away: each of its sessions'
    next turn re-prefills the whole context elsewhere (a 280k-token agent context is ~14 s on H200 TP4)
    and blocks the requests queued behind it on that rank, however much spare capacity the fleet has,
    so the roles that compute prompts shrink by ``prompt_scale_down_fraction`` (default: one replica
    per step; in the benchmark two at once breached a p95 TTFT of 5 s with the fleet at 1.45× its need).
    """
    if role == "prefill" or not disaggregated:
        return cfg.prompt_scale_down_fraction
    return cfg.max_scale_down_fraction


def proven_cap(observed: RoleObservation, judged: RoleJudgement, demand_rate: float, learned: Learned, slo: Slo,
               state: RoleState, now: float, config: PlannerConfig, profile: CapacityProfile,
               new_share: float | None = None) -> tuple[RoleState, float | None]:
    """(state with this window's proof recorded, replicas proven to hold ``demand_rate``; None: no proof yet).

    A window with trustworthy data, enough requests, no rollout and no scale-down within ``down_breach_window_s``
    (its moved sessions re-prefill, and the replicas it removed served part of the window) whose TTFT held
    ``proven_ttft_margin`` × the target proves that ``ready ÷ work`` replicas per unit of prompt work (req/s × the
    profile's seconds for the mean request) suffice: replicas still starting served nothing, so the proof is
    conservative. At the same utilisation per rank more ranks queue no longer, so the demand's work × that ratio
    is enough. The ``proven_min_windows``-th lowest ratio of the last ``proven_history_s`` is the proof (one
    lucky window proves nothing), among the proofs made at a share of new sessions (``new_share``: the session
    proxy's new sessions ÷ arrivals) no lower than about the current one's (``proven_share_slack``); a breach at a
    ratio at or above a proof withdraws it."""
    cfg, rep, w = config, observed.replicas, observed.window
    if cfg.proven_min_windows <= 0:
        return state, None
    per_request = profile.prefill.request_seconds(learned.sized.new_tokens, learned.sized.cached_tokens)
    proven = tuple(x for x in state.proven if x[0] > now - cfg.proven_history_s)
    steady = (judged.data == "ok" and w is not None and not observed.rolling_out and rep.ready > 0
              and not _after_scale_down(state, now, cfg) and w.requests >= cfg.min_requests_for_feedback
              and w.request_rate > 0 and per_request > 0)
    if steady:
        ratio = rep.ready / (w.request_rate * per_request)
        if judged.breached:
            proven = tuple(x for x in proven if x[1] > ratio)
        elif judged.observed_ttft_s is not None and judged.observed_ttft_s <= cfg.proven_ttft_margin * slo.ttft_s:
            proven = proven + ((now, ratio, new_share),)
    state = replace(state, proven=proven)
    valid = [x[1] for x in proven if cfg.proven_share_slack <= 0 or new_share is None
             or (x[2] is not None and not _a_wave(new_share, x[2], cfg))]
    if len(valid) < cfg.proven_min_windows or demand_rate <= 0:
        return state, None
    ratio = sorted(valid)[cfg.proven_min_windows - 1]
    return state, ratio * demand_rate * per_request


def foreseen_cap(ready: int, breach: float | None, foreseen: tuple[float, float], cfg: PlannerConfig
                 ) -> tuple[int | None, str]:
    """(the most replicas a P/D prefill scale-up asks for while a learned season forecasts the horizon, why; None: no
    cap). ``breach``: None while the SLO holds, else the observed TTFT ÷ its target; ``foreseen``: (the demand
    observed now, the season's forecast). The SLO holding at the observed demand proves that the Ready replicas hold
    it: the season's rise scales them, with ``foreseen_margin``. A modest breach at a demand the season foresaw steps
    up by ``foreseen_breach_up_ratio`` × Ready; one above the forecast (a surprise) or further out (short of
    capacity): no cap."""
    observed, forecast = foreseen
    if ready <= 0 or observed <= 0:
        return None, ""
    if breach is None:
        if cfg.foreseen_margin <= 0:
            return None, ""
        rise = max(1.0, forecast / observed)
        cap = math.ceil(ready * rise * (1 + cfg.foreseen_margin) - 1e-9)
        return cap, (f"the SLO holds at {observed:.2f} req/s with {ready} Ready: ×{rise:.2f} for the season's "
                     f"{forecast:.2f} and ×{1 + cfg.foreseen_margin:g} margin is {cap}")
    if cfg.foreseen_breach_up_ratio <= 0 or observed > forecast or breach > cfg.foreseen_breach_ttft_ratio:
        return None, ""
    cap = math.ceil(ready * cfg.foreseen_breach_up_ratio - 1e-9)
    return cap, (f"TTFT ×{breach:.2f} its target at a demand the season foresaw: at most "
                 f"×{cfg.foreseen_breach_up_ratio:g} the {ready} Ready")


def _stabilization_reset(rs: RoleState) -> RoleState:
    return replace(rs, recommendations=(), tracking_since=None, guard_held_since=None)


def act(role: Role, observed: RoleObservation, bounds: RoleBounds, judged: RoleJudgement, demand_rate: float | None,
        sizing: Sizing, learned: Learned, disaggregated: bool, slo: Slo, budgets: Budgets, state: RoleState,
        now: float, config: PlannerConfig, headroom_note: str = "", profile: CapacityProfile | None = None,
        new_share: float | None = None, foreseen: tuple[float, float] | None = None) -> Acted:
    """Asymmetric: scale up at once to the need (counting replicas still starting), scale down one step at a
    time, only to the highest recommendation of the stabilization window, never while metrics are incomplete,
    a change is rolling out, or the SLO is breached. Given ``profile``, P/D prefill's scale-up while the SLO holds
    stops at the proven capacity (``proven_cap``; ``new_share``: the window's share of new sessions). Bounds and the
    GPU budget come after (``clamp``). ``foreseen``: (the demand observed now, the learned season's forecast over the
    horizon) while a season forecasts it: P/D prefill then scales up from what its Ready replicas do (``foreseen_cap``)."""
    cfg = config
    cur = observed.replicas.desired
    lo, hi = bounds.min_replicas, bounds.max_replicas
    starting = observed.replicas.starting
    if not bounds.autoscale:
        why = f"autoscaling is off for {role}: replicas are left to their owner"
        return Acted(Verdict(cur, "hold", why), _stabilization_reset(state))
    head = _observed_head(judged, slo, budgets.itl_s)
    need = sizing.need
    if need is None:  # missing or stale metrics: hold (bounds still apply in clamp)
        why = f"hold: {judged.data_why}; no scaling on {judged.data} metrics"
        return Acted(Verdict(cur, "hold", why), _stabilization_reset(state))
    assert demand_rate is not None
    kp, kd = learned.prefill_correction, learned.decode_correction
    k = kp if role == "prefill" else kd
    need_txt = _need_text(role, demand_rate, need, learned.sized, k, kp if not disaggregated else None)
    ks = learned.state.prefill.service_correction
    if role == "prefill" and ks is not None:
        need_txt += f" (tail fit {learned.state.prefill.correction:.2f}, measured prefill time {ks:.2f})"
    if sizing.kv_note:
        need_txt += f"; {sizing.kv_note} needs {need.replicas:.1f}"
    if headroom_note:
        need_txt += f"; {headroom_note}"
    if observed.replicas.unschedulable:
        need_txt += f"; {observed.replicas.unschedulable} replica(s) unschedulable (not counted as capacity on its way)"
    if observed.replicas.lost:
        need_txt += f"; {observed.replicas.lost} replica(s) on NotReady nodes (not counted as capacity)"
    up_target = math.ceil(need.replicas - 1e-9)
    if not judged.breached and need.replicas <= cur * (1 + cfg.up_tolerance):
        up_target = min(up_target, cur)  # the SLO holds and the need is within noise of what runs
    stuck_correction = k >= cfg.correction_max * 0.99
    if judged.breached and up_target <= cur and starting == 0 and judged.data == "ok" and (stuck_correction or not need.feasible):
        up_target = cur + 1  # model cannot learn further: step up on the observed breach alone
        need_txt += " (model at its correction limit; +1 on the observed breach)"
    rs, proof = state, None
    if role == "prefill" and disaggregated and profile is not None:
        rs, proof = proven_cap(observed, judged, demand_rate, learned, slo, rs, now, cfg, profile, new_share)
        if proof is not None:
            cap = math.ceil(proof - 1e-9)
            if up_target > max(cur, cap) and not judged.breached:
                need_txt += f" (proven capacity: {cap} held this work's TTFT before)"
                up_target = max(cur, cap)
    if role == "prefill" and disaggregated and foreseen is not None:
        over = None
        if judged.breached:  # how far out the TTFT is (inf: the breach is not the TTFT's, or unmeasured)
            t = judged.observed_ttft_s
            over = t / slo.ttft_s if t is not None else math.inf
        cap, why = foreseen_cap(observed.replicas.ready, over, foreseen, cfg)
        if cap is not None and up_target > max(cur, cap):
            need_txt += f" ({why})"
            up_target = max(cur, cap)
    if cfg.scale_up_stabilization_s > 0 and judged.data == "ok":
        # HPA semantics: scale up only to the lowest recommendation of the window
        ups = tuple(x for x in rs.up_recommendations if x[0] > now - cfg.scale_up_stabilization_s) + ((now, up_target),)
        rs = replace(rs, up_recommendations=ups)
        if min(x[1] for x in ups) < up_target:
            need_txt += f" (scale-up stabilization {cfg.scale_up_stabilization_s:.0f}s: {min(x[1] for x in ups)})"
        up_target = min(x[1] for x in ups)
    if (cfg.learn_down_margin and judged.breached and rs.last_action == "scale_down" and rs.last_scale_time is not None
            and now - rs.last_scale_time <= cfg.down_breach_window_s and rs.last_down_need):
        # that scale-down broke the SLO: the replicas it left were too few for what the model called the need
        # (re-prefill storms of moved sessions, a need the model misses): keep that ratio from now on
        ratio = min(cfg.headroom_max, rs.last_down_from / rs.last_down_need)
        rs = replace(rs, down_margin_learned=max(rs.down_margin_learned, ratio), last_down_need=None)
    margin = max(1 + cfg.down_margin, rs.down_margin_learned)
    if margin > 1 + cfg.down_margin:
        need_txt += f"; scale-down margin ×{margin:.2f} (learned: a scale-down to that ratio breached)"
    rec = max(lo, min(hi, math.ceil(need.replicas * margin - 1e-9)))
    if proof is not None and cfg.proven_down and not judged.breached:
        proven_rec = max(lo, min(hi, math.ceil(proof * margin - 1e-9)))
        if proven_rec < min(rec, cur):  # the model asks for more than has held this work: come down to what did
            need_txt += f"; scale-down to the proven capacity ({proof:.1f} × margin)"
            rec = proven_rec
    # stabilization window bookkeeping (only complete windows count as evidence for scale-down)
    if judged.data == "ok":
        recs = tuple(x for x in rs.recommendations if x[0] > now - cfg.scale_down_stabilization_s) + ((now, rec),)
        rs = replace(rs, recommendations=recs, tracking_since=rs.tracking_since if rs.tracking_since is not None else now)
    else:
        rs = _stabilization_reset(rs)
    if not need.feasible:
        need_txt += " — target unattainable with this profile even unloaded"

    desired, action = cur, "hold"
    held, moves = None, False  # since when the moved-sessions guard alone holds a scale-down; one that passed it
    if up_target > cur:
        # a change in flight: wait for it, unless users suffer or demand clearly outgrew it
        jump = need.replicas > cur * cfg.rollout_override_ratio
        if (starting > 0 or observed.rolling_out) and not judged.breached and not jump:
            why = f"{head}; {need_txt}; waiting for {_progress(observed)} before adding more (SLO holds)"
        else:
            desired, action = up_target, "scale_up"
            why = f"{head}; {need_txt}; {cur} → {up_target}"
    else:
        stabilized = max(x[1] for x in rs.recommendations) if rs.recommendations else rec
        if judged.data != "ok" and rec < cur:
            why = f"{head}; {need_txt}; holding {cur}: no scale-down on {judged.data} metrics"
        elif stabilized >= cur:
            why = f"{head}; {need_txt}; {cur} fit{'s' if cur == 1 else ''}"
        else:
            # replicas still starting or unschedulable hold no sessions, no cache and no requests: cancelling
            # them moves nothing, so neither the step limit nor the moved-sessions guard applies, and only they
            # are removed (a ReplicaSet deletes unscheduled, then not-ready pods first, and pods_to_remove picks
            # them for the deletion cost; the simulator cancels starting replicas first)
            unsched = observed.replicas.unschedulable
            cancel = cfg.cancel_starting and starting + unsched > 0
            blocker = _down_blocker(observed, judged, rs, now, cfg, cancel)
            guard = "" if blocker or cancel else sizing.down_guard
            if guard:
                held_since = rs.guard_held_since if rs.guard_held_since is not None else now
                hold = cfg.moved_sessions_hold_s
                if hold > 0 and now - held_since >= hold and not sizing.down_guard_overload:
                    # the guard is right about this scale-down's next turns, but holding for ever keeps a fleet
                    # sized for a peak through every trough: one replica per hold, its sessions re-prefill
                    target = max(stabilized, cur - cfg.max_scale_down_step)
                    desired, action, moves = target, "scale_down", True
                    why = (f"{head}; {need_txt}; {cur} → {target} after the moved-sessions guard held it "
                           f"{now - held_since:.0f}s ({guard}; the TTFT percentile may breach for about one turn)")
                else:
                    held = held_since
                    why = f"{head}; {need_txt}; holding {cur}: {guard}"
                    if hold > 0 and not sizing.down_guard_overload:
                        why += f" (held {now - held_since:.0f}/{hold:.0f}s)"
            elif blocker:
                why = f"{head}; {need_txt}; holding {cur}: {blocker}"
            elif cancel:
                target = max(stabilized, cur - starting - unsched)
                desired, action = target, "scale_down"
                why = (f"{head}; {need_txt}; {cur} → {target} after {cfg.scale_down_stabilization_s:.0f}s below: "
                       f"cancelling {cur - target} replica(s) not serving yet ({starting} starting, "
                       f"{unsched} unschedulable)")
            else:
                step = max(cfg.max_scale_down_step, math.floor(cur * down_fraction(role, disaggregated, cfg) + 1e-9))
                target = max(stabilized, cur - step)
                desired, action = target, "scale_down"
                why = f"{head}; {need_txt}; {cur} → {target} after {cfg.scale_down_stabilization_s:.0f}s below"
    if judged.data == "partial":
        why += f" [partial metrics: {judged.data_why}]"
    return Acted(Verdict(desired, action, why, moves_sessions=moves), replace(rs, guard_held_since=held))


def remember(rs: RoleState, v: Verdict, current: int, need: float | None, now: float) -> RoleState:
    """What the role's state keeps of its final (clamped) verdict: the last scale action gates the next
    scale-down (cooldown, spacing), and a scale-down is judged if a breach follows (a learned scale-down margin)
    — unless it passed the moved-sessions guard: that breach was expected, not the model's error."""
    if v.action != "hold":
        rs = replace(rs, last_scale_time=now, last_action=v.action)
    if v.action == "scale_down" and need:
        rs = replace(rs, last_down_from=current, last_down_need=None if v.moves_sessions else need)
    return rs


# ---------------------------------------------------------------- 6. clamp
@dataclass(frozen=True)
class Claim:
    """One role's verdict and what clamping it needs to know."""

    role: Role
    verdict: Verdict
    current: int  # replicas the workload has (RoleReplicas.desired)
    bounds: RoleBounds
    gpus_per_replica: int
    need: float | None  # fractional replicas the model needs (None: not sized)


@dataclass(frozen=True)
class Clamped:
    verdicts: tuple[Verdict, ...]  # one per claim, in the claims' order
    notes: tuple[str, ...] = ()


def _action(desired: int, cur: int) -> Action:
    return "scale_up" if desired > cur else "scale_down" if desired < cur else "hold"


def within_bounds(v: Verdict, cur: int, bounds: RoleBounds) -> Verdict:
    lo, hi = bounds.min_replicas, bounds.max_replicas
    want = v.desired
    desired = max(lo, min(hi, want))
    clamped, why = v.clamped, v.why
    if desired != want:
        clamped = f"{'max' if want > hi else 'min'} replicas {desired} (wanted {want})"
        why += f"; clamped to {clamped}"
    return replace(v, desired=desired, action=_action(desired, cur), why=why, clamped=clamped)


def clamp(claims: tuple[Claim, ...], gpu_budget: int | None) -> Clamped:
    """Bounds per role (autoscaled roles only), then the GPU budget: scale-ups are granted replica by replica
    to the role under most pressure until the budget is used; never a scale-down to fit it."""
    verdicts = [within_bounds(c.verdict, c.current, c.bounds) if c.bounds.autoscale else c.verdict for c in claims]
    if gpu_budget is None:
        return Clamped(tuple(verdicts))
    notes: list[str] = []
    alloc = [min(v.desired, c.current) if c.bounds.autoscale else c.current for c, v in zip(claims, verdicts)]
    used = sum(a * c.gpus_per_replica for a, c in zip(alloc, claims))
    if used > gpu_budget:
        notes.append(f"current replicas already use {used} GPUs > budget {gpu_budget}; no scale-up")
    wanting = [i for i, v in enumerate(verdicts) if v.desired > alloc[i]]
    while wanting:
        # pressure = need per allocated replica: the most starved role gets the next replica
        wanting.sort(key=lambda i: -((claims[i].need if claims[i].need is not None else verdicts[i].desired)
                                     / max(1, alloc[i])))
        granted = False
        for i in wanting:
            if used + claims[i].gpus_per_replica <= gpu_budget:
                alloc[i] += 1
                used += claims[i].gpus_per_replica
                granted = True
                break
        wanting = [i for i in wanting if verdicts[i].desired > alloc[i]]
        if not granted:
            break
    for i, c in enumerate(claims):
        v = verdicts[i]
        if alloc[i] < v.desired:
            clamped = f"GPU budget {gpu_budget} (model wanted {v.desired} {c.role} replicas, got {alloc[i]})"
            verdicts[i] = replace(v, desired=alloc[i], action=_action(alloc[i], c.current), clamped=clamped,
                                  why=v.why + f"; clamped by {clamped}")
    return Clamped(tuple(verdicts), tuple(notes))


# ---------------------------------------------------------------- predictions at the decided replicas
@dataclass(frozen=True)
class Prediction:
    ttft_s: float | None = None
    e2e_p95_s: float | None = None
    itl_s: float | None = None


@dataclass(frozen=True)
class Predictions:
    decode: Prediction
    prefill: Prediction | None = None  # None: aggregated


def predict(prefill_load: tuple[float, int] | None, decode_rate: float, decode_replicas: int, learned: Learned,
            budgets: Budgets, profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> Predictions:
    """What the model expects users to see at the decided replicas. ``prefill_load``: (req/s, replicas) of
    prefill, None when aggregated."""
    cfg = config
    pp, dp = profile.prefill, profile.decode
    d, p = learned.sized, slo.ttft_percentile
    kp, kd = learned.prefill_correction, learned.decode_correction
    pred_ttft = None
    if prefill_load is not None:
        prefill_rate, prefill_replicas = prefill_load
        pred_ttft = capacity.prefill_ttft(
            pp, prefill_rate, prefill_replicas, d.new_tokens, d.cached_tokens, p, kp, None, cfg.service_cv2
        ) + budgets.handover_s
    pred_itl = capacity.decode_itl(dp, decode_rate, decode_replicas, d.osl, d.context, kd) if d.osl > 0 else None
    if prefill_load is None:
        dshare = capacity.decode_replicas_needed(dp, decode_rate, d.osl, d.context, budgets.itl_s, kd, 1.0).replicas
        pred_ttft = capacity.prefill_ttft(
            pp, decode_rate, max(0.1 * decode_replicas, decode_replicas - dshare), d.new_tokens, d.cached_tokens, p, kp,
            dp.data_parallel_size, cfg.service_cv2,
        )
    pred_e2e = pred_ttft + d.osl_p95 * pred_itl if pred_itl is not None and pred_ttft is not None else None
    if prefill_load is None:  # the one role computes prompts too: its TTFT is the deployment's
        return Predictions(decode=Prediction(ttft_s=pred_ttft, e2e_p95_s=pred_e2e, itl_s=pred_itl))
    return Predictions(decode=Prediction(e2e_p95_s=pred_e2e, itl_s=pred_itl), prefill=Prediction(ttft_s=pred_ttft))
