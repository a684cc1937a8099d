"""What a V41FlashDeployment wants: its spec validated and rendered at the replicas the operator writes, in the slot
that serves (pure but for a per-deployment cache), and the ownerReference its children carry."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from ..api import v1alpha1 as api
from ..api.validation import validate
from ..render import SlotSpec, render
from ..render.checks import operator_checks
from ..roles import ROLES
from ..rollout.world import resting_slot
from .config import admin_policy
from .memory import DeploymentMemory

log = logging.getLogger(__name__)


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


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"], "uid": meta["uid"]}


def operator_namespace() -> str | None:
    """Where the operator runs (the engines' NetworkPolicy admits its scrapes from there)."""
    return os.environ.get("POD_NAMESPACE") or None


@dataclass(frozen=True)
class Prepared:
    problems: tuple = ()  # what validation refused (then no model and nothing rendered)
    model: api.V41FlashDeployment | None = None
    objects: tuple[dict[str, Any], ...] = ()  # every child the spec renders
    render_failure: str | None = None  # why rendering a valid spec failed (a bug: validation renders too)


def prepare(mem: DeploymentMemory, body: dict[str, Any], previous: dict[str, Any], planned: dict[str, int] | None
            ) -> Prepared:
    """The spec validated and rendered at desired_replicas() in the slot that serves (rollout/world.resting_slot;
    a pass that rolls out renders the slots its decision names instead), kept in `mem` for an unchanged key."""
    meta = body["metadata"]
    slot = resting_slot(previous)
    # what desired_replicas() reads (the spec's bounds are in the spec part of the key): a planner pass that
    # holds at what status records and the periodic pass between planner passes share one entry
    # (a role the spec turns off renders no replicas, whatever status records for it)
    spec_raw = body.get("spec") or {}
    replicas_key = tuple((role, None if (spec_raw.get(role) or {}).get("enabled", True) is False else
                          (planned or {}).get(role, (previous.get(role) or {}).get("desiredReplicas")))
                         for role in ROLES)
    key = (meta.get("generation"), meta.get("resourceVersion") if meta.get("generation") is None else None,
           replicas_key, json.dumps(body.get("spec") or {}, sort_keys=True, default=str), slot)
    hit = mem.prepared
    if hit is not None and hit[0] == key:
        return hit[1]
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": meta, "spec": body.get("spec") or {}}
    # with what this operator's administrator allows (weight cache host paths, Prometheus endpoints)
    problems = validate(doc, extra_checks=operator_checks(admin_policy()))
    obj = api.V41FlashDeployment.model_validate(doc) if not problems else None
    desired_objs: list[dict[str, Any]] = []
    failure: str | None = None
    if obj is not None:
        replicas = desired_replicas(obj.spec, previous, planned)
        try:
            desired_objs = render(obj, [SlotSpec(slot, obj.spec, replicas)], owner=owner_reference(body),
                                  operator_namespace=operator_namespace())
        except Exception as exc:  # noqa: BLE001 - validate renders too; this is the net under it
            log.exception("render of %s/%s failed", meta["namespace"], meta["name"])
            failure = f"spec: the operator cannot render it: {type(exc).__name__}: {str(exc)[:300]}"
    result = Prepared(tuple(problems), obj, tuple(desired_objs), failure)
    if obj is not None:
        # kept under the replicas it rendered: the next pass reads them from the status this one writes (a new
        # CR's first pass has none recorded yet, so its first observe pass missed and rendered again)
        key = (key[0], key[1], tuple((role, replicas.get(role)) for role in ROLES), key[3], slot)
    mem.prepared = (key, result)
    return result
