#!/usr/bin/env python3
"""A hostile engine for the e2e cluster: answers health and serving paths like a vLLM pod, but its
`/metrics` floods or drips. The supervisor (e2e/supervisor.py) runs it instead of llm-d-inference-sim for
an engine pod whose container sets V41F_HOSTILE_METRICS=flood|drip (spec.<role>.extraEnv; real vLLM
ignores it), bound to the pod's IP and port like the simulator.

* flood: a 256 MiB `/metrics` body (no Content-Length, close-delimited) of valid exposition lines,
  written as fast as the reader takes it;
* drip: one line per second, never ending.

Standalone (standard library only): `python e2e/hostile_metrics.py --host IP --port N --mode flood`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("flood", "drip")
FLOOD_BYTES = 256 << 20
DRIP_INTERVAL_S = 1.0
_LINE = b'vllm:num_requests_running{engine="0",model_name="hostile"} 0.0\n'
_CHUNK = _LINE * ((1 << 20) // len(_LINE))  # ~1 MiB of valid exposition lines


class Handler(BaseHTTPRequestHandler):
    mode = "flood"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # one line per request on stderr, like an access log
        sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

    def do_GET(self):  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            return self._metrics()
        if path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": "hostile", "object": "model"}]})
        return self._json({})  # /health, /ready, /version, ...: healthy, so the pod turns Ready

    def do_POST(self):  # noqa: N802
        self._json({"error": "a hostile engine serves no requests"}, status=503)

    def _json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _metrics(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Connection", "close")  # close-delimited body: no Content-Length to refuse up front
        self.end_headers()
        self.close_connection = True
        try:
            if self.mode == "flood":
                sent = 0
                while sent < FLOOD_BYTES:
                    self.wfile.write(_CHUNK)
                    sent += len(_CHUNK)
            else:
                n = 0
                while True:
                    self.wfile.write(f"# drip {n}\n".encode())
                    self.wfile.flush()
                    n += 1
                    time.sleep(DRIP_INTERVAL_S)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up: what it should do


def serve(host: str, port: int, mode: str) -> ThreadingHTTPServer:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    handler = type("HostileHandler", (Handler,), {"mode": mode})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True, choices=MODES)
    a = ap.parse_args()
    server = serve(a.host, a.port, a.mode)
    sys.stderr.write(f"hostile /metrics ({a.mode}) on {a.host}:{a.port}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
