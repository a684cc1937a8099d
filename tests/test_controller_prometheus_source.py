"""The planner on spec.autoscaling.metrics.source: Prometheus (controller/autoscale.py): it reads the windows from
Prometheus (answers recorded from the real server, replayed at the query's time: prom_replay.py) and scrapes no
pod; when Prometheus is unreachable, answers nothing or only old data, it holds — never scales down — and says
why in lastDecision, the MetricsUnavailable condition and one Warning Event."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from fake_kube import FakeKube
from prom_replay import META, NAMESPACE, WINDOW_S, Replay
from v41flash.api import v1alpha1 as api
from v41flash.controller import config as operator_config
from v41flash.controller.autoscale import METRICS_UNAVAILABLE, Autoscaler
from v41flash.controller.status import _planner_conditions
from v41flash.planner.datatypes import PlannerConfig

ROLE_OF = {**{p: "prefill" for p in META["expected"]["prefill"]}, **{p: "decode" for p in META["expected"]["decode"]},
           **{p: "router" for p in META["router_pods"]}}


def pod(name: str, role: str, owner: str | None = None) -> SimpleNamespace:
    labels = {"v41flash.io/deployment": "x", "v41flash.io/role": role}
    if role != "router":
        labels["v41flash.io/serving"] = "true"
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, namespace=NAMESPACE, labels=labels, deletion_timestamp=None, annotations={},
                                 creation_timestamp=datetime.now(timezone.utc),
                                 owner_references=[SimpleNamespace(kind="ReplicaSet", name=owner or f"x-{role}-5d9f",
                                                                   controller=True)]),
        # an address nothing listens on: the Prometheus source must not scrape pods
        status=SimpleNamespace(pod_ip="127.0.0.1", conditions=[SimpleNamespace(type="Ready", status="True")]))


PROFILE = Path(__file__).resolve().parents[1] / "e2e" / "autoscale" / "sim-profile.yaml"  # the simulators' capacity


def cluster(pods: list[SimpleNamespace] | None = None) -> FakeKube:
    """The apiserver of deployment x: its pods, and the ConfigMap of its capacity profile (spec.autoscaling)."""
    kube = FakeKube(pods=[pod(n, r) for n, r in ROLE_OF.items()] if pods is None else pods)
    kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sim-profile"},
              "data": {"profile.yaml": PROFILE.read_text()}}, namespace=NAMESPACE)
    return kube


def spec(url: str, ttft_target: float = 0.5) -> api.V41FlashDeploymentSpec:
    return api.V41FlashDeploymentSpec.model_validate({
        "gpu": {"product": "H200"}, "prefill": {"minReplicas": 1, "maxReplicas": 4},
        "decode": {"minReplicas": 1, "maxReplicas": 4},
        "slo": {"ttft": {"targetSeconds": ttft_target, "percentile": 90}, "e2eP95Seconds": 60,
                "windowSeconds": int(WINDOW_S)},
        "autoscaling": {"intervalSeconds": 30, "capacityProfile": "sim-profile", "metrics": {"source": "Prometheus", "prometheus": {
            "url": url, "timeoutSeconds": 2, "scrapedBy": {"podLabels": {"app": "prometheus"}}}}}})


STATUS = {"prefill": {"desiredReplicas": 2, "readyReplicas": 2, "replicas": 2},
          "decode": {"desiredReplicas": 2, "readyReplicas": 2, "replicas": 2}}
BODY = {"metadata": {"name": "x", "namespace": NAMESPACE, "uid": "u1"}, "status": STATUS}
EAGER = PlannerConfig.for_spec(30, 0)  # no scale-down stabilization: a quiet window with good data shrinks at once


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there


@pytest.fixture
def prom(monkeypatch):
    """Replayed Prometheus servers, each on a loopback port the operator's administrator allows by name (the
    default operator queries nothing: test_the_default_operator_queries_nothing)."""
    fakes = []

    def allow() -> None:
        monkeypatch.setattr(operator_config, "_installed", operator_config.OperatorConfig(
            prometheus_endpoints=(UNREACHABLE, *(f.url for f in fakes))))

    def start(*args, **kw):
        fakes.append(Replay(*args, **kw))
        allow()
        return fakes[-1]
    allow()
    yield start
    for f in fakes:
        f.close()


def test_the_default_operator_queries_nothing():
    """No allowlist (the chart's default): a loopback URL is refused before any query, naming the field; the planner
    holds with the PrometheusRefused condition."""
    fake = Replay(shift=True)
    try:
        out = Autoscaler(cluster(), config=EAGER).step(BODY, spec(fake.url, ttft_target=5.0))
    finally:
        fake.close()
    assert fake.seen == []
    [(type_, reason, message)] = out.conditions
    assert (type_, reason) == (METRICS_UNAVAILABLE, "PrometheusRefused") and out.desired == {"prefill": 2, "decode": 2}
    assert message.startswith("prefill: spec.autoscaling.metrics.prometheus.url: Prometheus at " + fake.url)
    assert "allows" in message and out.status["lastDecision"]["action"] == "hold"


def test_the_planner_scales_on_prometheus_figures_and_scrapes_no_pod(prom):
    fake = prom(shift=True)
    scaler = Autoscaler(cluster())
    out = scaler.step(BODY, spec(fake.url))  # the recorded TTFT p90 is ~1 s, over the 0.5 s target
    assert fake.seen and {f["time"] for f in fake.seen} == {fake.seen[0]["time"]}  # one round, at the decision time
    assert out.status["slo"]["ttftSeconds"] > 0.5 and out.status["slo"]["requestRate"] > 0
    assert out.status["lastDecision"]["action"] == "scale_up", out.status["lastDecision"]["reason"]
    assert out.desired["prefill"] > 2 and [e[1] for e in out.events] == ["Scaled"]
    assert out.conditions == []
    assert scaler.histories["u1"].pods() == []  # nothing was scraped


def test_a_pod_that_only_copied_our_labels_is_not_queried(prom):
    fake = prom(shift=True)
    pods = [pod(n, r) for n, r in ROLE_OF.items()] + [pod("intruder", "decode", owner="evil-decode-1")]
    Autoscaler(cluster(pods)).step(BODY, spec(fake.url))
    assert all("intruder" not in f["query"] for f in fake.seen)


@pytest.mark.parametrize("fault,reason,says", [
    ("unreachable", "PrometheusUnreachable", "unreachable: ConnectError"),
    ("empty", "PrometheusNoData", "has no vllm:num_requests_running series"),
    ("error", "PrometheusError", "answered HTTP 400"),
    ("stale", "PrometheusStale", "older than 120s"),
])
def test_prometheus_trouble_holds_says_why_once_and_never_scales_down(prom, fault, reason, says):
    if fault == "unreachable":
        url = UNREACHABLE
    else:
        url = prom({"stale": "ok"}.get(fault, fault), shift=True, age_s=300 if fault == "stale" else 0).url
    # a quiet target: with good data this window is a scale-down from 2 (the control below)
    scaler = Autoscaler(cluster(), config=EAGER)
    out = scaler.step(BODY, spec(url, ttft_target=5.0))
    last = out.status["lastDecision"]
    assert last["action"] == "hold" and out.desired == {"prefill": 2, "decode": 2}, last["reason"]
    assert says in last["reason"] or fault == "stale", last["reason"]
    assert "stale" in last["reason"] or fault != "stale", last["reason"]
    [(type_, why, message)] = out.conditions
    assert (type_, why) == (METRICS_UNAVAILABLE, reason) and says in message
    assert [(e[0], e[1]) for e in out.events] == [("Warning", METRICS_UNAVAILABLE)]
    # the condition as reconcile records it; the next pass with the same trouble posts no second Event
    status = {**STATUS, **out.status, "conditions": _planner_conditions([], {}, out, 1, "2026-12-01T00:00:00Z")}
    assert [c["type"] for c in status["conditions"]] == [METRICS_UNAVAILABLE]
    scaler.states["u1"] = replace(scaler.states["u1"], last_decision_time=time.time() - 60)
    again = scaler.step({**BODY, "status": status}, spec(url, ttft_target=5.0))
    assert again.events == [] and again.conditions[0][1] == reason and again.desired == {"prefill": 2, "decode": 2}


def test_control_good_prometheus_data_on_the_same_quiet_target_scales_down(prom):
    fake = prom(shift=True)
    out = Autoscaler(cluster(), config=EAGER).step(BODY, spec(fake.url, ttft_target=5.0))
    assert out.status["lastDecision"]["action"] == "scale_down", out.status["lastDecision"]["reason"]
    assert out.conditions == []
