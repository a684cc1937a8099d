"""Home of the GPU table: every GPU product, its per-node count, HBM and default parallel sizes.

The API (enum, CEL defaults), the renderer (resolve), the argument builder and the planner's profiles all read
it from here. A leaf: it imports nothing of the package.

Sources: the vLLM 0.33.0 recipe recipes/models/deepseek-ai/DeepSeek-V4.1-Flash.yaml
(strategy_overrides.single_node_tp.tp, hardware overrides, hardware notes) and the product brief
(low-latency = TP4, 8 on H100; high-throughput = DEP2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "amd"]
# NVLink/NVSwitch inside one node; Multi-Node NVLink across the trays of an NVL72 rack.
Fabric = Literal["nvlink", "mnnvl", "xgmi"]

# Recipe `variants.*.vram_minimum_gb`: the whole checkpoint resident, Engram tables included.
VRAM_MINIMUM_GB = 614
# Smallest replica the recipe verifies with the Engram tables in host memory: B200 AgentX DEP2
# (2 x 180 GB). H100 TP4 (4 x 80 = 320 GB) is called out by the recipe as not enough.
ENGRAM_OFFLOADED_MINIMUM_GB = 360


@dataclass(frozen=True)
class GpuProduct:
    name: str
    vendor: Vendor
    resource_name: str  # extended resource the device plugin advertises
    gpus_per_node: int  # per node; per compute tray on GB200/GB300 NVL72
    hbm_gb: int  # vendor-rated HBM per GPU (GB)
    node_label_key: str
    node_label_value: str  # GPU Feature Discovery / AMD node labeller value
    blackwell: bool
    fabric: Fabric
    recipe_min_tp: int  # recipe single_node_tp.tp for this GPU: the smallest TP it serves
    low_latency_tp: int  # product low-latency profile TP (TP4; H100 needs 8)
    recipe_key: str  # key the recipe uses for hardware overrides

    def replica_hbm_gb(self, gpus: int) -> int:
        return self.hbm_gb * gpus


_NVIDIA = dict(vendor="nvidia", resource_name="nvidia.com/gpu", node_label_key="nvidia.com/gpu.product")

GPU_PRODUCTS: dict[str, GpuProduct] = {
    p.name: p
    for p in (
        # recipe: "H100 spans the whole 8x80 GB node ... even TP8 needs the H100 override"
        GpuProduct("H100", **_NVIDIA, gpus_per_node=8, hbm_gb=80,
                   node_label_value="NVIDIA-H100-80GB-HBM3", blackwell=False, fabric="nvlink",
                   recipe_min_tp=8, low_latency_tp=8, recipe_key="h100"),
        # recipe: "H200 takes the TP4 default on 8x141 GB"
        GpuProduct("H200", **_NVIDIA, gpus_per_node=8, hbm_gb=141, node_label_value="NVIDIA-H200",
                   blackwell=False, fabric="nvlink", recipe_min_tp=4, low_latency_tp=4,
                   recipe_key="h200"),
        GpuProduct("B200", **_NVIDIA, gpus_per_node=8, hbm_gb=180, node_label_value="NVIDIA-B200",
                   blackwell=True, fabric="nvlink", recipe_min_tp=2, low_latency_tp=4,
                   recipe_key="b200"),
        GpuProduct("B300", **_NVIDIA, gpus_per_node=8, hbm_gb=288, node_label_value="NVIDIA-B300",
                   blackwell=True, fabric="nvlink", recipe_min_tp=2, low_latency_tp=4,
                   recipe_key="b300"),
        # GB200/GB300 NVL72: 4 GPUs per compute tray; trays of a rack share MNNVL.
        GpuProduct("GB200", **_NVIDIA, gpus_per_node=4, hbm_gb=186, node_label_value="NVIDIA-GB200",
                   blackwell=True, fabric="mnnvl", recipe_min_tp=2, low_latency_tp=4,
                   recipe_key="gb200"),
        GpuProduct("GB300", **_NVIDIA, gpus_per_node=4, hbm_gb=288, node_label_value="NVIDIA-GB300",
                   blackwell=True, fabric="mnnvl", recipe_min_tp=2, low_latency_tp=4,
                   recipe_key="gb300"),
        # AMD GPU operator's node labeller: amd.com/gpu.product-name (value chosen here:
        # AMD_Instinct_MI355X; clusters whose labeller reports e.g. an _OAM suffix override it).
        GpuProduct("MI355X", vendor="amd", resource_name="amd.com/gpu", gpus_per_node=8, hbm_gb=288,
                   node_label_key="amd.com/gpu.product-name", node_label_value="AMD_Instinct_MI355X",
                   blackwell=False, fabric="xgmi", recipe_min_tp=2, low_latency_tp=4,
                   recipe_key="mi355x"),
    )
}

# spec.gpu.allocation: DRA claims whole GPUs from the NVIDIA DRA driver (k8s-dra-driver-gpu): its driver name and the
# DeviceClass its chart installs. Other vendors' products keep the device plugin.
DRA_DRIVER = "gpu.nvidia.com"
DRA_DEVICE_CLASS = "gpu.nvidia.com"
DRA_VENDORS = ("nvidia",)

# Product brief: the high-throughput profile is DEP2 (TP1 x DP2 with expert parallelism).
HIGH_THROUGHPUT_DP = 2
HIGH_THROUGHPUT_TP = 1


def default_tensor_parallel_size(product: GpuProduct, high_throughput: bool) -> int:
    """TP per replica when the spec leaves it unset: 1 for DEP, else the low-latency TP."""
    return HIGH_THROUGHPUT_TP if high_throughput else product.low_latency_tp


def default_data_parallel_size(product: GpuProduct, high_throughput: bool) -> int:
    """DP per replica when the spec leaves it unset: the smallest fitting DEP, else 1."""
    return smallest_fitting_dp(product) if high_throughput else 1


def gpu(name: str) -> GpuProduct:
    try:
        return GPU_PRODUCTS[name]
    except KeyError:
        known = ", ".join(GPU_PRODUCTS)
        raise ValueError(f"unknown GPU product {name!r}; known: {known}") from None


def smallest_fitting_dp(product: GpuProduct, tp: int = HIGH_THROUGHPUT_TP) -> int:
    """Smallest power-of-two DP (from DEP2) whose replica holds the weights with Engram offloaded.

    DEP2 fits every Blackwell part and MI355X; H200 needs DEP4 and H100 DEP8 (2 x 141 GB and
    4 x 80 GB cannot hold the ~315 GB of non-Engram weights plus KV).
    """
    dp = HIGH_THROUGHPUT_DP
    while product.replica_hbm_gb(tp * dp) < ENGRAM_OFFLOADED_MINIMUM_GB:
        dp *= 2
    return dp
