"""Capacity that cannot arrive: more prefill replicas than the cluster's free H200 GPUs. The pods that no
node can take are Pending (PodScheduled=False, Insufficient nvidia.com/gpu); the operator says so in a
CapacityPending condition and an Unschedulable Event, and does not count them as capacity on its way."""
from __future__ import annotations

import pytest
import yaml

from e2e.kit import wait_for

pytestmark = pytest.mark.e2e

NAME = "pending"
H200_GPUS = 4 * 8  # e2e/harness.py NODE_POOLS: 4 H200 HGX nodes, 8 GPUs each
PREFILL = H200_GPUS // 4 + 1  # TP4 replicas: one more than fit


def test_unschedulable_prefill_pods_show_in_a_condition_and_an_event(cluster, operator_process, ns):
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
    # freeing the GPUs (fewer replicas) clears the condition
    doc["spec"]["prefill"] = {"minReplicas": 1, "maxReplicas": 1}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    wait_for(lambda: pending_condition() is None, 180, "CapacityPending gone")
