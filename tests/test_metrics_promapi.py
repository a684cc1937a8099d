"""Window figures from a (fake, loopback) Prometheus HTTP API."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from v41flash.metrics.promapi import PrometheusError, PromSource, _queries, prometheus_window

SEL = 'namespace="ai",role="prefill"'
END = 1_764_000_000.0
ANSWERS = {
    "requests": 120.0, "ttft": 0.93, "ttft_mean": 0.4, "e2e_p95": 9.5, "e2e_mean": 4.0, "queue_p95": 0.2,
    "itl_mean": 0.011, "prompt_rate": 2000.0, "gen_rate": 100.0, "isl": 12000.0, "osl": 400.0, "osl_p95": 1100.0,
    "hit_rate": 0.375, "preemptions": 0.0, "running": 8.0, "waiting": 1.0, "kv": 0.4, "spread": 1.5, "engines": 2.0,
    "last_sample": END - 5,
}


def _server(answers: dict, pods: dict, resets: dict, fail: bool = False):
    by_query = {q: k for k, q in _queries(SEL, "60s", 0.9, "pod").items()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            qs = parse_qs(urlparse(self.path).query)
            key = by_query.get(qs["query"][0])
            assert float(qs["time"][0]) == END
            if fail or key is None:
                body, code = {"status": "error", "errorType": "bad_data", "error": "parse error"}, 400
            elif key == "pod_samples":
                body, code = {"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": {"pod": p}, "value": [END, str(n)]} for p, n in pods.items()]}}, 200
            elif key == "pod_resets":
                body, code = {"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": {"pod": p}, "value": [END, str(n)]} for p, n in resets.items()]}}, 200
            else:
                v = answers.get(key)
                result = [] if v is None else [{"metric": {}, "value": [END, "NaN" if v != v else str(v)]}]
                body, code = {"status": "success", "data": {"resultType": "vector", "result": result}}, 200
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture()
def prom():
    servers = []

    def start(*args, **kw):
        srv = _server(*args, **kw)
        servers.append(srv)
        return PromSource(f"http://127.0.0.1:{srv.server_address[1]}", SEL)

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_figures_map_from_promql_answers(prom):
    src = prom(ANSWERS, {"p-a": 4, "p-b": 4}, {})
    w = asyncio.run(prometheus_window(src, END, 60.0, ["p-a", "p-b"]))
    assert w.complete and w.pods_observed == 2
    assert w.requests == 120 and w.request_rate == 2.0
    assert (w.ttft_s, w.e2e_p95_s, w.itl_mean_s, w.prefix_cache_hit_rate) == (0.93, 9.5, 0.011, 0.375)
    assert (w.mean_input_tokens, w.mean_output_tokens, w.output_tokens_p95) == (12000.0, 400.0, 1100.0)
    assert (w.running, w.waiting, w.kv_cache_usage, w.load_spread, w.engines) == (8.0, 1.0, 0.4, 1.5, 2)
    assert w.end == END - 5


def test_missing_partial_and_restarted_pods_are_reported(prom):
    src = prom({**ANSWERS, "ttft": float("nan")}, {"p-a": 4, "p-new": 1, "p-r": 4}, {"p-r": 1, "p-a": 0})
    w = asyncio.run(prometheus_window(src, END, 60.0, ["p-a", "p-new", "p-r", "p-gone"]))
    assert w.missing_pods == ("p-gone",)
    assert w.partial_pods == ("p-new", "p-r")
    assert w.pods_observed == 3 and not w.complete
    assert w.ttft_s is None  # NaN (no requests finished) is "not observable", not zero


def test_no_series_at_all_reads_as_stale(prom):
    src = prom({}, {}, {})
    w = asyncio.run(prometheus_window(src, END, 60.0, ["p-a"]))
    assert w.end < END - 120 and w.missing_pods == ("p-a",) and w.requests == 0


def test_prometheus_errors_raise(prom):
    src = prom(ANSWERS, {}, {}, fail=True)
    with pytest.raises(PrometheusError, match="HTTP 400: parse error"):
        asyncio.run(prometheus_window(src, END, 60.0))
    with pytest.raises(PrometheusError, match="ConnectError"):
        asyncio.run(prometheus_window(PromSource("http://127.0.0.1:9", SEL, timeout_s=1), END, 60.0))
