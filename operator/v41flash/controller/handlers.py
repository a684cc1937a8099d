"""kopf wiring: every trigger (create, update, resume, timer) runs the same reconcile.

Hardened as production kopf operators are: our own annotation prefix and finalizer name, bounded watch
timeouts, no progress annotations copied anywhere (children are built by the renderer from the spec only),
handler return values never dumped into status, and per-object serialization so a timer pass and an
update pass never interleave.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram

from ..api import v1alpha1 as api
from .kube import Kube
from .reconcile import reconcile

log = logging.getLogger(__name__)

RECONCILES = Counter("v41flash_reconciles_total", "Reconcile passes", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("v41flash_reconcile_duration_seconds", "Reconcile pass duration", ["trigger"])
APPLIED = Counter("v41flash_objects_applied_total", "Child objects created or changed", ["kind"])
PRUNED = Counter("v41flash_objects_pruned_total", "Child objects deleted as no longer desired", ["kind"])
STALLED = Gauge("v41flash_deployment_stalled", "1 while a deployment is Stalled", ["namespace", "name"])
READY = Gauge("v41flash_deployment_ready", "1 while a deployment is Ready", ["namespace", "name"])

_kube: Kube | None = None
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
TIMER_INTERVAL_SECONDS = 15.0  # drift repair + status refresh; the planner has its own cadence per spec


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration")
    settings.watching.server_timeout = 300  # the apiserver ends each watch; kopf re-lists and resumes
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.reporting_component = "v41flash-operator"
    settings.posting.event_name_prefix = "v41flash-"
    settings.posting.level = logging.WARNING  # only our own Events (emitted below), not kopf's chatter
    settings.execution.max_workers = 8
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)


def _run(trigger: str, body: kopf.Body, logger: logging.Logger) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]

    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message[:1000])

    with _lock(meta["uid"]), RECONCILE_SECONDS.labels(trigger).time():
        # The timer's body can lag behind an update; reconcile from a fresh read so status uses the newest spec.
        fresh = kube().custom.get_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, name)
        try:
            outcome = reconcile(kube(), fresh, emit)
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


@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
def on_change(body: kopf.Body, logger: logging.Logger, reason: str, **_: Any) -> None:
    _run(str(reason), body, logger)


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=TIMER_INTERVAL_SECONDS, initial_delay=5)
def on_timer(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    _run("timer", body, logger)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def on_delete(body: kopf.Body, **_: Any) -> None:
    """Children go by garbage collection (ownerReferences); only forget in-memory state here."""
    meta = body["metadata"]
    for gauge in (STALLED, READY):
        try:
            gauge.remove(meta["namespace"], meta["name"])
        except KeyError:
            pass
    with _locks_guard:
        _locks.pop(meta["uid"], None)
