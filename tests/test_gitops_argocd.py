"""The Argo CD health check (charts/v41flash-operator/files/argocd-health.lua) run in a real Lua runtime (lupa)
on status samples: hand-recorded edge cases and statuses produced by the operator's own compute_status, so the
verdict stays consistent with the kstatus conditions the controller writes."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from lupa import LuaRuntime

from v41flash.controller.status import Stall, WorkloadState, compute_status

REPO = Path(__file__).resolve().parent.parent
LUA = REPO / "charts" / "v41flash-operator" / "files" / "argocd-health.lua"
NOW = "2026-11-30T06:00:00Z"


def health(obj: dict) -> tuple[str, str]:
    """Run the check the way Argo CD does: the resource as global `obj`, the chunk returns {status, message}."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(LUA.read_text())
    return hs["status"], hs["message"]


def cr(generation: int, status: dict | None) -> dict:
    obj = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
           "metadata": {"name": "chat", "namespace": "default", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


def cond(type_: str, status: str, generation: int, reason: str = "R", message: str = "m") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": NOW}


RECORDED = [
    # (case, generation, status, verdict, message fragment)
    ("no status yet", 1, None, "Progressing", "Waiting for the v41flash operator"),
    ("status without observedGeneration", 1, {"conditions": []}, "Progressing", "Waiting for the v41flash operator"),
    ("ready", 2, {"observedGeneration": 2, "conditions": [cond("Ready", "True", 2, "AllReplicasReady", "all ready")]},
     "Healthy", "all ready"),
    ("ready but for an older spec", 3,
     {"observedGeneration": 2, "conditions": [cond("Ready", "True", 2)]}, "Progressing", "generation 3"),
    ("ready condition older than status", 3,
     {"observedGeneration": 3, "conditions": [cond("Ready", "True", 2)]}, "Progressing", "generation 2"),
    ("reconciling", 1, {"observedGeneration": 1, "conditions": [
        cond("Ready", "False", 1, "Progressing", "decode: 1/2 replicas ready"),
        cond("Reconciling", "True", 1, "Progressing", "decode: 1/2 replicas ready")]},
     "Progressing", "decode: 1/2 replicas ready"),
    ("stalled", 4, {"observedGeneration": 4, "conditions": [
        cond("Ready", "False", 4, "InvalidSpec", "x"),
        cond("Stalled", "True", 4, "InvalidSpec", "spec.decode.maxReplicas: below minReplicas")]},
     "Degraded", "InvalidSpec: spec.decode.maxReplicas: below minReplicas"),
    ("stalled for an older spec is not degraded", 5, {"observedGeneration": 4, "conditions": [
        cond("Stalled", "True", 4, "InvalidSpec", "x")]}, "Progressing", "generation 5"),
    ("stalled wins over reconciling", 1, {"observedGeneration": 1, "conditions": [
        cond("Reconciling", "True", 1), cond("Stalled", "True", 1, "KindNotInstalled", "no LWS")]},
     "Degraded", "KindNotInstalled: no LWS"),
    ("not ready, no reason given", 1, {"observedGeneration": 1, "conditions": [
        cond("Ready", "False", 1, "Progressing", "router: 0/1 replicas ready")]},
     "Progressing", "router: 0/1 replicas ready"),
    ("no conditions", 1, {"observedGeneration": 1}, "Progressing", "Waiting for the Ready condition"),
    # rollouts (docs/decisions/2026-12-01-rollouts.md §4.7): a canary in progress, waiting for room, rolled back, done
    ("canary step", 2, {"observedGeneration": 2, "rollout": {"phase": "Canary", "step": 2, "steps": 4}, "conditions": [
        cond("Ready", "False", 2, "RolloutProgressing", "canary step 2/4: 25% of new sessions on 9c41"),
        cond("Reconciling", "True", 2, "RolloutProgressing", "canary step 2/4: 25% of new sessions on 9c41")]},
     "Progressing", "canary step 2/4"),
    ("waiting for surge room", 2, {"observedGeneration": 2, "rollout": {"phase": "WaitingForSurgeRoom"}, "conditions": [
        cond("Reconciling", "True", 2, "WaitingForSurgeRoom", "candidate 9c41 needs 8 GPUs (4 decode + 4 prefill)")]},
     "Progressing", "needs 8 GPUs"),
    ("rolled back at the gate", 2, {"observedGeneration": 2, "rollout": {"phase": "RolledBack"}, "conditions": [
        cond("Ready", "False", 2, "GateFailed", "x"),
        cond("Stalled", "True", 2, "GateFailed", "rolled back 9c41: TTFT p90 2.70s > 2.00s target at step 2/4 (25%)")]},
     "Degraded", "GateFailed: rolled back 9c41: TTFT p90 2.70s > 2.00s target"),
    ("rollout complete", 3, {"observedGeneration": 3, "rollout": {"phase": "Complete", "servingSlot": "a"},
                             "conditions": [cond("Ready", "True", 3, "AllReplicasReady", "all ready")]},
     "Healthy", "all ready"),
    ("abnormal conditions False are ignored", 1, {"observedGeneration": 1, "conditions": [
        cond("Stalled", "False", 1), cond("Reconciling", "False", 1), cond("Ready", "True", 1, "A", "ok")]},
     "Healthy", "ok"),
]


@pytest.mark.parametrize("case,generation,status,verdict,fragment", RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_samples(case, generation, status, verdict, fragment):
    got, message = health(cr(generation, status))
    assert got == verdict
    assert fragment in message


def _operator_status(*, ready: int, want: int = 2, stall: Stall | None = None, generation: int = 7) -> dict:
    """A status exactly as the controller computes it for a decode-only deployment with a router."""
    decode = WorkloadState(exists=True, spec_replicas=want, replicas=max(ready, want), ready=ready,
                           updated=want, up_to_date=True)
    router = WorkloadState(exists=True, spec_replicas=1, replicas=1, ready=1, updated=1, up_to_date=True)
    return compute_status(generation=generation, enabled={"prefill": False, "decode": True},
                          desired={"prefill": 0, "decode": want}, workloads={"decode": decode}, router=router,
                          router_desired=1, gpus_per_replica={"decode": 8}, router_service="chat-router:8000",
                          stall=stall, previous=None, now=NOW)


@pytest.mark.parametrize("ready,stall,verdict", [
    (2, None, "Healthy"),
    (1, None, "Progressing"),
    (0, None, "Progressing"),
    (2, Stall("InvalidSpec", "spec.gpu: unknown product"), "Degraded"),
])
def test_verdicts_follow_the_operators_own_status(ready, stall, verdict):
    status = _operator_status(ready=ready, stall=stall)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    # The kstatus contract the verdict is derived from, stated against the real status computation.
    assert conditions["Ready"] == ("True" if verdict == "Healthy" else "False")
    assert conditions.get("Stalled") == ("True" if verdict == "Degraded" else None)
    assert conditions.get("Reconciling") == ("True" if verdict == "Progressing" else None)
    assert health(cr(7, status))[0] == verdict
    # The same status seen against a newer spec is stale whatever it says.
    assert health(cr(8, status))[0] == "Progressing"


def test_argocd_cm_patch_carries_the_same_lua():
    """manifests/argocd/argocd-cm-health.yaml is what users merge into argocd-cm: it must be this very check."""
    doc = yaml.safe_load((REPO / "manifests" / "argocd" / "argocd-cm-health.yaml").read_text())
    assert doc["metadata"]["name"] == "argocd-cm"
    assert doc["data"]["resource.customizations.health.v41flash.io_V41FlashDeployment"] == LUA.read_text()
