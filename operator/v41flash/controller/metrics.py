"""Every Prometheus series the operator process exports, and only here (a test holds it): the controller's
(passes, their queue and workers, what they applied and pruned, each deployment's Ready/Stalled, the apiserver
requests), engine health's (hangs, stragglers, replacements) and the planner's (PlannerMetrics: its decisions and
scrapes). The session proxy and the front's counters are other processes, with their own series
(proxy/session_proxy.py, front/counters.py).

The module-level series register on prometheus_client's default registry at import; PlannerMetrics takes a
registry (a test gives it a fresh one) and planner_metrics() is the process's instance on the default one.
The chart's alert rules and dashboard read these names, labels and buckets: change them only with those.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..figures import WindowFigures
from ..metrics.window import PodSnapshot
from ..planner.datatypes import Decision

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
HANGS = Counter("v41flash_engine_hangs_total", "Engines found hung (requests running, no progress) and replaced",
                ["namespace", "name", "role"])
STRAGGLERS = Counter("v41flash_engine_stragglers_total", "Engines (DEP groups) found straggling and replaced",
                     ["namespace", "name", "role"])
REPLACED = Counter("v41flash_engine_replaced_total", "Engine pods deleted by engine health for a replacement",
                   ["namespace", "name", "role", "reason"])


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


# --- the planner's series ---------------------------------------------------------------------------------------------

_DEP = ("namespace", "deployment")
_ROLE = (*_DEP, "role")


class PlannerMetrics:
    """The planner's and its scraper's series, all labelled by the V41FlashDeployment (namespace, name) and,
    where it applies, role."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.slo_target = Gauge(
            "v41flash_planner_slo_target_seconds", "The deployment's SLO targets (metric: ttft, e2e_p95).",
            ("namespace", "deployment", "metric"), registry=registry,
        )
        self.decisions = Counter(
            "v41flash_planner_decisions", "Planner decisions by role and action (scale_up, scale_down, hold).",
            (*_ROLE, "action"), registry=registry,
        )
        self.desired_replicas = Gauge(
            "v41flash_planner_desired_replicas", "Replicas the planner decided for a role.", _ROLE, registry=registry
        )
        self.current_replicas = Gauge(
            "v41flash_planner_current_replicas", "Replicas a role had when the planner decided.", _ROLE, registry=registry
        )
        self.needed_replicas = Gauge(
            "v41flash_planner_needed_replicas", "Fractional replicas the capacity model needs for the forecast demand.",
            _ROLE, registry=registry,
        )
        self.demand = Gauge(
            "v41flash_planner_demand_requests_per_second", "Request rate the planner sized a role for (forecast).",
            _ROLE, registry=registry,
        )
        self.predicted_latency = Gauge(
            "v41flash_planner_predicted_latency_seconds", "Latency the model predicts at the decided replicas.",
            (*_ROLE, "metric"), registry=registry,
        )
        self.observed_latency = Gauge(
            "v41flash_planner_observed_latency_seconds", "Latency observed in the planner's evaluation window.",
            (*_ROLE, "metric"), registry=registry,
        )
        self.correction = Gauge(
            "v41flash_planner_correction_factor", "Learned observed/predicted latency factor of the profile.",
            _ROLE, registry=registry,
        )
        self.slo_breached = Gauge(
            "v41flash_planner_slo_breached", "1 when the role's SLO was breached in the last window.", _ROLE, registry=registry
        )
        self.clamped = Counter(
            "v41flash_planner_clamped_decisions", "Decisions changed by replica bounds or the GPU budget.",
            _ROLE, registry=registry,
        )
        self.advisory = Gauge(
            "v41flash_planner_advisory", "1 when the planner runs in advisory mode (decides, writes no replicas).",
            _DEP, registry=registry,
        )
        self.tokens_per_second = Gauge(
            "v41flash_tokens_per_second", "Tokens served per second (prompt tokens, cached + computed, + output).",
            _DEP, registry=registry,
        )
        self.tokens_per_second_per_gpu = Gauge(
            "v41flash_tokens_per_second_per_gpu", "Tokens served per second per GPU of Ready replicas.",
            _DEP, registry=registry,
        )
        self.tokens_per_dollar = Gauge(
            "v41flash_tokens_per_dollar", "Tokens served per TCO dollar (spec.autoscaling.costPerGpuHour).",
            _DEP, registry=registry,
        )
        self.scrape_errors = Counter(
            "v41flash_metrics_scrape_errors", "Failed /metrics scrapes of vLLM or router pods (source Prometheus: roles it could not measure).", _ROLE, registry=registry
        )
        self.scrape_duration = Histogram(
            "v41flash_metrics_scrape_duration_seconds", "Wall time of one scrape of all pods of a deployment.",
            _DEP, registry=registry, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        )

    def record_decision(self, namespace: str, deployment: str, decision: Decision, advisory: bool = False) -> None:
        self.advisory.labels(namespace, deployment).set(1 if advisory else 0)
        for d in decision.roles():
            labels = (namespace, deployment, d.role)
            self.decisions.labels(*labels, d.action).inc()
            self.desired_replicas.labels(*labels).set(d.desired)
            self.current_replicas.labels(*labels).set(d.current)
            if d.needed is not None:
                self.needed_replicas.labels(*labels).set(d.needed)
            if d.demand_rate is not None:
                self.demand.labels(*labels).set(d.demand_rate)
            for metric, pred, obs in (
                ("ttft", d.predicted_ttft_s, d.observed_ttft_s),
                ("e2e_p95", d.predicted_e2e_p95_s, d.observed_e2e_p95_s),
                ("itl", d.predicted_itl_s, d.observed_itl_s),
            ):
                if pred is not None:
                    self.predicted_latency.labels(*labels, metric).set(pred)
                if obs is not None:
                    self.observed_latency.labels(*labels, metric).set(obs)
            self.correction.labels(*labels).set(d.correction)
            self.slo_breached.labels(*labels).set(1 if d.slo_breached else 0)
            if d.clamped:
                self.clamped.labels(*labels).inc()

    def record_scrape(self, namespace: str, deployment: str, snapshots: Sequence[PodSnapshot], duration_s: float) -> None:
        self.scrape_duration.labels(namespace, deployment).observe(duration_s)
        for s in snapshots:
            if not s.ok:
                self.scrape_errors.labels(namespace, deployment, s.role).inc()

    def record_prometheus(self, namespace: str, deployment: str, windows: Mapping[str, WindowFigures],
                          duration_s: float) -> None:
        """The Prometheus source's round of queries: its duration, and a failed 'scrape' per role it could not measure."""
        self.scrape_duration.labels(namespace, deployment).observe(duration_s)
        for role, w in windows.items():
            if w.error is not None:
                self.scrape_errors.labels(namespace, deployment, role).inc()

    def record_throughput(self, namespace: str, deployment: str, slo_status: dict) -> None:
        """The status.slo throughput figures (absent ones leave their series alone)."""
        for key, gauge in (("tokensPerSecond", self.tokens_per_second),
                           ("tokensPerSecondPerGPU", self.tokens_per_second_per_gpu),
                           ("tokensPerDollar", self.tokens_per_dollar)):
            if slo_status.get(key) is not None:
                gauge.labels(namespace, deployment).set(slo_status[key])

    def record_slo(self, namespace: str, deployment: str, ttft_s: float, e2e_p95_s: float) -> None:
        self.slo_target.labels(namespace, deployment, "ttft").set(ttft_s)
        self.slo_target.labels(namespace, deployment, "e2e_p95").set(e2e_p95_s)

    def forget(self, namespace: str, deployment: str) -> None:
        """Drop every series of a deleted deployment (no stale series for GitOps dashboards)."""
        for metric in (
            self.decisions, self.desired_replicas, self.current_replicas, self.needed_replicas, self.demand,
            self.predicted_latency, self.observed_latency, self.correction, self.slo_breached, self.clamped,
            self.scrape_errors, self.scrape_duration, self.slo_target, self.advisory, self.tokens_per_second,
            self.tokens_per_second_per_gpu, self.tokens_per_dollar,
        ):
            for labels in list(metric._metrics):  # prometheus_client keeps children keyed by label tuples
                if labels[:2] == (namespace, deployment):
                    metric.remove(*labels)


_default: PlannerMetrics | None = None


def planner_metrics() -> PlannerMetrics:
    """The process-wide instance on prometheus_client's default registry (created on first use)."""
    global _default
    if _default is None:
        _default = PlannerMetrics()
    return _default
