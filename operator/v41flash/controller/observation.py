"""What the planner sees of one deployment, built from plain data (pure: no apiserver, no network).

In: the deployment's pods (``PodView``, read by the I/O layer in ``autoscale.py``), the history of their
scraped snapshots or the windows a Prometheus measured (``Measured``), the CR's status and the time. Out:
the planner's ``Observation`` and the observed SLO figures for ``status.slo``; from the spec, the planner's
bounds and SLO.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..api import v1alpha1 as api
from ..figures import RouterFigures, WindowFigures
from ..metrics.promapi import error_kind
from ..metrics.scrape import ScrapeTarget, proxy_target, router_target, vllm_target
from ..metrics.window import SnapshotHistory, compute_router_window, role_windows
from ..planner import drain, headroom
from ..planner.datatypes import Bounds, Observation, RoleBounds, RoleObservation, RoleReplicas, Slo
from ..pods import ready_condition
from ..render import labels as L
from ..render.resolve import Resolved
from ..roles import ROLES


@dataclass(frozen=True)
class PodView:
    """One pod of the deployment, reduced to what the planner's edge reads."""

    name: str
    role: str | None  # the role label (render/labels.py ROLE_LABEL): prefill | decode | router
    ready: bool  # condition Ready is True
    ip: str | None
    deleting: bool = False  # has a deletionTimestamp
    created: float | None = None  # unix seconds
    deletion_cost: int | None = None  # the controller.kubernetes.io/pod-deletion-cost annotation, if an int
    ready_since: float | None = None  # unix seconds of the Ready condition's last transition (Ready pods)
    unschedulable: str | None = None  # the scheduler's message while PodScheduled=False (Unschedulable)
    controller: tuple[str, str] | None = None  # (kind, name) of the controller ownerReference, if any
    node: str | None = None  # spec.nodeName once scheduled
    node_not_ready: bool = False  # its node's Ready condition is not True (set by the caller, who reads nodes)


def pod_view(pod: Any) -> PodView:
    """PodView of a kubernetes-client V1Pod."""
    meta = pod.metadata
    try:
        cost: int | None = int((meta.annotations or {})[drain.POD_DELETION_COST])
    except (KeyError, ValueError):
        cost = None
    conditions = pod.status.conditions or []
    ready = ready_condition(pod)
    since = getattr(ready, "last_transition_time", None) if ready is not None else None
    stuck = next((c for c in conditions if c.type == "PodScheduled" and c.status == "False"
                  and getattr(c, "reason", "") == "Unschedulable"), None)
    return PodView(
        name=meta.name,
        role=(meta.labels or {}).get(L.ROLE_LABEL),
        ready=ready is not None,
        ip=pod.status.pod_ip,
        deleting=bool(meta.deletion_timestamp),
        created=meta.creation_timestamp.timestamp() if meta.creation_timestamp else None,
        deletion_cost=cost,
        ready_since=since.timestamp() if since is not None else None,
        unschedulable=(getattr(stuck, "message", "") or "no reason given") if stuck is not None else None,
        controller=next(((r.kind, r.name) for r in (getattr(meta, "owner_references", None) or [])
                         if getattr(r, "controller", False)), None),
        node=getattr(pod.spec, "node_name", None) if getattr(pod, "spec", None) is not None else None,
    )


def with_node_health(pods: Sequence[PodView], node_ready: Callable[[str], bool | None]) -> list[PodView]:
    """Mark the pods (not being deleted) on a node whose Ready condition is not True, one lookup per node. A
    kubelet that died leaves its pods NotReady; a kubelet that reports its node NotReady can leave them
    Ready: either way they are about to be evicted, and a NotReady one serves nothing meanwhile."""
    verdict: dict[str, bool | None] = {}
    out = []
    for p in pods:
        if p.node and not p.deleting:
            if p.node not in verdict:
                verdict[p.node] = node_ready(p.node)
            if verdict[p.node] is False:
                p = replace(p, node_not_ready=True)
        out.append(p)
    return out


def nodes_not_ready(pods: Sequence[PodView], roles: Sequence[str]) -> str | None:
    """'1 decode pod on a NotReady node (kwok-node-2): evicted and replaced once its toleration ends' or None."""
    parts = []
    for role in roles:
        stuck = [p for p in pods if p.role == role and p.node_not_ready and not p.deleting]
        if stuck:
            nodes = ", ".join(sorted({p.node for p in stuck if p.node}))
            parts.append(f"{len(stuck)} {role} pod{'s' if len(stuck) != 1 else ''} on NotReady node"
                         f"{'s' if ',' in nodes else ''} {nodes}")
    if not parts:
        return None
    return "; ".join(parts) + ": Kubernetes evicts them when their not-ready/unreachable toleration ends and the " \
                              "workload replaces them on the remaining capacity"


_INSUFFICIENT = re.compile(r"Insufficient ([\w/-]+(?:\.[\w/-]+)*)")  # a resource name, not the sentence's dot
# kube-scheduler's DynamicResources plugin when no node has free devices for a pod's claims (spec.gpu.allocation DRA)
_NO_DEVICES = "cannot allocate all claims"


def _why_unschedulable(messages: list[str]) -> str:
    """'0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: ...' → 'Insufficient nvidia.com/gpu';
    '... 4 cannot allocate all claims. ...' (GPUs claimed by DRA) → 'cannot allocate all claims'."""
    found = sorted({f"Insufficient {m}" for msg in messages for m in _INSUFFICIENT.findall(msg)} |
                   {_NO_DEVICES for msg in messages if _NO_DEVICES in msg})
    if found:
        return ", ".join(found)
    first = messages[0].strip()
    return first if len(first) <= 200 else first[:197] + "..."


def capacity_pending(pods: Sequence[PodView], roles: Sequence[str]) -> str | None:
    """'2 prefill pods unschedulable: Insufficient nvidia.com/gpu; ...' for roles with pods no node can take."""
    parts = []
    for role in roles:
        msgs = [p.unschedulable for p in pods if p.role == role and not p.deleting and p.unschedulable]
        if msgs:
            parts.append(f"{len(msgs)} {role} pod{'s' if len(msgs) != 1 else ''} unschedulable: {_why_unschedulable(msgs)}")
    return "; ".join(parts) or None


def measured_cold_start(pods: Sequence[PodView]) -> float | None:
    """Median pod created → Ready of the newest Ready pods (planner/headroom.py), from pod timestamps."""
    return headroom.measured_cold_start([(p.created, p.ready_since - p.created) for p in pods
                                         if p.ready and p.created is not None and p.ready_since is not None
                                         and p.ready_since > p.created])


def throughput_status(windows: Mapping, ready: Mapping[str, int], gpus_per_replica: Mapping[str, int],
                      cost_per_gpu_hour: float) -> dict[str, Any]:
    """Tokens served per second (prompt tokens, cached + computed, where prompts are computed + output
    tokens of decode), per GPU of Ready replicas, and per TCO dollar — the seed's unit."""
    front = windows.get("prefill") or windows.get("decode")
    dec = windows.get("decode")
    if front is None and dec is None:
        return {}
    tps = (front.prompt_tokens_rate if front else 0.0) + (dec.generation_tokens_rate if dec else 0.0)
    gpus = sum(ready.get(r, 0) * gpus_per_replica.get(r, 0) for r in ROLES)
    out: dict[str, Any] = {"tokensPerSecond": float(f"{tps:.3g}")}
    if gpus > 0:
        out["tokensPerSecondPerGPU"] = float(f"{tps / gpus:.3g}")
        if cost_per_gpu_hour > 0:
            out["tokensPerDollar"] = float(f"{tps * 3600.0 / (gpus * cost_per_gpu_hour):.3g}")
    return out


def owned_pod(pod: PodView, name: str) -> bool:
    """Pods this deployment's workloads made: labels alone can be copied onto any pod (a pod labelled like a
    decode engine would feed the planner, or flood the scraper). The controller must be the ReplicaSet of
    one of our Deployments (<name>-<role>-<hash>) or a StatefulSet of our LeaderWorkerSet
    (<name>-<role>[-<group>]); a forged ownerReference to an owner that does not exist gets the pod
    garbage-collected."""
    if pod.role not in (*ROLES, L.ROUTER) or pod.controller is None:
        return False
    kind, owner = pod.controller
    if kind == "ReplicaSet":
        return owner.startswith(f"{name}-{pod.role}-")
    if kind == "StatefulSet" and pod.role in ROLES:
        return owner == f"{name}-{pod.role}" or owner.startswith(f"{name}-{pod.role}-")
    return False


def serving(pods: Sequence[PodView]) -> dict[str, list[PodView]]:
    """Pods that can be scraped, per role (prefill, decode, router): not deleting, Ready, with an IP."""
    return {role: [p for p in pods if not p.deleting and p.role == role and p.ready and p.ip]
            for role in (*ROLES, L.ROUTER)}


def scrape_targets(pods: Sequence[PodView]) -> list[ScrapeTarget]:
    ready = serving(pods)
    targets = [vllm_target(p.name, role, p.ip) for role in ROLES for p in ready[role]]
    targets += [router_target(p.name, p.ip) for p in ready[L.ROUTER]]
    # the front's session proxy sees arrivals and new sessions before any engine queues them; a router pod gets
    # both targets, and rollout/progress.planner_targets keeps the one it serves (the front's, or a slot router's)
    targets += [proxy_target(p.name, p.ip) for p in ready[L.ROUTER]]
    return targets


def _fmt_s(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.2f}s"


def observed_slo_status(windows: dict, router_figs: Any) -> dict[str, Any]:
    """status.slo: user-facing figures (router first: its latency spans prefill, KV transfer and decode)."""
    ttft_w = windows.get("prefill") if windows.get("prefill") and windows["prefill"].requests else windows.get("decode")
    overall = windows.get("overall")
    e2e = router_figs.e2e_p95_s if router_figs is not None and router_figs.e2e_p95_s is not None else (
        windows["decode"].e2e_p95_s if windows.get("decode") else None)
    ttft = ttft_w.ttft_s if ttft_w is not None else None
    out: dict[str, Any] = {"ttft": _fmt_s(ttft)}
    for key, value in (("ttftSeconds", ttft), ("e2eP95Seconds", e2e),
                       ("requestRate", router_figs.request_rate if router_figs is not None and router_figs.requests
                        else (windows["decode"].request_rate if windows.get("decode") else None)),
                       ("prefixCacheHitRate", overall.prefix_cache_hit_rate if overall else None),
                       ("loadImbalance", overall.load_spread if overall else None),
                       ("arrivalRate", getattr(router_figs, "arrival_rate", None)),
                       ("newSessionsPerSecond", getattr(router_figs, "new_session_rate", None)),
                       ("promptTokensArrivingPerSecond", getattr(router_figs, "prompt_tokens_arriving_rate", None))):
        if value is not None and math.isfinite(value):
            out[key] = float(f"{float(value):.3g}")  # 3 significant digits: no status churn from noise
    return out


@dataclass(frozen=True)
class Measured:
    """Windows measured elsewhere (metrics source Prometheus): per role plus 'overall', and the router's figures."""
    windows: Mapping[str, WindowFigures]
    router: RouterFigures | None = None


@dataclass(frozen=True)
class Observed:
    observation: Observation  # the planner's input
    slo_status: dict[str, Any]  # status.slo
    pending: str | None = None  # pods no node can take, for the CapacityPending condition
    not_ready_nodes: str | None = None  # pods on NotReady nodes, for the NodeNotReady condition
    running: Mapping[str, float] = field(default_factory=dict)  # pod -> running requests at the window's end
    windows: Mapping[str, WindowFigures] = field(default_factory=dict)  # per role (and 'overall')


def prometheus_pods(pods: Sequence[PodView], name: str, roles: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Whose series the planner reads from Prometheus: the Ready pods our own workloads made, per role, and the
    router's (a pod that only copied our labels is never selected: observation.owned_pod)."""
    ready = serving([p for p in pods if owned_pod(p, name)])
    return {r: [p.name for p in ready[r]] for r in roles}, [p.name for p in ready[L.ROUTER]]


METRICS_UNAVAILABLE = "MetricsUnavailable"


def metrics_trouble(windows: Mapping[str, WindowFigures], roles: Sequence[str], now: float, max_age_s: float,
                    source: str = "Prometheus") -> tuple[str, str] | None:
    """(reason, message) of the MetricsUnavailable condition when the metrics source could not measure a role or
    has only old data for it; None when every role's window is usable. No figures in the message (no churn)."""
    errors = {r: windows[r].error for r in roles if r in windows and windows[r].error}
    if errors:
        msg = "; ".join(f"{r}: {e}" for r, e in errors.items())
        return (f"{source}{error_kind(next(iter(errors.values())))}",
                f"{msg[:900]}; the planner holds (no scaling on missing metrics)")
    stale = [r for r in roles if r in windows and windows[r].pods_expected and now - windows[r].end > max_age_s]
    if stale:
        return (f"{source}Stale", f"{source}'s newest samples of {', '.join(stale)} are older than {max_age_s:.0f}s; "
                                  "the planner holds (no scaling on stale metrics)")
    return None


def observe(spec: api.V41FlashDeploymentSpec, resolved: Resolved, pods: Sequence[PodView], history: SnapshotHistory,
            status: Mapping[str, Any], now: float, measured: Measured | None = None) -> Observed:
    """The window ending at ``now`` for each enabled role and the router, and each role's replicas.

    The windows are cut from the scraped ``history``, or taken from ``measured`` (metrics source Prometheus):
    the same figures either way. Replicas come from the CR's status (what the last reconcile read from the
    workloads); how long each not-yet-Ready pod has been starting comes from the pods.
    """
    live = [p for p in pods if not p.deleting]
    ready = serving(pods)
    enabled = [r for r in ROLES if resolved.roles[r].enabled]
    if measured is None:
        windows = role_windows(history, now, spec.slo.window_seconds,
                               {r: [p.name for p in ready[r]] for r in enabled},
                               spec.slo.ttft.percentile / 100)
        by_pod = {p: history.snapshots(p) for p in history.pods()}
        router_snaps = {p: ss for p, ss in by_pod.items() if ss and ss[-1].role == L.ROUTER}
        router_figs = compute_router_window(router_snaps, now, spec.slo.window_seconds) if router_snaps else None
    else:
        windows, router_figs = dict(measured.windows), measured.router

    def role_obs(role: str) -> RoleObservation:
        rs = status.get(role) or {}
        role_pods = [p for p in live if p.role == role]
        # pods no node can take are not capacity on its way (a multi-node replica needs all its pods)
        stuck = [p for p in role_pods if p.unschedulable]
        unschedulable = math.ceil(len(stuck) / max(1, resolved.roles[role].nodes_per_replica))
        # pods not Ready on a NotReady node serve nothing and are not on their way either
        lost = math.ceil(len([p for p in role_pods if p.node_not_ready and not p.ready])
                         / max(1, resolved.roles[role].nodes_per_replica))
        starting = [p for p in role_pods if not p.ready and not p.unschedulable and not p.node_not_ready]
        created = [p.created for p in starting if p.created is not None]
        desired = rs.get("desiredReplicas") or getattr(spec, role).min_replicas
        return RoleObservation(
            replicas=RoleReplicas(desired=desired, ready=rs.get("readyReplicas", len(ready[role])),
                                  starting=max(0, desired - rs.get("readyReplicas", 0) - unschedulable - lost),
                                  starting_for_s=tuple(max(0.0, now - c) for c in created),
                                  unschedulable=unschedulable, lost=lost),
            window=windows.get(role),
            rolling_out=rs.get("replicas", 0) > desired,
            cold_start_s=measured_cold_start(role_pods))

    observation = Observation(decode=role_obs("decode"),
                              prefill=role_obs("prefill") if resolved.roles["prefill"].enabled else None,
                              router=router_figs)
    slo_status = observed_slo_status(windows, router_figs)
    slo_status.update(throughput_status(windows, {r: len(ready[r]) for r in ROLES},
                                        {r: resolved.roles[r].gpus_per_replica for r in ROLES},
                                        spec.autoscaling.cost_per_gpu_hour))
    running = {pod: n for r in enabled if r in windows for pod, n in windows[r].pod_running}
    return Observed(observation=observation, slo_status=slo_status, pending=capacity_pending(live, enabled),
                    not_ready_nodes=nodes_not_ready(live, enabled), running=running, windows=windows)


def planner_bounds(spec: api.V41FlashDeploymentSpec) -> Bounds:
    return Bounds(
        decode=RoleBounds(spec.decode.min_replicas, spec.decode.max_replicas,
                          spec.decode.replicas_managed_by == "operator"),
        prefill=RoleBounds(spec.prefill.min_replicas, spec.prefill.max_replicas,
                           spec.prefill.replicas_managed_by == "operator"),
        gpu_budget=spec.autoscaling.gpu_budget or None)


def planner_slo(spec: api.V41FlashDeploymentSpec) -> Slo:
    return Slo(ttft_s=spec.slo.ttft.target_seconds, e2e_p95_s=spec.slo.e2e_p95_seconds,
               ttft_percentile=spec.slo.ttft.percentile / 100, window_s=float(spec.slo.window_seconds))
