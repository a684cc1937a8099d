"""Rollouts of a new serving revision (docs/2026-12-01-rollouts.md).

``machine``: the pure state machine (``decide``). ``world``: one reconcile pass's rollout part, from the
objects the controller observed to the objects it must apply (pure; uses the renderer).
"""
