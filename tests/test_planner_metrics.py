"""The planner's operator metrics reflect a decision and forget a deleted deployment."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from planner_sim import Cluster, run
from v41flash.metrics.window import PodSnapshot
from v41flash.controller.metrics import PlannerMetrics


def test_decision_and_scrape_metrics():
    reg = CollectorRegistry()
    m = PlannerMetrics(reg)
    decisions, _ = run([14.0], Cluster(prefill=2, decode=1))
    m.record_decision("ns", "flash", decisions[0])
    get = reg.get_sample_value
    assert get("v41flash_planner_decisions_total", {"namespace": "ns", "deployment": "flash", "role": "prefill", "action": "scale_up"}) == 1
    assert get("v41flash_planner_decisions_total", {"namespace": "ns", "deployment": "flash", "role": "decode", "action": "hold"}) == 1
    assert get("v41flash_planner_desired_replicas", {"namespace": "ns", "deployment": "flash", "role": "prefill"}) == 3
    obs = get("v41flash_planner_observed_latency_seconds", {"namespace": "ns", "deployment": "flash", "role": "prefill", "metric": "ttft"})
    assert obs == decisions[0].prefill.observed_ttft_s
    pred = get("v41flash_planner_predicted_latency_seconds", {"namespace": "ns", "deployment": "flash", "role": "decode", "metric": "e2e_p95"})
    assert pred == decisions[0].decode.predicted_e2e_p95_s
    m.record_scrape("ns", "flash", [PodSnapshot("p", "prefill", 0.0, error="timeout"), PodSnapshot("d", "decode", 0.0)], 0.2)
    assert get("v41flash_metrics_scrape_errors_total", {"namespace": "ns", "deployment": "flash", "role": "prefill"}) == 1
    assert get("v41flash_metrics_scrape_duration_seconds_count", {"namespace": "ns", "deployment": "flash"}) == 1
    m.forget("ns", "flash")
    assert get("v41flash_planner_desired_replicas", {"namespace": "ns", "deployment": "flash", "role": "prefill"}) is None
    assert get("v41flash_metrics_scrape_errors_total", {"namespace": "ns", "deployment": "flash", "role": "prefill"}) is None
