"""Faults on the local control plane: the operator SIGKILLed at random points, kube-apiserver and etcd
restarted, the leader killed or frozen with a standby running. Each test shares the session cluster and
the session operator and leaves both running. Recovery times are printed (the figures live in the README
from these runs and the benchmark); the waits are generous bounds, not targets."""
from __future__ import annotations

import copy
import contextlib
import os
import random
import signal
import time

import pytest
from kubernetes import client

from e2e.nodes import NODE_NOT_READY_LABEL
from e2e.kit import OperatorProcess, wait_for
from e2e.test_autoscale import Load
from e2e.test_operator import REPO, apply, children, condition, get_cr, load, rendered, wait_ready

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "manifests" / "examples" / "aggregated-h200.yaml"
LEASE = ("default", "v41flash-operator")  # the e2e operators' Lease (--leader-election-namespace default)


def lease_holder(cluster) -> str | None:
    try:
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(LEASE[1], LEASE[0])
    except client.ApiException:
        return None
    return lease.spec.holder_identity


def observed(cluster, ns: str, name: str, generation: int) -> bool:
    cr = get_cr(cluster, ns, name)
    return (cr.get("status") or {}).get("observedGeneration") == generation


def change(cluster, ns: str, name: str, max_replicas: int) -> int:
    """A spec change that touches no pod (a replica bound above what runs): the generation to observe."""
    cr = cluster.custom.patch_namespaced_custom_object(
        "v41flash.io", "v1alpha1", ns, "v41flashdeployments", name, {"spec": {"decode": {"maxReplicas": max_replicas}}})
    return cr["metadata"]["generation"]


def pod_uids(cluster, ns: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in cluster.core.list_namespaced_pod(ns).items
            if not p.metadata.deletion_timestamp}


def assert_exact_children(cluster, ns: str, doc: dict, cr: dict) -> None:
    """What runs is what the spec renders: no orphan, no duplicate, pods as desired."""
    live = sorted((o["kind"], o["metadata"]["name"]) for o in children(cluster, ns, doc["metadata"]["name"]))
    assert live == sorted((o["kind"], o["metadata"]["name"]) for o in rendered(doc, ns))
    uid = cr["metadata"]["uid"]
    for o in children(cluster, ns, doc["metadata"]["name"]):
        assert [r["uid"] for r in o["metadata"]["ownerReferences"]] == [uid], o["metadata"]["name"]
    for d in cluster.apps.list_namespaced_deployment(ns).items:
        live_rs = [rs for rs in cluster.apps.list_namespaced_replica_set(ns).items
                   if any(r.uid == d.metadata.uid for r in rs.metadata.owner_references or []) and rs.spec.replicas]
        assert len(live_rs) == 1, f"{d.metadata.name}: {len(live_rs)} ReplicaSets with replicas"
    pods = pod_uids(cluster, ns)
    want = cr["status"]["decode"]["desiredReplicas"] + (cr["status"].get("prefill") or {}).get("desiredReplicas", 0) + 1
    assert len(pods) == want, sorted(pods)


class Background:
    """Closed-loop clients through the deployment's router pod for the length of a `with` block."""

    def __init__(self, cluster, ns: str, name: str, clients: int = 4):
        import threading
        router = next(p for p in cluster.core.list_namespaced_pod(ns, label_selector=f"v41flash.io/deployment={name},"
                                                                                     "v41flash.io/role=router,v41flash.io/front=true").items
                      if not p.metadata.deletion_timestamp)
        sim = cluster.sim_for(router.metadata.name, ns)
        self.load = Load(url=f"http://{sim['ip']}:{sim['port']}")
        self.stop_at = float("inf")
        self.clients = clients
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while time.time() < self.stop_at:
            self.load.run(self.clients, min(5.0, max(0.0, self.stop_at - time.time())))

    def __enter__(self) -> Load:
        self.thread.start()
        wait_for(self._answered, 60, "the first answer through the router")
        return self.load

    def _answered(self) -> bool:
        if self.load.ok:
            return True
        with self.load.lock:  # what a timeout reports: no answer yet, or every request failing, and how
            raise AssertionError(f"{self.load.clients} clients in flight, {len(self.load.failed)} failed; "
                                 f"last failures {self.load.failed[-3:]}")

    def __exit__(self, *exc) -> None:
        self.stop_at = time.time()
        self.thread.join(90)


def test_operator_sigkilled_at_random_points_converges_without_orphans_or_duplicates(cluster, operator_process, ns):
    rng = random.Random(int(os.environ.get("V41F_FAULT_SEED", "13")))
    doc = load(EXAMPLE)
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    kills = int(os.environ.get("V41F_FAULT_KILLS", "20"))
    for i in range(kills):
        # a spec change that rolls the router (its args change): the kill lands during create, the
        # rollout, or a status write
        doc = copy.deepcopy(doc)
        doc["spec"].setdefault("routing", {})["requestTimeoutSeconds"] = 600 + i
        apply(cluster, doc, ns)
        time.sleep(rng.uniform(0.0, 2.0))
        operator_process.restart(sig=signal.SIGKILL)
    cr = wait_ready(cluster, ns, name)
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert_exact_children(cluster, ns, doc, cr)
    operator_process.assert_alive()

    # under client load: SIGKILLs during planner passes and edits that restart no pod; serving never notices
    uids = pod_uids(cluster, ns)
    with Background(cluster, ns, name) as traffic:
        for i in range(kills // 2):
            doc = copy.deepcopy(doc)
            doc["spec"]["decode"]["maxReplicas"] = 3 + i % 2  # a bound above what runs: no pod changes
            apply(cluster, doc, ns)
            time.sleep(rng.uniform(0.0, 2.0))
            operator_process.restart(sig=signal.SIGKILL)
        cr = wait_ready(cluster, ns, name)
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert_exact_children(cluster, ns, doc, cr)
    assert set(uids.items()) <= set(pod_uids(cluster, ns).items())  # nothing recreated (the planner may add one)
    assert traffic.ok > 0 and not traffic.failed, traffic.failed[:5]
    print(f"\n[fault] {kills + kills // 2} SIGKILLs; {traffic.ok} requests answered under load, 0 failed")


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_restart_resumes_without_recreating_anything(cluster, operator_process, ns, component):
    doc = load(EXAMPLE)
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    cr = wait_ready(cluster, ns, name)
    before = pod_uids(cluster, ns)
    restarts_before = operator_process.starts
    rounds = int(os.environ.get("V41F_FAULT_RESTARTS", "3"))
    with Background(cluster, ns, name) as traffic:
        for r in range(rounds):
            cluster.cluster.restart(component, down_seconds=5)
            back = time.monotonic()
            wait_for(cluster.cluster.is_up, 120, f"the cluster answering after the {component} restart")
            print(f"\n[fault] {component} #{r + 1}: apiserver ready {time.monotonic() - back:.1f}s after the restart")
            generation = wait_for(lambda: _try(lambda: change(cluster, ns, name, 3 + r % 2)), 60, "a spec change accepted")
            t0 = time.monotonic()
            wait_for(lambda: observed(cluster, ns, name, generation), 60, "the operator observing the new generation")
            print(f"[fault] {component} #{r + 1}: new generation observed {time.monotonic() - t0:.1f}s after it was "
                  f"applied ({time.monotonic() - back:.1f}s after the restart)")
    assert traffic.ok > 0 and not traffic.failed, traffic.failed[:5]  # serving never depended on the control plane
    assert pod_uids(cluster, ns) == before  # nothing recreated
    cr = get_cr(cluster, ns, name)
    assert_exact_children(cluster, ns, {**doc, "spec": cr["spec"]}, cr)
    operator_process.assert_alive()  # the same process (a lost Lease re-executes it in place: same PID)
    assert operator_process.starts == restarts_before


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def _non_get_requests(op: OperatorProcess) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(op.metrics_url, timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "v41flash_api_requests_total" and s.labels.get("verb") not in ("GET",))


@contextlib.contextmanager
def _standby_beside_leader(cluster, operator_process: OperatorProcess, ns: str, doc: dict):
    """The session operator leading, a second replica standing by, the example Ready; afterwards the
    session operator runs again (it may have been killed) and leads once the standby stopped cleanly."""
    wait_for(lambda: lease_holder(cluster) == operator_process.identity, 60, "the session operator leading")
    standby = OperatorProcess(cluster, name="operator-standby").start()
    try:
        wait_for(lambda: "standby" in standby.log_text(), 30, "the second replica standing by")
        apply(cluster, doc, ns)
        wait_ready(cluster, ns, doc["metadata"]["name"])
        yield standby
    finally:
        if not operator_process.alive:
            operator_process.start()  # now the standby
        standby.stop()  # a clean stop releases the Lease: the session operator takes over at its next retry
    wait_for(lambda: lease_holder(cluster) == operator_process.identity, 30, "the session operator leading again")


def test_standby_takes_over_when_the_leader_dies_and_wrote_nothing_before(cluster, operator_process, ns):
    doc = load(EXAMPLE)
    name = doc["metadata"]["name"]
    with _standby_beside_leader(cluster, operator_process, ns, doc) as standby:
        # a standby reads its Lease and writes nothing (its /metrics may come up a moment after it logs)
        assert wait_for(lambda: _try(lambda: _non_get_requests(standby) + 1), 30, "the standby's /metrics") == 1
        operator_process.stop(sig=signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: lease_holder(cluster) == standby.identity, 60, "the standby taking the Lease")
        took = time.monotonic() - killed
        generation = change(cluster, ns, name, 3)
        wait_for(lambda: observed(cluster, ns, name, generation), 60, "the new leader reconciling")
        print(f"\n[fault] leader SIGKILLed: standby leads after {took:.1f}s, reconciles a change "
              f"{time.monotonic() - killed:.1f}s after the kill")


def test_a_frozen_leader_is_deposed_and_stops_before_the_new_one_writes(cluster, operator_process, ns):
    """SIGSTOP the leader past its lease: the standby takes over; on SIGCONT the old leader finds its term
    over and restarts itself as a candidate without one more write."""
    doc = load(EXAMPLE)
    name = doc["metadata"]["name"]
    with _standby_beside_leader(cluster, operator_process, ns, doc) as standby:
        os.killpg(operator_process.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: lease_holder(cluster) == standby.identity, 60, "the standby taking the Lease")
            generation = change(cluster, ns, name, 3)
            wait_for(lambda: observed(cluster, ns, name, generation), 60, "the new leader reconciling")
            mark = len(operator_process.log_text())
        finally:
            os.killpg(operator_process.pid, signal.SIGCONT)
        wait_for(lambda: "lost Lease" in operator_process.log_text()[mark:], 30, "the old leader noticing")
        after = operator_process.log_text()[mark:]
        lost_at = after.index("lost Lease")
        assert "reconciled" not in after[:lost_at], after[:lost_at][-2000:]  # no pass finished before it stopped
        wait_for(lambda: "standby" in operator_process.log_text()[mark:], 60, "the old leader standing by")
        assert lease_holder(cluster) == standby.identity
        operator_process.assert_alive()  # re-executed in place (same PID), now a candidate


def test_the_documented_command_needs_no_kubeconfig_variable(operator_process):
    """The session operator runs as the README says (`v41flash operator --kubeconfig PATH`) with no
    KUBECONFIG in its environment; every test above ran against it."""
    env = open(f"/proc/{operator_process.pid}/environ", "rb").read().split(b"\0")
    assert not [e for e in env if e.startswith(b"KUBECONFIG=")]
    assert "--kubeconfig" in operator_process.argv
    operator_process.assert_alive()


def _node_ready(cluster, node: str) -> bool:
    n = cluster.core.read_node(node)
    return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) and not [
        t for t in n.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]


def test_a_node_going_notready_is_reported_and_its_engine_replaced_on_the_remaining_capacity(
        cluster, operator_process, ns):
    """kwok's chaos stage fails one node (its kubelet reports Ready False): the node lifecycle controller
    taints it NoExecute; the deployment says which pod on which node (NodeNotReady) and Warns; Kubernetes
    evicts the pod when its toleration ends, the replacement runs on another node and the deployment is
    Ready again; the condition goes."""
    from datetime import datetime, timezone
    doc = load(EXAMPLE)
    name = doc["metadata"]["name"]
    doc["spec"]["gpu"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
          for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"))]
    doc["spec"]["autoscaling"] = {"intervalSeconds": 5}
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)
    selector = f"v41flash.io/deployment={name},v41flash.io/role=decode"
    (engine,) = [p for p in cluster.core.list_namespaced_pod(ns, label_selector=selector).items
                 if not p.metadata.deletion_timestamp]
    node = engine.spec.node_name
    cluster.core.patch_node(node, {"metadata": {"labels": {NODE_NOT_READY_LABEL: "true"}}})
    t0 = time.monotonic()
    try:
        def reported():
            c = condition(get_cr(cluster, ns, name), "NodeNotReady")
            return c if c and c["status"] == "True" else None
        c = wait_for(reported, 90, "the NodeNotReady condition")
        assert c["message"].startswith(f"1 decode pod on NotReady node {node}:"), c["message"]
        print(f"\n[fault] node {node} NotReady: reported after {time.monotonic() - t0:.1f}s: {c['message']}")

        def replaced():
            pods = [p for p in cluster.core.list_namespaced_pod(ns, label_selector=selector).items
                    if not p.metadata.deletion_timestamp]
            return bool(pods) and all(p.spec.node_name and p.spec.node_name != node for p in pods)
        wait_for(replaced, 150, "the engine evicted and replaced on another node")
        wait_for(lambda: condition(get_cr(cluster, ns, name), "NodeNotReady") is None, 60,
                 "NodeNotReady gone once the pod on the failed node is gone")
        cr = wait_ready(cluster, ns, name, timeout=120)
        print(f"[fault] node {node} NotReady: Ready again on the remaining capacity after {time.monotonic() - t0:.1f}s")
        assert cr["status"]["decode"]["readyReplicas"] == 1
        assert engine.metadata.uid not in {p.metadata.uid for p in cluster.core.list_namespaced_pod(ns).items
                                          if not p.metadata.deletion_timestamp}
    finally:  # the node recovers: the label goes and its kubelet (kwok) reports Ready again
        cluster.core.patch_node(node, {"metadata": {"labels": {NODE_NOT_READY_LABEL: None}}})
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.core.patch_node_status(node, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e: the node recovered",
             "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
        wait_for(lambda: _node_ready(cluster, node), 120, f"node {node} Ready and untainted again")
