"""The e2e harness's hostile engine (e2e/hostile_metrics.py) against the real scraper: healthy on the probe
paths, its flood cut at the byte cap and its drip at the whole-scrape deadline; and how the supervisor
picks it for an engine pod (V41F_HOSTILE_METRICS in the engine container's env)."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from e2e import engine_pods as sims
from e2e import supervisor as sup
from e2e.cluster_config import ROLE_LABEL
from e2e.hostile_metrics import serve
from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.metrics.scrape import DEFAULT_MAX_BYTES, ScrapeTarget, scrape_one
from v41flash.render import render


@pytest.fixture
def hostile():
    servers = []

    def start(mode):
        server = serve("127.0.0.1", 0, mode)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


async def _scrape(url, **kw):
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        return await scrape_one(client, ScrapeTarget("p", "decode", url + "/metrics"), **kw)


@pytest.mark.parametrize("mode", ["flood", "drip"])
def test_hostile_engine_answers_the_probe_and_model_paths(hostile, mode):
    base = hostile(mode)
    assert httpx.get(base + "/health", timeout=2).status_code == 200
    assert httpx.get(base + "/v1/models", timeout=2).json()["data"][0]["id"] == "hostile"


def test_flood_is_cut_at_the_byte_cap(hostile):
    base = hostile("flood")
    with httpx.stream("GET", base + "/metrics", timeout=5) as r:  # it really sends more than the cap
        assert "content-length" not in r.headers
        got = 0
        for chunk in r.iter_bytes():
            got += len(chunk)
            if got > 2 * DEFAULT_MAX_BYTES:
                break
    assert got > 2 * DEFAULT_MAX_BYTES
    snap = asyncio.run(_scrape(base))
    assert not snap.ok and f"body over {DEFAULT_MAX_BYTES} bytes" in snap.error


def test_drip_is_cut_at_the_whole_scrape_deadline(hostile):
    base = hostile("drip")
    t0 = time.monotonic()
    snap = asyncio.run(_scrape(base, deadline_s=1.5))
    assert 1.4 < time.monotonic() - t0 < 3.0
    assert not snap.ok and "no whole page" in snap.error and "within 1.5 s" in snap.error


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode 'slow'"):
        serve("127.0.0.1", 0, "slow")
    with pytest.raises(ValueError, match="V41F_HOSTILE_METRICS='slow'"):
        sims.hostile_command("127.1.1.5", 8000, "slow")


def _engine_pod(extra_env):
    obj = V41FlashDeployment.model_validate({
        "apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"prefill": {"enabled": False}, "decode": {"extraEnv": extra_env}}})
    dep = next(o for o in render(obj) if o["kind"] == "Deployment" and o["metadata"]["name"] == "t-decode")
    return {"metadata": {"name": "t-decode-1", "namespace": "ns", "uid": "u1", "labels": {ROLE_LABEL: "decode"}},
            "spec": dep["spec"]["template"]["spec"], "status": {"phase": "Running", "podIP": "127.1.1.5"}}


def _supervisor(tmp_path: Path) -> sup.Supervisor:
    s = sup.Supervisor.__new__(sup.Supervisor)  # no tools, no apiserver: desired() is pure for engine pods
    s.logs, s.extra, s.tools = tmp_path, {r: [] for r in sims.SIM_ROLE_LATENCY}, None
    return s


@pytest.mark.parametrize("mode", ["flood", "drip"])
def test_supervisor_runs_the_hostile_engine_on_the_pods_ip_and_port(tmp_path, mode):
    pod = _engine_pod([{"name": sims.HOSTILE_METRICS_ENV, "value": mode}])
    [child] = _supervisor(tmp_path).desired(pod)
    assert child.kind == "hostile" and (child.ip, child.port) == ("127.1.1.5", 8000)
    assert child.argv[1:] == [str(sims.HOSTILE_METRICS), "--host", "127.1.1.5", "--port", "8000", "--mode", mode]
    assert child.probe_url == "http://127.1.1.5:8000/health"


def test_supervisor_refuses_an_unknown_hostile_mode(tmp_path):
    pod = _engine_pod([{"name": sims.HOSTILE_METRICS_ENV, "value": "slow"}])
    with pytest.raises(ValueError, match="V41F_HOSTILE_METRICS"):
        _supervisor(tmp_path).desired(pod)
