"""A deployment's status from what a pass observed: ``deployment_status`` is the one place it is computed
(pure: what it reads is handed in), kstatus conventions.

Ready (normal polarity), Reconciling and Stalled (abnormal polarity: present and True only while so).
observedGeneration says which spec the status describes; a condition keeps its lastTransitionTime while
its status stays the same, so an unchanged world yields a byte-identical status (and no write).

``deployment_status`` = ``compute_status`` (roles, router, servingRevision, Ready/Reconciling/Stalled from the
workloads) + the planner's fields + a rollout's (status.rollout, status.revisions, its conditions) + the
planner's conditions.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api import v1alpha1 as api
from ..render import gateway
from ..render import labels as L
from ..render.resolve import DEPLOYMENT, LEADER_WORKER_SET, resolve
from ..render.revision import revision_of
from ..render.router import service_address
from ..rollout import machine as M
from ..render.slots import slot_workload_name
from ..roles import ROLES
from ..rollout.world import RolloutPass
from .autoscale import PLANNER_CONDITIONS, PlannerOutcome
from .engine_health import HEALTH_CONDITIONS, STATUS_KEY as ENGINE_HEALTH
from .desired import desired_replicas
from .kube import ChildRef


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


def deployment_status(*, body: dict[str, Any], model: api.V41FlashDeployment | None,
                      live: Mapping[ChildRef, dict[str, Any]], stall: Stall | None, now: str,
                      planner: PlannerOutcome | None, desired: tuple[dict[str, Any], ...] | list[dict[str, Any]],
                      rolled: RolloutPass | None, pod_revisions: Callable[[], dict[str, tuple[int, int]]]
                      ) -> dict[str, Any]:
    """The status a pass writes: from the CR (spec model, previous status), the workloads that run (`live`),
    why the pass stopped (`stall`), the planner's outcome, the desired objects and the rollout pass.

    A rollout pass (without a stall) reads the serving slot's workloads and says what status.rollout says; any
    other pass reads the slot status records ("" before any rollout) and the revision `desired` renders. pod_revisions is called (one
    pod list) only while engine pods of another revision may be live: the serving revision is another one, or
    a role's workload may still run pods of an older template. So a deployment at rest, or one whose pods
    cannot be scheduled, lists no pods on its periodic passes."""
    meta = body["metadata"]
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation", 1)
    previous = dict(body.get("status") or {})
    if rolled is not None and stall is None:
        revision, slot = None, rolled.decision.serving_slot if rolled.decision else ""
    else:  # a stalled pass realised nothing: the slot that serves is the one status recorded ("" if none)
        revision, rolled = (revision_of(list(desired)) if stall is None else None), None
        slot = M.State.from_status(previous.get("rollout")).serving_slot
    by_name = {ref.name: o for ref, o in live.items() if ref.kind in (DEPLOYMENT, LEADER_WORKER_SET)}
    workloads = {role: workload_state(by_name.get(slot_workload_name(name, role, slot))) for role in ROLES}
    gateway_mode = model is not None and gateway.is_gateway(model.spec)
    # the router: vllm-router's Deployment (the front, once rolled out), or the serving slot's endpoint picker
    router = workload_state(by_name.get(gateway.epp_name(name, slot) if gateway_mode else L.child_name(name, L.ROUTER)))
    if model is not None:
        spec = model.spec
        enabled = {role: getattr(spec, role).enabled for role in ROLES}
        want = desired_replicas(spec, previous, planner.desired if planner and stall is None else None)
        resolved = resolve(spec)
        gpus = {role: r.gpus_per_replica for role, r in resolved.roles.items()}
        # one picker per slot; the front: what its autoscaler decided (spec.replicas), at least its minimum
        router_desired = 1 if gateway_mode else max(router.spec_replicas or 0,
                                                   spec.routing.front_or_default.min_replicas)
    else:  # an invalid spec: describe what runs, as it runs
        enabled = {role: workloads[role].exists for role in ROLES}
        want = {role: workloads[role].spec_replicas for role in ROLES}
        gpus = {role: _gpus_per_replica(previous.get(role) or {}) for role in ROLES}
        router_desired = router.spec_replicas or 0
    pods = None
    if revision is not None and (
            previous.get("servingRevision") not in (None, revision)
            or any(may_run_older_pods(workloads[role]) for role in ROLES if enabled.get(role))):
        pods = pod_revisions()
    status = compute_status(
        generation=generation, enabled=enabled, desired=want, workloads=workloads, router=router,
        router_desired=router_desired, gpus_per_replica=gpus,
        router_service="" if gateway_mode else service_address(name, namespace), stall=stall, previous=previous,
        now=now, revision=revision, pod_revisions=pods)
    if gateway_mode:
        status["router"]["inferencePool"] = gateway.pool_name(name)
    if planner is not None and stall is None:
        status.update(planner.status)
    if rolled is not None:
        _rollout_status(status, rolled, previous, generation, now)
    elif stall is not None:  # what a later pass decides from: which slot serves, which revision where
        status.update({key: previous[key] for key in ("rollout", "revisions") if key in previous})
    status["conditions"] = _planner_conditions(status["conditions"], previous, planner if stall is None else None,
                                               generation, now)
    # engine health writes its own fields (controller/engine_health.py); a pass carries them over
    status["conditions"] += [c for c in previous.get("conditions") or [] if c.get("type") in HEALTH_CONDITIONS]
    if previous.get(ENGINE_HEALTH):
        status[ENGINE_HEALTH] = previous[ENGINE_HEALTH]
    return status


def _rollout_status(status: dict[str, Any], rolled: RolloutPass, previous: dict[str, Any], generation: int,
                    now: str) -> None:
    """servingRevision, status.rollout / status.revisions and the kstatus conditions of a rollout pass:
    Reconciling (step k/n, share, the candidate's figures vs the gate) while it progresses, Stalled with the
    reason after a rollback (Ready False in both: the spec's generation is not realised)."""
    if rolled.serving_revision:
        status["servingRevision"] = rolled.serving_revision
    for key, value in (("rollout", rolled.rollout_status), ("revisions", rolled.revisions_status)):
        if rolled.rollout_status is not None and value:
            status[key] = value
        else:
            status.pop(key, None)
    d = rolled.decision
    if d is None or (not d.stalled and not d.reconciling):
        return
    prev = previous.get("conditions") or []
    conds = {c["type"]: c for c in status["conditions"]}
    if d.stalled:
        reason, message = d.stalled
        out = [_condition(prev, "Ready", "False", reason, message, generation, now),
               _condition(prev, "Stalled", "True", reason, message, generation, now)]
    else:
        message = d.reconciling
        if "Reconciling" in conds:  # the serving slot's own progress too (a surge, a replica starting)
            message = f"{message}; {conds['Reconciling']['message']}"
        reason = d.reconciling_reason or "RolloutProgressing"
        out = [_condition(prev, "Ready", "False", reason, message, generation, now),
               _condition(prev, "Reconciling", "True", reason, message, generation, now)]
    status["conditions"] = out


def _gpus_per_replica(previous_role_status: dict[str, Any]) -> int:
    """GPUs per replica as the last status counted them (total over the replicas it counted), for when the spec
    cannot say; dividing by the replicas running now would be wrong while their number changes."""
    return previous_role_status.get("gpus", 0) // max(1, previous_role_status.get("replicas", 0))


def _planner_conditions(conditions: list[dict[str, Any]], previous: dict[str, Any], planner: PlannerOutcome | None,
                       generation: int, now: str) -> list[dict[str, Any]]:
    """Add the planner's conditions (abnormal polarity: present and True only while so). Between planner
    passes (no outcome) the recorded ones are kept, like status.lastDecision."""
    prev = previous.get("conditions") or []
    if planner is None:
        return conditions + [c for c in prev if c.get("type") in PLANNER_CONDITIONS]
    return conditions + [_condition(prev, type_, "True", reason, message, generation, now)
                         for type_, reason, message in planner.conditions]
