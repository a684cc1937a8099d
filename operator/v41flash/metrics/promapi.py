"""Window figures from a Prometheus server's HTTP API instead of scraping pods (spec.autoscaling.metrics).

The same figures as ``window.compute_window`` / ``compute_router_window``, written as PromQL over the same
vLLM and vllm-router series, evaluated as instant queries at the window's end: counters and histograms as
``increase()``/``rate()`` over the planner window (histogram quantiles from the bucket increases, as the
scraper differences two snapshots), gauges at the end.

Series identity: every query selects ``<namespace_label>="<ns>"`` and ``<pod_label>=~"<pod>|<pod>|..."``
with the exact names of the pods the operator itself listed and checked (``observation.owned_pod``), plus
the user's ``matchLabels``. Those two labels must be attached by Prometheus from the Kubernetes API (a
PodMonitor/ServiceMonitor does; with kubernetes_sd_configs relabel ``__meta_kubernetes_namespace`` and
``__meta_kubernetes_pod_name``); a label a pod exports itself is renamed ``exported_pod`` by Prometheus
(honor_labels: false), so a foreign pod cannot pass its series off as ours.

Data quality is reported the way the scraper reports it: an expected pod without series is missing, one
with fewer samples than the others over the window (appeared/vanished) or a counter reset is partial. A
Prometheus that cannot be reached, fails a query, or holds no series at all for a role's pods gives that
role a window with ``error`` set (the planner holds and says why); its newest sample's time is the
window's end, so old data reads as stale.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from v41flash.metrics import parse as m
from v41flash.metrics.figures import RouterFigures, WindowFigures
from v41flash.metrics.window import PROXY_ARRIVALS, PROXY_NEW_SESSIONS, PROXY_PROMPT_TOKENS, ROUTER_DURATIONS, ROUTER_ERRORS

MAX_CONCURRENT_QUERIES = 4  # one planner pass sends one instant query per role, one for all pods, one for the router
FIGURE_LABEL = "v41flash_figure"  # which figure a sample of a combined query answers (label_replace'd onto it)
MAX_ANSWER_BYTES = 8 << 20  # one answer: a vector of at most a few hundred pods is tens of KiB


class PrometheusError(RuntimeError):
    """Prometheus could not answer (unreachable, HTTP error, query error); the caller treats it as missing."""


@dataclass(frozen=True)
class PromSource:
    url: str  # base URL, e.g. http://prometheus-operated.monitoring:9090
    namespace: str  # the deployment's namespace
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    match_labels: tuple[tuple[str, str], ...] = ()  # more exact matchers (cluster, job, ...)
    timeout_s: float = 10.0

    @classmethod
    def from_spec(cls, spec, namespace: str) -> PromSource:
        """From spec.autoscaling.metrics.prometheus (api.PrometheusMetricsSpec)."""
        return cls(url=spec.url, namespace=namespace, pod_label=spec.pod_label, namespace_label=spec.namespace_label,
                   match_labels=tuple(sorted(spec.match_labels.items())), timeout_s=spec.timeout_seconds)


def error_kind(error: str) -> str:
    """'Unreachable' | 'NoData' | 'Error' of a window error this module wrote ('Prometheus at <url> <what>...')."""
    what = error.split(" ", 3)[3] if error.startswith("Prometheus at ") and error.count(" ") >= 3 else ""
    if what.startswith(("unreachable", "did not answer")):
        return "Unreachable"
    return "NoData" if what.startswith("has no ") else "Error"


def _quote(value: str) -> str:
    """A PromQL string literal (double-quoted, backslash escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(src: PromSource, pods: Iterable[str]) -> str:
    """Label matchers of exactly these pods' series: namespace, pod name (anchored regex of escaped names), extras."""
    names = sorted(set(pods))
    if not names:
        raise ValueError("a selector needs at least one pod")
    parts = [f"{src.namespace_label}={_quote(src.namespace)}",
             f"{src.pod_label}=~{_quote('|'.join(re.escape(p) for p in names))}"]
    parts += [f"{k}={_quote(v)}" for k, v in src.match_labels]
    return ",".join(parts)


def _window(window_s: float) -> str:
    return f"{max(1, int(round(window_s)))}s"


def _queries(sel: str, w: str, p: float, pod: str) -> dict[str, str]:
    """PromQL per figure of one role's engines (instant queries at the window's end)."""
    def inc(name: str) -> str:
        return f"sum(increase({name}{{{sel}}}[{w}]))"

    def quantile(q: float, name: str) -> str:
        return f"histogram_quantile({q:g}, sum by (le) (increase({name}_bucket{{{sel}}}[{w}])))"

    def mean(name: str) -> str:
        return f"{inc(name + '_sum')} / {inc(name + '_count')}"

    return {
        "requests": inc(f"{m.E2E}_count"),
        "request_rate": f"sum(rate({m.E2E}_count{{{sel}}}[{w}]))",
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
        # per pod: samples over the window (fewer than the others: appeared/vanished), counter resets, load now
        "pod_samples": f"sum by ({pod}) (count_over_time({m.RUNNING}{{{sel}}}[{w}]))",
        "pod_resets": f"sum by ({pod}) (resets({m.E2E}_count{{{sel}}}[{w}]))",
        "pod_running": f"sum by ({pod}) ({m.RUNNING}{{{sel}}})",
    }


def _router_queries(sel: str, w: str, pod: str) -> dict[str, str]:
    """PromQL of the router pods' figures: vllm-router's request histograms and errors, the session proxy's
    leading signals (its /proxy/metrics must be scraped too for those)."""
    q: dict[str, str] = {"pods": f"count(count by ({pod}) ({{__name__=~{_quote('|'.join(re.escape(n + '_count') for n in ROUTER_DURATIONS))},{sel}}}))"}
    for i, name in enumerate(ROUTER_DURATIONS):
        q[f"requests{i}"] = f"sum(increase({name}_count{{{sel}}}[{w}]))"
        q[f"p95_{i}"] = f"histogram_quantile(0.95, sum by (le) (increase({name}_bucket{{{sel}}}[{w}])))"
        q[f"mean{i}"] = f"sum(increase({name}_sum{{{sel}}}[{w}])) / sum(increase({name}_count{{{sel}}}[{w}]))"
    q["errors"] = " + ".join(f"(sum(increase({n}_total{{{sel}}}[{w}])) or vector(0))" for n in ROUTER_ERRORS)
    for key, name in (("arrivals", PROXY_ARRIVALS), ("new_sessions", PROXY_NEW_SESSIONS),
                      ("prompt_tokens", PROXY_PROMPT_TOKENS)):
        q[key] = f"sum(increase({name}_total{{{sel}}}[{w}]))"
    return q


def _value(result: list[dict]) -> float | None:
    if not result:
        return None
    v = float(result[0]["value"][1])
    return None if math.isnan(v) or math.isinf(v) else v


def _by_pod(result: list[dict], pod_label: str) -> dict[str, float]:
    return {s["metric"].get(pod_label, ""): float(s["value"][1]) for s in result}


async def _post(client: httpx.AsyncClient, url: str, form: dict[str, str]) -> tuple[int, bytes]:
    """POST, reading at most MAX_ANSWER_BYTES (the URL is the CR author's: an endless body must not fill memory)."""
    async with client.stream("POST", url, data=form) as resp:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise PrometheusError(f"answer of {declared} bytes, over {MAX_ANSWER_BYTES}")
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise PrometheusError(f"answer over {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
        return resp.status_code, b"".join(chunks)


async def _query(client: httpx.AsyncClient, src: PromSource, promql: str, at: float, sem: asyncio.Semaphore
                 ) -> list[dict]:
    """One instant query (POST: a selector of many pod names would not fit a URL)."""
    async with sem:
        try:
            status, raw = await _post(client, f"{src.url.rstrip('/')}/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        except httpx.HTTPError as exc:
            raise PrometheusError(f"Prometheus at {src.url} unreachable: {type(exc).__name__}: {exc}") from exc
        except PrometheusError as exc:
            raise PrometheusError(f"Prometheus at {src.url} answered too much: {exc}") from exc
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise PrometheusError(f"Prometheus at {src.url} answered HTTP {status} with no JSON: {raw[:200]!r}") from exc
    if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", body) if isinstance(body, dict) else body
        raise PrometheusError(f"Prometheus at {src.url} answered HTTP {status}: {str(err)[:300]}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"Prometheus at {src.url} answered a {data.get('resultType')!r}, not a vector")
    return data.get("result") or []


def combined(queries: Mapping[str, str]) -> str:
    """One PromQL expression answering every figure of ``queries``: each figure's vector labelled with its key
    (``FIGURE_LABEL``) and the vectors joined by ``or`` (their label sets differ by that label, so every sample
    stays). One instant query per group of pods instead of one per figure (~25 a role)."""
    return " or ".join(f'label_replace({q}, "{FIGURE_LABEL}", "{key}", "", "")' for key, q in queries.items())


def split(result: list[dict], keys: Iterable[str]) -> dict[str, list[dict]]:
    """The answer of ``combined`` back into one result per figure (the figure label removed); a figure with no
    sample gets an empty result, as its own query would have."""
    out: dict[str, list[dict]] = {key: [] for key in keys}
    for sample in result:
        metric = dict(sample.get("metric") or {})
        key = metric.pop(FIGURE_LABEL, None)
        if key in out:
            out[key].append({**sample, "metric": metric})
    return out


async def _run(client: httpx.AsyncClient, src: PromSource, queries: Mapping[str, str], at: float,
               sem: asyncio.Semaphore) -> dict[str, list[dict]]:
    return split(await _query(client, src, combined(queries), at, sem), queries)


def role_figures(src: PromSource, r: Mapping[str, list[dict]], end: float, window_s: float,
                 expected: Sequence[str], ttft_percentile: float) -> WindowFigures:
    """WindowFigures of one role from the answers to ``_queries`` (pure: recorded answers test it)."""
    v = {k: _value(res) for k, res in r.items() if not k.startswith("pod_")}
    samples = _by_pod(r["pod_samples"], src.pod_label)
    resets = {p for p, n in _by_pod(r["pod_resets"], src.pod_label).items() if n > 0}
    running_by_pod = _by_pod(r["pod_running"], src.pod_label)
    want = set(expected)
    seen = set(samples) & want
    if not seen:
        return WindowFigures(start=end - window_s, end=end, pods_expected=len(want), missing_pods=tuple(sorted(want)),
                             ttft_percentile=ttft_percentile,
                             error=(f"Prometheus at {src.url} has no {m.RUNNING} series of the {len(want)} pod(s) "
                                    f"({src.namespace_label}={src.namespace}, {src.pod_label}={', '.join(sorted(want)[:3])}"
                                    f"{', ...' if len(want) > 3 else ''}): does it scrape them and attach those labels?"))
    most = max(samples[p] for p in seen)
    missing = sorted(want - seen)
    short = {p for p in seen if samples[p] < 0.75 * most}
    restarted = resets & seen
    partial = sorted(short | restarted)
    notes = [f"{p}: no series in Prometheus" for p in missing]
    notes += [f"{p}: appeared or vanished mid-window (Prometheus has {samples[p]:.0f} of {most:.0f} samples)"
              for p in sorted(short)]
    notes += [f"{p}: restarted (counter reset) during the window" for p in sorted(restarted)]
    requests = v["requests"] or 0.0
    last = v["last_sample"]
    return WindowFigures(
        start=end - window_s,
        end=min(end, last) if last is not None else end - 10 * window_s,
        pods_expected=len(want),
        pods_observed=len(seen),
        missing_pods=tuple(missing),
        partial_pods=tuple(partial),
        requests=requests,
        request_rate=v["request_rate"] or 0.0,
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
        pod_running=tuple(sorted((p, n) for p, n in running_by_pod.items() if p in want)),
    )


def router_figures(r: Mapping[str, list[dict]], end: float, window_s: float, expected: Sequence[str]) -> RouterFigures:
    """RouterFigures from the answers to ``_router_queries``: the P/D histogram when it counted requests."""
    v = {k: _value(res) for k, res in r.items()}
    i = next((i for i in range(len(ROUTER_DURATIONS)) if (v[f"requests{i}"] or 0) > 0), 0)
    requests = v[f"requests{i}"] or 0.0
    observed = int(v["pods"] or 0)

    def rate(key: str) -> float | None:
        return v[key] / window_s if v[key] is not None and window_s > 0 else None

    return RouterFigures(
        start=end - window_s, end=end, requests=requests,
        request_rate=requests / window_s if window_s > 0 else 0.0,
        e2e_p95_s=v[f"p95_{i}"] if requests > 0 else None, e2e_mean_s=v[f"mean{i}"] if requests > 0 else None,
        errors=v["errors"] or 0.0, pods_observed=observed,
        missing_pods=tuple(sorted(expected)) if observed == 0 else (),
        arrival_rate=rate("arrivals"), new_session_rate=rate("new_sessions"),
        prompt_tokens_arriving_rate=rate("prompt_tokens"))


def _failed(role_pods: Sequence[str], end: float, window_s: float, p: float, why: str) -> WindowFigures:
    return WindowFigures(start=end - window_s, end=end, pods_expected=len(role_pods), missing_pods=tuple(sorted(role_pods)),
                         ttft_percentile=p, error=why)


async def prometheus_windows(
    src: PromSource,
    end: float,
    window_s: float,
    expected: Mapping[str, Sequence[str]],
    router_pods: Sequence[str] = (),
    ttft_percentile: float = 0.9,
    client: httpx.AsyncClient | None = None,
) -> tuple[dict[str, WindowFigures], RouterFigures | None]:
    """Per role (keys of ``expected``: role → its Ready pods) plus ``overall`` (all of them), and the router's
    figures, like ``window.role_windows`` + ``compute_router_window``. Never raises: a role Prometheus could
    not measure gets a window with ``error`` set; the router's figures are None then (like no router scraped)."""
    w = _window(window_s)
    groups = {role: list(pods) for role, pods in expected.items()}
    groups["overall"] = sorted({p for pods in expected.values() for p in pods})
    own = client is None
    client = client or httpx.AsyncClient(timeout=httpx.Timeout(src.timeout_s), follow_redirects=False)
    sem = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    async def one(pods: list[str]) -> WindowFigures:
        if not pods:  # nothing Ready to measure: the same empty window the scraper gives
            return WindowFigures(start=end - window_s, end=end, ttft_percentile=ttft_percentile)
        try:
            r = await _run(client, src, _queries(selector(src, pods), w, ttft_percentile, src.pod_label), end, sem)
        except PrometheusError as exc:
            return _failed(pods, end, window_s, ttft_percentile, str(exc))
        return role_figures(src, r, end, window_s, pods, ttft_percentile)

    async def router() -> RouterFigures | None:
        if not router_pods:
            return None
        try:
            r = await _run(client, src, _router_queries(selector(src, router_pods), w, src.pod_label), end, sem)
        except PrometheusError:
            return None  # the engine roles carry the error; the planner falls back to their figures
        return router_figures(r, end, window_s, router_pods)

    async def everything():
        return await asyncio.gather(*(one(p) for p in groups.values()), router())

    try:
        *figs, rt = await asyncio.wait_for(everything(), src.timeout_s)
    except asyncio.TimeoutError:
        why = f"Prometheus at {src.url} did not answer within {src.timeout_s:g} s"
        figs, rt = [_failed(p, end, window_s, ttft_percentile, why) for p in groups.values()], None
    finally:
        if own:
            await client.aclose()
    return dict(zip(groups, figs, strict=True)), rt
