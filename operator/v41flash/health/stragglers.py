"""The straggler finder, pure: an engine (or a DEP group: the slowest rank sets its step) whose mean inter-token
latency or time to first token over a window is at least ``ratio`` times the median of its role's peers at comparable
load.

Each engine's figures are the increase of its own ITL and TTFT histograms over the window (scraped at its start and
its end), so the verdict covers the whole window, not one slow moment. Comparable load: a peer counts when its mean
running requests are within a factor of ``LOAD_BAND`` of the engine's (latency grows with the batch; a slow engine
also holds its streams longer, so it runs somewhat more at the same arrival rate). Too few tokens or first tokens in
the window (an idle engine) gives no figure, and an engine with no comparable peer is never judged.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..metrics.parse import EMPTY_HISTOGRAM, Histogram
from ..metrics.window import PodSnapshot
from ..vllm.metric_names import ITL, RUNNING, TTFT

LOAD_BAND = 3.0  # a peer's mean running requests within [1/3, 3] x the engine's
MIN_TOKENS = 50  # inter-token latencies in the window for an ITL figure
MIN_FIRST_TOKENS = 5  # first tokens in the window for a TTFT figure


@dataclass(frozen=True)
class EngineLatency:
    """One engine's figures over the window; ``unit`` is what is judged and acted on (the pod, or its DEP group)."""
    pod: str
    role: str
    unit: str
    itl_s: float | None
    ttft_s: float | None
    running: float


@dataclass(frozen=True)
class Straggler:
    unit: str
    role: str
    pods: tuple[str, ...]
    metric: str  # "ITL" | "TTFT"
    value_s: float
    peers_s: float  # the median of its comparable peers
    ratio: float

    def message(self, window_s: float) -> str:
        what = f"{self.role} DEP group {self.unit}" if self.pods != (self.unit,) else f"{self.role} pod {self.unit}"
        return (f"{what}: mean {self.metric} {self.value_s * 1000:.0f} ms over {window_s:.0f} s is {self.ratio:.1f}x "
                f"its peers' median {self.peers_s * 1000:.0f} ms at comparable load")


def _sum(snapshot: PodSnapshot, name: str) -> Histogram:
    out = EMPTY_HISTOGRAM
    for em in snapshot.engines.values():
        h = em.histograms.get(name)
        if h is not None:
            out = out.plus(h)
    return out


def latency_over(snapshots: Sequence[PodSnapshot], now: float, window_s: float, unit: str = "") -> EngineLatency | None:
    """The engine's figures over the window ending at ``now`` from its scrapes (oldest first); None unless its
    scrapes reach back a whole window."""
    ok = [s for s in snapshots if s.ok]
    # a restarted engine (its counters went down) is judged only on what it did since: a whole window of it
    restarts = [i for i in range(1, len(ok)) if _sum(ok[i], ITL).count < _sum(ok[i - 1], ITL).count]
    ok = ok[restarts[-1]:] if restarts else ok
    start = [s for s in ok if s.time <= now - window_s]
    if not start or ok[-1].time <= start[-1].time:
        return None
    first, last = start[-1], ok[-1]
    inside = [s for s in ok if s.time >= first.time]
    itl, ttft = _sum(last, ITL).minus(_sum(first, ITL)), _sum(last, TTFT).minus(_sum(first, TTFT))
    running = statistics.fmean(sum(em.gauges.get(RUNNING, 0.0) for em in s.engines.values()) for s in inside)
    return EngineLatency(last.pod, last.role, unit or last.pod,
                         itl.mean if itl.count >= MIN_TOKENS else None,
                         ttft.mean if ttft.count >= MIN_FIRST_TOKENS else None, running)


def _units(engines: Sequence[EngineLatency]) -> dict[str, EngineLatency]:
    """One figure per unit: a DEP group's worst rank (the slowest sets the step), its summed load."""
    out: dict[str, EngineLatency] = {}
    for e in engines:
        u = out.get(e.unit)
        if u is None:
            out[e.unit] = EngineLatency(e.unit, e.role, e.unit, e.itl_s, e.ttft_s, e.running)
            continue
        worst = [x for x in (u.itl_s, e.itl_s) if x is not None]
        worst_t = [x for x in (u.ttft_s, e.ttft_s) if x is not None]
        out[e.unit] = EngineLatency(e.unit, e.role, e.unit, max(worst, default=None), max(worst_t, default=None),
                                    u.running + e.running)
    return out


def find_stragglers(engines: Sequence[EngineLatency], ratio: float) -> list[Straggler]:
    """The units at least ``ratio`` x slower than their role's comparable peers' median, ITL judged before TTFT."""
    pods: dict[str, list[str]] = {}
    for e in engines:
        pods.setdefault(e.unit, []).append(e.pod)
    units = _units(engines)
    found: list[Straggler] = []
    for u in units.values():
        peers = [p for p in units.values() if p.unit != u.unit and p.role == u.role and p.running > 0 < u.running
                 and u.running / LOAD_BAND <= p.running <= u.running * LOAD_BAND]
        for metric, mine, theirs in (("ITL", u.itl_s, [p.itl_s for p in peers]),
                                     ("TTFT", u.ttft_s, [p.ttft_s for p in peers])):
            theirs = [x for x in theirs if x is not None and x > 0]
            if mine is None or not theirs:
                continue
            median = statistics.median(theirs)
            if mine >= ratio * median:
                found.append(Straggler(u.unit, u.role, tuple(sorted(pods[u.unit])), metric, mine, median,
                                       mine / median))
                break
    return sorted(found, key=lambda s: (s.role, s.unit))


def group_of(labels: Mapping[str, str], pod: str) -> str:
    """The unit a pod is judged and replaced as: its LeaderWorkerSet group (named as its leader pod), else itself."""
    lws, index = labels.get(LWS_NAME_LABEL), labels.get(LWS_GROUP_INDEX_LABEL)
    return f"{lws}-{index}" if lws and index is not None else pod


LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
