"""A rollout in progress as the controller follows it: what it reads and decides around the pure
``rollout.world.rollout_pass`` (docs/decisions/2026-12-01-rollouts.md §8).

* ``needed``, ``at_rest``, ``active``: which pass a deployment gets (a rollout recorded in status, or a spec
  that renders another revision than the one serving; a rollout that is over; one acting on its own clock);
* ``pod_dicts``, ``slot_engine_pods``, ``slot_router_pods``: the deployment's pods as the rollout reads them
  (controller/revisions.py feeds rollout_pass with them, the workloads, the records and the step's figures);
* ``StepFigures``: scrapes, during a rollout, the candidate's engines and router, the serving and the
  draining slot's routers and the draining slot's engines, whether or not the planner runs, into a
  per-deployment SnapshotHistory, and cuts the step's window from it (``SnapshotHistory.window_of`` and
  ``compute_router_window``, combined by ``machine.candidate_figures``);
* ``records_to_delete``: ControllerRevisions no longer needed (only the live revisions and the previous
  serving one are kept);
* the planner during a rollout: the serving slot's pods and targets, its GPU budget, scale-downs held.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client

from ..metrics import parse as m
from ..metrics.scrape import router_target, scrape, vllm_target
from ..metrics.window import SnapshotHistory, compute_router_window
from ..render import labels as L
from ..render.resolve import resolve
from ..roles import ROLES
from . import machine as M
from ..pods import is_ready, labels_of

log = logging.getLogger(__name__)

# Phases in which the machine acts on its own clock (steps, deadlines, drains): passes come every
# OperatorConfig.rollout_pass_seconds, each applies, and the step's figures are scraped.
ACTIVE_PHASES = (M.STARTING, M.WAITING, M.CANARY, M.PAUSED, M.DRAINING, M.RECREATING)
_SANITIZE = client.ApiClient()


def needed(status: Mapping[str, Any], spec_revision: str | None) -> bool:
    """A pass goes through rollout_pass when status.rollout exists or the spec renders a revision other than
    the serving one (once a first revision has served: the first bring-up is today's plain path)."""
    if status.get("rollout"):
        return True
    serving = status.get("servingRevision")
    return bool(serving and spec_revision and serving != spec_revision)


def at_rest(status: Mapping[str, Any], spec_revision: str | None) -> bool:
    """A rollout is over and nothing is left of it: status.rollout Complete, no slot retiring or candidate, and the
    spec renders the serving revision. An observe pass then renders the serving slot from spec and status
    (rollout/world.rest_pass) instead of listing pods, records and children and applying them."""
    r = status.get("rollout") or {}
    return (r.get("phase") == M.COMPLETE and not r.get("retiringSlot") and not r.get("candidateSlot")
            and not r.get("drainingSlot") and bool(spec_revision) and status.get("servingRevision") == spec_revision)


def active(status: Mapping[str, Any]) -> bool:
    r = status.get("rollout") or {}
    return (r.get("phase") or "") in ACTIVE_PHASES or bool(r.get("retiringSlot"))


def pod_dicts(pods: Sequence[Any]) -> list[dict[str, Any]]:
    """kubernetes-client V1Pods as API dicts (camelCase), what rollout/slots.slot_observation reads."""
    return [p if isinstance(p, dict) else _SANITIZE.sanitize_for_serialization(p) for p in pods]


def _live(p: Mapping[str, Any]) -> bool:
    return not (p.get("metadata") or {}).get("deletionTimestamp")


def slot_engine_pods(pods: Sequence[Mapping[str, Any]], slot: str, revision: str | None = None
                     ) -> list[Mapping[str, Any]]:
    """The serving engine pods of one slot ("" = a deployment's first), of one revision when given."""
    return [p for p in pods if _live(p) and labels_of(p).get(L.ROLE_LABEL) in ROLES
            and labels_of(p).get(L.SERVING_LABEL) == "true" and labels_of(p).get(L.SLOT_LABEL, "") == slot
            and (revision is None or labels_of(p).get(L.REVISION_LABEL) == revision)]


def slot_router_pods(pods: Sequence[Mapping[str, Any]], slot: str) -> list[Mapping[str, Any]]:
    """The vllm-router pods of one slot (slot "" has router '0')."""
    return [p for p in pods if _live(p) and labels_of(p).get(L.ROLE_LABEL) == L.ROUTER
            and labels_of(p).get(L.SLOT_LABEL) == (slot or "0")]


# A rolled-back candidate's engines count as idle only from a scrape this long after it left the routing
# table (the front re-reads its table each second in the harness; a request routed just before still counts).
RETIRE_SETTLE_SECONDS = 3.0


@dataclass(frozen=True)
class StepView:
    figures: M.Figures | None = None
    serving_requests: int | None = None
    old_live_requests: int | None = None
    retiring_live_requests: int | None = None


class StepFigures:
    """Per deployment (uid): the history of the rollout's scrapes. One per operator process."""

    def __init__(self, retention_s: float = 3600.0) -> None:
        self.histories: dict[str, SnapshotHistory] = {}
        self.retention_s = retention_s
        self._lock = threading.Lock()

    def forget(self, uid: str) -> None:
        with self._lock:
            self.histories.pop(uid, None)

    def _history(self, uid: str) -> SnapshotHistory:
        with self._lock:
            return self.histories.setdefault(uid, SnapshotHistory(retention_s=self.retention_s))

    def targets(self, state: M.State, pods: Sequence[Mapping[str, Any]]):
        engines = []
        routers = []
        if state.candidate_slot and state.candidate_revision:
            engines += slot_engine_pods(pods, state.candidate_slot, state.candidate_revision)
            routers += slot_router_pods(pods, state.candidate_slot)
        if state.phase not in (M.RECREATING,):
            routers += slot_router_pods(pods, state.serving_slot)
        if state.draining_revision:
            engines += slot_engine_pods(pods, state.draining_slot, state.draining_revision)
            routers += slot_router_pods(pods, state.draining_slot)
        if state.retiring_slot and state.candidate_revision:
            engines += slot_engine_pods(pods, state.retiring_slot, state.candidate_revision)
        out = []
        for p in engines:
            ip = (p.get("status") or {}).get("podIP")
            if ip and is_ready(p):
                out.append(vllm_target(p["metadata"]["name"], labels_of(p)[L.ROLE_LABEL], ip))
        for p in routers:
            ip = (p.get("status") or {}).get("podIP")
            if ip and is_ready(p):
                out.append(router_target(p["metadata"]["name"], ip))
        return out

    def observe(self, uid: str, state: M.State, pods: Sequence[Mapping[str, Any]], now: float,
                ttft_percentile: float, scraper=None) -> StepView:
        """Scrape what the step is judged on, then the candidate's figures since stepStartedAt, the serving
        revision's requests over the same window and the draining revision's live requests."""
        if state.phase not in (M.CANARY, M.PAUSED, M.DRAINING, M.STARTING) and not state.retiring_slot:
            return StepView()
        history = self._history(uid)
        targets = self.targets(state, pods)
        if targets:
            snapshots = (scraper or _scrape)(targets)
            history.add(snapshots)
            now = max([now, *(s.time for s in snapshots)])
        figures = serving_requests = None
        window = now - state.step_started_at if state.step_started_at else 0.0
        if state.phase in (M.CANARY, M.PAUSED) and window > 0:
            cand = slot_engine_pods(pods, state.candidate_slot, state.candidate_revision)
            windows = {}
            for role in ROLES:
                names = [p["metadata"]["name"] for p in cand if labels_of(p).get(L.ROLE_LABEL) == role]
                if names:
                    windows[role] = history.window_of(names, role, now, window, ttft_percentile)
            router = self._router_window(history, slot_router_pods(pods, state.candidate_slot), now, window)
            figures = M.candidate_figures(windows, router)
            serving = self._router_window(history, slot_router_pods(pods, state.serving_slot), now, window)
            serving_requests = None if serving is None else int(round(serving.requests))
        old_live = retiring_live = None
        if state.draining_revision:
            old_live = self._live(history, slot_engine_pods(pods, state.draining_slot, state.draining_revision))
        if state.retiring_slot:
            retiring_live = self._live(history, slot_engine_pods(pods, state.retiring_slot, state.candidate_revision),
                                       since=state.ended_at + RETIRE_SETTLE_SECONDS)
        return StepView(figures, serving_requests, old_live, retiring_live)

    @staticmethod
    def _live(history: SnapshotHistory, engines: Sequence[Mapping[str, Any]], since: float = 0.0) -> int | None:
        """Running + waiting requests over engine pods at their last scrape (at or after ``since``); 0 when there
        is no pod left; None while one has no such scrape. A pod never Ready and never scraped never served
        (its router routes only to Ready engines): it counts 0."""
        total = 0.0
        for p in engines:
            name = p["metadata"]["name"]
            ss = [s for s in history.snapshots(name) if s.ok and s.time >= since]
            if not ss:
                if not history.snapshots(name) and not is_ready(p):
                    continue
                return None
            total += sum(em.gauges.get(m.RUNNING, 0.0) + em.gauges.get(m.WAITING, 0.0) for em in ss[-1].engines.values())
        return int(round(total))

    @staticmethod
    def _router_window(history: SnapshotHistory, pods: Sequence[Mapping[str, Any]], now: float, window: float):
        snaps = {p["metadata"]["name"]: history.snapshots(p["metadata"]["name"]) for p in pods}
        snaps = {k: v for k, v in snaps.items() if v}
        return compute_router_window(snaps, now, window) if snaps else None


def _scrape(targets):
    return asyncio.run(scrape(targets))


def records_to_delete(records: Sequence[Mapping[str, Any]], live: set[str]) -> list[str]:
    """Names of ControllerRevisions to delete: all but the live revisions' and the newest other one (the
    previous serving revision, a fast way back after a promotion)."""
    def rev(cr):
        return labels_of(cr).get(L.REVISION_LABEL, "")
    others = sorted((cr for cr in records if rev(cr) not in live), key=lambda cr: int(cr.get("revision") or 0))
    return [cr["metadata"]["name"] for cr in others[:-1]]


# --- the planner during a rollout (docs/decisions/2026-12-01-rollouts.md §8.4) ------------------------------------

CANDIDATE_PHASES = (M.STARTING, M.CANARY, M.PAUSED)  # a candidate slot holds GPUs beside the serving one


def candidate_exists(status: Mapping[str, Any]) -> bool:
    r = status.get("rollout") or {}
    return r.get("phase") in CANDIDATE_PHASES and bool(r.get("candidateSlot"))


def serving_slot(status: Mapping[str, Any]) -> str | None:
    """The slot the planner sizes: None for a deployment that never rolled out (every pod is the serving one)."""
    r = status.get("rollout")
    return None if not r else (r.get("servingSlot") or "")


def planner_pod(labels: Mapping[str, str], slot: str | None) -> bool:
    """Whether the planner reads a pod (by its labels): the serving slot's engines, the front (the session
    proxy's leading signals) and the serving slot's router; every pod before a first rollout."""
    if slot is None:
        return True
    if labels.get(L.ROLE_LABEL) == L.ROUTER:
        return labels.get(L.FRONT_LABEL) == "true" or labels.get(L.SLOT_LABEL) == (slot or "0")
    return labels.get(L.SLOT_LABEL, "") == slot


def planner_targets(targets, pods_labels: Mapping[str, Mapping[str, str]]):
    """The front runs only the session proxy and a slot router only vllm-router: each is scraped for what it
    serves (a router target on the front, or a proxy target on a slot router, would only fail). A router pod
    from before every deployment had a front runs both (rollout/world.unscoped_router_live)."""
    out = []
    for t in targets:
        pod, proxy = (t.pod[:-len("/proxy")], True) if t.pod.endswith("/proxy") else (t.pod, False)
        labels = pods_labels.get(pod) or {}
        scoped = labels.get(L.FRONT_LABEL) == "true" or L.SLOT_LABEL in labels
        if labels.get(L.ROLE_LABEL) == L.ROUTER and scoped and (labels.get(L.FRONT_LABEL) == "true") != proxy:
            continue
        out.append(t)
    return out


def planner_budget(spec: Any, status: Mapping[str, Any]) -> int | None:
    """The GPU budget the planner may size the serving slot to: gpuBudget, and while a candidate exists
    gpuBudget + the surge allowance (maxSurgeGPUs, or status.rollout.surgeGPUs: the candidate's full size when
    the rollout started) - what the candidate holds (status.rollout.candidateReplicas; one replica per
    role plus the in-place hand-over in a status from before) + what InPlace handed over (the planner's count
    includes the replicas the serving slot gave the candidate), so both slots together stay within it."""
    budget = spec.autoscaling.gpu_budget
    if not budget or not candidate_exists(status):
        return budget or None
    r = status.get("rollout") or {}
    roles = resolve(spec).enabled_roles
    per_replica = sum(rr.gpus_per_replica for rr in roles)
    in_place = int(r.get("inPlace") or 0)
    size = r.get("candidateReplicas") or {}
    held = sum(rr.gpus_per_replica * int(size.get(rr.role, 1 + in_place) if size else 1 + in_place) for rr in roles)
    surge = spec.rollout.max_surge_gpus or int(r.get("surgeGPUs") or 0) or per_replica
    return max(0, budget + surge - held + in_place * per_replica)


def hold_scale_downs(decision: Any, why: str) -> Any:
    """A planner Decision with every scale-down held (a candidate exists: the serving slot's load is about to
    move, and the canary is judged against it)."""
    roles = {}
    for d in decision.roles():
        if d.desired < d.current:
            roles[d.role] = replace(d, desired=d.current, action="hold", reason=f"scale-down held: {why}")
    if not roles:
        return decision
    return replace(decision, **roles)
