"""The planner's edge: scrape engines and routers (or query the cluster's Prometheus:
spec.autoscaling.metrics), cut the evaluation window, call the pure planner, and turn its Decision into
status fields, Events, metrics and pod-deletion costs.

``Autoscaler`` is the thin I/O layer (list pods, scrape, read a profile ConfigMap, annotate pods); what it
reads goes through pure functions: ``observation.observe`` builds the planner's input, the functions
here turn a Decision into a ``PlannerOutcome`` and pod-deletion costs.

The operator stays stateless except for recent metric snapshots (a restart costs one window of data,
during which the planner holds); the planner's memory (corrections, stabilization) lives in status.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..metrics.promapi import PromSource, prometheus_windows
from ..metrics.scrape import scrape
from ..metrics.window import SnapshotHistory
from ..planner import drain
from ..planner import seasonal
from ..planner.datatypes import Decision, PlannerConfig, PlannerState
from ..planner.plan import plan
from ..planner.profile import CapacityProfile, find_profile, for_rendered_args, profile_from_dict
from ..planner.schedule import Window
from ..render import labels as L
from ..render.engine import engine_config
from ..render.resolve import Resolved, resolve
from ..roles import ROLES
from ..vllm import args as vargs
from ..vllm import features as vfeatures
from ..rollout import progress
from .config import admin_policy
from .kube import KubeAPI
from .metrics import planner_metrics
from .observation import (  # noqa: F401  (observed_slo_status: re-exported)
    METRICS_UNAVAILABLE, Measured, Observed, PodView, metrics_trouble, observe, observed_slo_status, owned_pod,
    capacity_pending, nodes_not_ready, planner_bounds, planner_slo, pod_view, prometheus_pods, scrape_targets,
    serving, with_node_health,
)

log = logging.getLogger(__name__)


@dataclass
class PlannerOutcome:
    """What the planner decided this pass: replicas to write and the status fields it owns."""
    desired: dict[str, int] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)  # slo, lastDecision, plannerState
    events: list[tuple[str, str, str]] = field(default_factory=list)
    # conditions the planner owns: (type, reason, message) present while true; every other planner-owned
    # type (PLANNER_CONDITIONS) is absent
    conditions: list[tuple[str, str, str]] = field(default_factory=list)


CAPACITY_PENDING = "CapacityPending"  # replicas that cannot be scheduled (no free GPUs, taints, ...)
NODE_NOT_READY = "NodeNotReady"  # replicas whose pods sit on NotReady nodes
PLANNER_CONDITIONS = (CAPACITY_PENDING, NODE_NOT_READY, METRICS_UNAVAILABLE)  # the last: the Prometheus source failed


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


def profile_for(spec: api.V41FlashDeploymentSpec, resolved: Resolved, kube: KubeAPI | None, namespace: str
                ) -> CapacityProfile | None:
    """The capacity profile: the user's ConfigMap (profile.yaml) or the shipped one for profile + GPU."""
    if spec.autoscaling.capacity_profile and kube is not None:
        import yaml
        cm = kube.core.read_namespaced_config_map(spec.autoscaling.capacity_profile, namespace)
        return profile_from_dict(yaml.safe_load((cm.data or {}).get("profile.yaml", "")) or {})
    roles = resolved.roles
    shipped = find_profile(
        spec.profile, spec.gpu.product,
        _parallelism(roles["prefill"]) if roles["prefill"].enabled else None,
        _parallelism(roles["decode"]))
    return None if shipped is None else follow_rendered_features(shipped, spec, resolved)


def follow_rendered_features(profile: CapacityProfile, spec: api.V41FlashDeploymentSpec, resolved: Resolved
                             ) -> CapacityProfile:
    """The shipped profile as the decode engines run: DSpark on/off, the host KV tier and --max-num-seqs (the
    profiles assume 128/256 sequences, P/D renders 32 per rank), read from the argv the renderer builds (a
    ConfigMap profile describes the user's own measured deployment and is taken as is)."""
    try:
        args = vargs.build_replica(engine_config(spec, resolved, "decode")).leader.args
    except vargs.InvalidEngineConfig:  # the deployment is Stalled for that reason; plan on the profile alone
        return profile
    return for_rendered_args(profile, args)


_DIGITS = re.compile(r"[0-9][0-9.,]*")


def same_decision(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same action, replicas and kind of reason (numbers aside): a hold that holds for the same reason."""
    keys = ("action", "prefill", "decode")
    return bool(a) and all(a.get(k) == b.get(k) for k in keys) and \
        _DIGITS.sub("#", a.get("reason", "")) == _DIGITS.sub("#", b.get("reason", ""))


def durable_state(state: PlannerState, season_bytes: int = PlannerConfig.foresight.season_status_bytes) -> dict[str, Any]:
    """What must survive an operator restart: the learned corrections, the last scale action, the
    headroom the demand history gave (coarse: it rarely changes, so status is not rewritten for it) and the
    seasonal forecaster's history (closed buckets only, 3 significant digits, at most ``season_bytes`` of JSON:
    status changes once per bucket, and a restart or failover forecasts from the same past).

    The rest (rate trend, stabilization history, the demand history itself, the proven capacity) rebuilds
    from fresh windows, and rebuilding it is the safe direction: no scale-down until a full stabilization
    window has been seen again, the carried headroom until the new history has enough samples, and no
    proven-capacity cap until new windows prove it.
    """
    out: dict[str, Any] = {}
    for role in ROLES:
        rs = state.role(role)
        out[role] = {"correction": round(rs.correction, 3), "corrections_learned": rs.corrections_learned,
                     "service_correction": None if rs.service_correction is None else round(rs.service_correction, 3),
                     "last_scale_time": rs.last_scale_time, "last_action": rs.last_action,
                     "headroom_rise": rs.headroom_rise, "headroom_peak": rs.headroom_peak}
    out["season"] = seasonal.to_status(state.season, season_bytes)
    return out


def planner_config(a: api.AutoscalingSpec) -> PlannerConfig:
    """The planner's knobs from spec.autoscaling: cadence, stabilization, the moved-sessions hold, the schedules,
    the forecast's quantile and the outage memory."""
    return PlannerConfig.for_spec(a.interval_seconds, a.scale_down_stabilization_seconds,
                                  a.scale_up_stabilization_seconds, a.moved_sessions_hold_seconds,
                                  tuple(Window.from_spec(w) for w in a.schedules), a.forecast.quantile,
                                  a.outage_memory_seconds)


def planner_due(known: PlannerState | None, status: Mapping[str, Any], now: float, interval_s: float) -> bool:
    """The planner decides every intervalSeconds: since the last decision in memory, else the one in status."""
    last = known.last_decision_time if known and known.last_decision_time is not None else \
        _parse_time((status.get("lastDecision") or {}).get("time", ""))
    return last is None or now - last >= interval_s


def no_profile_outcome(spec: api.V41FlashDeploymentSpec, slo_status: dict[str, Any], previous: dict[str, Any],
                       now: float) -> PlannerOutcome:
    """Without a capacity profile the planner holds and says so (the Event once, not every interval)."""
    reason = (f"no capacity profile for {spec.profile} on {spec.gpu.product}: set "
              f"spec.autoscaling.capacityProfile; replicas stay where they are")
    last = {"time": iso_time(now), "action": "hold", "reason": reason}
    if same_decision(previous, last):
        return PlannerOutcome(status={"slo": slo_status, "lastDecision": previous})
    return PlannerOutcome(status={"slo": slo_status, "lastDecision": last},
                          events=[("Warning", "NoCapacityProfile", reason)])


def planner_outcome(decision: Decision, slo_status: dict[str, Any], now: float, previous: dict[str, Any],
                    advisory: bool = False) -> PlannerOutcome:
    """Replicas to write, status.slo / lastDecision / plannerState, and a Scaled Event when something moved.

    ``advisory``: the same decision is reported (lastDecision with advisory: true, a WouldScale Event) and
    no replicas are written."""
    out = PlannerOutcome(status={"slo": slo_status, "plannerState": durable_state(decision.state)})
    reasons = []
    for d in decision.roles():
        if not advisory:
            out.desired[d.role] = d.desired
        reasons.append(f"{d.role} {d.current}->{d.desired}: {d.reason}")
    reason = "; ".join(reasons)
    if advisory:
        reason = f"advisory (not applied): {reason}"
    last = {"time": iso_time(now), "action": decision.action, "reason": reason[:2000]}
    for d in decision.roles():
        last[d.role] = d.desired
    last["decidedBy"] = {d.role: d.decided_by for d in decision.roles() if d.decided_by}
    last["forecastBy"] = {d.role: d.forecast_by for d in decision.roles() if d.forecast_by}
    if advisory:
        last["advisory"] = True
    # The same decision again (only its figures moved) keeps the recorded one: no status churn.
    out.status["lastDecision"] = previous if same_decision(previous, last) else last
    if decision.action != "hold":
        out.events.append(("Normal", "WouldScale" if advisory else "Scaled", last["reason"]))
    return out


def with_pending(out: PlannerOutcome, observed: Observed, status: Mapping[str, Any]) -> PlannerOutcome:
    """The CapacityPending condition while pods cannot be scheduled, NodeNotReady while pods sit on NotReady
    nodes, and a Warning when either news changes."""
    return _with_pod_news(out, observed.pending, observed.not_ready_nodes, status)


def _with_pod_news(out: PlannerOutcome, pending: str | None, not_ready_nodes: str | None, status: Mapping[str, Any]
                   ) -> PlannerOutcome:
    for type_, reason, message in ((CAPACITY_PENDING, "Unschedulable", pending),
                                   (NODE_NOT_READY, "NodeNotReady", not_ready_nodes)):
        if message is None:
            continue
        out.conditions.append((type_, reason, message))
        before = next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)
        if before is None or before.get("message") != message:
            out.events.append(("Warning", reason, message))
    return out


def nothing_to_observe_yet(pods: Sequence[PodView], roles: Sequence[str], status: Mapping[str, Any]
                           ) -> PlannerOutcome | None:
    """Before the first decision, while no engine pod is Ready: no planner status (slo, lastDecision,
    plannerState), only the conditions on pods that cannot come; None (no pass at all) when those are
    already recorded as they are."""
    live = [p for p in pods if not p.deleting]
    out = _with_pod_news(PlannerOutcome(), capacity_pending(live, roles), nodes_not_ready(live, roles), status)
    recorded = {(c.get("type"), c.get("reason"), c.get("message")) for c in status.get("conditions") or []
                if c.get("type") in PLANNER_CONDITIONS and c.get("status") == "True"}
    return None if not out.events and set(out.conditions) == recorded else out


def with_metrics_trouble(out: PlannerOutcome, trouble: tuple[str, str] | None, status: Mapping[str, Any]
                         ) -> PlannerOutcome:
    """The MetricsUnavailable condition while the metrics source fails, and a Warning when its reason changes."""
    if trouble is None:
        return out
    reason, message = trouble
    out.conditions.append((METRICS_UNAVAILABLE, reason, message))
    before = next((c for c in status.get("conditions") or [] if c.get("type") == METRICS_UNAVAILABLE), None)
    if before is None or before.get("reason") != reason:
        out.events.append(("Warning", METRICS_UNAVAILABLE, message))
    return out


def removal_annotations(decision: Decision, pods: Sequence[PodView], running: Mapping[str, float]
                        ) -> list[tuple[str, dict[str, str | None]]]:
    """Pod-deletion costs for each role that scales down: least-loaded pods get the lowest, so the
    ReplicaSet removes them first. ``running``: pod -> running requests (the windows' pod_running).
    (pod, annotations) in the order to write them."""
    out: list[tuple[str, dict[str, str | None]]] = []
    for d in decision.roles():
        if d.desired >= d.current:
            continue
        loads = [drain.PodLoad(name=p.name, running=running.get(p.name, 0.0), ready=p.ready,
                               deletion_cost=p.deletion_cost, created=p.created if p.created is not None else 0.0)
                 for p in pods if p.role == d.role and not p.deleting]
        remove = drain.pods_to_remove(loads, d.current - d.desired)
        out += [(pod, dict(annotations)) for pod, annotations in drain.deletion_cost_annotations(loads, remove).items()]
    return out


class Autoscaler:
    """One per operator process: snapshot history per deployment, and the planner metrics."""

    def __init__(self, kube: KubeAPI, config: PlannerConfig | None = None):
        self.kube = kube
        self.histories: dict[str, SnapshotHistory] = {}
        self.states: dict[str, PlannerState] = {}  # full planner memory; status keeps the durable part
        self.metrics = planner_metrics()
        self.config = config
        self._nodes: dict[str, tuple[float, bool | None]] = {}

    NODE_TTL_S = 10.0  # a node's readiness is read at most this often, whichever deployments ask

    def _node_ready(self, node: str) -> bool | None:
        now = time.monotonic()
        hit = self._nodes.get(node)
        if hit is None or now - hit[0] > self.NODE_TTL_S:
            hit = self._nodes[node] = (now, self.kube.node_ready(node))
        return hit[1]

    def forget(self, uid: str, namespace: str, name: str) -> None:
        self.histories.pop(uid, None)
        self.states.pop(uid, None)
        self.metrics.forget(namespace, name)

    def step(self, body: dict[str, Any], spec: api.V41FlashDeploymentSpec, now: float | None = None
             ) -> PlannerOutcome | None:
        """Scrape (every pass, to build history; with the Prometheus source nothing: Prometheus keeps it) and plan
        (every intervalSeconds, on windows cut from that history or queried from Prometheus); None = nothing decided."""
        now = now or time.time()
        meta, status = body["metadata"], body.get("status") or {}
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        resolved = resolve(spec)
        enabled = [r for r in ROLES if resolved.roles[r].enabled]
        if not status.get("lastDecision") and not any((status.get(r) or {}).get("replicas") for r in enabled):
            # no decision yet and no engine pod at all (the workloads report none): nothing to list either
            return nothing_to_observe_yet([], enabled, status)
        # one list for the serving engine pods and the router pods (both carry the deployment label)
        wanted = (L.serving_pods_selector(name).items(), L.router_pods_selector(name).items())
        # during a rollout: the serving slot's pods only (the candidate is judged, not planned for)
        slot = progress.serving_slot(status)
        raw = [p for p in self.kube.list_pods(ns, L.label_selector({L.DEPLOYMENT_LABEL: name}))
               if any(sel <= (p.metadata.labels or {}).items() for sel in wanted)
               and progress.planner_pod(p.metadata.labels or {}, slot)]
        labels = {p.metadata.name: dict(p.metadata.labels or {}) for p in raw}
        pods = with_node_health([pod_view(p) for p in raw], self._node_ready)
        if not status.get("lastDecision") and \
                not any(serving([p for p in pods if owned_pod(p, name)])[r] for r in enabled):
            # no engine pod Ready yet and no decision made: nothing to observe, and a first decision now would
            # only be "hold, waiting for pods" written to status (after a burst of 500 new CRs: 500 writes
            # while their pods are Pending). The Reconciling condition names the pods waited for; the
            # conditions on why they cannot come (CapacityPending, NodeNotReady) are still the planner's.
            return nothing_to_observe_yet(pods, enabled, status)
        history = self.histories.setdefault(uid, SnapshotHistory(retention_s=max(900.0, 3 * spec.slo.window_seconds)))
        prom = spec.autoscaling.metrics.prometheus if spec.autoscaling.metrics.source == "Prometheus" else None
        if prom is None:
            # scrape only pods our workloads made: labels alone can be copied onto any pod (observation.owned_pod)
            targets = progress.planner_targets(scrape_targets([p for p in pods if owned_pod(p, name)]), labels)
            t0 = time.monotonic()
            snapshots = asyncio.run(scrape(targets)) if targets else []
            self.metrics.record_scrape(ns, name, snapshots, time.monotonic() - t0)
            history.add(snapshots)
            now = max([now, *(s.time for s in snapshots)])  # the window ends at the newest scrape

        known = self.states.get(uid)
        if not planner_due(known, status, now, spec.autoscaling.interval_seconds):
            return None
        profile = profile_for(spec, resolved, self.kube, ns)
        config = self.config or planner_config(spec.autoscaling)
        measured, trouble = None, None
        if prom is not None:  # Prometheus holds the history: one query round per decision, at its time
            expected, router_pods = prometheus_pods(pods, name, enabled)
            t0 = time.monotonic()
            windows, router = asyncio.run(prometheus_windows(
                PromSource.from_spec(prom, ns, admin_policy().endpoints), now, spec.slo.window_seconds, expected,
                router_pods, spec.slo.ttft.percentile / 100))
            self.metrics.record_prometheus(ns, name, {r: windows[r] for r in enabled}, time.monotonic() - t0)
            measured = Measured(windows, router)
            trouble = metrics_trouble(windows, enabled, now, config.judge.max_metrics_age_s)
        observed = observe(spec, resolved, pods, history, status, now, measured)
        self.metrics.record_throughput(ns, name, observed.slo_status)
        previous = status.get("lastDecision") or {}
        state = known or PlannerState.from_dict(status.get("plannerState"))
        if profile is None:
            self.states[uid] = replace(state, last_decision_time=now)
            return with_metrics_trouble(with_pending(no_profile_outcome(spec, observed.slo_status, previous, now),
                                                     observed, status), trouble, status)

        slo = planner_slo(spec)
        advisory = spec.autoscaling.mode == "advisory"
        self.metrics.record_slo(ns, name, slo.ttft_s, slo.e2e_p95_s)
        bounds = planner_bounds(spec)
        if progress.candidate_exists(status):  # the budget counts the candidate's GPUs too
            bounds = replace(bounds, gpu_budget=progress.planner_budget(spec, status))
        decision = plan(observed.observation, profile, slo, bounds, state, now, config)
        if progress.candidate_exists(status):
            decision = progress.hold_scale_downs(
                decision, f"a rollout's candidate {(status.get('rollout') or {}).get('candidateRevision')} exists")
        # costs first: if the apiserver is unreachable the pass fails before the decision is remembered
        if not advisory:  # advisory: replicas (and pod deletion costs) stay as they are
            self._annotate(ns, removal_annotations(decision, pods, observed.running))
        self.states[uid] = decision.state
        self.metrics.record_decision(ns, name, decision, advisory=advisory)
        return with_metrics_trouble(with_pending(planner_outcome(decision, observed.slo_status, now, previous, advisory),
                                                 observed, status), trouble, status)

    def _annotate(self, ns: str, annotations: list[tuple[str, dict[str, str | None]]]) -> None:
        """Deletion costs are a preference: a scale-down goes ahead without them (the ReplicaSet picks)."""
        for pod, values in annotations:
            try:
                self.kube.patch_pod_annotations(ns, pod, values)
            except ApiException as exc:
                if exc.status == 404:  # the pod vanished meanwhile: it needs no cost
                    log.info("pod %s/%s vanished before its deletion cost was set", ns, pod)
                else:
                    log.warning("could not set the deletion cost of pod %s/%s (%s %s); the scale-down goes ahead "
                                "without it", ns, pod, exc.status, exc.reason)
