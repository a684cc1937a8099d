"""Rollouts of a new serving revision (docs/rollouts.md; the record: docs/decisions/2026-12-01-rollouts.md).

``machine``: the pure state machine (``decide``). ``world``: one reconcile pass's rollout part, from the
objects the controller observed to the objects it must apply (pure). ``slots``: two live revisions side by
side, rendered into slots, and what the controller reads back of each (pure; uses the renderer's builders).
``progress``: the rollout as the controller follows it: which pass it needs, the step's figures scraped from
the pods, old revision records, the planner's share during a rollout. ``pods``: what slots and progress read
of a pod (its labels, Ready).
"""
