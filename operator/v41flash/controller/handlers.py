"""kopf wiring: every trigger (create, update, resume, periodic) runs the same reconcile.

The periodic pass is our own loop over the CRs seen by a watch-event handler, not a kopf timer: kopf
puts a finalizer on every object that has a timer or daemon, which would block `kubectl delete` of a
deployment whenever the operator is down or uninstalled. Children need no finalizer either: they are
garbage-collected through their ownerReferences.

Hardened as production kopf operators are: our own annotation prefix and finalizer name, bounded watch
timeouts, no progress annotations copied anywhere (children are built by the renderer from the spec only),
handler return values never dumped into status, and per-object serialization so a periodic pass and
an update pass never interleave.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Gauge, Histogram

from ..api import v1alpha1 as api
from .autoscale import Autoscaler, PlannerOutcome
from .kube import REQUEST_TIMEOUT, Kube
from .reconcile import reconcile
from .redact import RedactingDiffBaseStorage

log = logging.getLogger(__name__)

RECONCILES = Counter("v41flash_reconciles_total", "Reconcile passes", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("v41flash_reconcile_duration_seconds", "Reconcile pass duration", ["trigger"])
APPLIED = Counter("v41flash_objects_applied_total", "Child objects created or changed", ["kind"])
PRUNED = Counter("v41flash_objects_pruned_total", "Child objects deleted as no longer desired", ["kind"])
STALLED = Gauge("v41flash_deployment_stalled", "1 while a deployment is Stalled", ["namespace", "name"])
READY = Gauge("v41flash_deployment_ready", "1 while a deployment is Ready", ["namespace", "name"])
PLANNER_ERRORS = Counter("v41flash_planner_pass_errors_total", "Planner passes that failed (replicas held)")

_kube: Kube | None = None
_autoscaler: Autoscaler | None = None
_locks: dict[str, threading.Lock] = {}
_known: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name) of every live V41FlashDeployment
_locks_guard = threading.Lock()
TIMER_INTERVAL_SECONDS = 15.0  # drift repair + status refresh; the planner has its own cadence per spec


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


def autoscaler() -> Autoscaler:
    global _autoscaler
    if _autoscaler is None:
        _autoscaler = Autoscaler(kube())
    return _autoscaler


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    # escape-hatch values as digests: the annotation must not carry extraEnv text (controller/redact.py)
    settings.persistence.diffbase_storage = RedactingDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration")
    settings.watching.server_timeout = 300  # the apiserver ends each watch; kopf re-lists and resumes
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.reporting_component = "v41flash-operator"
    settings.posting.event_name_prefix = "v41flash-"
    settings.posting.level = logging.WARNING  # kopf posts only failures; ours go through Kube.post_event
    settings.execution.max_workers = 8
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)


def _run(trigger: str, ns: str, name: str, uid: str, logger: logging.Logger) -> None:
    with _lock(uid), RECONCILE_SECONDS.labels(trigger).time():
        # Reconcile from a fresh read: an event's body can lag behind the newest spec and status.
        try:
            fresh = kube().custom.get_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, name,
                                                               _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:  # deleted meanwhile: garbage collection takes the children
                return
            raise
        if fresh["metadata"]["uid"] != uid or fresh["metadata"].get("deletionTimestamp"):
            return

        def emit(type_: str, reason: str, message: str) -> None:
            kube().post_event(fresh, type_, reason, message)

        planned = _plan(fresh, logger) if trigger == "periodic" else None
        try:
            outcome = reconcile(kube(), fresh, emit, planner=planned)
        except Exception:
            RECONCILES.labels(trigger, "error").inc()
            raise
    RECONCILES.labels(trigger, "stalled" if outcome.stall else "ok").inc()
    for item in outcome.applied:
        APPLIED.labels(item.split("/")[0]).inc()
    for item in outcome.pruned:
        PRUNED.labels(item.split("/")[0]).inc()
    STALLED.labels(ns, name).set(1 if outcome.stall else 0)
    ready = next((c for c in outcome.status["conditions"] if c["type"] == "Ready"), {})
    READY.labels(ns, name).set(1 if ready.get("status") == "True" else 0)
    if outcome.applied or outcome.pruned or outcome.status_written:
        logger.info("reconciled (%s): applied=%s pruned=%s ready=%s", trigger, outcome.applied, outcome.pruned,
                    ready.get("reason"))


def _plan(body: dict[str, Any], logger: logging.Logger) -> PlannerOutcome | None:
    """The planner's pass; any failure leaves replicas as they are (and says so), never breaks reconcile."""
    try:
        spec = api.V41FlashDeploymentSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return None  # reconcile reports the invalid spec as Stalled
    if not spec.autoscaling.enabled:
        return None
    try:
        return autoscaler().step(body, spec)
    except Exception:
        PLANNER_ERRORS.inc()
        logger.exception("planner pass failed; replicas stay as they are")
        return None


@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
def on_change(body: kopf.Body, logger: logging.Logger, reason: str, **_: Any) -> None:
    meta = body["metadata"]
    _run(str(reason), meta["namespace"], meta["name"], meta["uid"], logger)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
def track(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    """Keep the set of live deployments for the periodic pass; forget a deleted one's in-memory state."""
    meta = body["metadata"]
    if event.get("type") == "DELETED":
        _known.pop(meta["uid"], None)
        if _autoscaler is not None:
            _autoscaler.forget(meta["uid"], meta["namespace"], meta["name"])
        for gauge in (STALLED, READY):
            try:
                gauge.remove(meta["namespace"], meta["name"])
            except KeyError:
                pass
        with _locks_guard:
            _locks.pop(meta["uid"], None)
    else:
        _known[meta["uid"]] = (meta["namespace"], meta["name"])


async def _periodic(interval: float) -> None:
    """Drift repair, status refresh and the planner's cadence for every known deployment."""
    while True:
        await asyncio.sleep(interval)
        for uid, (ns, name) in list(_known.items()):
            try:
                await asyncio.to_thread(_run, "periodic", ns, name, uid, log)
            except Exception:  # one broken deployment must not stop the others' passes
                log.exception("periodic reconcile of %s/%s failed; retrying next pass", ns, name)


@kopf.on.startup()
async def start_periodic(memo: kopf.Memo, **_: Any) -> None:
    memo["periodic"] = asyncio.create_task(_periodic(TIMER_INTERVAL_SECONDS))


@kopf.on.cleanup()
async def stop_periodic(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("periodic")
    if task:
        task.cancel()
