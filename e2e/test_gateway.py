"""spec.routing.mode: Gateway on the real control plane, through a real Envoy (e2e/gateway.py) programmed from the
operator's HTTPRoute like a Gateway controller programs its proxies:

1. with prefill (TP4 Deployments; and wide-EP DEP16 decode as a LeaderWorkerSet over 4 nodes, the sidecar in its
   leader pod): the CR becomes Ready (endpoint picker Ready by its gRPC health probe, decode pods Ready by their
   routing sidecar), and a chat completion through Envoy -> the picker (ext_proc) -> the decode pod's routing
   sidecar reaches a prefill and a decode simulator of the deployment (their request counters move);
2. the InferencePool CRD missing: the CR reports it as a condition naming the kind, the operator keeps running,
   and the deployment becomes Ready once the CRDs are back;
3. a rollout under steady load through Envoy: 0 failed requests, the new revision serving at the end; the same
   through the user's own HTTPRoute on the front pool (no operator route: steps [100], blue/green on the pool),
   and there a candidate over the TTFT gate rolled back, the front pool back on the serving slot;
4. the endpoint picker SIGKILLed under load: restarted as kubelet restarts a container, its pod out of Ready until
   the startup and readiness probes pass again, requests failing only while it is down (FailClose), the
   deployment Ready again;
5. a scorer weight changed under load: the picker pod replaced (surge first) with the new plugins file, the engines
   untouched; and during a canary, the rollout going on to complete with a replaced picker carrying the weight;
6. routing.mode switched on a running deployment: refused at admission with the default canary strategy (a canary
   cannot split traffic across two front doors); with Recreate, VllmRouter -> Gateway -> VllmRouter, each time the
   new front door serves and the old one's objects are pruned (no router pod left behind a Gateway, no picker,
   pool or HTTPRoute behind a router).

The Gateway (`e2e-gateway`, one per namespace, all on one Envoy) is started once for the module.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.gateway import CONTROLLER_NAME, GATEWAY_NAME, GatewayProcess, install_gie_crds, remove_gie_crds
from e2e.kit import LoadThreads, wait_for
from e2e.test_operator import apply, children, condition, get_cr, wait_ready

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "manifests/examples/tp4-h200-pd-gateway.yaml"
REVISION = "v41flash.io/serving-revision"
ROLLOUT = {"steps": [50, 100], "stepSeconds": 8, "minRequestsPerStep": 5, "progressDeadlineSeconds": 60,
           "drainDeadlineSeconds": 20}


@pytest.fixture(scope="module")
def gateway(cluster):
    from e2e.tools import Tools
    tools = Tools.load()
    missing = [str(p) for p in (tools.epp, tools.pd_sidecar) if not p.exists()]
    if missing:
        pytest.fail(f"mode Gateway's binaries are not built: {missing}; run `e2e/build-tools.sh epp pd-sidecar`")
    gw = GatewayProcess(cluster.cluster).start()
    yield gw
    gw.stop()


def gateway_doc(name: str = "gw") -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["routing"]["gateway"]["httpRoute"] = {"name": GATEWAY_NAME}
    return doc


def model(doc: dict) -> str:
    return doc["spec"]["model"].get("servedModelName") or doc["spec"]["model"]["checkpoint"]


def served(entry: dict) -> float:
    """Requests a simulator counted (vllm:request_success_total), read from its own port."""
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"http://{entry['ip']}:{entry['port']}/metrics", timeout=5).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name in ("vllm:request_success", "vllm:request_success_total"))


def sims(cluster, ns: str, name: str, revision: str | None = None) -> dict[str, list[dict]]:
    """The simulators (kind sim: the engines themselves, not the sidecar in front) of the deployment's engine
    pods by role, of one revision when given."""
    sel = f"v41flash.io/deployment={name},v41flash.io/serving=true" + (f",{REVISION}={revision}" if revision else "")
    pods = {p.metadata.name: p.metadata.labels["v41flash.io/role"]
            for p in cluster.core.list_namespaced_pod(ns, label_selector=sel).items if not p.metadata.deletion_timestamp}
    out: dict[str, list[dict]] = {}
    for s in cluster.supervised(ns, kind="sim"):
        if s["pod"] in pods:
            out.setdefault(pods[s["pod"]], []).append(s)
    return out


def pods_ready(cluster, ns: str, name: str, roles: tuple[str, ...]) -> bool:
    """At least one pod of each role, and every pod of those roles Ready."""
    pods = [p for p in cluster.core.list_namespaced_pod(ns, label_selector=f"v41flash.io/deployment={name}").items
            if not p.metadata.deletion_timestamp and p.metadata.labels.get("v41flash.io/role") in roles]
    ready = lambda p: any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))  # noqa: E731
    return {p.metadata.labels["v41flash.io/role"] for p in pods} == set(roles) and all(ready(p) for p in pods)


def chat(base: str, doc: dict, text: str, client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": model(doc), "max_tokens": 8,
            "messages": [{"role": "user", "content": f"{text}: " + "plan the change step by step " * 8}]}
    return (client or httpx).post(f"{base}/v1/chat/completions", json=body, timeout=30)


def route_status(cluster, ns: str, name: str) -> dict[str, dict]:
    route = cluster.kubectl_json("get", "httproutes.gateway.networking.k8s.io", f"{name}-route", "-n", ns)
    parents = [p for p in (route.get("status") or {}).get("parents") or [] if p.get("controllerName") == CONTROLLER_NAME]
    return {c["type"]: c for p in parents for c in p.get("conditions") or []}


def in_phase(cluster, ns: str, name: str, phase: str, replacing: str | None = None) -> dict | None:
    """The CR once its status.rollout is in `phase` (and, with `replacing`, serves another revision), else None."""
    cr = get_cr(cluster, ns, name)
    st = cr.get("status") or {}
    if (st.get("rollout") or {}).get("phase") != phase or (replacing and st.get("servingRevision") == replacing):
        return None
    return cr


def test_gateway_mode_with_prefill_is_ready_and_a_completion_through_envoy_reaches_prefill_and_decode(
        cluster, operator_process, gateway, ns):
    doc = gateway_doc()
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    # the data path first (pods Ready as kubelet would set them), the CR's own Ready last: a failure says which
    # side is missing. The picker's pod is Ready by its grpc probe, through the forwarder on the pod IP.
    wait_for(lambda: pods_ready(cluster, ns, name, ("prefill", "decode", "epp")), 120,
             "the prefill, decode and endpoint-picker pods Ready")
    assert {s["kind"] for s in cluster.supervised(ns, role="epp")} == {"epp", "fwd"}
    decode_kinds = {s["kind"] for s in cluster.supervised(ns, role="decode")}
    assert decode_kinds == {"sidecar", "sim"}, decode_kinds
    by_role = sims(cluster, ns, name)
    assert set(by_role) == {"prefill", "decode"}, by_role
    before = {role: sum(served(s) for s in ss) for role, ss in by_role.items()}

    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    resp = wait_for(lambda: (lambda r: r if r.status_code == 200 else None)(chat(base, doc, "hello")), 90,
                    "a 200 through Envoy, the endpoint picker and the routing sidecar")
    assert resp.json()["choices"][0]["message"]["content"]
    # one request, P/D: the decode pod's sidecar sent it to a prefill pod first, then decoded locally
    wait_for(lambda: all(sum(served(s) for s in by_role[role]) > before[role] for role in by_role), 20,
             "the prefill and the decode simulator both counting the request")
    # the route's status, as a Gateway controller writes it
    conds = wait_for(lambda: (lambda c: c if c.get("ResolvedRefs", {}).get("status") == "True" else None)(
        route_status(cluster, ns, name)), 30, "HTTPRoute status ResolvedRefs")
    assert conds["Accepted"]["status"] == "True", conds
    # paths outside the route are not served (Envoy's 404: the route's matches are programmed, not a catch-all)
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 404
    # the operator's view: Ready (from the endpoint picker and the engines; mode Gateway runs no router)
    wait_ready(cluster, ns, name, timeout=60)


def test_gateway_mode_with_multi_node_decode_serves_through_the_leader_s_sidecar(cluster, operator_process, gateway,
                                                                                ns):
    """The DEP16 decode of the GB300 example as a LeaderWorkerSet (leader + 3 workers): the routing sidecar runs
    in the leader pod only (the group's API server), and a completion through Envoy reaches the prefill and the
    decode simulators."""
    doc = yaml.safe_load((REPO / "manifests/examples/gb300-pd-dep4-dep16.yaml").read_text())
    doc["metadata"]["name"] = "wide"
    doc["spec"]["routing"] = {"mode": "Gateway", "gateway": {"httpRoute": {"name": GATEWAY_NAME}}}
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    wait_for(lambda: pods_ready(cluster, ns, name, ("prefill", "decode", "epp")), 180,
             "the prefill pod, the decode group and the endpoint picker Ready")
    decode = {p.metadata.name: p for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=decode").items}
    assert len(decode) == 4, sorted(decode)  # one group: the leader and 3 workers
    sidecars = {s["pod"] for s in cluster.supervised(ns, role="decode", kind="sidecar")}
    leaders = {n for n, p in decode.items() if (p.metadata.labels or {}).get("leaderworkerset.sigs.k8s.io/worker-index")
               == "0"}
    assert sidecars == leaders and len(leaders) == 1, (sidecars, leaders)
    by_role = sims(cluster, ns, name)
    before = {role: sum(served(s) for s in ss) for role, ss in by_role.items()}
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: (lambda r: r if r.status_code == 200 else None)(chat(base, doc, "wide")), 90,
             "a 200 through Envoy, the picker and the decode leader's sidecar")
    wait_for(lambda: all(sum(served(s) for s in by_role[role]) > before[role] for role in ("prefill", "decode")), 20,
             "the prefill and the decode simulator both counting the request")
    wait_ready(cluster, ns, name, timeout=120)


def test_missing_inferencepool_crd_is_a_condition_and_the_deployment_recovers_once_installed(
        cluster, operator_process, gateway, ns):
    doc = gateway_doc("nocrd")
    name = doc["metadata"]["name"]
    remove_gie_crds(cluster.cluster)
    try:
        apply(cluster, doc, ns)

        def reported():
            cr = get_cr(cluster, ns, name)
            conds = [c for c in (cr.get("status") or {}).get("conditions") or []
                     if c.get("status") == "True" and "InferencePool" in (c.get("message") or "")]
            return conds if cr["status"].get("observedGeneration") == cr["metadata"]["generation"] else None
        conds = wait_for(reported, 60, "a condition naming the missing InferencePool kind")
        print(f"\n[missing CRD] conditions: {conds}")
        assert any(c["type"] == "Stalled" for c in conds), conds
        ready = condition(get_cr(cluster, ns, name), "Ready") or {}
        assert ready.get("status") != "True", ready
        operator_process.assert_alive()
    finally:
        install_gie_crds(cluster.cluster)
    # level-triggered: with the CRDs back, the stall clears, the pool is applied, and the deployment becomes Ready
    wait_for(lambda: not any(c.get("status") == "True" for c in [condition(get_cr(cluster, ns, name), "Stalled") or {}]),
             60, "the Stalled condition cleared once the CRDs are installed")
    wait_for(lambda: cluster.kubectl("get", "inferencepools.inference.networking.k8s.io", f"{name}-pool", "-n", ns,
                                     check=False).returncode == 0, 60, "the InferencePool applied")
    wait_ready(cluster, ns, name)
    operator_process.assert_alive()


class GatewayLoad(LoadThreads):
    """`workers` threads sending chat completions through the Gateway; every response recorded."""

    def __init__(self, base: str, doc: dict, workers: int = 3):
        super().__init__(workers)
        self.base, self.doc = base, doc

    def _worker(self, w: int) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                rec = {"t0": time.time()}
                try:
                    r = chat(self.base, self.doc, f"w{w}-{uuid.uuid4().hex[:8]}", client)
                    rec.update(status=r.status_code, body=r.text[:200] if r.status_code != 200 else "",
                               pod=r.headers.get("x-inference-pod", ""))  # the decode pod the picker chose
                except httpx.HTTPError as exc:
                    rec.update(status=0, body=f"{type(exc).__name__}: {exc}")
                rec["t1"] = time.time()
                self.record(rec)


def own_route(name: str, ns: str, pool: str) -> dict:
    """What a platform team writes itself: the OpenAI paths on the shared Gateway to the deployment's front pool."""
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": GATEWAY_NAME}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1/"}}],
                                "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                 "name": pool}]}]}}


@pytest.mark.parametrize("route", ["operator", "own"])
def test_a_rollout_in_gateway_mode_serves_every_request_through_envoy(cluster, operator_process, gateway, ns, route):
    """With the operator's HTTPRoute the canary's share is the route's weight; with the user's own route on the
    front pool (the CRD then asks for steps [100]) the front pool moves to the candidate for its judged step."""
    doc = gateway_doc("roll" if route == "operator" else "own")
    doc["spec"]["rollout"] = dict(ROLLOUT)
    name = doc["metadata"]["name"]
    if route == "own":
        doc["spec"]["routing"]["gateway"].pop("httpRoute")
        refused = apply(cluster, doc, ns, check=False)  # the default steps would never get the candidate traffic
        assert refused.returncode != 0 and "spec.rollout.steps" in refused.stderr, refused.stderr
        doc["spec"]["rollout"]["steps"] = [100]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(own_route("mine", ns, f"{name}-pool")))
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, doc, "warm").status_code == 200, 90, "a 200 through the Gateway")
    old_decode = {p.metadata.name for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=decode").items}
    with GatewayLoad(base, doc) as load:
        load.wait_requests(8)
        doc["spec"]["model"]["revision"] = "e2e-1017"
        apply(cluster, doc, ns)
        cr = wait_for(lambda: in_phase(cluster, ns, name, "Complete", replacing=old), 300,
                      "the rollout in mode Gateway to complete")
        new = cr["status"]["servingRevision"]
        wait_for(lambda: {p.metadata.labels[REVISION] for p in cluster.core.list_namespaced_pod(
            ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/serving=true").items
            if not p.metadata.deletion_timestamp} == {new}, 90, "only the new revision's engine pods left")
        load.wait_requests(8)
    print(f"\n[gateway rollout] {len(load.records)} requests, {len(load.failures())} failed; {old} -> {new}")
    assert load.failures() == [], load.failures()[:10]
    # both revisions served through the Gateway (the HTTPRoute's split, then the promoted pool alone)
    new_decode = {s["pod"] for s in sims(cluster, ns, name, new).get("decode", [])}
    pods = {r.get("pod") for r in load.records}
    assert pods & old_decode and pods & new_decode, (pods, old_decode, new_decode)
    # no request crossed revisions: the new revision's prefill and decode simulators counted the same requests
    # (every request is P/D here: prefillThresholdTokens 0), and some
    by_role = sims(cluster, ns, name, new)
    counted = {role: sum(served(s) for s in by_role.get(role, [])) for role in ("prefill", "decode")}
    assert counted["decode"] > 0 and counted["prefill"] == counted["decode"], counted


def test_a_failing_blue_green_step_through_the_users_own_route_moves_the_front_pool_back(
        cluster, operator_process, gateway, ns):
    """Without the operator's HTTPRoute the judged step (steps [100]) gives the candidate the whole front pool; a
    candidate over the TTFT gate is rolled back, the pool selects the serving slot's pods again, and every request
    through the user's route is served."""
    doc = gateway_doc("bgback")
    name = doc["metadata"]["name"]
    doc["spec"]["routing"]["gateway"].pop("httpRoute")
    doc["spec"]["rollout"] = {**ROLLOUT, "steps": [100]}
    doc["spec"]["slo"]["ttft"] = {"targetSeconds": 1.0, "percentile": 90}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(own_route("mine", ns, f"{name}-pool")))
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, doc, "warm").status_code == 200, 90, "a 200 through the Gateway")
    old_decode = {s["pod"] for s in sims(cluster, ns, name, old)["decode"]}
    with GatewayLoad(base, doc) as load:
        load.wait_requests(8)
        doc["spec"]["model"]["revision"] = "e2e-slow"
        doc["spec"]["prefill"]["extraEnv"] = [{"name": "V41F_SIM_ARGS", "value": "--v41f-latency-factor=150"}]
        apply(cluster, doc, ns)
        cr = wait_for(lambda: in_phase(cluster, ns, name, "RolledBack"), 240, "the candidate over the gate rolled back")
        wait_for(lambda: {p.metadata.labels[REVISION] for p in cluster.core.list_namespaced_pod(
            ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/serving=true").items
            if not p.metadata.deletion_timestamp} == {old}, 120, "only the serving revision's engine pods left")
        since = time.time()
        load.wait_requests(8)
    print(f"\n[blue/green rollback] {len(load.records)} requests, {len(load.failures())} failed")
    assert load.failures() == [], load.failures()[:10]
    stalled = condition(cr, "Stalled") or {}
    assert stalled.get("reason") == "GateFailed" and "TTFT p90" in stalled.get("message", ""), stalled
    assert cr["status"]["servingRevision"] == old
    # the candidate had the front pool for its judged step, and the serving slot has it again after the rollback
    assert {r.get("pod") for r in load.records} - old_decode, "no request reached the candidate during its step"
    later = {r.get("pod") for r in load.records if r["t0"] > since}
    assert later and later <= old_decode, (later, old_decode)


def router_chat(cluster, ns: str, name: str, doc: dict) -> httpx.Response | None:
    """A chat completion through the deployment's front (Envoy's port), None while it has none."""
    pods = [p for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=router").items
        if not p.metadata.deletion_timestamp]
    entry = next((s for s in cluster.supervised(ns) for p in pods if s["pod"] == p.metadata.name
                  and s["kind"] == "front"), None)
    if entry is None:
        return None
    r = chat(f"http://{entry['ip']}:{entry['port']}", doc, "through the router")
    return r if r.status_code == 200 else None


def kinds_of(cluster, ns: str, name: str) -> dict[str, set[str]]:
    """The deployment's live children: kind -> names."""
    out: dict[str, set[str]] = {}
    for item in children(cluster, ns, name):
        out.setdefault(item["kind"], set()).add(item["metadata"]["name"])
    return out


def test_switching_routing_mode_on_a_running_deployment_moves_the_front_door_and_prunes_the_old_one(
        cluster, operator_process, gateway, ns):
    gw_doc = gateway_doc("switch")
    name = gw_doc["metadata"]["name"]
    router_doc = yaml.safe_load(yaml.safe_dump(gw_doc))
    router_doc["spec"]["routing"] = {"mode": "VllmRouter"}
    apply(cluster, router_doc, ns)
    wait_ready(cluster, ns, name)
    wait_for(lambda: router_chat(cluster, ns, name, router_doc), 90, "a 200 through the router")
    first = kinds_of(cluster, ns, name)
    assert f"{name}-router" in first.get("Deployment", set()), first
    assert "InferencePool" not in first and "HTTPRoute" not in first, first

    # a canary cannot carry the switch (two front doors, no split between them): refused at admission, naming the
    # field, and nothing changes
    refused = apply(cluster, gw_doc, ns, check=False)
    assert refused.returncode != 0 and "spec.routing.mode" in refused.stderr and "Recreate" in refused.stderr, \
        refused.stderr
    assert get_cr(cluster, ns, name)["spec"]["routing"]["mode"] == "VllmRouter"

    # VllmRouter -> Gateway with Recreate: the picker and its pool serve, the router's objects go
    for d in (gw_doc, router_doc):
        d["spec"]["rollout"] = {"strategy": "Recreate"}
    apply(cluster, gw_doc, ns)
    cr = wait_ready(cluster, ns, name)
    assert (cr["status"].get("router") or {}).get("inferencePool") == f"{name}-pool", cr["status"].get("router")
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, gw_doc, "after the switch").status_code == 200, 90, "a 200 through the Gateway")

    def router_gone():
        k = kinds_of(cluster, ns, name)
        routers = [p for p in cluster.core.list_namespaced_pod(
            ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=router").items]
        return k if f"{name}-router" not in k.get("Deployment", set()) and not routers else None
    second = wait_for(router_gone, 60, "the router's Deployment and pods pruned in mode Gateway")
    assert f"{name}-pool" in second.get("InferencePool", set()), second  # the front pool, beside the slot's
    assert f"{name}-route" in second.get("HTTPRoute", set()), second
    print(f"\n[mode switch] in Gateway mode: {sorted((k, sorted(v)) for k, v in second.items())}")

    # Gateway -> VllmRouter: the router serves again, nothing of mode Gateway is left
    apply(cluster, router_doc, ns)
    cr = wait_ready(cluster, ns, name)
    assert not (cr["status"].get("router") or {}).get("inferencePool"), cr["status"].get("router")
    wait_for(lambda: router_chat(cluster, ns, name, router_doc), 90, "a 200 through the router again")

    def gateway_gone():
        k = kinds_of(cluster, ns, name)
        pickers = [p for p in cluster.core.list_namespaced_pod(
            ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=epp").items]
        left = {kind: names for kind, names in k.items() if kind in ("InferencePool", "HTTPRoute")}
        left["picker"] = {d for d in k.get("Deployment", set()) if "-epp" in d} | {p.metadata.name for p in pickers}
        return k if not any(left.values()) else None
    third = wait_for(gateway_gone, 60, "the pickers, pools and HTTPRoute pruned back in mode VllmRouter")
    assert f"{name}-router" in third.get("Deployment", set()), third
    operator_process.assert_alive()


def test_a_picker_killed_under_load_is_restarted_and_serving_resumes(cluster, operator_process, gateway, ns):
    doc = gateway_doc("crash")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, doc, "warm").status_code == 200, 90, "a 200 through the Gateway")
    (picker,) = cluster.supervised(ns, role="epp", kind="epp")
    picker_pod = picker["pod"]
    picker_ready = lambda: pods_ready(cluster, ns, name, ("epp",))  # noqa: E731 - its one pod

    with GatewayLoad(base, doc) as load:
        load.wait_requests(6)
        before = len(load.records)
        killed_at = time.time()
        os.kill(picker["pid"], signal.SIGKILL)  # a crash: no SIGTERM, no preStop
        wait_for(lambda: not picker_ready(), 30, "the picker's pod out of Ready while its process is down")
        restarted = wait_for(lambda: next((s for s in cluster.supervised(ns, role="epp", kind="epp")
                                           if s["pid"] != picker["pid"]), None), 60, "the picker restarted")
        wait_for(picker_ready, 90, "the restarted picker Ready (startup probe, then gRPC health)")
        ready_at = time.time()
        wait_for(lambda: sum(1 for r in list(load.records) if r["status"] == 200 and r["t0"] > ready_at) >= 10, 60,
                 "10 requests answered through the restarted picker")
    late = [r for r in load.failures() if r["t0"] > ready_at + 5]  # Envoy's endpoint updates trail by a beat
    down = [r for r in load.records[before:] if r["status"] != 200]
    first_ok = min(r["t0"] for r in load.records[before:] if r["status"] == 200 and r["t0"] > killed_at)
    print(f"\n[picker crash] restart #{restarted.get('restarts')}; Ready again {ready_at - killed_at:.1f}s after the "
          f"kill, first 200 {first_ok - killed_at:.1f}s after; {len(down)} of {len(load.records) - before} requests "
          f"failed since the kill (clients retrying at once), none 5 s after Ready")
    assert late == [], late[:5]
    assert [r for r in load.records[:before] if r["status"] != 200] == []
    assert restarted["pod"] == picker_pod and restarted["restarts"] >= 1  # the same pod: a container restart
    wait_ready(cluster, ns, name, timeout=60)
    operator_process.assert_alive()


def picker_config(entry: dict) -> dict:
    """The plugins file the picker process was started with (its --config-file)."""
    argv = entry["argv"]
    return yaml.safe_load(Path(argv[argv.index("--config-file") + 1]).read_text())


def active_weight(cfg: dict) -> int:
    """The active-request scorer's weight in a picker's plugins file."""
    return next(ref["weight"] for prof in cfg["schedulingProfiles"] for ref in prof["plugins"]
                if ref["pluginRef"] == "active-request-scorer")


def test_a_scorer_weight_change_replaces_the_picker_under_load(cluster, operator_process, gateway, ns):
    doc = gateway_doc("weights")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    revision = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, doc, "warm").status_code == 200, 90, "a 200 through the Gateway")
    (old,) = cluster.supervised(ns, role="epp", kind="epp")
    engines = {p.metadata.name for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/serving=true").items}
    assert active_weight(picker_config(old)) == 2
    with GatewayLoad(base, doc) as load:
        load.wait_requests(6)
        doc["spec"]["routing"]["gateway"]["activeRequestWeight"] = 3
        apply(cluster, doc, ns)
        new = wait_for(lambda: next((s for s in cluster.supervised(ns, role="epp", kind="epp")
                                     if s["pod"] != old["pod"]), None), 90, "a new picker pod")
        wait_for(lambda: [s["pod"] for s in cluster.supervised(ns, role="epp", kind="epp")] == [new["pod"]], 90,
                 "the old picker gone, the new one serving")
        load.wait_requests(10)
    print(f"\n[picker config] {len(load.records)} requests, {len(load.failures())} failed; {old['pod']} -> "
          f"{new['pod']}")
    assert active_weight(picker_config(new)) == 3
    assert load.failures() == [], load.failures()[:5]
    cr = wait_ready(cluster, ns, name, timeout=60)
    assert cr["status"]["servingRevision"] == revision  # a picker setting is no new revision
    assert {p.metadata.name for p in cluster.core.list_namespaced_pod(
        ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/serving=true").items} == engines


def test_a_scorer_weight_change_mid_rollout_replaces_the_picker_and_the_rollout_completes(
        cluster, operator_process, gateway, ns):
    """A picker setting changed during a canary (the operator's HTTPRoute splitting traffic over two pools): no new
    revision, the rollout goes on to complete on the same candidate, its picker replaced (surge first) with the new
    weight, every request served."""
    doc = gateway_doc("midroll")
    doc["spec"]["rollout"] = dict(ROLLOUT)
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    base = wait_for(lambda: gateway.address(ns), 60, f"Gateway {ns}/{GATEWAY_NAME} programmed")
    wait_for(lambda: chat(base, doc, "warm").status_code == 200, 90, "a 200 through the Gateway")
    with GatewayLoad(base, doc) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-midroll"
        apply(cluster, doc, ns)
        candidate = wait_for(lambda: in_phase(cluster, ns, name, "Canary"), 180,
                             "the candidate's canary step")["status"]["rollout"]["candidateRevision"]
        pickers = {s["pod"] for s in cluster.supervised(ns, role="epp", kind="epp")}
        assert len(pickers) == 2, pickers  # the serving slot's and the candidate's
        doc["spec"]["routing"]["gateway"]["activeRequestWeight"] = 3
        apply(cluster, doc, ns)
        cr = wait_for(lambda: in_phase(cluster, ns, name, "Complete", replacing=old), 240,
                      "the rollout to complete after the picker change")
        (picker,) = wait_for(lambda: (lambda s: s if len(s) == 1 else None)(
            cluster.supervised(ns, role="epp", kind="epp")), 90, "one picker left (the serving slot's)")
        load.wait_requests(8)
    print(f"\n[picker change mid-rollout] {len(load.records)} requests, {len(load.failures())} failed")
    assert load.failures() == [], load.failures()[:10]
    assert cr["status"]["servingRevision"] == candidate  # the picker change replaced no candidate
    assert picker["pod"] not in pickers
    assert active_weight(picker_config(picker)) == 3
