"""Rollouts of a new serving revision (docs/2026-12-01-rollouts.md).

``machine``: the pure state machine (``decide``). ``slots``: two live revisions side by side, rendered into
slots, and what the controller reads back of each (pure; uses the renderer's builders). ``world``: one
reconcile pass's rollout part, from the objects the controller observed to the objects it must apply (pure).
"""
