"""A flooding and a dripping `/metrics` pod on the real control plane (issue 12): two hostile deployments
(their engines are e2e/hostile_metrics.py, picked by the supervisor from V41F_HOSTILE_METRICS in
spec.decode.extraEnv) and one normal deployment in the session operator. Over several planner intervals:

* the operator's RSS (VmRSS, sampled every 0.2 s) stays under the chart's memory limit;
* the normal deployment keeps reconciling on time: spec changes are observed within SPEC_BOUND_S, and its
  planner decides on every periodic pass its interval allows (v41flash_planner_decisions_total; its
  status.lastDecision keeps the first of identical holds, by design, so its time is not what advances);
* the hostile deployments hold at 2 replicas after minReplicas drops to 1 (zero load would scale a
  measured deployment down), with the byte cap or the deadline named in status.lastDecision;
* no traceback in the operator's log.

The figures are printed and written to <state>/artifacts/hostile-metrics-<time>.json.
"""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes.utils.quantity import parse_quantity
from prometheus_client.parser import text_string_to_metric_families

from e2e.kit import TIMER_INTERVAL_S, wait_for
from e2e.engine_pods import HOSTILE_METRICS_ENV
from v41flash.metrics.scrape import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
CHART_VALUES = REPO / "charts" / "v41flash-operator" / "values.yaml"
GROUP = ("v41flash.io", "v1alpha1")
PLURAL = "v41flashdeployments"
PLANNER_INTERVAL_S = 5  # spec.autoscaling.intervalSeconds of every deployment here
# the planner decides on the first periodic pass at least PLANNER_INTERVAL_S after its last decision
PLANNER_PASS_S = math.ceil(PLANNER_INTERVAL_S / TIMER_INTERVAL_S) * TIMER_INTERVAL_S
OBSERVE_S = 2 * PLANNER_PASS_S + 10  # >= 2 planner intervals (the planner runs on the periodic pass)
SPEC_BOUND_S = 10.0  # a spec change is an urgent pass: observed in well under a periodic interval
READY_S = 120
FLOOD_REASON = f"body over {DEFAULT_MAX_BYTES} bytes"
DRIP_REASON = f"within {DEFAULT_TIMEOUT_S:g} s"


def chart_memory_limit() -> int:
    values = yaml.safe_load(CHART_VALUES.read_text())
    return int(parse_quantity(values["resources"]["limits"]["memory"]))


def deployment(name: str, min_replicas: int, mode: str | None = None) -> dict:
    decode = {"minReplicas": min_replicas, "maxReplicas": 3}
    if mode:
        decode["extraEnv"] = [{"name": HOSTILE_METRICS_ENV, "value": mode}]
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": name},
            "spec": {"profile": "low-latency", "model": {"servedModelName": "deepseek-v4.1-flash"},
                     "gpu": {"product": "H200"}, "prefill": {"enabled": False}, "decode": decode,
                     "slo": {"windowSeconds": 30},
                     "autoscaling": {"enabled": True, "intervalSeconds": PLANNER_INTERVAL_S,
                                     "scaleDownStabilizationSeconds": 0}}}


class RssSampler(threading.Thread):
    """VmRSS of one process every `every` seconds, until stop()."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[int] = []  # bytes
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.samples.append(int(line.split()[1]) * 1024)
            except FileNotFoundError:
                self.samples.append(-1)  # the operator is gone: the test fails on it
                return
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def decisions(metrics_url: str, ns: str, name: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "v41flash_planner_decisions_total" and s.labels.get("namespace") == ns
               and s.labels.get("deployment") == name)


def test_flooding_and_dripping_metrics_pods_leave_the_operator_bounded_and_others_on_time(
        cluster, operator_process, ns):
    limit = chart_memory_limit()
    op = operator_process
    log_start = len(op.log_text())
    rss = RssSampler(op.pid)
    rss.start()

    def cr(name):
        return cluster.custom.get_namespaced_custom_object(*GROUP, ns, PLURAL, name)

    def patch(name, decode):
        return cluster.custom.patch_namespaced_custom_object(*GROUP, ns, PLURAL, name, {"spec": {"decode": decode}})

    def ready_replicas(name, n):
        st = cr(name).get("status") or {}
        return (st.get("decode") or {}).get("readyReplicas") == n

    def observed_within(name, generation, bound):
        t0 = time.monotonic()
        wait_for(lambda: (cr(name).get("status") or {}).get("observedGeneration") == generation, bound,
                 f"{name} observing generation {generation}", interval=0.1)
        return time.monotonic() - t0

    try:
        for doc in (deployment("flood", 2, "flood"), deployment("drip", 2, "drip"), deployment("normal", 1)):
            cluster.custom.create_namespaced_custom_object(*GROUP, ns, PLURAL, doc)
        for name, n in (("flood", 2), ("drip", 2), ("normal", 1)):
            wait_for(lambda: ready_replicas(name, n), READY_S, f"{name}: {n} Ready decode pods")
        kinds = {s["pod"]: s["kind"] for s in cluster.supervised(ns, role="decode")}
        assert sorted(kinds.values()) == ["hostile"] * 4 + ["sim"], kinds

        # from here on a measured, idle deployment would scale down to 1: the hostile ones must not
        for name in ("flood", "drip"):
            patch(name, {"minReplicas": 1})
        t_start = time.monotonic()
        latencies, desired = [], {"flood": set(), "drip": set()}
        decided0 = decisions(op.metrics_url, ns, "normal")
        max_replicas = 3
        while time.monotonic() - t_start < OBSERVE_S:
            max_replicas = 5 - max_replicas  # 3 <-> 2: a spec change that touches no pod
            gen = patch("normal", {"maxReplicas": max_replicas})["metadata"]["generation"]
            latencies.append(observed_within("normal", gen, SPEC_BOUND_S))
            for name in desired:
                desired[name].add(((cr(name).get("status") or {}).get("decode") or {}).get("desiredReplicas"))
            time.sleep(3)
        decided = decisions(op.metrics_url, ns, "normal") - decided0
        observed_s = time.monotonic() - t_start
        last = {name: (cr(name).get("status") or {}).get("lastDecision") or {} for name in ("flood", "drip", "normal")}
    finally:
        rss.stop()

    peak = max(rss.samples)
    report = {"peak_rss_mib": round(peak / 2**20, 1), "rss_samples": len(rss.samples),
              "memory_limit_mib": limit / 2**20, "observed_s": round(observed_s, 1),
              "spec_change_observed_s": {"n": len(latencies), "max": round(max(latencies), 2),
                                         "median": round(sorted(latencies)[len(latencies) // 2], 2)},
              "normal_planner_decisions": decided, "desired_replicas_seen": {k: sorted(v, key=str) for k, v in desired.items()},
              "last_decision": last}
    out = cluster.state / "artifacts" / f"hostile-metrics-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print("\n[e2e] hostile /metrics:", json.dumps(report, indent=1), f"\n[e2e] report: {out}")

    op.assert_alive()
    assert 0 < peak < limit, f"operator RSS peaked at {peak / 2**20:.0f} MiB, chart limit {limit / 2**20:.0f} MiB"
    assert max(latencies) < SPEC_BOUND_S
    # the planner ran for the normal deployment on every planner pass of the window (one decision per role)
    assert decided >= int(observed_s // PLANNER_PASS_S) - 1 >= 1, decided
    assert "missing" not in last["normal"].get("reason", ""), last["normal"]
    for name, why in (("flood", FLOOD_REASON), ("drip", DRIP_REASON)):
        assert desired[name] == {2}, (name, desired[name])
        assert last[name]["action"] == "hold" and last[name]["decode"] == 2, last[name]
        assert "no pod of 2 answered its metrics scrape" in last[name]["reason"] and why in last[name]["reason"], \
            last[name]
    new_log = op.log_text()[log_start:]
    assert "Traceback" not in new_log, new_log[new_log.index("Traceback") - 2000:][:6000]
