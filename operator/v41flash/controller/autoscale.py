"""The planner's edge: scrape engines and routers, cut the evaluation window, call the pure planner, and
turn its Decision into status fields, Events, metrics and pod-deletion costs.

The operator stays stateless except for recent metric snapshots (a restart costs one window of data,
during which the planner holds); the planner's memory (corrections, stabilization) lives in status.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from ..api import v1alpha1 as api
from ..metrics.scrape import router_target, scrape, vllm_target
from ..metrics.window import SnapshotHistory, compute_router_window, role_windows
from ..planner import drain
from ..planner.datatypes import (
    Bounds, Decision, Observation, PlannerConfig, PlannerState, RoleBounds, RoleObservation, RoleReplicas, Slo,
)
from ..metrics.operator_metrics import planner_metrics
from ..planner.plan import plan
from ..planner.profile import CapacityProfile, find_profile, profile_from_dict
from ..render import labels as L
from ..render.resolve import Resolved, resolve
from ..roles import ROLES
from .kube import Kube

log = logging.getLogger(__name__)


@dataclass
class PlannerOutcome:
    """What the planner decided this pass: replicas to write and the status fields it owns."""
    desired: dict[str, int] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)  # slo, lastDecision, plannerState
    events: list[tuple[str, str, str]] = field(default_factory=list)


STATUS_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # RFC 3339 in UTC, as Kubernetes writes times


def _parse_time(value: str) -> float | None:
    try:
        return datetime.strptime(value, STATUS_TIME_FORMAT).replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime(STATUS_TIME_FORMAT)


def _parallelism(r) -> str:
    return f"DEP{r.tensor_parallel_size * r.data_parallel_size}" if r.data_parallel_size > 1 else \
        f"TP{r.tensor_parallel_size}"


def profile_for(spec: api.V41FlashDeploymentSpec, resolved: Resolved, kube: Kube | None, namespace: str
                ) -> CapacityProfile | None:
    """The capacity profile: the user's ConfigMap (profile.yaml) or the shipped one for profile + GPU."""
    if spec.autoscaling.capacity_profile and kube is not None:
        import yaml
        cm = kube.core.read_namespaced_config_map(spec.autoscaling.capacity_profile, namespace)
        return profile_from_dict(yaml.safe_load((cm.data or {}).get("profile.yaml", "")) or {})
    roles = resolved.roles
    return find_profile(
        spec.profile, spec.gpu.product,
        _parallelism(roles["prefill"]) if roles["prefill"].enabled else None,
        _parallelism(roles["decode"]))


def _pod_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _deletion_cost(pod) -> int | None:
    try:
        return int((pod.metadata.annotations or {})[drain.POD_DELETION_COST])
    except (KeyError, ValueError):
        return None


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
                       ("loadImbalance", overall.load_spread if overall else None)):
        if value is not None and math.isfinite(value):
            out[key] = float(f"{float(value):.3g}")  # 3 significant digits: no status churn from noise
    return out


_DIGITS = re.compile(r"[0-9][0-9.,]*")


def same_decision(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same action, replicas and kind of reason (numbers aside): a hold that holds for the same reason."""
    keys = ("action", "prefill", "decode")
    return bool(a) and all(a.get(k) == b.get(k) for k in keys) and \
        _DIGITS.sub("#", a.get("reason", "")) == _DIGITS.sub("#", b.get("reason", ""))


def durable_state(state: PlannerState) -> dict[str, Any]:
    """What must survive an operator restart: the learned corrections and the last scale action.

    The rest (rate trend, stabilization history) rebuilds from fresh windows, and rebuilding it is
    the safe direction: no scale-down until a full stabilization window has been seen again.
    """
    out: dict[str, Any] = {}
    for role in ROLES:
        rs = state.role(role)
        out[role] = {"correction": round(rs.correction, 3), "corrections_learned": rs.corrections_learned,
                     "service_correction": None if rs.service_correction is None else round(rs.service_correction, 3),
                     "last_scale_time": rs.last_scale_time, "last_action": rs.last_action}
    return out


class Autoscaler:
    """One per operator process: snapshot history per deployment, and the planner metrics."""

    def __init__(self, kube: Kube, config: PlannerConfig | None = None):
        self.kube = kube
        self.histories: dict[str, SnapshotHistory] = {}
        self.states: dict[str, PlannerState] = {}  # full planner memory; status keeps the durable part
        self.metrics = planner_metrics()
        self.config = config

    def forget(self, uid: str, namespace: str, name: str) -> None:
        self.histories.pop(uid, None)
        self.states.pop(uid, None)
        self.metrics.forget(namespace, name)

    def step(self, body: dict[str, Any], spec: api.V41FlashDeploymentSpec, now: float | None = None
             ) -> PlannerOutcome | None:
        """Scrape (every pass, to build history) and plan (every intervalSeconds); None = nothing decided."""
        now = now or time.time()
        meta, status = body["metadata"], body.get("status") or {}
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        resolved = resolve(spec)
        pods = self.kube.list_pods(ns, L.label_selector(L.serving_pods_selector(name)))
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        ready = {role: [p for p in live if p.metadata.labels.get(L.ROLE_LABEL) == role and _pod_ready(p)
                        and p.status.pod_ip] for role in (*ROLES, L.ROUTER)}
        targets = [vllm_target(p.metadata.name, role, p.status.pod_ip) for role in ROLES for p in ready[role]]
        targets += [router_target(p.metadata.name, p.status.pod_ip) for p in ready[L.ROUTER]]
        t0 = time.monotonic()
        snapshots = asyncio.run(scrape(targets)) if targets else []
        self.metrics.record_scrape(ns, name, snapshots, time.monotonic() - t0)
        history = self.histories.setdefault(uid, SnapshotHistory(retention_s=max(900.0, 3 * spec.slo.window_seconds)))
        history.add(snapshots)
        now = max([now, *(s.time for s in snapshots)])  # the window ends at the newest scrape

        known = self.states.get(uid)
        last = known.last_decision_time if known and known.last_decision_time is not None else \
            _parse_time((status.get("lastDecision") or {}).get("time", ""))
        if last is not None and now - last < spec.autoscaling.interval_seconds:
            return None
        profile = profile_for(spec, resolved, self.kube, ns)
        enabled = [r for r in ROLES if resolved.roles[r].enabled]
        windows = role_windows(history, now, spec.slo.window_seconds,
                               {r: [p.metadata.name for p in ready[r]] for r in enabled},
                               spec.slo.ttft.percentile / 100)
        by_pod = {p: history.snapshots(p) for p in history.pods()}
        router_snaps = {p: ss for p, ss in by_pod.items() if ss and ss[-1].role == L.ROUTER}
        router_figs = compute_router_window(router_snaps, now, spec.slo.window_seconds) if router_snaps else None
        slo_status = observed_slo_status(windows, router_figs)
        if profile is None:
            reason = (f"no capacity profile for {spec.profile} on {spec.gpu.product}: set "
                      f"spec.autoscaling.capacityProfile; replicas stay where they are")
            previous = status.get("lastDecision") or {}
            last = {"time": iso_time(now), "action": "hold", "reason": reason}
            self.states[uid] = replace(known or PlannerState.from_dict(status.get("plannerState")),
                                       last_decision_time=now)
            if same_decision(previous, last):
                return PlannerOutcome(status={"slo": slo_status, "lastDecision": previous})
            return PlannerOutcome(status={"slo": slo_status, "lastDecision": last},
                                  events=[("Warning", "NoCapacityProfile", reason)])

        def role_obs(role: str) -> RoleObservation:
            rs = status.get(role) or {}
            role_pods = [p for p in live if p.metadata.labels.get(L.ROLE_LABEL) == role]
            starting = [p for p in role_pods if not _pod_ready(p)]
            created = [p.metadata.creation_timestamp.timestamp() for p in starting if p.metadata.creation_timestamp]
            desired = rs.get("desiredReplicas") or getattr(spec, role).min_replicas
            return RoleObservation(
                replicas=RoleReplicas(desired=desired, ready=rs.get("readyReplicas", len(ready[role])),
                                      starting=max(0, desired - rs.get("readyReplicas", 0)),
                                      starting_for_s=tuple(max(0.0, now - c) for c in created)),
                window=windows.get(role),
                rolling_out=rs.get("replicas", 0) > desired)

        observation = Observation(decode=role_obs("decode"),
                                  prefill=role_obs("prefill") if resolved.roles["prefill"].enabled else None,
                                  router=router_figs)
        bounds = Bounds(
            decode=RoleBounds(spec.decode.min_replicas, spec.decode.max_replicas,
                              spec.decode.replicas_managed_by == "operator"),
            prefill=RoleBounds(spec.prefill.min_replicas, spec.prefill.max_replicas,
                               spec.prefill.replicas_managed_by == "operator"),
            gpu_budget=spec.autoscaling.gpu_budget or None)
        slo = Slo(ttft_s=spec.slo.ttft.target_seconds, e2e_p95_s=spec.slo.e2e_p95_seconds,
                  ttft_percentile=spec.slo.ttft.percentile / 100, window_s=float(spec.slo.window_seconds))
        config = self.config or PlannerConfig.for_spec(spec.autoscaling.interval_seconds,
                                                       spec.autoscaling.scale_down_stabilization_seconds)
        self.metrics.record_slo(ns, name, slo.ttft_s, slo.e2e_p95_s)
        state = self.states.get(uid) or PlannerState.from_dict(status.get("plannerState"))
        decision = plan(observation, profile, slo, bounds, state, now, config)
        self.states[uid] = decision.state
        self.metrics.record_decision(ns, name, decision)
        return self._outcome(decision, slo_status, now, ns, pods, snapshots, status.get("lastDecision") or {})

    def _outcome(self, decision: Decision, slo_status: dict[str, Any], now: float, ns: str, pods: list,
                 snapshots: list, previous: dict[str, Any]) -> PlannerOutcome:
        out = PlannerOutcome(status={"slo": slo_status, "plannerState": durable_state(decision.state)})
        reasons = []
        for d in decision.roles():
            out.desired[d.role] = d.desired
            reasons.append(f"{d.role} {d.current}->{d.desired}: {d.reason}")
            if d.desired < d.current:
                self._mark_for_removal(ns, d.role, d.current - d.desired, pods, snapshots)
        last = {"time": iso_time(now), "action": decision.action, "reason": "; ".join(reasons)[:2000]}
        for d in decision.roles():
            last[d.role] = d.desired
        # The same decision again (only its figures moved) keeps the recorded one: no status churn.
        out.status["lastDecision"] = previous if same_decision(previous, last) else last
        if decision.action != "hold":
            out.events.append(("Normal", "Scaled", last["reason"]))
        return out

    def _mark_for_removal(self, ns: str, role: str, count: int, pods: list, snapshots: list) -> None:
        """Least-loaded pods get the lowest pod-deletion-cost, so the ReplicaSet removes them first."""
        running = {s.pod: sum(e.gauges.get("vllm:num_requests_running", 0.0) for e in s.engines.values())
                   for s in snapshots if s.ok}
        loads = [drain.PodLoad(name=p.metadata.name, running=running.get(p.metadata.name, 0.0),
                               ready=_pod_ready(p), deletion_cost=_deletion_cost(p),
                               created=p.metadata.creation_timestamp.timestamp() if p.metadata.creation_timestamp else 0.0)
                 for p in pods if p.metadata.labels.get(L.ROLE_LABEL) == role and not p.metadata.deletion_timestamp]
        remove = drain.pods_to_remove(loads, count)
        for pod, annotations in drain.deletion_cost_annotations(loads, remove).items():
            try:
                self.kube.patch_pod_annotations(ns, pod, dict(annotations))
            except Exception:  # a pod that vanished meanwhile needs no cost
                log.info("could not annotate pod %s/%s with its deletion cost", ns, pod)
