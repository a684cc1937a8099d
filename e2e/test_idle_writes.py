"""At rest, the operator writes nothing: N deployments (N >= 100, V41F_E2E_IDLE_N) whose pods cannot be scheduled
(every node cordoned, as a new user's first try with no free GPUs), once the cluster settled, get no write from
the operator for a window that holds every deployment's drift re-apply and planner passes.

A write is what the objects' own managedFields say the operator wrote (v41flash_bench.writes): a status that
moved, a child changed by a re-apply, an Event. A server-side apply that changed nothing is not one.
"""
from __future__ import annotations

import copy
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from e2e.kit import TIMER_INTERVAL_S, wait_for
from v41flash.api import v1alpha1 as api
from v41flash.controller.config import OperatorConfig
from v41flash.controller.kube import FIELD_MANAGER
from v41flash_bench.writes import namespace_snapshot, settle, summary, writes_by

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "examples" / "aggregated-h200.yaml"
N = int(os.environ.get("V41F_E2E_IDLE_N", "100"))
# every deployment's staggered drift slot (a full re-apply and prune) falls in the window, and every tick's
# observe and planner passes
WINDOW_S = OperatorConfig().drift_every * TIMER_INTERVAL_S + 2 * TIMER_INTERVAL_S


@pytest.fixture
def cordoned(cluster, ns):
    """Every node unschedulable for the test; before they take pods again, the test's deployments and their
    Pending pods are gone (else the next tests would share the cluster with N deployments starting up). The
    namespace goes at once: its controller deletes each kind by collection (the pods first among them), where
    deleting the deployments left their N x 15 children to the garbage collector's chains (195 s in CI)."""
    nodes = {n.metadata.name: bool(n.spec.unschedulable) for n in cluster.core.list_node().items}
    for name in nodes:
        cluster.core.patch_node(name, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        wait_for(lambda: not cluster.kubectl_json("get", "pods", "-n", ns)["items"], 300, f"{ns}'s pods gone")
        for name, was in nodes.items():
            if not was:
                cluster.core.patch_node(name, {"spec": {"unschedulable": False}})


def test_at_rest_n_deployments_get_no_write_from_the_operator(cluster, operator_process, ns, cordoned):
    doc = yaml.safe_load(EXAMPLE.read_text())
    names = [f"idle-{i:03d}" for i in range(N)]

    def create(name: str) -> None:
        cr = copy.deepcopy(doc)
        cr["metadata"] = {"name": name, "namespace": ns}
        cluster.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, cr)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, names))

    def observed() -> bool:
        items = cluster.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL)["items"]
        done = sum(1 for o in items if (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"])
        return done == N or None
    wait_for(observed, 300, f"all {N} deployments observed")

    def take():
        return namespace_snapshot(cluster.api, ns, api.GROUP, api.VERSION, api.PLURAL)
    # the controller-manager creates and counts the pods, the scheduler finds no node, the operator records it
    # (CapacityPending) and applies what the children's first statuses ask for: the window opens once nobody,
    # the operator included, wrote for four ticks. With N deployments on a loaded 2-core machine the operator's
    # first round takes minutes (at N=100, 2026-12-07: each deployment's CapacityPending written 2-3 min after its
    # pods were Pending); an operator that never comes to rest fails here, naming what it kept writing.
    settle(take, "", quiet_s=4 * TIMER_INTERVAL_S, sample_s=TIMER_INTERVAL_S, timeout=600)
    before = take()
    t_before = time.time()
    time.sleep(WINDOW_S)
    after = take()
    ours = writes_by(FIELD_MANAGER, before, after)
    assert ours == [], (f"{len(ours)} objects written by the operator in {WINDOW_S:.0f} s at rest (from "
                        f"{time.strftime('%H:%M:%S', time.gmtime(t_before))}), by what moved: {summary(ours)}; "
                        f"first: {ours[:5]}; what they hold: {_what_moved(ours, before, after)}")
    operator_process.assert_alive()


def _what_moved(ours, before, after, n: int = 4) -> list:
    """The first written CRs' CapacityPending condition before and after, and the first Events' text: what a
    failure needs to say why the operator wrote."""
    def cond(o):
        c = next((c for c in ((o or {}).get("status") or {}).get("conditions") or [] if c.get("type") == "CapacityPending"),
                 None)
        return c and (c.get("message"), c.get("lastTransitionTime"))
    out = []
    for w in [w for w in ours if w.key.startswith("V41FlashDeployment/")][:n]:
        out.append((w.key, "before", cond(before.get(w.key)), "after", cond(after.get(w.key))))
    for w in [w for w in ours if w.key.startswith("Event/")][:n]:
        e = after.get(w.key) or {}
        out.append((w.key, (e.get("involvedObject") or {}).get("name"), e.get("message"),
                    e.get("firstTimestamp") or e.get("eventTime"), e.get("count")))
    return out
