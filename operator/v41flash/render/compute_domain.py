"""IMEX ComputeDomains: a multi-node replica on an NVL72 (GB200/GB300) reaches its peers' GPU memory over Multi-Node
NVLink only through an IMEX channel, which NVIDIA's DRA driver allocates to pods that claim it from the
ResourceClaimTemplate its ComputeDomain controller creates (docs/decisions/2026-12-07-compute-domains.md).

One ComputeDomain per engine workload (a slot's LeaderWorkerSet of one role), named after it, with numNodes 0 (the
driver's IMEXDaemonsWithDNSNames mode, its default since v25.8: IMEX daemons start as pods arrive, so scaling the
workload never needs the immutable spec to change). Every pod of every group of the workload claims one channel.
The API is the NVIDIA DRA driver's resource.nvidia.com/v1beta1 (k8s-dra-driver-gpu v25.8.1,
api/nvidia.com/resource/v1beta1/computedomain.go).
"""
from __future__ import annotations

from typing import Any

from .. import gpus
from . import labels as L

API_VERSION = "resource.nvidia.com/v1beta1"
KIND = "ComputeDomain"
# what the controller's KindNotInstalled stall tells to install
INSTALL_HINTS = {KIND: "the NVIDIA DRA driver for GPUs (its ComputeDomain CRD, resource.nvidia.com; multi-node NVLink "
                       "replicas on GB200/GB300 need IMEX channels)"}
# The name of the claim in the engine pods (pod spec resourceClaims and the vLLM container's resources.claims).
CHANNEL_CLAIM = "imex-channel"
# The DeviceClass of the channels the driver's ComputeDomain controller puts in the template it creates.
CHANNEL_DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"
DOMAIN_SUFFIX = "imex"
CHANNEL_SUFFIX = "imex-channel"


def needs_domain(product: str, nodes_per_replica: int) -> bool:
    """A replica over several trays of a Multi-Node NVLink rack."""
    return nodes_per_replica > 1 and gpus.gpu(product).fabric == "mnnvl"


def domain_name(workload_name: str) -> str:
    return f"{workload_name}-{DOMAIN_SUFFIX}"


def channel_template_name(workload_name: str) -> str:
    """The ResourceClaimTemplate the ComputeDomain controller creates, in the domain's namespace."""
    return f"{workload_name}-{CHANNEL_SUFFIX}"


def claim_channel(pod_spec: dict[str, Any], container: dict[str, Any], workload_name: str) -> None:
    """The pod claims one channel of its workload's domain (a ResourceClaim per pod, from the template)."""
    pod_spec.setdefault("resourceClaims", []).append({"name": CHANNEL_CLAIM, "resourceClaimTemplateName":
                                                      channel_template_name(workload_name)})
    container["resources"].setdefault("claims", []).append({"name": CHANNEL_CLAIM})


def claimed_template(pod_spec: dict[str, Any]) -> str | None:
    return next((c.get("resourceClaimTemplateName") for c in pod_spec.get("resourceClaims") or []
                 if c.get("name") == CHANNEL_CLAIM), None)


def compute_domain(workload: dict[str, Any], owner: dict[str, Any] | None) -> dict[str, Any]:
    """The ComputeDomain of one engine workload (same namespace, labels and owner as the workload)."""
    meta = workload["metadata"]
    name = meta["name"]
    out_meta: dict[str, Any] = {"name": domain_name(name), "namespace": meta["namespace"],
                                "labels": dict(meta["labels"])}
    if owner is not None:
        out_meta["ownerReferences"] = [L.owner_reference(owner)]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": out_meta,
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": channel_template_name(name)},
                                                "allocationMode": "Single"}}}


def domains(engines: list[dict[str, Any]], owner: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A ComputeDomain for each engine workload whose pods claim a channel."""
    out = []
    for w in engines:
        if w["kind"] != "LeaderWorkerSet":
            continue
        lwt = w["spec"]["leaderWorkerTemplate"]
        if claimed_template(lwt["workerTemplate"]["spec"]) is not None:
            out.append(compute_domain(w, owner))
    return out


def template_holders(pods: list[Any]) -> set[str]:
    """The channel templates that live pods (V1Pod objects) still claim from: their domains stay."""
    out = set()
    for pod in pods:
        for claim in (pod.spec.resource_claims or []) if pod.spec is not None else []:
            if claim.name == CHANNEL_CLAIM and claim.resource_claim_template_name:
                out.add(claim.resource_claim_template_name)
    return out
