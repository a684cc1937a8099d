"""Everything this operator process remembers per deployment (uid) between passes, and the one forget().

None of it is needed for correctness: a new process (a restart, a new leader) starts with nothing and its first
passes read or rebuild it. It saves API reads, renders and writes, and keeps the planner's recent scrapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..rollout.progress import StepFigures
from . import metrics
from .autoscale import Autoscaler
from .children import ChildCache
from .kube import ChildRef


@dataclass
class DeploymentMemory:
    """One deployment's part."""
    body: dict[str, Any] | None = None  # the newest V41FlashDeployment body we know (None: not watched)
    applied_generation: int | None = None  # the generation a full pass of this process last applied
    applied_at: float = float("-inf")  # when (monotonic) a full pass last applied the children
    # the desired set the last full pass converged to (a pass lists to prune only when it moves); True: list
    pruned_against: frozenset[ChildRef] | bool = True
    # validating and rendering cost ~25 ms of CPU; a spec at one generation renders the same objects for the same
    # replicas, so the periodic pass reuses the last result: (key, desired.Prepared)
    prepared: tuple[tuple, Any] | None = None
    # resourceVersion of each child as our last apply left it: a pass that did not list can still tell a no-op
    # apply (same version) from a change (an Event and a log line only for the latter)
    applied_rv: dict[ChildRef, str] = field(default_factory=dict)
    # revisions whose ControllerRevision this process created or found: one create per revision
    recorded: set[str] = field(default_factory=set)
    # an undesired ComputeDomain waits for the pods that claim its channel: every tick prunes until it is gone
    domains_draining: bool = False


class Memory:
    """Per deployment: a DeploymentMemory, its workloads as watched (``children``), the rollout's scrapes
    (``step_figures``) and the planner's histories and states (in ``autoscaler``, made with the first planner
    pass). ``forget`` drops all of it, and the deployment's own series."""

    def __init__(self) -> None:
        self._by_uid: dict[str, DeploymentMemory] = {}
        self.children = ChildCache()
        self.step_figures = StepFigures()
        self.autoscaler: Autoscaler | None = None

    def of(self, uid: str) -> DeploymentMemory:
        mem = self._by_uid.get(uid)
        return mem if mem is not None else self._by_uid.setdefault(uid, DeploymentMemory())

    def body(self, uid: str) -> dict[str, Any] | None:
        mem = self._by_uid.get(uid)
        return None if mem is None else mem.body

    def known(self) -> list[str]:
        """The deployments the watch delivered (and not deleted since)."""
        return [uid for uid, mem in list(self._by_uid.items()) if mem.body is not None]

    def remember(self, body: dict[str, Any]) -> None:
        """Keep the newer of two bodies (resourceVersion as a number: etcd's revision, as clients commonly do)."""
        mem = self.of(body["metadata"]["uid"])
        try:
            if mem.body is not None and \
                    int(mem.body["metadata"]["resourceVersion"]) > int(body["metadata"]["resourceVersion"]):
                return
        except (KeyError, TypeError, ValueError):
            pass
        mem.body = body

    def forget(self, uid: str, namespace: str, name: str) -> None:
        """A deleted deployment: nothing of it is kept."""
        self._by_uid.pop(uid, None)
        self.children.forget(uid)
        self.step_figures.forget(uid)
        if self.autoscaler is not None:
            self.autoscaler.forget(uid, namespace, name)
        metrics.forget(namespace, name)
