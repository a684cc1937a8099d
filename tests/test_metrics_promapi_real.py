"""The Prometheus metrics source against a real Prometheus server (pinned, `bash e2e/build-tools.sh prometheus`)
scraping loopback pages shaped like vLLM 0.33.0's and vllm-router's, with counters that grow at known rates.

* The figures from PromQL equal the direct scraper's over the same pages and window (and the known rates).
* Series identity: a pod of another namespace with the same name, and a pod that exports a forged `pod` label,
  are not read as the deployment's pods.
* A stopped Prometheus gives every role a window with the error (the planner holds on it).
* V41F_RECORD_PROM=1 writes the server's raw answers to tests/fixtures/prometheus/ (the recorded answers
  test_metrics_promapi.py parses without a server).
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from e2e import prometheus as P
from prereq import require_tool, tool_cache, versions
from v41flash.metrics import promapi
from v41flash.metrics.promapi import PromSource, prometheus_windows, selector
from v41flash.metrics.scrape import ScrapeTarget, scrape
from v41flash.metrics.window import compute_window
from v41flash_bench.procs import LOOPBACK, stop_procs
from vllm_exposition import TTFT_LE, E2E_LE, page

FIXTURES = Path(__file__).parent / "fixtures" / "prometheus"
RECORD = os.environ.get("V41F_RECORD_PROM", "") == "1"
WINDOW_S = 10.0  # the smallest slo.windowSeconds: the recorded answers replay for a CR
RATE = {"p-a": 3.0, "p-b": 1.0}  # finished requests per second per pod
FOREIGN_RATE = 50.0


def prometheus_binary() -> Path:
    return require_tool(tool_cache() / f"prometheus-{versions()['PROMTOOL_VERSION']}" / "prometheus",
                        "bash e2e/build-tools.sh prometheus")


def engine_figures(rate: float, elapsed: float, running: float) -> dict:
    n = rate * elapsed  # cumulative requests: 50 % TTFT <= 0.5 s, 90 % <= 1 s, all <= 2.5 s; e2e all in (5, 10]
    return {"running": running, "waiting": 1.0, "kv": 0.25, "prompt_tokens": 1000 * n, "gen_tokens": 100 * n,
            "queries": 1000 * n, "hits": 400 * n,
            "ttft": ([0.0, 0.5 * n, 0.9 * n, n, n, n], 0.6 * n),
            "e2e": ([0.0, 0.0, n, n, n, n], 7.0 * n),
            "prompt_len": ([0.0, 0.0, n, n, n], 1000 * n), "gen_len": ([0.0, n, n, n, n], 100 * n)}


def router_page(rate: float, elapsed: float) -> str:
    n = rate * elapsed
    name = "vllm_router_pd_request_duration_seconds"
    lines = [f"# HELP {name} PD request duration", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{le}"}} {c}' for le, c in (("5.0", 0.0), ("10.0", n), ("+Inf", n))]
    lines += [f"{name}_count {n}", f"{name}_sum {7.5 * n}",
              "# HELP vllm_router_pd_errors_total errors", "# TYPE vllm_router_pd_errors_total counter",
              f"vllm_router_pd_errors_total {0.1 * n}",
              "# HELP v41flash_session_proxy_new_sessions_total new", "# TYPE v41flash_session_proxy_new_sessions_total counter",
              f"v41flash_session_proxy_new_sessions_total {0.5 * n}"]
    return "\n".join(lines) + "\n"


class Pages:
    """One loopback server per target; each page is a function of the seconds since start."""

    def __init__(self):
        self.t0 = time.time()
        self.servers = []

    def serve(self, make) -> str:
        t0 = self.t0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                data = make(time.time() - t0).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        srv = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.servers.append(srv)
        return f"{LOOPBACK}:{srv.server_address[1]}"

    def close(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    binary = prometheus_binary()
    pages = Pages()
    targets, direct = {}, {}
    for pod, rate in RATE.items():
        addr = pages.serve(lambda t, r=rate: page({"0": engine_figures(r, t, running=4 * r)}))
        targets[addr] = {"namespace": "ai", "pod": pod}
        direct[pod] = addr
    # same pod name in another namespace; a pod of ours by namespace that exports a forged pod label
    foreign = pages.serve(lambda t: page({"0": engine_figures(FOREIGN_RATE, t, running=99)}))
    targets[foreign] = {"namespace": "other", "pod": "p-a"}
    forged = pages.serve(lambda t: page({"0": engine_figures(FOREIGN_RATE, t, running=99)}).replace(
        'engine="0"', 'engine="0",pod="p-b"'))
    targets[forged] = {"namespace": "ai", "pod": "intruder"}
    router = pages.serve(lambda t: router_page(4.0, t))
    targets[router] = {"namespace": "ai", "pod": "r-0"}
    proc = P.start(binary, P.static_config(targets), tmp_path_factory.mktemp("prom"))
    try:
        P.wait_scraped(proc, ["p-a", "p-b", "intruder", "r-0"])
        yield proc, direct, pages
    finally:
        stop_procs([proc])
        pages.close()


def _record(src: PromSource, expected: dict, router_pods: list, end: float) -> None:
    """The raw answers of every query at `end`, keyed like promapi's query dicts."""
    w = promapi._window(WINDOW_S)

    async def run():
        sem = asyncio.Semaphore(4)
        async with httpx.AsyncClient(timeout=10) as c:
            groups = {**expected, "overall": sorted(p for pods in expected.values() for p in pods)}
            out = {role: await promapi._run(c, src, promapi._queries(selector(src, pods), w, 0.9, "pod"), end, sem)
                   for role, pods in groups.items()}
            out["router"] = await promapi._run(c, src, promapi._router_queries(selector(src, router_pods), w, "pod"),
                                               end, sem)
            bad = await c.post(f"{src.url}/api/v1/query", data={"query": "sum(rate(x[5m]", "time": f"{end:.3f}"})
            return out, {"status_code": bad.status_code, "body": bad.json()}

    answers, bad = asyncio.run(run())
    FIXTURES.mkdir(parents=True, exist_ok=True)
    meta = {"prometheus": versions()["PROMTOOL_VERSION"], "end": end, "window_s": WINDOW_S, "rates": RATE,
            "expected": expected, "router_pods": router_pods}
    (FIXTURES / "window.json").write_text(json.dumps({"meta": meta, "answers": answers}, indent=1, sort_keys=True) + "\n")
    (FIXTURES / "bad_query.json").write_text(json.dumps(bad, indent=1, sort_keys=True) + "\n")


def test_figures_equal_the_direct_scrapers_and_read_only_our_pods(setup):
    proc, direct, _ = setup
    src = PromSource(P.url(proc), "ai")
    expected = {"prefill": ["p-a"], "decode": ["p-b"]}
    # the direct scraper over the same pages, two snapshots a window apart; Prometheus at the second one
    targets = [ScrapeTarget(p, "prefill", f"http://{a}/metrics") for p, a in direct.items()]
    first = asyncio.run(scrape(targets))
    time.sleep(WINDOW_S)
    last = asyncio.run(scrape(targets))
    end = last[0].time
    windows, rt = asyncio.run(prometheus_windows(src, end, WINDOW_S, expected, ["r-0"]))
    if RECORD:
        _record(src, expected, ["r-0"], end)
    for role, pods in expected.items():
        w = windows[role]
        d = compute_window({p: [s for s in (*first, *last) if s.pod == p] for p in pods}, last[0].time, WINDOW_S, pods)
        assert w.error is None and w.complete and w.pods_observed == 1, (role, w)
        rate = RATE[pods[0]]
        assert w.request_rate == pytest.approx(rate, rel=0.15) and d.request_rate == pytest.approx(rate, rel=0.05)
        assert w.requests == pytest.approx(d.requests, rel=0.2)  # increase() extrapolates to the window's edges
        assert w.prompt_tokens_rate == pytest.approx(d.prompt_tokens_rate, rel=0.15)
        assert w.generation_tokens_rate == pytest.approx(d.generation_tokens_rate, rel=0.15)
        for f in ("ttft_s", "ttft_mean_s", "e2e_p95_s", "e2e_mean_s", "prefix_cache_hit_rate", "mean_input_tokens",
                  "mean_output_tokens"):
            assert getattr(w, f) == pytest.approx(getattr(d, f), rel=0.02), f
        assert (w.running, w.waiting, w.kv_cache_usage, w.engines) == (d.running, d.waiting, d.kv_cache_usage, d.engines)
        assert w.pod_running == d.pod_running == ((pods[0], 4 * rate),)
        assert end - w.end <= 2.0  # the newest sample: fresh
    overall = windows["overall"]
    assert overall.pods_observed == 2 and overall.request_rate == pytest.approx(4.0, rel=0.15)
    assert overall.running == 16.0  # not the foreign pods' 99s
    assert rt is not None and rt.pods_observed == 1 and rt.request_rate == pytest.approx(4.0, rel=0.2)
    assert 5.0 < rt.e2e_p95_s <= 10.0 and rt.errors == pytest.approx(0.4 * WINDOW_S, rel=0.2)
    assert rt.new_session_rate == pytest.approx(2.0, rel=0.2) and rt.arrival_rate is None


def test_a_pod_prometheus_does_not_scrape_is_missing_and_the_rest_still_read(setup):
    proc, _, _ = setup
    windows, _ = asyncio.run(prometheus_windows(PromSource(P.url(proc), "ai"), time.time(), WINDOW_S,
                                                {"decode": ["p-b", "p-gone"]}))
    w = windows["decode"]
    assert w.error is None and w.missing_pods == ("p-gone",) and w.pods_observed == 1 and not w.complete
    windows, _ = asyncio.run(prometheus_windows(PromSource(P.url(proc), "ai", match_labels=(("cluster", "east"),)),
                                                time.time(), WINDOW_S, {"decode": ["p-b"]}))
    assert "has no vllm:num_requests_running series" in windows["decode"].error


def test_stopped_prometheus_gives_every_role_the_error(setup, tmp_path):
    binary = prometheus_binary()
    proc = P.start(binary, P.static_config({}), tmp_path / "p2")
    src = PromSource(P.url(proc), "ai", timeout_s=2)
    stop_procs([proc])
    windows, rt = asyncio.run(prometheus_windows(src, time.time(), WINDOW_S, {"prefill": ["p-a"], "decode": ["p-b"]},
                                                 ["r-0"]))
    assert rt is None
    for role in ("prefill", "decode", "overall"):
        # the error names the field (issue 39), then what failed, never the answer's text
        assert windows[role].error == f"spec.autoscaling.metrics.prometheus.url: Prometheus at {src.url} unreachable: " \
                                      "ConnectError"
        assert not windows[role].complete


def test_the_e2e_kubernetes_sd_configuration_is_valid_for_promtool(tmp_path):
    """e2e/prometheus.py's pod discovery + relabelling (what the README tells users to attach) passes promtool."""
    import subprocess

    import yaml

    promtool = require_tool(tool_cache() / f"promtool-{versions()['PROMTOOL_VERSION']}" / "promtool",
                            "bash e2e/build-tools.sh promtool")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    cfg = P.kubernetes_sd_config(kubeconfig, "ai")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([str(promtool), "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"vllm", "vllm-router", "session-proxy"} and jobs["session-proxy"]["metrics_path"] == "/proxy/metrics"
    targets = {r.get("target_label") for j in jobs.values() for r in j["relabel_configs"]}
    assert {"namespace", "pod", "__address__"} <= targets
