"""The operator load benchmark's arithmetic (the run itself needs a cluster: `v41flash bench operator`)."""
from __future__ import annotations

from v41flash_bench.operator_load import delta, histogram, parse_metrics, summary, workloads_of, example_cr, REPO

PAGE = """# TYPE v41flash_reconcile_duration_seconds histogram
v41flash_reconcile_duration_seconds_bucket{trigger="create",le="0.1"} 8
v41flash_reconcile_duration_seconds_bucket{trigger="create",le="0.5"} 9
v41flash_reconcile_duration_seconds_bucket{trigger="create",le="+Inf"} 10
v41flash_reconcile_duration_seconds_sum{trigger="create"} 3.0
v41flash_reconcile_duration_seconds_count{trigger="create"} 10
"""


def test_percentiles_and_histogram_quantiles_from_a_metrics_delta():
    s = summary([float(x) for x in range(1, 101)])
    assert (s["n"], s["p50"], s["p99"], s["max"]) == (100, 51.0, 99.0, 100.0)
    assert summary([])["p50"] is None
    m = delta(parse_metrics(PAGE), {})
    h = histogram(m, "v41flash_reconcile_duration_seconds", trigger="create")
    assert h == {"count": 10, "mean": 0.3, "p50_le": 0.1, "p99_le": float("inf"), "max_le": float("inf")}
    assert histogram(m, "v41flash_reconcile_duration_seconds", trigger="update") == {"count": 0}


def test_the_default_example_renders_two_workloads():
    doc = example_cr(REPO / "manifests" / "examples" / "aggregated-h200.yaml", "x")
    assert workloads_of(doc) == 2  # decode + router: what "children exist" waits for
