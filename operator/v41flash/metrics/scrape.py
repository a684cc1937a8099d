"""Scrape vLLM pods' and the router's Prometheus endpoints (httpx, async, bounded, never all-or-nothing).

Every target yields exactly one ``PodSnapshot``: a failed target (timeout, refused, HTTP error,
unparsable text) comes back with ``error`` set, so one bad pod is reported as missing by the window
instead of failing the whole scrape.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import httpx

from v41flash.metrics.parse import parse_metrics
from v41flash.metrics.window import PodSnapshot
from v41flash.render.engine import ENGINE_PORT as VLLM_METRICS_PORT  # vLLM serves /metrics on its API port
from v41flash.render.labels import ROUTER
from v41flash.render.router import METRICS_PORT as ROUTER_METRICS_PORT
from v41flash.render.router import ROUTER_PORT


@dataclass(frozen=True)
class ScrapeTarget:
    pod: str  # pod name (the key of its snapshots)
    role: str  # prefill | decode | router
    url: str  # full /metrics URL


def vllm_target(pod: str, role: str, pod_ip: str, port: int = VLLM_METRICS_PORT) -> ScrapeTarget:
    return ScrapeTarget(pod, role, f"http://{_host(pod_ip)}:{port}/metrics")


def router_target(pod: str, pod_ip: str, port: int = ROUTER_METRICS_PORT) -> ScrapeTarget:
    return ScrapeTarget(pod, ROUTER, f"http://{_host(pod_ip)}:{port}/metrics")


def proxy_target(pod: str, pod_ip: str, port: int = ROUTER_PORT) -> ScrapeTarget:
    """The session proxy on the router pod: its leading signals (arrivals, new sessions, prompt tokens).
    Its snapshots are kept under '<pod>/proxy' so they never mix with the router's own."""
    return ScrapeTarget(f"{pod}/proxy", "router", f"http://{_host(pod_ip)}:{port}/proxy/metrics")


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip  # IPv6 pod IPs need brackets


async def scrape_one(
    client: httpx.AsyncClient, target: ScrapeTarget, clock: Callable[[], float] = time.time
) -> PodSnapshot:
    try:
        resp = await client.get(target.url)
        resp.raise_for_status()
        engines = parse_metrics(resp.text)
    except httpx.HTTPStatusError as exc:
        return PodSnapshot(target.pod, target.role, clock(), error=f"HTTP {exc.response.status_code} from {target.url}")
    except httpx.TimeoutException:
        return PodSnapshot(target.pod, target.role, clock(), error=f"timeout scraping {target.url}")
    except httpx.HTTPError as exc:
        return PodSnapshot(target.pod, target.role, clock(), error=f"{type(exc).__name__} scraping {target.url}: {exc}")
    except (ValueError, KeyError, IndexError) as exc:  # prometheus_client's parser on malformed text
        return PodSnapshot(target.pod, target.role, clock(), error=f"unparsable metrics from {target.url}: {exc}")
    if target.role != "router" and not any(name.startswith("vllm:") for em in engines.values()
                                           for name in (*em.counters, *em.gauges, *em.histograms)):
        # an empty page (or some other exporter's) is no measurement: read as zero load it would shrink the role
        return PodSnapshot(target.pod, target.role, clock(), error=f"no vllm:* series in the metrics from {target.url}")
    return PodSnapshot(target.pod, target.role, clock(), engines=engines)


async def scrape(
    targets: Iterable[ScrapeTarget],
    *,
    concurrency: int = 16,
    timeout_s: float = 5.0,
    client: httpx.AsyncClient | None = None,
    clock: Callable[[], float] = time.time,
) -> list[PodSnapshot]:
    """Scrape all targets with at most ``concurrency`` requests in flight; one snapshot per target, in order."""
    targets = list(targets)
    sem = asyncio.Semaphore(max(1, concurrency))
    own = client is None
    client = client or httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=max(1, concurrency), max_keepalive_connections=max(1, concurrency)),
        follow_redirects=False,
    )

    async def bounded(t: ScrapeTarget) -> PodSnapshot:
        async with sem:
            return await scrape_one(client, t, clock)

    try:
        return list(await asyncio.gather(*(bounded(t) for t in targets)))
    finally:
        if own:
            await client.aclose()


def errors(snapshots: Sequence[PodSnapshot]) -> list[PodSnapshot]:
    return [s for s in snapshots if not s.ok]
