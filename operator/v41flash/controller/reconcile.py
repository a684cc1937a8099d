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
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..api.validation import validate
from ..render import labels as L
from ..render import render, revision_of
from ..render.checks import operator_checks
from ..render.resolve import DEPLOYMENT, LEADER_WORKER_SET, resolve
from ..render.router import service_address
from ..render.slots import controller_revision, slot_workload_name
from ..roles import ROLES
from ..rollout import machine as M
from ..rollout import progress
from ..rollout.world import RolloutPass, World, rest_pass, rollout_pass
from .autoscale import PLANNER_CONDITIONS, PlannerOutcome, iso_time
from .kube import CONTROLLER_REVISION, ChildRef, Kube, KindNotInstalled, is_conflict, namespace_terminating
from .status import Stall, WorkloadState, _condition, compute_status, may_run_older_pods, workload_state

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
    capacity: bool = False  # the cluster refused an object for capacity: retry later, with backoff
    conflict: bool = False  # the status changed under us: the caller re-reads and passes again
    body: dict[str, Any] | None = None  # the CR as our status write returned it
    desired: frozenset[ChildRef] = frozenset()  # what this spec renders (prune needs a list only when it moves)


@dataclass(frozen=True)
class Pass:
    """What one pass does besides computing status. The default is everything (create/update/resume).

    apply=False observes only: the workloads come from `workloads` (a watch cache) or are read by name.
    prune=False skips listing what exists, for passes where nothing undesired can be there (a new CR);
    a set of refs lists only when the desired set differs from it (the set a previous pass pruned against).
    """
    apply: bool = True
    prune: bool | frozenset[ChildRef] = True
    workloads: Callable[[str, str], dict[ChildRef, dict[str, Any]]] | None = None  # (namespace, uid) → live
    # told each workload this pass applied or listed (as the apiserver returned it): the watch cache behind
    # `workloads` may deliver it much later
    seen: Callable[[dict[str, Any]], None] | None = None


FULL = Pass()

# Validating and rendering cost ~25 ms of CPU; a spec at one generation renders the same objects for the
# same replicas, so the periodic pass reuses the last result per deployment (uid).
_prepared: dict[str, tuple[tuple, tuple]] = {}
# resourceVersion of each child as our last apply left it: a pass that did not list can still tell a
# no-op apply (same version) from a change (an Event and a log line only for the latter).
_applied_rv: dict[str, dict[ChildRef, str]] = {}
# Revisions whose ControllerRevision this process created or found (per uid): one create per revision.
_recorded: dict[str, set[str]] = {}
# The rollout's own scrapes (candidate and slot routers), whether or not the planner runs.
STEP_FIGURES = progress.StepFigures()


def forget(uid: str) -> None:
    _prepared.pop(uid, None)
    _applied_rv.pop(uid, None)
    _recorded.pop(uid, None)
    STEP_FIGURES.forget(uid)


def _prepare(body: dict[str, Any], previous: dict[str, Any], planned: dict[str, int] | None
             ) -> tuple[list, api.V41FlashDeployment | None, list[dict[str, Any]], Stall | None]:
    """(problems, the model, the rendered children, a render failure) — cached per uid for an unchanged key."""
    meta = body["metadata"]
    # what desired_replicas() reads (the spec's bounds are in the spec part of the key): a planner pass that
    # holds at what status records and the periodic pass between planner passes share one entry
    # (a role the spec turns off renders no replicas, whatever status records for it)
    spec_raw = body.get("spec") or {}
    replicas_key = tuple((role, None if (spec_raw.get(role) or {}).get("enabled", True) is False else
                          (planned or {}).get(role, (previous.get(role) or {}).get("desiredReplicas")))
                         for role in ROLES)
    key = (meta.get("generation"), meta.get("resourceVersion") if meta.get("generation") is None else None,
           replicas_key, json.dumps(body.get("spec") or {}, sort_keys=True, default=str))
    hit = _prepared.get(meta["uid"])
    if hit is not None and hit[0] == key:
        return hit[1]  # type: ignore[return-value]
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta, "spec": body.get("spec") or {}}
    problems = validate(doc, extra_checks=operator_checks())
    obj = api.V41FlashDeployment.model_validate(doc) if not problems else None
    desired_objs: list[dict[str, Any]] = []
    render_stall: Stall | None = None
    if obj is not None:
        replicas = desired_replicas(obj.spec, previous, planned)
        owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"], "uid": meta["uid"]}
        try:
            desired_objs = render(obj, replicas=replicas, owner=owner,
                                  operator_namespace=os.environ.get("POD_NAMESPACE") or None)
        except Exception as exc:  # noqa: BLE001 - validate renders too; this is the net under it
            log.exception("render of %s/%s failed", meta["namespace"], meta["name"])
            render_stall = Stall("RenderFailed", f"spec: the operator cannot render it: "
                                                 f"{type(exc).__name__}: {str(exc)[:300]}")
    result = (problems, obj, desired_objs, render_stall)
    if obj is not None:
        # kept under the replicas it rendered: the next pass reads them from the status this one writes (a new
        # CR's first pass has none recorded yet, so its first observe pass missed and rendered again)
        key = (key[0], key[1], tuple((role, replicas.get(role)) for role in ROLES), key[3])
    _prepared[meta["uid"]] = (key, result)
    return result


def _stall_for_problems(problems: list) -> Stall:
    return Stall("InvalidSpec", "; ".join(str(p) for p in problems))


def _label(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


WORKLOAD_KINDS = (DEPLOYMENT, LEADER_WORKER_SET)


def reconcile(kube: Kube, body: dict[str, Any], emit: Emit, *, now: str | None = None,
              planner: PlannerOutcome | None = None, how: Pass = FULL) -> Outcome:
    now = now or now_iso()
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = meta.get("generation", 1)
    previous = dict(body.get("status") or {})

    stall: Stall | None = None
    capacity = False
    applied: list[str] = []
    pruned: list[str] = []
    problems, obj, desired_objs, render_stall = _prepare(body, previous, planner.desired if planner else None)
    spec_revision = revision_of(desired_objs) if obj is not None and render_stall is None else None
    rolled: RolloutPass | None = None
    records: list[dict[str, Any]] = []
    live: dict[ChildRef, dict[str, Any]] = {}
    if obj is not None and not problems and render_stall is None and not how.apply and \
            progress.at_rest(previous, spec_revision):
        # A rollout that is over: an observe pass renders the serving slot from spec and status (no lists, no
        # applies); drift passes and spec or annotation changes still take the full rollout pass below.
        rolled = rest_pass(obj, previous, desired_replicas(obj.spec, previous, planner.desired if planner else None),
                           _owner(body), operator_namespace=os.environ.get("POD_NAMESPACE") or None)
        desired_objs = rolled.objects
    elif obj is not None and not problems and render_stall is None and progress.needed(previous, spec_revision):
        # A rollout (or one to start): every pass lists, decides from what runs, applies and prunes.
        how = replace(how, apply=True, prune=True)
        live = {ChildRef.of(o): o for o in kube.list_children(namespace, name, uid)}
        try:
            rolled, records = _rollout(kube, body, obj, previous, live, planner)
            desired_objs = rolled.objects
        except ValueError as exc:
            render_stall = Stall("RolloutBlocked", str(exc)[:1000])
    want = frozenset(ChildRef.of(o) for o in desired_objs)
    prune = how.apply and (how.prune if isinstance(how.prune, bool) else want != how.prune)
    if prune and not live:
        live = {ChildRef.of(o): o for o in kube.list_children(namespace, name, uid)}

    if problems:
        stall = _stall_for_problems(problems)
    else:
        stall = render_stall
        missing = sorted({f"{o['kind']}.{o['apiVersion']}" for o in desired_objs
                          if not kube.has_kind(o["apiVersion"], o["kind"])})
        if stall is not None:
            pass
        elif missing:
            stall = Stall("KindNotInstalled", f"the cluster does not serve {', '.join(missing)}: install it "
                                              f"(e.g. the LeaderWorkerSet controller for multi-node replicas)")
        elif how.apply:
            known = _applied_rv.setdefault(uid, {})
            stall = name_collisions(kube, namespace, uid, desired_objs, live, known)
            if stall is None:
                stall, capacity = _apply_all(kube, namespace, desired_objs, live, applied, known)
            for ref, o in live.items() if how.seen is not None else ():
                if ref.kind in WORKLOAD_KINDS and ref in want:
                    how.seen(o)
            if stall is None and prune:
                for ref in [r for r in live if r not in want]:
                    kube.delete(ref, namespace)
                    _applied_rv.get(uid, {}).pop(ref, None)
                    pruned.append(f"{ref.kind}/{ref.name}")
                    del live[ref]
            if stall is None and rolled is not None:
                _keep_records(kube, namespace, uid, rolled, records, applied, pruned)
    if stall is None and obj is not None and rolled is None and spec_revision and \
            spec_revision not in _recorded.get(uid, set()):
        _record(kube, body, obj, spec_revision)
    if not how.apply or (problems and not prune):  # observe: workloads as they run
        cached = how.workloads(namespace, uid) if how.workloads else {}
        live.update(cached)
        # one the watch has not delivered yet is read, not reported missing (no status flapping)
        live.update(_read_workloads(kube, namespace, frozenset(r for r in want if r not in cached)))

    revision = revision_of(desired_objs) if stall is None else None
    if rolled is not None and stall is None:
        status = _status(obj, body, live, previous, stall, generation, now, planner, None, None,
                         slot=rolled.decision.serving_slot if rolled.decision else "", rolled=rolled)
    else:
        status = _status(obj, body, live, previous, stall, generation, now, planner, revision,
                         lambda: _pod_revisions(kube, namespace, name))
    outcome = Outcome(status=status, applied=applied, pruned=pruned, stall=stall, capacity=capacity, desired=want)
    if applied:
        emit("Normal", "Applied", "created or updated " + ", ".join(applied))
    if pruned:
        emit("Normal", "Pruned", "deleted " + ", ".join(pruned) + " (no longer desired)")
    if stall and not _was_stalled_same(previous, stall):
        emit("Warning", stall.reason, stall.message)
    for event in (planner.events if planner and stall is None else ()):
        emit(*event)
    for ev in (rolled.events if rolled is not None and stall is None else ()):
        emit("Warning" if ev.warning else "Normal", ev.reason, ev.message)
    if status != previous:
        try:
            outcome.body = kube.patch_status(namespace, name, status, meta["resourceVersion"])
            outcome.status_written = True
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            outcome.conflict = True
            log.info("status of %s/%s changed under us; passing again from a fresh read", namespace, name)
    return outcome


def _owner(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"], "uid": meta["uid"]}


def _rollout(kube: Kube, body: dict[str, Any], obj: api.V41FlashDeployment, previous: dict[str, Any],
             live: dict[ChildRef, dict[str, Any]], planner: PlannerOutcome | None
             ) -> tuple[RolloutPass, list[dict[str, Any]]]:
    """One rollout pass from what runs: pods, workloads, ControllerRevisions, the step's figures."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    pods = progress.pod_dicts(kube.list_pods(namespace, L.label_selector({L.DEPLOYMENT_LABEL: name})))
    records = kube.list_controller_revisions(namespace, name, uid)
    _recorded.setdefault(uid, set()).update(
        (r["metadata"].get("labels") or {}).get(L.REVISION_LABEL, "") for r in records)
    # the newest annotations (a rollout action is an annotation: it moves no generation, so the prepared
    # model may carry older ones)
    obj = obj.model_copy(update={"metadata": {**obj.metadata, "annotations": dict(meta.get("annotations") or {})}})
    state = M.State.from_status(previous.get("rollout"))
    now = time.time()
    view = STEP_FIGURES.observe(uid, state, pods, now, obj.spec.slo.ttft.percentile / 100)
    world = World(now=now, workloads=[o for r, o in live.items() if r.kind in WORKLOAD_KINDS], pods=pods,
                  controller_revisions=records, figures=view.figures, old_live_requests=view.old_live_requests,
                  serving_requests=view.serving_requests, retiring_live_requests=view.retiring_live_requests)
    replicas = desired_replicas(obj.spec, previous, planner.desired if planner else None)
    out = rollout_pass(obj, previous, world, replicas, _owner(body),
                       operator_namespace=os.environ.get("POD_NAMESPACE") or None)
    return out, records


def _record(kube: Kube, body: dict[str, Any], obj: api.V41FlashDeployment, revision: str) -> None:
    """The ControllerRevision of the spec being rendered, once per revision: after the spec moves on, the
    serving revision is rendered from it (a rollout's serving slot)."""
    meta = body["metadata"]
    cr = controller_revision(meta["name"], meta["namespace"], revision, obj.spec, int(time.time()), _owner(body))
    try:
        kube.create(cr, meta["namespace"])
    except KindNotInstalled:
        return
    except ApiException as exc:
        if namespace_terminating(exc):  # the deployment goes with its namespace: nothing to record
            return
        if exc.status not in (403, 422):
            raise
        # not allowed (RBAC from before rollouts) or refused: serving goes on; a rollout later stalls naming
        # the missing record. Said once per revision, not every pass.
        log.warning("%s/%s: cannot record revision %s in ControllerRevision %s (%s %s): a later rollout of this "
                    "deployment will stall until it can", meta["namespace"], meta["name"], revision,
                    cr["metadata"]["name"], exc.status, exc.reason)
    _recorded.setdefault(meta["uid"], set()).add(revision)


def _keep_records(kube: Kube, namespace: str, uid: str, rolled: RolloutPass, records: list[dict[str, Any]],
                  applied: list[str], pruned: list[str]) -> None:
    """Create the records the pass needs; delete all but the live revisions' and the previous serving one."""
    for cr in rolled.create:
        if kube.create(cr, namespace) is not None:
            applied.append(_label(cr))
        _recorded.setdefault(uid, set()).add(cr["metadata"]["labels"][L.REVISION_LABEL])
    live_revs = {p.revision for p in (rolled.decision.slots if rolled.decision else ())} | {rolled.serving_revision}
    have = {r["metadata"]["name"]: r for r in [*records, *rolled.create]}
    for cr_name in progress.records_to_delete(list(have.values()), live_revs):
        kube.delete(ChildRef(*CONTROLLER_REVISION, cr_name), namespace)
        rev = (have[cr_name]["metadata"].get("labels") or {}).get(L.REVISION_LABEL, "")
        _recorded.get(uid, set()).discard(rev)
        pruned.append(f"ControllerRevision/{cr_name}")


def _read_workloads(kube: Kube, namespace: str, want: frozenset[ChildRef]) -> dict[ChildRef, dict[str, Any]]:
    out = {}
    for ref in want:
        if ref.kind in WORKLOAD_KINDS and (obj := kube.read(ref, namespace)) is not None:
            out[ref] = obj
    return out


def _was_stalled_same(previous: dict[str, Any], stall: Stall) -> bool:
    return any(c.get("type") == "Stalled" and c.get("status") == "True" and c.get("message") == stall.message
               for c in previous.get("conditions") or [])


# What the apiserver says when the cluster has no room for an object (not a problem of the spec):
# a full Service IP or NodePort range, an exhausted ResourceQuota.
_CAPACITY_SIGNS = ("range is full", "exceeded quota", "insufficient quota", "no available", "too many")


def capacity_refusal(exc: ApiException) -> bool:
    text = f"{exc.reason} {_api_message(exc)}".lower()
    return exc.status in (403, 409, 422, 500, 507) and any(sign in text for sign in _CAPACITY_SIGNS)


# Objects others refer to (ServiceAccount, Role, ConfigMap...) go first; then the workloads and the
# RoleBindings. A RoleBinding refers to its Role: the apiserver's RBAC escalation check resolves that Role
# when the binding is written, and answers 404 for a Role not created yet to any writer that is not
# cluster-admin (the chart's least-privilege ServiceAccount: found by the install e2e). Within a wave
# nothing depends on anything else, so each wave is applied concurrently.
SECOND_WAVE_KINDS = (*WORKLOAD_KINDS, "RoleBinding")


def _waves(desired: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    first = [o for o in desired if o["kind"] not in SECOND_WAVE_KINDS]
    second = [o for o in desired if o["kind"] in SECOND_WAVE_KINDS]
    return [w for w in (first, second) if w]


class NamespaceTerminating(Exception):
    """The namespace is being deleted: the apiserver refuses new objects in it (403 NamespaceTerminating),
    and the deployment goes with it. Not a failure to retry."""


def _owner_text(obj: dict[str, Any]) -> str:
    owners = obj.get("metadata", {}).get("ownerReferences") or []
    if not owners:
        return "no owner"
    return "owned by " + ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in owners)


def name_collisions(kube: Kube, namespace: str, uid: str, desired: list[dict[str, Any]],
                    live: dict[ChildRef, dict[str, Any]], known: dict[ChildRef, str]) -> Stall | None:
    """An existing object with a child's name that this deployment does not own (no ownerReference to its
    uid) is someone else's: never adopt it. Server-side apply with force would overwrite it and the
    ownerReference would have garbage collection delete it with the CR. Checked before anything is applied;
    children listed as ours or applied by us before (known) cost no call, the rest are read concurrently
    from the apiserver's watch cache (no etcd read per child of a new deployment)."""
    unknown = [ChildRef.of(o) for o in desired if ChildRef.of(o) not in live and ChildRef.of(o) not in known]
    taken = []
    for ref, existing in zip(unknown, kube.read_many(unknown, namespace, cached=True)):
        if isinstance(existing, KindNotInstalled):  # uninstalled since discovery: nothing applied yet
            return Stall("KindNotInstalled", str(existing))
        if isinstance(existing, BaseException):
            raise existing
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
               applied: list[str], versions: dict[ChildRef, str]) -> tuple[Stall | None, bool]:
    """(stall, refused-for-capacity). An error that is neither a stall nor capacity is raised (retried)."""
    for wave in _waves(desired):
        results = kube.apply_many(wave, namespace)
        for obj, after in zip(wave, results):
            if isinstance(after, BaseException):
                continue
            ref = ChildRef.of(obj)
            before = (live.get(ref) or {}).get("metadata", {}).get("resourceVersion") or versions.get(ref)
            live[ref] = after
            versions[ref] = after.get("metadata", {}).get("resourceVersion")
            if versions[ref] != before:
                applied.append(_label(obj))
        for obj, exc in zip(wave, results):
            if not isinstance(exc, BaseException):
                continue
            if isinstance(exc, KindNotInstalled):
                return Stall("KindNotInstalled", str(exc)), False
            if isinstance(exc, ApiException) and namespace_terminating(exc):
                raise NamespaceTerminating(f"namespace {namespace} is being deleted") from None
            if isinstance(exc, ApiException) and capacity_refusal(exc):
                return Stall("CapacityExhausted", f"the cluster refused {_label(obj)} for capacity: "
                                                  f"{_api_message(exc) or exc.reason}; retrying with backoff"), True
            if isinstance(exc, ApiException) and exc.status in (400, 422):
                # the apiserver refuses what we rendered: permanent until the spec changes
                return Stall("ApplyRejected", f"{_label(obj)}: {exc.reason}: {_api_message(exc)}"), False
        for exc in results:
            if isinstance(exc, BaseException):
                raise exc
    return None, False


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
            pod_revisions: Callable[[], dict[str, tuple[int, int]]] | None = None, slot: str = "",
            rolled: RolloutPass | None = None) -> dict[str, Any]:
    """pod_revisions is called (one pod list) only while engine pods of another revision may be live: the
    serving revision is another one, or a role's workload may still run pods of an older template. So a
    deployment at rest, or one whose pods cannot be scheduled, lists no pods on its periodic passes."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    by_name = {ref.name: o for ref, o in live.items() if ref.kind in (DEPLOYMENT, LEADER_WORKER_SET)}
    workloads = {role: workload_state(by_name.get(slot_workload_name(name, role, slot))) for role in ROLES}
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
    pods = None
    if revision is not None and pod_revisions is not None and (
            previous.get("servingRevision") not in (None, revision)
            or any(may_run_older_pods(workloads[role]) for role in ROLES if enabled.get(role))):
        pods = pod_revisions()
    status = compute_status(
        generation=generation, enabled=enabled, desired=desired, workloads=workloads, router=router,
        router_desired=router_desired, gpus_per_replica=gpus,
        router_service=service_address(name, namespace), stall=stall, previous=previous, now=now,
        revision=revision, pod_revisions=pods)
    if planner is not None and stall is None:
        status.update(planner.status)
    if rolled is not None:
        _rollout_status(status, rolled, previous, generation, now)
    status["conditions"] = _planner_conditions(status["conditions"], previous, planner if stall is None else None,
                                               generation, now)
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


__all__ = ["reconcile", "desired_replicas", "Outcome", "WorkloadState"]
