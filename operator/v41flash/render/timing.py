"""Home of engine pods' timing: the drain (preStop deadline, grace period) and the startup and liveness
probes' budget.

Pure. The drain deadline is sized from the SLO (a request that just started should still finish), but
it is NOT part of the pod template: the renderer writes it into the deployment's ConfigMap, which the
engine pods mount, and the preStop hook reads it when the pod stops. So an SLO edit updates the file in
place (kubelet syncs ConfigMap volumes within about a minute) and restarts no engine. The grace period
in the template is therefore a fixed upper bound that covers the largest deadline the hook accepts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import defaults

DRAIN_MIN_SECONDS = 30
DRAIN_MAX_SECONDS = 3600  # the hook clamps the file's value to this; the grace period covers it
SHUTDOWN_SECONDS = 30  # vLLM's exit after SIGTERM, once the drain is over


@dataclass(frozen=True)
class PodTiming:
    """What of the engine pods' timing is in the pod template: none of it depends on the SLO."""
    # The largest drain plus vLLM's shutdown: an upper bound only; a pod goes as soon as the preStop
    # deadline has passed and vLLM has exited.
    termination_grace_period_seconds: int = DRAIN_MAX_SECONDS + SHUTDOWN_SECONDS
    # Weight load (~511 GB) + FlashInfer autotune: never shorter than the engine's own ready timeout.
    startup_margin_seconds: int = 1800
    startup_min_seconds: int = defaults.ENGINE_STARTUP_MIN_SECONDS
    startup_period_seconds: int = 30
    liveness_period_seconds: int = 30
    liveness_failure_threshold: int = 10


def drain_seconds(
    e2e_p95_s: float | None,
    *,
    margin: float = 1.5,
    router_refresh_s: float = 10.0,
    default_e2e_s: float = 300.0,
) -> int:
    """The preStop deadline from the p95 e2e latency: a request that just started should still finish.

    The router drops a terminating pod from discovery at once; the deadline lets requests it already
    sent finish before vLLM gets SIGTERM. ``router_refresh_s`` covers the router noticing the
    terminating pod (endpoint/pod watch) before it stops routing to it; without a figure
    ``default_e2e_s`` is assumed (long agentic outputs). Clamped to [DRAIN_MIN_SECONDS,
    DRAIN_MAX_SECONDS], so the fixed grace period always covers it.
    """
    e2e = default_e2e_s if e2e_p95_s is None or not math.isfinite(e2e_p95_s) else max(0.0, e2e_p95_s)
    return int(min(DRAIN_MAX_SECONDS, max(DRAIN_MIN_SECONDS, math.ceil(e2e * margin + router_refresh_s))))


# Used by the hook when the ConfigMap file is missing or unreadable (e.g. deleted by hand).
DEFAULT_DRAIN_SECONDS = drain_seconds(None)

# The ConfigMap key (in labels.config_name's ConfigMap) the renderer writes the deadline to, and where
# the engine pods mount it.
DRAIN_CONFIG_KEY = "engine-drain-seconds"
DRAIN_MOUNT_DIR = "/etc/v41flash/drain"


def pre_stop_script() -> str:
    """The preStop hook: sleep for the deadline in the mounted file (clamped), the default without one."""
    path = f"{DRAIN_MOUNT_DIR}/{DRAIN_CONFIG_KEY}"
    return (f's=$(cat {path} 2>/dev/null); case "$s" in ""|*[!0-9]*) s={DEFAULT_DRAIN_SECONDS};; esac; '
            f'[ "$s" -gt {DRAIN_MAX_SECONDS} ] && s={DRAIN_MAX_SECONDS}; exec sleep "$s"')
