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

Where it may connect (issue 39): only to what the operator's administrator allows (api/endpoints.py: URL
prefixes, or Services of allowed namespaces). The host name is resolved here and every address checked (no
loopback, link-local or cloud metadata address unless the allowlist names it); the query then goes to that
checked address (Host header and TLS server name kept), so a name that resolves again differently is never
followed. Nothing of an answer but its status code and Prometheus' own error type reaches a window's error (which
status, Events and logs show), and the URL is shown without userinfo: a URL that is no Prometheus (a metadata
service, a secret store) gets its answer counted, never copied. Every failure, a malformed URL and a failed name
lookup included, is a window error naming the field; nothing raises into the planner.

Data quality is reported the way the scraper reports it: an expected pod without series is missing, one
with fewer samples than the others over the window (appeared/vanished) or a counter reset is partial. A
Prometheus that cannot be reached, fails a query, or holds no series at all for a role's pods gives that
role a window with ``error`` set (the planner holds and says why); its newest sample's time is the
window's end, so old data reads as stale.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from v41flash.api import endpoints as E

from v41flash.figures import RouterFigures, WindowFigures
from v41flash.metrics import parse as m
from v41flash.metrics.window import PROXY_ARRIVALS, PROXY_NEW_SESSIONS, PROXY_PROMPT_TOKENS, ROUTER_DURATIONS, ROUTER_ERRORS

MAX_CONCURRENT_QUERIES = 4  # one planner pass sends one instant query per role, one for all pods, one for the router
FIGURE_LABEL = "v41flash_figure"  # which figure a sample of a combined query answers (label_replace'd onto it)
MAX_ANSWER_BYTES = 8 << 20  # one answer: a vector of at most a few hundred pods is tens of KiB
URL_FIELD = E.FIELD  # spec.autoscaling.metrics.prometheus.url: every error about reaching it names it
FIELD = "spec.autoscaling.metrics.prometheus"
# Prometheus' own errorType values (its HTTP API): the one part of an error answer a window's error repeats
ERROR_TYPES = ("bad_data", "timeout", "canceled", "execution", "internal", "unavailable", "not_found",
               "not_acceptable")
RESULT_TYPES = ("matrix", "vector", "scalar", "string")
Resolver = Callable[[str, int], Awaitable[list[str]]]  # host, port -> addresses


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
    # what the administrator allows (the operator always passes it); None: no check (tests, a checked caller)
    allow: E.EndpointAllowlist | None = None

    @classmethod
    def from_spec(cls, spec, namespace: str, allow: E.EndpointAllowlist) -> PromSource:
        """From spec.autoscaling.metrics.prometheus (api.PrometheusMetricsSpec) and the operator's allowlist."""
        return cls(url=spec.url, namespace=namespace, pod_label=spec.pod_label, namespace_label=spec.namespace_label,
                   match_labels=tuple(sorted(spec.match_labels.items())), timeout_s=spec.timeout_seconds, allow=allow)

    @property
    def shown(self) -> str:
        """The URL as errors show it (no userinfo)."""
        return E.redact(self.url)


def _at(src: PromSource, what: str, field: str = URL_FIELD) -> str:
    """A window error: the field, then 'Prometheus at <url> <what>' (error_kind reads <what>)."""
    return f"{field}: Prometheus at {src.shown} {what}"


def error_kind(error: str) -> str:
    """'Unreachable' | 'Refused' | 'NoData' | 'Error' of a window error this module wrote
    ('<field>: Prometheus at <url> <what>...'): read from the phrase after the URL, never the server's text."""
    head, sep, rest = error.partition("Prometheus at ")
    what = rest.split(" ", 1)[1] if sep and " " in rest and not head.strip(": ").count(" ") else ""
    if what.startswith(("unreachable", "did not answer", "cannot be resolved")):
        return "Unreachable"
    if what.startswith("refused"):
        return "Refused"
    return "NoData" if what.startswith("has no ") else "Error"


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


async def checked_target(src: PromSource, resolver: Resolver = _resolve) -> tuple[E.Endpoint, str]:
    """The endpoint and the one address the query goes to, every address of the host checked against the
    administrator's allowlist; PrometheusError (naming why, never userinfo) otherwise."""
    try:
        ep = E.parse(src.url)
    except ValueError as exc:
        raise PrometheusError(_at(src, f"refused: {exc}")) from None
    if src.allow is not None:
        why = E.static_problem(src.url, src.allow)
        if why:
            raise PrometheusError(_at(src, f"refused: {why.removeprefix(str(ep)).lstrip(': ')}"))
    literal = None
    try:
        literal = ipaddress.ip_address(ep.host)
    except ValueError:
        pass
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(ep.host, ep.port)
        except (OSError, UnicodeError, ValueError) as exc:
            raise PrometheusError(_at(src, f"cannot be resolved ({type(exc).__name__})")) from None
        if not addresses:
            raise PrometheusError(_at(src, "cannot be resolved (no address)"))
    if src.allow is not None:
        entry = src.allow.match(ep)
        for a in addresses:
            try:
                why = E.address_problem(ep, ipaddress.ip_address(a.split("%")[0]), entry)
            except ValueError:
                why = f"{ep} resolves to an address the operator cannot read"
            if why:
                raise PrometheusError(_at(src, f"refused: {why.removeprefix(str(ep)).lstrip(': ')}"))
    return ep, addresses[0]


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


async def _post(client: httpx.AsyncClient, url: str, form: dict[str, str], headers: dict[str, str] | None = None,
                extensions: dict[str, str] | None = None) -> tuple[int, bytes]:
    """POST, reading at most MAX_ANSWER_BYTES (the URL is the CR author's: an endless body must not fill memory)."""
    async with client.stream("POST", url, data=form, headers=headers, extensions=extensions) as resp:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise PrometheusError(f"a declared answer over {MAX_ANSWER_BYTES} bytes")
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise PrometheusError(f"answer over {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
        return resp.status_code, b"".join(chunks)


def _transport_failure(exc: BaseException) -> str:
    """What went wrong reaching the server, by exception type only: an exception's text can hold what the server
    sent (a status line, a certificate's names)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return f"unreachable: TLS handshake failed ({type(cause).__name__})"
        cause = cause.__cause__ or cause.__context__
    return f"unreachable: {type(exc).__name__}"


def _pinned(ep: E.Endpoint, address: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """The query URL at the checked address, with the Host header and the TLS server name of the URL's host."""
    ip = ipaddress.ip_address(address.split("%")[0])
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    named = f"[{ep.host}]" if ":" in ep.host else ep.host
    default = ep.port == (443 if ep.scheme == "https" else 80)
    extensions = {"sni_hostname": ep.host} if ep.scheme == "https" and ip != _literal_or_none(ep.host) else {}
    return (f"{ep.scheme}://{host}:{ep.port}{ep.path}/api/v1/query",
            {"Host": named if default else f"{named}:{ep.port}"}, extensions)


def _literal_or_none(host: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _query(client: httpx.AsyncClient, src: PromSource, target: tuple[E.Endpoint, str], promql: str, at: float,
                 sem: asyncio.Semaphore) -> list[dict]:
    """One instant query (POST: a selector of many pod names would not fit a URL) to the checked address."""
    url, headers, extensions = _pinned(*target)
    async with sem:
        try:
            status, raw = await _post(client, url, {"query": promql, "time": f"{at:.3f}"}, headers, extensions)
        except httpx.HTTPError as exc:
            raise PrometheusError(_at(src, _transport_failure(exc))) from None
        except PrometheusError as exc:
            raise PrometheusError(_at(src, f"answered too much: {exc}")) from None
        except Exception as exc:  # noqa: BLE001 - an invalid URL, a codec error: a window error, never a crash
            raise PrometheusError(_at(src, f"failed: {type(exc).__name__}")) from None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise PrometheusError(_at(src, f"answered HTTP {status} with no JSON (its answer is not shown)")) from None
    if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
        kind = body.get("errorType") if isinstance(body, dict) else None
        shown = f" ({kind})" if kind in ERROR_TYPES else ""
        raise PrometheusError(_at(src, f"answered HTTP {status}{shown}: not a successful query answer (its answer is "
                                       f"not shown)"))
    data = body.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    if kind != "vector":
        shown = repr(kind) if kind in RESULT_TYPES else "another type"
        raise PrometheusError(_at(src, f"answered a {shown}, not a vector"))
    result = data.get("result") or []
    if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
        raise PrometheusError(_at(src, "answered a vector of no samples it can read"))
    return result


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


async def _run(client: httpx.AsyncClient, src: PromSource, target: tuple[E.Endpoint, str], queries: Mapping[str, str],
               at: float, sem: asyncio.Semaphore) -> dict[str, list[dict]]:
    return split(await _query(client, src, target, combined(queries), at, sem), queries)


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
                             error=_at(src, f"has no {m.RUNNING} series of the {len(want)} pod(s) "
                                            f"({src.namespace_label}={src.namespace}, {src.pod_label}="
                                            f"{', '.join(sorted(want)[:3])}{', ...' if len(want) > 3 else ''}): does "
                                            f"it scrape them and attach those labels?", FIELD))
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
    client = client or httpx.AsyncClient(timeout=httpx.Timeout(src.timeout_s), follow_redirects=False, trust_env=False)
    sem = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)
    target: tuple[E.Endpoint, str] | None = None

    async def one(pods: list[str]) -> WindowFigures:
        if not pods:  # nothing Ready to measure: the same empty window the scraper gives
            return WindowFigures(start=end - window_s, end=end, ttft_percentile=ttft_percentile)
        try:
            r = await _run(client, src, target, _queries(selector(src, pods), w, ttft_percentile, src.pod_label), end,
                           sem)
            return role_figures(src, r, end, window_s, pods, ttft_percentile)
        except PrometheusError as exc:
            return _failed(pods, end, window_s, ttft_percentile, str(exc))
        except Exception as exc:  # noqa: BLE001 - samples no figure can be read from: an error window, not a crash
            return _failed(pods, end, window_s, ttft_percentile,
                           _at(src, f"answered samples the planner cannot read ({type(exc).__name__})"))

    async def router() -> RouterFigures | None:
        if not router_pods:
            return None
        try:
            r = await _run(client, src, target, _router_queries(selector(src, router_pods), w, src.pod_label), end,
                           sem)
            return router_figures(r, end, window_s, router_pods)
        except Exception:  # noqa: BLE001 - the engine roles carry the error; the planner falls back to their figures
            return None

    async def everything():
        nonlocal target
        target = await checked_target(src)  # once a round: every query goes to this checked address
        return await asyncio.gather(*(one(p) for p in groups.values()), router())

    def failed(why: str):
        return [_failed(p, end, window_s, ttft_percentile, why) if p else
                WindowFigures(start=end - window_s, end=end, ttft_percentile=ttft_percentile)
                for p in groups.values()], None

    try:
        if not any(groups.values()):
            # nothing Ready to measure: no query, no name lookup
            figs, rt = [WindowFigures(start=end - window_s, end=end, ttft_percentile=ttft_percentile) for _ in groups], None
        else:
            *figs, rt = await asyncio.wait_for(everything(), src.timeout_s)
    except asyncio.TimeoutError:
        figs, rt = failed(_at(src, f"did not answer within {src.timeout_s:g} s"))
    except PrometheusError as exc:
        figs, rt = failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - never raises into the planner (it would fail every pass)
        figs, rt = failed(_at(src, f"failed: {type(exc).__name__}"))
    finally:
        if own:
            await client.aclose()
    return dict(zip(groups, figs, strict=True)), rt
