"""Two live revisions side by side during a rollout (docs/decisions/2026-12-01-rollouts.md §4.1-4.2): pure.

A revision lives in a slot. Slot "" is the layout of a deployment that has never rolled out (``render()``:
workloads ``<cr>-<role>``, one router pod with the session proxy in front of vllm-router); "a" and "b" are the
rollout slots, with workloads ``<cr>-<role>-<slot>`` whose selectors carry the slot label. Once a deployment
has slots (``render_slots``), every live slot has its own vllm-router Deployment and Service,
``<cr>-router-<slot>`` ("0" for slot ""), that discovers only engine pods labelled with that slot's serving
revision, so a router can pair a prefill and a decode of its own revision only. The front, ``<cr>-router``
(the Service clients call), runs the session proxy alone, which splits new sessions between the slots'
routers by the routing table in the ConfigMap (``routes.json``, proxy/revisions.py) and keeps known
sessions on their revision.

The serving revision comes from its own spec (the record of what it was rendered from: the controller keeps
it in a ControllerRevision), the candidate from the current spec; the router settings, the SLO, the drain
deadline and the front come from the current spec (none of them is part of a revision).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..api import v1alpha1 as api
from ..proxy.revisions import ROUTES_FILE_NAME, Route, table_json
from ..render import gateway
from ..render import labels as L
from ..render.engine import engine_workload, replica_commands
from ..render.network import network_policies
from ..render.objects import config_map, pdb, role_service
from ..render.resolve import resolve
from ..render.revision import serving_revision, stamp_revision
from ..render.router import ROUTER_INTERNAL_PORT, SERVICE_PORT, router_args, router_objects, session_proxy_container
from ..render.timing import PodTiming, drain_seconds
from .machine import RoleObs, SlotObs, SlotPlan
from .pods import is_ready, labels_of

ROUTES_CONFIG_KEY = ROUTES_FILE_NAME
ROUTES_MOUNT_DIR = "/etc/v41flash/routes"


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
    return L.child_name(cr_name, f"{L.ROUTER}-{slot or '0'}")


def slot_workload_name(cr_name: str, role: str, slot: str) -> str:
    return L.child_name(cr_name, f"{role}-{slot}" if slot else role)


def slot_router_url(cr_name: str, namespace: str, slot: str) -> str:
    return f"http://{slot_router_name(cr_name, slot)}.{namespace}.svc:{SERVICE_PORT}"


def serving_router_name(cr_name: str) -> str:
    """The Service in front of the serving slot's router: the front's --upstream (used only while the routing
    table cannot be read). Its selector follows the serving slot, so a promotion never changes the front's pod
    template (a front restart would forget which revision each live session is on)."""
    return L.child_name(cr_name, f"{L.ROUTER}-serving")


def _templates(w: dict[str, Any]) -> list[dict[str, Any]]:
    if w["kind"] == "Deployment":
        return [w["spec"]["template"]]
    lwt = w["spec"]["leaderWorkerTemplate"]
    return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t is not None]


def _in_slot(w: dict[str, Any], cr_name: str, slot: str) -> dict[str, Any]:
    """A rendered engine workload moved into a slot: its name, the slot label on it and its pods, and in a
    Deployment's selector. Slot "" is the workload as rendered."""
    if not slot:
        return w
    w = copy.deepcopy(w)
    role = w["metadata"]["labels"][L.ROLE_LABEL]
    w["metadata"]["name"] = slot_workload_name(cr_name, role, slot)
    w["metadata"]["labels"][L.SLOT_LABEL] = slot
    if w["kind"] == "Deployment":
        w["spec"]["selector"]["matchLabels"][L.SLOT_LABEL] = slot
    for t in _templates(w):
        t["metadata"]["labels"][L.SLOT_LABEL] = slot
    return w


def slot_engines(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, replicas: dict[str, int | None] | None,
                 slot: str, owner: dict[str, Any] | None, timing: PodTiming) -> tuple[str, list[dict[str, Any]]]:
    """(revision, engine workloads of one slot). The revision is the hash of the workloads as render() makes
    them, so it does not depend on the slot a revision runs in."""
    res = resolve(spec)
    effective = {rr.role: (None if rr.replicas_managed_by == "external" else
                           ((replicas or {}).get(rr.role) if (replicas or {}).get(rr.role) is not None
                            else rr.min_replicas)) for rr in res.enabled_roles}
    engines = [engine_workload(cr_name, namespace, spec, res, rr.role, effective, owner, timing)
               for rr in res.enabled_roles]
    revision = serving_revision(engines)
    for w in engines:
        stamp_revision(w, revision)
    return revision, [_in_slot(w, cr_name, slot) for w in engines]


def _slot_router(cr_name: str, namespace: str, front: api.V41FlashDeploymentSpec, s: SlotSpec, revision: str,
                 owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """vllm-router alone for one slot: discovery scoped to the slot's revision, on the internal port (its admin
    API is reachable only from the front's proxy pods, network.py)."""
    spec = s.spec.model_copy(update={"routing": front.routing})
    res = resolve(spec)
    objs = router_objects(cr_name, namespace, spec, res, owner)
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    service = next(o for o in objs if o["kind"] == "Service")
    name = slot_router_name(cr_name, s.slot)
    sel = {**L.selector_labels(cr_name, L.ROUTER), L.SLOT_LABEL: s.slot or "0"}
    for o in (deployment, service):
        o["metadata"]["name"] = name
        o["metadata"]["labels"][L.SLOT_LABEL] = s.slot or "0"
        o["metadata"]["labels"][L.REVISION_LABEL] = revision
    deployment["spec"]["selector"]["matchLabels"] = dict(sel)
    pod = deployment["spec"]["template"]
    pod["metadata"]["labels"].update({L.SLOT_LABEL: s.slot or "0", L.REVISION_LABEL: revision})
    pod["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] = dict(sel)
    # The router pod's vllm-router container alone (the front runs the session proxy), listening on the pod IP.
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "router")
    pod["spec"]["containers"] = [container]
    args = container["args"]
    # Discovery: only engine pods of this revision (the label is set at pod creation and never changed).
    for flag in ("--prefill-selector", "--decode-selector", "--selector"):
        if flag in args:
            i = args.index(flag) + 1
            while i < len(args) and not args[i].startswith("--"):
                i += 1
            args.insert(i, f"{L.REVISION_LABEL}={revision}")
    args[args.index("--host") + 1] = "0.0.0.0"
    args[args.index("--port") + 1] = str(ROUTER_INTERNAL_PORT)
    container["ports"] = [{"name": "http", "containerPort": ROUTER_INTERNAL_PORT, "protocol": "TCP"},
                          *(p for p in container["ports"] if p["name"] != "http")]
    # /readiness answers 503 until the router has healthy workers: no traffic to an empty pool.
    container["readinessProbe"] = {"httpGet": {"path": "/readiness", "port": "http"},
                                   "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3}
    container["livenessProbe"] = {"httpGet": {"path": "/liveness", "port": "http"},
                                  "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}
    service["spec"]["selector"] = dict(sel)
    return [deployment, service]


def _front(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, serving_slot: str,
           owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``<cr>-router``: the session proxy alone, reading the routing table; its ServiceAccount/Role/
    RoleBinding are the slot routers' too (pod discovery)."""
    res = resolve(spec)
    objs = router_objects(cr_name, namespace, spec, res, owner)
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    service = next(o for o in objs if o["kind"] == "Service")
    pod = deployment["spec"]["template"]
    proxy = session_proxy_container(spec)
    i = proxy["args"].index("--upstream")
    proxy["args"][i + 1] = f"http://{serving_router_name(cr_name)}.{namespace}.svc:{SERVICE_PORT}"
    proxy["args"] += ["--routes-file", f"{ROUTES_MOUNT_DIR}/{ROUTES_CONFIG_KEY}",
                      "--session-ttl-seconds", str(spec.routing.session_affinity_ttl_seconds or 600)]
    proxy["volumeMounts"] = [{"name": "routes", "mountPath": ROUTES_MOUNT_DIR, "readOnly": True}]
    # The front's own metrics: the proxy's, on its serving port (/proxy/metrics).
    pod["spec"]["containers"] = [proxy]
    pod["spec"]["volumes"] = [{"name": "routes", "configMap": {
        "name": L.config_name(cr_name), "items": [{"key": ROUTES_CONFIG_KEY, "path": ROUTES_CONFIG_KEY}]}}]
    pod["metadata"]["labels"][L.FRONT_LABEL] = "true"
    service["spec"]["selector"] = {**L.selector_labels(cr_name, L.ROUTER), L.FRONT_LABEL: "true"}
    service["spec"]["ports"] = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    serving_service = copy.deepcopy(next(o for o in objs if o["kind"] == "Service"))
    serving_service["metadata"]["name"] = serving_router_name(cr_name)
    serving_service["spec"]["selector"] = {**L.selector_labels(cr_name, L.ROUTER), L.SLOT_LABEL: serving_slot or "0"}
    serving_service["spec"]["ports"] = [p for p in serving_service["spec"]["ports"] if p["name"] == "http"]
    return [o for o in objs if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")] + [deployment, service,
                                                                                            serving_service]


def routes(cr_name: str, namespace: str, slots: Sequence[SlotSpec], revisions: dict[str, str]) -> list[Route]:
    """The routing table: the candidate (the slot with the smaller share that takes new sessions) first, so a
    growing share only adds sessions to it; draining slots last with share 0."""
    taking = sorted((s for s in slots if s.accept_new), key=lambda s: s.share)
    rest = [s for s in slots if not s.accept_new and s.routed]
    return [Route(revisions[s.slot], slot_router_url(cr_name, namespace, s.slot), s.share if s.accept_new else 0,
                  s.accept_new) for s in [*taking, *rest]]


def render_slots(obj: api.V41FlashDeployment, slots: Sequence[SlotSpec], owner: dict[str, Any] | None = None,
                 timing: PodTiming | None = None, operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Every desired object of a deployment whose engines live in slots (one or two), in render()'s order:
    the ConfigMap (with the routing table), per role its Service and PDB (over all slots), each slot's engine
    workloads, the front, each slot's router, the NetworkPolicies."""
    if not slots or len(slots) > 2 or len({s.slot for s in slots}) != len(slots):
        raise ValueError(f"render_slots: want one or two distinct slots, got {[s.slot for s in slots]}")
    taking = [s for s in slots if s.accept_new]
    if not taking or sum(s.share for s in taking) != 100:
        raise ValueError("render_slots: the shares of the slots that take new sessions must add up to 100")
    name = obj.metadata["name"]
    namespace = obj.metadata.get("namespace") or "default"
    spec = obj.spec
    timing = timing or PodTiming()
    res = resolve(spec)
    revisions: dict[str, str] = {}
    engines: list[dict[str, Any]] = []
    roles: list[str] = []
    for s in slots:
        rev, ws = slot_engines(name, namespace, s.spec, s.replicas, s.slot, owner, timing)
        revisions[s.slot] = rev
        engines += ws
        roles += [w["metadata"]["labels"][L.ROLE_LABEL] for w in ws if w["metadata"]["labels"][L.ROLE_LABEL]
                  not in roles]
    serving = max(taking, key=lambda s: s.share)
    commands = {rr.role: replica_commands(spec, res, rr.role) for rr in res.enabled_roles}
    effective = {rr.role: (serving.replicas or {}).get(rr.role) for rr in res.enabled_roles}
    cm = config_map(name, namespace, spec, res, commands, effective, router_args(name, namespace, spec, res), timing,
                    drain_seconds(spec.slo.e2e_p95_seconds), revisions[serving.slot], owner)
    gateway_mode = gateway.is_gateway(spec)
    if not gateway_mode:
        cm["data"][ROUTES_CONFIG_KEY] = table_json(routes(name, namespace, slots, revisions))
    out: list[dict[str, Any]] = [cm]
    for role in sorted(roles, key=lambda r: ("prefill", "decode").index(r)):
        out.append(role_service(name, namespace, role, owner))
        out.append(pdb(name, namespace, role, owner))
        out += [w for w in engines if w["metadata"]["labels"][L.ROLE_LABEL] == role]
    if gateway_mode:
        out += _gateway_slots(name, namespace, spec, slots, revisions, serving, owner)
    else:
        out += _front(name, namespace, spec, serving.slot, owner)
        for s in slots:
            out += _slot_router(name, namespace, spec, s, revisions[s.slot], owner)
        out.append(pdb(name, namespace, L.ROUTER, owner))
    metrics = spec.autoscaling.metrics
    out += network_policies(name, namespace, roles, owner, operator_namespace,
                            metrics.prometheus.scraped_by if metrics.source == "Prometheus" and metrics.prometheus else None,
                            slot_routers=not gateway_mode,
                            gateway=gateway.gateway_settings(spec) if gateway_mode else None)
    return out


def _gateway_slots(cr_name: str, namespace: str, front: api.V41FlashDeploymentSpec, slots: Sequence[SlotSpec],
                   revisions: dict[str, str], serving: SlotSpec, owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Mode Gateway's share of render_slots (render/gateway.py): the pickers' RBAC, per slot a picker and a pool
    of its revision, the front pool and Service on the serving slot, and the HTTPRoute: the serving share on the
    front pool, the candidate's on its slot's pool, 0 for a slot that takes no new requests. A slot out of the
    routing table (a rolled-back candidate finishing) keeps its picker, outside the route."""
    out = gateway.epp_shared(cr_name, namespace, owner)
    for s in slots:
        spec = s.spec.model_copy(update={"routing": front.routing})  # the picker's settings: the current spec's
        out += gateway.epp_slot(cr_name, namespace, spec, resolve(spec), owner, slot=s.slot,
                                revision=revisions[s.slot])
    out += gateway.epp_front(cr_name, namespace, owner, serving_slot=serving.slot, revision=revisions[serving.slot])
    pools = [(gateway.pool_name(cr_name) if s is serving else gateway.pool_name(cr_name, s.slot),
              s.share if s.accept_new else 0) for s in slots if s.routed]
    route = gateway.http_route(cr_name, namespace, front, owner, pools)
    return out + ([route] if route is not None else [])


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
    """SlotSpecs for render_slots from the rollout machine's slot plans: each revision's
    spec (the ControllerRevision's, the current spec's for the candidate), the serving slot at the planner's
    size less what InPlace handed over (never below one replica), the others at their planned size."""
    out = []
    for p in slots:
        if p.revision not in specs:
            raise ValueError(f"no recorded spec for revision {p.revision} (slot {p.slot or 'legacy'}): its "
                             "ControllerRevision is missing")
        if p.replicas is not None:
            replicas: dict[str, int | None] | None = dict(p.replicas)
        elif serving_replicas is not None and p.minus:
            replicas = {r: (None if n is None else max(1, n - p.minus)) for r, n in serving_replicas.items()}
        else:
            replicas = serving_replicas if p.kind == "serving" else None
        out.append(SlotSpec(p.slot, specs[p.revision], replicas, p.share, p.accept_new))
    return out
