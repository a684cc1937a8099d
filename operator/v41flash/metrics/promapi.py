"""Window figures from a Prometheus server's HTTP API instead of scraping pods (optional source).

The same figures as ``window.compute_window``, written as PromQL over the same vLLM series, evaluated
as instant queries at the window's end. Where the pods' series carry a pod label (``pod`` by default,
as a ServiceMonitor/PodMonitor adds it), missing and partial pods are reported the same way.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from v41flash.metrics import parse as m
from v41flash.metrics.figures import WindowFigures


class PrometheusError(RuntimeError):
    """Prometheus could not answer (unreachable, HTTP error, query error); the caller treats it as missing."""


@dataclass(frozen=True)
class PromSource:
    url: str  # base URL, e.g. http://prometheus-operated.monitoring:9090
    selector: str  # label matchers of one role's vLLM series, e.g. 'namespace="ai",v41flash_io_role="prefill"'
    pod_label: str = "pod"
    timeout_s: float = 10.0


def _queries(sel: str, w: str, p: float, pod: str) -> dict[str, str]:
    def inc(name: str) -> str:
        return f"sum(increase({name}{{{sel}}}[{w}]))"

    def quantile(q: float, name: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (increase({name}_bucket{{{sel}}}[{w}])))"

    def mean(name: str) -> str:
        return f"{inc(name + '_sum')} / {inc(name + '_count')}"

    return {
        "requests": inc(f"{m.E2E}_count"),
        "ttft": quantile(p, m.TTFT),
        "ttft_mean": mean(m.TTFT),
        "e2e_p95": quantile(0.95, m.E2E),
        "e2e_mean": mean(m.E2E),
        "queue_p95": quantile(0.95, m.QUEUE),
        "itl_mean": mean(m.ITL),
        "prefill_time_mean": mean(m.PREFILL_TIME),
        "prompt_rate": f"sum(rate({m.PROMPT_TOKENS}_total{{{sel}}}[{w}]))",
        "gen_rate": f"sum(rate({m.GEN_TOKENS}_total{{{sel}}}[{w}]))",
        "isl": mean(m.PROMPT_LEN),
        "osl": mean(m.GEN_LEN),
        "osl_p95": quantile(0.95, m.GEN_LEN),
        "hit_rate": f"{inc(m.PREFIX_HITS + '_total')} / {inc(m.PREFIX_QUERIES + '_total')}",
        "preemptions": inc(f"{m.PREEMPTIONS}_total"),
        "running": f"sum({m.RUNNING}{{{sel}}})",
        "waiting": f"sum({m.WAITING}{{{sel}}})",
        "kv": f"avg({m.KV_USAGE}{{{sel}}})",
        "spread": f"max({m.RUNNING}{{{sel}}}) / avg({m.RUNNING}{{{sel}}})",
        "engines": f"count({m.RUNNING}{{{sel}}})",
        "last_sample": f"max(timestamp({m.RUNNING}{{{sel}}}))",
        # per pod: samples over the window (fewer than the others: appeared/vanished) and counter resets
        "pod_samples": f"sum by ({pod}) (count_over_time({m.RUNNING}{{{sel}}}[{w}]))",
        "pod_resets": f"sum by ({pod}) (resets({m.E2E}_count{{{sel}}}[{w}]))",
    }


def _value(result: list[dict]) -> float | None:
    if not result:
        return None
    v = float(result[0]["value"][1])
    return None if math.isnan(v) or math.isinf(v) else v


async def _query(client: httpx.AsyncClient, src: PromSource, promql: str, at: float) -> list[dict]:
    try:
        resp = await client.get(f"{src.url.rstrip('/')}/api/v1/query", params={"query": promql, "time": f"{at:.3f}"})
        body = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise PrometheusError(f"{src.url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200 or body.get("status") != "success":
        raise PrometheusError(f"{src.url}: HTTP {resp.status_code}: {body.get('error', body)} (query {promql})")
    return body["data"]["result"]


async def prometheus_window(
    src: PromSource,
    end: float,
    window_s: float,
    expected_pods: Iterable[str] | None = None,
    ttft_percentile: float = 0.9,
    client: httpx.AsyncClient | None = None,
) -> WindowFigures:
    """Figures of one role over [end - window_s, end] from Prometheus; raises PrometheusError."""
    w = f"{max(1, int(round(window_s)))}s"
    queries = _queries(src.selector, w, ttft_percentile, src.pod_label)
    own = client is None
    client = client or httpx.AsyncClient(timeout=httpx.Timeout(src.timeout_s))
    try:
        results = await asyncio.gather(*(_query(client, src, q, end) for q in queries.values()))
    finally:
        if own:
            await client.aclose()
    r = dict(zip(queries, results, strict=True))
    v = {k: _value(res) for k, res in r.items() if not k.startswith("pod_")}
    samples = {s["metric"].get(src.pod_label, ""): float(s["value"][1]) for s in r["pod_samples"]}
    resets = {s["metric"].get(src.pod_label, "") for s in r["pod_resets"] if float(s["value"][1]) > 0}
    expected = set(expected_pods) if expected_pods is not None else set(samples)
    most = max(samples.values(), default=0.0)
    missing = sorted(expected - set(samples))
    short = {p for p, n in samples.items() if n < 0.75 * most}
    partial = sorted((short | resets) - set(missing))
    notes = [f"{p}: no series in Prometheus" for p in missing]
    notes += [f"{p}: appeared or vanished mid-window" for p in sorted(short)]
    notes += [f"{p}: restarted (counter reset) during the window" for p in sorted(resets)]
    requests = v["requests"] or 0.0
    observed = len(expected & set(samples))
    return WindowFigures(
        start=end - window_s,
        end=min(end, v["last_sample"]) if v["last_sample"] is not None else end - 10 * window_s,
        pods_expected=len(expected),
        pods_observed=observed,
        missing_pods=tuple(missing),
        partial_pods=tuple(partial),
        requests=requests,
        request_rate=requests / window_s if window_s > 0 else 0.0,
        ttft_percentile=ttft_percentile,
        ttft_s=v["ttft"],
        ttft_mean_s=v["ttft_mean"],
        e2e_p95_s=v["e2e_p95"],
        e2e_mean_s=v["e2e_mean"],
        queue_p95_s=v["queue_p95"],
        itl_mean_s=v["itl_mean"],
        prefill_time_mean_s=v["prefill_time_mean"],
        prompt_tokens_rate=v["prompt_rate"] or 0.0,
        generation_tokens_rate=v["gen_rate"] or 0.0,
        mean_input_tokens=v["isl"],
        mean_output_tokens=v["osl"],
        output_tokens_p95=v["osl_p95"],
        prefix_cache_hit_rate=v["hit_rate"],
        preemptions=v["preemptions"] or 0.0,
        running=v["running"] or 0.0,
        waiting=v["waiting"] or 0.0,
        kv_cache_usage=v["kv"],
        load_spread=v["spread"],
        engines=int(v["engines"] or 0),
        notes=tuple(notes),
    )
