"""SLO planner: capacity profiles + observed windows → desired prefill/decode replicas (pure)."""
from v41flash.planner.datatypes import (
    Bounds,
    Decision,
    Observation,
    PlannerConfig,
    PlannerState,
    RoleBounds,
    RoleDecision,
    RoleObservation,
    RoleReplicas,
    RoleState,
    Slo,
)
from v41flash.planner.drain import PodLoad, deletion_cost_annotations, pods_to_remove
from v41flash.planner.plan import plan
from v41flash.planner.profile import CapacityProfile, find_profile, load_profile, shipped_profiles

__all__ = [
    "Bounds", "CapacityProfile", "Decision", "Observation", "PlannerConfig", "PlannerState",
    "PodLoad", "RoleBounds", "RoleDecision", "RoleObservation", "RoleReplicas", "RoleState", "Slo",
    "deletion_cost_annotations", "find_profile", "load_profile", "plan", "pods_to_remove",
    "shipped_profiles",
]
