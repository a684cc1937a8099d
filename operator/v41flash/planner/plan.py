"""The SLO planner: observed window + capacity profile + SLO + bounds + state → desired replicas.

One pure function, ``plan``. Per decision and per role it:

1. judges the data (missing / stale / partial → no scale-down, no learning, say why);
2. learns: compares observed latency with what the profile predicts at the observed load and moves a
   per-role correction factor towards the ratio (bounded, smoothed in log space);
3. forecasts demand: damped Holt trend on the request rate over the role's cold-start horizon, plus
   the queue backlog, never below what is observed now;
4. sizes: fractional replicas that keep TTFT (prefill) and ITL within the e2e budget (decode) at the
   forecast demand, with the corrected profile;
5. acts asymmetrically: scale up at once to the need (counting replicas still starting), scale down
   one step at a time, only to the highest recommendation of the stabilization window, never while
   metrics are incomplete, a change is rolling out, or the SLO is breached;
6. clamps to bounds and the GPU budget and says what was clamped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from v41flash.metrics.figures import WindowFigures
from v41flash.planner import capacity
from v41flash.planner.profile import CapacityProfile
from v41flash.planner.datatypes import (
    Action,
    Bounds,
    Decision,
    Observation,
    PlannerConfig,
    PlannerState,
    Role,
    RoleBounds,
    RoleDecision,
    RoleObservation,
    RoleState,
    Slo,
)


ASSUMED_OUTPUT_TOKENS = 1000.0  # AgentX mean output (shared/reference/workload-and-performance.md)


@dataclass(frozen=True)
class _Demand:
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


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.2f}s")


def _fmt_k(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def _pct(p: float) -> str:
    return f"p{p * 100:g}"


def _data_status(obs: RoleObservation, now: float, cfg: PlannerConfig) -> tuple[str, str]:
    """('ok' | 'partial' | 'stale' | 'missing', why)."""
    w = obs.window
    if w is None:
        return "missing", "no metrics for this role"
    age = now - w.end
    if age > cfg.max_metrics_age_s:
        return "stale", f"metrics are {age:.0f}s old (> {cfg.max_metrics_age_s:.0f}s)"
    if w.pods_observed == 0 and (w.pods_expected > 0 or obs.replicas.ready > 0):
        return "missing", f"no pod of {w.pods_expected or obs.replicas.ready} answered its metrics scrape"
    if not w.complete:
        parts = []
        if w.missing_pods:
            parts.append(f"{len(w.missing_pods)} pod(s) missing ({', '.join(w.missing_pods[:3])})")
        if w.partial_pods:
            parts.append(f"{len(w.partial_pods)} pod(s) with partial data ({', '.join(w.partial_pods[:3])})")
        if not parts:
            parts.append(f"{w.pods_observed}/{w.pods_expected} pods observed")
        return "partial", "; ".join(parts)
    return "ok", ""


def _scaled_rate(w: WindowFigures) -> float:
    """Request rate, scaled up when only some pods reported (never underestimate demand)."""
    if w.pods_observed and w.pods_expected > w.pods_observed:
        return w.request_rate * w.pods_expected / w.pods_observed
    return w.request_rate


def _demand(observed: Observation) -> _Demand:
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
    return _Demand(
        prefill_rate=_scaled_rate(front) if front else 0.0,
        decode_rate=_scaled_rate(dw) if dw else 0.0,
        isl=isl,
        hit_rate=min(0.999, max(0.0, first(front.prefix_cache_hit_rate if front else None))),
        osl=osl,
        osl_p95=first(dw.output_tokens_p95 if dw else None, default=2.0 * osl),
        prefill_backlog=front.waiting if front else 0.0,
        decode_backlog=dw.waiting if dw else 0.0,
    )


def _forecast(rs: RoleState, rate: float | None, now: float, horizon: float, cfg: PlannerConfig) -> tuple[RoleState, float]:
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


def _smooth_correction(old: float, sample: float, cfg: PlannerConfig) -> float:
    w = cfg.correction_smoothing
    k = math.exp((1 - w) * math.log(old) + w * math.log(sample))
    return min(cfg.correction_max, max(cfg.correction_min, k))


@dataclass
class _RoleWork:
    """Mutable scratch for one role inside one plan() call (never escapes)."""

    role: Role
    obs: RoleObservation
    bounds: RoleBounds
    state: RoleState
    gpus: int
    status: str = "ok"
    status_why: str = ""
    need: capacity.Need | None = None
    demand_rate: float | None = None
    desired: int = 0
    action: Action = "hold"
    why: str = ""
    clamped: str | None = None
    breached: bool = False
    observed_ttft: float | None = None
    observed_e2e: float | None = None
    observed_itl: float | None = None
    rec: int | None = None
    kv_note: str = ""


def plan(
    observed: Observation,
    profile: CapacityProfile,
    slo: Slo,
    bounds: Bounds,
    state: PlannerState,
    now: float,
    config: PlannerConfig = PlannerConfig(),
) -> Decision:
    """Decide replicas per role. Pure: same inputs, same Decision (the new state comes back inside it)."""
    cfg = config
    disagg = observed.prefill is not None
    pp, dp = profile.prefill, profile.decode
    demand = _demand(observed)
    p = slo.ttft_percentile

    # --- budgets: split the SLO between the phases ------------------------------------------------
    dw = observed.decode.window
    pw = observed.prefill.window if disagg else None
    # A window where nothing finished says nothing about output lengths: split the SLO as for a typical
    # answer, not for 0 tokens (that would hand the whole e2e headroom to one decode step). Sizing still
    # uses the observed demand, so an empty window never asks for capacity.
    osl_for_budget = demand.osl_p95 if demand.osl_p95 > 0 else 2.0 * ASSUMED_OUTPUT_TOKENS
    itl_budget = slo.itl_s or max(1e-4, (slo.e2e_p95_s - slo.ttft_s) / max(1.0, osl_for_budget))
    # KV hand-over plus decode's first step (at its budget: decode is sized separately to meet it)
    handover = (profile.kv_transfer.seconds(demand.isl) + itl_budget) if disagg else 0.0
    prefill_budget = max(1e-3, slo.ttft_s - handover)

    # --- observed, user-facing figures --------------------------------------------------------------
    enough = lambda w: w is not None and w.requests >= cfg.min_requests_for_slo  # noqa: E731
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
    e2e_breach = obs_e2e is not None and obs_e2e > slo.e2e_p95_s
    itl_breach = obs_itl is not None and obs_itl > itl_budget

    roles: list[_RoleWork] = []
    if disagg:
        roles.append(_RoleWork("prefill", observed.prefill, bounds.prefill, state.prefill, pp.gpus_per_replica))
    roles.append(_RoleWork("decode", observed.decode, bounds.decode, state.decode, dp.gpus_per_replica))
    work = {r.role: r for r in roles}
    new_state = state
    notes: list[str] = []

    for r in roles:
        r.status, r.status_why = _data_status(r.obs, now, cfg)
        cold_start = (pp if r.role == "prefill" else dp).cold_start_seconds
        stuck = [s for s in r.obs.replicas.starting_for_s if s > 2 * cold_start]
        if stuck:  # still counted as coming capacity, but a human should look (unschedulable? crash loop?)
            notes.append(
                f"{len(stuck)} {r.role} replica(s) starting for over {max(stuck):.0f}s "
                f"(> 2× the profile's {cold_start:.0f}s cold start): check their pods"
            )
        r.observed_itl = obs_itl if r.role == "decode" else None
        r.observed_ttft = obs_ttft if (r.role == "prefill" or not disagg) else None
        r.observed_e2e = obs_e2e if r.role == "decode" else None
        if r.role == "prefill":
            r.breached = ttft_breach or (e2e_breach and not itl_breach)
        else:
            r.breached = (e2e_breach and (itl_breach or not disagg or not ttft_breach)) or (ttft_breach and not disagg)

    # --- learn: per-role correction from observed vs predicted latency -------------------------------
    prefill_state = state.prefill
    decode_state = state.decode
    front_obs = observed.prefill if disagg else observed.decode
    front_status = work["prefill"].status if disagg else work["decode"].status
    learn_ok = lambda o, st: (  # noqa: E731
        st == "ok" and not o.rolling_out and o.window.requests >= cfg.min_requests_for_feedback
    )
    decode_need_now = 0.0
    ready_d = observed.decode.replicas.ready
    if learn_ok(observed.decode, work["decode"].status) and dw.itl_mean_s and ready_d > 0 and demand.osl > 0:
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
            dp, dw.request_rate if dw else 0.0, demand.osl, demand.context, itl_budget, decode_state.correction, 1.0
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
    new_state = replace(new_state, prefill=prefill_state, decode=decode_state)
    # The latency correction fits the queueing tail; below the measured service-time ratio (or 1 when
    # prefill time is not measured) it sized prefill too lean as load rose (agent prefill times are
    # heavy-tailed and session-affine): sizing never assumes prefill cheaper than that floor.
    ks = prefill_state.service_correction
    kp = max(prefill_state.correction, ks if ks is not None else cfg.min_throughput_correction)
    kd = decode_state.correction
    # Size for the cache-hit level that will hold when new replicas are Ready, not for one window's miss
    # storm (a scale-down or a wave of new sessions): the smoothed level, when there is one.
    front_role: Role = "prefill" if disagg else "decode"
    frs = new_state.role(front_role)
    hit_level = frs.hit_level
    if learn_ok(front_obs, front_status) and fw.prefix_cache_hit_rate is not None:
        w = cfg.hit_smoothing
        hit_level = demand.hit_rate if hit_level is None else w * demand.hit_rate + (1 - w) * hit_level
        new_state = new_state.with_role(front_role, replace(frs, hit_level=hit_level))
    sized = demand if hit_level is None else replace(demand, hit_rate=min(0.999, max(0.0, hit_level)))

    # --- forecast and size ----------------------------------------------------------------------------
    def size_prefill(rate: float, ranks: int) -> capacity.Need:
        return capacity.prefill_replicas_needed(
            pp, rate, sized.new_tokens, sized.cached_tokens, prefill_budget, p, kp, cfg.target_utilization, ranks,
            cfg.service_cv2,
        )

    def size_decode(rate: float) -> capacity.Need:
        return capacity.decode_replicas_needed(dp, rate, demand.osl, demand.context, itl_budget, kd, cfg.target_utilization)

    for r in roles:
        rs = new_state.role(r.role)
        usable = r.status in ("ok", "partial")
        cold = (pp if r.role == "prefill" else dp).cold_start_seconds
        horizon = cfg.forecast_horizon_s if cfg.forecast_horizon_s is not None else cold
        completed = demand.prefill_rate if (r.role == "prefill" or not disagg) else demand.decode_rate
        backlog = demand.prefill_backlog if (r.role == "prefill" or not disagg) else demand.decode_backlog
        # arrivals = completions + queue growth (completions alone understate demand when saturated)
        observed_rate = completed
        if cfg.arrivals_from_queue_growth and usable and rs.last_waiting is not None and rs.rate_time is not None and now > rs.rate_time:
            observed_rate = max(0.0, completed + (backlog - rs.last_waiting) / (now - rs.rate_time))
        rs, forecast = _forecast(rs, observed_rate if usable else None, now, horizon, cfg)
        rs = replace(rs, last_waiting=backlog if usable else None)
        new_state = new_state.with_role(r.role, rs)
        if not usable:
            continue
        # smoothed demand normally (noise must not scale); the raw rate too when users already suffer
        rate = (max(observed_rate, forecast) if r.breached else forecast) + backlog / cfg.backlog_drain_s
        r.demand_rate = rate
        if r.role == "prefill":
            r.need = size_prefill(rate, pp.data_parallel_size)
        elif disagg:
            r.need = size_decode(rate)
        else:
            dn, pn = size_decode(rate), size_prefill(rate, dp.data_parallel_size)
            r.need = capacity.Need(dn.replicas + pn.replicas, dn.feasible and pn.feasible)
        if r.role == "decode" and r.obs.window.kv_cache_usage is not None and r.obs.replicas.ready > 0:
            # KV memory binds before compute (long agentic contexts): keep usage under the target
            # (also when below target: it stops a scale-down that would push usage over it)
            kv = r.obs.window.kv_cache_usage
            kv_need = r.obs.replicas.ready * kv / cfg.kv_cache_target
            if kv_need > r.need.replicas:
                r.need = capacity.Need(kv_need, r.need.feasible)
                r.kv_note = f"KV cache {kv:.0%} full ({cfg.kv_cache_target:.0%} target)"

    # --- act per role -----------------------------------------------------------------------------
    for r in roles:
        rs = new_state.role(r.role)
        cur = r.obs.replicas.desired
        lo, hi = r.bounds.min_replicas, r.bounds.max_replicas
        starting = r.obs.replicas.starting
        r.desired, r.action = cur, "hold"
        if not r.bounds.autoscale:
            r.why = f"autoscaling is off for {r.role}: replicas are left to their owner"
            new_state = new_state.with_role(r.role, replace(rs, recommendations=(), tracking_since=None))
            continue
        head = _observed_head(r, slo, itl_budget)
        if r.need is None:  # missing or stale metrics: hold (bounds still apply below)
            new_state = new_state.with_role(r.role, replace(rs, recommendations=(), tracking_since=None))
            r.why = f"hold: {r.status_why}; no scaling on {r.status} metrics"
            _apply_bounds(r, cur, lo, hi)
            continue
        k = kp if r.role == "prefill" else kd
        need_txt = _need_text(r, sized, k, kp if not disagg else None)
        if r.role == "prefill" and ks is not None:
            need_txt += f" (tail fit {prefill_state.correction:.2f}, measured prefill time {ks:.2f})"
        if r.kv_note:
            need_txt += f"; {r.kv_note} needs {r.need.replicas:.1f}"
        up_target = math.ceil(r.need.replicas - 1e-9)
        if not r.breached and r.need.replicas <= cur * (1 + cfg.up_tolerance):
            up_target = min(up_target, cur)  # the SLO holds and the need is within noise of what runs
        stuck_correction = k >= cfg.correction_max * 0.99
        if r.breached and up_target <= cur and starting == 0 and r.status == "ok" and (stuck_correction or not r.need.feasible):
            up_target = cur + 1  # model cannot learn further: step up on the observed breach alone
            need_txt += " (model at its correction limit; +1 on the observed breach)"
        rec = max(lo, min(hi, math.ceil(r.need.replicas * (1 + cfg.down_margin) - 1e-9)))
        # stabilization window bookkeeping (only complete windows count as evidence for scale-down)
        if r.status == "ok":
            recs = tuple(x for x in rs.recommendations if x[0] > now - cfg.scale_down_stabilization_s) + ((now, rec),)
            rs = replace(rs, recommendations=recs, tracking_since=rs.tracking_since if rs.tracking_since is not None else now)
        else:
            rs = replace(rs, recommendations=(), tracking_since=None)
        new_state = new_state.with_role(r.role, rs)
        if not r.need.feasible:
            need_txt += " — target unattainable with this profile even unloaded"

        if up_target > cur:
            # a change in flight: wait for it, unless users suffer or demand clearly outgrew it
            jump = r.need.replicas > cur * cfg.rollout_override_ratio
            if (starting > 0 or r.obs.rolling_out) and not r.breached and not jump:
                r.why = f"{head}; {need_txt}; waiting for {_progress(r)} before adding more (SLO holds)"
            else:
                r.desired, r.action = up_target, "scale_up"
                r.why = f"{head}; {need_txt}; {cur} → {up_target}"
        else:
            stabilized = max(x[1] for x in rs.recommendations) if rs.recommendations else rec
            if r.status != "ok" and rec < cur:
                r.why = f"{head}; {need_txt}; holding {cur}: no scale-down on {r.status} metrics"
            elif stabilized >= cur:
                r.why = f"{head}; {need_txt}; {cur} fit{'s' if cur == 1 else ''}"
            else:
                blocker = _down_blocker(r, rs, now, cfg)
                if blocker:
                    r.why = f"{head}; {need_txt}; holding {cur}: {blocker}"
                else:
                    step = max(cfg.max_scale_down_step, math.floor(cur * _down_fraction(r, disagg, cfg) + 1e-9))
                    target = max(stabilized, cur - step)
                    r.desired, r.action = target, "scale_down"
                    r.why = f"{head}; {need_txt}; {cur} → {target} after {cfg.scale_down_stabilization_s:.0f}s below"
        if r.status == "partial":
            r.why += f" [partial metrics: {r.status_why}]"
        _apply_bounds(r, cur, lo, hi)

    _apply_budget(roles, bounds.gpu_budget, notes)

    # --- predictions at the decided replicas, final state -------------------------------------------
    decisions: dict[str, RoleDecision] = {}
    pred_ttft = None
    if disagg:
        pr = work["prefill"]
        pred_ttft = capacity.prefill_ttft(
            pp, pr.demand_rate or demand.prefill_rate, pr.desired, sized.new_tokens, sized.cached_tokens, p, kp, None, cfg.service_cv2
        ) + handover
    for r in roles:
        rs = new_state.role(r.role)
        if r.action != "hold":
            rs = replace(rs, last_scale_time=now, last_action=r.action)
        new_state = new_state.with_role(r.role, rs)
        rate = r.demand_rate if r.demand_rate is not None else (demand.prefill_rate if r.role == "prefill" else demand.decode_rate)
        pred_itl = pred_e2e = None
        if r.role == "decode":
            pred_itl = capacity.decode_itl(dp, rate, r.desired, demand.osl, demand.context, kd) if demand.osl > 0 else None
            if not disagg:
                dshare = capacity.decode_replicas_needed(dp, rate, demand.osl, demand.context, itl_budget, kd, 1.0).replicas
                pred_ttft = capacity.prefill_ttft(
                    pp, rate, max(0.1 * r.desired, r.desired - dshare), sized.new_tokens, sized.cached_tokens, p, kp,
                    dp.data_parallel_size, cfg.service_cv2,
                )
            if pred_itl is not None and pred_ttft is not None:
                pred_e2e = pred_ttft + demand.osl_p95 * pred_itl
        decisions[r.role] = RoleDecision(
            role=r.role,
            current=r.obs.replicas.desired,
            desired=r.desired,
            action=r.action,
            reason=r.why,
            needed=None if r.need is None else round(r.need.replicas, 3),
            demand_rate=None if r.demand_rate is None else round(r.demand_rate, 4),
            observed_ttft_s=r.observed_ttft,
            observed_e2e_p95_s=r.observed_e2e,
            observed_itl_s=r.observed_itl,
            predicted_ttft_s=pred_ttft if (r.role == "prefill" or not disagg) else None,
            predicted_e2e_p95_s=pred_e2e,
            predicted_itl_s=pred_itl,
            correction=round(kp if r.role == "prefill" else kd, 4),
            clamped=r.clamped,
            slo_breached=r.breached,
        )
    new_state = replace(new_state, last_decision_time=now)
    return Decision(time=now, decode=decisions["decode"], prefill=decisions.get("prefill"), state=new_state, notes=tuple(notes))


def _observed_head(r: _RoleWork, slo: Slo, itl_budget: float) -> str:
    p = _pct(slo.ttft_percentile)
    parts = []
    if r.observed_ttft is not None:
        op = ">" if r.observed_ttft > slo.ttft_s else "≤"
        parts.append(f"TTFT {p} {_fmt_s(r.observed_ttft)} {op} {_fmt_s(slo.ttft_s)} target")
    if r.observed_e2e is not None:
        op = ">" if r.observed_e2e > slo.e2e_p95_s else "≤"
        parts.append(f"e2e p95 {_fmt_s(r.observed_e2e)} {op} {_fmt_s(slo.e2e_p95_s)} target")
    if r.observed_itl is not None and r.observed_itl > itl_budget:
        parts.append(f"ITL {r.observed_itl * 1000:.1f}ms > {itl_budget * 1000:.1f}ms budget")
    return ", ".join(parts) if parts else "no latency samples in window"


def _need_text(r: _RoleWork, d: _Demand, k: float, k_prefill: float | None) -> str:
    lengths = f"{_fmt_k(d.isl)} ISL"
    if d.hit_rate > 0:
        lengths += f" ({d.hit_rate:.0%} cached)"
    if r.role == "decode":
        lengths += f", {_fmt_k(d.osl)} OSL"
    corr = f"correction {k:.2f}" if k_prefill is None else f"corrections prefill {k_prefill:.2f}/decode {k:.2f}"
    return f"demand {r.demand_rate:.2f} req/s × {lengths} needs {r.need.replicas:.1f} {r.role} replicas at {corr}"


def _progress(r: _RoleWork) -> str:
    rep = r.obs.replicas
    if rep.starting:
        since = f", longest {max(rep.starting_for_s):.0f}s" if rep.starting_for_s else ""
        return f"{rep.starting} starting replica(s){since}"
    return "the rollout in progress"


def _down_blocker(r: _RoleWork, rs: RoleState, now: float, cfg: PlannerConfig) -> str | None:
    """Why a scale-down the model wants must wait, or None when it may happen now."""
    if r.status != "ok":
        return f"no scale-down on {r.status} metrics"
    if r.breached:
        return "SLO is breached"
    if r.obs.replicas.starting > 0 or r.obs.rolling_out:
        return f"waiting for {_progress(r)}"
    covered = now - rs.tracking_since if rs.tracking_since is not None else 0.0
    if covered < cfg.scale_down_stabilization_s:
        return f"stabilizing ({covered:.0f}/{cfg.scale_down_stabilization_s:.0f}s of lower need)"
    if rs.last_scale_time is not None:
        wait = cfg.scale_down_cooldown_s if rs.last_action == "scale_up" else cfg.scale_down_interval_s
        if now - rs.last_scale_time < wait:
            return f"cooldown ({now - rs.last_scale_time:.0f}/{wait:.0f}s since the last {rs.last_action.replace('_', '-')})"
    return None


def _down_fraction(r: _RoleWork, disagg: bool, cfg: PlannerConfig) -> float:
    """Share of the role's replicas one scale-down may remove (at least ``max_scale_down_step``).

    Removing a replica that computes prompts throws its prefix cache away: each of its sessions'
    next turn re-prefills the whole context elsewhere (a 280k-token agent context is ~14 s on H200 TP4)
    and blocks the requests queued behind it on that rank, however much spare capacity the fleet has,
    so the roles that compute prompts shrink by ``prompt_scale_down_fraction`` (default: one replica
    per step; in the benchmark two at once breached a p95 TTFT of 5 s with the fleet at 1.45× its need).
    """
    if r.role == "prefill" or not disagg:
        return cfg.prompt_scale_down_fraction
    return cfg.max_scale_down_fraction


def _apply_bounds(r: _RoleWork, cur: int, lo: int, hi: int) -> None:
    want = r.desired
    r.desired = max(lo, min(hi, want))
    if r.desired != want:
        r.clamped = f"{'max' if want > hi else 'min'} replicas {r.desired} (wanted {want})"
        r.why += f"; clamped to {r.clamped}"
    r.action = "scale_up" if r.desired > cur else "scale_down" if r.desired < cur else "hold"


def _apply_budget(roles: list[_RoleWork], budget: int | None, notes: list[str]) -> None:
    """Grant scale-ups replica by replica to the role under most pressure until the GPU budget is used."""
    if budget is None:
        return
    alloc = {r.role: min(r.desired, r.obs.replicas.desired) if r.bounds.autoscale else r.obs.replicas.desired for r in roles}
    used = sum(alloc[r.role] * r.gpus for r in roles)
    if used > budget:
        notes.append(f"current replicas already use {used} GPUs > budget {budget}; no scale-up")
    wanting = [r for r in roles if r.desired > alloc[r.role]]
    while wanting:
        # pressure = need per allocated replica: the most starved role gets the next replica
        wanting.sort(key=lambda r: -((r.need.replicas if r.need else r.desired) / max(1, alloc[r.role])))
        granted = False
        for r in wanting:
            if used + r.gpus <= budget:
                alloc[r.role] += 1
                used += r.gpus
                granted = True
                break
        wanting = [r for r in wanting if r.desired > alloc[r.role]]
        if not granted:
            break
    for r in roles:
        if alloc[r.role] < r.desired:
            want = r.desired
            r.desired = alloc[r.role]
            r.clamped = f"GPU budget {budget} (model wanted {want} {r.role} replicas, got {r.desired})"
            r.why += f"; clamped by {r.clamped}"
            cur = r.obs.replicas.desired
            r.action = "scale_up" if r.desired > cur else "scale_down" if r.desired < cur else "hold"
