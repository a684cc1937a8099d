"""What a watch event means: the watch handlers only record what was delivered and ask for a pass.

* A V41FlashDeployment's event: keep its newest body (no re-read); ask for a pass when its spec moved (or its
  rollout-action annotation, which moves no generation); a deleted one is forgotten. Level-triggered from the
  watch alone: no kopf change handlers, so kopf writes nothing on the CR (no diff-base annotation racing our
  status write).
* One of our workloads' events (Deployments, LeaderWorkerSets): its status lands in the child cache, so the
  periodic pass and a status change need no API read; its owner gets an observe pass, or a full one (drift
  repair) when it was deleted or its spec changed by someone else.
"""
from __future__ import annotations

import copy
from typing import Any

from ..api import v1alpha1 as api
from .kube import ChildRef
from .runtime import Runtime
from .scheduler import Work


def deployment_event(rt: Runtime, event_type: str | None, body: Any) -> None:
    """First sight in this process: from kopf's initial listing (event type None) it may own children from an
    earlier process (list and prune: "resume"); a new object (ADDED) owns nothing yet ("create")."""
    meta = body["metadata"]
    uid = meta["uid"]
    if event_type == "DELETED":
        if rt.scheduler is not None:
            rt.scheduler.forget(uid)
        rt.memory.forget(uid, meta["namespace"], meta["name"])
        return
    old = rt.memory.body(uid)
    rt.memory.remember(copy.deepcopy(dict(body)))  # kopf hands out read-only views of the raw event object
    if meta.get("deletionTimestamp"):
        return
    if old is None:
        reason = "create" if event_type == "ADDED" else "resume"
        rt.request(uid, Work(trigger=reason, full=True, prune=reason == "resume"))
    elif old["metadata"].get("generation") != meta.get("generation"):
        rt.request(uid, Work(trigger="update", full=True))  # lists only if the desired set moved
    elif _rollout_action(old["metadata"]) != _rollout_action(meta):  # kubectl annotate ... rollout-action=<verb>/<rev>
        rt.request(uid, Work(trigger="update", full=True))


def child_event(rt: Runtime, event_type: str | None, body: Any) -> None:
    """A workload of ours changed: its owner's status may have (observe). Deleted, or its spec changed by
    someone else (a generation our own apply did not return): re-apply at once (drift repair)."""
    children = rt.memory.children
    old = children.get(body)
    owner, changed = children.update(event_type, body)
    if owner is None or rt.memory.body(owner) is None or not changed:
        return
    meta = body.get("metadata") or {}
    ref = ChildRef(body["apiVersion"], body["kind"], meta.get("name"))
    applied_rv = rt.memory.of(owner).applied_rv
    ours = applied_rv.get(ref)
    if event_type == "DELETED" and not _newer(ours, meta.get("resourceVersion")):
        # no longer ours: the next pass reads the name again (someone else may have taken it) before it applies
        applied_rv.pop(ref, None)
    drifted = event_type == "DELETED" or (old is not None and old["metadata"]["generation"] != meta.get("generation")
                                          and ours != meta.get("resourceVersion"))
    rt.request(owner, Work(trigger="child", full=drifted))


def _newer(recorded: str | None, deleted: str | None) -> bool:
    """Whether the version we recorded is newer than a DELETED event's (a pass re-created the child before the
    event was handled). Versions compared as numbers (etcd's revision); unknown → not newer."""
    try:
        return recorded is not None and deleted is not None and int(recorded) > int(deleted)
    except ValueError:
        return False


def _rollout_action(meta: Any) -> str | None:
    """The rollout-action annotation: it moves no generation, so its change alone asks for a pass."""
    return (meta.get("annotations") or {}).get(api.ROLLOUT_ACTION_ANNOTATION)
