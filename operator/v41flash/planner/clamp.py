"""Step 6, ``clamp``: the roles' verdicts within their bounds, then within the GPU budget."""
from __future__ import annotations

from dataclasses import dataclass, replace

from v41flash.planner.act import Verdict
from v41flash.planner.datatypes import Action, RoleBounds
from v41flash.roles import Role


@dataclass(frozen=True)
class Claim:
    """One role's verdict and what clamping it needs to know."""

    role: Role
    verdict: Verdict
    current: int  # replicas the workload has (RoleReplicas.desired)
    bounds: RoleBounds
    gpus_per_replica: int
    need: float | None  # fractional replicas the model needs (None: not sized)


@dataclass(frozen=True)
class Clamped:
    verdicts: tuple[Verdict, ...]  # one per claim, in the claims' order
    notes: tuple[str, ...] = ()


def _action(desired: int, cur: int) -> Action:
    return "scale_up" if desired > cur else "scale_down" if desired < cur else "hold"


def within_bounds(v: Verdict, cur: int, bounds: RoleBounds) -> Verdict:
    lo, hi = bounds.min_replicas, bounds.max_replicas
    want = v.desired
    desired = max(lo, min(hi, want))
    clamped, why = v.clamped, v.why
    if desired != want:
        clamped = f"{'max' if want > hi else 'min'} replicas {desired} (wanted {want})"
        why += f"; clamped to {clamped}"
    return replace(v, desired=desired, action=_action(desired, cur), why=why, clamped=clamped)


def clamp(claims: tuple[Claim, ...], gpu_budget: int | None) -> Clamped:
    """Bounds per role (autoscaled roles only), then the GPU budget: scale-ups are granted replica by replica
    to the role under most pressure until the budget is used; never a scale-down to fit it."""
    verdicts = [within_bounds(c.verdict, c.current, c.bounds) if c.bounds.autoscale else c.verdict for c in claims]
    if gpu_budget is None:
        return Clamped(tuple(verdicts))
    notes: list[str] = []
    alloc = [min(v.desired, c.current) if c.bounds.autoscale else c.current for c, v in zip(claims, verdicts)]
    used = sum(a * c.gpus_per_replica for a, c in zip(alloc, claims))
    if used > gpu_budget:
        notes.append(f"current replicas already use {used} GPUs > budget {gpu_budget}; no scale-up")
    wanting = [i for i, v in enumerate(verdicts) if v.desired > alloc[i]]
    while wanting:
        # pressure = need per allocated replica: the most starved role gets the next replica
        wanting.sort(key=lambda i: -((claims[i].need if claims[i].need is not None else verdicts[i].desired)
                                     / max(1, alloc[i])))
        granted = False
        for i in wanting:
            if used + claims[i].gpus_per_replica <= gpu_budget:
                alloc[i] += 1
                used += claims[i].gpus_per_replica
                granted = True
                break
        wanting = [i for i in wanting if verdicts[i].desired > alloc[i]]
        if not granted:
            break
    for i, c in enumerate(claims):
        v = verdicts[i]
        if alloc[i] < v.desired:
            clamped = f"GPU budget {gpu_budget} (model wanted {v.desired} {c.role} replicas, got {alloc[i]})"
            verdicts[i] = replace(v, desired=alloc[i], action=_action(alloc[i], c.current), clamped=clamped,
                                  why=v.why + f"; clamped by {clamped}")
    return Clamped(tuple(verdicts), tuple(notes))
