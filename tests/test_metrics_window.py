"""Parsing vLLM /metrics pages and turning snapshots into window figures (exact values)."""
from __future__ import annotations

import math

import pytest

from v41flash.metrics.parse import Histogram, parse_metrics
from v41flash.metrics.window import PodSnapshot, SnapshotHistory, compute_window, role_windows
from vllm_exposition import page


def snap(pod: str, t: float, engines: dict[str, dict], role: str = "prefill") -> PodSnapshot:
    return PodSnapshot(pod, role, t, parse_metrics(page(engines)))


# ------------------------------------------------------------------ parse / histogram
def test_parser_strips_total_and_sums_other_labels():
    engines = parse_metrics(page({"0": {"prompt_tokens": 120, "running": 2}, "1": {"prompt_tokens": 30}}))
    assert sorted(engines) == ["0", "1"]
    assert engines["0"].counters["vllm:prompt_tokens"] == 120
    assert engines["1"].counters["vllm:prompt_tokens"] == 30
    assert engines["0"].gauges["vllm:num_requests_running"] == 2
    assert not any(name.endswith("_created") for e in engines.values() for name in e.gauges)


def test_series_differing_in_other_labels_are_summed_per_engine():
    text = """# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 1.0
"""
    engines = parse_metrics(text)
    assert engines["0"].counters["vllm:request_success"] == 10
    assert engines["1"].counters["vllm:request_success"] == 1


def test_histogram_quantile_interpolates_like_promql():
    h = Histogram(((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)), 40.0, 12.0)
    assert h.quantile(0.5) == pytest.approx(0.3)
    assert h.quantile(0.9) == pytest.approx(0.8)
    assert h.quantile(0.25) == pytest.approx(0.1 + 0.4 * 0.0 / 20 + 0.4 * (10 - 10) / 20)
    assert h.mean == pytest.approx(0.3)
    # rank in the +Inf bucket: the highest finite bound
    tail = Histogram(((0.1, 1.0), (1.0, 2.0), (math.inf, 10.0)), 10.0, 50.0)
    assert tail.quantile(0.95) == 1.0
    assert Histogram((), 0.0, 0.0).quantile(0.9) is None


def test_histogram_delta_and_reset():
    a = Histogram(((1.0, 5.0), (math.inf, 8.0)), 8.0, 10.0)
    b = Histogram(((1.0, 9.0), (math.inf, 14.0)), 14.0, 19.0)
    d = b.minus(a)
    assert d.buckets == ((1.0, 4.0), (math.inf, 6.0)) and d.count == 6.0 and d.sum == 9.0
    restarted = Histogram(((1.0, 1.0), (math.inf, 2.0)), 2.0, 3.0)
    assert restarted.minus(b) == restarted  # like increase(): the new process's whole count


# ------------------------------------------------------------------ windows
def _engine(requests: float, ttft_counts, e2e_counts, **kw) -> dict:
    return {
        "ttft": (ttft_counts, kw.pop("ttft_sum", 0.0)),
        "e2e": (e2e_counts, kw.pop("e2e_sum", 0.0)),
        "success_stop": requests,
        **kw,
    }


def test_window_figures_from_two_pods():
    t0, t1 = 1000.0, 1060.0
    start = {
        "p-a": [snap("p-a", t0, {"0": _engine(10, [0, 5, 10, 10, 10, 10], [0, 10, 10, 10, 10, 10], prompt_tokens=1000, queries=1000, hits=500, gen_tokens=100, prompt_len=([0, 5, 10, 10, 10], 5000), gen_len=([0, 10, 10, 10, 10], 100))})],
        "p-b": [snap("p-b", t0, {"0": _engine(0, [0] * 6, [0] * 6)})],
    }
    end = {
        # p-a: +60 requests: TTFT buckets deltas 0.1:20, 0.5:50, 1.0:60 ; e2e all ≤ 5 s
        "p-a": [snap("p-a", t1, {"0": _engine(70, [20, 55, 70, 70, 70, 70], [0, 70, 70, 70, 70, 70], ttft_sum=20.0, e2e_sum=150.0, prompt_tokens=61000, queries=61000, hits=45500, gen_tokens=6100, running=6, waiting=1, kv=0.5, prompt_len=([0, 5, 70, 70, 70], 605000), gen_len=([0, 70, 70, 70, 70], 6100))})],
        # p-b: +60 requests all in the 0.5..1.0 bucket, e2e 5..10 s
        "p-b": [snap("p-b", t1, {"0": _engine(60, [0, 0, 60, 60, 60, 60], [0, 0, 60, 60, 60, 60], running=2, kv=0.3, prompt_tokens=60000, queries=60000, hits=0)})],
    }
    series = {p: start[p] + end[p] for p in start}
    w = compute_window(series, t1, 60.0, expected_pods=["p-a", "p-b"], ttft_percentile=0.9)
    assert w.complete and w.pods_observed == 2 and w.pods_expected == 2
    assert w.requests == 120
    assert w.request_rate == pytest.approx(2.0)
    # merged TTFT deltas: 0.1:20, 0.5:50, 1.0:120 ; p90 rank 108 → 0.5 + 0.5 * (108-50)/70
    assert w.ttft_s == pytest.approx(0.5 + 0.5 * 58 / 70)
    # merged e2e deltas: 1:0, 5:60, 10:120 ; p95 rank 114 → 5 + 5 * 54/60
    assert w.e2e_p95_s == pytest.approx(5 + 5 * 54 / 60)
    assert w.prompt_tokens_rate == pytest.approx((60000 + 60000) / 60)
    assert w.generation_tokens_rate == pytest.approx(6000 / 60)
    # token-weighted hit rate: (45000 + 0) / (60000 + 60000)
    assert w.prefix_cache_hit_rate == pytest.approx(45000 / 120000)
    assert w.mean_input_tokens == pytest.approx(600000 / 60)
    assert w.running == 8 and w.waiting == 1
    assert w.kv_cache_usage == pytest.approx(0.4)
    assert w.load_spread == pytest.approx(6 / 4)


def test_counter_reset_is_counted_like_increase_and_flags_partial():
    t0, t1 = 0.0, 60.0
    before = snap("p", t0, {"0": _engine(500, [500] * 6, [500] * 6, prompt_tokens=900000)})
    after = snap("p", t1, {"0": _engine(12, [12] * 6, [12] * 6, prompt_tokens=24000)})  # restarted
    w = compute_window({"p": [before, after]}, t1, 60.0, expected_pods=["p"])
    assert w.requests == 12
    assert w.prompt_tokens_rate == pytest.approx(24000 / 60)
    assert w.partial_pods == ("p",) and not w.complete
    assert any("restarted" in n for n in w.notes)


def test_missing_pod_is_reported_not_fatal():
    t0, t1 = 0.0, 60.0
    ok = [snap("a", t0, {"0": _engine(0, [0] * 6, [0] * 6)}), snap("a", t1, {"0": _engine(30, [30] * 6, [30] * 6)})]
    failed = [PodSnapshot("b", "prefill", t1, error="timeout scraping http://10.0.0.2:8000/metrics")]
    w = compute_window({"a": ok, "b": failed}, t1, 60.0, expected_pods=["a", "b"])
    assert w.missing_pods == ("b",)
    assert w.pods_observed == 1 and w.pods_expected == 2 and not w.complete
    assert w.requests == 30
    assert any("timeout" in n for n in w.notes)


def test_pod_appeared_mid_window_is_partial_and_uses_its_first_snapshot():
    a0 = snap("a", 0.0, {"0": _engine(0, [0] * 6, [0] * 6)})
    a1 = snap("a", 60.0, {"0": _engine(10, [10] * 6, [10] * 6)})
    n0 = snap("new", 30.0, {"0": _engine(100, [100] * 6, [100] * 6)})  # first seen mid-window
    n1 = snap("new", 60.0, {"0": _engine(104, [104] * 6, [104] * 6)})
    w = compute_window({"a": [a0, a1], "new": [n0, n1]}, 60.0, 60.0, expected_pods=["a", "new"], tolerance_s=5)
    assert w.partial_pods == ("new",)
    assert w.requests == 14  # 10 from a, 4 from new (not its whole lifetime)
    assert w.request_rate == pytest.approx(10 / 60 + 4 / 30)


def test_vanished_pod_is_partial():
    a = [snap("a", 0.0, {"0": _engine(0, [0] * 6, [0] * 6)}), snap("a", 60.0, {"0": _engine(5, [5] * 6, [5] * 6)})]
    gone = [snap("gone", 0.0, {"0": _engine(0, [0] * 6, [0] * 6)}), snap("gone", 30.0, {"0": _engine(3, [3] * 6, [3] * 6)})]
    w = compute_window({"a": a, "gone": gone}, 60.0, 60.0, expected_pods=["a"], tolerance_s=5)
    assert w.partial_pods == ("gone",) and w.missing_pods == ()
    assert w.requests == 5


def test_history_cuts_windows_per_role_and_prunes():
    h = SnapshotHistory(retention_s=120)
    for t in (0.0, 30.0, 60.0, 90.0, 120.0, 150.0):
        k = t / 30
        h.add([
            snap("p", t, {"0": _engine(10 * k, [10 * k] * 6, [10 * k] * 6)}, role="prefill"),
            snap("d", t, {"0": _engine(2 * k, [2 * k] * 6, [2 * k] * 6), "1": _engine(k, [k] * 6, [k] * 6)}, role="decode"),
        ])
    assert [s.time for s in h.snapshots("p")] == [30.0, 60.0, 90.0, 120.0, 150.0]
    ws = role_windows(h, 150.0, 60.0, {"prefill": ["p"], "decode": ["d"]})
    assert ws["prefill"].requests == 20 and ws["prefill"].complete
    assert ws["decode"].requests == 6 and ws["decode"].engines == 2
    assert ws["overall"].requests == 26 and ws["overall"].pods_expected == 2


def test_router_window_gives_user_facing_latency():
    from v41flash.metrics.window import compute_router_window

    def router_page(count_le, total, errors):
        les = ("1.0", "10.0", "60.0", "+Inf")
        lines = ["# HELP vllm_router_pd_request_duration_seconds PD request duration",
                 "# TYPE vllm_router_pd_request_duration_seconds histogram"]
        lines += [f'vllm_router_pd_request_duration_seconds_bucket{{le="{le}"}} {c}' for le, c in zip(les, count_le)]
        lines += [f"vllm_router_pd_request_duration_seconds_count {count_le[-1]}", f"vllm_router_pd_request_duration_seconds_sum {total}",
                  "# TYPE vllm_router_pd_errors_total counter", f"vllm_router_pd_errors_total {errors}"]
        return "\n".join(lines) + "\n"

    s0 = PodSnapshot("router-0", "router", 0.0, parse_metrics(router_page([10, 50, 60, 60], 300.0, 2)))
    s1 = PodSnapshot("router-0", "router", 60.0, parse_metrics(router_page([10, 130, 160, 160], 1500.0, 5)))
    r = compute_router_window({"router-0": [s0, s1]}, 60.0, 60.0)
    # deltas: ≤1: 0, ≤10: 80, ≤60: 100 ; p95 rank 95 → 10 + 50 * 15/20
    assert r.requests == 100 and r.request_rate == pytest.approx(100 / 60)
    assert r.e2e_p95_s == pytest.approx(10 + 50 * 15 / 20)
    assert r.e2e_mean_s == pytest.approx(12.0) and r.errors == 3


def test_router_window_reads_the_session_proxys_leading_signals():
    from v41flash.metrics.parse import parse_metrics
    from v41flash.metrics.window import PodSnapshot, compute_router_window

    def page(arrivals, new, tokens):
        return parse_metrics(
            "# TYPE v41flash_session_proxy_arrivals_total counter\n"
            f"v41flash_session_proxy_arrivals_total {arrivals}\n"
            "# TYPE v41flash_session_proxy_new_sessions_total counter\n"
            f"v41flash_session_proxy_new_sessions_total {new}\n"
            "# TYPE v41flash_session_proxy_prompt_tokens_estimated_total counter\n"
            f"v41flash_session_proxy_prompt_tokens_estimated_total {tokens}\n")

    snaps = {"r-0/proxy": [PodSnapshot("r-0/proxy", "router", 0.0, page(10, 2, 1e6)),
                           PodSnapshot("r-0/proxy", "router", 60.0, page(130, 8, 7e6))]}
    fig = compute_router_window(snaps, 60.0, 60.0)
    assert fig.arrival_rate == pytest.approx(2.0) and fig.new_session_rate == pytest.approx(0.1)
    assert fig.prompt_tokens_arriving_rate == pytest.approx(1e5)


def test_window_of_a_subset_of_pods_is_that_subset_only():
    """A rollout slot's own figures: the candidate's pods, not the serving revision's beside them."""
    t0, t1 = 1000.0, 1060.0
    h = SnapshotHistory()
    h.add([snap("cand", t0, {"0": _engine(0, [0] * 6, [0] * 6)}), snap("serv", t0, {"0": _engine(0, [0] * 6, [0] * 6)})])
    h.add([snap("cand", t1, {"0": _engine(10, [0, 0, 10, 10, 10, 10], [0, 0, 10, 10, 10, 10])}),
           snap("serv", t1, {"0": _engine(50, [50] * 6, [50] * 6)})])
    w = h.window_of(["cand"], "prefill", t1, 60.0)
    assert w.requests == 10 and w.pods_observed == 1 and w.ttft_s > 0.5
    assert h.window("prefill", t1, 60.0).requests == 60
    missing = h.window_of(["cand", "gone"], "prefill", t1, 60.0)
    assert missing.missing_pods == ("gone",) and not missing.complete
