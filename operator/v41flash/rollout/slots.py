"""What a rollout reads back and hands the renderer (pure): the record of a revision (a ControllerRevision holding
the spec it was rendered from, so the serving slot can be rendered after the spec has moved on), what one slot
runs (slot_observation), and the SlotSpecs render() takes from the rollout machine's slot plans (slot_specs).
What a slot is made of is render/slots.py's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import v1alpha1 as api
from ..render import gateway
from ..render import labels as L
from ..render.slots import SlotSpec, slot_router_name, slot_workload_name
from .machine import RoleObs, SlotObs, SlotPlan
from ..pods import is_ready, labels_of

# --- what the controller reads back (pure) -------------------------------------------------------

CONTROLLER_REVISION_API = "apps/v1"


def controller_revision(cr_name: str, namespace: str, revision: str, spec: api.V41FlashDeploymentSpec, number: int,
                        owner: dict[str, Any] | None) -> dict[str, Any]:
    """The record of one revision (apps/v1 ControllerRevision ``<cr>-<revision>``): the spec it was rendered
    from, so the serving slot can be rendered after the spec has moved on."""
    meta = L.metadata(cr_name, namespace, L.child_name(cr_name, revision), "config", owner)
    meta["labels"][L.REVISION_LABEL] = revision
    return {"apiVersion": CONTROLLER_REVISION_API, "kind": "ControllerRevision", "metadata": meta,
            "revision": int(number), "data": {"spec": spec.model_dump(by_alias=True, exclude_none=True)}}


def spec_of(controller_revision_obj: dict[str, Any]) -> api.V41FlashDeploymentSpec:
    """The spec a ControllerRevision records; ValueError naming the object when it is not one of ours."""
    name = controller_revision_obj.get("metadata", {}).get("name", "?")
    data = controller_revision_obj.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        raise ValueError(f"ControllerRevision {name}: data.spec missing")
    try:
        return api.V41FlashDeploymentSpec.model_validate(data["spec"])
    except Exception as e:  # noqa: BLE001 - pydantic's error, named
        raise ValueError(f"ControllerRevision {name}: data.spec is not a valid spec: {str(e)[:200]}") from None


def _pod_problem(pod: dict[str, Any]) -> str:
    st = pod.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{pod['metadata']['name']}: {waiting['reason']}"
        if cs.get("restartCount"):
            return f"{pod['metadata']['name']}: {cs['restartCount']} restarts"
    return f"{pod['metadata']['name']}: not Ready"


def _unschedulable(pod: dict[str, Any]) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c.get("message") or c.get("reason") or "Unschedulable"
    return ""


def slot_observation(cr_name: str, slot: str, revision: str, workloads: Sequence[dict[str, Any]],
                     pods: Sequence[dict[str, Any]], routers: Sequence[dict[str, Any]], roles: Sequence[str]
                     ) -> SlotObs:
    """The SlotObs of one slot, counting only what carries ``revision``: a workload whose template is of
    another revision has 0 replicas of it; its pods of another revision are not counted (after a candidate
    was replaced, the older candidate's pods still in the slot are not the new one's)."""
    out = {}
    for role in roles:
        name = slot_workload_name(cr_name, role, slot)
        w = next((x for x in workloads if x["metadata"]["name"] == name), None)
        replicas = 0
        if w is not None and labels_of(w).get(L.REVISION_LABEL) == revision:
            replicas = int((w.get("spec") or {}).get("replicas") or 0)
        mine = [p for p in pods if labels_of(p).get(L.ROLE_LABEL) == role
                and labels_of(p).get(L.SERVING_LABEL) == "true"
                and labels_of(p).get(L.SLOT_LABEL, "") == slot and labels_of(p).get(L.REVISION_LABEL) == revision
                and not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in mine if is_ready(p)]
        unsched = next((u for u in map(_unschedulable, mine) if u), "")
        problems = tuple(sorted(_pod_problem(p) for p in mine if not is_ready(p) and not _unschedulable(p)))
        out[role] = RoleObs(replicas=replicas, ready=len(ready), unschedulable=unsched, problems=problems)
    rnames = (slot_router_name(cr_name, slot), gateway.epp_name(cr_name, slot))  # vllm-router's, or the picker
    r = next((x for x in routers if x["metadata"]["name"] in rnames), None)
    router_ready = bool(r is not None and labels_of(r).get(L.REVISION_LABEL) == revision
                        and ((r.get("status") or {}).get("readyReplicas") or 0) >= 1)
    return SlotObs(out, router_ready=router_ready)


def slot_specs(slots: Sequence[SlotPlan], specs: dict[str, api.V41FlashDeploymentSpec],
               serving_replicas: dict[str, int | None] | None) -> list[SlotSpec]:
    """SlotSpecs for render() from the rollout machine's slot plans: each revision's
    spec (the ControllerRevision's, the current spec's for the candidate), the serving slot at the planner's
    size less what InPlace handed over (never below one replica), the others at their planned size."""
    out = []
    for p in slots:
        if p.revision not in specs:
            raise ValueError(f"no recorded spec for revision {p.revision} (slot {p.slot!r}): its "
                             "ControllerRevision is missing")
        if p.replicas is not None:
            replicas: dict[str, int | None] | None = dict(p.replicas)
        elif serving_replicas is not None and p.minus:
            replicas = {r: (None if n is None else max(1, n - p.minus)) for r, n in serving_replicas.items()}
        else:
            replicas = serving_replicas if p.kind == "serving" else None
        out.append(SlotSpec(p.slot, specs[p.revision], replicas, p.share, p.accept_new))
    return out
