"""The controller's own tunables: one frozen OperatorConfig, each field with its default and what it does.

It is the single home of their names, defaults and descriptions: `v41flash operator` derives one flag per
field from it (cli/operator.py; ``--timer-interval-seconds`` for ``timer_interval_seconds``) and the chart's
``controller`` values pass those flags (charts/v41flash-operator). Made once at startup; nothing changes it.

Four of them are the administrator's security decisions (issue 39), empty by default: the host directories a
weight cache may use and the Prometheus endpoints the planner may query (``admin_policy``). The running process
installs its configuration (``install``) so that a pass reads that policy (``admin_policy()``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api.admin import AdminPolicy
from ..api.endpoints import EndpointAllowlist
from ..api.host_paths import HostPathAllowlist


def floats(text: str) -> tuple[float, ...]:
    """A comma-separated list of numbers, as a flag gives it: "2,4,8"."""
    return tuple(float(x) for x in text.split(",") if x.strip())


def strings(text: str) -> tuple[str, ...]:
    """A comma-separated list of words, as a flag gives it: "/mnt/a,/mnt/b"."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _tunable(default: Any, help: str, parse: Callable[[str], Any]) -> Any:
    return field(default=default, metadata={"help": help, "parse": parse})


@dataclass(frozen=True)
class OperatorConfig:
    timer_interval_seconds: float = _tunable(
        15.0, "seconds between periodic ticks: each deployment's status refresh and its planner's scrape (the "
              "planner decides every spec.autoscaling.intervalSeconds, on a tick)", float)
    drift_every: int = _tunable(
        20, "ticks between drift repairs of a deployment (staggered): a periodic pass that re-applies its children "
            "and prunes strays (a Service or ConfigMap edited by hand; a changed workload is re-applied at once)", int)
    drift_recent_ticks: int | None = _tunable(
        None, "a drift repair is skipped when a full pass applied the children less than this many ticks ago "
              "(after a burst of new CRs) (default: half of drift-every)", int)
    pass_workers: int = _tunable(
        16, "reconcile passes at once (each applies its children concurrently on the apply workers)", int)
    urgent_workers: int = _tunable(
        4, "of the pass workers, those reserved for urgent passes: a new CR, a spec change, a resume", int)
    pass_deadline_seconds: float = _tunable(
        60.0, "a pass still running this long is left to finish on its own; the other deployments go on", float)
    backoff_seconds: tuple[float, ...] = _tunable(
        (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 300.0),
        "delays before retrying a failed pass, one per consecutive failure, the last repeated (each varied by up "
        "to 10 percent)", floats)
    rollout_pass_seconds: float = _tunable(
        5.0, "seconds between the passes of a deployment whose rollout is in progress (its steps, deadlines and "
             "drains act on their own clock)", float)
    planner_workers: int = _tunable(8, "planner passes (scrape and plan) at once", int)
    planner_deadline_seconds: float = _tunable(
        15.0, "a planner pass still running this long is dropped (replicas stay as they are; slow /metrics)", float)
    apply_workers: int = _tunable(
        12, "apiserver calls at once for the periodic, watch-driven and planner passes, and for Events", int)
    urgent_apply_workers: int = _tunable(
        32, "apiserver calls at once for urgent passes (a burst of new CRs is all urgent)", int)
    connection_pool: int = _tunable(
        96, "connections to the apiserver, shared by both call pools and the passes' status writes", int)
    request_timeout_seconds: tuple[float, ...] = _tunable(
        (5.0, 30.0), "connect and read deadline of every apiserver call (kopf's watches have their own)", floats)
    # the administrator's allowlists (api/admin.py): nothing by default
    weight_cache_host_paths: tuple[str, ...] = _tunable(
        (), "host directories a spec.startup.weightCache.hostPath may name; each namespace gets <directory>/<namespace>, "
            "mounted read-only in its engines and written by its prefetcher; none: the feature is off",
        strings)
    weight_cache_shared_host_paths: tuple[str, ...] = _tunable(
        (), "host directories (and those below) that weight caches with sharedAcrossNamespaces: true use as written, "
            "shared by every namespace naming them: any of them can overwrite the weights the others load",
        strings)
    prometheus_endpoints: tuple[str, ...] = _tunable(
        (), "URL prefixes (scheme://host[:port][/path]) spec.autoscaling.metrics.prometheus.url may name; a loopback, "
            "link-local or metadata address only where an entry names it", strings)
    prometheus_namespaces: tuple[str, ...] = _tunable(
        (), "namespaces whose Services (http(s)://<service>.<namespace>[.svc[.cluster.local]][:port]) "
            "spec.autoscaling.metrics.prometheus.url may name", strings)

    def __post_init__(self) -> None:
        if self.drift_recent_ticks is None:
            object.__setattr__(self, "drift_recent_ticks", self.drift_every // 2)
        for name in ("timer_interval_seconds", "drift_every", "pass_workers", "pass_deadline_seconds",
                     "rollout_pass_seconds", "planner_workers", "planner_deadline_seconds", "apply_workers",
                     "urgent_apply_workers", "connection_pool"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be more than 0")
        if self.drift_recent_ticks < 0:
            raise ValueError(f"drift_recent_ticks: {self.drift_recent_ticks} must be 0 or more")
        if not 0 <= self.urgent_workers < self.pass_workers:
            raise ValueError(f"reserved: {self.urgent_workers} urgent workers of {self.pass_workers}: leave at "
                             f"least one for the rest")
        if not self.backoff_seconds or min(self.backoff_seconds) <= 0:
            raise ValueError(f"backoff_seconds: {self.backoff_seconds}: one or more delays, each more than 0")
        if len(self.request_timeout_seconds) != 2 or min(self.request_timeout_seconds) <= 0:
            raise ValueError(f"request_timeout_seconds: {self.request_timeout_seconds}: connect and read seconds, "
                             f"each more than 0")
        self.admin_policy()  # ValueError naming a host path or an endpoint the allowlists cannot hold

    def admin_policy(self) -> AdminPolicy:
        """What this operator's administrator allows specs to reach (render/checks.py, metrics/promapi.py)."""
        return AdminPolicy(HostPathAllowlist(self.weight_cache_host_paths, self.weight_cache_shared_host_paths),
                           EndpointAllowlist(self.prometheus_endpoints, self.prometheus_namespaces))


_installed = OperatorConfig()


def install(config: OperatorConfig) -> None:
    """The running operator's configuration (cli/operator.py, once at startup)."""
    global _installed
    _installed = config


def admin_policy() -> AdminPolicy:
    """The running operator's AdminPolicy (the default one's, allowing nothing, until install)."""
    return _installed.admin_policy()
