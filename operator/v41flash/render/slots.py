"""A deployment is a front plus one or two slots (docs/decisions/2026-12-07-one-renderer.md): pure.

A revision lives in a slot. Slot "" is where a deployment's first revision runs (workloads ``<cr>-<role>``);
"a" and "b" are the rollout slots, with workloads ``<cr>-<role>-<slot>`` whose selectors carry the slot label.
Every live slot has its own vllm-router Deployment and Service, ``<cr>-router-<slot>`` ("0" for slot ""),
that discovers only engine pods labelled with that slot's serving revision, so a router pairs a prefill and a
decode of its own revision only. The front, ``<cr>-router`` (the Service clients call), runs the session proxy
alone, which splits new sessions between the slots' routers by the routing table in the ConfigMap
(``routes.json``, proxy/revisions.py) and keeps known sessions on their revision. In mode Gateway each slot has
its endpoint picker and pool instead (render/gateway.py).

The rollout machine decides the slots (rollout/); this module says what a slot is made of.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..api import v1alpha1 as api
from ..proxy.revisions import Route
from ..roles import FIRST_SLOT
from . import labels as L
from .engine import engine_workload
from .resolve import Resolved, resolve
from .revision import serving_revision, stamp_revision
from .ports import SERVICE_PORT
from .timing import PodTiming



@dataclass(frozen=True)
class SlotSpec:
    """One live slot: the spec its revision is rendered from, its replicas, its share of new sessions."""
    slot: str
    spec: api.V41FlashDeploymentSpec
    replicas: dict[str, int | None] | None = None
    share: int = 100
    accept_new: bool = True
    routed: bool = True  # False: out of the routing table (a rolled-back candidate finishing its requests)


def slot_router_name(cr_name: str, slot: str) -> str:
    return L.child_name(cr_name, f"{L.ROUTER}-{L.slot_tag(slot)}")


def slot_workload_name(cr_name: str, role: str, slot: str) -> str:
    return L.child_name(cr_name, f"{role}-{slot}" if slot else role)


def slot_router_url(cr_name: str, namespace: str, slot: str) -> str:
    return f"http://{slot_router_name(cr_name, slot)}.{namespace}.svc:{SERVICE_PORT}"


def effective_replicas(res: Resolved, replicas: dict[str, int | None] | None) -> dict[str, int | None]:
    """Per enabled role: None for an external owner (HPA/KEDA), the asked replicas, else minReplicas."""
    out: dict[str, int | None] = {}
    for rr in res.enabled_roles:
        want = (replicas or {}).get(rr.role)
        out[rr.role] = None if rr.replicas_managed_by == "external" else rr.min_replicas if want is None else want
    return out


def _templates(w: dict[str, Any]) -> list[dict[str, Any]]:
    if w["kind"] == "Deployment":
        return [w["spec"]["template"]]
    lwt = w["spec"]["leaderWorkerTemplate"]
    return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t is not None]


def _in_slot(w: dict[str, Any], cr_name: str, slot: str) -> dict[str, Any]:
    """A rendered engine workload moved into a slot: its name, the slot label on it and its pods, and in a
    Deployment's selector; the claim templates its pods name (render/compute_domain.py, render/dra.py) are the
    slot's. Slot "" is the workload as rendered."""
    if not slot:
        return w
    w = copy.deepcopy(w)
    role = w["metadata"]["labels"][L.ROLE_LABEL]
    rendered = w["metadata"]["name"]
    w["metadata"]["name"] = slot_workload_name(cr_name, role, slot)
    w["metadata"]["labels"][L.SLOT_LABEL] = slot
    if w["kind"] == "Deployment":
        w["spec"]["selector"]["matchLabels"][L.SLOT_LABEL] = slot
    for t in _templates(w):
        t["metadata"]["labels"][L.SLOT_LABEL] = slot
        for claim in t["spec"].get("resourceClaims") or []:  # templates named after the workload: the slot's
            claim["resourceClaimTemplateName"] = w["metadata"]["name"] + \
                claim["resourceClaimTemplateName"].removeprefix(rendered)
    return w


def slot_engines(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, replicas: dict[str, int | None] | None,
                 slot: str, owner: dict[str, Any] | None, timing: PodTiming) -> tuple[str, list[dict[str, Any]]]:
    """(revision, engine workloads of one slot). The revision is the hash of the workloads as slot "" has them,
    so it does not depend on the slot a revision runs in."""
    res = resolve(spec)
    effective = effective_replicas(res, replicas)
    engines = [engine_workload(cr_name, namespace, spec, res, rr.role, effective, owner, timing)
               for rr in res.enabled_roles]
    revision = serving_revision(engines)
    for w in engines:
        stamp_revision(w, revision)
    return revision, [_in_slot(w, cr_name, slot) for w in engines]


def spec_revision(obj: api.V41FlashDeployment, timing: PodTiming | None = None) -> str:
    """The serving revision a deployment's spec renders (its engines' hash; replicas are not part of it)."""
    name = obj.metadata["name"]
    return slot_engines(name, obj.metadata.get("namespace") or "default", obj.spec, None, FIRST_SLOT, None,
                        timing or PodTiming())[0]


def routes(cr_name: str, namespace: str, slots: Sequence[SlotSpec], revisions: dict[str, str]) -> list[Route]:
    """The routing table: the candidate (the slot with the smaller share that takes new sessions) first, so a
    growing share only adds sessions to it; draining slots last with share 0."""
    taking = sorted((s for s in slots if s.accept_new), key=lambda s: s.share)
    rest = [s for s in slots if not s.accept_new and s.routed]
    return [Route(revisions[s.slot], slot_router_url(cr_name, namespace, s.slot), s.share if s.accept_new else 0,
                  s.accept_new) for s in [*taking, *rest]]


def check_slots(slots: Sequence[SlotSpec]) -> SlotSpec:
    """The serving slot (the largest share of those taking new sessions); ValueError for an impossible set."""
    if not slots or len(slots) > 2 or len({s.slot for s in slots}) != len(slots):
        raise ValueError(f"render: want one or two distinct slots, got {[s.slot for s in slots]}")
    taking = [s for s in slots if s.accept_new]
    if not taking or sum(s.share for s in taking) != 100:
        raise ValueError("render: the shares of the slots that take new sessions must add up to 100")
    return max(taking, key=lambda s: s.share)
