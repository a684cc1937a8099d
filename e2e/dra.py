"""Dynamic Resource Allocation on the local cluster: what NVIDIA's DRA driver would put there, played by the harness.

NVIDIA's driver (k8s-dra-driver-gpu) is not served by the Go module proxy this project builds from, and its kubelet
plugins need a kubelet and GPUs; Kubernetes' example driver (sigs.k8s.io/dra-example-driver) is served but publishes
gpu.example.com devices with its own attributes, one kubelet plugin per node. The operator's claims select NVIDIA's
driver and attributes (render/dra.py, render/compute_domain.py), so the harness publishes ResourceSlices as NVIDIA's
kubelet plugins would for each kwok GPU node, installs the driver's DeviceClasses, serves a ComputeDomain CRD written
from the driver's v25.8.1 Go types (api/nvidia.com/resource/v1beta1/computedomain.go), and runs a stand-in for its
ComputeDomain controller: each ComputeDomain gets the ResourceClaimTemplate the real controller creates (same name,
device class, opaque channel config and labels; owned by the domain, so it goes with it). The real kube-scheduler
allocates every claim from the slices and the real controller-manager creates and removes the pods' claims.

    python -m e2e.dra --state DIR    # the stand-in controller (the harness starts it as `imex-controller`)
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any, Iterable

from v41flash import gpus
from v41flash.render import compute_domain as cd
from v41flash.render import dra

from e2e.nodes import NodePool

log = logging.getLogger("e2e.dra")

CD_GROUP, CD_VERSION = cd.API_VERSION.split("/")
CD_PLURAL = "computedomains"
CD_DRIVER = "compute-domain.nvidia.com"
CD_LABEL = "resource.nvidia.com/computeDomain"  # on the template: the domain's uid (as the real controller sets it)
CD_DAEMON_DEVICE_CLASS = "compute-domain-daemon.nvidia.com"


def compute_domain_crd() -> dict[str, Any]:
    """computedomains.resource.nvidia.com v1beta1 with the schema of the driver's v25.8.1 Go types (spec immutable)."""
    node = {"type": "object", "required": ["cliqueID", "ipAddress", "name"], "properties": {
        "cliqueID": {"type": "string"}, "index": {"type": "integer"}, "ipAddress": {"type": "string"},
        "name": {"type": "string"}, "status": {"type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady"}}}
    spec = {"type": "object", "required": ["channel", "numNodes"],
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}],
            "properties": {
                "numNodes": {"type": "integer"},
                "channel": {"type": "object", "required": ["resourceClaimTemplate"], "properties": {
                    "resourceClaimTemplate": {"type": "object", "required": ["name"],
                                              "properties": {"name": {"type": "string"}}},
                    "allocationMode": {"type": "string", "enum": ["All", "Single"], "default": "Single"}}}}}
    status = {"type": "object", "required": ["status"], "properties": {
        "status": {"type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady"},
        "nodes": {"type": "array", "items": node, "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["name"]}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{CD_PLURAL}.{CD_GROUP}"},
        "spec": {"group": CD_GROUP, "scope": "Namespaced",
                 "names": {"kind": cd.KIND, "listKind": f"{cd.KIND}List", "plural": CD_PLURAL,
                           "singular": "computedomain"},
                 "versions": [{"name": CD_VERSION, "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"}, "spec": spec, "status": status}}}}]}}


def device_classes() -> list[dict[str, Any]]:
    """The driver chart's DeviceClasses (deployments/helm/.../templates/deviceclass-*.yaml, v25.8.1)."""
    def dc(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    return [
        dc(dra.DEFAULT_DEVICE_CLASS, f"device.driver == '{dra.GPU_DRIVER}' && "
                                     f"device.attributes['{dra.GPU_DRIVER}'].type == 'gpu'"),
        dc(cd.CHANNEL_DEVICE_CLASS, f"device.driver == '{CD_DRIVER}' && device.attributes['{CD_DRIVER}'].type == "
                                    f"'channel' && device.attributes['{CD_DRIVER}'].id == 0"),
        dc(CD_DAEMON_DEVICE_CLASS, f"device.driver == '{CD_DRIVER}' && "
                                   f"device.attributes['{CD_DRIVER}'].type == 'daemon'"),
    ]


# NVML's total memory of one GPU as the driver reports it (capacity "memory"), by GPU Feature Discovery's product label
NVML_MEMORY = {"NVIDIA-H200": "143771Mi", "NVIDIA-B200": "183359Mi", "NVIDIA-GB300": "284208Mi"}


def resource_slices(nodes: Iterable[dict[str, Any]], pools: Iterable[NodePool]) -> list[dict[str, Any]]:
    """Per GPU node, the slices the driver's two kubelet plugins publish: its GPUs (gpu.nvidia.com: type, productName,
    memory) and, on Multi-Node NVLink trays, the IMEX channel 0 and the daemon device (compute-domain.nvidia.com)."""
    by_prefix = {p.prefix: p for p in pools}
    out = []
    for node in nodes:
        name = node["metadata"]["name"]
        label = node["metadata"]["labels"].get("nvidia.com/gpu.product")
        pool = next((p for prefix, p in by_prefix.items() if name.startswith(prefix)), None)
        if not label or pool is None or not pool.gpus:
            continue
        product = next(p for p in gpus.GPU_PRODUCTS.values() if p.node_label_value == label)
        devices = [{"name": f"gpu-{i}", "attributes": {
            "type": {"string": "gpu"}, "index": {"int": i}, "productName": {"string": dra.product_name(product)},
            "uuid": {"string": f"GPU-{name}-{i}"}}, "capacity": {"memory": {"value": NVML_MEMORY[label]}}}
            for i in range(pool.gpus)]
        out.append(_slice(f"{name}-gpu", name, dra.GPU_DRIVER, devices))
        if product.fabric == "mnnvl":
            out.append(_slice(f"{name}-compute-domain", name, CD_DRIVER, [
                {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
                {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}}]))
    return out


def _slice(name: str, node: str, driver: str, devices: list[dict]) -> dict[str, Any]:
    return {"apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": devices}}


def channel_template(domain: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate the driver's ComputeDomain controller creates for a domain
    (templates/compute-domain-workload-claim-template.tmpl.yaml, v25.8.1), owned by the domain."""
    meta = domain["metadata"]
    channel = domain["spec"]["channel"]
    return {
        "apiVersion": dra.RESOURCE_API_VERSION, "kind": "ResourceClaimTemplate",
        "metadata": {"name": channel["resourceClaimTemplate"]["name"], "namespace": meta["namespace"],
                     "labels": {CD_LABEL: meta["uid"]},
                     "ownerReferences": [{"apiVersion": cd.API_VERSION, "kind": cd.KIND, "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_DEVICE_CLASS}}],
            "config": [{"requests": ["channel"], "opaque": {"driver": CD_DRIVER, "parameters": {
                "apiVersion": cd.API_VERSION, "kind": "ComputeDomainChannelConfig", "domainID": meta["uid"],
                "allocationMode": channel.get("allocationMode", "Single")}}}]}}},
    }


def run(kubeconfig: str) -> None:
    """Watch every ComputeDomain; create its channel template when missing (garbage collection removes it)."""
    from kubernetes import client, config, watch
    config.load_kube_config(kubeconfig)
    custom, resource = client.CustomObjectsApi(), client.ResourceV1Api()
    while True:
        try:
            listed = custom.list_cluster_custom_object(CD_GROUP, CD_VERSION, CD_PLURAL)
            for domain in listed["items"]:
                _ensure_template(resource, domain)
            stream = watch.Watch().stream(custom.list_cluster_custom_object, CD_GROUP, CD_VERSION, CD_PLURAL,
                                          resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=300)
            for event in stream:
                if event["type"] in ("ADDED", "MODIFIED") and not event["object"]["metadata"].get("deletionTimestamp"):
                    _ensure_template(resource, event["object"])
        except Exception as exc:  # noqa: BLE001 - a controller outlives apiserver hiccups; relist after a pause
            log.warning("watch of ComputeDomains failed (%s); relisting", exc)
            time.sleep(1)


def _ensure_template(resource: Any, domain: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException
    rct = channel_template(domain)
    try:
        resource.create_namespaced_resource_claim_template(rct["metadata"]["namespace"], rct)
        log.info("created ResourceClaimTemplate %s/%s for ComputeDomain %s", rct["metadata"]["namespace"],
                 rct["metadata"]["name"], domain["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 409:  # 409: it exists already
            raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", required=True)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run(os.environ.get("KUBECONFIG") or os.path.join(a.state, "kubeconfig"))


if __name__ == "__main__":
    main()
