"""Step 2, ``learn``: what a trustworthy window teaches, by four learners composed in ``learn``.

- ``learn_decode_correction``: decode's ITL against the profile's at the measured batch (Little's law);
- ``learn_prefill_correction``: the TTFT percentile's queueing tail fit of the role that computes prompts;
- ``learn_service_time``: P/D prefill's measured service time, without the queue (the floor of the correction);
- ``learn_hit_level``: the smoothed cache-hit level and share of new sessions of the role that computes prompts.

Each correction moves towards observed / predicted latency, bounded and smoothed in log space. Then
``prefill_sizing_correction`` and ``sized_demand`` say what sizing uses of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from v41flash.planner import capacity
from v41flash.planner.datatypes import LearnConfig, Observation, PlannerConfig, PlannerState, RoleObservation, RoleState
from v41flash.planner.demand import Budgets, Demand, new_session_share
from v41flash.planner.judge import DataStatus, Judgement
from v41flash.planner.profile import CapacityProfile
from v41flash.roles import Role


@dataclass(frozen=True)
class Learned:
    """The state after learning, and what sizing uses from it."""

    state: PlannerState  # corrections, measured service time and cache-hit level updated
    prefill_correction: float  # the tail fit, floored by the measured service-time ratio (or its default)
    decode_correction: float
    sized: Demand  # the window's demand at the smoothed cache-hit level


def _smooth_correction(old: float, sample: float, cfg: LearnConfig, weight: float | None = None) -> float:
    w = cfg.correction_smoothing if weight is None else weight
    k = math.exp((1 - w) * math.log(old) + w * math.log(sample))
    return min(cfg.correction_max, max(cfg.correction_min, k))


def _ewma(level: float | None, sample: float, weight: float) -> float:
    """The smoothed level after one more sample (the first sample is the level)."""
    return sample if level is None else weight * sample + (1 - weight) * level


def a_wave(share: float, level: float, cfg: PlannerConfig) -> bool:
    """A share of new sessions well above ``level`` (by ``proven_share_slack`` + 0.01): whole prompts, dearer work
    than the cache-hit level of the windows at ``level`` says."""
    return share > level * (1 + cfg.act.proven_share_slack) + 0.01


def after_scale_down(rs: RoleState, now: float, cfg: PlannerConfig) -> bool:
    """The role shed replicas within ``down_breach_window_s``: its moved sessions may still be re-prefilling."""
    return (rs.last_action == "scale_down" and rs.last_scale_time is not None
            and now - rs.last_scale_time < cfg.act.down_breach_window_s)


def _front(observed: Observation) -> tuple[Role, RoleObservation]:
    """The role that computes prompts (prefill, or the one aggregated role) and its observation."""
    return ("prefill", observed.prefill) if observed.prefill is not None else ("decode", observed.decode)


def _teaches(o: RoleObservation, status: DataStatus, cfg: PlannerConfig) -> bool:
    """A window to learn from: complete data, no rollout, enough finished requests."""
    return status == "ok" and not o.rolling_out and o.window.requests >= cfg.learn.min_requests_for_feedback


def learn_decode_correction(observed: Observation, judgement: Judgement, demand: Demand, profile: CapacityProfile,
                            rs: RoleState, cfg: PlannerConfig) -> RoleState:
    """Decode's ITL against the profile's at the batch the window measured (Little's law, not the model)."""
    dp, dw, ready = profile.decode, observed.decode.window, observed.decode.replicas.ready
    if not (_teaches(observed.decode, judgement.decode.data, cfg) and dw.itl_mean_s and ready > 0 and demand.osl > 0):
        return rs
    lc = cfg.learn
    rate_rank = dw.request_rate / (ready * dp.data_parallel_size)
    b_obs = rate_rank * demand.osl * dw.itl_mean_s  # Little's law: measured, not modelled
    model_itl = dp.itl_seconds(b_obs, demand.context)
    sample = min(lc.correction_max * 2, max(lc.correction_min / 2, dw.itl_mean_s / model_itl))
    return replace(rs, correction=_smooth_correction(rs.correction, sample, lc),
                   corrections_learned=rs.corrections_learned + 1)


def learn_prefill_correction(observed: Observation, judgement: Judgement, demand: Demand, budgets: Budgets,
                             profile: CapacityProfile, rs: RoleState, decode: RoleState,
                             cfg: PlannerConfig) -> RoleState:
    """The correction that makes the queueing model's TTFT percentile the observed one, for the role that computes
    prompts (kept in the prefill state also when aggregated; ``decode``: decode's learned state, whose work takes
    part of every aggregated replica)."""
    disagg = observed.prefill is not None
    pp, dp = profile.prefill, profile.decode
    front, front_obs = _front(observed)
    fw, ready_f = front_obs.window, front_obs.replicas.ready
    if not (_teaches(front_obs, judgement.role(front).data, cfg) and fw.ttft_s is not None and ready_f > 0
            and demand.isl > 0):
        return rs
    lc = cfg.learn
    decode_need_now = 0.0
    dw = observed.decode.window
    if not disagg and observed.decode.replicas.ready > 0:
        # aggregated: decode work occupies part of every replica; prefill gets the rest
        decode_need_now = capacity.decode_replicas_needed(
            dp, dw.request_rate if dw else 0.0, demand.osl, demand.context, budgets.itl_s, decode.correction, 1.0
        ).replicas
    n_eff = max(0.1 * ready_f, ready_f - decode_need_now)
    ranks = dp.data_parallel_size if not disagg else pp.data_parallel_size

    def predict(k: float) -> float:
        return capacity.prefill_ttft(
            pp, fw.request_rate, n_eff, demand.new_tokens, demand.cached_tokens, fw.ttft_percentile, k, ranks,
            cfg.size.service_cv2
        )

    sample = capacity.solve_correction(predict, fw.ttft_s, lc.correction_min / 2, lc.correction_max * 2)
    service = pp.request_seconds(demand.new_tokens, demand.cached_tokens)
    if fw.request_rate * service * sample / (n_eff * ranks) > 0.9:
        # near saturation a queue of any length fits some k < truth: it may only teach "slower"
        sample = max(sample, rs.correction)
    if lc.saturation_learning and fw.waiting > n_eff * ranks and fw.request_rate > 0:
        # a backlog means the ranks were busy all window: completions = capacity, so ρ ≥ 1 gives
        # k ≥ ranks / (completions × service) — a lower bound that holds however long the queue
        sample = max(sample, n_eff * ranks / (fw.request_rate * service))
    return replace(rs, correction=_smooth_correction(rs.correction, sample, lc),
                   corrections_learned=rs.corrections_learned + 1)


def learn_service_time(observed: Observation, judgement: Judgement, demand: Demand, profile: CapacityProfile,
                       rs: RoleState, cfg: PlannerConfig) -> RoleState:
    """P/D prefill's service time itself, measured without the queue (vllm:request_prefill_time): the floor of
    the correction (``prefill_sizing_correction``)."""
    fw = observed.prefill.window if observed.prefill is not None else None
    if not (observed.prefill is not None and _teaches(observed.prefill, judgement.role("prefill").data, cfg)
            and fw.ttft_s is not None and observed.prefill.replicas.ready > 0 and demand.isl > 0
            and fw.prefill_time_mean_s and demand.new_tokens > 0):
        return rs
    lc = cfg.learn
    model_s = profile.prefill.request_seconds(demand.new_tokens, demand.cached_tokens)
    s_sample = min(lc.correction_max * 2, max(lc.correction_min / 2, fw.prefill_time_mean_s / model_s))
    old = rs.service_correction
    return replace(rs, service_correction=s_sample if old is None else _smooth_correction(
        old, s_sample, lc, weight=lc.service_smoothing))


def learn_hit_level(observed: Observation, judgement: Judgement, demand: Demand, state: PlannerState,
                    cfg: PlannerConfig) -> PlannerState:
    """The cache-hit level and the share of new sessions of the role that computes prompts, smoothed
    (``hit_smoothing``): what will hold when new replicas are Ready, not one window's miss storm."""
    front, front_obs = _front(observed)
    if not _teaches(front_obs, judgement.role(front).data, cfg):
        return state
    frs, share, weight = state.role(front), new_session_share(observed), cfg.learn.hit_smoothing
    hit_level = frs.hit_level
    if front_obs.window.prefix_cache_hit_rate is not None:
        hit_level = _ewma(hit_level, demand.hit_rate, weight)
    share_level = frs.share_level if share is None else _ewma(frs.share_level, share, weight)
    return state.with_role(front, replace(frs, hit_level=hit_level, share_level=share_level))


def prefill_sizing_correction(rs: RoleState, cfg: PlannerConfig) -> float:
    """The latency correction fits the queueing tail; below the measured service-time ratio (or 1 when prefill
    time is not measured) it sized prefill too lean as load rose (agent prefill times are heavy-tailed and
    session-affine): sizing never assumes prefill cheaper than that floor."""
    lc = cfg.learn
    ks = rs.service_correction
    kp = max(rs.correction, ks if ks is not None else lc.min_throughput_correction)
    if ks is not None and lc.max_tail_over_service > 0:
        # ... nor much dearer than measured: when the TTFT tail is the service time of the longest prompts, more
        # replicas do not shorten it, and a tail fit that keeps rising with them orders replicas without end
        kp = min(kp, max(ks, lc.min_throughput_correction) * lc.max_tail_over_service)
    return kp


def sized_demand(observed: Observation, judgement: Judgement, demand: Demand, before: RoleState, after: RoleState,
                 now: float, cfg: PlannerConfig) -> Demand:
    """The demand at the cache-hit level that will hold when new replicas are Ready (``after``: the front role's
    state with the level learned; ``before``: without this window): the smoothed level, when there is one — except
    while users already wait (the role judged in breach): then the window's own level if lower, the work the tail
    fit saw ... unless the role shed replicas within ``down_breach_window_s`` and the window's share of new sessions
    is no wave (``a_wave``, against the share level before this window): then the misses are the sessions the
    scale-down moved, which re-prefill for about one turn, not a wave that misses for as long as it lasts."""
    lc = cfg.learn
    front, front_obs = _front(observed)
    hit_level, share, share_level = after.hit_level, new_session_share(observed), before.share_level
    wave = share is None or share_level is None or a_wave(share, share_level, cfg)
    if (lc.breach_hit_level and hit_level is not None and judgement.role(front).breached
            and front_obs.window.prefix_cache_hit_rate is not None
            and (wave or not lc.breach_share_gate or not after_scale_down(before, now, cfg))):
        hit_level = min(hit_level, demand.hit_rate)
    return demand if hit_level is None else replace(demand, hit_rate=min(0.999, max(0.0, hit_level)))


def learn(observed: Observation, judgement: Judgement, demand: Demand, budgets: Budgets, profile: CapacityProfile,
          state: PlannerState, config: PlannerConfig, now: float) -> Learned:
    """The four learners on this window, then what sizing uses: the prefill correction with its floor and cap,
    and the demand at the cache-hit level."""
    decode = learn_decode_correction(observed, judgement, demand, profile, state.decode, config)
    prefill = learn_prefill_correction(observed, judgement, demand, budgets, profile, state.prefill, decode, config)
    prefill = learn_service_time(observed, judgement, demand, profile, prefill, config)
    corrected = replace(state, prefill=prefill, decode=decode)
    learned = learn_hit_level(observed, judgement, demand, corrected, config)
    front = _front(observed)[0]
    sized = sized_demand(observed, judgement, demand, corrected.role(front), learned.role(front), now, config)
    return Learned(state=learned, prefill_correction=prefill_sizing_correction(prefill, config),
                   decode_correction=decode.correction, sized=sized)
