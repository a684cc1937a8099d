"""Resolve a spec into what the operator decided: effective parallel sizes, GPUs, workload kinds.

This is the same resolution the CRD's CEL rules encode (profile defaults, GPUs per node from the
product; both take them from the GPU table in gpus.py), written once more in Python because the
renderer, the ConfigMap, the planner's GPU counts and the operator checks all need the numbers, not a
yes/no. tests/test_render_resolve.py checks that the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..api import v1alpha1 as api
from ..roles import ROLES
from .. import gpus

DEPLOYMENT = "Deployment"
LEADER_WORKER_SET = "LeaderWorkerSet"


@dataclass(frozen=True)
class GPUResolved:
    product: str
    gpus_per_node: int
    resource_name: str  # nvidia.com/gpu or amd.com/gpu
    product_label: str  # node label key (spec.gpu.productLabel)
    product_label_value: str  # the product's value of that label (GPU Feature Discovery's)
    topology_key: str
    rdma_resource: str
    allocation: str = "DevicePlugin"  # DevicePlugin | DRA (spec.gpu.allocation; render/dra.py)
    device_class: str = ""  # with DRA: spec.gpu.deviceClassName ('' = the driver's default class)

    @property
    def dra(self) -> bool:
        return self.allocation == "DRA"


@dataclass(frozen=True)
class RoleResolved:
    role: str  # prefill | decode
    enabled: bool
    tensor_parallel_size: int
    data_parallel_size: int
    data_parallel_size_local: int  # DP ranks in one pod
    expert_parallel: bool
    expert_parallel_size: int  # TP x DP when expert parallel, else 1
    nodes_per_replica: int
    gpus_per_replica: int
    gpus_per_pod: int
    workload_kind: str  # Deployment | LeaderWorkerSet
    kv_role: str | None  # kv_producer | kv_consumer | None (aggregated: no KV transfer)
    min_replicas: int
    max_replicas: int
    replicas_managed_by: str  # operator | external

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_replica > 1


@dataclass(frozen=True)
class Resolved:
    profile: str
    gpu: GPUResolved
    checkpoint: str
    served_model_name: str
    disaggregated: bool  # prefill and decode both on: P/D with KV transfer
    roles: dict[str, RoleResolved]  # prefill, decode (disabled ones too, with enabled=False)

    @property
    def prefill(self) -> RoleResolved:
        return self.roles["prefill"]

    @property
    def decode(self) -> RoleResolved:
        return self.roles["decode"]

    @property
    def enabled_roles(self) -> list[RoleResolved]:
        return [r for r in self.roles.values() if r.enabled]

    def min_gpus(self) -> int:
        """GPUs all enabled roles hold at their minReplicas (what a GPU budget must cover)."""
        return sum(r.min_replicas * r.gpus_per_replica for r in self.enabled_roles)


def gpus_per_node(spec: api.V41FlashDeploymentSpec) -> int:
    return spec.gpu.gpus_per_node or gpus.gpu(spec.gpu.product).gpus_per_node


def resolve_gpu(spec: api.V41FlashDeploymentSpec) -> GPUResolved:
    product = gpus.gpu(spec.gpu.product)
    return GPUResolved(
        product=spec.gpu.product,
        gpus_per_node=gpus_per_node(spec),
        resource_name=product.resource_name,
        product_label=_product_label(spec, product),
        product_label_value=product.node_label_value,
        topology_key=spec.gpu.topology_key,
        rdma_resource=spec.gpu.rdma_resource,
        allocation=spec.gpu.allocation,
        device_class=spec.gpu.device_class_name,
    )


def _product_label(spec: api.V41FlashDeploymentSpec, product: gpus.GpuProduct) -> str:
    """The node label naming the product: the spec's, unless left at the (NVIDIA GFD) default for a
    product whose labeller uses another key (AMD: amd.com/gpu.product-name)."""
    default = api.GPUSpec.model_fields["product_label"].default
    return product.node_label_key if spec.gpu.product_label == default else spec.gpu.product_label


def resolve_role(spec: api.V41FlashDeploymentSpec, role: str) -> RoleResolved:
    r: api.RoleSpec = getattr(spec, role)
    high_throughput = spec.profile == "high-throughput"
    product = gpus.gpu(spec.gpu.product)
    tp = r.tensor_parallel_size or gpus.default_tensor_parallel_size(product, high_throughput)
    dp = r.data_parallel_size or gpus.default_data_parallel_size(product, high_throughput)
    ep = r.expert_parallel if r.expert_parallel is not None else high_throughput
    nodes = r.nodes_per_replica
    gpus_per_replica = tp * dp
    disaggregated = spec.prefill.enabled and spec.decode.enabled
    return RoleResolved(
        role=role,
        enabled=r.enabled,
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        # floor: a DP size that does not split over the nodes is refused by operator_checks
        data_parallel_size_local=max(dp // nodes, 1),
        expert_parallel=ep,
        expert_parallel_size=gpus_per_replica if ep else 1,
        nodes_per_replica=nodes,
        gpus_per_replica=gpus_per_replica,
        gpus_per_pod=gpus_per_replica // nodes,
        workload_kind=LEADER_WORKER_SET if nodes > 1 else DEPLOYMENT,
        kv_role=({"prefill": "kv_producer", "decode": "kv_consumer"}[role] if disaggregated else None),
        min_replicas=r.min_replicas,
        max_replicas=r.max_replicas,
        replicas_managed_by=r.replicas_managed_by,
    )


def resolve(spec: api.V41FlashDeploymentSpec) -> Resolved:
    return Resolved(
        profile=spec.profile,
        gpu=resolve_gpu(spec),
        checkpoint=spec.model.checkpoint,
        served_model_name=spec.model.served_model_name or spec.model.checkpoint,
        disaggregated=spec.prefill.enabled and spec.decode.enabled,
        roles={role: resolve_role(spec, role) for role in ROLES},
    )
