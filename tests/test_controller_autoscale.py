"""The planner's edge in the controller: real scrapes of loopback /metrics servers, windows cut from the
history, the pure planner called at its cadence, and its outcome turned into status fields and Events.
The apiserver is the tests' FakeKube, holding pods (the e2e suite covers the real one)."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from fake_kube import FakeKube
from prereq import unavailable
from v41flash.api import v1alpha1 as api
from v41flash.render import labels as L
from v41flash.controller.autoscale import Autoscaler, observed_slo_status
from v41flash.controller.desired import desired_replicas
from v41flash.metrics.parse import parse_metrics
from v41flash.metrics.window import PodSnapshot, SnapshotHistory
from vllm_exposition import E2E_LE, TTFT_LE, page

# The scraper reads pod_ip:8000, so the fakes need their own loopback addresses: random per run, so that
# concurrent runs on one machine do not take each other's port 8000, and in 127.200-254.x.x, clear of the
# e2e clusters' pod networks (127.<N>.0.0/16 claimed upward from N = 1, e2e/harness.py).
_NET = f"127.{random.randrange(200, 255)}.{random.randrange(0, 256)}"
IPS = {"prefill": f"{_NET}.1", "decode": f"{_NET}.2"}


def busy_page(requests: float, ttft_s: float) -> str:
    """One engine that finished `requests` requests, all with the given TTFT and a 20 s e2e."""
    ttft = [requests if ttft_s <= le else 0.0 for le in TTFT_LE] + [requests]
    e2e = [requests if 20.0 <= le else 0.0 for le in E2E_LE] + [requests]
    return page({"0": {"ttft": (ttft, ttft_s * requests), "e2e": (e2e, 20.0 * requests), "running": 4,
                       "prompt_tokens": 8000 * requests, "gen_tokens": 500 * requests,
                       "queries": 8000 * requests, "hits": 6000 * requests,
                       "prompt_len": ([0, 0, requests, requests, requests], 8000 * requests),
                       "gen_len": ([0, requests, requests, requests, requests], 500 * requests)}})


class Pages:
    def __init__(self):
        self.text = {ip: busy_page(0, 0.05) for ip in IPS.values()}


@pytest.fixture
def servers():
    pages = Pages()
    started = []
    for ip in IPS.values():
        class Handler(BaseHTTPRequestHandler):
            my_ip = ip

            def do_GET(self):  # noqa: N802
                body = pages.text[self.my_ip].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        try:
            srv = ThreadingHTTPServer((ip, 8000), Handler)
        except OSError as exc:
            unavailable(f"cannot bind {ip}:8000 on loopback: {exc}")
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
    yield pages
    for srv in started:
        srv.shutdown()
        srv.server_close()


def pod(name: str, role: str, ready: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, namespace="ns",
                                 labels={"v41flash.io/deployment": "x", "v41flash.io/role": role,
                                                    **({} if role == "router" else {"v41flash.io/serving": "true"})},
                                 deletion_timestamp=None,
                                 annotations={}, creation_timestamp=datetime.now(timezone.utc),
                                 owner_references=[SimpleNamespace(kind="ReplicaSet", name=f"x-{role}-5d9f",
                                                                   controller=True)]),
        status=SimpleNamespace(pod_ip=IPS[role], conditions=[SimpleNamespace(type="Ready", status=str(ready))]))


def cluster() -> FakeKube:
    """The apiserver of deployment x: one prefill and one decode pod."""
    return FakeKube(pods=[pod("p-0", "prefill"), pod("d-0", "decode")])


def listed(kube: FakeKube) -> list[str]:
    """The selectors the autoscaler listed pods with."""
    return [selector for method, selector in kube.calls if method == "list_pods"]


SPEC = api.V41FlashDeploymentSpec.model_validate({
    "gpu": {"product": "H200"}, "prefill": {"minReplicas": 1, "maxReplicas": 4},
    "decode": {"minReplicas": 1, "maxReplicas": 4},
    "slo": {"ttft": {"targetSeconds": 0.5, "percentile": 90}, "e2eP95Seconds": 60, "windowSeconds": 60},
    "autoscaling": {"intervalSeconds": 30}})
BODY = {"metadata": {"name": "x", "namespace": "ns", "uid": "u1"},
        "status": {"prefill": {"desiredReplicas": 1, "readyReplicas": 1, "replicas": 1},
                   "decode": {"desiredReplicas": 1, "readyReplicas": 1, "replicas": 1}}}


def seed_history(scaler: Autoscaler, text_by_role: dict[str, str], t: float) -> None:
    hist = scaler.histories.setdefault("u1", SnapshotHistory())
    names = {"prefill": "p-0", "decode": "d-0"}
    hist.add([PodSnapshot(names[r], r, t, parse_metrics(text)) for r, text in text_by_role.items()])


def test_first_pass_without_a_window_holds_and_says_why(servers):
    scaler = Autoscaler(cluster())
    out = scaler.step(BODY, SPEC)
    assert out is not None and out.desired == {"prefill": 1, "decode": 1}
    last = out.status["lastDecision"]
    assert last["action"] == "hold" and "partial" in last["reason"]  # one snapshot: no full window yet
    assert out.events == []  # holding is not news
    assert out.status["plannerState"]


def test_pods_are_listed_by_their_deployment_s_label(servers):
    kube = cluster()
    Autoscaler(kube).step(BODY, SPEC)
    assert listed(kube) and all("v41flash.io/deployment=x" in selector.split(",") for selector in listed(kube))


def test_ttft_breach_scales_prefill_and_reports_observed_figures(servers):
    scaler = Autoscaler(cluster())
    now = time.time()
    seed_history(scaler, {"prefill": busy_page(100, 0.05), "decode": busy_page(100, 0.05)}, now - 60)
    # the next minute: 900 requests at a 4.5 s TTFT (p90 far above the 0.5 s target)
    servers.text[IPS["prefill"]] = busy_page(1000, 4.5)
    servers.text[IPS["decode"]] = busy_page(1000, 0.05)
    out = scaler.step(BODY, SPEC)
    assert out.status["slo"]["ttftSeconds"] > 0.5 and out.status["slo"]["ttft"].endswith("s")
    assert out.status["slo"]["prefixCacheHitRate"] == pytest.approx(0.75)
    assert out.desired["prefill"] > 1, out.status["lastDecision"]["reason"]
    assert out.status["lastDecision"]["action"] == "scale_up"
    assert [e[1] for e in out.events] == ["Scaled"]
    # the controller writes exactly that, within the bounds
    assert desired_replicas(SPEC, BODY["status"], out.desired)["prefill"] == out.desired["prefill"]


def test_planner_runs_at_its_interval_not_every_pass(servers):
    scaler = Autoscaler(cluster())
    body = {**BODY, "status": {**BODY["status"], "lastDecision": {
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}}
    assert scaler.step(body, SPEC) is None  # scraped (history grows) but no decision yet
    assert scaler.histories["u1"].pods() == ["d-0", "p-0"]


def test_missing_profile_holds_with_a_warning(servers):
    scaler = Autoscaler(cluster())
    spec = SPEC.model_copy(update={"gpu": api.GPUSpec(product="MI355X")})
    out = scaler.step(BODY, spec)
    assert out.desired == {}
    assert "no capacity profile" in out.status["lastDecision"]["reason"]
    assert out.events and out.events[0][1] == "NoCapacityProfile"


def test_observed_slo_status_prefers_router_latency():
    w = SimpleNamespace(requests=10, ttft_s=0.4, e2e_p95_s=9.0, request_rate=2.0, prefix_cache_hit_rate=0.9,
                        load_spread=1.1)
    router = SimpleNamespace(e2e_p95_s=12.0, request_rate=2.5, requests=20)
    st = observed_slo_status({"prefill": w, "decode": w, "overall": w}, router)
    assert st == {"ttft": "0.40s", "ttftSeconds": 0.4, "e2eP95Seconds": 12.0,
                  "requestRate": 2.5, "prefixCacheHitRate": 0.9, "loadImbalance": 1.1}


def test_a_repeated_hold_keeps_the_recorded_decision_and_state_is_compact(servers):
    scaler = Autoscaler(cluster())
    first = scaler.step(BODY, SPEC)
    body = {**BODY, "status": {**BODY["status"], **first.status}}
    state = scaler.states["u1"]  # as if the interval had passed
    scaler.states["u1"] = replace(state, last_decision_time=state.last_decision_time - SPEC.autoscaling.interval_seconds)
    again = scaler.step(body, SPEC)
    assert again is not None
    assert again.status["lastDecision"] is first.status["lastDecision"]  # only numbers moved: no new record
    assert again.status["plannerState"] == first.status["plannerState"]
    assert set(first.status["plannerState"]["prefill"]) == {"correction", "corrections_learned", "service_correction", "last_scale_time",
                                                             "last_action", "headroom_rise", "headroom_peak"}


def unschedulable_pod(name: str, role: str) -> SimpleNamespace:
    p = pod(name, role, ready=False)
    p.status = SimpleNamespace(pod_ip=None, conditions=[SimpleNamespace(
        type="PodScheduled", status="False", reason="Unschedulable",
        message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
                "3 No preemption victims found for incoming pod.")])
    return p


def step_seeing_observation(scaler: Autoscaler, body: dict):
    """scaler.step(body, SPEC), and the Observation it handed to plan()."""
    import v41flash.controller.autoscale as autoscale_mod
    seen = {}
    real_plan = autoscale_mod.plan

    def spy(observation, *args, **kwargs):
        seen["obs"] = observation
        return real_plan(observation, *args, **kwargs)

    autoscale_mod.plan = spy
    try:
        out = scaler.step(body, SPEC)
    finally:
        autoscale_mod.plan = real_plan
    return out, seen["obs"]


def test_unschedulable_pods_are_not_starting_capacity_and_show_in_a_condition_and_event(servers):
    kube = cluster()
    kube.pods += [unschedulable_pod("p-1", "prefill"), unschedulable_pod("p-2", "prefill")]
    scaler = Autoscaler(kube)
    body = {**BODY, "status": {**BODY["status"], "prefill": {"desiredReplicas": 3, "readyReplicas": 1, "replicas": 3}}}
    out, observation = step_seeing_observation(scaler, body)
    rep = observation.prefill.replicas
    assert (rep.desired, rep.ready, rep.starting, rep.unschedulable) == (3, 1, 0, 2)
    msg = "2 prefill pods unschedulable: Insufficient nvidia.com/gpu"
    assert out.conditions == [("CapacityPending", "Unschedulable", msg)]
    assert ("Warning", "Unschedulable", msg) in out.events
    # the same news again: the condition stays, no second Event
    body2 = {**body, "status": {**body["status"], "conditions": [
        {"type": "CapacityPending", "status": "True", "reason": "Unschedulable", "message": msg}]}}
    scaler.states["u1"] = replace(scaler.states["u1"], last_decision_time=0.0)
    again = scaler.step(body2, SPEC)
    assert again.conditions == out.conditions and not [e for e in again.events if e[1] == "Unschedulable"]


def test_advisory_mode_decides_and_reports_but_writes_no_replicas(servers):
    scaler = Autoscaler(cluster())
    now = time.time()
    seed_history(scaler, {"prefill": busy_page(100, 0.05), "decode": busy_page(100, 0.05)}, now - 60)
    servers.text[IPS["prefill"]] = busy_page(1000, 4.5)
    servers.text[IPS["decode"]] = busy_page(1000, 0.05)
    spec = SPEC.model_copy(update={"autoscaling": SPEC.autoscaling.model_copy(update={"mode": "advisory"})})
    out = scaler.step(BODY, spec)
    assert out.desired == {}  # nothing to write
    last = out.status["lastDecision"]
    assert last["advisory"] is True and last["action"] == "scale_up" and last["prefill"] > 1
    assert last["reason"].startswith("advisory (not applied): ")
    assert [e[1] for e in out.events] == ["WouldScale"]
    assert desired_replicas(spec, BODY["status"], out.desired)["prefill"] == 1  # replicas stay
    assert scaler.metrics.advisory.labels("ns", "x")._value.get() == 1


def test_throughput_status_counts_prompt_and_output_tokens_per_gpu_and_dollar():
    from v41flash.controller.observation import throughput_status
    pre = SimpleNamespace(prompt_tokens_rate=90_000.0, generation_tokens_rate=0.0)
    dec = SimpleNamespace(prompt_tokens_rate=90_000.0, generation_tokens_rate=10_000.0)
    st = throughput_status({"prefill": pre, "decode": dec}, {"prefill": 2, "decode": 3}, {"prefill": 4, "decode": 4}, 2.0)
    assert st == {"tokensPerSecond": 100_000.0, "tokensPerSecondPerGPU": 5_000.0,
                  "tokensPerDollar": pytest.approx(100_000 * 3600 / (20 * 2.0))}
    assert "tokensPerDollar" not in throughput_status({"decode": dec}, {"decode": 1}, {"decode": 4}, 0.0)


def test_measured_cold_start_from_pod_timestamps():
    from v41flash.controller.observation import measured_cold_start, pod_view
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    pods = []
    for i, secs in enumerate((500, 700, 600)):
        p = pod(f"p-{i}", "prefill")
        p.metadata.creation_timestamp = datetime.fromtimestamp(t0 + 60 * i, timezone.utc)
        p.status.conditions = [SimpleNamespace(type="Ready", status="True", last_transition_time=datetime.fromtimestamp(
            t0 + 60 * i + secs, timezone.utc))]
        pods.append(pod_view(p))
    assert measured_cold_start(pods) == pytest.approx(600.0)
    assert measured_cold_start([pod_view(pod("x", "prefill"))]) is None  # no Ready transition time: nothing measured
def test_only_pods_our_workloads_made_are_scrape_targets():
    from v41flash.controller.observation import PodView, owned_pod, pod_view

    def p(role, kind, owner):
        return PodView(name="p", role=role, ready=True, ip="10.0.0.1", controller=(kind, owner) if kind else None)
    assert owned_pod(p("decode", "ReplicaSet", "x-decode-5d9f"), "x")
    assert owned_pod(p("prefill", "StatefulSet", "x-prefill-1"), "x")  # LeaderWorkerSet worker group
    assert owned_pod(p("router", "ReplicaSet", "x-router-77c"), "x")
    assert not owned_pod(p("decode", None, ""), "x")  # a bare pod with copied labels
    assert not owned_pod(p("decode", "ReplicaSet", "evil-5d9f"), "x")
    assert not owned_pod(p("decode", "ReplicaSet", "x-prefill-5d9f"), "x")  # role label and owner disagree
    assert not owned_pod(p("decode", "Job", "x-decode-1"), "x")
    # pod_view keeps only the controller reference
    v1pod = pod("d-0", "decode")
    v1pod.metadata.owner_references = [SimpleNamespace(kind="ReplicaSet", name="x-decode-1", controller=False)]
    assert pod_view(v1pod).controller is None


def test_router_pods_are_listed_and_scraped_with_their_session_proxy(servers, monkeypatch):
    # router pods carry no v41flash.io/serving label: the engines' selector alone never lists them
    import v41flash.controller.autoscale as autoscale_mod
    from v41flash.metrics.scrape import proxy_target, router_target
    kube = cluster()
    router = pod("d-0", "decode")
    router.metadata = SimpleNamespace(**{**vars(router.metadata), "name": "r-0",
                                         "labels": {"v41flash.io/deployment": "x", "v41flash.io/role": "router"},
                                         "owner_references": [SimpleNamespace(kind="ReplicaSet", name="x-router-77c",
                                                                              controller=True)]})
    router.status = SimpleNamespace(**{**vars(router.status), "pod_ip": f"{_NET}.3"})
    kube.pods.append(router)
    seen: list = []

    async def spy(targets, *args, **kwargs):
        seen.extend(targets)
        return []
    monkeypatch.setattr(autoscale_mod, "scrape", spy)
    Autoscaler(kube).step(BODY, SPEC)
    assert router_target("r-0", f"{_NET}.3") in seen and proxy_target("r-0", f"{_NET}.3") in seen
    assert sorted(t.role for t in seen) == ["decode", "prefill", "router", "router"]


def on_node(p: SimpleNamespace, node: str) -> SimpleNamespace:
    p.spec = SimpleNamespace(node_name=node)
    return p


def test_pods_on_a_notready_node_are_neither_serving_nor_starting_and_show_in_a_condition(servers):
    kube = cluster()
    kube.nodes = {"gpu-1": True, "gpu-2": False}
    kube.pods = [on_node(pod("p-0", "prefill"), "gpu-1"), on_node(pod("d-0", "decode", ready=False), "gpu-2"),
                 on_node(pod("d-1", "decode", ready=False), "gpu-1")]  # loading weights on a healthy node
    scaler = Autoscaler(kube)
    body = {**BODY, "status": {**BODY["status"], "decode": {"desiredReplicas": 2, "readyReplicas": 0, "replicas": 2}}}
    out, observation = step_seeing_observation(scaler, body)
    rep = observation.decode.replicas
    assert (rep.desired, rep.ready, rep.starting, rep.lost) == (2, 0, 1, 1)
    assert sorted(node for method, node in kube.calls if method == "node_ready") == ["gpu-1", "gpu-2"]  # each once
    (type_, reason, msg), = [c for c in out.conditions if c[0] == "NodeNotReady"]
    assert reason == "NodeNotReady" and msg.startswith("1 decode pod on NotReady node gpu-2: Kubernetes evicts")
    assert ("Warning", "NodeNotReady", msg) in out.events
    kube.nodes["gpu-2"] = True  # the node is back (or the pod was replaced): the condition goes
    scaler._nodes.clear()
    scaler.states["u1"] = replace(scaler.states["u1"], last_decision_time=0.0)
    assert not [c for c in scaler.step(body, SPEC).conditions if c[0] == "NodeNotReady"]


def test_a_node_that_cannot_be_read_is_not_reported():
    from v41flash.controller.observation import PodView, nodes_not_ready, with_node_health
    pods = [PodView(name="d-0", role="decode", ready=False, ip=None, node="n1")]
    assert nodes_not_ready(with_node_health(pods, lambda n: None), ["decode"]) is None
    assert nodes_not_ready(with_node_health(pods, lambda n: False), ["decode"]).startswith("1 decode pod on NotReady node n1")


def test_a_ready_pod_on_a_node_that_reports_notready_is_reported_but_still_counted_ready():
    from v41flash.controller.observation import PodView, nodes_not_ready, with_node_health
    pods = with_node_health([PodView(name="d-0", role="decode", ready=True, ip=None, node="n1"),
                             PodView(name="d-1", role="decode", ready=True, ip=None, node="n2")],
                            {"n1": False, "n2": True}.get)
    assert [p.node_not_ready for p in pods] == [True, False]
    assert nodes_not_ready(pods, ["decode"]).startswith("1 decode pod on NotReady node n1:")


def test_a_flooding_decode_pod_holds_its_role_and_the_reason_names_the_byte_cap(servers):
    """The e2e harness's hostile engine (a 256 MiB /metrics) as the decode pod, through the real scraper and
    planner: decode holds, and lastDecision says why (the byte cap), not only that no pod answered."""
    from e2e.hostile_metrics import serve
    from v41flash.metrics.scrape import DEFAULT_MAX_BYTES
    ip = f"{_NET}.3"
    try:
        srv = serve(ip, 8000, "flood")
    except OSError as exc:
        unavailable(f"cannot bind {ip}:8000 on loopback: {exc}")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        kube = cluster()
        kube.pods[1].status.pod_ip = ip
        scaler = Autoscaler(kube)
        now = time.time()
        seed_history(scaler, {"prefill": busy_page(100, 0.05)}, now - 60)
        body = {**BODY, "status": {**BODY["status"], "decode": {"desiredReplicas": 2, "readyReplicas": 1, "replicas": 1}}}
        out = scaler.step(body, SPEC)
    finally:
        srv.shutdown()
        srv.server_close()
    last = out.status["lastDecision"]
    assert out.desired["decode"] == 2 and last["decode"] == 2 and last["action"] == "hold", last
    assert "no pod of 1 answered its metrics scrape (d-0: " in last["reason"], last["reason"]
    assert f"body over {DEFAULT_MAX_BYTES} bytes" in last["reason"], last["reason"]


# --- during a rollout (docs/decisions/2026-12-01-rollouts.md §8.4) ---------------------------------------------------

def _labelled(p: SimpleNamespace, name: str, ip: str, **labels) -> SimpleNamespace:
    p.metadata = SimpleNamespace(**{**vars(p.metadata), "name": name,
                                    "labels": {**p.metadata.labels, **labels}})
    p.status = SimpleNamespace(**{**vars(p.status), "pod_ip": ip})
    return p


def test_during_a_rollout_the_planner_reads_the_serving_slot_the_front_as_proxy_and_its_router(servers, monkeypatch):
    import v41flash.controller.autoscale as autoscale_mod
    from v41flash.metrics.scrape import proxy_target, router_target
    kube = cluster()  # p-0 / d-0: the serving slot "" (never-rolled layout)
    router = lambda n, ip, **lb: _labelled(pod("r", "router"), n, ip, **lb)  # noqa: E731
    for p in (_labelled(pod("c", "prefill"), "p-a", f"{_NET}.11", **{L.SLOT_LABEL: "a"}),
              _labelled(pod("c", "decode"), "d-a", f"{_NET}.12", **{L.SLOT_LABEL: "a"})):
        p.metadata.owner_references = [SimpleNamespace(kind="ReplicaSet", name=f"x-{p.metadata.labels[L.ROLE_LABEL]}-a-1",
                                                       controller=True)]
        kube.pods.append(p)
    IPS["router"] = f"{_NET}.3"
    try:
        front = router("front-0", f"{_NET}.3", **{L.FRONT_LABEL: "true"})
        r0 = router("router-0-0", f"{_NET}.4", **{L.SLOT_LABEL: "0"})
        ra = router("router-a-0", f"{_NET}.5", **{L.SLOT_LABEL: "a"})
    finally:
        IPS.pop("router")
    for r in (front, r0, ra):
        r.metadata.owner_references = [SimpleNamespace(kind="ReplicaSet", name="x-router-77c", controller=True)]
        kube.pods.append(r)
    seen: list = []

    async def spy(targets, *args, **kwargs):
        seen.extend(targets)
        return []
    monkeypatch.setattr(autoscale_mod, "scrape", spy)
    body = {**BODY, "status": {**BODY["status"], "rollout": {"phase": "Canary", "servingSlot": "",
                                                             "candidateSlot": "a", "candidateRevision": "c" * 10}}}
    Autoscaler(kube).step(body, SPEC)
    assert {t.pod for t in seen} == {"p-0", "d-0", "front-0/proxy", "router-0-0"}
    assert proxy_target("front-0", f"{_NET}.3") in seen and router_target("router-0-0", f"{_NET}.4") in seen


def test_while_a_candidate_exists_scale_downs_are_held_and_the_budget_counts_its_gpus():
    from v41flash.rollout import progress
    from v41flash.planner.datatypes import Decision, PlannerState, RoleDecision
    d = Decision(time=0.0, decode=RoleDecision("decode", 3, 2, "scale_down", "idle"),
                 prefill=RoleDecision("prefill", 1, 2, "scale_up", "ttft"), state=PlannerState())
    held = progress.hold_scale_downs(d, "a rollout's candidate abc exists")
    assert (held.decode.desired, held.decode.action) == (3, "hold") and "candidate abc" in held.decode.reason
    assert held.prefill == d.prefill and held.action == "scale_up"  # a scale-up of the serving slot still goes
    spec = SPEC.model_copy(update={"autoscaling": SPEC.autoscaling.model_copy(update={"gpu_budget": 16})})
    canary = {"rollout": {"phase": "Canary", "candidateSlot": "a"}}
    assert progress.planner_budget(spec, {}) == 16
    assert progress.planner_budget(spec, canary) == 16  # a status without surgeGPUs: one replica per role
    # the default surge is the candidate's full size when the rollout started (status.rollout.surgeGPUs): 2 + 2
    # replicas of 4 GPUs then; the candidate holds 1 + 1 now, so serving may have 16 + 16 - 8 = 24
    grown = {"rollout": {**canary["rollout"], "surgeGPUs": 16, "candidateReplicas": {"prefill": 1, "decode": 1}}}
    assert progress.planner_budget(spec, grown) == 24
    surge = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"max_surge_gpus": 4})})
    assert progress.planner_budget(surge, canary) == 12  # 16 + 4 - 8 held by the candidate
    # a candidate grown to 2 replicas per role holds 16: the serving slot may have 16 + 4 - 16 = 4
    assert progress.planner_budget(surge, {"rollout": {**canary["rollout"],
                                                       "candidateReplicas": {"prefill": 2, "decode": 2}}}) == 4
    # InPlace: one pair handed over (the planner's count still includes it), the candidate at one per role:
    # serving N x 8 - 8 + 8 <= 16 + 4, so N x 8 <= 20
    assert progress.planner_budget(surge, {"rollout": {**canary["rollout"], "inPlace": 1,
                                                       "candidateReplicas": {"prefill": 1, "decode": 1}}}) == 20
    # a status from before candidates were sized: one replica per role plus the hand-over (2 per role)
    assert progress.planner_budget(surge, {"rollout": {**canary["rollout"], "inPlace": 1}}) == 12
    assert progress.planner_budget(surge, {"rollout": {"phase": "Complete", "servingSlot": "a"}}) == 16


def test_no_planner_status_while_no_engine_pod_is_ready_and_the_first_decision_once_one_is(servers):
    """Before any engine pod is Ready there is nothing to observe: a first decision would only write "hold,
    waiting for pods" to status (after a burst of 500 CRs whose pods are Pending: 500 status writes). Nothing
    is decided or written until an engine pod is Ready; then the first decision is made as before."""
    kube = cluster()
    kube.pods = [pod("p-0", "prefill", ready=False), pod("d-0", "decode", ready=False)]
    scaler = Autoscaler(kube)
    starting = {**BODY, "status": {r: {"desiredReplicas": 1, "readyReplicas": 0, "replicas": 1}
                                   for r in ("prefill", "decode")}}
    assert scaler.step(starting, SPEC) is None  # no pass, no status write
    kube.pods = []  # no pod yet at all (the workloads just created)
    assert scaler.step(starting, SPEC) is None
    assert "u1" not in scaler.states and not scaler.histories.get("u1", SnapshotHistory()).pods()
    # pods that cannot come are still the planner's news: the condition and its Warning, no planner fields
    kube.pods = [unschedulable_pod("p-1", "prefill"), pod("d-0", "decode", ready=False)]
    out = scaler.step(starting, SPEC)
    msg = "1 prefill pod unschedulable: Insufficient nvidia.com/gpu"
    assert out.status == {} and out.desired == {}
    assert out.conditions == [("CapacityPending", "Unschedulable", msg)] and out.events == [("Warning", "Unschedulable", msg)]
    recorded = {**starting, "status": {**starting["status"], "conditions": [
        {"type": "CapacityPending", "status": "True", "reason": "Unschedulable", "message": msg}]}}
    assert scaler.step(recorded, SPEC) is None  # the same news is recorded: nothing to write
    kube.pods = [pod("p-0", "prefill", ready=False), pod("d-0", "decode", ready=False)]
    cleared = scaler.step(recorded, SPEC)  # the pod was scheduled: the condition goes (one pass)
    assert cleared.status == {} and cleared.conditions == [] and cleared.events == []
    # one engine pod Ready: the first decision, as before
    kube.pods = [pod("p-0", "prefill", ready=False), pod("d-0", "decode")]
    first = scaler.step(starting, SPEC)
    assert first is not None and first.status["lastDecision"]["action"] == "hold"
    assert set(first.status) == {"slo", "lastDecision", "plannerState"}


def test_a_deployment_that_has_decided_before_still_decides_when_no_engine_pod_is_ready(servers):
    """Every engine down after the planner has run: the planner still decides and says what it saw (status.slo and
    lastDecision do not keep figures from when the engines served)."""
    kube = cluster()
    kube.pods = [pod("p-0", "prefill", ready=False), pod("d-0", "decode", ready=False)]
    scaler = Autoscaler(kube)
    body = {**BODY, "status": {**{r: {"desiredReplicas": 1, "readyReplicas": 0, "replicas": 1}
                                  for r in ("prefill", "decode")},
                               "lastDecision": {"time": "2026-01-01T00:00:00Z", "action": "hold", "reason": "x"}}}
    out = scaler.step(body, SPEC)
    assert out is not None and out.status["lastDecision"]["time"] > "2026-01-01T00:00:00Z"
    assert set(out.status) == {"slo", "lastDecision", "plannerState"}


def test_no_pod_list_before_the_first_decision_while_the_workloads_report_no_pod(servers):
    """A new CR whose workloads report no pod (status.<role>.replicas 0): nothing to list, nothing decided (at 500
    new CRs a pod list each per tick); once a workload reports pods they are listed (CapacityPending needs them)."""
    kube = cluster()
    scaler = Autoscaler(kube)
    none_yet = {**BODY, "status": {r: {"desiredReplicas": 1, "readyReplicas": 0, "replicas": 0} for r in ("prefill", "decode")}}
    assert scaler.step(none_yet, SPEC) is None and listed(kube) == []
    assert scaler.step({**BODY, "status": {}}, SPEC) is None and listed(kube) == []  # no status at all yet
    recorded = {**none_yet, "status": {**none_yet["status"], "conditions": [
        {"type": "CapacityPending", "status": "True", "reason": "Unschedulable", "message": "1 prefill pod ..."}]}}
    cleared = scaler.step(recorded, SPEC)  # the pods went: the condition goes
    assert cleared.conditions == [] and cleared.status == {} and listed(kube) == []
    pods = {**BODY, "status": {**none_yet["status"], "decode": {"desiredReplicas": 1, "readyReplicas": 0, "replicas": 1}}}
    kube.pods = [unschedulable_pod("d-1", "decode")]
    out = scaler.step(pods, SPEC)
    assert len(listed(kube)) == 1 and out.conditions[0][0] == "CapacityPending"


def test_the_planner_runs_with_the_spec_s_autoscaling_knobs(servers, monkeypatch):
    """Every spec.autoscaling number reaches the PlannerConfig the controller plans with (none accepted and
    then ignored): the stabilization windows, the cadence and the moved-sessions hold."""
    import v41flash.controller.autoscale as autoscale_mod
    seen = []
    real = autoscale_mod.plan

    def spy(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(autoscale_mod, "plan", spy)
    spec = SPEC.model_copy(update={"autoscaling": api.AutoscalingSpec.model_validate({
        "intervalSeconds": 45, "scaleUpStabilizationSeconds": 30, "scaleDownStabilizationSeconds": 240,
        "movedSessionsHoldSeconds": 900})})
    Autoscaler(cluster()).step(BODY, spec)
    assert len(seen) == 1
    cfg = seen[0]
    assert (cfg.interval_s, cfg.act.scale_up_stabilization_s, cfg.act.scale_down_stabilization_s,
            cfg.act.moved_sessions_hold_s) == (45, 30, 240, 900)
    default = api.AutoscalingSpec()
    assert default.moved_sessions_hold_seconds == 3600  # defaults.MOVED_SESSIONS_HOLD_SECONDS
    with pytest.raises(ValueError, match="movedSessionsHoldSeconds"):
        api.AutoscalingSpec.model_validate({"movedSessionsHoldSeconds": -1})
