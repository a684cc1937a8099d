"""How the harness configures kwok and the LeaderWorkerSet controller for simulated pods: kwok's stages (the roles
whose kubelet the supervisor plays start Running but unready, and are deleted by the supervisor), and LWS's
webhooks on loopback."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml


ROLE_LABEL = "v41flash.io/role"
# The roles whose pods the supervisor plays kubelet for (e2e/supervisor.py): it runs their processes, sets their
# Ready condition, and on deletion terminates them as kubelet does, then removes the pod object itself.
# "epp": mode Gateway's endpoint picker (render/gateway.py's EPP component).
SUPERVISED_ROLES = ("prefill", "decode", "router", "epp")


def kwok_stages(assets: Path) -> str:
    """kwok's stock stages (with its chaos stage that fails a node on a label), except for pods carrying
    v41flash.io/role, whose kubelet the supervisor plays:

    * they start Running but not Ready (`v41flash-pod-running-unready`): the supervisor sets Ready from their
      readiness probe against the simulator;
    * the stock pod-delete stage (which removes a pod the moment it has a deletionTimestamp) leaves out the
      roles the supervisor runs: it runs the pod's preStop hook, stops its processes within the grace period
      and then deletes the pod with grace 0, as kubelet does. Until then the pod keeps its IP in kwok's pool
      (kwok recycles an IP only when the pod object is gone)."""
    docs = {f: yaml.safe_load((assets / f).read_text()) for f in (
        "node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml", "pod-complete.yaml",
        "pod-delete.yaml", "node-not-ready.yaml")}  # the last: a node labelled NODE_NOT_READY_LABEL=true fails
    ready = docs["pod-ready.yaml"]
    role_key = f'.metadata.labels["{ROLE_LABEL}"]'
    running = json.loads(json.dumps(ready))
    ready["spec"]["selector"]["matchExpressions"].append({"key": role_key, "operator": "DoesNotExist"})
    running["metadata"]["name"] = "v41flash-pod-running-unready"
    running["spec"]["selector"]["matchExpressions"].append({"key": role_key, "operator": "Exists"})
    tmpl = running["spec"]["next"]["statusTemplate"]
    for cond in ("Ready", "ContainersReady"):
        old = f'status: "True"\n  type: {cond}\n'
        assert tmpl.count(old) == 1, f"kwok pod-ready template changed: no {cond} condition"
        tmpl = tmpl.replace(old, f'status: "False"\n  type: {cond}\n')
    old = "  ready: true\n  restartCount: 0\n  state:\n    running:"
    assert tmpl.count(old) == 1, "kwok pod-ready template changed: no running container status"
    running["spec"]["next"]["statusTemplate"] = tmpl.replace(old, old.replace("ready: true", "ready: false"))
    delete = docs["pod-delete.yaml"]
    assert delete["spec"].get("next", {}).get("delete") is True, "kwok pod-delete stage changed: it deletes no more"
    # NotIn also matches a pod without the label (kwok's selector: a missing key is "not in" any set)
    delete["spec"]["selector"]["matchExpressions"].append(
        {"key": role_key, "operator": "NotIn", "values": list(SUPERVISED_ROLES)})
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in [*docs.values(), running])


def lws_webhooks(manifests_yaml: str, url: str, ca_bundle: bytes) -> list[dict]:
    """LWS's webhook configurations (config/webhook/manifests.yaml) pointed at a URL on loopback, with the
    pod webhooks restricted to LWS pods as the upstream kustomize patch and Helm chart do."""
    out = []
    for doc in yaml.safe_load_all(manifests_yaml):
        if not doc:
            continue
        doc["metadata"]["name"] = "lws-" + doc["metadata"]["name"]
        for wh in doc["webhooks"]:
            path = wh["clientConfig"]["service"]["path"]
            wh["clientConfig"] = {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca_bundle).decode()}
            if any("pods" in r.get("resources", []) for r in wh.get("rules", [])):
                wh["objectSelector"] = {"matchExpressions": [
                    {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
        out.append(doc)
    return out
