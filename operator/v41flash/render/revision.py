"""The serving revision: one short, stable hash of everything the engines of a deployment run.

It is computed from the rendered engine workloads, not from a list of spec fields: the pod templates of
both roles (image, the whole vLLM command line, every environment variable, volumes, resources,
probes) and, for a LeaderWorkerSet, the rest of its leaderWorkerTemplate (group size, restart policy). So a
new engine-affecting field is covered the day it is rendered, and the revision changes exactly when
some engine pod would be replaced. Replicas, router settings, SLO targets, autoscaling and the drain
deadline are not in any pod template (the drain deadline is a mounted ConfigMap file, render/timing.py),
so they never change it.

One hash over both roles: a revision is the unit that serves a request (its prefill and its decode), so
a change to either role is a new revision of the pair. Pure.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from . import labels as L

REVISION_LENGTH = 10  # hex digits: a label value, like pod-template-hash


def _pod_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Deployment":
        return [workload["spec"]["template"]]
    lwt = workload["spec"]["leaderWorkerTemplate"]
    return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t is not None]


def _engine_part(workload: dict[str, Any]) -> dict[str, Any]:
    """What of one engine workload its pods are made of (no replicas, no rollout strategy)."""
    w = copy.deepcopy(workload)
    for template in _pod_templates(w):
        template.get("metadata", {}).get("labels", {}).pop(L.REVISION_LABEL, None)
    pods = w["spec"]["template"] if w["kind"] == "Deployment" else w["spec"]["leaderWorkerTemplate"]
    return {"role": w["metadata"]["labels"][L.ROLE_LABEL], "kind": w["kind"], "pods": pods}


def serving_revision(engine_workloads: list[dict[str, Any]]) -> str:
    """The revision of a set of rendered engine workloads (one per enabled role), order-independent."""
    parts = sorted((_engine_part(w) for w in engine_workloads), key=lambda p: p["role"])
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:REVISION_LENGTH]


def stamp_revision(workload: dict[str, Any], revision: str) -> None:
    """Label the workload and each of its pod templates with the revision (in place)."""
    workload["metadata"]["labels"][L.REVISION_LABEL] = revision
    for template in _pod_templates(workload):
        template.setdefault("metadata", {}).setdefault("labels", {})[L.REVISION_LABEL] = revision


def revision_of(objs: list[dict[str, Any]]) -> str | None:
    """The serving revision a rendered object list carries (None without engine workloads)."""
    for obj in objs:
        rev = obj.get("metadata", {}).get("labels", {}).get(L.REVISION_LABEL)
        if rev:
            return rev
    return None
