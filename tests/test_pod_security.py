"""Pod Security Standards (issue 12): engine pods pass `baseline` (unless RDMA needs IPC_LOCK), router pods
pass `restricted`. The checks are the standard's own list (kubernetes.io/docs/concepts/security/
pod-security-standards), applied to every rendered pod template; e2e proves the same on a real apiserver."""
from pathlib import Path

import pytest
import yaml

from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.render import render

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def baseline_violations(pod: dict) -> list[str]:
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(key)
    if (pod.get("securityContext", {}).get("seccompProfile", {}) or {}).get("type") == "Unconfined":
        out.append("seccomp Unconfined")
    if pod.get("securityContext", {}).get("sysctls"):
        out.append("sysctls")
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out.append(f"hostPath volume {v['name']}")
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']} privileged")
        extra = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPS
        if extra:
            out.append(f"{c['name']} adds {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']} hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c['name']} seccomp Unconfined")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{c['name']} procMount")
    return out


def restricted_violations(pod: dict) -> list[str]:
    out = baseline_violations(pod)
    psc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        if not set(v) - {"name"} <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} type")
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']} allowPrivilegeEscalation")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            out.append(f"{c['name']} runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{c['name']} runAsUser 0")
        if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault",
                                                                                            "Localhost"):
            out.append(f"{c['name']} seccomp")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            out.append(f"{c['name']} drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']} adds capabilities")
    return out


def templates(objs):
    for o in objs:
        if o["kind"] == "Deployment":
            yield o["metadata"]["labels"]["app.kubernetes.io/component"], o["spec"]["template"]["spec"]
        elif o["kind"] == "LeaderWorkerSet":
            for key in ("leaderTemplate", "workerTemplate"):
                yield o["metadata"]["labels"]["app.kubernetes.io/component"], \
                    o["spec"]["leaderWorkerTemplate"][key]["spec"]


def _cr(doc):
    doc["metadata"].setdefault("namespace", "default")
    return V41FlashDeployment.model_validate(doc)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_engines_pass_baseline_and_router_passes_restricted(path):
    seen = set()
    for component, pod in templates(render(_cr(yaml.safe_load(path.read_text())))):
        seen.add(component)
        if component in ("router", "epp"):  # the router pod, or mode Gateway's endpoint picker
            assert restricted_violations(pod) == []
            assert all(c["securityContext"].get("readOnlyRootFilesystem") for c in pod["containers"])
        else:
            assert baseline_violations(pod) == [], component
            assert pod["automountServiceAccountToken"] is False
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert all(c["securityContext"]["allowPrivilegeEscalation"] is False for c in pod["containers"])
    assert seen & {"router", "epp"} and "decode" in seen


def test_ipc_lock_only_with_rdma_and_then_it_is_said_to_be_outside_baseline():
    doc = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": "t"},
           "spec": {"gpu": {"rdmaResource": "rdma/ib"}}}
    for component, pod in templates(render(_cr(doc))):
        if component != "router":
            assert baseline_violations(pod) == ["vllm adds ['IPC_LOCK']"]


def test_the_checker_catches_what_the_old_engine_pod_did():
    old = {"containers": [{"name": "vllm", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}
    assert baseline_violations(old) == ["vllm adds ['IPC_LOCK']"]
    assert "vllm runAsNonRoot" in restricted_violations(old)
