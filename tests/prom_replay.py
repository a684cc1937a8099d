"""A loopback fake of the Prometheus HTTP API that replays answers recorded from the real server
(tests/fixtures/prometheus/, recorded by `V41F_RECORD_PROM=1 pytest tests/test_metrics_promapi_real.py`).

Each instant query is answered with the recorded answer of the same PromQL; with ``shift`` the sample times
(and the newest-sample figure) move to the query's time, so a recording from the past reads as fresh data
(``age_s`` makes it that much older: stale). ``mode``: "ok", "error" (the recorded HTTP 400 for every query),
"empty" (every result empty: Prometheus has no such series)."""
from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

from v41flash.metrics import promapi
from v41flash.metrics.promapi import PromSource, selector

FIXTURES = Path(__file__).parent / "fixtures" / "prometheus"
RECORDED = json.loads((FIXTURES / "window.json").read_text())
META, ANSWERS = RECORDED["meta"], RECORDED["answers"]
BAD_QUERY = json.loads((FIXTURES / "bad_query.json").read_text())
END, WINDOW_S = META["end"], META["window_s"]
NAMESPACE = "ai"


def _answer(queries: dict[str, str], recorded: dict[str, list]) -> tuple[str, list]:
    """The combined query of one group and the recorded per-figure results as its answer (figure-labelled)."""
    return promapi.combined(queries), [{**s, "metric": {**s["metric"], promapi.FIGURE_LABEL: key}}
                                       for key in queries for s in recorded[key]]


def recorded_queries(namespace: str = NAMESPACE) -> dict[str, list]:
    """PromQL → recorded result, for the recorded pods (prefill, decode, overall, router)."""
    src = PromSource("http://x", namespace)
    w = promapi._window(WINDOW_S)
    groups = {**META["expected"], "overall": sorted(p for ps in META["expected"].values() for p in ps)}
    out = dict(_answer(promapi._queries(selector(src, pods), w, 0.9, "pod"), ANSWERS[role])
               for role, pods in groups.items())
    out.update([_answer(promapi._router_queries(selector(src, META["router_pods"]), w, "pod"), ANSWERS["router"])])
    return out


class Replay:
    def __init__(self, mode: str = "ok", shift: bool = False, age_s: float = 0.0, namespace: str = NAMESPACE):
        self.mode, self.shift, self.age_s = mode, shift, age_s
        by_query = recorded_queries(namespace)
        self.seen: list[dict] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
                replay.seen.append(form)
                q, at = form["query"], float(form["time"])
                if replay.mode == "error" or q not in by_query:
                    code, body = BAD_QUERY["status_code"], BAD_QUERY["body"]
                else:
                    result = [] if replay.mode == "empty" else copy.deepcopy(by_query[q])
                    if replay.shift:
                        for s in result:
                            s["value"][0] = at
                            if s["metric"].get(promapi.FIGURE_LABEL) == "last_sample":  # the newest sample: as old
                                # as it was when recorded (+ age_s)
                                s["value"][1] = str(at - (END - float(s["value"][1])) - replay.age_s)
                    code, body = 200, {"status": "success", "data": {"resultType": "vector", "result": result}}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()
