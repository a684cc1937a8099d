"""Every engine shape the operator supports, as EngineConfigs: the set the tests and the
cross-check against vLLM's real parser (tools/vllm_flags/crosscheck.py) render and verify:
reference_configs (GPU x shape x role x KV events x EPLB), feature_configs (GPU x shape x role x agent
feature set) and preset_configs (every AgentX point of every preset, per role).
"""

from __future__ import annotations

import itertools

from ..facts import DEFAULT_CHECKPOINT
from ..gpus import GPU_PRODUCTS, GpuProduct, smallest_fitting_dp
from ..lanes import PRESETS
from ..roles import ROLES
from .args import EngineConfig, EplbConfig, KvEvents, KvTransfer
from .features import EngineFeatures, KvOffload, SpeculativeDecoding

ENGINE_ROLES = ("aggregated", *ROLES)  # vLLM engine roles: an aggregated engine does both


def _shapes(product: GpuProduct) -> list[tuple[str, dict, EplbConfig]]:
    """(name, parallel sizes, an EPLB config whose routed + redundant experts split evenly) per GPU."""
    dp = smallest_fitting_dp(product)
    shapes = [
        ("tp", dict(tensor_parallel_size=product.low_latency_tp), EplbConfig(enabled=False)),
        (f"dep{dp}", dict(tensor_parallel_size=1, data_parallel_size=dp, expert_parallel=True),
         EplbConfig(num_redundant_experts=dp, communicator="nixl")),
    ]
    per_node = product.gpus_per_node
    # NVL72 trays: DEP8/16/32 over 2/4/8 trays (GB300 AgentX decode runs DEP16 and DEP32);
    # 8-GPU nodes: DEP16 over two nodes.
    node_counts = (2, 4, 8) if per_node == 4 else (2,)
    for nodes in node_counts:
        size = per_node * nodes
        shapes.append((f"dep{size}x{nodes}n",
                       dict(tensor_parallel_size=1, data_parallel_size=size, expert_parallel=True,
                            nodes_per_replica=nodes),
                       EplbConfig(num_redundant_experts=size)))
    return shapes


def reference_configs(model: str = DEFAULT_CHECKPOINT) -> dict[str, EngineConfig]:
    """Name -> config for GPU x shape x role x KV events x EPLB (EPLB only where it applies)."""
    out = {}
    for name, product in GPU_PRODUCTS.items():
        for (shape, sizes, eplb), role, events, with_eplb in itertools.product(
            _shapes(product), ENGINE_ROLES, (False, True), (False, True)
        ):
            if with_eplb and not eplb.enabled:
                continue
            cfg = EngineConfig(
                role, name, model,
                kv_transfer=KvTransfer() if role != "aggregated" else None,
                kv_events=KvEvents() if events else None,
                eplb=eplb if with_eplb else None,
                **sizes,
            )
            tags = f"{'-events' if events else ''}{'-eplb' if with_eplb else ''}"
            out[f"{name}-{shape}-{role}{tags}"] = cfg
    return out


# Feature sets of the matrix: the API default (everything on), everything off, each one alone, and the
# default with a host KV tier of each backend.
_ON = EngineFeatures()
FEATURE_SETS: dict[str, tuple[EngineFeatures | None, KvOffload | None]] = {
    "default": (_ON, None),
    "off": (EngineFeatures(tool_calling=False, reasoning=False, speculative_decoding=None, text_only=False), None),
    "parsers": (EngineFeatures(speculative_decoding=None, text_only=False), None),
    "dspark3": (EngineFeatures(tool_calling=False, reasoning=False, text_only=False,
                               speculative_decoding=SpeculativeDecoding(num_speculative_tokens=3)), None),
    "adaptive": (EngineFeatures(speculative_decoding=SpeculativeDecoding(adaptive_verification=True)), None),
    "hostkv": (_ON, KvOffload("native", 32)),
    "hostkv-simple": (_ON, KvOffload("simple", 50, lazy=True)),
}


def feature_configs(model: str = DEFAULT_CHECKPOINT) -> dict[str, EngineConfig]:
    """GPU x shape (TP, single-node DEP, one multi-node DEP) x role x feature set, where the set applies
    (adaptive verification is NVIDIA only)."""
    out = {}
    for name, product in GPU_PRODUCTS.items():
        shapes = _shapes(product)
        for (shape, sizes, _eplb), role, (fname, (feats, kv)) in itertools.product(
            [*shapes[:2], shapes[2]], ENGINE_ROLES, FEATURE_SETS.items()
        ):
            if fname == "adaptive" and product.vendor == "amd":
                continue
            out[f"{name}-{shape}-{role}-{fname}"] = EngineConfig(
                role, name, model, kv_transfer=KvTransfer() if role != "aggregated" else None,
                features=feats, kv_offload=kv, **sizes)
    return out


def preset_configs(model: str = DEFAULT_CHECKPOINT) -> dict[str, EngineConfig]:
    """Every AgentX point of every preset, per role, at the layout it was measured at (default features)."""
    out = {}
    for lane in PRESETS.values():
        for point, role in itertools.product(lane.points, ENGINE_ROLES):
            sizes = (dict(tensor_parallel_size=point.tp) if lane.strategy == "tp" else
                     dict(tensor_parallel_size=1, data_parallel_size=point.dp, expert_parallel=True))
            out[f"{lane.name}-{point.name}-{role}"] = EngineConfig(
                role, lane.gpu_product, model, kv_transfer=KvTransfer() if role != "aggregated" else None,
                features=_ON, preset=lane.name, point=point.name, **sizes)
    return out
