"""The SLO planner: observed window + capacity profile + SLO + bounds + state → desired replicas.

One pure function, ``plan``, composed of the steps, each a pure function with frozen data in and out in a
module of its own (``demand``, ``judge``, ``learn``, ``forecast``, ``size``, ``act``, ``clamp``, ``predict``),
tested on its own. After measuring the demand and splitting the SLO between the phases
(``workload_demand``, ``split_slo``), per decision and per role:

1. ``judge``: judges the data (missing / stale / partial → no scale-down, no learning, say why);
2. ``learn``: compares observed latency with what the profile predicts at the observed load and moves a
   per-role correction factor towards the ratio (bounded, smoothed in log space);
3. ``forecast``: demand, damped Holt trend on the request rate over the role's cold-start horizon, plus
   the queue backlog, never below what is observed now while the SLO is breached;
4. ``size``: fractional replicas that keep TTFT (prefill) and ITL within the e2e budget (decode) at the
   forecast demand, with the corrected profile;
5. ``act``, asymmetrically: scale up at once to the need (counting replicas still starting), scale down
   one step at a time, only to the highest recommendation of the stabilization window, never while
   metrics are incomplete, a change is rolling out, or the SLO is breached;
6. ``clamp``: to bounds and the GPU budget, saying what was clamped;

then ``predict`` says what users should see at the decided replicas.
"""
from __future__ import annotations

from dataclasses import replace

from v41flash.planner.datatypes import (
    Bounds, Decision, Observation, PlannerConfig, PlannerState, RoleBounds, RoleDecision, Slo,
)
from v41flash.planner.foresight import foresee, remember_demand
from v41flash.planner.profile import CapacityProfile
from v41flash.planner.act import ActContext, act, remember
from v41flash.planner.clamp import Claim, clamp
from v41flash.planner.demand import new_session_share, split_slo, workload_demand
from v41flash.planner.forecast import forecast
from v41flash.planner.judge import cold_start_of, judge
from v41flash.planner.learn import learn
from v41flash.planner.predict import predict
from v41flash.planner.size import size
from v41flash.roles import ROLES, Role


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
    disagg = observed.prefill is not None
    roles: tuple[Role, ...] = ROLES if disagg else ("decode",)
    demand = workload_demand(observed)
    budgets = split_slo(demand, slo, profile, disagg)
    judged = judge(observed, profile, slo, budgets, now, config)
    learned = learn(observed, judged, demand, budgets, profile, state, config, now)
    front: Role = "prefill" if disagg else "decode"

    arrivals = observed.router.arrival_rate if observed.router is not None else None
    new_share = new_session_share(observed)
    new_state = remember_demand(learned.state, demand.prefill_rate if judged.role(front).usable else None, now,
                                config)
    claims, rates, deciders = [], {}, {}
    for role in roles:
        obs, role_bounds, role_profile = getattr(observed, role), getattr(bounds, role), getattr(profile, role)
        cold = cold_start_of(obs, role_profile)
        seen = foresee(new_state, role, now, cold, obs.replicas.desired, config)
        fc = forecast(judged.role(role), demand, role == "prefill" or not disagg, cold, new_state.role(role), now,
                      config, arrivals, (seen.rate, seen.note), seen.seasonal)
        sizing = size(role, fc.demand_rate, obs, disagg, learned, budgets, profile, slo, config)
        observed_rate = demand.prefill_rate if role == "prefill" or not disagg else demand.decode_rate
        foreseen = (observed_rate, seen.rate) if seen.seasonal and seen.rate is not None else None
        acted = act(ActContext(role, obs, role_bounds, judged.role(role), fc.demand_rate, sizing, learned, disagg, slo,
                               budgets, fc.state, now, config, fc.headroom_note, profile, new_share, foreseen))
        new_state = new_state.with_role(role, acted.state)
        rates[role] = fc.demand_rate
        # which foresight (a schedule, the season or the trend), else the forecast's own term
        source = fc.source.replace("foresight", seen.source or "foresight")
        deciders[role] = (acted.decided_by, source)
        # a schedule's floor bounds the answer (clamp), never the stabilization's recommendations: gone at its end
        floored = role_bounds if seen.replicas <= role_bounds.min_replicas else RoleBounds(
            min(seen.replicas, role_bounds.max_replicas), role_bounds.max_replicas, role_bounds.autoscale)
        claims.append(Claim(role, acted.verdict, obs.replicas.desired, floored, role_profile.gpus_per_replica,
                            None if sizing.need is None else sizing.need.replicas))
    clamped = clamp(tuple(claims), bounds.gpu_budget)
    verdicts = dict(zip(roles, clamped.verdicts))

    predicted = predict(
        (rates["prefill"] or demand.prefill_rate, verdicts["prefill"].desired) if disagg else None,
        rates["decode"] if rates["decode"] is not None else demand.decode_rate, verdicts["decode"].desired,
        learned, budgets, profile, slo, config)
    decisions: dict[str, RoleDecision] = {}
    for role, claim in zip(roles, claims):
        pred = predicted.prefill if role == "prefill" else predicted.decode
        v, j = verdicts[role], judged.role(role)
        new_state = new_state.with_role(role, remember(new_state.role(role), v, claim.current, claim.need, now))
        decisions[role] = RoleDecision(
            role=role, current=claim.current, desired=v.desired, action=v.action, reason=v.why,
            needed=None if claim.need is None else round(claim.need, 3),
            demand_rate=None if rates[role] is None else round(rates[role], 4),
            observed_ttft_s=j.observed_ttft_s, observed_e2e_p95_s=j.observed_e2e_p95_s, observed_itl_s=j.observed_itl_s,
            predicted_ttft_s=pred.ttft_s, predicted_e2e_p95_s=pred.e2e_p95_s, predicted_itl_s=pred.itl_s,
            correction=round(learned.prefill_correction if role == "prefill" else learned.decode_correction, 4),
            clamped=v.clamped, slo_breached=j.breached,
            decided_by=deciders[role][0], forecast_by=deciders[role][1],
        )
    return Decision(time=now, decode=decisions["decode"], prefill=decisions.get("prefill"),
                    state=replace(new_state, last_decision_time=now), notes=judged.notes + clamped.notes)
