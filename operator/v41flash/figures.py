"""What one evaluation window observed for a set of vLLM pods: the planner's input per role.

Plain frozen data so the planner stays pure and the benchmark simulator can build the same object
from its own simulated engines. A leaf (it imports nothing of the package): the metrics scraper and Prometheus
source produce it, the planner reads it, and neither imports the other for it. ``None`` means "not observable in this window" (e.g. no request
finished, so there is no latency percentile), never zero.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WindowFigures:
    start: float  # unix seconds of the window's first snapshot
    end: float  # unix seconds of the window's last snapshot
    pods_expected: int = 0  # pods that should have reported (ready pods of the role)
    pods_observed: int = 0  # pods with a usable sample at both ends of the window
    missing_pods: tuple[str, ...] = ()  # expected but not scraped (timeouts, errors) at the end
    partial_pods: tuple[str, ...] = ()  # appeared or vanished mid-window, or restarted (counter reset)
    # finished requests and latencies (histogram deltas over the window)
    requests: float = 0.0  # requests finished in the window
    request_rate: float = 0.0  # finished requests per second
    ttft_percentile: float = 0.9  # the percentile ttft_s was computed at
    ttft_s: float | None = None  # TTFT at ttft_percentile
    ttft_mean_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_mean_s: float | None = None
    queue_p95_s: float | None = None
    itl_mean_s: float | None = None
    prefill_time_mean_s: float | None = None  # mean time a request spent being prefilled (no queue)
    # token flows
    prompt_tokens_rate: float = 0.0  # prompt tokens/s (cached + computed)
    generation_tokens_rate: float = 0.0
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    output_tokens_p95: float | None = None
    prefix_cache_hit_rate: float | None = None  # token-weighted hits / queries
    preemptions: float = 0.0
    # instantaneous gauges at the window's end (sums over engines, except where said)
    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float | None = None  # mean over engines, 0..1
    load_spread: float | None = None  # max / mean running requests per engine (1.0 = even)
    engines: int = 0  # engine (DP rank) series seen at the end
    notes: tuple[str, ...] = field(default=())  # human-readable data-quality remarks
    pod_running: tuple[tuple[str, float], ...] = ()  # (pod, running requests at the end), for scale-down choices
    error: str | None = None  # the source could not measure this window at all (e.g. Prometheus unreachable): why

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def complete(self) -> bool:
        """Every expected pod reported for the whole window (safe to act on, including scale-down)."""
        return self.error is None and not self.missing_pods and not self.partial_pods and \
            self.pods_observed >= self.pods_expected


@dataclass(frozen=True)
class RouterFigures:
    """What the router saw in the window: the user-facing view (its latency includes prefill, KV transfer, decode)."""

    start: float
    end: float
    requests: float = 0.0  # requests the router completed (its request-duration histogram count)
    request_rate: float = 0.0
    e2e_p95_s: float | None = None
    e2e_mean_s: float | None = None
    errors: float = 0.0  # request errors in the window
    pods_observed: int = 0
    missing_pods: tuple[str, ...] = ()
    # leading signals from the session proxy on the router pod (None: no proxy answered)
    arrival_rate: float | None = None  # requests/s arriving (before any engine queues them)
    new_session_rate: float | None = None  # new sessions/s
    prompt_tokens_arriving_rate: float | None = None  # estimated prompt tokens/s arriving
