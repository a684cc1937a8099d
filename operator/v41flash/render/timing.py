"""Home of engine pods' timing: the drain (preStop sleep, grace period) sized from the SLO, and the
startup and liveness probes' budget.

Pure; the renderer sizes every engine pod from the spec with it (never from live metrics: changing it
restarts every engine).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PodTiming:
    """Shutdown and probe timing of engine pods (drain_timing sizes the first two from the SLO)."""
    # The router drops a terminating pod from discovery at once; the sleep lets requests it already
    # sent finish before vLLM gets SIGTERM.
    pre_stop_sleep_seconds: int = 30
    termination_grace_period_seconds: int = 300
    # Weight load (~511 GB) + FlashInfer autotune: never shorter than the engine's own ready timeout.
    startup_margin_seconds: int = 1800
    startup_min_seconds: int = 7200
    startup_period_seconds: int = 30
    liveness_period_seconds: int = 30
    liveness_failure_threshold: int = 10


def drain_timing(
    e2e_p95_s: float | None,
    *,
    margin: float = 1.5,
    router_refresh_s: float = 10.0,
    shutdown_s: float = 30.0,
    default_e2e_s: float = 300.0,
    min_s: float = 30.0,
    max_s: float = 3600.0,
) -> PodTiming:
    """Size the drain from the p95 e2e latency: a request that just started should still finish.

    ``router_refresh_s`` covers the router noticing the terminating pod (endpoint/pod watch) before it
    stops routing to it; without a figure ``default_e2e_s`` is assumed (long agentic outputs). The
    grace period is the preStop sleep plus ``shutdown_s`` for vLLM to exit after SIGTERM.
    """
    e2e = default_e2e_s if e2e_p95_s is None or not math.isfinite(e2e_p95_s) else max(0.0, e2e_p95_s)
    pre_stop = int(min(max_s, max(min_s, math.ceil(e2e * margin + router_refresh_s))))
    return PodTiming(pre_stop_sleep_seconds=pre_stop,
                     termination_grace_period_seconds=int(pre_stop + math.ceil(shutdown_s)))
