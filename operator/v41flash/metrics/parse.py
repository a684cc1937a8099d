"""Prometheus text → per-engine counters, gauges and histograms (prometheus_client's parser does the parsing).

prometheus_client reports a counter family under its name without ``_total`` (the sample keeps the
suffix) and a histogram as ``_bucket`` samples (label ``le``), ``_sum`` and ``_count``; ``_created``
samples are ignored. Series of one family that differ only in labels other than ``engine`` (e.g.
``finished_reason``) are summed, so every figure is per engine (vLLM's DP rank).
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ENGINE_LABEL = "engine"
DEFAULT_ENGINE = "0"  # series without an engine label (single-engine servers, routers)

# vLLM 0.33.0's names, from their home (re-exported: the scraper's readers spell them m.TTFT, ...)
from ..vllm.metric_names import (E2E, GEN_LEN, GEN_TOKENS, ITL, KV_USAGE, PREEMPTIONS, PREFILL_TIME,  # noqa: E402,F401
                                 PREFIX_HITS, PREFIX_QUERIES, PROMPT_LEN, PROMPT_TOKENS, QUEUE, RUNNING, SUCCESS,
                                 TTFT, WAITING)


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, ends at +Inf
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """Increase since ``earlier``; a decreased count means the engine restarted (use self whole)."""
        if self.count < earlier.count:
            return self
        prev = dict(earlier.buckets)
        return Histogram(
            buckets=tuple((le, max(0.0, c - prev.get(le, 0.0))) for le, c in self.buckets),
            count=self.count - earlier.count,
            sum=max(0.0, self.sum - earlier.sum),
        )

    def plus(self, other: Histogram) -> Histogram:
        merged: dict[float, float] = defaultdict(float)
        for le, c in (*self.buckets, *other.buckets):
            merged[le] += c
        return Histogram(tuple(sorted(merged.items())), self.count + other.count, self.sum + other.sum)

    def quantile(self, q: float) -> float | None:
        """Like PromQL histogram_quantile: linear interpolation inside the bucket holding rank q·count."""
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0 or not self.buckets:
            return None
        rank = q * total
        prev_le, prev_c = 0.0, 0.0
        running = 0.0
        for le, c in self.buckets:
            c = max(c, running)  # merged histograms with different layouts can dip; keep cumulative
            running = c
            if c >= rank:
                if math.isinf(le):
                    return prev_le  # the +Inf bucket: the highest finite bound is all we know
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


EMPTY_HISTOGRAM = Histogram(buckets=(), count=0.0, sum=0.0)


@dataclass(frozen=True)
class EngineMetrics:
    counters: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)


def _le(value: str) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def parse_metrics(text: str, engine_label: str = ENGINE_LABEL) -> dict[str, EngineMetrics]:
    """Parse one /metrics page into {engine: EngineMetrics}. Raises ValueError on malformed text."""
    counters: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gauges: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    buckets: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    h_count: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    h_sum: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            engine = s.labels.get(engine_label, DEFAULT_ENGINE)
            if family.type == "counter" and s.name.endswith("_total"):
                counters[engine][family.name] += s.value
            elif family.type == "gauge" and not family.name.endswith("_created"):
                gauges[engine][family.name] += s.value
            elif family.type == "histogram":
                if s.name.endswith("_bucket"):
                    buckets[engine][family.name][_le(s.labels["le"])] += s.value
                elif s.name.endswith("_count"):
                    h_count[engine][family.name] += s.value
                elif s.name.endswith("_sum"):
                    h_sum[engine][family.name] += s.value
    engines = set(counters) | set(gauges) | set(buckets) | set(h_count)
    out: dict[str, EngineMetrics] = {}
    for e in sorted(engines):
        hists = {
            name: Histogram(tuple(sorted(b.items())), h_count[e].get(name, max(b.values(), default=0.0)), h_sum[e].get(name, 0.0))
            for name, b in buckets[e].items()
        }
        out[e] = EngineMetrics(dict(counters[e]), dict(gauges[e]), hists)
    return out
