"""Per-pod snapshots over time → figures of one evaluation window (pure; no I/O).

Counters and histograms are turned into increases between the window's first and last snapshot of each
pod, the way PromQL ``increase()`` does with two samples: a value that went down means the process
restarted, so the increase is the new value itself. Gauges are read at the window's end.

Data quality is reported, never hidden: a pod expected but not scraped is *missing*; a pod that
appeared or vanished mid-window, or restarted, is *partial*. ``WindowFigures.complete`` is then
False and the planner will not scale down on it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from v41flash.figures import RouterFigures, WindowFigures
from v41flash.metrics import parse as m
from v41flash.metrics.parse import EMPTY_HISTOGRAM, EngineMetrics, Histogram


@dataclass(frozen=True)
class PodSnapshot:
    pod: str
    role: str  # prefill | decode | router
    time: float  # unix seconds when the scrape finished
    engines: Mapping[str, EngineMetrics] = field(default_factory=dict)
    error: str | None = None  # scrape failed: why (the pod then counts as missing)

    @property
    def ok(self) -> bool:
        return self.error is None


class SnapshotHistory:
    """Keeps recent snapshots per pod (bounded by ``retention_s``) and cuts windows out of them."""

    def __init__(self, retention_s: float = 900.0) -> None:
        self.retention_s = retention_s
        self._by_pod: dict[str, list[PodSnapshot]] = {}

    def add(self, snapshots: Iterable[PodSnapshot]) -> None:
        latest = 0.0
        for s in snapshots:
            # failed scrapes are kept too, so a window can say why a pod is missing
            self._by_pod.setdefault(s.pod, []).append(s)
            latest = max(latest, s.time)
        cutoff = latest - self.retention_s
        for pod in list(self._by_pod):
            kept = [s for s in self._by_pod[pod] if s.time >= cutoff]
            if kept:
                self._by_pod[pod] = sorted(kept, key=lambda s: s.time)
            else:
                del self._by_pod[pod]

    def pods(self) -> list[str]:
        return sorted(self._by_pod)

    def snapshots(self, pod: str) -> list[PodSnapshot]:
        return list(self._by_pod.get(pod, ()))

    def window(
        self,
        role: str,
        end: float,
        window_s: float,
        expected_pods: Iterable[str] | None = None,
        ttft_percentile: float = 0.9,
        tolerance_s: float | None = None,
    ) -> WindowFigures:
        """Figures of ``role`` over [end - window_s, end]; see ``compute_window``."""
        by_pod = {p: [s for s in ss if s.time <= end + 1e-9] for p, ss in self._by_pod.items()}
        by_pod = {p: ss for p, ss in by_pod.items() if ss and ss[-1].role == role}
        return compute_window(by_pod, end, window_s, expected_pods, ttft_percentile, tolerance_s)

    def window_of(self, pods: Iterable[str], role: str, end: float, window_s: float, ttft_percentile: float = 0.9,
                  tolerance_s: float | None = None) -> WindowFigures:
        """Figures of ``role`` over the given pods only (one rollout slot's: the candidate's own figures)."""
        keep = set(pods)
        by_pod = {p: [s for s in ss if s.time <= end + 1e-9] for p, ss in self._by_pod.items() if p in keep}
        by_pod = {p: ss for p, ss in by_pod.items() if ss and ss[-1].role == role}
        return compute_window(by_pod, end, window_s, sorted(keep), ttft_percentile,
                              tolerance_s)


@dataclass
class _Acc:
    """Sums over pods and engines of one window (scratch)."""

    hist: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # counter increase / pod duration (rates)
    running: list[float] = field(default_factory=list)  # per engine
    waiting: float = 0.0
    kv: list[float] = field(default_factory=list)

    def add_hist(self, name: str, h: Histogram) -> None:
        self.hist[name] = self.hist.get(name, EMPTY_HISTOGRAM).plus(h)

    def add_rate(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    def h(self, name: str) -> Histogram:
        return self.hist.get(name, EMPTY_HISTOGRAM)


_FINISHED = "finished requests"  # internal rate key: e2e histogram count increase per second


def _increase(now: float, then: float) -> float:
    return now if now < then else now - then


def compute_window(
    snapshots: Mapping[str, list[PodSnapshot]],
    end: float,
    window_s: float,
    expected_pods: Iterable[str] | None = None,
    ttft_percentile: float = 0.9,
    tolerance_s: float | None = None,
) -> WindowFigures:
    """Window figures from each pod's time-ordered snapshots (all of one role).

    For every pod the last good snapshot at or before ``end`` closes the window and the last good
    snapshot at or before ``end - window_s`` (give or take ``tolerance_s``, default 25 % of the window)
    opens it. A pod without an opening snapshot appeared mid-window: its own first snapshot opens it
    and it is partial. A pod whose last good snapshot is older than the window end (minus tolerance)
    vanished or is failing: it is missing when expected, otherwise partial.
    """
    tol = window_s * 0.25 if tolerance_s is None else tolerance_s
    start = end - window_s
    expected = set(expected_pods) if expected_pods is not None else None
    missing: list[str] = []
    partial: list[str] = []
    notes: list[str] = []
    acc = _Acc()
    observed = 0
    engines_seen = 0
    pod_running: list[tuple[str, float]] = []

    pods = sorted(set(snapshots) | (expected or set()))
    for pod in pods:
        series = [s for s in snapshots.get(pod, []) if s.ok]
        last_any = snapshots.get(pod, [])[-1] if snapshots.get(pod) else None
        closing = series[-1] if series else None
        if closing is None or closing.time < end - tol:
            failing = last_any is not None and not last_any.ok and last_any.time >= start
            if (expected is not None and pod in expected) or (expected is None and failing):
                missing.append(pod)
                notes.append(f"{pod}: {last_any.error if failing else 'no recent scrape'}")
            elif closing is not None and closing.time >= start:
                partial.append(pod)
                notes.append(f"{pod}: vanished mid-window")
            continue
        opening_candidates = [s for s in series if s.time <= start + tol]
        opening = opening_candidates[-1] if opening_candidates else None
        pod_partial = False
        if opening is None:
            pod_partial = True
            notes.append(f"{pod}: appeared mid-window")
            opening = series[0] if series[0] is not closing else None
        duration = closing.time - opening.time if opening is not None else 0.0
        restarted = False
        pod_running.append((pod, sum(em.gauges.get(m.RUNNING, 0.0) for em in closing.engines.values())))
        for engine, em in closing.engines.items():
            before = opening.engines.get(engine) if opening is not None else None
            if before is None and opening is not None and opening.engines:
                pod_partial = True  # a new engine series: nothing to difference against
            if before is not None:
                for name, h in em.histograms.items():
                    h0 = before.histograms.get(name)
                    if h0 is not None and h.count < h0.count:
                        restarted = True
                    delta = h.minus(h0) if h0 is not None else h
                    acc.add_hist(name, delta)
                    if name == m.E2E and duration > 0:
                        acc.add_rate(_FINISHED, delta.count / duration)
                if duration > 0:
                    for name, v in em.counters.items():
                        v0 = before.counters.get(name, 0.0)
                        restarted = restarted or v < v0
                        acc.add_rate(name, _increase(v, v0) / duration)
            acc.running.append(em.gauges.get(m.RUNNING, 0.0))
            acc.waiting += em.gauges.get(m.WAITING, 0.0)
            if m.KV_USAGE in em.gauges:
                acc.kv.append(em.gauges[m.KV_USAGE])
            engines_seen += 1
        if restarted:
            pod_partial = True
            notes.append(f"{pod}: restarted (counter reset) during the window")
        if pod_partial:
            partial.append(pod)
        if expected is None or pod in expected:
            observed += 1

    figures = _figures(acc, start, end, window_s, observed, expected, missing, partial, notes, ttft_percentile, engines_seen)
    return replace(figures, pod_running=tuple(pod_running))


def _figures(
    acc: _Acc,
    start: float,
    end: float,
    window_s: float,
    observed: int,
    expected: set[str] | None,
    missing: list[str],
    partial: list[str],
    notes: list[str],
    ttft_percentile: float,
    engines: int,
) -> WindowFigures:
    e2e, ttft, itl, queue = acc.h(m.E2E), acc.h(m.TTFT), acc.h(m.ITL), acc.h(m.QUEUE)
    prefill_time = acc.h(m.PREFILL_TIME)
    prompt_len, gen_len = acc.h(m.PROMPT_LEN), acc.h(m.GEN_LEN)
    hits, queries = acc.counters.get(m.PREFIX_HITS), acc.counters.get(m.PREFIX_QUERIES)
    running_total = sum(acc.running)
    mean_running = running_total / len(acc.running) if acc.running else 0.0
    requests = e2e.count
    return WindowFigures(
        start=start,
        end=end,
        pods_expected=len(expected) if expected is not None else observed + len(missing),
        pods_observed=observed,
        missing_pods=tuple(missing),
        partial_pods=tuple(partial),
        requests=requests,
        request_rate=acc.counters.get(_FINISHED, 0.0),
        ttft_percentile=ttft_percentile,
        ttft_s=ttft.quantile(ttft_percentile),
        ttft_mean_s=ttft.mean,
        e2e_p95_s=e2e.quantile(0.95),
        e2e_mean_s=e2e.mean,
        queue_p95_s=queue.quantile(0.95),
        itl_mean_s=itl.mean,
        prefill_time_mean_s=prefill_time.mean,
        prompt_tokens_rate=acc.counters.get(m.PROMPT_TOKENS, 0.0),
        generation_tokens_rate=acc.counters.get(m.GEN_TOKENS, 0.0),
        mean_input_tokens=prompt_len.mean,
        mean_output_tokens=gen_len.mean,
        output_tokens_p95=gen_len.quantile(0.95),
        prefix_cache_hit_rate=(hits / queries) if hits is not None and queries else None,
        preemptions=acc.counters.get(m.PREEMPTIONS, 0.0) * window_s,
        running=running_total,
        waiting=acc.waiting,
        kv_cache_usage=sum(acc.kv) / len(acc.kv) if acc.kv else None,
        load_spread=(max(acc.running) / mean_running) if mean_running > 0 else None,
        engines=engines,
        notes=tuple(notes),
    )


def role_windows(
    history: SnapshotHistory,
    end: float,
    window_s: float,
    expected: Mapping[str, Iterable[str]],
    ttft_percentile: float = 0.9,
) -> dict[str, WindowFigures]:
    """Figures per role (keys of ``expected``: role → expected pod names) plus ``overall`` (all roles)."""
    out = {
        role: history.window(role, end, window_s, pods, ttft_percentile) for role, pods in expected.items()
    }
    all_pods = {p for pods in expected.values() for p in pods}
    by_pod = {p: [s for s in history.snapshots(p) if s.time <= end + 1e-9] for p in history.pods()}
    by_pod = {p: ss for p, ss in by_pod.items() if ss and ss[-1].role in expected}
    out["overall"] = compute_window(by_pod, end, window_s, all_pods, ttft_percentile)
    return out


# vllm-router 0.1.17 histograms of whole-request latency: the P/D one when it serves disaggregated
ROUTER_DURATIONS = ("vllm_router_pd_request_duration_seconds", "vllm_router_request_duration_seconds")
ROUTER_ERRORS = ("vllm_router_pd_errors", "vllm_router_request_errors")
# the session proxy's leading signals (scraped from the router pod's /proxy/metrics)
PROXY_ARRIVALS = "v41flash_session_proxy_arrivals"
PROXY_NEW_SESSIONS = "v41flash_session_proxy_new_sessions"
PROXY_PROMPT_TOKENS = "v41flash_session_proxy_prompt_tokens_estimated"
PROXY_COUNTERS = (PROXY_ARRIVALS, PROXY_NEW_SESSIONS, PROXY_PROMPT_TOKENS)


def compute_router_window(snapshots: Mapping[str, list[PodSnapshot]], end: float, window_s: float, tolerance_s: float | None = None) -> RouterFigures:
    """User-facing request rate, p95 latency and errors from the router pods' snapshots (increase() semantics)."""
    tol = window_s * 0.25 if tolerance_s is None else tolerance_s
    start = end - window_s
    hist: dict[str, Histogram] = {}
    errors = 0.0
    leading: dict[str, float] = {}
    missing: list[str] = []
    observed = 0
    for pod, series in sorted(snapshots.items()):
        good = [s for s in series if s.ok and s.time <= end + 1e-9]
        if not good or good[-1].time < end - tol:
            missing.append(pod)
            continue
        closing = good[-1]
        opening = next((s for s in reversed(good) if s.time <= start + tol), None)
        if opening is None or opening is closing:
            continue  # no baseline yet: nothing to difference
        observed += 1
        for engine, em in closing.engines.items():
            before = opening.engines.get(engine, EngineMetrics())
            for name in ROUTER_DURATIONS:
                if name in em.histograms:
                    h0 = before.histograms.get(name)
                    delta = em.histograms[name].minus(h0) if h0 is not None else em.histograms[name]
                    hist[name] = hist.get(name, EMPTY_HISTOGRAM).plus(delta)
            for name in ROUTER_ERRORS:
                if name in em.counters:
                    errors += _increase(em.counters[name], before.counters.get(name, 0.0))
            for name in PROXY_COUNTERS:
                if name in em.counters:
                    leading[name] = leading.get(name, 0.0) + _increase(em.counters[name], before.counters.get(name, 0.0))
    h = next((hist[n] for n in ROUTER_DURATIONS if n in hist and hist[n].count > 0), EMPTY_HISTOGRAM)
    return RouterFigures(
        start=start,
        end=end,
        requests=h.count,
        request_rate=h.count / window_s if window_s > 0 else 0.0,
        e2e_p95_s=h.quantile(0.95),
        e2e_mean_s=h.mean,
        errors=errors,
        pods_observed=observed,
        missing_pods=tuple(missing),
        arrival_rate=leading[PROXY_ARRIVALS] / window_s if PROXY_ARRIVALS in leading and window_s > 0 else None,
        new_session_rate=leading[PROXY_NEW_SESSIONS] / window_s if PROXY_NEW_SESSIONS in leading and window_s > 0 else None,
        prompt_tokens_arriving_rate=leading[PROXY_PROMPT_TOKENS] / window_s if PROXY_PROMPT_TOKENS in leading and window_s > 0 else None,
    )
