"""Rollouts of a new serving revision (docs/2026-12-01-rollouts.md).

``machine``: the pure state machine (``decide``). ``world``: one reconcile pass's rollout part, from the
objects the controller observed to the objects it must apply (pure; uses the renderer).
"""
from .machine import (  # noqa: F401 - the package's APIABORTED, CANARY, COMPLETE, DRAINING, ENDED, LEGACY_SLOT, PAUSED, RECREATING, ROLLED_BACK,
                      STARTING, WAITING, Action, Decision, Event, Figures, Observed, Policy, RoleObs, SlotObs,
                      SlotPlan, State, candidate_figures, candidate_gpus, decide, judge, other_slot,
                      policy_from_spec, surge_room)
