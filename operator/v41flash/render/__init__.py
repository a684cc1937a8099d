"""The renderer: a V41FlashDeployment → every Kubernetes object it needs, as plain dicts (pure).

The controller applies exactly this list (server-side apply) and prunes the rest; `v41flash render`
prints it. Same input, same output, same order: ConfigMap, then per enabled role its Service, PDB and
workload, then (with spec.startup.weightCache.prefetch) the weight prefetcher's DaemonSet, then the router's
ServiceAccount, Role, RoleBinding, Deployment, Service and PDB (mode Gateway instead: the endpoint picker's
ServiceAccount, Role, RoleBinding, ConfigMap, Deployment, Service, the InferencePool, the HTTPRoute when asked
for), then the NetworkPolicies of the engines and the router (or the endpoint picker).
"""
from __future__ import annotations

from typing import Any

from ..api import v1alpha1 as api
from . import labels as L
from .engine import engine_workload, replica_commands
from .gateway import gateway_objects, gateway_settings, is_gateway
from .objects import config_map, pdb, role_service
from .prefetch import weight_prefetch
from .resolve import Resolved, resolve
from .network import network_policies
from .revision import revision_of, serving_revision, stamp_revision
from .router import router_args, router_objects
from .timing import PodTiming, drain_seconds

__all__ = ["render", "resolve", "Resolved", "PodTiming", "revision_of"]


def render(obj: api.V41FlashDeployment, replicas: dict[str, int | None] | None = None,
           owner: dict[str, Any] | None = None, timing: PodTiming | None = None,
           operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Every desired object of one deployment.

    replicas: desired replicas per role (planner / minReplicas); a missing or None entry means the
    role's minReplicas, and a role with replicasManagedBy: external never gets spec.replicas.
    owner: {apiVersion, kind, name, uid} of the CR → ownerReferences on every object; None offline.
    timing: the engine pods' fixed grace period and probe budget (None = the defaults). The preStop drain
    deadline is sized from the SLO's p95 e2e target and written to the ConfigMap, not the pod template.
    Every engine workload and pod is labelled with the serving revision (render/revision.py).
    operator_namespace: where the operator runs (its NetworkPolicy peer); None = any namespace.
    """
    name = obj.metadata["name"]
    namespace = obj.metadata.get("namespace") or "default"
    spec = obj.spec
    timing = timing or PodTiming()
    res = resolve(spec)
    effective = {rr.role: _effective_replicas(rr.role, res, replicas) for rr in res.enabled_roles}
    commands = {rr.role: replica_commands(spec, res, rr.role) for rr in res.enabled_roles}
    r_args = router_args(name, namespace, spec, res)

    engines = {rr.role: engine_workload(name, namespace, spec, res, rr.role, effective, owner, timing)
               for rr in res.enabled_roles}
    revision = serving_revision(list(engines.values()))
    for workload in engines.values():
        stamp_revision(workload, revision)

    out: list[dict[str, Any]] = [
        config_map(name, namespace, spec, res, commands, effective, r_args, timing,
                   drain_seconds(spec.slo.e2e_p95_seconds), revision, owner),
    ]
    for rr in res.enabled_roles:
        out.append(role_service(name, namespace, rr.role, owner))
        out.append(pdb(name, namespace, rr.role, owner))
        out.append(engines[rr.role])
    prefetch = weight_prefetch(name, namespace, spec, res, owner)
    if prefetch is not None:
        out.append(prefetch)
    if is_gateway(spec):
        out += gateway_objects(name, namespace, spec, res, owner)
    else:
        out += router_objects(name, namespace, spec, res, owner)
        out.append(pdb(name, namespace, L.ROUTER, owner))
    metrics = spec.autoscaling.metrics
    out += network_policies(name, namespace, [rr.role for rr in res.enabled_roles], owner, operator_namespace,
                            metrics.prometheus.scraped_by if metrics.source == "Prometheus" and metrics.prometheus else None,
                            gateway=gateway_settings(spec) if is_gateway(spec) else None)
    return out


def _effective_replicas(role: str, res: Resolved, replicas: dict[str, int | None] | None) -> int | None:
    rr = res.roles[role]
    if rr.replicas_managed_by == "external":
        return None
    want = (replicas or {}).get(role)
    return rr.min_replicas if want is None else want
