"""Engine health's edge: every few seconds (``interval_for``: a tenth of spec.engineHealth.hang.seconds, 1 to 3 s)
scrape each deployment's engine pods (SCRAPE_DEADLINE_S each), run the hang watchdog and the straggler finder
(health/, pure), and act on what they find. A hang is acted on at most N + interval + scrape deadline (N + 5 s)
after the engine's last progress.

How an engine leaves routing: its pod is deleted. The pod is then terminating: vllm-router's discovery drops it on
the event that shows the deletion, Services and InferencePools stop selecting it once it is not Ready (kubelet marks
it at once), so no new request reaches it; its workload (ReplicaSet, or LeaderWorkerSet for a DEP group: the group
is recreated when its leader goes) starts the replacement at once, and a terminating pod is no replica the planner
counts. A hung engine is deleted with a short grace (nothing on it will finish); a straggler with its own, so its
preStop drain lets the streams it holds finish. One unit per role at a time, never the role's last Ready one.

What it reports: a Warning Event (EngineHung, Straggler) naming the pod and what was measured; status.engineHealth
and the conditions EngineHung / Straggler (abnormal polarity: present while an entry of the last HOLD_SECONDS is);
the series v41flash_engine_hangs_total, v41flash_engine_stragglers_total and v41flash_engine_replaced_total.
The status fields are this module's: the one status function carries them over (controller/status.py), and this
writes them with the same optimistic lock, only when they change.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..health import stragglers as S
from ..health import watchdog as W
from ..metrics.scrape import scrape, vllm_target
from ..metrics.window import PodSnapshot
from ..pods import ready_condition
from ..render import labels as L
from ..roles import ROLES
from .kube import KubeAPI
from .metrics import HANGS, REPLACED, STRAGGLERS
from .observation import owned_pod, pod_view

log = logging.getLogger(__name__)

ENGINE_HUNG, STRAGGLER = "EngineHung", "Straggler"
HEALTH_CONDITIONS = (ENGINE_HUNG, STRAGGLER)  # the conditions this module owns (status.py carries them over)
STATUS_KEY = "engineHealth"
HOLD_SECONDS = 600  # an entry (and its condition) stays this long after the engine was replaced
HUNG_GRACE_SECONDS = 10  # a hung engine finishes nothing: SIGTERM, then SIGKILL, without the preStop drain
SCRAPE_DEADLINE_S = 2.0  # a page is a few KiB: an engine that cannot send it in 2 s is not answering
LIST_EVERY_S = 15.0  # the engine pods are listed this often (and again before acting), not on every check
SPEC_KEY = "engineHealth"  # spec.engineHealth


def engine_health_spec(body: Mapping[str, Any]) -> api.EngineHealthSpec:
    """spec.engineHealth alone (the rest of a spec, valid or not, does not change what engine health does)."""
    try:
        return api.EngineHealthSpec.model_validate((body.get("spec") or {}).get(SPEC_KEY) or {})
    except ValueError:
        return api.EngineHealthSpec()


def interval_for(spec: api.EngineHealthSpec) -> float:
    """Seconds between a deployment's checks: a tenth of the hang threshold, 1 to 3 s."""
    return min(3.0, max(1.0, spec.hang.seconds / 10))
STATE = {ENGINE_HUNG: "Hung", STRAGGLER: "Straggler"}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return 0.0


@dataclass
class DeploymentHealth:
    """What engine health keeps per deployment between ticks (lost on a restart: one window to learn again)."""
    progress: dict[str, W.Progress] = field(default_factory=dict)
    history: dict[str, deque] = field(default_factory=dict)  # pod -> its recent snapshots (a window's worth)
    engines: list = field(default_factory=list)  # the engine pods as last listed
    listed_at: float = float("-inf")  # monotonic


@dataclass(frozen=True)
class Engine:
    name: str
    uid: str
    role: str
    unit: str  # the pod, or its DEP group (named as its leader pod)
    ip: str
    ready: bool
    deleting: bool


def engines_of(pods: Sequence[Any], name: str) -> list[Engine]:
    """The deployment's own engine pods that serve HTTP (LWS workers run --headless and carry no SERVING_LABEL)."""
    out = []
    for p in pods:
        labels = p.metadata.labels or {}
        view = pod_view(p)
        if view.role not in ROLES or labels.get(L.SERVING_LABEL) != "true" or not owned_pod(view, name) or not view.ip:
            continue
        out.append(Engine(view.name, p.metadata.uid, view.role, S.group_of(labels, view.name), view.ip,
                          ready_condition(p) is not None, view.deleting))
    return out


def entry(kind: str, unit: str, role: str, now: float, message: str) -> dict[str, str]:
    return {"pod": unit, "role": role, "state": STATE[kind], "since": _iso(now), "message": message}


def health_status(previous: Mapping[str, Any], new: Sequence[dict[str, str]], now: float, generation: int
                  ) -> dict[str, Any]:
    """status.engineHealth (the last HOLD_SECONDS' entries, newest last) and this module's conditions, from the
    previous status and the entries found now; every other condition as it was."""
    kept = [e for e in previous.get(STATUS_KEY) or [] if now - _epoch(e.get("since", "")) < HOLD_SECONDS]
    entries = (kept + list(new))[-20:]
    conditions = [c for c in previous.get("conditions") or [] if c.get("type") not in HEALTH_CONDITIONS]
    prev = {c.get("type"): c for c in previous.get("conditions") or []}
    for kind in HEALTH_CONDITIONS:
        mine = [e for e in entries if e["state"] == STATE[kind]]
        if not mine:
            continue
        last = mine[-1]
        message = f"{len(mine)} replaced in the last {HOLD_SECONDS // 60} min; last: {last['message']}"
        before = prev.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == "True" else _iso(now)
        conditions.append({"type": kind, "status": "True", "reason": f"{STATE[kind]}Replaced", "message": message,
                           "observedGeneration": generation, "lastTransitionTime": since or _iso(now)})
    return {STATUS_KEY: entries, "conditions": conditions}


def decide(engines: Sequence[Engine], hung: Sequence[W.Hung], slow: Sequence[S.Straggler]
           ) -> list[tuple[str, str, str, str]]:
    """What to replace now: (kind, unit, role, message); hung first, one unit per role at a time, never while a
    pod of the role is already terminating, never the role's last Ready unit."""
    out: list[tuple[str, str, str, str]] = []
    by_pod = {e.name: e for e in engines}
    busy = {e.role for e in engines if e.deleting}
    for kind, unit, role, message in (
            *((ENGINE_HUNG, by_pod[h.pod].unit, h.role, h.message()) for h in hung if h.pod in by_pod),
            *((STRAGGLER, s.unit, s.role, None) for s in slow)):
        ready_units = {e.unit for e in engines if e.role == role and e.ready and not e.deleting}
        if role in busy or not (ready_units - {unit}):
            continue
        busy.add(role)
        out.append((kind, unit, role, message or ""))
    return out


class EngineHealth:
    def __init__(self, kube: KubeAPI):
        self.kube = kube
        self.states: dict[str, DeploymentHealth] = {}
        self.unwritten: dict[str, list[dict[str, str]]] = {}  # uid -> entries a refused status write still owes

    def forget(self, uid: str) -> None:
        self.states.pop(uid, None)
        self.unwritten.pop(uid, None)

    def check(self, body: dict[str, Any], now: float | None = None) -> None:
        """One tick for one deployment: scrape its engines, find hung ones and stragglers, replace, report."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        cfg = engine_health_spec(body)
        if not cfg.hang.enabled and not cfg.straggler.enabled:
            self.forget(uid)
            return
        state = self.states.setdefault(uid, DeploymentHealth())
        if time.monotonic() - state.listed_at >= LIST_EVERY_S:
            self._list(state, ns, name)
        live = [e for e in state.engines if not e.deleting]
        targets = [vllm_target(e.name, e.role, e.ip) for e in live]
        snapshots = asyncio.run(scrape(targets, timeout_s=SCRAPE_DEADLINE_S)) if targets else []
        now = max([now or time.time(), *(s.time for s in snapshots)])
        hung: list[W.Hung] = []
        if cfg.hang.enabled:
            state.progress, hung = W.watch(state.progress, snapshots, cfg.hang.seconds)
        slow: list[S.Straggler] = []
        if cfg.straggler.enabled:
            slow = self._stragglers(state, snapshots, live, now, cfg.straggler)
        new = []
        if hung or slow:
            self._list(state, ns, name)  # act on what runs now: Ready, terminating, the pods' uids
            live = [e for e in state.engines if not e.deleting]
            for kind, unit, role, message in decide(state.engines, hung, slow):
                if kind == STRAGGLER:
                    message = next(x for x in slow if x.unit == unit).message(cfg.straggler.window_seconds)
                if not self._replace(body, [e for e in live if e.unit == unit], kind, role, message):
                    continue
                new.append(entry(kind, unit, role, now, message))
                for e in live:
                    if e.unit == unit:
                        state.progress.pop(e.name, None)
                        state.history.pop(e.name, None)
                state.listed_at = float("-inf")  # list again next tick: its replacement
        self._report(body, self.unwritten.pop(uid, []) + new, now)

    def _list(self, state: DeploymentHealth, ns: str, name: str) -> None:
        state.engines = engines_of(self.kube.list_pods(ns, L.label_selector({L.DEPLOYMENT_LABEL: name})), name)
        state.listed_at = time.monotonic()

    def _stragglers(self, state: DeploymentHealth, snapshots: Sequence[PodSnapshot], live: Sequence[Engine],
                    now: float, cfg: api.StragglerSpec) -> list[S.Straggler]:
        keep = cfg.window_seconds + 15
        for s in snapshots:
            h = state.history.setdefault(s.pod, deque())
            h.append(s)
            while h and h[0].time < now - keep:
                h.popleft()
        names = {e.name for e in live}
        for pod in [p for p in state.history if p not in names]:
            del state.history[pod]
        units = {e.name: e.unit for e in live if e.ready}
        figures = [f for pod, unit in units.items()
                   if (f := S.latency_over(list(state.history.get(pod, ())), now, cfg.window_seconds, unit))]
        return S.find_stragglers(figures, cfg.ratio)

    def _replace(self, body: dict[str, Any], unit_pods: Sequence[Engine], kind: str, role: str, message: str) -> bool:
        """Delete the unit's pod (a DEP group: its leader; the LeaderWorkerSet recreates the group) and say so."""
        if not unit_pods:
            return False
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        leader = next((e for e in unit_pods if e.name == e.unit), unit_pods[0])
        grace = HUNG_GRACE_SECONDS if kind == ENGINE_HUNG else None
        what = "taken out of routing and replaced" + (" (no drain: nothing on it progresses)" if grace else
                                                      " (it drains the streams it holds for its preStop deadline)")
        log.warning("%s/%s: %s; %s", ns, name, message, what)
        (HANGS if kind == ENGINE_HUNG else STRAGGLERS).labels(ns, name, role).inc()
        try:
            self.kube.delete_pod(ns, leader.name, leader.uid, grace)
        except ApiException as exc:
            log.warning("%s/%s: cannot delete %s (%s); next tick retries", ns, name, leader.name, exc.reason)
            return False
        REPLACED.labels(ns, name, role, STATE[kind]).inc()
        self.kube.post_event_soon(body, "Warning", kind, f"{message}: {what}")
        return True

    def _report(self, body: dict[str, Any], new: Sequence[dict[str, str]], now: float) -> None:
        previous = body.get("status") or {}
        mine = health_status(previous, new, now, body["metadata"].get("generation", 1))
        if (previous.get(STATUS_KEY) or []) == mine[STATUS_KEY] and (previous.get("conditions") or []) == \
                mine["conditions"]:
            return
        status = {**previous, **mine}
        if not status.get(STATUS_KEY):
            status.pop(STATUS_KEY, None)
        meta = body["metadata"]
        try:
            self.kube.patch_status(meta["namespace"], meta["name"], status, meta["resourceVersion"])
        except ApiException as exc:  # a stale view (the 'test' op): the next tick writes from the newer body
            if new:  # never lose an entry: it is written with the next tick's
                log.info("%s/%s: engine health status not written (%s); retried next tick", meta["namespace"],
                         meta["name"], exc.reason)
                self.unwritten.setdefault(meta["uid"], []).extend(new)


class HealthLoop:
    """Each deployment's check when it is due (interval_for its spec), on a bounded pool, one at a time per
    deployment."""

    def __init__(self, rt: Any, workers: int = 4):
        self.rt = rt
        self.health = EngineHealth(rt.kube)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="engine-health")
        self.running: set[str] = set()
        self.due: dict[str, float] = {}  # uid -> monotonic time of its next check

    def _one(self, uid: str) -> None:
        try:
            body = self.rt.memory.body(uid)
            if body is not None and not body["metadata"].get("deletionTimestamp"):
                self.health.check(body)
            elif body is None:
                self.health.forget(uid)
        except Exception as exc:  # noqa: BLE001 - one deployment's failure never stops the others
            log.warning("engine health check of %s failed: %s: %s", uid, type(exc).__name__, exc,
                        exc_info=not isinstance(exc, (ApiException, OSError)))
        finally:
            self.running.discard(uid)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            known = set(self.rt.memory.known())
            for uid in [u for u in self.due if u not in known]:
                del self.due[uid]
                self.health.forget(uid)
            for uid in known:
                if uid in self.running or now < self.due.get(uid, 0.0):
                    continue
                self.due[uid] = now + interval_for(engine_health_spec(self.rt.memory.body(uid) or {}))
                self.running.add(uid)
                self.pool.submit(self._one, uid)
