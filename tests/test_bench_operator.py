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
    assert workloads_of(doc) == 3  # decode, the front and slot ""'s router: what "children exist" waits for


def test_phases_run_in_their_fixed_order_with_the_burst_always_and_unknown_names_refused():
    import pytest
    from v41flash_bench.operator_load import PHASES, parse_phases
    assert parse_phases(",".join(PHASES)) == PHASES
    assert parse_phases("idle,one_more") == ("burst", "one_more", "idle")
    assert parse_phases("") == ("burst",)
    with pytest.raises(ValueError, match=r"--phases: unknown phase\(s\) idel"):
        parse_phases("one_more,idel")


def test_a_report_without_the_later_phases_still_plots(tmp_path):
    from v41flash_bench.operator_load import plot
    run = {"deployments": 10, "burst": {"apply_to_observed_s": {"p50": 1.0, "p99": 2.0}, "all_converged_s": 2.5,
                                         "api_requests_per_deployment": 30.0}, "operator_rss_mb": {"peak": 100.0}}
    plot([run], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_watcher_resumes_from_the_last_resource_version_and_starts_over_only_when_it_is_gone(monkeypatch):
    """A watch started without a resourceVersion replays the namespace (500 CRs, 1,000 Deployments) as ADDED:
    restarted every 60 s that held the benchmark's view seconds behind the operator's."""
    import threading
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException
    from v41flash_bench import operator_load as ol
    calls, done = [], threading.Event()
    gone = ApiException(status=410, reason="Gone")

    class FakeWatch:
        def stream(self, fn, ns, **kwargs):
            calls.append(kwargs.get("resource_version"))
            n = len(calls)
            if n == 3:
                raise gone
            if n >= 5:
                done.set()
                return
            yield {"type": "MODIFIED", "object": {"metadata": {"name": "cr", "resourceVersion": str(10 * n)},
                                                   "status": {"observedGeneration": n}}}

    monkeypatch.setattr(watch, "Watch", FakeWatch)
    monkeypatch.setattr(ol.time, "sleep", lambda s: None)
    w = object.__new__(ol.Watcher)
    w.ns, w._stop = "ns", threading.Event()
    seen = []
    t = threading.Thread(target=w._loop, args=(None, lambda kind, obj: seen.append(obj["metadata"]["resourceVersion"])))
    t.start()
    assert done.wait(10)
    w._stop.set()
    t.join(10)
    assert calls[:5] == [None, "10", "20", None, "40"]  # resumed; after 410 Gone a fresh start
    assert seen == ["10", "20", "40"]


def test_at_rest_means_no_pass_queued_or_running_for_the_whole_quiet_stretch():
    import pytest
    from v41flash_bench.operator_load import AtRest

    def m(depth, running):
        return {("v41flash_pass_queue_depth", ()): depth, ("v41flash_passes_running", ()): running}
    rest = AtRest(quiet_s=5.0)
    assert not rest.sample(0.0, m(0, 0))  # quiet, but not for long enough yet
    assert not rest.sample(4.9, m(0, 0))
    assert not rest.sample(5.0, m(0, 1))  # one pass running: the stretch starts over
    assert not rest.sample(6.0, m(3, 0))  # passes queued
    assert not rest.sample(7.0, m(0, 0))
    assert not rest.sample(11.9, m(0, 0))
    assert rest.sample(12.0, m(0, 0))
    with pytest.raises(RuntimeError, match="v41flash_passes_running"):
        AtRest().sample(0.0, {("v41flash_pass_queue_depth", ()): 0})  # an operator without the gauge: not "at rest"


def test_the_table_reports_one_more_right_after_the_burst_and_at_rest():
    from v41flash_bench.operator_load import table
    run = {"deployments": 500, "burst": {"apply_to_observed_s": {"p50": 40.0, "p99": 70.0}, "all_converged_s": 80.0,
                                         "api_requests_per_deployment": 30.0}, "operator_rss_mb": {"peak": 240.0},
           "one_more": {"apply_to_observed_s": {"p50": 3.14, "p99": 4.9}, "apply_to_children_s": {"p50": 2.9, "p99": 4.6}},
           "one_more_at_rest": {"apply_to_observed_s": {"p50": 0.31, "p99": 0.62},
                                "at_rest": {"first_rest_after_s": 42.0}}}
    header, line = table([run]).splitlines()
    assert "at rest obs p50/p99" in header and "rest after" in header
    assert "3.14/4.90" in line and "0.31/0.62" in line and "42s" in line
    assert "-/-" in table([{**run, "one_more_at_rest": {}}]).splitlines()[1]  # a phase not run: dashes
