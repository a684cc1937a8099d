"""Capacity that cannot arrive: more prefill replicas than the cluster's free H200 GPUs. The pods that no
node can take are Pending (PodScheduled=False, Insufficient nvidia.com/gpu); the operator says so in a
CapacityPending condition and an Unschedulable Event, and does not count them as capacity on its way.
Once the bounds let the planner decide and the need is below the fleet, its first scale-down cancels the
Pending pods, all at once, and no Ready one (the ReplicaSet deletes unscheduled pods first)."""
from __future__ import annotations

import pytest
import yaml

from e2e.kit import wait_for

pytestmark = pytest.mark.e2e

NAME = "pending"
H200_GPUS = 4 * 8  # e2e/harness.py NODE_POOLS: 4 H200 HGX nodes, 8 GPUs each
PREFILL = H200_GPUS // 4 + 1  # TP4 replicas: one more than fit


def test_unschedulable_prefill_pods_show_in_a_condition_and_an_event(cluster, operator_process, ns):
    # the count of Ready and Pending pods below is the cluster's H200 GPUs: an earlier test's engine pods, still
    # terminating (the harness runs their preStop and grace period as a kubelet would), must have left them
    wait_for(lambda: not [p for p in cluster.kubectl_json("get", "pods", "-A", "-l",
                                                          "v41flash.io/role in (prefill,decode)")["items"]
                          if p["metadata"]["namespace"] != ns], 180, "other tests' engine pods gone")
    doc = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": NAME},
           "spec": {"profile": "low-latency", "gpu": {"product": "H200"},
                    "prefill": {"minReplicas": PREFILL, "maxReplicas": PREFILL},
                    "decode": {"minReplicas": 1, "maxReplicas": 1},
                    "autoscaling": {"intervalSeconds": 10}}}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

    def pending_condition():
        cr = cluster.kubectl_json("get", "v41f", NAME, "-n", ns)
        return next((c for c in (cr.get("status") or {}).get("conditions", [])
                     if c["type"] == "CapacityPending" and c["status"] == "True"), None)
    cond = wait_for(pending_condition, 180, f"{ns}/{NAME} CapacityPending")
    assert cond["reason"] == "Unschedulable"
    assert "prefill pod" in cond["message"] and "unschedulable: Insufficient nvidia.com/gpu" in cond["message"], cond
    events = wait_for(lambda: cluster.kubectl_json("get", "events", "-n", ns, "--field-selector",
                                                   "reason=Unschedulable")["items"], 60, "an Unschedulable Event")
    assert any("Insufficient nvidia.com/gpu" in e["message"] and e["involvedObject"]["kind"] == "V41FlashDeployment"
               for e in events), [e["message"] for e in events]

    def prefill_pods():
        pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l",
                                    f"v41flash.io/deployment={NAME},v41flash.io/role=prefill")["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def has(p, kind, status):
        return any(c["type"] == kind and c["status"] == status for c in (p.get("status") or {}).get("conditions") or [])

    def settled():  # every prefill pod either Ready or unschedulable, some of each
        pods = prefill_pods()
        ready = {p["metadata"]["name"] for p in pods if has(p, "Ready", "True")}
        pending = {p["metadata"]["name"] for p in pods if has(p, "PodScheduled", "False")}
        return (ready, pending) if len(pods) == PREFILL and ready and pending and len(ready | pending) == PREFILL \
            else None
    ready, pending = wait_for(settled, 180, "prefill pods Ready or unschedulable")
    # the planner may now decide (no load: the need is one replica); its first scale-down cancels the
    # Pending pods only, after the stabilization window, all at once
    doc["spec"]["prefill"] = {"minReplicas": 1, "maxReplicas": PREFILL}
    doc["spec"]["autoscaling"]["scaleDownStabilizationSeconds"] = 30
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    scaled = wait_for(lambda: [e["message"] for e in cluster.kubectl_json(
        "get", "events", "-n", ns, "--field-selector", "reason=Scaled")["items"] if "cancelling" in e["message"]],
        180, "a prefill scale-down cancelling the Pending pods (Scaled Event)")
    print(f"[e2e] Scaled: {scaled[0][:400]}")
    assert len(scaled) == 1, scaled
    assert f"{PREFILL} → {len(ready)} after 30s below: cancelling {len(pending)} replica(s) not serving yet " \
           f"(0 starting, {len(pending)} unschedulable)" in scaled[0], scaled
    # the Pending pods are gone and every Ready pod still runs (the next step, 30 s on, removes a Ready one)
    left = wait_for(lambda: (lambda pods: pods if not any(has(p, "PodScheduled", "False") for p in pods) else None)(
        prefill_pods()), 30, "Pending prefill pods deleted", interval=0.2)
    assert ready <= {p["metadata"]["name"] for p in left}, (sorted(ready), [p["metadata"]["name"] for p in left])
    # the GPUs are enough now: the condition clears
    wait_for(lambda: pending_condition() is None, 180, "CapacityPending gone")
