"""The weight prefetcher: a DaemonSet that copies the hub checkpoint into the weight cache's node directory on every
node the engines may run on, so that a new replica reads ~511 GB from the node's disk instead of the network.

Its init container downloads (huggingface_hub's snapshot_download, in the vLLM image the engines run: the same
client and HF_HOME layout, so the engines find the files and download nothing); then a small container idles,
keeping the pod (and so the download's completion) visible per node: `kubectl get ds <name>-weight-prefetch`
counts the nodes whose copy is complete as Ready. It requests no GPU.
"""
from __future__ import annotations

from typing import Any

from ..api import v1alpha1 as api
from . import labels as L
from .engine import WEIGHT_CACHE_DIR, WEIGHT_CACHE_HF_HOME, _affinity, _engine_security, _tolerations, weight_cache_volume
from .resolve import Resolved

COMPONENT = "weight-prefetch"
# env, not argv: a checkpoint id or revision never lands inside the Python source
DOWNLOAD = ("import os; from huggingface_hub import snapshot_download; "
            "snapshot_download(os.environ['CHECKPOINT'], revision=os.environ.get('REVISION') or None); "
            "print('checkpoint complete in', os.environ['HF_HOME'])")


def weight_prefetch(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
                    owner: dict[str, Any] | None) -> dict[str, Any] | None:
    """The DaemonSet, or None when no weight cache is prefetched (or the weights come from a PVC)."""
    cache, hub = spec.startup.weight_cache, spec.model.source.hub
    if cache is None or not cache.prefetch or hub is None:
        return None
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": WEIGHT_CACHE_HF_HOME},
                                 {"name": "CHECKPOINT", "value": spec.model.checkpoint},
                                 {"name": "REVISION", "value": spec.model.revision}]
    if hub.token_secret_ref is not None:
        ref = hub.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    mount = [{"name": "weight-cache", "mountPath": WEIGHT_CACHE_DIR}]
    security = _engine_security(res)
    security.pop("capabilities", None)  # no RDMA here
    labels = L.common_labels(cr_name, COMPONENT)
    engine_role = res.enabled_roles[0].role  # every role runs on the same GPU product's nodes
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": {"nodeAffinity": _affinity(cr_name, engine_role, res, res.roles[engine_role])["nodeAffinity"]},
        "tolerations": _tolerations(spec),
        "initContainers": [{
            "name": "download", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
            "command": ["python3", "-c", DOWNLOAD], "env": env, "volumeMounts": mount,
            "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}},
            "securityContext": security,
        }],
        "containers": [{
            "name": "idle", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
            "command": ["sleep", "infinity"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": security,
        }],
        "volumes": [weight_cache_volume(cache, namespace)],  # the one writer of the node's copy
    }
    if spec.gpu.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.gpu.node_selector.items()))
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": L.metadata(cr_name, namespace, L.child_name(cr_name, COMPONENT), COMPONENT, owner),
        "spec": {
            "selector": {"matchLabels": L.selector_labels(cr_name, COMPONENT)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
