"""Status from what was observed: pure functions, kstatus conventions.

Ready (normal polarity), Reconciling and Stalled (abnormal polarity: present and True only while so).
observedGeneration says which spec the status describes; a condition keeps its lastTransitionTime while
its status stays the same, so an unchanged world yields a byte-identical status (and no write).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..roles import ROLES


@dataclass(frozen=True)
class WorkloadState:
    """What a Deployment or LeaderWorkerSet reports, reduced to what status needs."""
    exists: bool = False
    spec_replicas: int | None = None
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    up_to_date: bool = False  # the workload controller has seen its latest spec


def workload_state(obj: dict[str, Any] | None) -> WorkloadState:
    if not obj:
        return WorkloadState()
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status") or {}
    return WorkloadState(
        exists=True,
        spec_replicas=spec.get("replicas"),
        replicas=status.get("replicas") or 0,
        ready=status.get("readyReplicas") or 0,
        updated=status.get("updatedReplicas") or 0,
        up_to_date=(status.get("observedGeneration") or 0) >= (meta.get("generation") or 0)
        if obj.get("kind") == "Deployment" else True,  # LWS reports no observedGeneration
    )


def may_run_older_pods(w: WorkloadState) -> bool:
    """Whether the workload may still run pods of an older template (it has pods, and its controller has not
    seen the latest spec or not every replica is updated). A settled workload's pods are all of its current
    template; one that reports no replicas has no live pod to list."""
    return w.exists and w.replicas > 0 and (not w.up_to_date or w.updated < w.replicas)  # replicas 0: no pod at all


@dataclass(frozen=True)
class Stall:
    reason: str  # CamelCase, e.g. InvalidSpec
    message: str


def _condition(prev: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
               generation: int, now: str) -> dict[str, Any]:
    old = next((c for c in prev if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since}


def _role_progress(role: str, want: int, w: WorkloadState) -> str | None:
    """Why a role is not yet where it should be; None when it is."""
    if not w.exists:
        return f"{role}: workload not created yet"
    if not w.up_to_date:
        return f"{role}: rollout of the new spec not yet observed"
    if w.updated < want:
        return f"{role}: {w.updated}/{want} replicas updated"
    if w.ready < want:
        return f"{role}: {w.ready}/{want} replicas ready"
    if w.replicas > want:  # a surge replica still starting, or an old one still leaving
        return f"{role}: {w.replicas} replicas for {want} desired (rolling)"
    return None


def _serving_revision(revision: str | None, pod_revisions: dict[str, tuple[int, int]], roles_settled: bool,
                      previous: str) -> tuple[str, str | None]:
    """(servingRevision, why the engines are still rolling or None).

    The new revision serves once every role has its replicas updated and ready and no live engine pod
    runs another revision; until then the revision that served before keeps the name.
    """
    if revision is None:
        return previous, None
    others = {rev: n for rev, n in pod_revisions.items() if rev != revision}
    if not others:
        return (revision if roles_settled else previous), None
    live, ready = pod_revisions.get(revision, (0, 0))
    total = live + sum(n for n, _ in others.values())
    return previous, (f"engines rolling from revision {', '.join(sorted(others))} to {revision}: "
                      f"{live}/{total} engine pods on {revision} ({ready} Ready)")


def compute_status(*, generation: int, enabled: dict[str, bool], desired: dict[str, int | None],
                   workloads: dict[str, WorkloadState], router: WorkloadState, router_desired: int,
                   gpus_per_replica: dict[str, int], router_service: str, stall: Stall | None,
                   previous: dict[str, Any] | None, now: str, revision: str | None = None,
                   pod_revisions: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """The whole status except the planner's parts (slo, lastDecision, plannerState), which are carried.

    revision: the serving revision the spec renders (None: an invalid spec, nothing rendered);
    pod_revisions: (live, Ready) serving engine pods per revision label (live = not terminating).
    """
    previous = previous or {}
    prev_conditions = previous.get("conditions") or []
    status: dict[str, Any] = {"observedGeneration": generation}
    waiting: list[str] = []
    for role in ROLES:
        w = workloads.get(role, WorkloadState())
        if not enabled.get(role):
            status[role] = {"desiredReplicas": 0, "replicas": 0, "readyReplicas": 0, "ready": "off", "gpus": 0}
            continue
        # External owners (HPA/KEDA) decide replicas: what the workload asks for is the target.
        want = desired.get(role)
        want = want if want is not None else (w.spec_replicas if w.spec_replicas is not None else 0)
        status[role] = {"desiredReplicas": want, "replicas": w.replicas, "readyReplicas": w.ready,
                        "ready": f"{w.ready}/{want}", "gpus": w.replicas * gpus_per_replica.get(role, 0)}
        if (why := _role_progress(role, want, w)) is not None:
            waiting.append(why)
    status["router"] = {"readyReplicas": router.ready, "service": router_service}
    if (why := _role_progress("router", router_desired, router)) is not None:
        waiting.append(why)

    serving, rolling = _serving_revision(revision, pod_revisions or {}, stall is None and not waiting,
                                         previous.get("servingRevision") or "")
    if serving:
        status["servingRevision"] = serving
    if rolling:
        waiting.append(rolling)

    for key in ("slo", "lastDecision", "plannerState"):
        if key in previous:
            status[key] = previous[key]

    if stall is not None:
        ready = ("False", stall.reason, stall.message)
        conditions = [_condition(prev_conditions, "Stalled", "True", stall.reason, stall.message, generation, now)]
    elif waiting:
        message = "; ".join(waiting)
        ready = ("False", "Progressing", message)
        conditions = [_condition(prev_conditions, "Reconciling", "True", "Progressing", message, generation, now)]
    else:
        ready = ("True", "AllReplicasReady", "every role and the router have their replicas ready")
        conditions = []
    conditions.insert(0, _condition(prev_conditions, "Ready", *ready, generation, now))
    status["conditions"] = conditions
    return status
