"""Graceful scale-down helpers (pure): which pods go first.

A ReplicaSet scaling down deletes pods with the lowest ``controller.kubernetes.io/pod-deletion-cost``
first, so the controller annotates the pods chosen here *before* lowering replicas. LeaderWorkerSet
(multi-node replicas) always removes the highest group indices and ignores the annotation; there the
pods' drain timing (render/timing.py, sized from the SLO) is what protects in-flight requests.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class PodLoad:
    name: str
    running: float = 0.0  # vllm:num_requests_running summed over the pod's engines
    waiting: float = 0.0  # vllm:num_requests_waiting summed over the pod's engines
    ready: bool = True
    created: float = 0.0  # creation time, unix seconds
    deletion_cost: int | None = None  # the annotation the pod carries now, if any


def pods_to_remove(pods: Sequence[PodLoad], count: int) -> tuple[str, ...]:
    """The ``count`` pods cheapest to lose: not ready first, then least loaded, then newest (coldest cache)."""
    if count <= 0:
        return ()
    order = sorted(pods, key=lambda p: (p.ready, p.running + p.waiting, -p.created, p.name))
    return tuple(p.name for p in order[:count])


def deletion_cost_annotations(pods: Sequence[PodLoad], remove: Sequence[str]) -> dict[str, Mapping[str, str]]:
    """Annotation patches: chosen pods get costs below every other pod (first chosen = lowest).

    Pods left over from an earlier, cancelled choice (negative cost, not chosen now) are reset to 0, so
    they are not removed next time merely because they once were candidates. Pods needing no change
    are left out, so an unchanged plan writes nothing.
    """
    chosen = {name: -(len(remove) - i) for i, name in enumerate(remove)}
    patches: dict[str, Mapping[str, str]] = {}
    for p in pods:
        want = chosen.get(p.name)
        if want is None and p.deletion_cost is not None and p.deletion_cost < 0:
            want = 0
        if want is not None and want != p.deletion_cost:
            patches[p.name] = {POD_DELETION_COST: str(want)}
    return patches

