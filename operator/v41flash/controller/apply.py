"""Writing a pass's children: refuse a name someone else's object holds (never adopt), then server-side apply
in two waves (what others refer to first), telling a stall (the apiserver refuses the spec, a kind is missing,
no room) from an error to retry."""
from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..render.resolve import DEPLOYMENT, LEADER_WORKER_SET
from .kube import ChildRef, KindNotInstalled, KubeAPI, namespace_terminating
from .status import Stall

WORKLOAD_KINDS = (DEPLOYMENT, LEADER_WORKER_SET)


def label(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


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


def name_collisions(kube: KubeAPI, namespace: str, uid: str, desired: list[dict[str, Any]],
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


def apply_all(kube: KubeAPI, namespace: str, desired: list[dict[str, Any]], live: dict[ChildRef, dict[str, Any]],
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
                applied.append(label(obj))
        for obj, exc in zip(wave, results):
            if not isinstance(exc, BaseException):
                continue
            if isinstance(exc, KindNotInstalled):
                return Stall("KindNotInstalled", str(exc)), False
            if isinstance(exc, ApiException) and namespace_terminating(exc):
                raise NamespaceTerminating(f"namespace {namespace} is being deleted") from None
            if isinstance(exc, ApiException) and capacity_refusal(exc):
                return Stall("CapacityExhausted", f"the cluster refused {label(obj)} for capacity: "
                                                  f"{_api_message(exc) or exc.reason}; retrying with backoff"), True
            if isinstance(exc, ApiException) and exc.status in (400, 422):
                # the apiserver refuses what we rendered: permanent until the spec changes
                return Stall("ApplyRejected", f"{label(obj)}: {exc.reason}: {_api_message(exc)}"), False
        for exc in results:
            if isinstance(exc, BaseException):
                raise exc
    return None, False


def _api_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message", "")
    except (TypeError, ValueError):
        return str(exc.body or "")
