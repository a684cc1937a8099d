"""The planner on metrics from a real Prometheus (spec.autoscaling.metrics.source: Prometheus).

A Prometheus server (pinned, built from its Go module: `bash e2e/build-tools.sh prometheus`) discovers the
deployment's pods through kubernetes_sd_configs against the local apiserver and scrapes the simulators on their
pod IPs (engines' /metrics, vllm-router's metrics port, the session proxy's /proxy/metrics), attaching namespace
and pod from the Kubernetes API as a PodMonitor does. Load through the router breaches the TTFT target; the
planner, which scrapes no pod itself, scales prefill up on Prometheus' figures. Then Prometheus is stopped
(by PID): the planner holds, never below what runs, and says why in lastDecision, a MetricsUnavailable
condition and a Warning Event.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import pytest
import yaml

from e2e import prometheus as P
from e2e.tools import Tools
from e2e.kit import wait_for
from e2e.test_autoscale import CLIENTS, MODEL, PROFILE, Load, deployment
from v41flash_bench.procs import stop_procs

pytestmark = pytest.mark.e2e

NAME = "slo-autoscale"  # e2e.test_autoscale.deployment()'s
WINDOW_S = 15  # short windows on Prometheus' 1 s scrapes: a breach shows within one planner pass
INTERVAL_S = 5  # the planner decides on the first operator pass (e2e.kit.TIMER_INTERVAL_S apart) 5 s after the last
LOAD_MAX_S = 60  # the scale-up came 16 s into the load in the recorded run; the hold needs no load


def _status(cluster, ns: str) -> dict:
    return cluster.kubectl_json("get", "v41f", NAME, "-n", ns).get("status") or {}


def test_planner_scales_on_prometheus_and_holds_when_it_is_gone(cluster, operator_process, ns):
    binary = Tools.load().prometheus
    if not binary.exists():
        pytest.fail(f"{binary} not built: run `bash e2e/build-tools.sh prometheus`")  # e2e never skips a tool
    prom = P.start(binary, P.kubernetes_sd_config(cluster.kubeconfig, ns), cluster.state / f"prometheus-{ns}",
                   name=f"prometheus-{ns}")
    cluster.cluster.register(prom)  # `make down` stops it too, should this test die
    try:
        with allowed(operator_process, "--prometheus-endpoints", P.url(prom)):  # the admin allows this Prometheus
            _run(cluster, ns, prom)
    finally:
        stop_procs([prom])
        cluster.cluster.unregister(prom.name)


@contextlib.contextmanager
def allowed(operator_process, *flags: str):
    """The operator restarted with an administrator's allowlist flags (issue 39: it queries nothing by default),
    restarted as it was afterwards."""
    before = list(operator_process.extra_args)
    operator_process.extra_args = [*before, *flags]
    operator_process.restart()
    try:
        yield
    finally:
        operator_process.extra_args = before
        operator_process.restart()


def _run(cluster, ns: str, prom) -> None:
    cluster.kubectl("create", "configmap", "sim-capacity-profile", "-n", ns, f"--from-file=profile.yaml={PROFILE}")
    doc = deployment()
    doc["spec"]["slo"]["windowSeconds"] = WINDOW_S
    doc["spec"]["autoscaling"].update({"intervalSeconds": INTERVAL_S, "metrics": {"source": "Prometheus", "prometheus": {
        "url": P.url(prom), "timeoutSeconds": 5,
        "scrapedBy": {"podLabels": {"app.kubernetes.io/name": "prometheus"}}}}})
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in _status(cluster, ns).get("conditions", [])),
             240, f"{ns}/{NAME} Ready")
    pods = {p["metadata"]["name"]: p["metadata"]["labels"]["v41flash.io/role"] for p in cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={NAME}")["items"]}
    # the rendered NetworkPolicy admits that Prometheus to the engines' metrics port
    policy = cluster.kubectl_json("get", "networkpolicy", f"{NAME}-engines", "-n", ns)
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}} in policy["spec"]["ingress"][2]["from"]
    P.wait_scraped(prom, pods, timeout=60)  # kubernetes_sd found every pod, through the apiserver

    router_pod = next(p for p, role in pods.items() if role == "router")
    router = cluster.sim_for(router_pod, ns)
    load = Load(f"http://{router['ip']}:{router['port']}")
    wait_for(lambda: httpx.post(f"{load.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}).status_code == 200,
        90, "a 200 from the router")

    t0 = time.time()
    load_thread = threading.Thread(target=load.run, args=(CLIENTS, LOAD_MAX_S), daemon=True)
    load_thread.start()

    def scaled_up():
        st = _status(cluster, ns)
        last = st.get("lastDecision") or {}
        return (st, last) if last.get("action") == "scale_up" and (st.get("prefill") or {}).get("desiredReplicas", 1) > 1 \
            else None
    st, last = wait_for(scaled_up, LOAD_MAX_S, "a scale-up decided on Prometheus' figures", interval=1)
    print(f"\n[e2e] {time.time() - t0:.0f}s into the load: {last['reason']}\n[e2e] status.slo: {st.get('slo')}", flush=True)
    assert "TTFT" in last["reason"] and st["slo"]["ttftSeconds"] > doc["spec"]["slo"]["ttft"]["targetSeconds"]
    peak = st["prefill"]["desiredReplicas"]

    # Prometheus goes away: hold, with the reason, the condition and an Event
    stop_procs([prom])
    t1 = time.time()

    def holding():
        st = _status(cluster, ns)
        cond = next((c for c in st.get("conditions", []) if c["type"] == "MetricsUnavailable" and c["status"] == "True"), None)
        return (st, cond) if cond else None
    st, cond = wait_for(holding, 60, "MetricsUnavailable after Prometheus stopped", interval=1)
    print(f"[e2e] {time.time() - t1:.0f}s after Prometheus stopped: {cond['message']}\n"
          f"[e2e] lastDecision: {st['lastDecision']['reason']}", flush=True)
    assert cond["reason"] == "PrometheusUnreachable" and P.url(prom) in cond["message"]
    assert st["lastDecision"]["action"] == "hold" and "unreachable" in st["lastDecision"]["reason"]
    assert st["prefill"]["desiredReplicas"] >= peak and st["decode"]["desiredReplicas"] >= 1
    events = wait_for(lambda: cluster.kubectl_json("get", "events", "-n", ns, "--field-selector",
                                                   "reason=MetricsUnavailable")["items"], 30, "a MetricsUnavailable Event")
    assert all(e["type"] == "Warning" for e in events) and any(P.url(prom) in e["message"] for e in events)
    load_thread.join(LOAD_MAX_S + 60)
    assert load.ok > 0 and not load.failed, f"failed requests: {load.failed[:5]}"


SECRET = "AKIA-E2E-METADATA-SECRET"


class _MetadataLike(threading.Thread):
    """A loopback server shaped like a cloud metadata service: every request gets credentials back."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"Code": "Success", "AccessKeyId": SECRET, "errorType": SECRET}).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        super().__init__(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_metadata_like_url_gets_a_condition_and_none_of_its_answer(cluster, operator_process, ns):
    """Issue 39: spec.autoscaling.metrics.prometheus.url at a loopback server answering credentials. The default
    operator never contacts it: Stalled naming the field. An administrator who allows that very address (a
    mistake) gets the queries sent, a MetricsUnavailable condition naming the field, and nothing of the answer in
    status, Events or the operator's log."""
    server = _MetadataLike()
    server.start()
    try:
        cluster.kubectl("create", "configmap", "sim-capacity-profile", "-n", ns, f"--from-file=profile.yaml={PROFILE}")
        doc = deployment()
        doc["spec"]["autoscaling"].update({"intervalSeconds": INTERVAL_S, "metrics": {"source": "Prometheus", "prometheus": {
            "url": server.url, "timeoutSeconds": 2, "scrapedBy": {"podLabels": {"app.kubernetes.io/name": "prometheus"}}}}})
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        field = "spec.autoscaling.metrics.prometheus.url"

        def condition(type_: str):
            c = next((c for c in _status(cluster, ns).get("conditions", []) if c["type"] == type_), None)
            return c if c and c["status"] == "True" else None
        stalled = wait_for(lambda: condition("Stalled"), 60, f"{NAME} Stalled on a URL the operator does not allow")
        assert stalled["reason"] == "InvalidSpec" and field in stalled["message"]
        assert server.requests == 0

        with allowed(operator_process, "--prometheus-endpoints", server.url):
            cond = wait_for(lambda: condition("MetricsUnavailable"), 240,
                            "MetricsUnavailable once the planner queried the metadata-like server", interval=1)
            assert server.requests > 0
            assert cond["reason"] == "PrometheusError" and field in cond["message"] and "HTTP 401" in cond["message"]
            events = wait_for(lambda: cluster.kubectl_json("get", "events", "-n", ns, "--field-selector",
                                                           "reason=MetricsUnavailable")["items"], 30, "its Event")
            everything = json.dumps([cluster.kubectl_json("get", "v41f", NAME, "-n", ns),
                                     cluster.kubectl_json("get", "events", "-n", ns)])
            print(f"\n[e2e] {server.requests} queries answered with credentials; condition: {cond['message']}")
            assert events and SECRET not in everything and SECRET not in operator_process.log_text()
    finally:
        cluster.kubectl("delete", "v41f", NAME, "-n", ns, "--wait=false", check=False)
        server.close()
