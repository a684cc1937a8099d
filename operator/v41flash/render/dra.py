"""GPUs allocated by Dynamic Resource Allocation (spec.gpu.allocation: DRA) instead of the device plugin's extended
resource: each engine workload gets a ResourceClaimTemplate (resource.k8s.io/v1) asking the NVIDIA DRA driver's
DeviceClass for exactly the pod's GPUs, selected by product and memory in CEL; each pod claims from it.

The template is named after its workload and a hash of its spec: a template's spec is immutable, so a change (another
count, class or product) is a new template under a new name, which the pod template names, so it is a new serving
revision too (render/revision.py).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from .. import gpus
from . import labels as L

RESOURCE_API_VERSION = "resource.k8s.io/v1"
GPU_DRIVER = gpus.DRA_DRIVER
DEFAULT_DEVICE_CLASS = gpus.DRA_DEVICE_CLASS
GPU_CLAIM = "gpus"  # the claim's name in the engine pods
GPU_SUFFIX = "gpus"
# what the controller's KindNotInstalled stall tells to install
INSTALL_HINTS = {"ResourceClaimTemplate": "Kubernetes 1.34 or later (Dynamic Resource Allocation, resource.k8s.io/v1) "
                                          "and the NVIDIA DRA driver for GPUs (spec.gpu.allocation: DRA)"}
# The driver reports NVML's total memory, a little above or below the vendor's rated HBM: select at least this share.
MEMORY_FLOOR = 0.95


def product_name(product: gpus.GpuProduct) -> str:
    """NVML's product name, the driver's productName attribute: GPU Feature Discovery's label value with spaces."""
    return product.node_label_value.replace("-", " ")


def selector(product: gpus.GpuProduct) -> str:
    """The CEL that picks the spec's product with (about) its memory."""
    memory = f"{int(product.hbm_gb * MEMORY_FLOOR)}G"
    return (f"device.attributes['{GPU_DRIVER}'].productName == '{product_name(product)}' && "
            f"device.capacity['{GPU_DRIVER}'].memory.compareTo(quantity('{memory}')) >= 0")


def device_class(class_name: str) -> str:
    return class_name or DEFAULT_DEVICE_CLASS


def template_spec(product: str, class_name: str, gpus_per_pod: int) -> dict[str, Any]:
    """ResourceClaimTemplate.spec: exactly the pod's GPUs of the class, of the product."""
    return {"spec": {"devices": {"requests": [{"name": GPU_CLAIM, "exactly": {
        "deviceClassName": device_class(class_name), "allocationMode": "ExactCount", "count": gpus_per_pod,
        "selectors": [{"cel": {"expression": selector(gpus.gpu(product))}}]}}]}}}


def template_name(workload_name: str, spec: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return f"{workload_name}-{GPU_SUFFIX}-{digest}"


def claim_gpus(pod_spec: dict[str, Any], container: dict[str, Any], template: str) -> None:
    """The pod's GPUs come from its own claim (one per pod, from the workload's template)."""
    pod_spec.setdefault("resourceClaims", []).append({"name": GPU_CLAIM, "resourceClaimTemplateName": template})
    container["resources"].setdefault("claims", []).append({"name": GPU_CLAIM})


def claimed_template(pod_spec: dict[str, Any]) -> str | None:
    return next((c.get("resourceClaimTemplateName") for c in pod_spec.get("resourceClaims") or []
                 if c.get("name") == GPU_CLAIM), None)


def claim_template(workload: dict[str, Any], spec: dict[str, Any], owner: dict[str, Any] | None) -> dict[str, Any]:
    """The ResourceClaimTemplate a workload's pods claim from (its name as the pod template has it)."""
    meta = workload["metadata"]
    lwt = workload["spec"].get("leaderWorkerTemplate")
    pod = (lwt["leaderTemplate"] if lwt else workload["spec"]["template"])["spec"]
    out_meta: dict[str, Any] = {"name": claimed_template(pod), "namespace": meta["namespace"],
                                "labels": dict(meta["labels"])}
    if owner is not None:
        out_meta["ownerReferences"] = [L.owner_reference(owner)]
    return {"apiVersion": RESOURCE_API_VERSION, "kind": "ResourceClaimTemplate", "metadata": out_meta, "spec": spec}
