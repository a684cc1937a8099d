"""One level-triggered reconcile: validate → decide replicas → render → apply → prune → observe → status.

Runs on create/update/resume and on the timer, always the whole pipeline, so any drift or missed event is
repaired on the next pass. A spec the operator cannot realize stops the pipeline BEFORE anything is
applied (Stalled), so a running deployment keeps running on its last good spec.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..api.validation import validate
from ..render import labels as L
from ..render import render, revision_of
from ..render.checks import operator_checks
from ..render.resolve import DEPLOYMENT, LEADER_WORKER_SET, resolve
from ..render.router import service_address
from ..roles import ROLES
from .autoscale import PLANNER_CONDITIONS, PlannerOutcome, iso_time
from .kube import ChildRef, Kube, KindNotInstalled, is_conflict
from .status import Stall, WorkloadState, _condition, compute_status, workload_state

log = logging.getLogger(__name__)

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message) → a Kubernetes Event


def now_iso() -> str:
    return iso_time(time.time())


def desired_replicas(spec: api.V41FlashDeploymentSpec, previous_status: dict[str, Any],
                     planned: dict[str, int] | None = None) -> dict[str, int | None]:
    """Replicas the operator writes per enabled role; None = an external owner (HPA/KEDA) writes them.

    The planner's newest decision (`planned`), else the one recorded as status.<role>.desiredReplicas;
    the bounds are re-applied here so a changed min/max takes effect at once. Without the planner a role
    runs at minReplicas.
    """
    out: dict[str, int | None] = {}
    for role in ROLES:
        rs: api.RoleSpec = getattr(spec, role)
        if not rs.enabled:
            continue
        if rs.replicas_managed_by == "external":
            out[role] = None
            continue
        want = rs.min_replicas
        if spec.autoscaling.enabled:
            prev = (planned or {}).get(role, (previous_status.get(role) or {}).get("desiredReplicas"))
            if isinstance(prev, int) and prev > 0:
                want = prev
        out[role] = max(rs.min_replicas, min(rs.max_replicas, want))
    return out


@dataclass
class Outcome:
    status: dict[str, Any]
    status_written: bool = False
    applied: list[str] = field(default_factory=list)  # objects created or changed by this pass
    pruned: list[str] = field(default_factory=list)
    stall: Stall | None = None


def _stall_for_problems(problems: list) -> Stall:
    return Stall("InvalidSpec", "; ".join(str(p) for p in problems))


def _label(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def reconcile(kube: Kube, body: dict[str, Any], emit: Emit, *, now: str | None = None,
              planner: PlannerOutcome | None = None) -> Outcome:
    now = now or now_iso()
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = meta.get("generation", 1)
    previous = dict(body.get("status") or {})

    existing = kube.list_children(namespace, name, uid)
    live = {ChildRef.of(o): o for o in existing}

    stall: Stall | None = None
    applied: list[str] = []
    pruned: list[str] = []
    desired_objs: list[dict[str, Any]] = []
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta, "spec": body.get("spec") or {}}
    problems = validate(doc, extra_checks=operator_checks())
    obj = api.V41FlashDeployment.model_validate(doc) if not problems else None

    if problems:
        stall = _stall_for_problems(problems)
    else:
        assert obj is not None
        replicas = desired_replicas(obj.spec, previous, planner.desired if planner else None)
        owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": name, "uid": uid}
        try:
            desired_objs = render(obj, replicas=replicas, owner=owner,
                                  operator_namespace=os.environ.get("POD_NAMESPACE") or None)
        except Exception as exc:  # noqa: BLE001 - validate renders too; this is the net under it
            log.exception("render of %s/%s failed", namespace, name)
            desired_objs, stall = [], Stall("RenderFailed", f"spec: the operator cannot render it: "
                                                           f"{type(exc).__name__}: {str(exc)[:300]}")
        missing = sorted({f"{o['kind']}.{o['apiVersion']}" for o in desired_objs
                          if not kube.has_kind(o["apiVersion"], o["kind"])})
        if stall is not None:
            pass
        elif missing:
            stall = Stall("KindNotInstalled", f"the cluster does not serve {', '.join(missing)}: install it "
                                              f"(e.g. the LeaderWorkerSet controller for multi-node replicas)")
        else:
            stall = (name_collisions(kube, namespace, uid, desired_objs, live)
                     or _apply_all(kube, namespace, desired_objs, live, applied))
            if stall is None:
                want = {ChildRef.of(o) for o in desired_objs}
                for ref in [r for r in live if r not in want]:
                    kube.delete(ref, namespace)
                    pruned.append(f"{ref.kind}/{ref.name}")
                    del live[ref]

    revision = revision_of(desired_objs) if stall is None else None
    pod_revisions = _pod_revisions(kube, namespace, name) if revision else None
    status = _status(obj, body, live, previous, stall, generation, now, planner, revision, pod_revisions)
    outcome = Outcome(status=status, applied=applied, pruned=pruned, stall=stall)
    if applied:
        emit("Normal", "Applied", "created or updated " + ", ".join(applied))
    if pruned:
        emit("Normal", "Pruned", "deleted " + ", ".join(pruned) + " (no longer desired)")
    if stall and not _was_stalled_same(previous, stall):
        emit("Warning", stall.reason, stall.message)
    for event in (planner.events if planner and stall is None else ()):
        emit(*event)
    if status != previous:
        try:
            kube.patch_status(namespace, name, status, meta["resourceVersion"])
            outcome.status_written = True
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            log.info("status of %s/%s changed under us; the next pass writes it", namespace, name)
    return outcome


def _was_stalled_same(previous: dict[str, Any], stall: Stall) -> bool:
    return any(c.get("type") == "Stalled" and c.get("status") == "True" and c.get("message") == stall.message
               for c in previous.get("conditions") or [])


def _owner_text(obj: dict[str, Any]) -> str:
    owners = obj.get("metadata", {}).get("ownerReferences") or []
    if not owners:
        return "no owner"
    return "owned by " + ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in owners)


def name_collisions(kube: Kube, namespace: str, uid: str, desired: list[dict[str, Any]],
                    live: dict[ChildRef, dict[str, Any]]) -> Stall | None:
    """An existing object with a child's name that this deployment does not own (no ownerReference to its
    uid) is someone else's: never adopt it. Server-side apply with force would overwrite it and the
    ownerReference would have garbage collection delete it with the CR. Checked before anything is applied;
    children already listed as ours cost no call."""
    taken = []
    for obj in desired:
        ref = ChildRef.of(obj)
        if ref in live:
            continue
        try:
            existing = kube.get_object(ref.api_version, ref.kind, ref.name, namespace)
        except KindNotInstalled as exc:  # uninstalled since discovery: nothing applied yet
            return Stall("KindNotInstalled", str(exc))
        if existing is None:
            continue
        owners = existing.get("metadata", {}).get("ownerReferences") or []
        if not any(o.get("uid") == uid for o in owners):
            taken.append(f"{ref.kind}/{ref.name} ({_owner_text(existing)})")
    if not taken:
        return None
    return Stall("NameCollision", f"{', '.join(taken)} already exist{'s' if len(taken) == 1 else ''} in {namespace} "
                                  f"and {'is' if len(taken) == 1 else 'are'} not this deployment's: nothing was "
                                  f"applied or changed. Rename the V41FlashDeployment (children are named "
                                  f"<name>-<role>) or remove the other object")


def _apply_all(kube: Kube, namespace: str, desired: list[dict[str, Any]], live: dict[ChildRef, dict[str, Any]],
               applied: list[str]) -> Stall | None:
    for obj in desired:
        ref = ChildRef.of(obj)
        before = (live.get(ref) or {}).get("metadata", {}).get("resourceVersion")
        try:
            after = kube.apply(obj, namespace)
        except KindNotInstalled as exc:
            return Stall("KindNotInstalled", str(exc))
        except ApiException as exc:
            if exc.status in (400, 422):  # the apiserver refuses what we rendered: permanent until the spec changes
                return Stall("ApplyRejected", f"{_label(obj)}: {exc.reason}: {_api_message(exc)}")
            raise
        live[ref] = after
        if after.get("metadata", {}).get("resourceVersion") != before:
            applied.append(_label(obj))
    return None


def _api_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message", "")
    except (TypeError, ValueError):
        return str(exc.body or "")


def _pod_revisions(kube: Kube, namespace: str, name: str) -> dict[str, tuple[int, int]]:
    """(live, Ready) serving engine pods per serving-revision label; terminating pods are not counted."""
    out: dict[str, tuple[int, int]] = {}
    for pod in kube.list_pods(namespace, L.label_selector(L.serving_pods_selector(name))):
        if pod.metadata.deletion_timestamp:
            continue
        rev = (pod.metadata.labels or {}).get(L.REVISION_LABEL, "")
        ready = any(c.type == "Ready" and c.status == "True" for c in ((pod.status and pod.status.conditions) or []))
        live, n_ready = out.get(rev, (0, 0))
        out[rev] = (live + 1, n_ready + int(ready))
    return out


def _status(obj: api.V41FlashDeployment | None, body: dict[str, Any], live: dict[ChildRef, dict[str, Any]],
            previous: dict[str, Any], stall: Stall | None, generation: int, now: str,
            planner: PlannerOutcome | None, revision: str | None = None,
            pod_revisions: dict[str, int] | None = None) -> dict[str, Any]:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    by_name = {ref.name: o for ref, o in live.items() if ref.kind in (DEPLOYMENT, LEADER_WORKER_SET)}
    workloads = {role: workload_state(by_name.get(L.child_name(name, role))) for role in ROLES}
    router = workload_state(by_name.get(L.child_name(name, L.ROUTER)))
    if obj is not None:
        spec = obj.spec
        enabled = {role: getattr(spec, role).enabled for role in ROLES}
        desired = desired_replicas(spec, previous, planner.desired if planner and stall is None else None)
        resolved = resolve(spec)
        gpus = {role: r.gpus_per_replica for role, r in resolved.roles.items()}
        router_desired = spec.routing.replicas
    else:  # an invalid spec: describe what runs, as it runs
        enabled = {role: workloads[role].exists for role in ROLES}
        desired = {role: workloads[role].spec_replicas for role in ROLES}
        gpus = {role: _gpus_per_replica(previous.get(role) or {}) for role in ROLES}
        router_desired = router.spec_replicas or 0
    status = compute_status(
        generation=generation, enabled=enabled, desired=desired, workloads=workloads, router=router,
        router_desired=router_desired, gpus_per_replica=gpus,
        router_service=service_address(name, namespace), stall=stall, previous=previous, now=now,
        revision=revision, pod_revisions=pod_revisions)
    if planner is not None and stall is None:
        status.update(planner.status)
    status["conditions"] = _planner_conditions(status["conditions"], previous, planner if stall is None else None,
                                               generation, now)
    return status


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


__all__ = ["reconcile", "desired_replicas", "Outcome", "WorkloadState"]
