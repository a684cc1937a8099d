"""kopf wiring: every trigger (a CR's spec moving, first sight of a CR, a child changing, the periodic tick)
asks the one scheduler for a pass of the same level-triggered reconcile.

* kopf's watch handlers only record the newest body (what the watch delivered) and ask for a pass; the scheduler
  runs passes on a bounded pool, one at a time per deployment, each with a deadline, so one stuck
  deployment never delays another, and retries failures with exponential backoff and one log line per
  step (a refused-for-capacity apply also becomes a Stalled condition naming it).
* Workloads (Deployments, LeaderWorkerSets) that we own are watched too: their status lands in a cache,
  so the periodic pass and a child's status change need no API read, and a deleted child is re-created.
* The periodic tick is our own loop, not a kopf timer: kopf puts a finalizer on every object that has a
  timer or daemon, which would block `kubectl delete` whenever the operator is down. Most ticks only
  observe (status from the cache, written only when it changed); every DRIFT_EVERY-th tick per
  deployment (staggered) re-applies its children and prunes strays (drift repair).
* The planner scrapes in its own bounded pool, off the reconcile path; a decision becomes a pass.

kopf is hardened as production kopf operators are (kopf_setup.py); the series are controller/metrics.py's.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from . import reconcile as rec
from . import kopf_setup
from .autoscale import Autoscaler, PlannerOutcome, same_decision
from .children import ChildCache
from ..render import labels as L
from ..render.engine import LWS_API_VERSION
from ..rollout import progress
from .kube import REQUEST_TIMEOUT, ChildRef, Kube, NotLeader
from .metrics import (APPLIED, BACKOFFS, PASS_OVERRUNS, PASS_WAIT, PASSES_RUNNING, PERIODIC_CYCLE, PLANNER_ERRORS,
                      PRUNED, QUEUE_DEPTH, READY, RECONCILE_SECONDS, RECONCILES, STALLED)
from .reconcile import Pass, reconcile

log = logging.getLogger(__name__)

TIMER_INTERVAL_SECONDS = 15.0  # status refresh + the planner's scrapes; the planner plans at its own cadence
# ticks: each deployment's children are re-applied and strays pruned every 5 min, staggered; a workload
# changed or deleted by someone else is re-applied at once (its watch event), so this catches the rest
# (a Service or ConfigMap edited by hand)
DRIFT_EVERY = 20
# a drift slot is skipped when a full pass applied the children less than this many ticks ago: right after a
# burst of new CRs (or a restart's resume passes) their slots would otherwise re-apply what was just applied,
# hundreds of full passes queued behind the burst (measured at 500, docs/2026-12-01-ha-and-scale.md)
DRIFT_RECENT_TICKS = DRIFT_EVERY // 2
PASS_WORKERS = 16  # reconcile passes at once (each applies its children concurrently on Kube's pool)
# of those, workers that take only urgent passes: a new CR or a spec change never waits for a periodic,
# watch-driven or planner pass to finish (at 500 deployments every other worker is busy most of the time)
URGENT_WORKERS = 4
PLANNER_WORKERS = 8  # planner scrapes at once
PASS_DEADLINE_SECONDS = 60.0  # a pass still running then is left to finish on its own; others go on
BACKOFF_SECONDS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 300.0)
URGENT = ("create", "update", "resume")  # passes that go before periodic, watch-driven and planner ones

_kube: Kube | None = None
_autoscaler: Autoscaler | None = None
_fence: Any = None


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
        _kube.fence = _fence
    return _kube


def set_fence(fence) -> None:
    """Writes happen only while fence() is True (leader election)."""
    global _fence
    _fence = fence
    if _kube is not None:
        _kube.fence = fence


def autoscaler() -> Autoscaler:
    global _autoscaler
    if _autoscaler is None:
        _autoscaler = Autoscaler(kube())
    return _autoscaler


# -- what the watches delivered ------------------------------------------------------------------------------

_bodies: dict[str, dict[str, Any]] = {}  # uid -> the newest V41FlashDeployment body we know
_children = ChildCache()
_pruned_against: dict[str, frozenset[ChildRef]] = {}  # uid -> the desired set the last full pass converged to
_applied_generation: dict[str, int] = {}  # uid -> the generation this process last applied
_applied_at: dict[str, float] = {}  # uid -> when (monotonic) a full pass last applied its children


def _remember(body: dict[str, Any]) -> None:
    """Keep the newer of two bodies (resourceVersion as a number: etcd's revision, as clients commonly do)."""
    uid = body["metadata"]["uid"]
    old = _bodies.get(uid)
    try:
        if old is not None and int(old["metadata"]["resourceVersion"]) > int(body["metadata"]["resourceVersion"]):
            return
    except (KeyError, TypeError, ValueError):
        pass
    _bodies[uid] = body


def _seen(workload: dict[str, Any]) -> None:
    """A workload as our apply returned it: known before its watch event, which then asks for no pass."""
    _children.seen(workload)


def _forget(uid: str, namespace: str, name: str) -> None:
    _bodies.pop(uid, None)
    _children.forget(uid)
    _pruned_against.pop(uid, None)
    _applied_generation.pop(uid, None)
    _applied_at.pop(uid, None)
    rec.forget(uid)
    if _autoscaler is not None:
        _autoscaler.forget(uid, namespace, name)
    for gauge in (STALLED, READY):
        try:
            gauge.remove(namespace, name)
        except KeyError:
            pass


# -- one pass ------------------------------------------------------------------------------------------------

@dataclass
class Work:
    trigger: str = "periodic"
    full: bool = False  # apply the children (else observe)
    prune: bool = False  # list and prune whatever the desired set
    planner: PlannerOutcome | None = None
    requested: float = 0.0
    cycles: tuple = ()  # the periodic ticks waiting for this pass

    def merge(self, other: Work) -> Work:
        return Work(trigger=self.trigger if self.trigger != "periodic" else other.trigger,
                    full=self.full or other.full, prune=self.prune or other.prune,
                    planner=other.planner or self.planner, requested=min(self.requested, other.requested),
                    cycles=self.cycles + other.cycles)

    def done(self, uid: str) -> None:
        for cycle in self.cycles:
            cycle.done(uid)


class CapacityRefused(Exception):
    """The cluster has no room for a child (Service range full, quota): retried with backoff."""


def run_pass(uid: str, work: Work) -> rec.Outcome | None:
    """One pass for one deployment (a worker thread). None = the deployment is gone."""
    body = _bodies.get(uid)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    generation = meta.get("generation", 1)
    full = work.full or _applied_generation.get(uid) != generation  # observe only what we applied ourselves
    how = Pass(apply=full, prune=True if work.prune else (_pruned_against.get(uid, True) if full else False),
               workloads=_children.of, seen=_seen)
    if work.trigger == "create" and not work.prune:
        how = Pass(apply=True, prune=False, workloads=_children.of, seen=_seen)  # a new uid owns nothing yet
    trigger = work.trigger if full or work.trigger != "periodic" else "observe"
    planned = work.planner
    if planned is not None:
        # the planner decided from the body of its start; if status has since recorded the same decision
        # (only its figures moved), keep that record: otherwise an older copy would be written back (churn)
        now_recorded = (body.get("status") or {}).get("lastDecision") or {}
        decided = planned.status.get("lastDecision")
        if decided is not None and now_recorded and same_decision(now_recorded, decided):
            planned = replace(planned, status={**planned.status, "lastDecision": now_recorded})

    def emit(type_: str, reason: str, message: str) -> None:
        kube().post_event_soon(body, type_, reason, message)  # an Event is news, not a step of the pass

    with RECONCILE_SECONDS.labels(trigger).time(), kube().urgent(work.trigger in URGENT):
        try:
            outcome = reconcile(kube(), body, emit, planner=planned, how=how)
            if outcome.conflict:  # the CR changed since the watch delivered it: read it once
                try:
                    fresh = kube().custom.get_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, name,
                                                                       _request_timeout=REQUEST_TIMEOUT)
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise
                if fresh["metadata"]["uid"] != uid or fresh["metadata"].get("deletionTimestamp"):
                    return None
                _remember(fresh)
                if fresh.get("spec") == body.get("spec") and fresh.get("status") == body.get("status"):
                    # only metadata moved (kopf's own annotation after a create/update): write what we computed
                    outcome.body = kube().patch_status(ns, name, outcome.status, fresh["metadata"]["resourceVersion"])
                    outcome.status_written, outcome.conflict = True, False
                else:  # the children are applied already: status from a fresh view is all that is left
                    body = _bodies[uid]
                    outcome = reconcile(kube(), body, emit, planner=planned,
                                        how=Pass(apply=False, workloads=_children.of) if full else how)
        except rec.NamespaceTerminating as exc:  # the deployment goes with its namespace: nothing to retry
            log.info("%s/%s: %s; not reconciling it", ns, name, exc)
            return None
        except Exception:
            RECONCILES.labels(trigger, "error").inc()
            raise
    if outcome.body is not None:
        _remember(outcome.body)
    if full and outcome.stall is None:
        _applied_generation[uid] = generation
        _applied_at[uid] = time.monotonic()
        _pruned_against[uid] = outcome.desired
    RECONCILES.labels(trigger, "capacity" if outcome.capacity else "stalled" if outcome.stall else "ok").inc()
    for item in outcome.applied:
        APPLIED.labels(item.split("/")[0]).inc()
    for item in outcome.pruned:
        PRUNED.labels(item.split("/")[0]).inc()
    STALLED.labels(ns, name).set(1 if outcome.stall else 0)
    ready = next((c for c in outcome.status["conditions"] if c["type"] == "Ready"), {})
    READY.labels(ns, name).set(1 if ready.get("status") == "True" else 0)
    if outcome.applied or outcome.pruned:
        log.info("%s/%s reconciled (%s): applied=%s pruned=%s ready=%s", ns, name, trigger, outcome.applied,
                 outcome.pruned, ready.get("reason"))
    if outcome.capacity:
        raise CapacityRefused(outcome.stall.message if outcome.stall else "refused for capacity")
    return outcome


# -- the scheduler -------------------------------------------------------------------------------------------

class Cycle:
    """One periodic tick: how long until every deployment it asked for had its pass."""

    def __init__(self, uids: set[str]):
        self.started = time.monotonic()
        self.left = set(uids)
        if not self.left:
            PERIODIC_CYCLE.observe(0.0)

    def done(self, uid: str) -> None:
        if uid in self.left:
            self.left.discard(uid)
            if not self.left:
                PERIODIC_CYCLE.observe(time.monotonic() - self.started)


class Scheduler:
    """Passes on a bounded pool: at most one per deployment at a time, each with a deadline, with backoff."""

    def __init__(self, workers: int = PASS_WORKERS, deadline: float = PASS_DEADLINE_SECONDS,
                 reserved: int = URGENT_WORKERS):
        """workers passes at once, `reserved` of them for urgent passes only (create/update/resume)."""
        if not 0 <= reserved < workers:
            raise ValueError(f"reserved: {reserved} urgent workers of {workers}: leave at least one for the rest")
        self.workers, self.reserved, self.deadline = workers, reserved, deadline
        self.pool = ThreadPoolExecutor(workers * 2, thread_name_prefix="pass")  # room beside stuck passes
        # (priority, sequence, uid): a spec change or a new CR goes before the periodic and watch-driven
        # refreshes, so one more CR among hundreds does not wait for a whole tick's worth of them
        self.queue: asyncio.PriorityQueue[tuple[int, int, str]] = asyncio.PriorityQueue()
        # urgent entries are also put here, for the reserved workers; whichever worker takes an entry first
        # runs it, the other copy is then stale and skipped like any other
        self.urgent_queue: asyncio.Queue[tuple[int, int, str]] = asyncio.Queue()
        self.seq = 0
        self.pending: dict[str, Work] = {}
        self.queued: dict[str, int] = {}  # uid -> the best priority it is queued at
        self.running: set[str] = set()
        self.failures: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.tasks: list[asyncio.Task] = []
        self.follow_ups: set[str] = set()  # uids with a rollout pass scheduled (ROLLOUT_PASS_SECONDS)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker(self.queue)) for _ in range(self.workers - self.reserved)]
        self.tasks += [asyncio.create_task(self._worker(self.urgent_queue)) for _ in range(self.reserved)]

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def request(self, uid: str, work: Work) -> None:
        work.requested = work.requested or time.monotonic()
        if work.trigger == "periodic" and time.monotonic() < self.not_before.get(uid, 0.0):
            work.done(uid)  # backing off: its pass comes at the backoff's time
            return
        self.pending[uid] = self.pending[uid].merge(work) if uid in self.pending else work
        self._enqueue(uid)

    def _enqueue(self, uid: str) -> None:
        if uid in self.running:
            return  # queued again when the running pass finishes
        prio = 0 if self.pending[uid].trigger in URGENT else 1
        if self.queued.get(uid, 2) <= prio:
            return
        self.queued[uid] = prio
        self.seq += 1
        self.queue.put_nowait((prio, self.seq, uid))
        if prio == 0 and self.reserved:
            self.urgent_queue.put_nowait((prio, self.seq, uid))
        QUEUE_DEPTH.set(len(self.queued))

    def forget(self, uid: str) -> None:
        work = self.pending.pop(uid, None)
        if work is not None:
            work.done(uid)
        self.queued.pop(uid, None)
        self.failures.pop(uid, None)
        self.not_before.pop(uid, None)

    async def _worker(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, uid = await queue.get()
            if uid in self.running or uid not in self.pending:
                continue  # a stale entry (it was queued again at a better priority, or taken from the other queue)
            if queue is self.urgent_queue and self.pending[uid].trigger not in URGENT:
                continue  # taken already; what is pending now is background work, queued as such
            self.queued.pop(uid, None)
            QUEUE_DEPTH.set(len(self.queued))
            work = self.pending.pop(uid)
            PASS_WAIT.labels("urgent" if work.trigger in URGENT else "background").observe(
                max(0.0, time.monotonic() - work.requested))
            self.running.add(uid)
            PASSES_RUNNING.set(len(self.running))
            fut = loop.run_in_executor(self.pool, run_pass, uid, work)
            done, _ = await asyncio.wait({fut}, timeout=self.deadline)
            if not done:
                PASS_OVERRUNS.labels("reconcile").inc()
                log.warning("pass of %s still running after %.0f s; other deployments go on", self._name(uid),
                            self.deadline)
            fut.add_done_callback(lambda f, uid=uid, work=work: self._finished(uid, work, f))

    def _name(self, uid: str) -> str:
        meta = (_bodies.get(uid) or {}).get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def _finished(self, uid: str, work: Work, fut: asyncio.Future) -> None:
        self.running.discard(uid)
        PASSES_RUNNING.set(len(self.running))
        work.done(uid)
        exc = None if fut.cancelled() else fut.exception()
        if exc is None:
            outcome = fut.result()
            if outcome is not None and progress.active(outcome.status) and uid not in self.follow_ups:
                # a rollout acts on its own clock (steps, deadlines, drains): its next pass comes soon
                self.follow_ups.add(uid)
                asyncio.get_running_loop().call_later(progress.ROLLOUT_PASS_SECONDS, self._follow_up, uid)
            if self.failures.pop(uid, None):
                log.info("%s: pass succeeded again", self._name(uid))
            self.not_before.pop(uid, None)
        elif isinstance(exc, NotLeader):
            return  # leadership ended: the process restarts as a candidate
        elif uid in _bodies:
            self._backoff(uid, work, exc)
        if uid in self.pending:
            self._enqueue(uid)

    def _follow_up(self, uid: str) -> None:
        self.follow_ups.discard(uid)
        if uid in _bodies:
            self.request(uid, Work(trigger="rollout", full=True))

    def _backoff(self, uid: str, work: Work, exc: BaseException) -> None:
        n = self.failures.get(uid, 0)
        self.failures[uid] = n + 1
        delay = BACKOFF_SECONDS[min(n, len(BACKOFF_SECONDS) - 1)] * random.uniform(0.9, 1.1)
        self.not_before[uid] = time.monotonic() + delay
        cause = "capacity" if isinstance(exc, CapacityRefused) else "error"
        BACKOFFS.labels(cause).inc()
        what = str(exc) if isinstance(exc, CapacityRefused) else \
            f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
        # one line per backoff step; the traceback only the first time (a bug, not a busy cluster)
        log.warning("%s: pass failed (%s); retry %d in %.0f s", self._name(uid), what, n + 1, delay,
                    exc_info=exc if n == 0 and cause == "error" else None)
        retry = Work(trigger="retry", full=True, prune=work.prune, planner=work.planner)
        asyncio.get_running_loop().call_later(delay, self.request, uid, retry)


_scheduler: Scheduler | None = None


def _request(uid: str, work: Work) -> None:
    if _scheduler is not None:
        _scheduler.request(uid, work)


# -- the planner, off the reconcile path ---------------------------------------------------------------------

def _plan(body: dict[str, Any]) -> PlannerOutcome | None:
    """The planner's pass; any failure leaves replicas as they are (and says so), never breaks reconcile."""
    try:
        spec = api.V41FlashDeploymentSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return None  # reconcile reports the invalid spec as Stalled
    if not spec.autoscaling.enabled:
        return None
    try:
        return autoscaler().step(body, spec)
    except Exception as exc:
        PLANNER_ERRORS.inc()
        # the apiserver away (a restart) is one line; anything else is a bug and keeps its traceback
        away = isinstance(exc, (ApiException, urllib3.exceptions.HTTPError, OSError))
        log.warning("planner pass of %s/%s failed (%s: %s); replicas stay as they are",
                    body["metadata"]["namespace"], body["metadata"]["name"], type(exc).__name__,
                    getattr(exc, "reason", None) or exc, exc_info=None if away else exc)
        return None


def _autoscaled(body: dict[str, Any]) -> bool:
    return bool(((body.get("spec") or {}).get("autoscaling") or {}).get("enabled", False))


class Planners:
    """Scrape and plan per autoscaled deployment, bounded and deadlined, one at a time per deployment."""

    def __init__(self, workers: int = PLANNER_WORKERS, deadline: float = TIMER_INTERVAL_SECONDS):
        self.pool = ThreadPoolExecutor(workers * 2, thread_name_prefix="planner")
        self.sem = asyncio.Semaphore(workers)
        self.deadline = deadline
        self.running: set[str] = set()

    async def run(self, uid: str) -> None:
        body = _bodies.get(uid)
        if body is None or uid in self.running:
            return
        if _applied_generation.get(uid) != body["metadata"].get("generation", 1):
            # its first pass (or the one for a new spec) has not run yet: there is nothing to scale, and a
            # decision now would compare against a status without replicas and queue one more full pass
            # (after a burst of 500 new CRs, each one's planner did)
            return
        self.running.add(uid)
        async with self.sem:
            fut = asyncio.get_running_loop().run_in_executor(self.pool, _plan, body)
            fut.add_done_callback(lambda f: self.running.discard(uid))
            done, _ = await asyncio.wait({fut}, timeout=self.deadline)
        if not done:
            PASS_OVERRUNS.labels("planner").inc()
            log.warning("planner pass of %s/%s still running after %.0f s (slow engines' /metrics?)",
                        body["metadata"]["namespace"], body["metadata"]["name"], self.deadline)
            return
        outcome = fut.result()
        if outcome is not None:
            # new replicas are applied; a hold (or the same numbers) only refreshes status
            status = body.get("status") or {}
            moved = any(n != (status.get(role) or {}).get("desiredReplicas") for role, n in outcome.desired.items())
            _request(uid, Work(trigger="planner", full=moved, planner=outcome))


_planner_tasks: set[asyncio.Task] = set()


def periodic_work(uid: str, tick: int, interval: float, cycle: Cycle | None = None,
                  now: float | None = None) -> Work:
    """A tick's pass for one deployment: observe, or at its staggered drift slot (every DRIFT_EVERY-th tick)
    re-apply and prune — unless a full pass applied its children within the last DRIFT_RECENT_TICKS ticks."""
    now = time.monotonic() if now is None else now
    slot = (zlib.crc32(uid.encode()) + tick) % DRIFT_EVERY == 0
    recent = now - _applied_at.get(uid, float("-inf")) < DRIFT_RECENT_TICKS * interval
    drift = slot and not recent
    return Work(trigger="periodic", full=drift, prune=drift, cycles=(cycle,) if cycle else ())


async def _periodic(interval: float, scheduler: Scheduler, planners: Planners) -> None:
    tick = 0
    while True:
        await asyncio.sleep(interval)
        tick += 1
        uids = list(_bodies)
        cycle = Cycle(set(uids))
        for uid in uids:
            scheduler.request(uid, periodic_work(uid, tick, interval, cycle))
            if _autoscaled(_bodies.get(uid) or {}):
                task = asyncio.create_task(planners.run(uid))
                _planner_tasks.add(task)
                task.add_done_callback(_planner_tasks.discard)


# -- kopf ----------------------------------------------------------------------------------------------------

@kopf.on.login()
def login(settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf connects with the very configuration the operator loaded (--kubeconfig, in-cluster, default)."""
    if _kube is None:
        return kopf.login_via_client(settings=settings, **kwargs)
    return kopf_setup.connection_info(_kube.api_client.configuration, settings)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    kopf_setup.harden(settings)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def track(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    """Every V41FlashDeployment event: keep the newest body (no re-read) and ask for a pass when the spec
    moved. Level-triggered from the watch alone: no kopf change handlers, so kopf writes nothing on the CR
    (no diff-base annotation racing our status write).

    First sight in this process: from kopf's initial listing (event type None) it may own children from
    an earlier process (list and prune: "resume"); a new object (ADDED) owns nothing yet ("create").
    """
    meta = body["metadata"]
    uid = meta["uid"]
    kind = event.get("type")
    if kind == "DELETED":
        if _scheduler is not None:
            _scheduler.forget(uid)
        _forget(uid, meta["namespace"], meta["name"])
        return
    old = _bodies.get(uid)
    _remember(_raw(body))
    if meta.get("deletionTimestamp"):
        return
    if old is None:
        reason = "create" if kind == "ADDED" else "resume"
        _request(uid, Work(trigger=reason, full=True, prune=reason == "resume"))
    elif old["metadata"].get("generation") != meta.get("generation"):
        _request(uid, Work(trigger="update", full=True))  # lists only if the desired set moved
    elif _rollout_action(old["metadata"]) != _rollout_action(meta):  # kubectl annotate ... rollout-action=<verb>/<rev>
        _request(uid, Work(trigger="update", full=True))


async def _child_event(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    """A workload of ours changed: its owner's status may have (observe). Deleted, or its spec changed by
    someone else (a generation our own apply did not return): re-apply at once (drift repair)."""
    kind = event.get("type")
    old = _children.get(body)
    owner, changed = _children.update(kind, body)
    if owner is None or owner not in _bodies or not changed:
        return
    meta = body.get("metadata") or {}
    ref = ChildRef(body["apiVersion"], body["kind"], meta.get("name"))
    ours = rec._applied_rv.get(owner, {}).get(ref)
    if kind == "DELETED" and not _newer(ours, meta.get("resourceVersion")):
        # no longer ours: the next pass reads the name again (someone else may have taken it) before it applies
        rec._applied_rv.get(owner, {}).pop(ref, None)
    drifted = kind == "DELETED" or (old is not None and old["metadata"]["generation"] != meta.get("generation")
                                    and ours != meta.get("resourceVersion"))
    _request(owner, Work(trigger="child", full=drifted))


def _newer(recorded: str | None, deleted: str | None) -> bool:
    """Whether the version we recorded is newer than a DELETED event's (a pass re-created the child before the
    event was handled). Versions compared as numbers (etcd's revision), as _remember does; unknown → not newer."""
    try:
        return recorded is not None and deleted is not None and int(recorded) > int(deleted)
    except ValueError:
        return False


_OURS = {L.MANAGED_BY_LABEL: L.MANAGED_BY}
kopf.on.event("apps", "v1", "deployments", labels=_OURS)(_child_event)
kopf.on.event(*LWS_API_VERSION.split("/"), "leaderworkersets", labels=_OURS)(_child_event)


def _rollout_action(meta: Any) -> str | None:
    """The rollout-action annotation: it moves no generation, so its change alone asks for a pass."""
    return (meta.get("annotations") or {}).get(api.ROLLOUT_ACTION_ANNOTATION)


def _raw(body: Any) -> dict[str, Any]:
    """A plain dict of a kopf Body (kopf hands out read-only views of the raw event object)."""
    import copy
    return copy.deepcopy(dict(body))


@kopf.on.startup()
async def start_periodic(memo: kopf.Memo, **_: Any) -> None:
    global _scheduler
    _scheduler = Scheduler()
    _scheduler.start()
    memo["periodic"] = asyncio.create_task(_periodic(TIMER_INTERVAL_SECONDS, _scheduler, Planners()))


@kopf.on.cleanup()
async def stop_periodic(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("periodic")
    if task:
        task.cancel()
    if _scheduler is not None:
        _scheduler.stop()
