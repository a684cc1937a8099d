"""The renderer: a V41FlashDeployment and its live slots → every Kubernetes object it needs, as plain dicts (pure).

The only orchestrator of the builders: the controller applies exactly this list (server-side apply) and prunes
the rest, whether or not a rollout runs (the rollout machine decides the slots, rollout/); `v41flash render`
prints it for slot "" alone. A deployment is a front plus one or two slots (render/slots.py). Same input, same
output, same order: the ConfigMap (the routing table, the front's Envoy files), per enabled role its Service and PDB
and each slot's engine workload (after the GPUs' ResourceClaimTemplate with spec.gpu.allocation DRA and the IMEX
ComputeDomain when its replicas span NVL72 trays), then (with spec.startup.weightCache.prefetch) the weight
prefetcher's DaemonSet, then the front (its ServiceAccount, Role, RoleBinding, the Envoy Deployment, Service, the
serving slot's router Service and the front's HorizontalPodAutoscaler), each slot's vllm-router Deployment and Service, the router PDB (mode Gateway
instead: the endpoint pickers' ServiceAccount, Role, RoleBinding, per slot a picker's ConfigMap, Deployment, Service
and pool, the front picker Service and pool, the HTTPRoute when asked for), then the NetworkPolicies.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import v1alpha1 as api
from ..proxy.revisions import table_json
from . import compute_domain, dra, gateway
from . import labels as L
from .engine import gpu_claim_spec, replica_commands
from .network import network_policies
from .objects import config_map, pdb, role_service
from .prefetch import weight_prefetch
from .resolve import Resolved, resolve
from .revision import revision_of
from .router import ROUTES_CONFIG_KEY, front_files, front_objects, router_args, slot_router_objects
from .slots import (FIRST_SLOT, SlotSpec, check_slots, effective_replicas, routes, slot_engines, slot_router_name,
                    spec_revision)
from .timing import PodTiming, drain_seconds

__all__ = ["render", "resolve", "Resolved", "PodTiming", "revision_of", "spec_revision", "SlotSpec", "FIRST_SLOT"]

ROLE_ORDER = ("prefill", "decode")


def render(obj: api.V41FlashDeployment, slots: Sequence[SlotSpec] | None = None, *,
           replicas: dict[str, int | None] | None = None, owner: dict[str, Any] | None = None,
           timing: PodTiming | None = None, operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Every desired object of one deployment.

    slots: the live slots, each with the spec its revision renders, its replicas and share (the rollout machine's
    decision); None = slot "" alone serving obj.spec at `replicas` (a deployment that is not rolling out).
    replicas: desired replicas per role for that default slot; a missing or None entry means the role's
    minReplicas, and a role with replicasManagedBy: external never gets spec.replicas.
    owner: {apiVersion, kind, name, uid} of the CR → ownerReferences on every object; None offline.
    timing: the engine pods' fixed grace period and probe budget (None = the defaults). The preStop drain
    deadline is sized from the SLO's p95 e2e target and written to the ConfigMap, not the pod template.
    Every engine workload and pod is labelled with its serving revision (render/revision.py).
    operator_namespace: where the operator runs (its NetworkPolicy peer); None = any namespace.
    The front, the router settings, the SLO, the drain deadline and the prefetcher come from obj.spec.
    """
    if slots is None:
        slots = [SlotSpec(FIRST_SLOT, obj.spec, replicas)]
    elif replicas is not None:
        raise ValueError("render: replicas belong to the slots (SlotSpec.replicas) when slots are given")
    serving = check_slots(slots)
    name = obj.metadata["name"]
    namespace = obj.metadata.get("namespace") or "default"
    spec = obj.spec
    timing = timing or PodTiming()
    res = resolve(spec)
    revisions: dict[str, str] = {}
    engines: list[dict[str, Any]] = []
    claim_templates: list[dict[str, Any]] = []  # spec.gpu.allocation DRA: each workload's (render/dra.py)
    for s in slots:
        revisions[s.slot], ws = slot_engines(name, namespace, s.spec, s.replicas, s.slot, owner, timing)
        engines += ws
        slot_res = resolve(s.spec)
        claim_templates += [dra.claim_template(w, gpu_claim_spec(slot_res, slot_res.roles[w["metadata"]["labels"][
            L.ROLE_LABEL]]), owner) for w in ws if slot_res.gpu.dra]
    roles = [r for r in ROLE_ORDER if any(w["metadata"]["labels"][L.ROLE_LABEL] == r for w in engines)]
    gateway_mode = gateway.is_gateway(spec)
    if gateway_mode:
        front = _gateway_slots(name, namespace, spec, slots, revisions, serving, owner)
        router_command, proxy_command = ["vllm-router", *router_args(name, namespace, spec, res)], []
    else:
        front = front_objects(name, namespace, spec, serving.slot, owner)
        for s in slots:  # each slot's router takes the current routing settings
            front += slot_router_objects(name, namespace, s.spec.model_copy(update={"routing": spec.routing}),
                                         s.slot, revisions[s.slot], owner)
        front.append(pdb(name, namespace, L.ROUTER, owner))
        router_command = _command(front, slot_router_name(name, serving.slot), "router")
        proxy_command = _command(front, L.child_name(name, L.ROUTER), "front")
    commands = {rr.role: replica_commands(spec, res, rr.role) for rr in res.enabled_roles}
    cm = config_map(name, namespace, spec, res, commands, effective_replicas(res, serving.replicas),
                    router_command, proxy_command, timing, drain_seconds(spec.slo.e2e_p95_seconds),
                    revisions[serving.slot], owner)
    if not gateway_mode:
        table = routes(name, namespace, slots, revisions)
        cm["data"][ROUTES_CONFIG_KEY] = table_json(table)
        cm["data"].update(front_files(name, namespace, spec, table))
    out: list[dict[str, Any]] = [cm]
    for role in roles:
        out.append(role_service(name, namespace, role, owner))
        out.append(pdb(name, namespace, role, owner))
        workloads = [w for w in engines if w["metadata"]["labels"][L.ROLE_LABEL] == role]
        # before the pods: they claim from these
        out += [t for t in claim_templates if t["metadata"]["labels"][L.ROLE_LABEL] == role]
        out += compute_domain.domains(workloads, owner)
        out += workloads
    prefetch = weight_prefetch(name, namespace, spec, res, owner)
    if prefetch is not None:
        out.append(prefetch)
    out += front
    metrics = spec.autoscaling.metrics
    out += network_policies(name, namespace, roles, owner, operator_namespace,
                            metrics.prometheus.scraped_by if metrics.source == "Prometheus" and metrics.prometheus else None,
                            slot_routers=not gateway_mode,
                            gateway=gateway.gateway_settings(spec) if gateway_mode else None)
    return out


def _command(objs: list[dict[str, Any]], deployment: str, container: str) -> list[str]:
    """A container's command line as the Deployment named runs it."""
    d = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == deployment)
    c = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == container)
    return [*c["command"], *c["args"]]


def _gateway_slots(cr_name: str, namespace: str, front: api.V41FlashDeploymentSpec, slots: Sequence[SlotSpec],
                   revisions: dict[str, str], serving: SlotSpec, owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Mode Gateway's objects (render/gateway.py): the pickers' RBAC, per slot a picker and a pool of its
    revision, the front pool and Service on the serving slot, and the HTTPRoute: the serving share on the
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
