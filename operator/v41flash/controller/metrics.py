"""The controller's own Prometheus series (the planner's are metrics/operator_metrics.py): passes, their
queue and workers, what they applied and pruned, each deployment's Ready/Stalled, the apiserver requests.

The chart's alert rules and dashboard read these names, labels and buckets: change them only with those.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("v41flash_reconciles_total", "Reconcile passes", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("v41flash_reconcile_duration_seconds", "Reconcile pass duration", ["trigger"],
                              buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
APPLIED = Counter("v41flash_objects_applied_total", "Child objects created or changed", ["kind"])
PRUNED = Counter("v41flash_objects_pruned_total", "Child objects deleted as no longer desired", ["kind"])
STALLED = Gauge("v41flash_deployment_stalled", "1 while a deployment is Stalled", ["namespace", "name"])
READY = Gauge("v41flash_deployment_ready", "1 while a deployment is Ready", ["namespace", "name"])
PLANNER_ERRORS = Counter("v41flash_planner_pass_errors_total", "Planner passes that failed (replicas held)")
PASS_OVERRUNS = Counter("v41flash_pass_deadline_exceeded_total",
                        "Passes still running at their deadline (the scheduler moved on)", ["stage"])
BACKOFFS = Counter("v41flash_pass_backoffs_total", "Passes that failed and were rescheduled with backoff", ["cause"])
PERIODIC_CYCLE = Histogram("v41flash_periodic_cycle_seconds",
                           "From a periodic tick until every deployment's pass of that tick finished",
                           buckets=(.1, .25, .5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120))
QUEUE_DEPTH = Gauge("v41flash_pass_queue_depth", "Deployments waiting for a pass")
PASSES_RUNNING = Gauge("v41flash_passes_running", "Passes running now (on the pass workers)")
PASS_WAIT = Histogram("v41flash_pass_wait_seconds", "From the first request of a pass until a worker started it",
                      ["priority"], buckets=(.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
API_REQUESTS = Counter("v41flash_api_requests_total",
                       "Requests to the apiserver from the operator's own client (kopf's watches not included)",
                       ["verb"])


def record_pass(namespace: str, name: str, trigger: str, *, capacity: bool, stalled: bool, ready: bool,
                applied: list[str], pruned: list[str]) -> None:
    """A pass that finished (an error is counted where it is raised)."""
    RECONCILES.labels(trigger, "capacity" if capacity else "stalled" if stalled else "ok").inc()
    for item in applied:
        APPLIED.labels(item.split("/")[0]).inc()
    for item in pruned:
        PRUNED.labels(item.split("/")[0]).inc()
    STALLED.labels(namespace, name).set(1 if stalled else 0)
    READY.labels(namespace, name).set(1 if ready else 0)


def forget(namespace: str, name: str) -> None:
    """A deleted deployment's series."""
    for gauge in (STALLED, READY):
        try:
            gauge.remove(namespace, name)
        except KeyError:
            pass
