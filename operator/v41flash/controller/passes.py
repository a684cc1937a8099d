"""One pass for one deployment, as the scheduler runs it on a worker thread: which reconcile the requested
Work means (apply or observe, list or not), a fresh read when the status changed under us, and what the pass
leaves in memory and in the controller's series."""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from . import metrics
from .apply import NamespaceTerminating
from .autoscale import PlannerOutcome, same_decision
from .kube import KubeAPI
from .reconcile import Outcome, Pass, reconcile
from .runtime import Runtime
from .scheduler import URGENT, CapacityRefused, Work

log = logging.getLogger(__name__)


def run_pass(rt: Runtime, uid: str, work: Work) -> Outcome | None:
    """None = the deployment is gone."""
    memory = rt.memory
    kube: KubeAPI = rt.kube
    body = memory.body(uid)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    generation = meta.get("generation", 1)
    mem = memory.of(uid)
    full = work.full or mem.applied_generation != generation  # observe only what we applied ourselves
    children = memory.children
    how = Pass(apply=full, prune=True if work.prune else (mem.pruned_against if full else False),
               workloads=children.of, seen=children.seen)
    if work.trigger == "create" and not work.prune:
        how = Pass(apply=True, prune=False, workloads=children.of, seen=children.seen)  # a new uid owns nothing yet
    trigger = work.trigger if full or work.trigger != "periodic" else "observe"
    planned = _newest_record(body, work.planner)

    def emit(type_: str, reason: str, message: str) -> None:
        kube.post_event_soon(body, type_, reason, message)  # an Event is news, not a step of the pass

    with metrics.RECONCILE_SECONDS.labels(trigger).time(), kube.urgent(work.trigger in URGENT):
        try:
            outcome = reconcile(kube, body, emit, memory=memory, planner=planned, how=how)
            if outcome.conflict:  # the CR changed since the watch delivered it: read it once
                fresh = kube.read_cr(ns, name)
                if fresh is None or fresh["metadata"]["uid"] != uid or fresh["metadata"].get("deletionTimestamp"):
                    return None
                memory.remember(fresh)
                if fresh.get("spec") == body.get("spec") and fresh.get("status") == body.get("status"):
                    # only metadata moved (kopf's own annotation after a create/update): write what we computed
                    outcome.body = kube.patch_status(ns, name, outcome.status, fresh["metadata"]["resourceVersion"])
                    outcome.status_written, outcome.conflict = True, False
                else:  # the children are applied already: status from a fresh view is all that is left
                    body = memory.body(uid)
                    outcome = reconcile(kube, body, emit, memory=memory, planner=planned,
                                        how=Pass(apply=False, workloads=children.of) if full else how)
        except NamespaceTerminating as exc:  # the deployment goes with its namespace: nothing to retry
            log.info("%s/%s: %s; not reconciling it", ns, name, exc)
            return None
        except Exception:
            metrics.RECONCILES.labels(trigger, "error").inc()
            raise
    if outcome.body is not None:
        memory.remember(outcome.body)
    if full and outcome.stall is None:
        mem = memory.of(uid)
        mem.applied_generation, mem.applied_at, mem.pruned_against = generation, time.monotonic(), outcome.desired
    ready = next((c for c in outcome.status["conditions"] if c["type"] == "Ready"), {})
    metrics.record_pass(ns, name, trigger, capacity=outcome.capacity, stalled=outcome.stall is not None,
                        ready=ready.get("status") == "True", applied=outcome.applied, pruned=outcome.pruned)
    if outcome.applied or outcome.pruned:
        log.info("%s/%s reconciled (%s): applied=%s pruned=%s ready=%s", ns, name, trigger, outcome.applied,
                 outcome.pruned, ready.get("reason"))
    if outcome.capacity:
        raise CapacityRefused(outcome.stall.message if outcome.stall else "refused for capacity")
    return outcome


def _newest_record(body: dict[str, Any], planned: PlannerOutcome | None) -> PlannerOutcome | None:
    """The planner decided from the body of its start; if status has since recorded the same decision (only its
    figures moved), keep that record: otherwise an older copy would be written back (churn)."""
    if planned is None:
        return None
    now_recorded = (body.get("status") or {}).get("lastDecision") or {}
    decided = planned.status.get("lastDecision")
    if decided is not None and now_recorded and same_decision(now_recorded, decided):
        return replace(planned, status={**planned.status, "lastDecision": now_recorded})
    return planned
