"""Step 5, ``act``: one role's need becomes hold, scale-up or scale-down, by an ordered list of small named rules
(``RULES``, each ``(context, proposal) -> proposal``; ``act``'s docstring lists them), the reason built from the
words of the rules that fired. Then ``remember`` keeps what the next decisions need of the final verdict.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from v41flash.planner import capacity
from v41flash.planner.caps import foreseen_cap, proven_cap
from v41flash.planner.datatypes import Action, PlannerConfig, RoleBounds, RoleObservation, RoleState, Slo
from v41flash.planner.demand import Budgets, Demand
from v41flash.planner.judge import RoleJudgement
from v41flash.planner.learn import Learned
from v41flash.planner.profile import CapacityProfile
from v41flash.planner.size import Sizing
from v41flash.planner.wording import fmt_k, fmt_s, pct
from v41flash.roles import Role


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
    rules: tuple[str, ...] = ()  # the rules that fired, in order (act.RULES)
    decided_by: str = ""  # the rule that chose hold, scale-up or scale-down


def _observed_head(j: RoleJudgement, slo: Slo, itl_budget: float) -> str:
    p = pct(slo.ttft_percentile)
    parts = []
    if j.observed_ttft_s is not None:
        op = ">" if j.observed_ttft_s > slo.ttft_s else "≤"
        parts.append(f"TTFT {p} {fmt_s(j.observed_ttft_s)} {op} {fmt_s(slo.ttft_s)} target")
    if j.observed_e2e_p95_s is not None:
        op = ">" if j.observed_e2e_p95_s > slo.e2e_p95_s else "≤"
        parts.append(f"e2e p95 {fmt_s(j.observed_e2e_p95_s)} {op} {fmt_s(slo.e2e_p95_s)} target")
    if j.observed_itl_s is not None and j.observed_itl_s > itl_budget:
        parts.append(f"ITL {j.observed_itl_s * 1000:.1f}ms > {itl_budget * 1000:.1f}ms budget")
    return ", ".join(parts) if parts else "no latency samples in window"


def _need_text(role: Role, demand_rate: float, need: capacity.Need, d: Demand, k: float, k_prefill: float | None) -> str:
    lengths = f"{fmt_k(d.isl)} ISL"
    if d.hit_rate > 0:
        lengths += f" ({d.hit_rate:.0%} cached)"
    if role == "decode":
        lengths += f", {fmt_k(d.osl)} OSL"
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
    if covered < cfg.act.scale_down_stabilization_s:
        return f"stabilizing ({covered:.0f}/{cfg.act.scale_down_stabilization_s:.0f}s of lower need)"
    if rs.last_scale_time is not None:
        wait = cfg.act.scale_down_cooldown_s if rs.last_action == "scale_up" else cfg.act.scale_down_interval_s
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
        return cfg.act.prompt_scale_down_fraction
    return cfg.act.max_scale_down_fraction


def _stabilization_reset(rs: RoleState) -> RoleState:
    return replace(rs, recommendations=(), tracking_since=None, guard_held_since=None)


def _within(bounds: RoleBounds, replicas: int) -> int:
    return max(bounds.min_replicas, min(bounds.max_replicas, replicas))


def _cancels(c: ActContext) -> bool:
    """A scale-down may cancel replicas still starting or unschedulable (they hold nothing)."""
    return c.config.act.cancel_starting and c.starting + c.observed.replicas.unschedulable > 0


def _stabilized(p: Proposal) -> int:
    """The highest recommendation of the stabilization window (this window's when there is none)."""
    recs = p.state.recommendations
    return max(x[1] for x in recs) if recs else p.down_target


# ---------------------------------------------------------------- the context, the proposal, the rules
@dataclass(frozen=True)
class ActContext:
    """What ``act`` decides from, for one role: the judgement, the sizing and what plan learned and foresaw."""

    role: Role
    observed: RoleObservation
    bounds: RoleBounds
    judged: RoleJudgement
    demand_rate: float | None  # req/s sized for (None: the data cannot be used)
    sizing: Sizing
    learned: Learned
    disaggregated: bool
    slo: Slo
    budgets: Budgets
    state: RoleState  # the role's state before this decision (after forecast)
    now: float
    config: PlannerConfig
    headroom_note: str = ""  # set when the learned headroom raised the demand
    profile: CapacityProfile | None = None  # given: P/D prefill's scale-up stops at the proven capacity
    new_share: float | None = None  # the window's share of new sessions (the proven capacity's gate)
    foreseen: tuple[float, float] | None = None  # (demand observed now, the season's forecast) while one forecasts

    @property
    def current(self) -> int:
        return self.observed.replicas.desired

    @property
    def starting(self) -> int:
        return self.observed.replicas.starting

    @property
    def correction(self) -> float:
        """The latency correction sizing used for this role."""
        return self.learned.prefill_correction if self.role == "prefill" else self.learned.decode_correction

    @property
    def need(self) -> capacity.Need:
        need = self.sizing.need
        assert need is not None  # the rules after no_need
        return need


@dataclass(frozen=True)
class Proposal:
    """Where the rules have got to: the answer so far, the state they updated and the words of each that fired."""

    desired: int  # replicas
    state: RoleState  # stabilization windows, proofs, the learned margin
    action: Action = "hold"
    up_target: int = 0  # what a scale-up would ask for
    down_target: int = 0  # this window's scale-down recommendation (into the stabilization window)
    margin: float = 1.0  # the scale-down margin the recommendation was made with
    proof: float | None = None  # replicas proven to hold the demand (None: no proof)
    moves_sessions: bool = False  # a scale-down past the moved-sessions guard
    guard_held_since: float | None = None  # since when the moved-sessions guard alone holds a scale-down
    decided: bool = False  # a rule chose hold, scale-up or scale-down: the later deciding rules pass
    decided_by: str = ""  # ... which one
    final: bool = False  # the answer is complete: no later rule runs
    fired: tuple[tuple[str, str], ...] = ()  # (rule, its words in the reason), in order

    def said(self, rule: str, words: str = "", **changes) -> Proposal:
        return replace(self, fired=self.fired + ((rule, words),), **changes)

    def decide(self, rule: str, words: str, desired: int, action: Action, **changes) -> Proposal:
        return self.said(rule, words, desired=desired, action=action, decided=True, decided_by=rule, **changes)


Rule = Callable[[ActContext, Proposal], Proposal]


# ---------------------------------------------------------------- the rules, in order
def autoscaling_off(c: ActContext, p: Proposal) -> Proposal:
    """The role's replicas belong to another owner (HPA, KEDA, a human): hold, and forget the windows."""
    if c.bounds.autoscale:
        return p
    return p.decide("autoscaling_off", f"autoscaling is off for {c.role}: replicas are left to their owner",
                    c.current, "hold", state=_stabilization_reset(c.state), final=True)


def no_need(c: ActContext, p: Proposal) -> Proposal:
    """Missing or stale metrics size nothing: hold (bounds still apply in clamp), and forget the windows."""
    if c.sizing.need is not None:
        return p
    j = c.judged
    return p.decide("no_need", f"hold: {j.data_why}; no scaling on {j.data} metrics", c.current, "hold",
                    state=_stabilization_reset(c.state), final=True)


def need(c: ActContext, p: Proposal) -> Proposal:
    """What users saw and what the model needs, in words; a scale-up would ask for the need rounded up."""
    assert c.demand_rate is not None
    obs, need, learned = c.observed, c.need, c.learned
    kp = learned.prefill_correction
    words = _need_text(c.role, c.demand_rate, need, learned.sized, c.correction,
                       kp if not c.disaggregated else None)
    ks = learned.state.prefill.service_correction
    if c.role == "prefill" and ks is not None:
        words += f" (tail fit {learned.state.prefill.correction:.2f}, measured prefill time {ks:.2f})"
    if c.sizing.kv_note:
        words += f"; {c.sizing.kv_note} needs {need.replicas:.1f}"
    if c.headroom_note:
        words += f"; {c.headroom_note}"
    if obs.replicas.unschedulable:
        words += f"; {obs.replicas.unschedulable} replica(s) unschedulable (not counted as capacity on its way)"
    if obs.replicas.lost:
        words += f"; {obs.replicas.lost} replica(s) on NotReady nodes (not counted as capacity)"
    head = _observed_head(c.judged, c.slo, c.budgets.itl_s)
    return p.said("need", f"{head}; {words}", up_target=math.ceil(need.replicas - 1e-9))


def within_noise(c: ActContext, p: Proposal) -> Proposal:
    """While the SLO holds, a need within ``up_tolerance`` above what runs is noise, not a scale-up."""
    if c.judged.breached or c.need.replicas > c.current * (1 + c.config.act.up_tolerance):
        return p
    return p.said("within_noise", up_target=min(p.up_target, c.current))


def step_up_at_correction_limit(c: ActContext, p: Proposal) -> Proposal:
    """A breach the model cannot explain (its correction at the limit, or the target unattainable): +1."""
    j, cfg = c.judged, c.config
    stuck_correction = c.correction >= cfg.learn.correction_max * 0.99
    if not (j.breached and p.up_target <= c.current and c.starting == 0 and j.data == "ok"
            and (stuck_correction or not c.need.feasible)):
        return p
    return p.said("step_up_at_correction_limit", " (model at its correction limit; +1 on the observed breach)",
                  up_target=c.current + 1)


def proven_capacity(c: ActContext, p: Proposal) -> Proposal:
    """P/D prefill records this window's proof; while the SLO holds, its scale-up stops at the proven capacity."""
    if not (c.role == "prefill" and c.disaggregated and c.profile is not None):
        return p
    assert c.demand_rate is not None
    state, proof = proven_cap(c.observed, c.judged, c.demand_rate, c.learned, c.slo, p.state, c.now, c.config,
                              c.profile, c.new_share)
    p = replace(p, state=state, proof=proof)
    if proof is None:
        return p
    cap = math.ceil(proof - 1e-9)
    if p.up_target > max(c.current, cap) and not c.judged.breached:
        return p.said("proven_capacity", f" (proven capacity: {cap} held this work's TTFT before)",
                      up_target=max(c.current, cap))
    return p


def foreseen_capacity(c: ActContext, p: Proposal) -> Proposal:
    """While a learned season forecasts the horizon, P/D prefill scales up from what its Ready replicas do."""
    if not (c.role == "prefill" and c.disaggregated and c.foreseen is not None):
        return p
    over = None
    if c.judged.breached:  # how far out the TTFT is (inf: the breach is not the TTFT's, or unmeasured)
        t = c.judged.observed_ttft_s
        over = t / c.slo.ttft_s if t is not None else math.inf
    cap, why = foreseen_cap(c.observed.replicas.ready, over, c.foreseen, c.config)
    if cap is not None and p.up_target > max(c.current, cap):
        return p.said("foreseen_capacity", f" ({why})", up_target=max(c.current, cap))
    return p


def breach_proportional(c: ActContext, p: Proposal) -> Proposal:
    """A breach is never ignored because the model calls the fleet fit (a closed loop keeps the observed demand flat
    while users wait; cache-affine queues the pooled model does not see): at least the Ready replicas × (observed ÷
    target)^``breach_exponent`` (at most ``breach_step_ratio``×), counted on Ready replicas so that readings during a
    cold start ask for the same, not for more each time."""
    cfg, j = c.config.act, c.judged
    if cfg.breach_exponent <= 0 or not (j.breached and j.own_breach) or j.data == "stale":
        return p
    ratios = [o / t for o, t in ((j.observed_ttft_s, c.slo.ttft_s), (j.observed_e2e_p95_s, c.slo.e2e_p95_s))
              if o is not None and t > 0]
    ready = c.observed.replicas.ready
    if not ratios or max(ratios) <= 1 or ready <= 0:
        return p
    r = max(ratios)
    factor = min(max(1.0, cfg.breach_step_ratio), r ** cfg.breach_exponent)
    up = math.ceil(ready * factor - 1e-9)
    if up <= max(p.up_target, c.current):
        return p
    return p.said("breach_proportional", f" (a breach ×{r:.2f} its target the model calls fit: {ready} Ready × "
                                         f"{factor:.2f} = {up})", up_target=up)


def breach_step(c: ActContext, p: Proposal) -> Proposal:
    """A breach's scale-up, sized from the work and no larger than one reading can justify. While a queue builds
    (waiting ≥ Ready: the Ready replicas are saturated, so what each completed in the window is its capacity), the
    demand (with the backlog to drain) ÷ that capacity × (1 + margin), whatever the model says — a backlog inflates
    the latency the model sizes from, not the work, and a model that calls a saturated fleet fit is wrong (one reading
    of a cache-hit dip once asked for 160 replicas where 30 held; an 8× surge met +1 at a time; issue 40). Either way
    at most ``breach_step_ratio`` × the replicas Ready or starting (at least +1): the next reading, which counts what
    is starting, may double again."""
    cfg = c.config.act
    if cfg.breach_step_ratio <= 0 or not c.judged.breached:
        return p
    if not c.judged.own_breach:  # another role's breach: this one does not grow for it
        return p.said("breach_step", " (the breach is another role's)", up_target=min(p.up_target, c.current)) \
            if p.up_target > c.current and c.config.act.breach_exponent > 0 else p
    ready, w = c.observed.replicas.ready, c.observed.window
    up, why = p.up_target, ""
    if w is not None and ready > 0 and w.request_rate > 0 and w.waiting >= ready and c.demand_rate:
        per_replica = w.request_rate / ready
        up = math.ceil(c.demand_rate / per_replica * (1 + cfg.breach_rate_margin) - 1e-9)
        why = (f"{c.demand_rate:.2f} req/s at the {per_replica:.2f} req/s each of {ready} saturated Ready replicas "
               f"completed, ×{1 + cfg.breach_rate_margin:g}: {up}")
    cap = max(c.current + 1, math.ceil(max(1, ready + c.starting) * cfg.breach_step_ratio - 1e-9))
    if up > cap:
        up, why = cap, (f"{why}; " if why else "") + \
            f"at most {cap}, ×{cfg.breach_step_ratio:g} the {ready + c.starting} Ready or starting"
    if up == p.up_target or (up <= c.current and p.up_target <= c.current):
        return p
    return p.said("breach_step", f" (a breach's step: {why})", up_target=max(up, c.current))


def scale_up_stabilization(c: ActContext, p: Proposal) -> Proposal:
    """HPA semantics: scale up only to the lowest recommendation of ``scale_up_stabilization_s``."""
    window = c.config.act.scale_up_stabilization_s
    if not (window > 0 and c.judged.data == "ok"):
        return p
    rs, now = p.state, c.now
    ups = tuple(x for x in rs.up_recommendations if x[0] > now - window) + ((now, p.up_target),)
    lowest = min(x[1] for x in ups)
    words = f" (scale-up stabilization {window:.0f}s: {lowest})" if lowest < p.up_target else ""
    return p.said("scale_up_stabilization", words, state=replace(rs, up_recommendations=ups), up_target=lowest)


def learn_down_margin(c: ActContext, p: Proposal) -> Proposal:
    """A breach soon after a scale-down: the replicas it left were too few for what the model called the need
    (re-prefill storms of moved sessions, a need the model misses): keep that ratio as the scale-down margin."""
    cfg, rs = c.config, p.state
    if not (cfg.act.learn_down_margin and c.judged.breached and rs.last_action == "scale_down"
            and rs.last_scale_time is not None and c.now - rs.last_scale_time <= cfg.act.down_breach_window_s
            and rs.last_down_need):
        return p
    ratio = min(cfg.forecast.headroom_max, rs.last_down_from / rs.last_down_need)
    return p.said("learn_down_margin",
                  state=replace(rs, down_margin_learned=max(rs.down_margin_learned, ratio), last_down_need=None))


def down_recommendation(c: ActContext, p: Proposal) -> Proposal:
    """This window's scale-down recommendation: the need × the scale-down margin (the learned one when larger),
    within bounds."""
    base = 1 + c.config.act.down_margin
    margin = max(base, p.state.down_margin_learned)
    words = f"; scale-down margin ×{margin:.2f} (learned: a scale-down to that ratio breached)" if margin > base else ""
    rec = _within(c.bounds, math.ceil(c.need.replicas * margin - 1e-9))
    return p.said("down_recommendation", words, down_target=rec, margin=margin)


def proven_down(c: ActContext, p: Proposal) -> Proposal:
    """While the SLO holds, a model that asks for more than has held this work comes down to what did."""
    if p.proof is None or not c.config.act.proven_down or c.judged.breached:
        return p
    proven_rec = _within(c.bounds, math.ceil(p.proof * p.margin - 1e-9))
    if proven_rec >= min(p.down_target, c.current):
        return p
    return p.said("proven_down", f"; scale-down to the proven capacity ({p.proof:.1f} × margin)",
                  down_target=proven_rec)


def outage_memory(c: ActContext, p: Proposal) -> Proposal:
    """After the demand collapses (below ``outage_collapse_ratio`` × its highest of the last ``outage_memory_s``), no
    scale-down below the most replicas the demand asked for before the collapse (need × margin), until ``outage_memory_s`` after it: the HPA's
    scale-down stabilisation, long enough that a crowd returning after an outage finds capacity that takes minutes
    to start. Those recommendations are remembered while the demand stands (``RoleState.recent_high``)."""
    cfg = c.config.act
    if cfg.outage_memory_s <= 0 or c.demand_rate is None:
        return p
    since = c.now - cfg.outage_memory_s
    peak = max((h[1] for h in c.state.demand_history if h[0] >= since), default=0.0)
    collapsed = peak > 0 and c.demand_rate < cfg.outage_collapse_ratio * peak
    highs = tuple(x for x in p.state.recent_high if x[0] > since)
    if not collapsed:  # what the standing demand asked for (not what ran: an overshoot is no peak to keep)
        highs = tuple(x for x in highs if x[1] > p.down_target) + ((c.now, p.down_target),)
    p = replace(p, state=replace(p.state, recent_high=highs))
    if not collapsed or not highs or highs[0][1] <= p.down_target:
        return p
    floor = _within(c.bounds, highs[0][1])
    return p.said("outage_memory", f"; outage memory: demand {c.demand_rate:.2f} req/s < "
                                   f"{cfg.outage_collapse_ratio:g} × its {peak:.2f} of the last "
                                   f"{cfg.outage_memory_s:.0f}s, keeping {floor} until "
                                   f"{highs[0][0] + cfg.outage_memory_s - c.now:.0f}s from now",
                  down_target=max(p.down_target, floor))


def stabilization_window(c: ActContext, p: Proposal) -> Proposal:
    """Only complete windows count as evidence for a scale-down: record this one's recommendation, or start
    the window again."""
    rs, now = p.state, c.now
    if c.judged.data != "ok":
        return p.said("stabilization_window", state=_stabilization_reset(rs))
    recs = tuple(x for x in rs.recommendations if x[0] > now - c.config.act.scale_down_stabilization_s) + \
        ((now, p.down_target),)
    since = rs.tracking_since if rs.tracking_since is not None else now
    return p.said("stabilization_window", state=replace(rs, recommendations=recs, tracking_since=since))


def unattainable(c: ActContext, p: Proposal) -> Proposal:
    """Say so when no replica count meets the target, even unloaded."""
    if c.need.feasible:
        return p
    return p.said("unattainable", " — target unattainable with this profile even unloaded")


def cancel_on_clear(c: ActContext, p: Proposal) -> Proposal:
    """Replicas still starting when the breach that ordered them has cleared (TTFT at most
    ``cancel_clear_ttft_ratio`` × its target, and every scale-down recommendation of the last
    ``cancel_clear_window_s`` fits in the Ready replicas) are cancelled at once: they hold nothing, and every second
    they start costs GPUs (the stabilization window waits for evidence about Ready replicas, not about orders).
    Foresight and headroom are in the recommendations, so an order a forecast wants stays."""
    cfg, j = c.config.act, c.judged
    if p.decided or cfg.cancel_clear_ttft_ratio <= 0 or not cfg.cancel_starting or c.starting <= 0 \
            or j.breached or j.data != "ok" or c.state.last_action != "scale_up" or not c.state.up_in_breach \
            or j.observed_ttft_s is None \
            or j.observed_ttft_s > cfg.cancel_clear_ttft_ratio * c.slo.ttft_s:
        return p
    ready = c.current - c.starting - c.observed.replicas.unschedulable - c.observed.replicas.lost
    recent = [x[1] for x in p.state.recommendations if x[0] > c.now - cfg.cancel_clear_window_s]
    target = max([p.down_target, ready, *recent])
    if target >= c.current:
        return p
    return p.decide("cancel_on_clear", f"; {c.current} → {target}: the breach cleared (TTFT "
                                       f"{fmt_s(j.observed_ttft_s)}), cancelling {c.current - target} replica(s) "
                                       f"still starting", target, "scale_down")


def wait_for_capacity_in_flight(c: ActContext, p: Proposal) -> Proposal:
    """A scale-up waits for replicas starting or a rollout, unless users suffer or demand clearly outgrew it."""
    jump = c.need.replicas > c.current * c.config.act.rollout_override_ratio
    if p.decided or p.up_target <= c.current or not (c.starting > 0 or c.observed.rolling_out) \
            or c.judged.breached or jump:
        return p
    return p.decide("wait_for_capacity_in_flight",
                    f"; waiting for {_progress(c.observed)} before adding more (SLO holds)", c.current, "hold")


def scale_up(c: ActContext, p: Proposal) -> Proposal:
    """At once to the need (remembering whether users suffered: only a breach's orders are cancelled when it clears)."""
    if p.decided or p.up_target <= c.current:
        return p
    return p.decide("scale_up", f"; {c.current} → {p.up_target}", p.up_target, "scale_up",
                    state=replace(p.state, up_in_breach=c.judged.breached))


def no_scale_down_on_incomplete_data(c: ActContext, p: Proposal) -> Proposal:
    if p.decided or c.judged.data == "ok" or p.down_target >= c.current:
        return p
    return p.decide("no_scale_down_on_incomplete_data",
                    f"; holding {c.current}: no scale-down on {c.judged.data} metrics", c.current, "hold")


def current_fits(c: ActContext, p: Proposal) -> Proposal:
    """The highest recommendation of the stabilization window is what runs, or more: hold."""
    cur = c.current
    if p.decided or _stabilized(p) < cur:
        return p
    return p.decide("current_fits", f"; {cur} fit{'s' if cur == 1 else ''}", cur, "hold")


def down_blocked(c: ActContext, p: Proposal) -> Proposal:
    """A scale-down the model wants waits for complete data, the SLO, changes in flight, the stabilization window
    and the cooldowns (``_down_blocker``)."""
    if p.decided:
        return p
    blocker = _down_blocker(c.observed, c.judged, p.state, c.now, c.config, _cancels(c))
    if not blocker:
        return p
    return p.decide("down_blocked", f"; holding {c.current}: {blocker}", c.current, "hold")


def cancel_not_serving(c: ActContext, p: Proposal) -> Proposal:
    """Replicas still starting or unschedulable hold no sessions, no cache and no requests: cancelling them moves
    nothing, so neither the step limit nor the moved-sessions guard applies, and only they are removed (a ReplicaSet
    deletes unscheduled, then not-ready pods first, and pods_to_remove picks them for the deletion cost; the
    simulator cancels starting replicas first)."""
    if p.decided or not _cancels(c):
        return p
    cur, starting, unsched = c.current, c.starting, c.observed.replicas.unschedulable
    target = max(_stabilized(p), cur - starting - unsched)
    return p.decide("cancel_not_serving",
                    f"; {cur} → {target} after {c.config.act.scale_down_stabilization_s:.0f}s below: "
                    f"cancelling {cur - target} replica(s) not serving yet ({starting} starting, "
                    f"{unsched} unschedulable)", target, "scale_down")


def moved_sessions_guard(c: ActContext, p: Proposal) -> Proposal:
    """Hold a scale-down that would itself break the TTFT percentile (``size.moved_sessions_checks``) — but the guard
    is right about this scale-down's next turns, and holding for ever keeps a fleet sized for a peak through every
    trough: after ``moved_sessions_hold_s``, one replica goes (its sessions re-prefill), unless the replicas left
    could not do the moved turns' work."""
    guard = c.sizing.down_guard
    if p.decided or not guard:
        return p
    cfg, cur, now = c.config.act, c.current, c.now
    held_since = p.state.guard_held_since if p.state.guard_held_since is not None else now
    hold = cfg.moved_sessions_hold_s
    if hold > 0 and now - held_since >= hold and not c.sizing.down_guard_overload:
        target = max(_stabilized(p), cur - cfg.max_scale_down_step)
        return p.decide("moved_sessions_guard",
                        f"; {cur} → {target} after the moved-sessions guard held it {now - held_since:.0f}s ({guard}; "
                        f"the TTFT percentile may breach for about one turn)", target, "scale_down", moves_sessions=True)
    words = f"; holding {cur}: {guard}"
    if hold > 0 and not c.sizing.down_guard_overload:
        words += f" (held {now - held_since:.0f}/{hold:.0f}s)"
    return p.decide("moved_sessions_guard", words, cur, "hold", guard_held_since=held_since)


def overshoot_down(c: ActContext, p: Proposal) -> Proposal:
    """A fleet more than ``overshoot_ratio`` × the window's highest recommendation (an overshoot, or a peak that has
    gone) sheds ``overshoot_down_fraction`` of its replicas per step, not one: the descent is the cost of every
    overshoot. It runs after the moved-sessions guard, which still holds what would re-prefill more than the
    replicas left can take."""
    cfg, cur, rec = c.config.act, c.current, _stabilized(p)
    if p.decided or cfg.overshoot_ratio <= 0 or cur <= cfg.overshoot_ratio * max(rec, 1):
        return p
    step = math.floor(cur * cfg.overshoot_down_fraction + 1e-9)
    if step <= cfg.max_scale_down_step or (c.role != "prefill" and c.disaggregated):
        return p  # no quicker than step_down (decode already sheds max_scale_down_fraction)
    target = max(rec, cur - step)
    return p.decide("overshoot_down", f"; {cur} → {target}: {cur} is over ×{cfg.overshoot_ratio:g} the {rec} the "
                                      f"last {cfg.scale_down_stabilization_s:.0f}s asked for", target, "scale_down")


def step_down(c: ActContext, p: Proposal) -> Proposal:
    """One step (``max_scale_down_step``, or the role's share of its replicas), never below the window's highest
    recommendation."""
    if p.decided:
        return p
    cfg, cur = c.config.act, c.current
    step = max(cfg.max_scale_down_step, math.floor(cur * down_fraction(c.role, c.disaggregated, c.config) + 1e-9))
    target = max(_stabilized(p), cur - step)
    return p.decide("step_down", f"; {cur} → {target} after {cfg.scale_down_stabilization_s:.0f}s below", target,
                    "scale_down")


def partial_metrics(c: ActContext, p: Proposal) -> Proposal:
    """Say which data was missing when the decision stood on part of it."""
    if c.judged.data != "partial":
        return p
    return p.said("partial_metrics", f" [partial metrics: {c.judged.data_why}]")


RULES: tuple[Rule, ...] = (
    autoscaling_off, no_need,
    # what a scale-up would ask for
    need, within_noise, step_up_at_correction_limit, proven_capacity, foreseen_capacity, breach_proportional,
    breach_step, scale_up_stabilization,
    # what a scale-down would come down to
    learn_down_margin, down_recommendation, proven_down, outage_memory, stabilization_window, unattainable,
    # the answer: the first of these that applies
    cancel_on_clear, wait_for_capacity_in_flight, scale_up, no_scale_down_on_incomplete_data, current_fits, down_blocked,
    cancel_not_serving, moved_sessions_guard, overshoot_down, step_down,
    partial_metrics,
)


def act(c: ActContext) -> Acted:
    """Asymmetric: scale up at once to the need (counting replicas still starting), scale down one step at a
    time, only to the highest recommendation of the stabilization window, never while metrics are incomplete,
    a change is rolling out, or the SLO is breached. Bounds and the GPU budget come after (``clamp``).

    The rules in ``RULES`` run in order, each ``(context, proposal) -> proposal``; the reason is the words of
    those that fired, in order:

    1. ``autoscaling_off``, ``no_need``: hold, and nothing else runs;
    2. ``need`` states what users saw and the model needs; a scale-up would ask for the need, but
       ``within_noise`` (SLO holds, need within ``up_tolerance``), ``step_up_at_correction_limit`` (+1 on a
       breach the model cannot explain), ``proven_capacity`` and ``foreseen_capacity`` (P/D prefill: what held
       this work before, what Ready replicas do at the season's rise), ``breach_proportional`` (a breach the model
       calls fit still scales the Ready replicas), ``breach_step`` (a breach's step no larger than one reading
       justifies) and ``scale_up_stabilization`` change it;
    3. a scale-down would come down to the need × the margin (``learn_down_margin``, ``down_recommendation``),
       or the proven capacity (``proven_down``), never below the peak before a collapse of the demand
       (``outage_memory``); ``stabilization_window`` records it; ``unattainable`` says when no replica count meets
       the target;
    4. the first deciding rule that applies answers: ``cancel_on_clear`` (orders a cleared breach no longer needs),
       ``wait_for_capacity_in_flight`` or ``scale_up``; ``no_scale_down_on_incomplete_data``, ``current_fits`` or
       ``down_blocked`` hold; ``cancel_not_serving``, ``moved_sessions_guard`` (hold, or one replica after its hold),
       ``overshoot_down`` (a quarter of a fleet far above its need) or ``step_down`` scale down;
    5. ``partial_metrics`` names the data that was missing.
    """
    p = Proposal(desired=c.current, state=c.state)
    for rule in RULES:
        p = rule(c, p)
        if p.final:
            break
    why = "".join(words for _, words in p.fired)
    verdict = Verdict(p.desired, p.action, why, moves_sessions=p.moves_sessions)
    return Acted(verdict, replace(p.state, guard_held_since=p.guard_held_since), tuple(r for r, _ in p.fired),
                 p.decided_by)


def remember(rs: RoleState, v: Verdict, current: int, need: float | None, now: float) -> RoleState:
    """What the role's state keeps of its final (clamped) verdict: the last scale action gates the next
    scale-down (cooldown, spacing), and a scale-down is judged if a breach follows (a learned scale-down margin)
    — unless it passed the moved-sessions guard: that breach was expected, not the model's error."""
    if v.action != "hold":
        rs = replace(rs, last_scale_time=now, last_action=v.action)
    if v.action == "scale_down" and need:
        rs = replace(rs, last_down_from=current, last_down_need=None if v.moves_sessions else need)
    return rs
