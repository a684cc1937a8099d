"""The SLO planner: observed window + capacity profile + SLO + bounds + state → desired replicas."""
from __future__ import annotations

from v41flash.planner.profile import CapacityProfile
from v41flash.planner.types import Bounds, Decision, Observation, PlannerConfig, PlannerState, Slo


def plan(
    observed: Observation,
    profile: CapacityProfile,
    slo: Slo,
    bounds: Bounds,
    state: PlannerState,
    now: float,
    config: PlannerConfig = PlannerConfig(),
) -> Decision:
    """Decide replicas per role. Pure: same inputs, same Decision (state comes back inside it)."""
    raise NotImplementedError("API committed first; implementation follows")
