"""The Prometheus metrics source without a server: query building, and parsing of answers recorded from the
real Prometheus (tests/fixtures/prometheus/, written by `V41F_RECORD_PROM=1 pytest tests/test_metrics_promapi_real.py`)
replayed by a loopback fake of its HTTP API (prom_replay.py)."""
from __future__ import annotations

import asyncio

import pytest

from prom_replay import ANSWERS, END, META, WINDOW_S, Replay
from v41flash.metrics import promapi
from v41flash.metrics.promapi import PromSource, prometheus_windows, role_figures, router_figures, selector


def test_selector_names_exactly_our_pods_in_our_namespace():
    src = PromSource("http://p:9090", "ai", match_labels=(("cluster", 'we"st'),))
    assert selector(src, ["b.x-1", "a"]) == r'namespace="ai",pod=~"a|b\\.x\\-1",cluster="we\"st"'
    src = PromSource("http://p:9090", "ai", pod_label="kubernetes_pod_name", namespace_label="kubernetes_namespace")
    assert selector(src, ["a"]).startswith('kubernetes_namespace="ai",kubernetes_pod_name=~"a"')
    with pytest.raises(ValueError):
        selector(src, [])


def test_queries_cover_the_window_and_the_percentile():
    q = promapi._queries('pod=~"a"', "60s", 0.95, "pod")
    assert q["ttft"] == 'histogram_quantile(0.95, sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{pod=~"a"}[60s])))'
    assert q["request_rate"] == 'sum(rate(vllm:e2e_request_latency_seconds_count{pod=~"a"}[60s]))'
    assert q["pod_samples"].startswith("sum by (pod) (count_over_time(")
    assert promapi._window(59.6) == "60s" and promapi._window(0.2) == "1s"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_recorded_answers_give_the_pages_known_rates(role):
    pods = META["expected"][role]
    src = PromSource("http://p:9090", "ai")
    w = role_figures(src, ANSWERS[role], END, WINDOW_S, pods, 0.9)
    rate = META["rates"][pods[0]]
    assert w.error is None and w.complete and w.pods_observed == 1
    assert w.request_rate == pytest.approx(rate, rel=0.15)
    assert w.prompt_tokens_rate == pytest.approx(1000 * rate, rel=0.15)
    assert w.ttft_mean_s == pytest.approx(0.6) and w.e2e_mean_s == pytest.approx(7.0)
    assert w.prefix_cache_hit_rate == pytest.approx(0.4) and w.mean_input_tokens == pytest.approx(1000)
    assert 0.5 < w.ttft_s <= 1.0 + 1e-9 and 5.0 < w.e2e_p95_s <= 10.0 + 1e-9
    assert w.itl_mean_s is None  # NaN in the answer (no inter-token samples): not observable, not zero
    assert w.pod_running == ((pods[0], 4 * rate),) and w.running == 4 * rate and w.engines == 1
    assert END - 2 < w.end <= END


def test_recorded_router_answers():
    rt = router_figures(ANSWERS["router"], END, WINDOW_S, META["router_pods"])
    assert rt.pods_observed == 1 and rt.request_rate == pytest.approx(4.0, rel=0.2)
    assert 5.0 < rt.e2e_p95_s <= 10.0 and rt.e2e_mean_s == pytest.approx(7.5)
    assert rt.new_session_rate == pytest.approx(2.0, rel=0.2) and rt.arrival_rate is None


def test_missing_partial_and_restarted_pods_from_per_pod_answers():
    src = PromSource("http://p:9090", "ai")
    a = dict(ANSWERS["decode"])
    sample = a["pod_samples"][0]
    t = sample["value"][0]
    a["pod_samples"] = [{"metric": {"pod": p}, "value": [t, n]} for p, n in (("p-b", "9"), ("p-new", "2"), ("p-r", "9"))]
    a["pod_resets"] = [{"metric": {"pod": p}, "value": [t, n]} for p, n in (("p-b", "0"), ("p-r", "1"))]
    w = role_figures(src, a, END, WINDOW_S, ["p-b", "p-new", "p-r", "p-gone"], 0.9)
    assert w.missing_pods == ("p-gone",) and w.partial_pods == ("p-new", "p-r") and w.pods_observed == 3
    assert not w.complete and any("p-new: appeared or vanished" in n for n in w.notes)
    # series of pods nobody expects (not ours) do not count as observed
    w = role_figures(src, a, END, WINDOW_S, ["p-other"], 0.9)
    assert w.pods_observed == 0 and w.error.startswith("spec.autoscaling.metrics.prometheus: Prometheus at http://p:9090 has no "
                                                        "vllm:num_requests_running")


def test_stale_newest_sample_ends_the_window_early():
    a = dict(ANSWERS["decode"])
    t = a["last_sample"][0]["value"][0]
    a["last_sample"] = [{"metric": {}, "value": [t, str(END - 300)]}]
    w = role_figures(PromSource("http://p:9090", "ai"), a, END, WINDOW_S, META["expected"]["decode"], 0.9)
    assert w.end == END - 300  # the planner's data_status reads this as stale


def test_windows_over_http_post_at_the_window_end():
    fake = Replay()
    try:
        windows, rt = asyncio.run(prometheus_windows(PromSource(fake.url, "ai"), END, WINDOW_S, META["expected"],
                                                     META["router_pods"]))
    finally:
        fake.close()
    assert {w.error for w in windows.values()} == {None}
    assert windows["overall"].pods_observed == 2 and windows["overall"].running == 16.0
    assert windows["prefill"].request_rate == pytest.approx(3.0, rel=0.15) and rt.requests > 0
    assert {s["time"] for s in fake.seen} == {f"{END:.3f}"}
    # one instant query per group of pods (prefill, decode, overall) and one for the router, not one per figure
    assert len(fake.seen) == 4


def test_a_combined_answer_splits_back_per_figure_and_a_figure_without_samples_is_empty():
    queries = {"requests": 'sum(x{pod=~"a"})', "pod_running": 'sum by (pod) (y{pod=~"a"})', "kv": 'avg(z{pod=~"a"})'}
    q = promapi.combined(queries)
    assert q.count(" or ") == 2 and q.count(f'"{promapi.FIGURE_LABEL}"') == 3
    answer = [{"metric": {promapi.FIGURE_LABEL: "requests"}, "value": [1.0, "3"]},
              {"metric": {promapi.FIGURE_LABEL: "pod_running", "pod": "a"}, "value": [1.0, "4"]},
              {"metric": {promapi.FIGURE_LABEL: "pod_running", "pod": "b"}, "value": [1.0, "5"]},
              {"metric": {promapi.FIGURE_LABEL: "other"}, "value": [1.0, "9"]},  # not asked for: dropped
              {"metric": {}, "value": [1.0, "9"]}]
    out = promapi.split(answer, queries)
    assert out == {"requests": [{"metric": {}, "value": [1.0, "3"]}],
                   "pod_running": [{"metric": {"pod": "a"}, "value": [1.0, "4"]},
                                   {"metric": {"pod": "b"}, "value": [1.0, "5"]}],
                   "kv": []}


def test_a_query_error_and_an_unreachable_server_are_window_errors_naming_them():
    fake = Replay("error")
    try:
        windows, rt = asyncio.run(prometheus_windows(PromSource(fake.url, "ai"), END, WINDOW_S, META["expected"]))
    finally:
        fake.close()
    assert rt is None
    # the status and Prometheus' own error type, never the answer's text
    assert "HTTP 400 (bad_data)" in windows["decode"].error and "parse error" not in windows["decode"].error
    windows, _ = asyncio.run(prometheus_windows(PromSource("http://127.0.0.1:9", "ai", timeout_s=1), END, WINDOW_S,
                                                {"decode": ["p-b"]}))
    assert windows["decode"].error == ("spec.autoscaling.metrics.prometheus.url: Prometheus at http://127.0.0.1:9 "
                                       "unreachable: ConnectError")
    assert windows["decode"].missing_pods == ("p-b",) and not windows["decode"].complete


def test_a_role_without_ready_pods_sends_no_query():
    windows, rt = asyncio.run(prometheus_windows(PromSource("http://127.0.0.1:9", "ai"), END, WINDOW_S, {"decode": []}))
    assert windows["decode"].error is None and windows["decode"].pods_expected == 0 and rt is None


def _serve(body: bytes, content_type: str = "application/json", declared: bool = True):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if declared:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("body,declared,says", [
    (b"x" * (promapi.MAX_ANSWER_BYTES + 1), True, "answered too much: a declared answer over"),
    (b"x" * (promapi.MAX_ANSWER_BYTES + 1), False, "answered too much: answer over"),
    (b"<html>502 Bad Gateway</html>", True, "answered HTTP 200 with no JSON"),
    (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', True, "not a vector"),
])
def test_a_url_that_is_no_prometheus_is_an_error_window_and_its_size_is_capped(body, declared, says):
    srv = _serve(body, declared=declared)
    try:
        windows, _ = asyncio.run(prometheus_windows(PromSource(f"http://127.0.0.1:{srv.server_address[1]}", "ai"),
                                                    END, WINDOW_S, {"decode": ["p-b"]}))
    finally:
        srv.shutdown()
        srv.server_close()
    assert says in windows["decode"].error, windows["decode"].error


def test_error_kinds_read_the_phrase_after_the_url_not_the_servers_text():
    assert promapi.error_kind("Prometheus at http://p:9090 unreachable: ConnectError: refused") == "Unreachable"
    assert promapi.error_kind("Prometheus at http://p:9090 did not answer within 2 s") == "Unreachable"
    assert promapi.error_kind("Prometheus at http://p:9090 has no vllm:num_requests_running series ...") == "NoData"
    # the server's own words cannot pick the kind
    assert promapi.error_kind("Prometheus at http://p:9090 answered HTTP 422: it has no unreachable data") == "Error"
    field = "spec.autoscaling.metrics.prometheus.url: "
    assert promapi.error_kind(field + "Prometheus at http://p:9090 refused: it is loopback") == "Refused"
    assert promapi.error_kind(field + "Prometheus at http://p:9090 cannot be resolved (gaierror)") == "Unreachable"
    assert promapi.error_kind(field + "Prometheus at http://p:9090 answered HTTP 500 (internal): ...") == "Error"
