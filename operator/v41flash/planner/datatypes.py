"""Inputs and outputs of the planner: plain frozen dataclasses (the planner itself is pure).

Roles are ``prefill`` and ``decode``; an aggregated (non-disaggregated) deployment has only
``decode``, whose replicas both prefill and decode. The caller (controller or simulator) builds an
``Observation``, keeps the ``PlannerState`` the last ``Decision`` returned (e.g. in CR status via
``PlannerState.to_dict``/``from_dict``), and writes ``RoleDecision.desired`` as the role's replicas.
"""
from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields, is_dataclass, replace
from typing import Literal

from v41flash import defaults
from v41flash.figures import RouterFigures, WindowFigures
from v41flash.planner import seasonal, trend
from v41flash.planner.schedule import Window
from v41flash.roles import Role

Action = Literal["scale_up", "scale_down", "hold"]


# ---------------------------------------------------------------- inputs
@dataclass(frozen=True)
class RoleReplicas:
    desired: int  # replicas currently written in the workload spec (what the planner last asked for)
    ready: int  # Ready pods/replicas
    starting: int = 0  # created but not Ready yet (weights loading); they count as coming capacity
    starting_for_s: tuple[float, ...] = ()  # how long each starting replica has been starting
    # Pending because no node can take them (PodScheduled=False, Unschedulable): part of ``desired``,
    # never of ``starting`` — they are not capacity on its way
    unschedulable: int = 0
    # on a node that is NotReady (pods not Ready there): part of ``desired``, neither ``ready`` nor
    # ``starting`` — they serve nothing until Kubernetes evicts and the workload replaces them
    lost: int = 0


@dataclass(frozen=True)
class RoleObservation:
    replicas: RoleReplicas
    window: WindowFigures | None  # None: no metrics at all for this role
    rolling_out: bool = False  # a template/spec rollout is in progress (pods being replaced)
    cold_start_s: float | None = None  # measured pod created → Ready on this cluster; None: the profile's


@dataclass(frozen=True)
class Observation:
    decode: RoleObservation
    prefill: RoleObservation | None = None  # None: aggregated deployment
    router: RouterFigures | None = None  # user-facing e2e from the router, preferred when it has samples


@dataclass(frozen=True)
class Slo:
    ttft_s: float  # TTFT target (seconds) at ttft_percentile
    e2e_p95_s: float  # p95 end-to-end latency target (seconds)
    ttft_percentile: float = defaults.TTFT_PERCENTILE / 100  # 0.9 = p90
    window_s: float = float(defaults.SLO_WINDOW_SECONDS)  # evaluation window
    itl_s: float | None = None  # optional explicit inter-token latency target; else derived from e2e


@dataclass(frozen=True)
class RoleBounds:
    min_replicas: int = defaults.MIN_REPLICAS
    max_replicas: int = defaults.MAX_REPLICAS
    autoscale: bool = True  # False: the planner leaves this role's replicas alone (HPA/KEDA/manual)


@dataclass(frozen=True)
class Bounds:
    decode: RoleBounds = RoleBounds()
    prefill: RoleBounds = RoleBounds()
    gpu_budget: int | None = None  # total GPUs across roles (None: unlimited)


@dataclass(frozen=True)
class JudgeConfig:
    """How far a window's data is trusted, and when its latency is judged (``judge``)."""

    max_metrics_age_s: float = 120.0  # a window older than this is stale
    min_requests_for_slo: float = 10.0  # fewer finished requests: latency percentiles are not judged
    # a TTFT breach whose excess is decode's own first token (slot wait) counts as decode's breach too
    decode_owns_its_ttft: bool = True


@dataclass(frozen=True)
class LearnConfig:
    """What a trustworthy window teaches: latency corrections, the service time, the cache-hit level (``learn``)."""

    correction_min: float = 0.5  # bounds of the learned latency correction (observed / predicted)
    correction_max: float = 2.0
    correction_smoothing: float = 0.4  # EWMA weight of a new correction sample (log space)
    hit_smoothing: float = 0.2  # EWMA weight of a window's prefix-cache hit rate in the sizing level
    service_smoothing: float = 0.1  # the same for the measured prefill service-time ratio (a hardware property)
    min_requests_for_feedback: float = 20.0  # a window with fewer finished requests teaches nothing
    # prefill sizing never assumes a prefill cheaper than this × the profile's while its service time is
    # not measured (a low latency correction usually means the queueing tail is lighter than modelled,
    # not that prefill is faster); a measured vllm:request_prefill_time ratio replaces it
    min_throughput_correction: float = 1.0
    saturation_learning: bool = False  # learn a lower bound of the correction from a backlog (experimental)
    # prefill sizing never assumes prefill more than this × dearer than its measured service time (0: no cap)
    max_tail_over_service: float = 1.3
    # while the role that computes prompts is judged in breach, size prompts at this window's cache-hit level when it
    # is lower than the smoothed one: a wave of new sessions misses the cache for as long as it lasts, and the tail fit
    # was learned on this window's own work (docs/decisions/2026-12-01-autoscale-suite.md, thirteenth pass)
    breach_hit_level: bool = True
    # ... except within down_breach_window_s of the role's scale-down when the window's share of new sessions is
    # no wave (learn.sized_demand): the misses are the moved sessions' one-turn re-prefills. Off: in any breach
    breach_share_gate: bool = True


@dataclass(frozen=True)
class ForecastConfig:
    """The demand to size for over a cold start: trend, backlog and the learned headroom (``forecast``)."""

    trend_alpha: float = 0.5  # Holt level smoothing of the request rate
    trend_beta: float = 0.1  # Holt trend smoothing (low: one noisy window must not look like a trend)
    forecast_horizon_s: float | None = None  # None: the role's cold start (what a new replica misses)
    backlog_drain_s: float = 60.0  # waiting requests should be absorbed within this many seconds
    trend_damping: float = 0.8  # damped-trend factor per interval (caps extrapolation at ~4 intervals)
    max_forecast_growth: float = 1.5  # a forecast never exceeds this × the smoothed level
    arrivals_from_queue_growth: bool = False  # demand = completions + queue growth (experimental)
    # prompt demand ≥ the session proxy's arrival rate (a leading signal), when known; off: in the closed-loop
    # simulator arrivals track completions and it cost the shipped diurnal scenario a window (suite doc)
    use_arrivals: bool = False
    # Headroom from the deployment's own demand (planner/headroom.py): size for this quantile of the
    # demand rises seen over one cold start (+ one interval), times the current demand; 0 turns it off
    headroom_quantile: float = 0.9
    headroom_bucket_s: float = 60.0  # demand history resolution
    headroom_history_s: float = 4 * 3600.0  # how far back rises are learned from
    headroom_min_samples: int = 10  # fewer past moments than this: no learned headroom yet (one rise is no quantile)
    headroom_max: float = 2.0  # the learned rise is capped at this (a forecast, not a panic)


@dataclass(frozen=True)
class SizeConfig:
    """The queueing model's targets: replicas for a demand (``size``, and ``learn`` and ``predict`` with it)."""

    target_utilization: float = 0.9  # plan replicas so the model's capacity is used at most this much
    kv_cache_target: float = 0.85  # decode KV-cache usage above this asks for replicas (memory-bound)
    # P/D decode also keeps enough sequence slots that a request rarely waits for one (square-root staffing
    # at the TTFT percentile, capacity.decode_slots_needed): max-num-seqs caps a rank's batch (32 rendered)
    decode_slot_staffing: bool = True
    # squared coefficient of variation of prefill service times in the queueing tail: 1.2 measured in a
    # steady agent run; 2.0 also covers the re-prefill storms of moved sessions
    # (docs/decisions/2026-11-30-autoscale-bench.md)
    service_cv2: float = 2.0
    # no scale-down of a role that computes prompts when the sessions it moves (1/N) are more than the TTFT
    # percentile's tail and one full-context re-prefill exceeds the TTFT budget (size.moved_sessions_checks)
    guard_moved_sessions: bool = True


@dataclass(frozen=True)
class ActConfig:
    """When the need becomes a scale-up or a scale-down, and how far (``act``'s rules)."""

    # scale down to the max recommendation of this long
    scale_down_stabilization_s: float = float(defaults.SCALE_DOWN_STABILIZATION_SECONDS)
    scale_down_cooldown_s: float = 300.0  # no scale-down this soon after a scale-up of the role
    scale_down_interval_s: float = 120.0  # at least this long between two scale-downs (drain, and the moved sessions' re-prefill)
    max_scale_down_step: int = 1  # replicas removed per decision at most (or the fraction below)
    max_scale_down_fraction: float = 0.25  # ... or this share of the current replicas, if more (decode)
    prompt_scale_down_fraction: float = 0.0  # the same for replicas that hold prefix caches (prefill, aggregated)
    down_margin: float = 0.15  # scale down only if need × (1 + margin) fits in fewer replicas
    up_tolerance: float = 0.1  # while the SLO holds, a need within this share above the current count is not a scale-up
    rollout_override_ratio: float = 1.25  # need above this × current scales up even during a rollout
    # While a learned season forecasts the horizon, P/D prefill scales up from what Ready replicas do at the demand
    # observed now, not from the queueing model alone (which over-sizes 100k–450k-token contexts several times over):
    # - the SLO holds: at most Ready × (forecast ÷ observed demand) × (1 + foreseen_margin): the present window is the
    #   proof that Ready replicas hold the observed demand; the season says how much more comes;
    # - a modest breach (TTFT at most foreseen_breach_ttft_ratio × the target) at a demand the season foresaw
    #   (observed ≤ forecast): at most foreseen_breach_up_ratio × Ready until those are Ready (the model's error near
    #   the target, not a surprise in demand); a demand above the forecast, a TTFT further out (a queue that grows: a
    #   fleet short of capacity), or no season: sized by the model as before. 0 turns each off.
    foreseen_margin: float = 0.2
    foreseen_breach_up_ratio: float = 1.5
    foreseen_breach_ttft_ratio: float = 2.0
    # Proven capacity (caps.proven_cap): while the SLO holds, P/D prefill's scale-up goes no further than the
    # replicas per unit of prompt work (req/s × modelled seconds per request) that held the TTFT target with this
    # margin in at least ``proven_min_windows`` windows of the last ``proven_history_s`` — a need beyond what was seen
    # to suffice is the model's error; a breach at a proven ratio or above withdraws that proof. Off: 0 windows.
    proven_min_windows: int = 3
    proven_history_s: float = 3600.0
    proven_ttft_margin: float = 0.75
    # a proof holds only for windows whose share of new sessions (the session proxy's count ÷ arrivals) is at most
    # this much above its own (+ 0.01): a wave of new sessions prefills whole prompts, dearer work than the smoothed
    # cache-hit level says. 0: proofs hold at any share
    proven_share_slack: float = 0.25
    # the proven capacity also bounds the scale-down recommendation (still through every scale-down guard)
    proven_down: bool = True
    # a scale-down may first cancel replicas still starting or unschedulable (never a Ready one): they hold nothing
    cancel_starting: bool = True
    # a scale-down followed by a breach within this long teaches a larger scale-down margin: the ratio of the
    # replicas before it to the need the model saw (re-prefill storms the queueing model does not see)
    learn_down_margin: bool = True
    down_breach_window_s: float = 300.0
    scale_up_stabilization_s: float = 0.0  # scale up only to the lowest need of this long (HPA semantics)
    # the moved-sessions guard (SizeConfig.guard_moved_sessions) holds a scale-down no longer than this: once the
    # guard alone has held it this long, one replica goes (its sessions re-prefill elsewhere; the TTFT percentile may
    # breach for about one turn) and the hold starts again. Without it a fleet of fewer than 1 / (1 − percentile)
    # replicas never shrinks. 0: hold for ever
    moved_sessions_hold_s: float = float(defaults.MOVED_SESSIONS_HOLD_SECONDS)
    # A breach's scale-up is bounded by what one reading can justify (act.breach_step): at most this × the replicas
    # Ready or starting (at least +1), and, while a queue builds (waiting ≥ Ready), at most the demand ÷ what each Ready
    # replica completed in the window (its measured capacity) × (1 + breach_rate_margin): a backlog inflates latency
    # and the model's answer with it, not the work. 0: no bound
    breach_step_ratio: float = 2.0
    breach_rate_margin: float = 0.25
    # a breach the model calls fit still asks for Ready × (observed ÷ target)^this (act.breach_proportional; 0: off)
    breach_exponent: float = 0.5
    # replicas still starting are cancelled as soon as the SLO holds clearly again (TTFT at most this × its target) and
    # the scale-down recommendations fit in the Ready ones (act.cancel_on_clear): an order a breach made
    # that the breach no longer needs. 0: they wait for the stabilization window like any scale-down
    cancel_clear_ttft_ratio: float = 0.8
    cancel_clear_window_s: float = 120.0  # ... and the recommendations of this long fit in the Ready ones
    # Outage memory (act.outage_memory): when the demand collapses below outage_collapse_ratio × its highest of the
    # last outage_memory_s, no scale-down goes below the most replicas run at a demand above that, until
    # outage_memory_s after it: a returning crowd finds them (the HPA's scale-down stabilisation, longer for a model
    # that takes minutes to start). 0 s: off
    outage_memory_s: float = float(defaults.OUTAGE_MEMORY_SECONDS)
    outage_collapse_ratio: float = 0.15  # a diurnal trough (0.3 of its peak or more) is no outage
    # replicas that hold prefix caches, above overshoot_ratio × the stabilization window's highest recommendation,
    # shed this share of themselves per scale-down (act.overshoot_down), not one replica; the moved-sessions guard
    # still applies first. 0: off
    overshoot_ratio: float = 1.5
    overshoot_down_fraction: float = 0.25


@dataclass(frozen=True)
class ForesightConfig:
    """What the user says and the season learns the next cold start brings (``foresight``)."""

    # Foresight the user gives (planner/schedule.py): recurring windows with a floor per role or a request rate,
    # ordered one measured cold start (+ one interval) ahead; overlapping windows combine by maximum
    schedules: tuple[Window, ...] = ()
    epoch_s: float = 0.0  # the wall clock (Unix time) at the planner's time 0: 0 in the operator, a date in the simulator
    # Foresight it learns (planner/seasonal.py): size for the forecast at this quantile of a season found in the
    # demand history (the median of past days at this time of day × today's level × the learned headroom), a cold
    # start ahead; 0 turns it off (the history is still kept)
    forecast_quantile: float = defaults.FORECAST_QUANTILE
    season_bucket_s: float = 900.0  # history resolution
    season_periods_s: tuple[float, ...] = (86400.0, 7 * 86400.0)  # a day and a week
    season_keep: int = 3 * 672 + 96  # buckets kept: three weeks and a day (a weekly median of three)
    season_status_bytes: int = 16384  # the hard cap on the history's JSON in status
    # a recurring rise the season's quantile gate cannot see passes on its own buckets (seasonal.Settings; 0: off)
    season_rise_ratio: float = 1.5
    # Foresight from the slope (planner/trend.py): the demand one cold start ahead on the slope of the last
    # slope_window_s, × slope_damping (0 turns it off), at most slope_max_growth × the level, used only while its
    # backtest (forecasting slope_check_s ahead over the last slope_backtest_s) errs at most slope_skill × "demand stays"
    slope_damping: float = 0.5
    slope_window_s: float = 600.0
    slope_check_s: float = 300.0
    slope_backtest_s: float = 600.0
    slope_skill: float = 0.8
    slope_max_growth: float = 2.0

    @property
    def season(self) -> seasonal.Settings:
        return seasonal.Settings(periods_s=self.season_periods_s, quantile=self.forecast_quantile,
                                 rise_ratio=self.season_rise_ratio)

    @property
    def slope(self) -> trend.SlopeSettings:
        return trend.SlopeSettings(window_s=self.slope_window_s, check_s=self.slope_check_s,
                              backtest_s=self.slope_backtest_s, skill=self.slope_skill, damping=self.slope_damping,
                              max_growth=self.slope_max_growth)


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs with defaults, grouped by the step that reads them (``cfg.judge``, ``cfg.learn``, ...); the controller
    maps the CR's autoscaling fields onto these (``for_spec``). Knob names are unique across the groups:
    ``knobs``/``with_knobs`` address them by name alone (the benchmark's ``--planner-set FIELD=VALUE``)."""

    interval_s: float = float(defaults.PLANNER_INTERVAL_SECONDS)  # expected time between decisions
    judge: JudgeConfig = JudgeConfig()
    learn: LearnConfig = LearnConfig()
    forecast: ForecastConfig = ForecastConfig()
    size: SizeConfig = SizeConfig()
    act: ActConfig = ActConfig()
    foresight: ForesightConfig = ForesightConfig()

    @classmethod
    def knobs(cls) -> dict[str, tuple[str | None, Field]]:
        """Every knob by name: (its group, None for the top level; its dataclass field, with the default)."""
        out: dict[str, tuple[str | None, Field]] = {}
        for f in fields(cls):
            if is_dataclass(f.default):
                out.update({g.name: (f.name, g) for g in fields(f.default)})
            else:
                out[f.name] = (None, f)
        return out

    def with_knobs(self, **changes) -> PlannerConfig:
        """This config with knobs changed by name (each in its group); an unknown name is a TypeError."""
        knobs, top, groups = self.knobs(), {}, {}
        for name, value in changes.items():
            if name not in knobs:
                raise TypeError(f"PlannerConfig has no knob {name!r}")
            group = knobs[name][0]
            (top if group is None else groups.setdefault(group, {}))[name] = value
        return replace(self, **top, **{g: replace(getattr(self, g), **c) for g, c in groups.items()})

    @classmethod
    def for_spec(cls, interval_s: float, scale_down_stabilization_s: float,
                 scale_up_stabilization_s: float = 0.0,
                 moved_sessions_hold_s: float = defaults.MOVED_SESSIONS_HOLD_SECONDS,
                 schedules: tuple[Window, ...] = (),
                 forecast_quantile: float = defaults.FORECAST_QUANTILE,
                 outage_memory_s: float = defaults.OUTAGE_MEMORY_SECONDS) -> PlannerConfig:
        """The knobs a V41FlashDeployment's spec.autoscaling sets (the operator and the benchmark both use it)."""
        return cls(
            interval_s=float(interval_s),
            act=ActConfig(
                scale_up_stabilization_s=float(scale_up_stabilization_s),
                scale_down_stabilization_s=float(scale_down_stabilization_s),
                moved_sessions_hold_s=float(moved_sessions_hold_s),
                outage_memory_s=float(outage_memory_s),
                # a user's shorter scaleDownStabilizationSeconds also shortens the post-scale-up cooldown and
                # the spacing of scale-downs
                scale_down_cooldown_s=min(ActConfig.scale_down_cooldown_s, float(scale_down_stabilization_s)),
                scale_down_interval_s=min(ActConfig.scale_down_interval_s, float(scale_down_stabilization_s)),
            ),
            foresight=ForesightConfig(schedules=tuple(schedules), forecast_quantile=float(forecast_quantile)),
        )


# ---------------------------------------------------------------- state
@dataclass(frozen=True)
class RoleState:
    correction: float = 1.0  # learned multiplier on the profile's latency (observed / predicted)
    corrections_learned: int = 0  # windows that updated the correction
    service_correction: float | None = None  # measured / profile prefill service time (None: not measured)
    last_scale_time: float | None = None
    last_action: Action = "hold"
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas) within stabilization
    tracking_since: float | None = None  # recommendations cover [tracking_since, now] without a gap
    rate_level: float | None = None  # Holt level of request rate (req/s)
    rate_trend: float = 0.0  # Holt trend (req/s per second)
    rate_time: float | None = None  # time of the last rate update
    last_waiting: float | None = None  # queued requests at the last update (queue growth → arrivals)
    hit_level: float | None = None  # smoothed prefix-cache hit rate of the role that computes prompts
    share_level: float | None = None  # smoothed share of new sessions among arrivals (same role, same smoothing)
    demand_history: tuple[tuple[float, float, int], ...] = ()  # (bucket start, mean req/s, samples)
    up_recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas) within scale-up stabilization
    last_down_from: int | None = None  # replicas before the last scale-down
    last_down_need: float | None = None  # the need the model saw then (None: already judged)
    down_margin_learned: float = 0.0  # learned scale-down margin (replicas ÷ need), 0: none
    # the headroom the demand history last gave (rise, highest demand seen), coarse so that it rarely changes:
    # kept in status, it carries the learned headroom over a restart until the new history has enough samples
    headroom_rise: float | None = None
    headroom_peak: float | None = None
    # (time, ready replicas ÷ prompt work, new-session share or None) of windows that held the TTFT target
    proven: tuple[tuple[float, float, float | None], ...] = ()
    # since when the moved-sessions guard alone has held a scale-down (None: it is not holding one); memory only:
    # a restarted operator holds a full moved_sessions_hold_s again (the safe direction)
    guard_held_since: float | None = None
    # (time, replicas) run while the demand had not collapsed, within outage_memory_s, each above every later one
    # (the outage memory's floor is the first)
    recent_high: tuple[tuple[float, int], ...] = ()
    up_in_breach: bool = False  # the last scale-up was made in a breach (its orders go when the breach clears)


@dataclass(frozen=True)
class PlannerState:
    prefill: RoleState = RoleState()
    decode: RoleState = RoleState()
    last_decision_time: float | None = None
    # the deployment's demand (req/s of the role that computes prompts), one mean per bucket: the seasonal
    # forecaster's history; kept in status (seasonal.to_status, capped in bytes) so a restart keeps it
    season: seasonal.History = seasonal.History()

    def role(self, role: Role) -> RoleState:
        return self.prefill if role == "prefill" else self.decode

    def with_role(self, role: Role, rs: RoleState) -> PlannerState:
        return replace(self, **{role: rs})

    def to_dict(self) -> dict:
        """JSON-safe form for CR status (round-trips through from_dict)."""
        out = asdict(replace(self, season=seasonal.History()))
        out["season"] = seasonal.to_status(self.season, max_bytes=1 << 30, exact=True)
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> PlannerState:
        if not data:
            return cls()

        def role(d: dict | None) -> RoleState:
            d = dict(d or {})
            for key in ("recommendations", "demand_history", "up_recommendations", "proven", "recent_high"):
                d[key] = tuple(tuple(r) for r in d.get(key, ()))
            known = {f for f in RoleState.__dataclass_fields__}
            return RoleState(**{k: v for k, v in d.items() if k in known})

        season = data.get("season") or {}
        return cls(
            prefill=role(data.get("prefill")),
            decode=role(data.get("decode")),
            last_decision_time=data.get("last_decision_time"),
            season=seasonal.from_status(season, float(season.get("bucketSeconds") or seasonal.History.bucket_s)),
        )


# ---------------------------------------------------------------- outputs
@dataclass(frozen=True)
class RoleDecision:
    role: Role
    current: int  # replicas the workload had (RoleReplicas.desired)
    desired: int  # replicas to write
    action: Action
    reason: str  # one line for humans (status, Events)
    needed: float | None = None  # fractional replicas the model needs for the forecast demand
    demand_rate: float | None = None  # req/s the plan was sized for (forecast)
    observed_ttft_s: float | None = None
    observed_e2e_p95_s: float | None = None
    observed_itl_s: float | None = None
    predicted_ttft_s: float | None = None  # at desired replicas and forecast demand
    predicted_e2e_p95_s: float | None = None
    predicted_itl_s: float | None = None
    correction: float = 1.0
    clamped: str | None = None  # what bound/budget changed the model's answer, if any
    slo_breached: bool = False
    decided_by: str = ""  # the act rule that chose hold, scale-up or scale-down (act.RULES)
    forecast_by: str = ""  # what set the demand sized for (forecast.RoleForecast.source)


@dataclass(frozen=True)
class Decision:
    time: float
    decode: RoleDecision
    prefill: RoleDecision | None
    state: PlannerState  # persist and pass back next time
    notes: tuple[str, ...] = field(default=())

    def roles(self) -> tuple[RoleDecision, ...]:
        return tuple(d for d in (self.prefill, self.decode) if d is not None)

    @property
    def action(self) -> Action:
        """The overall action: any scale-up wins, then any scale-down, else hold."""
        acts = {d.action for d in self.roles()}
        return "scale_up" if "scale_up" in acts else "scale_down" if "scale_down" in acts else "hold"
