"""Engine-side routing figures: hit rate, load spread (pure)."""
from __future__ import annotations

import pytest

from v41flash.metrics.parse import EngineMetrics, Histogram, parse_metrics
from v41flash_bench.routing.engine_stats import EngineUsage, engine_usage, observe, spread


def _engine(hits: float, queries: float, success: float, e2e_sum: float) -> dict[str, EngineMetrics]:
    h = Histogram(buckets=((1.0, success), (float("inf"), success)), count=success, sum=e2e_sum)
    return {"0": EngineMetrics(
        counters={"vllm:prefix_cache_hits": hits, "vllm:prefix_cache_queries": queries,
                  "vllm:request_success": success},
        histograms={"vllm:e2e_request_latency_seconds": h})}


def test_spread():
    assert spread([1.0, 1.0, 2.0]) == pytest.approx(1.5)
    assert spread([3.0, 3.0]) == 1.0
    assert spread([]) is None
    assert spread([0.0, 0.0]) is None


def test_engine_usage_is_the_increase_and_littles_law_running():
    u = engine_usage("e", _engine(100, 400, 10, 5.0), _engine(700, 1400, 30, 25.0), period_s=10.0)
    assert (u.prompt_tokens, u.hit_tokens, u.requests) == (1000, 600, 20)
    assert u.uncached_tokens == 400
    assert u.mean_running == pytest.approx(2.0)  # 20 request-seconds over 10 s
    assert engine_usage("e", _engine(0, 0, 0, 0), _engine(1, 2, 1, 1), None).mean_running is None


def test_engine_restart_counts_the_new_value():
    u = engine_usage("e", _engine(500, 900, 9, 9.0), _engine(50, 100, 2, 1.0), period_s=1.0)
    assert (u.hit_tokens, u.prompt_tokens, u.requests, u.mean_running) == (50, 100, 2, 1.0)


def test_observe_token_weighted_hit_rate_and_spreads():
    usage = [EngineUsage("a", 1000, 900, 10, 3.0), EngineUsage("b", 3000, 1500, 30, 1.0)]
    o = observe(usage)
    assert o.hit_rate == pytest.approx(2400 / 4000)  # tokens, not per-engine averages (0.9, 0.5)
    assert o.running_spread == pytest.approx(3.0 / 2.0)
    assert o.uncached_spread == pytest.approx(1500 / 800)
    assert o.request_spread == pytest.approx(30 / 20)
    assert o.engines == 2


def test_observe_without_traffic_or_period():
    o = observe([EngineUsage("a", 0, 0, 0, None), EngineUsage("b", 0, 0, 0, 0.0)])
    assert o.hit_rate is None and o.running_spread is None and o.uncached_spread is None


SIM_METRICS = """\
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits{model_name="m"} 3040
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries{model_name="m"} 4716
# TYPE vllm:request_success_total counter
vllm:request_success_total{finish_reason="stop",model_name="m"} 16
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{model_name="m",le="1"} 16
vllm:e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 16
vllm:e2e_request_latency_seconds_sum{model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 16
"""


def test_reads_llm_d_inference_sim_exposition():
    # the simulator exposes the prefix-cache counters without the _total suffix real vLLM uses
    u = engine_usage("e", {}, parse_metrics(SIM_METRICS), period_s=2.0)
    assert (u.hit_tokens, u.prompt_tokens, u.requests, u.mean_running) == (3040, 4716, 16, 2.0)
