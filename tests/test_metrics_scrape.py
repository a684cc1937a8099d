"""Scraping over loopback: good pods parse, a bad pod is reported missing, concurrency is bounded."""
from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from v41flash.metrics.scrape import ScrapeTarget, router_target, scrape, vllm_target
from v41flash.metrics.window import compute_window
from v41flash_bench.procs import free_port
from vllm_exposition import page

PAGE = page({"0": {"running": 3, "prompt_tokens": 500, "success_stop": 4, "e2e": ([0, 4, 4, 4, 4, 4], 8.0)},
             "1": {"running": 1, "prompt_tokens": 100}})


class _Handler(BaseHTTPRequestHandler):
    in_flight = 0
    max_in_flight = 0
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        if self.path.startswith("/slow"):
            time.sleep(0.15)
        with cls.lock:  # leave before answering: the client may send its next request once it has the body
            cls.in_flight -= 1
        if self.path.startswith("/hang"):
            time.sleep(2.0)
        if self.path.startswith("/error"):
            self.send_response(503)
            self.end_headers()
            return
        body = b"this is { not prometheus\n" if self.path.startswith("/garbage") else PAGE.encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout case)
            pass

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    _Handler.max_in_flight = 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_one_bad_pod_never_fails_the_scrape(server):
    targets = [
        ScrapeTarget("good", "decode", f"{server}/metrics"),
        ScrapeTarget("err", "decode", f"{server}/error"),
        ScrapeTarget("hang", "decode", f"{server}/hang"),
        ScrapeTarget("garbage", "decode", f"{server}/garbage"),
        ScrapeTarget("refused", "decode", f"http://127.0.0.1:{free_port()}/metrics"),
    ]
    snaps = asyncio.run(scrape(targets, timeout_s=0.5))
    by = {s.pod: s for s in snaps}
    assert [s.pod for s in snaps] == [t.pod for t in targets]
    assert by["good"].ok and by["good"].engines["0"].gauges["vllm:num_requests_running"] == 3
    assert by["good"].engines["1"].counters["vllm:prompt_tokens"] == 100
    assert "HTTP 503" in by["err"].error
    assert "timeout" in by["hang"].error
    assert "unparsable" in by["garbage"].error
    assert by["refused"].error and "ConnectError" in by["refused"].error
    # the window reports the failed pods as missing and still uses the good one
    series = {s.pod: [s] for s in snaps}
    w = compute_window(series, max(s.time for s in snaps), 60.0, expected_pods=list(series))
    assert set(w.missing_pods) == {"err", "hang", "garbage", "refused"}
    assert w.pods_observed == 1 and w.running == 4


def test_concurrency_is_bounded(server):
    targets = [ScrapeTarget(f"p{i}", "prefill", f"{server}/slow") for i in range(9)]
    snaps = asyncio.run(scrape(targets, concurrency=3, timeout_s=5))
    assert all(s.ok for s in snaps)
    assert 1 <= _Handler.max_in_flight <= 3


def test_target_urls():
    assert vllm_target("p", "prefill", "10.1.2.3").url == "http://10.1.2.3:8000/metrics"
    assert vllm_target("p", "prefill", "fd00::5").url == "http://[fd00::5]:8000/metrics"
    assert router_target("r", "10.1.2.4").url == "http://10.1.2.4:29000/metrics"


# --- a hostile /metrics page cannot flood or hold the scraper (issue 12) ------------------------------

class _Hostile(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if self.path.startswith("/lying"):
            self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        try:
            if self.path.startswith("/drip"):
                for _ in range(40):  # one line every 0.1 s: each read is quick, the page never ends in time
                    self.wfile.write(b"# HELP x y\n")
                    self.wfile.flush()
                    time.sleep(0.1)
            elif self.path.startswith("/flood") or self.path.startswith("/lying"):
                line = b"vllm:num_requests_running{engine=\"0\"} 1\n" * 1024
                for _ in range(4096):  # ~160 MiB if read whole
                    self.wfile.write(line)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


@pytest.fixture()
def hostile():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_flooding_and_dripping_pages_are_cut(hostile):
    targets = [ScrapeTarget("flood", "decode", hostile + "/flood"), ScrapeTarget("drip", "decode", hostile + "/drip"),
               ScrapeTarget("lying", "decode", hostile + "/lying")]
    t0 = time.monotonic()
    flood, drip, lying = asyncio.run(scrape(targets, timeout_s=1.0, max_bytes=1 << 20))
    assert time.monotonic() - t0 < 3.0  # the drip would take 4 s; the deadline is for the whole scrape
    assert not flood.ok and "over 1048576 bytes" in flood.error
    assert not drip.ok and "within 1 s" in drip.error
    assert not lying.ok and "Content-Length" in lying.error
