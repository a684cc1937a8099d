"""Home of the defaults the CR and the planner share.

The V41FlashDeployment's spec.slo, spec.autoscaling and per-role replica bounds default to these
(api/v1alpha1.py), and the planner's own dataclasses (Slo, RoleBounds, PlannerConfig) take the same
values when a caller leaves them out; the engines' startup figures are shared by the renderer and the rollout
machine. Plain numbers: the planner imports this without the API.
"""
from __future__ import annotations

PLANNER_INTERVAL_SECONDS = 30  # spec.autoscaling.intervalSeconds; PlannerConfig.interval_s
# spec.autoscaling.scaleDownStabilizationSeconds; PlannerConfig.act.scale_down_stabilization_s
SCALE_DOWN_STABILIZATION_SECONDS = 600
# spec.autoscaling.movedSessionsHoldSeconds; PlannerConfig.act.moved_sessions_hold_s: how long the moved-sessions guard
# may hold a prefill scale-down the demand allows (an hour: at most one re-prefill breach an hour from it)
MOVED_SESSIONS_HOLD_SECONDS = 3600
# spec.autoscaling.forecast.quantile; PlannerConfig.foresight.forecast_quantile: the learned seasonal forecast sizes for this
# quantile of how far days exceed what their past said (0: off)
FORECAST_QUANTILE = 0.9
# spec.autoscaling.outageMemorySeconds; PlannerConfig.outage_memory_s: after the demand collapses, how long no
# scale-down goes below what the demand asked for before it (40 min: two of the longest cold starts, 20 min)
OUTAGE_MEMORY_SECONDS = 2400
SLO_WINDOW_SECONDS = 60  # spec.slo.windowSeconds; Slo.window_s
TTFT_PERCENTILE = 90  # spec.slo.ttft.percentile; Slo.ttft_percentile (as a fraction)
MIN_REPLICAS = 1  # spec.<role>.minReplicas; RoleBounds.min_replicas
MAX_REPLICAS = 4  # spec.<role>.maxReplicas; RoleBounds.max_replicas
# The engines' startup budget is never shorter than this (render.timing.PodTiming.startup_min_seconds): weight
# load (~511 GB) + FlashInfer autotune
ENGINE_STARTUP_MIN_SECONDS = 7200
# past the startup budget: an engine Deployment's progressDeadlineSeconds, and a rollout's default progress
# deadline (spec.rollout.progressDeadlineSeconds 0; rollout.machine.policy_from_spec)
PROGRESS_MARGIN_SECONDS = 600
