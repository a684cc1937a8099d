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
from v41flash.render.ports import ENGINE_PORT as VLLM_METRICS_PORT  # vLLM serves /metrics on its API port
from v41flash.render.labels import ROUTER
from v41flash.render.ports import METRICS_PORT as ROUTER_METRICS_PORT
from v41flash.render.ports import ROUTER_PORT


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


# A vLLM page with 16 DP ranks is a few hundred KiB: 8 MiB is generous and bounds what one pod can make the
# operator hold (the chart limits it to 512 Mi; several scrapes run at once).
DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_TIMEOUT_S = 5.0  # the whole scrape of one target: connect, headers and body together


class TooLarge(Exception):
    pass


async def _read_capped(client: httpx.AsyncClient, url: str, max_bytes: int) -> str:
    async with client.stream("GET", url) as resp:
        resp.raise_for_status()
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(f"Content-Length {declared} over {max_bytes} bytes")
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"body over {max_bytes} bytes")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


async def scrape_one(
    client: httpx.AsyncClient, target: ScrapeTarget, clock: Callable[[], float] = time.time, *,
    max_bytes: int = DEFAULT_MAX_BYTES, deadline_s: float = DEFAULT_TIMEOUT_S,
) -> PodSnapshot:
    """One target, never more than max_bytes read nor deadline_s spent (a dripping pod cannot hold it:
    httpx's timeouts are per read, this one is for the whole scrape)."""
    try:
        text = await asyncio.wait_for(_read_capped(client, target.url, max_bytes), deadline_s)
        engines = parse_metrics(text)
    except TooLarge as exc:
        return PodSnapshot(target.pod, target.role, clock(), error=f"{target.url}: {exc}")
    except asyncio.TimeoutError:
        return PodSnapshot(target.pod, target.role, clock(), error=f"timeout: no whole page from {target.url} within {deadline_s:g} s")
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
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
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
            return await scrape_one(client, t, clock, max_bytes=max_bytes, deadline_s=timeout_s)

    try:
        return list(await asyncio.gather(*(bounded(t) for t in targets)))
    finally:
        if own:
            await client.aclose()


def errors(snapshots: Sequence[PodSnapshot]) -> list[PodSnapshot]:
    return [s for s in snapshots if not s.ok]
