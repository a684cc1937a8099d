"""`v41flash front-counters`: the front's counters for the planner and Prometheus, read from Envoy's stats.

Runs beside Envoy in the front pod, on loopback; Envoy routes GET /proxy/metrics to it (front/envoy.py), so the
series keep the names and the place the session proxy gave them (metrics/window.py reads the first three):

- ``v41flash_session_proxy_arrivals_total``: inference requests sent on (the x-v41flash-class virtual clusters);
- ``v41flash_session_proxy_new_sessions_total``: those that are a conversation's first turn (one non-system
  message, the user's): a fact of the request, so every front replica counts a session once, whichever serves it;
- ``v41flash_session_proxy_prompt_tokens_estimated_total``: bytes received from clients / 4 (headers included:
  a few hundred bytes a request beside prompts of thousands of tokens);
- ``..._requests_total{code_class}``, ``..._session_keys_total{source}``, ``..._upstream_errors_total`` (a slot
  router unreachable or reset), ``..._refused_total{why}`` (busy: over the in-flight cap; slow_body: the request
  deadline).

Nothing here is on a request's path: it reads Envoy's admin API (loopback) once per scrape.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Mapping

import httpx
from aiohttp import web
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from .envoy import ADMIN_PORT, COUNTERS_PORT, KEY_SOURCES, STAT_PREFIX, VHOST, cluster_name

PREFIX = "v41flash_session_proxy"
BODY_BYTES_PER_TOKEN = 4.0
log = logging.getLogger("v41flash.front_counters")


def parse_stats(text: str) -> dict[str, float]:
    """Envoy's plain /stats page ("name: value" lines) → {name: value}; histograms and text lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition(": ")
        if sep and value.strip().lstrip("-").replace(".", "", 1).isdigit():
            out[name] = float(value)
    return out


def families(stats: Mapping[str, float]) -> list[CounterMetricFamily]:
    """The front's counters from Envoy's stats (pure)."""
    def stat(name: str) -> float:
        return stats.get(name, 0.0)

    http = f"http.{STAT_PREFIX}."
    requests = CounterMetricFamily(f"{PREFIX}_requests", "Requests answered by the front, by code class",
                                   labels=["code_class"])
    for c in range(1, 6):
        requests.add_metric([f"{c}xx"], stat(f"{http}downstream_rq_{c}xx"))
    keys = CounterMetricFamily(f"{PREFIX}_session_keys", "Inference requests sent on, by where x-session-id came "
                               "from (client, header, derived, none)", labels=["source"])
    arrivals = new = 0.0
    for src in KEY_SOURCES:
        plain = stat(f"vhost.{VHOST}.vcluster.keys_{src}.upstream_rq_total")
        first = stat(f"vhost.{VHOST}.vcluster.keys_{src}_first.upstream_rq_total")
        keys.add_metric([src], plain + first)
        arrivals += plain + first
        new += first
    revision = f"cluster.{cluster_name('')}"
    upstream_errors = sum(v for k, v in stats.items() if k.startswith(revision) and k.rpartition(".")[2] in (
        "upstream_cx_connect_fail", "upstream_rq_rx_reset", "upstream_cx_none_healthy"))
    busy = sum(v for k, v in stats.items() if k.startswith(revision) and k.endswith(".upstream_rq_pending_overflow"))
    refused = CounterMetricFamily(f"{PREFIX}_refused", "Requests the front answered itself, by why (busy: over "
                                  "the in-flight cap; slow_body: the request not received in time)", labels=["why"])
    refused.add_metric(["busy"], busy)
    refused.add_metric(["slow_body"], stat(f"{http}downstream_rq_timeout"))
    return [
        requests, keys, refused,
        CounterMetricFamily(f"{PREFIX}_arrivals", "Inference requests arriving (sent on to a slot router)",
                            value=arrivals),
        CounterMetricFamily(f"{PREFIX}_new_sessions", "Inference requests that are a conversation's first turn",
                            value=new),
        CounterMetricFamily(f"{PREFIX}_prompt_tokens_estimated", "Prompt tokens arriving, estimated as bytes "
                            f"received from clients / {BODY_BYTES_PER_TOKEN:g}",
                            value=stat(f"{http}downstream_cx_rx_bytes_total") / BODY_BYTES_PER_TOKEN),
        CounterMetricFamily(f"{PREFIX}_upstream_errors", "Requests a slot router could not be reached for or "
                            "that it reset", value=upstream_errors),
    ]


class _Snapshot(Collector):
    def __init__(self, stats: Mapping[str, float]) -> None:
        self.stats = stats

    def collect(self):  # type: ignore[no-untyped-def]
        yield from families(self.stats)


def exposition(stats: Mapping[str, float]) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Snapshot(stats))
    return generate_latest(registry)


def app(admin: str) -> web.Application:
    client = httpx.AsyncClient(timeout=4.0)

    async def metrics(_request: web.Request) -> web.Response:
        try:
            r = await client.get(f"http://{admin}/stats", params={"usedonly": "", "filter": r"^(http\.front|vhost|cluster\.revision-)"})
            r.raise_for_status()
        except httpx.HTTPError as e:
            return web.Response(status=503, text=f"envoy admin {admin}: {e}\n")
        return web.Response(body=exposition(parse_stats(r.text)), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def close(_app: web.Application) -> None:
        await client.aclose()

    a = web.Application()
    a.router.add_get("/proxy/metrics", metrics)
    a.on_cleanup.append(close)
    return a


def run_cli(args: argparse.Namespace) -> int:
    """`v41flash front-counters` (parser in v41flash.cli.front)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    web.run_app(app(args.admin), host=host.strip("[]") or "127.0.0.1", port=int(port), access_log=None,
                print=None)
    return 0
