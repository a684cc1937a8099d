"""Home of every `vllm serve` flag we render: pure argument building for DeepSeek-V4.1-Flash on vLLM 0.33.0.
The model facts they rest on (checkpoint, routed experts, EPLB communicators) live in v41flash/facts.py.

Plain frozen dataclasses in (EngineConfig), plain data out (EngineCommand / ReplicaCommands). The
settings follow the vLLM 0.33.0 recipe recipes/models/deepseek-ai/DeepSeek-V4.1-Flash.yaml
("recipe" below): base_args/base_env, strategy_overrides (single_node_tp, single_node_dep,
pd_cluster) with their per-GPU hardware overrides, and the gb300_agentx_pd preset for GB300 P/D
with DEP. Dev-image-only parts of the AgentX lanes (push_as_nixl, VLLM_MAX_ASYNC_KV_ADMITS_PER_STEP,
the "symm_mem" EPLB communicator) are not rendered: vLLM 0.33.0 does not have them.

Agent features (tool/reasoning parsers, DSpark, text-only) and the host KV tier come from features.py, the
AgentX presets from v41flash/lanes.py; the order is: recipe rows, P/D rows, preset and point, KV transfer / host
tier, KV events, features (the recipe emits them last), explicit knobs, extra_args.

Every argv built here is checked against the snapshot of vLLM 0.33.0's own parser (flags.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .. import lanes
from ..facts import (
    DSPARK_BLOCK, EPLB_COMMUNICATORS, EPLB_SYNC_ONLY_COMMUNICATORS, KV_LOAD_FAILURE_POLICIES, ROUTED_EXPERTS,
)
from ..gpus import ENGRAM_OFFLOADED_MINIMUM_GB, VRAM_MINIMUM_GB, GpuProduct, gpu
from . import flags
from .features import (
    FEATURE_FLAGS, HOST_KV_GPU_MEMORY_UTILIZATION, KV_OFFLOAD_BACKENDS, EngineFeatures, KvOffload,
    feature_args, offload_connector, with_host_tier,
)

Role = Literal["prefill", "decode", "aggregated"]
EngineProblem = tuple[str, str]  # (field path inside EngineConfig, message)

NIXL_SIDE_CHANNEL_PORT = 5600  # vllm/envs.py VLLM_NIXL_SIDE_CHANNEL_PORT default; + DP rank
DEFAULT_DP_RPC_PORT = 13345  # vLLM's ParallelConfig.data_parallel_rpc_port default
# Kubernetes expands $(VAR) in args from the container env; LeaderWorkerSet sets these two.
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"

TOKENIZER_MODE = "deepseek_v41"  # recipe base_args
ENGINE_READY_TIMEOUT_S = "3600"  # recipe base_env
# Multi-node engines handshake across trays and load Engram per rank; the AgentX PD lane uses 7200.
MULTI_NODE_ENGINE_READY_TIMEOUT_S = "7200"

_CUDAGRAPH_SIZES_8190 = [6, 12, 18, 24, 30, 36, 48, 60, 72, 96, 120, 144, 192, 240, 288, 384, 480,
                         576, 768, 1020, 1536, 2046, 3072, 4092, 6144, 8190]
_AGENTX_PD_PREFILL_GRAPHS = {
    "mode": "VLLM_COMPILE",
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "cudagraph_capture_sizes": _CUDAGRAPH_SIZES_8190[:22],
    "max_cudagraph_capture_size": 2046,
}
# gb300_agentx_pd decode: FULL decode-only graphs in steps of 6 (1 + 5 DSpark tokens) up to 240.
_AGENTX_PD_DECODE_GRAPHS = {
    "cudagraph_mode": "FULL_DECODE_ONLY",
    "cudagraph_capture_sizes": list(range(6, 241, 6)),
    "max_cudagraph_capture_size": 240,
}


# ------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class EplbConfig:
    enabled: bool = True
    num_redundant_experts: int = 0
    window_size: int = 1000
    step_interval: int = 3000
    use_async: bool = True
    communicator: str | None = None  # None: vLLM picks (nixl when available, else torch_gloo)
    log_balancedness: bool = False


@dataclass(frozen=True)
class KvTransfer:
    connector: str = "NixlConnector"
    load_failure_policy: str = "fail"
    ucx_tls: str = ""  # "" = the GPU fabric's default (MNNVL on GB200/GB300)
    extra_config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KvEvents:
    port_base: int = 5557  # vLLM's KVEventsConfig endpoint default; each DP rank adds its rank
    topic: str = "kv-events"


@dataclass(frozen=True)
class EngineConfig:
    role: Role
    gpu_product: str
    model: str  # hub id or a local path; vllm serve's positional model
    tensor_parallel_size: int
    data_parallel_size: int = 1
    data_parallel_size_local: int | None = None  # None: data_parallel_size / nodes_per_replica
    expert_parallel: bool = False
    nodes_per_replica: int = 1
    gpus_per_node: int | None = None  # None: the product's default
    revision: str = ""
    served_model_name: str = ""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    eplb: EplbConfig | None = None
    kv_transfer: KvTransfer | None = None
    kv_events: KvEvents | None = None
    port: int = 8000
    data_parallel_rpc_port: int = DEFAULT_DP_RPC_PORT
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # None: no agent features (the builder's neutral form); the API turns them on by default
    features: EngineFeatures | None = None
    kv_offload: KvOffload | None = None  # None: no host KV tier unless the preset point brings one
    preset: str = ""  # an AgentX lane of lanes.PRESETS; "" = none
    point: str = ""  # the lane's point; "" = chosen from the layout and max_num_seqs (lanes.select_point)
    load_format: str = ""  # --load-format; "" = vLLM's default (auto)


# ----------------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class EngineCommand:
    command: tuple[str, ...]  # container command
    args: tuple[str, ...]  # container args: what `vllm serve` parses (after $(VAR) expansion)
    env: Mapping[str, str]
    env_from_field: Mapping[str, str]  # env var -> downward-API fieldPath
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ReplicaCommands:
    leader: EngineCommand  # the only pod of a single-node replica
    worker: EngineCommand | None  # LeaderWorkerSet workers (index 1..nodes-1), headless


class InvalidEngineConfig(ValueError):
    def __init__(self, problems: list[EngineProblem]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


# ---------------------------------------------------------------------------- small helpers
def to_json(value: Any) -> str:
    """Compact JSON as the recipe writes it (no spaces)."""
    return json.dumps(value, separators=(",", ":"))


def gpus_per_node(cfg: EngineConfig) -> int:
    return cfg.gpus_per_node or gpu(cfg.gpu_product).gpus_per_node


def dp_local(cfg: EngineConfig) -> int:
    if cfg.data_parallel_size_local is not None:
        return cfg.data_parallel_size_local
    return max(cfg.data_parallel_size // cfg.nodes_per_replica, 1)


def ep_size(cfg: EngineConfig) -> int:
    """vLLM's EP group spans TP x DP ranks of the whole replica (PCP is not used here)."""
    return cfg.tensor_parallel_size * cfg.data_parallel_size


def replica_gpus(cfg: EngineConfig) -> int:
    return cfg.tensor_parallel_size * cfg.data_parallel_size


def is_dep(cfg: EngineConfig) -> bool:
    return cfg.data_parallel_size > 1 and cfg.expert_parallel


def uses_agentx_pd(cfg: EngineConfig) -> bool:
    """The gb300_agentx_pd preset: GB300, a P/D role, TP1 with data + expert parallelism."""
    return (
        cfg.gpu_product == "GB300"
        and cfg.role != "aggregated"
        and cfg.tensor_parallel_size == 1
        and is_dep(cfg)
    )


def engram_offloaded(cfg: EngineConfig, product: GpuProduct) -> bool:
    """Whether the Engram tables go to pinned host memory (recipe: per GPU; MI355X by fit)."""
    if product.vendor == "amd" and not is_dep(cfg):
        # recipe mi355x TP2 offloads; mi355x_agentx TP4 points keep them resident (cpu_offload:false)
        return product.replica_hbm_gb(replica_gpus(cfg)) < VRAM_MINIMUM_GB
    # DEP: every TP1 rank would hold whole tables, so offload (as the recipe's Blackwell DEP rows)
    return True  # every NVIDIA row of the recipe offloads (h100 variant, h200, Blackwell rows)


# --------------------------------------------------------------------------- argv assembly
class _Args:
    """Ordered flag -> values; setting a flag again replaces it in place (recipe last-wins)."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, ...]] = {}

    def set(self, flag: str, *values: Any) -> None:
        self._items[flag] = tuple(str(v) for v in values)

    def set_json(self, flag: str, value: Any) -> None:
        self.set(flag, to_json(value))

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, values in self._items.items():
            out.append(flag)
            out.extend(values)
        return out


def _identity_args(cfg: EngineConfig, a: _Args) -> None:
    if cfg.served_model_name:
        a.set("--served-model-name", cfg.served_model_name)
    if cfg.revision:
        a.set("--revision", cfg.revision)
    a.set("--port", cfg.port)
    a.set("--tokenizer-mode", TOKENIZER_MODE)  # recipe base_args


def _parallel_args(cfg: EngineConfig, a: _Args, node_rank: str | None) -> None:
    a.set("--tensor-parallel-size", cfg.tensor_parallel_size)
    if cfg.data_parallel_size > 1:
        a.set("--data-parallel-size", cfg.data_parallel_size)
    if cfg.nodes_per_replica > 1:
        # Multi-node DP: the leader's API server drives every rank; vLLM 0.33.0 derives a node's
        # first DP rank from --node-rank (node_rank x local ranks), so no shell arithmetic.
        a.set("--data-parallel-size-local", dp_local(cfg))
        a.set("--data-parallel-address", LWS_LEADER_ADDRESS)
        a.set("--data-parallel-rpc-port", cfg.data_parallel_rpc_port)
        a.set("--nnodes", cfg.nodes_per_replica)
        a.set("--node-rank", node_rank if node_rank is not None else 0)
    if cfg.expert_parallel:
        a.set("--enable-expert-parallel")
    if cfg.eplb is not None and cfg.eplb.enabled:
        a.set("--enable-eplb")
        a.set_json("--eplb-config", eplb_json(cfg.eplb))


def eplb_json(eplb: EplbConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "window_size": eplb.window_size,
        "step_interval": eplb.step_interval,
        "num_redundant_experts": eplb.num_redundant_experts,
        "use_async": eplb.use_async,
    }
    if eplb.log_balancedness:
        out["log_balancedness"] = True
    if eplb.communicator is not None:
        out["communicator"] = eplb.communicator
    return out


def _blackwell_tp_rows(product: GpuProduct, a: _Args, notes: list[str]) -> None:
    # recipe single_node_tp.hardware_overrides.blackwell
    a.set_json("--attention-config", lanes.ATTN_FLASHINFER_SPARSE)
    a.set("--kv-cache-dtype", "fp8")
    a.set("--max-num-seqs", 128)
    # recipe single_node_tp b200/gb200/gb300/b300: Engram tables to pinned host DRAM (UVA)
    a.set_json("--engram-config", {"cpu_offload": True})
    if product.name == "B300":
        # recipe single_node_tp.b300: exact-GPU override (graphs to 8190, 8192 tokens, 256 seqs)
        a.set_json("--compilation-config", {
            "mode": "VLLM_COMPILE",
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "cudagraph_capture_sizes": _CUDAGRAPH_SIZES_8190,
        })
        a.set("--max-cudagraph-capture-size", 8190)
        a.set("--max-num-batched-tokens", 8192)
        a.set("--max-num-seqs", 256)
        notes.append("B300: recipe exact-GPU override (CUDA graphs to 8190, 256 seqs)")


def _blackwell_dep_rows(a: _Args) -> None:
    # recipe single_node_dep.hardware_overrides.blackwell: MegaMoE + MegaAttention
    a.set_json("--kernel-config", {"moe_backend": "deep_gemm_mega_moe"})
    a.set_json("--attention-config", lanes.ATTN_MEGA)
    a.set("--kv-cache-dtype", "fp8")
    a.set("--max-num-seqs", 128)
    # recipe DEP row sets embedding_across_dp; cpu_offload explicit as the B200/GB* rows offload
    a.set_json("--engram-config", {"cpu_offload": True, "embedding_across_dp": True})


def _hopper_rows(cfg: EngineConfig, product: GpuProduct, a: _Args, env: dict, notes: list[str]):
    # recipe single_node_tp.h200 / variant h100: Engram tables to pinned host DRAM
    a.set_json("--engram-config", {"cpu_offload": True})
    if is_dep(cfg):
        notes.append(f"{product.name} DEP: the recipe has no Hopper DEP row; Engram offloaded as in "
                     "its Hopper TP rows so the weights fit")
    if product.name == "H100":
        # recipe variant hardware_overrides.h100: indexer logits buffer capped at 4096 tokens
        a.set("--max-num-batched-tokens", 4096)
        a.set("--gpu-memory-utilization", 0.92)
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def _amd_rows(cfg: EngineConfig, product: GpuProduct, a: _Args, env: dict, notes: list[str]):
    # recipe hardware_overrides.amd: CK a8w4 experts through aiter
    a.set("--gpu-memory-utilization", 0.9)
    a.set("--moe-backend", "aiter")
    env.update({
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_USE_AITER_MOE": "1",
        "AITER_TRITON_LOG_LEVEL": "ERROR",
        "VLLM_USE_BREAKABLE_CUDAGRAPH": "1",  # ROCm sparse SWA backend is UNIFORM_BATCH only
    })
    a.set_json("--engram-config", {"cpu_offload": engram_offloaded(cfg, product)})
    if not is_dep(cfg):
        # recipe single_node_tp.mi355x: paged MXFP4 indexer, block 128, mono decode kernels
        a.set_json("--attention-config", lanes.ATTN_INDEXER)
        a.set("--block-size", 128)
        a.set("--monokernel")
        env["VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA"] = "1"
        env["VLLM_ROCM_QUICK_REDUCE_QUANTIZATION"] = "INT4"
    notes.append("MI355X: the recipe verified these rows on the ROCm nightly image; 0.33.0's parser "
                 "accepts every flag")


def _hardware_rows(cfg: EngineConfig, product: GpuProduct, a: _Args, env: dict, notes: list[str]):
    if product.vendor == "amd":
        _amd_rows(cfg, product, a, env, notes)
    elif product.blackwell:
        if is_dep(cfg):
            _blackwell_dep_rows(a)
        else:
            _blackwell_tp_rows(product, a, notes)
    else:
        _hopper_rows(cfg, product, a, env, notes)


def _pd_rows(cfg: EngineConfig, a: _Args, env: dict, notes: list[str]) -> None:
    # recipe strategy_overrides.pd_cluster (verified 1P1D on GB200 NVL4)
    env["VLLM_DEEP_GEMM_WARMUP"] = "skip"
    a.set("--max-num-seqs", 32)
    if uses_agentx_pd(cfg):
        _agentx_pd_rows(cfg, a, env, notes)


def _agentx_pd_rows(cfg: EngineConfig, a: _Args, env: dict, notes: list[str]) -> None:
    # recipe presets.gb300_agentx_pd: MegaMoE, MegaAttention, Engram offload, KV over MNNVL
    a.set("--kv-cache-dtype", "fp8")
    a.set_json("--attention-config", lanes.ATTN_MEGA)
    a.set_json("--kernel-config", {
        "moe_backend": "deep_gemm_mega_moe",
        "sparse_indexer_topk_backend": "deep_select",
    })
    a.set_json("--engram-config", {"cpu_offload": True})
    a.set("--enable-ep-weight-filter")
    a.set("--gpu-memory-utilization", 0.95)
    a.set("--numa-bind")
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if cfg.role == "prefill":
        a.set("--max-num-seqs", 64)
        a.set("--max-num-batched-tokens", 32768)
        a.set("--long-prefill-token-threshold", 8192)
        a.set_json("--compilation-config", _AGENTX_PD_PREFILL_GRAPHS)
    else:
        # 40 sequences per rank; batched tokens 10x seqs (1 + 5 DSpark tokens per step, rounded)
        a.set("--max-num-seqs", 40)
        a.set("--max-num-batched-tokens", 400)
        a.set_json("--compilation-config", _AGENTX_PD_DECODE_GRAPHS)
        a.set("--no-enable-prefix-caching")
    notes.append("GB300 P/D: recipe gb300_agentx_pd preset (release-wheel settings only; the lane's "
                 "dev-image push_as_nixl connector and symm_mem EPLB are not in 0.33.0)")


def kv_transfer_json(cfg: EngineConfig) -> dict[str, Any]:
    kv = cfg.kv_transfer or KvTransfer()
    out: dict[str, Any] = {
        "kv_connector": kv.connector,
        # NIXL: prefill produces KV, decode consumes it (kv_both is deprecated for NIXL)
        "kv_role": "kv_producer" if cfg.role == "prefill" else "kv_consumer",
        "kv_load_failure_policy": kv.load_failure_policy,
    }
    if kv.extra_config:
        out["kv_connector_extra_config"] = dict(kv.extra_config)
    return out


def kv_events_json(events: KvEvents) -> dict[str, Any]:
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events.port_base}",  # vLLM adds the DP rank to this port
        "topic": events.topic,
    }


def _rows_max_num_seqs(cfg: EngineConfig) -> int | None:
    """--max-num-seqs the recipe rows render for this engine before any preset (None: vLLM's default)."""
    a, env, notes = _Args(), {}, []
    _hardware_rows(cfg, gpu(cfg.gpu_product), a, env, notes)
    if cfg.role != "aggregated":
        _pd_rows(cfg, a, env, notes)
    values = a._items.get("--max-num-seqs")
    return int(values[0]) if values else None


def selected_point(cfg: EngineConfig) -> lanes.Point | None:
    """The AgentX point this engine runs (None without a preset); ValueError when none fits."""
    if not cfg.preset:
        return None
    target = cfg.max_num_seqs if cfg.max_num_seqs is not None else _rows_max_num_seqs(cfg)
    return lanes.select_point(lanes.preset(cfg.preset), cfg.tensor_parallel_size, cfg.data_parallel_size,
                               cfg.point, target, host_kv=cfg.kv_offload is not None)


def effective_kv_offload(cfg: EngineConfig) -> KvOffload | None:
    """The host KV tier rendered: the explicit one, else the preset point's."""
    if cfg.kv_offload is not None:
        return cfg.kv_offload
    point = selected_point(cfg)
    if point is not None and point.host_kv is not None:
        return KvOffload(point.host_kv.backend, point.host_kv.size_gib, point.host_kv.lazy)
    return None


def _preset_rows(cfg: EngineConfig, a: _Args, env: dict, notes: list[str]) -> None:
    """recipe presets.<lane>: the lane's server args and env, then its point's args (last wins)."""
    lane = lanes.preset(cfg.preset)
    point = selected_point(cfg)
    assert point is not None
    for flag, values in (*lane.args, *point.args):
        a.set(flag, *values)
    env.update(dict(lane.env))
    notes.append(f"AgentX preset {lane.name}, point {point.name} (concurrency {point.concurrency}; "
                 f"recipe source {lane.source})")


def _host_kv_rows(cfg: EngineConfig, kv: KvOffload, a: _Args) -> None:
    """Aggregated engines: the recipe's flags (native) or the Simple CPU connector alone."""
    if kv.backend == "native":
        a.set("--kv-offloading-backend", "native")
        a.set("--kv-offloading-size", f"{kv.size_gib:g}")
    else:
        a.set_json("--kv-transfer-config", offload_connector(kv))


def _host_kv_gpu_memory(cfg: EngineConfig, a: _Args) -> None:
    """recipe b200_agentx_dep host-KV points: GPU memory at most 0.955, headroom for the indexer logits."""
    current = a._items.get("--gpu-memory-utilization")
    if cfg.gpu_memory_utilization is None and current and float(current[0]) > HOST_KV_GPU_MEMORY_UTILIZATION:
        a.set("--gpu-memory-utilization", HOST_KV_GPU_MEMORY_UTILIZATION)


def _feature_rows(cfg: EngineConfig, product: GpuProduct, a: _Args) -> None:
    # recipe: "Features emit last in resolveCommand"; with DSpark on it runs in both P/D pools
    if cfg.features is not None:
        for flag, values in feature_args(cfg.features, product.vendor):
            a.set(flag, *values)


def _user_knobs(cfg: EngineConfig, a: _Args) -> None:
    """Explicit EngineConfig values win over recipe rows (replaced in place)."""
    if cfg.max_num_seqs is not None:
        a.set("--max-num-seqs", cfg.max_num_seqs)
    if cfg.max_num_batched_tokens is not None:
        a.set("--max-num-batched-tokens", cfg.max_num_batched_tokens)
    if cfg.max_model_len is not None:
        a.set("--max-model-len", cfg.max_model_len)
    if cfg.gpu_memory_utilization is not None:
        a.set("--gpu-memory-utilization", cfg.gpu_memory_utilization)
    if cfg.load_format:
        a.set("--load-format", cfg.load_format)


def _pd_env(cfg: EngineConfig, product: GpuProduct, env: dict) -> dict[str, str]:
    """UCX for NIXL per fabric; the side-channel host comes from the pod IP (downward API)."""
    kv = cfg.kv_transfer or KvTransfer()
    if kv.ucx_tls:
        env["UCX_TLS"] = kv.ucx_tls
    elif product.fabric == "mnnvl":
        # recipe gb300_agentx_pd env: KV moves over the NVLink fabric between trays
        env["UCX_TLS"] = "cuda_copy,cuda_ipc,tcp"
    if product.fabric == "mnnvl":
        env["UCX_CUDA_IPC_ENABLE_MNNVL"] = "y"
    return {"VLLM_NIXL_SIDE_CHANNEL_HOST": "status.podIP"}


def _engine_command(cfg: EngineConfig, node_rank: str | None, headless: bool) -> EngineCommand:
    product = gpu(cfg.gpu_product)
    a = _Args()
    env: dict[str, str] = {"VLLM_ENGINE_READY_TIMEOUT_S": ENGINE_READY_TIMEOUT_S}  # recipe base_env
    notes: list[str] = []
    env_from_field: dict[str, str] = {}
    _identity_args(cfg, a)
    _parallel_args(cfg, a, node_rank)
    _hardware_rows(cfg, product, a, env, notes)
    if cfg.role != "aggregated":
        _pd_rows(cfg, a, env, notes)
    if cfg.preset:
        _preset_rows(cfg, a, env, notes)
    host_kv = effective_kv_offload(cfg)
    if cfg.role != "aggregated":
        kv_json = kv_transfer_json(cfg)
        # --kv-offloading-size would replace NIXL (VllmConfig._post_init_kv_transfer_config): a MultiConnector
        a.set_json("--kv-transfer-config", with_host_tier(kv_json, host_kv) if host_kv else kv_json)
        env_from_field = _pd_env(cfg, product, env)
    if host_kv is not None:
        if cfg.role == "aggregated":
            _host_kv_rows(cfg, host_kv, a)
        _host_kv_gpu_memory(cfg, a)
    if cfg.kv_events is not None:
        a.set_json("--kv-events-config", kv_events_json(cfg.kv_events))
    _feature_rows(cfg, product, a)
    _user_knobs(cfg, a)
    if cfg.nodes_per_replica > 1:
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = MULTI_NODE_ENGINE_READY_TIMEOUT_S
    if headless:
        a.set("--headless")  # workers run engines only; the leader's API server drives them
    env.update(cfg.extra_env)
    # an explicit extra_env value wins over the downward-API one (never both in a pod spec)
    env_from_field = {k: v for k, v in env_from_field.items() if k not in cfg.extra_env}
    args = (cfg.model, *a.argv(), *cfg.extra_args)
    return EngineCommand(("vllm", "serve"), args, env, env_from_field, tuple(notes))


# ------------------------------------------------------------------------------- public API
def build_replica(cfg: EngineConfig) -> ReplicaCommands:
    """Commands for one replica: the leader pod, and the LeaderWorkerSet worker template."""
    problems = validate_engine_config(cfg)
    if problems:
        raise InvalidEngineConfig(problems)
    return _build_unchecked(cfg)


def build_command(cfg: EngineConfig) -> EngineCommand:
    """The one command of a single-node replica."""
    replica = build_replica(cfg)
    if replica.worker is not None:
        raise InvalidEngineConfig([("nodes_per_replica", "multi-node replica: use build_replica")])
    return replica.leader


def _build_unchecked(cfg: EngineConfig) -> ReplicaCommands:
    if cfg.nodes_per_replica == 1:
        return ReplicaCommands(_engine_command(cfg, None, headless=False), None)
    leader = _engine_command(cfg, "0", headless=False)
    worker = _engine_command(cfg, LWS_WORKER_INDEX, headless=True)
    return ReplicaCommands(leader, worker)


def expand_k8s_vars(args: tuple[str, ...] | list[str], env: Mapping[str, str]) -> list[str]:
    """What the kubelet does to container args: $(VAR) -> value for variables it knows."""
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


def kv_event_ports(cfg: EngineConfig, node_rank: int = 0) -> list[int]:
    """KV-event publisher ports one pod binds (one per local DP rank)."""
    if cfg.kv_events is None:
        return []
    return [cfg.kv_events.port_base + r for r in _pod_dp_ranks(cfg, node_rank)]


def nixl_side_channel_ports(cfg: EngineConfig, node_rank: int = 0) -> list[int]:
    if cfg.role == "aggregated":
        return []
    return [NIXL_SIDE_CHANNEL_PORT + r for r in _pod_dp_ranks(cfg, node_rank)]


def _pod_dp_ranks(cfg: EngineConfig, node_rank: int) -> range:
    local = dp_local(cfg)
    return range(node_rank * local, node_rank * local + local)


# ------------------------------------------------------------------------------- validation
def validate_engine_config(cfg: EngineConfig) -> list[EngineProblem]:
    """Every reason vLLM 0.33.0 (or the hardware) would refuse this config, as (path, message)."""
    try:
        product = gpu(cfg.gpu_product)
    except ValueError as exc:
        return [("gpu_product", str(exc))]
    problems = [
        *_validate_sizes(cfg),
        *_validate_topology(cfg, product),
        *_validate_memory(cfg, product),
        *validate_eplb(cfg),
        *_validate_pd(cfg),
        *_validate_ports(cfg),
        *validate_features(cfg, product),
    ]
    if problems:
        return problems
    return _validate_rendered(cfg)


def _validate_sizes(cfg: EngineConfig) -> list[EngineProblem]:
    problems = []
    for name in ("tensor_parallel_size", "data_parallel_size", "nodes_per_replica"):
        if getattr(cfg, name) < 1:
            problems.append((name, "must be >= 1"))
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            problems.append((name, "must be >= 1"))
    if cfg.max_model_len is not None and cfg.max_model_len > 1048576:
        problems.append(("max_model_len", "DeepSeek-V4.1-Flash's context is 1,048,576 tokens"))
    gmu = cfg.gpu_memory_utilization
    if gmu is not None and not 0 < gmu <= 1:
        problems.append(("gpu_memory_utilization", "must be in (0, 1]"))
    if cfg.role not in ("prefill", "decode", "aggregated"):
        problems.append(("role", f"unknown role {cfg.role!r}; prefill, decode or aggregated"))
    if not cfg.model:
        problems.append(("model", "a checkpoint id or path is required"))
    return problems


def _validate_topology(cfg: EngineConfig, product: GpuProduct) -> list[EngineProblem]:
    gpn = gpus_per_node(cfg)
    tp, dp, nodes = cfg.tensor_parallel_size, cfg.data_parallel_size, cfg.nodes_per_replica
    if min(tp, dp, nodes) < 1:
        return []
    problems = []
    if tp > gpn:
        problems.append(("tensor_parallel_size",
                         f"TP{tp} does not fit a {product.name} node of {gpn} GPUs (tensor "
                         "parallelism stays inside one node)"))
    if nodes == 1:
        if tp * dp > gpn:
            problems.append(("data_parallel_size",
                             f"a replica needs TP x DP = {tp * dp} GPUs but a {product.name} node "
                             f"has {gpn}; set nodes_per_replica to span nodes"))
        if cfg.data_parallel_size_local not in (None, dp):
            problems.append(("data_parallel_size_local", "must equal data_parallel_size on one node"))
        return problems
    if dp % nodes != 0 or tp * dp != nodes * gpn:
        problems.append(("nodes_per_replica",
                         f"a {nodes}-node replica must fill its nodes: TP x DP = {tp * dp} GPUs vs "
                         f"{nodes} x {gpn} = {nodes * gpn} (only data parallelism spans nodes)"))
    elif cfg.data_parallel_size_local not in (None, dp // nodes):
        problems.append(("data_parallel_size_local",
                         f"must be data_parallel_size / nodes_per_replica = {dp // nodes}"))
    return problems


def _validate_memory(cfg: EngineConfig, product: GpuProduct) -> list[EngineProblem]:
    total = product.replica_hbm_gb(replica_gpus(cfg))
    if total >= ENGRAM_OFFLOADED_MINIMUM_GB or min(cfg.tensor_parallel_size, cfg.data_parallel_size) < 1:
        return []
    return [("tensor_parallel_size",
             f"a replica of {replica_gpus(cfg)} x {product.name} holds {total} GB; DeepSeek-V4.1-Flash "
             f"needs >= {ENGRAM_OFFLOADED_MINIMUM_GB} GB even with the Engram tables in host memory "
             f"(recipe: TP{product.recipe_min_tp} is the smallest TP on {product.name}; "
             f"{VRAM_MINIMUM_GB} GB with them resident)")]


def validate_eplb(cfg: EngineConfig) -> list[EngineProblem]:
    """vLLM 0.33.0 ParallelConfig/EPLBConfig/FusedMoE rules for expert-parallel load balancing."""
    eplb = cfg.eplb
    if eplb is None:
        return []
    problems: list[EngineProblem] = []
    if not eplb.enabled:
        if eplb.num_redundant_experts != 0:
            problems.append(("eplb.num_redundant_experts",
                             "redundant experts need EPLB enabled (vLLM refuses them otherwise)"))
        return problems
    if not cfg.expert_parallel:
        problems.append(("eplb.enabled", "EPLB needs expert parallelism (expert_parallel: true)"))
    if ep_size(cfg) <= 1:
        problems.append(("eplb.enabled", "EPLB needs TP x DP > 1 (an expert-parallel group to balance)"))
    if eplb.num_redundant_experts < 0:
        problems.append(("eplb.num_redundant_experts", "must be >= 0"))
    elif ep_size(cfg) >= 1 and (ROUTED_EXPERTS + eplb.num_redundant_experts) % ep_size(cfg) != 0:
        problems.append(("eplb.num_redundant_experts",
                         f"{ROUTED_EXPERTS} routed + {eplb.num_redundant_experts} redundant experts "
                         f"do not split evenly over {ep_size(cfg)} expert-parallel ranks"))
    for name in ("window_size", "step_interval"):
        if getattr(eplb, name) <= 0:
            problems.append((f"eplb.{name}", "must be > 0"))
    if eplb.communicator is not None and eplb.communicator not in EPLB_COMMUNICATORS:
        problems.append(("eplb.communicator",
                         f"{eplb.communicator!r} is not accepted by vLLM 0.33.0; one of "
                         f"{', '.join(EPLB_COMMUNICATORS)} (or unset for automatic)"))
    elif eplb.use_async and eplb.communicator in EPLB_SYNC_ONLY_COMMUNICATORS:
        problems.append(("eplb.communicator",
                         f"{eplb.communicator} conflicts with async EPLB (use_async) in vLLM 0.33.0; "
                         "use nixl or torch_gloo, unset it, or turn use_async off"))
    return problems


def validate_features(cfg: EngineConfig, product: GpuProduct) -> list[EngineProblem]:
    """Agent features, the host KV tier and the AgentX preset/point: what vLLM or the lane would refuse."""
    problems: list[EngineProblem] = []
    spec = cfg.features.speculative_decoding if cfg.features is not None else None
    if spec is not None:
        if not 1 <= spec.num_speculative_tokens <= DSPARK_BLOCK:
            problems.append(("features.speculative_decoding.num_speculative_tokens",
                             f"DSpark drafts blocks of {DSPARK_BLOCK} tokens (its trained block size): 1..{DSPARK_BLOCK}"))
        if spec.adaptive_verification and product.vendor == "amd":
            problems.append(("features.speculative_decoding.adaptive_verification",
                             "vLLM refuses DSpark adaptive verification on ROCm (recipe: the V4.1 indexer and sparse "
                             "SWA backends fail maybe_create_adaptive_verification_manager's checks); leave it off, "
                             "DSpark then verifies the whole block"))
    kv = cfg.kv_offload
    if kv is not None:
        if kv.backend not in KV_OFFLOAD_BACKENDS:
            problems.append(("kv_offload.backend", f"one of {', '.join(KV_OFFLOAD_BACKENDS)}"))
        if not kv.size_gib > 0:
            problems.append(("kv_offload.size_gib", "must be > 0 (GiB of host KV per DP rank)"))
        if kv.lazy and kv.backend != "simple":
            problems.append(("kv_offload.lazy", "lazy offload is a SimpleCPUOffloadConnector setting: backend simple"))
    problems += _validate_preset(cfg, product)
    own: set[str] = set()
    if not problems:
        try:
            own = {t.split("=", 1)[0] for t in _build_unchecked(replace(cfg, extra_args=())).leader.args
                   if t.startswith("--")}
        except (ValueError, KeyError):  # another rule reports why it cannot render
            pass
    for token in cfg.extra_args:
        flag = token.split("=", 1)[0]
        if flag in FEATURE_FLAGS and flag in own:
            problems.append(("extra_args", f"{flag} is rendered from {FEATURE_FLAGS[flag].replace('<role>', cfg.role)}"
                                           ": change it there, not in extraArgs"))
        elif flag in ("--kv-offloading-size", "--kv-offloading-backend") and cfg.role != "aggregated":
            problems.append(("extra_args", f"{flag} makes vLLM 0.33.0 replace the NIXL connector with its offloading "
                                           "one (P/D would stop handing KV over): use kvOffload, which adds the host "
                                           "tier next to NIXL"))
    return problems


def _validate_preset(cfg: EngineConfig, product: GpuProduct) -> list[EngineProblem]:
    if not cfg.preset:
        return [("point", "a point needs a preset (spec.preset)")] if cfg.point else []
    try:
        lane = lanes.preset(cfg.preset)
    except ValueError as exc:
        return [("preset", str(exc))]
    if lane.gpu_product != product.name:
        return [("preset", f"{lane.name} is the {lane.gpu_product} lane; this deployment runs {product.name}")]
    if lane.strategy == "dep" and not is_dep(cfg):
        return [("preset", f"{lane.name} runs data + expert parallel engines: profile high-throughput")]
    if lane.strategy == "tp" and (cfg.data_parallel_size > 1 or cfg.expert_parallel):
        return [("preset", f"{lane.name} runs tensor-parallel engines: profile low-latency")]
    try:
        selected_point(cfg)
    except ValueError as exc:
        return [("point", str(exc))]
    return []


def _validate_pd(cfg: EngineConfig) -> list[EngineProblem]:
    kv = cfg.kv_transfer
    if cfg.role == "aggregated":
        return [("kv_transfer", "an aggregated engine has no KV transfer")] if kv else []
    if kv is None:
        return [("kv_transfer", f"a {cfg.role} engine needs kv_transfer (NIXL) to reach its peer")]
    problems = []
    if not kv.connector:
        problems.append(("kv_transfer.connector", "a KV connector is required"))
    if kv.load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
        problems.append(("kv_transfer.load_failure_policy",
                         f"one of {', '.join(KV_LOAD_FAILURE_POLICIES)}"))
    return problems


def _validate_ports(cfg: EngineConfig) -> list[EngineProblem]:
    problems = []
    if not 1024 <= cfg.port <= 65535:
        problems.append(("port", "must be in 1024..65535"))
    if cfg.kv_events is not None and not cfg.kv_events.topic:
        problems.append(("kv_events.topic", "routers subscribe by topic: it must not be empty"))
    for node_rank in range(max(cfg.nodes_per_replica, 1)):
        events = kv_event_ports(cfg, node_rank)
        if events and (min(events) < 1024 or max(events) > 65535):
            problems.append(("kv_events.port_base", f"KV-event ports {events[0]}..{events[-1]} "
                                                    "leave 1024..65535"))
            break
        taken = {*nixl_side_channel_ports(cfg, node_rank), cfg.port}
        if cfg.nodes_per_replica > 1:
            taken.add(cfg.data_parallel_rpc_port)
        clash = sorted(taken.intersection(events))
        if clash:
            problems.append(("kv_events.port_base",
                             f"KV-event ports (base {cfg.kv_events.port_base} + DP rank) collide with "
                             f"ports {clash} (HTTP, NIXL side channel 5600 + DP rank, DP RPC)"))
            break
    return problems


def _validate_rendered(cfg: EngineConfig) -> list[EngineProblem]:
    """The final argv must pass vLLM 0.33.0's parser snapshot; blame extra_args when they add it."""
    own = set(_parser_problems(replace(cfg, extra_args=())))
    return [("args" if message in own else "extra_args", message)
            for message in _parser_problems(cfg)]


def _parser_problems(cfg: EngineConfig) -> list[str]:
    replica = _build_unchecked(cfg)
    sample_env = {"LWS_LEADER_ADDRESS": "leader.example", "LWS_WORKER_INDEX": "1"}
    messages: list[str] = []
    for command in (replica.leader, replica.worker):
        if command is not None:
            messages += flags.check_serve_args(expand_k8s_vars(command.args, sample_env))
    return list(dict.fromkeys(messages))
