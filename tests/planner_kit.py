"""What the planner's step tests share (tests/test_planner_<step>.py): a window at a rate, the steps up to
``learn``, a judgement, budgets and a demand, and ``act`` on a need."""
from __future__ import annotations

from dataclasses import replace

from planner_sim import ISL, OSL, OSL95, PROFILE, SLO, windows
from v41flash.planner import capacity
from v41flash.planner.act import ActContext, Acted, act
from v41flash.planner.datatypes import (Observation, PlannerConfig, PlannerState, RoleBounds, RoleObservation,
                                        RoleReplicas, RoleState)
from v41flash.planner.demand import Budgets, Demand, split_slo, workload_demand
from v41flash.planner.judge import RoleJudgement, judge
from v41flash.planner.learn import Learned, learn
from v41flash.planner.size import Sizing

T = 1_000_000.0
CFG = PlannerConfig()
STABLE = CFG.act.scale_down_stabilization_s


def observe(rate, prefill=2, decode=1, t=T, kp=1.0, kd=1.0, pw=None, dw=None, rolling=False, prefill_starting=0,
            starting_for_s=()):
    p, d = windows(rate, prefill, decode, t, kp, kd)
    return Observation(
        prefill=RoleObservation(RoleReplicas(prefill + prefill_starting, prefill, prefill_starting, starting_for_s),
                                replace(p, **(pw or {})), rolling),
        decode=RoleObservation(RoleReplicas(decode, decode), replace(d, **(dw or {}))),
    )


def aggregated(rate, replicas=2, t=T, **dw):
    p, d = windows(rate, replicas, replicas, t)
    d = replace(d, ttft_s=p.ttft_s, prefix_cache_hit_rate=0.5, **dw)
    return Observation(decode=RoleObservation(RoleReplicas(replicas, replicas), d))


def steps_to_learned(obs, state=PlannerState(), cfg=CFG):
    demand = workload_demand(obs)
    budgets = split_slo(demand, SLO, PROFILE, obs.prefill is not None)
    judged = judge(obs, PROFILE, SLO, budgets, T, cfg)
    return demand, budgets, judged, learn(obs, judged, demand, budgets, PROFILE, state, cfg, T)


def learned_for(obs):
    return steps_to_learned(obs)[3]


OK = RoleJudgement("prefill", "ok", "", breached=False)
BUDGETS = Budgets(itl_s=(SLO.e2e_p95_s - SLO.ttft_s) / OSL95, handover_s=0.02, prefill_ttft_s=1.48)


def demand(rate=10.0, backlog=0.0):
    return Demand(rate, rate, ISL, 0.5, OSL, OSL95, backlog, backlog)


def act_on(need, cur=3, judged=OK, bounds=RoleBounds(1, 10), state=RoleState(), now=T, starting=0, rolling=False,
           cfg=CFG, role="prefill") -> Acted:
    obs = RoleObservation(RoleReplicas(cur, cur - starting, starting), observe(10, prefill=cur).prefill.window, rolling)
    lrn = Learned(PlannerState(), 1.0, 1.0, demand())
    sizing = Sizing(None if need is None else capacity.Need(need, True))
    return act(ActContext(role, obs, bounds, replace(judged, role=role), 10.0, sizing, lrn, True, SLO, BUDGETS, state,
                          now, cfg))
