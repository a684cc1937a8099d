"""The InferenceX AgentX lanes of the vLLM 0.33.0 recipe as selectable presets and points.

Source: recipes/models/deepseek-ai/DeepSeek-V4.1-Flash.yaml in the vllm==0.33.0 sdist, section
`presets` (b200_agentx_tp, b200_agentx_dep, b300_agentx_dep, mi355x_agentx). Each preset carries the
lane's server-wide args/env and its per-concurrency points; a point names the tensor/data parallel
layout it was measured at, and its args replace the preset's in place (recipe last-wins).

Not here: b300_agentx_tp (its `--additional-config {"decode_backend":"latency_specialized"}` needs the
specialized decode of vllm-project/vllm#61868/#61869, which is not in the 0.33.0 release image), and
gb300_agentx_pd, which the argument builder applies by itself to GB300 P/D with DEP (vllm/args.py).
Every lane verifies the whole DSpark block (json_args enable_adaptive_verification: false); that is the
default of spec.features.speculativeDecoding.adaptiveVerification, so presets add nothing there.

Home of the lanes: the API (spec.preset's enum and its CEL rules), the argument builder and the catalog read them
from here. A leaf: it imports nothing of the package.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

Flag = tuple[str, tuple[str, ...]]  # (flag, values) in argv order


@dataclass(frozen=True)
class HostKv:
    """A point's host-DRAM KV tier (size per DP rank, GiB)."""
    backend: str  # native (--kv-offloading-backend native) | simple (SimpleCPUOffloadConnector)
    size_gib: float
    lazy: bool = False


@dataclass(frozen=True)
class Point:
    name: str
    concurrency: int  # the lane's expected concurrent sessions per server
    tp: int
    dp: int
    args: tuple[Flag, ...] = ()
    host_kv: HostKv | None = None
    default: bool = False  # the recipe's default point of the preset

    @property
    def max_num_seqs(self) -> int | None:
        return next((int(v[0]) for f, v in self.args if f == "--max-num-seqs"), None)


@dataclass(frozen=True)
class Preset:
    name: str
    gpu_product: str
    strategy: str  # tp (single_node_tp, profile low-latency) | dep (single_node_dep, high-throughput)
    source: str
    args: tuple[Flag, ...]
    env: tuple[tuple[str, str], ...]
    points: tuple[Point, ...]

    def point(self, name: str) -> Point | None:
        return next((p for p in self.points if p.name == name), None)

    @property
    def default_point(self) -> Point:
        return next(p for p in self.points if p.default)


def _j(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _flags(*pairs) -> tuple[Flag, ...]:
    out = []
    for flag, *values in pairs:
        out.append((flag, tuple(str(v) if not isinstance(v, dict | list) else _j(v) for v in values)))
    return tuple(out)


# Piecewise graph sizes in multiples of the six-token DSpark verification block (recipe anchors).
_S576 = [6, 12, 18, 24, 30, 36, 48, 60, 72, 96, 120, 144, 192, 240, 288, 384, 480, 576]
_S4092 = [*_S576, 768, 1020, 1536, 2046, 3072, 4092]
_S8190 = [*_S4092, 6144, 8190]
_S4096 = [*_S576, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096]
_REPLAY = [6, 12, 18, 24, 30, 36, 48, 60, 72, 96, 120, 144, 192, 240, 288, 384, 480, 576, 768, 1020, 1536,
           2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096]


def _cg(sizes, replay=None) -> dict:
    out = {"mode": "VLLM_COMPILE", "cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": sizes}
    if replay is not None:
        out["decoder_replay_cudagraph_capture_sizes"] = replay
    return out


_CG4092, _CG8190, _CG8190_REPLAY = _cg(_S4092), _cg(_S8190), _cg(_S8190, _REPLAY)
_CG576, _CG4096 = _cg(_S576), _cg(_S4096)
# --attention-config values (the recipe's): the sparse indexer alone, and with each MLA backend. Home of these
# tables: vllm/args.py renders them for the presets and points here and for the base GB300/B300 flags.
ATTN_INDEXER = {"indexer_kv_dtype": "mxfp4", "indexer_sparse_logits": True}
ATTN_FLASHINFER_SPARSE = {"backend": "FLASHINFER_MLA_SPARSE_DSV41", **ATTN_INDEXER}
ATTN_MEGA = {"backend": "FLASHMLA_MEGA_ATTN_DSV41", **ATTN_INDEXER}
_LANE_ENV = (("VLLM_USE_V2_MODEL_RUNNER", "1"), ("VLLM_ENGINE_READY_TIMEOUT_S", "7200"))  # autotune: long start


def _b200_tp_point(name, conc, tp, seqs, tokens, graphs, cap, default=False) -> Point:
    return Point(name, conc, tp, 1, _flags(("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens),
                                          ("--compilation-config", graphs), ("--max-cudagraph-capture-size", cap)),
                 default=default)


B200_AGENTX_TP = Preset(
    "b200_agentx_tp", "B200", "tp", "InferenceX #3837 (dsv41flash-fp4-b200-vllm-agentic-dspark, f817514)",
    _flags(("--kernel-config", {"enable_flashinfer_autotune": True}), ("--gpu-memory-utilization", 0.97),
           ("--engram-config", {"cpu_offload": True, "use_thp": True})),
    _LANE_ENV,
    (
        _b200_tp_point("tp2_c1", 1, 2, 8, 4096, _CG4092, 4092, default=True),
        _b200_tp_point("tp4_c1", 1, 4, 8, 4096, _CG4092, 4092),
        _b200_tp_point("tp4_c4", 4, 4, 8, 4096, _CG4092, 4092),
        _b200_tp_point("tp4_c8", 8, 4, 16, 8192, _CG8190, 8190),
        _b200_tp_point("tp4_c16", 16, 4, 32, 8192, _CG8190_REPLAY, 8190),
        _b200_tp_point("tp4_c32", 32, 4, 128, 8192, _CG8190_REPLAY, 8190),
        _b200_tp_point("tp4_c128", 128, 4, 256, 8192, _CG8190_REPLAY, 8190),
    ),
)


def _b200_dep_point(name, conc, dp, seqs, graphs, cap, *, interval=None, tokens=None, host_kv=False,
                    default=False) -> Point:
    pairs = [("--max-num-seqs", seqs)]
    if tokens is not None:
        pairs.append(("--max-num-batched-tokens", tokens))
    if interval is not None:
        pairs.append(("--prefill-schedule-interval", interval))
    pairs += [("--compilation-config", graphs), ("--max-cudagraph-capture-size", cap)]
    kv = None
    if host_kv:
        # runbook: native CPU KV offloading, 32 GiB per DP rank; GPU memory 0.955 for indexer headroom
        pairs.append(("--gpu-memory-utilization", 0.955))
        kv = HostKv("native", 32)
    return Point(name, conc, 1, dp, _flags(*pairs), kv, default)


B200_AGENTX_DEP = Preset(
    "b200_agentx_dep", "B200", "dep", "InferenceX #3837 (dsv41flash-fp4-b200-vllm-agentic-dspark, f817514)",
    _flags(("--attention-config", ATTN_FLASHINFER_SPARSE),
           ("--kernel-config", {"enable_flashinfer_autotune": True, "moe_backend": "deep_gemm_mega_moe"}),
           ("--engram-config", {"cpu_offload": True, "embedding_across_dp": True}),
           ("--gpu-memory-utilization", 0.97), ("--max-num-batched-tokens", 4096)),
    _LANE_ENV,
    (
        _b200_dep_point("dep2_c8", 8, 2, 16, _CG576, 576),
        _b200_dep_point("dep2_c16", 16, 2, 16, _CG576, 576),
        _b200_dep_point("dep2_c24", 24, 2, 32, _CG4096, 4096, interval=64),
        _b200_dep_point("dep2_c32", 32, 2, 32, _CG4096, 4096, interval=64, default=True),
        _b200_dep_point("dep2_kv_c64", 64, 2, 48, _CG576, 576, host_kv=True),
        _b200_dep_point("dep2_kv_c128", 128, 2, 48, _CG576, 576, host_kv=True),
        _b200_dep_point("dep4_c96", 96, 4, 96, _CG8190_REPLAY, 8190, interval=48, tokens=8192),
        _b200_dep_point("dep4_c128", 128, 4, 128, _CG8190_REPLAY, 8190, interval=48, tokens=8192),
    ),
)


def _b300_dep_point(name, conc, seqs, tokens, interval, graphs, *, host_kv=False, default=False) -> Point:
    pairs = []
    kv = None
    if host_kv:
        # kv_c128/kv_c192: MegaAttention, lazy Simple CPU offload of 50 GiB per DP rank
        pairs.append(("--attention-config", ATTN_MEGA))
        kv = HostKv("simple", 50, lazy=True)
    pairs += [("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens),
              ("--prefill-schedule-interval", interval), ("--compilation-config", graphs)]
    if graphs is _CG_B300_192:
        pairs.append(("--max-cudagraph-capture-size", 4092))
    return Point(name, conc, 1, 2, _flags(*pairs), kv, default)


_CG_B300_192 = _cg(_S4092, _REPLAY[:22])
B300_AGENTX_DEP = Preset(
    "b300_agentx_dep", "B300", "dep", "InferenceX #4332 (dsv41flash-fp4-b300-vllm-agentic-dspark, 649dd5a)",
    _flags(("--kernel-config", {"enable_flashinfer_autotune": True, "moe_backend": "deep_gemm_mega_moe"}),
           ("--engram-config", {"cpu_offload": True, "embedding_across_dp": True}),
           ("--attention-config", ATTN_FLASHINFER_SPARSE), ("--max-cudagraph-capture-size", 8190)),
    _LANE_ENV,
    (
        _b300_dep_point("c8", 8, 16, 16384, 80, _CG8190),
        _b300_dep_point("c16", 16, 16, 16384, 80, _CG8190),
        _b300_dep_point("c32", 32, 32, 16384, 80, _CG8190_REPLAY, default=True),
        _b300_dep_point("c64", 64, 64, 32768, 56, _CG8190_REPLAY),
        _b300_dep_point("kv_c128", 128, 128, 16384, 32, _CG8190_REPLAY, host_kv=True),
        _b300_dep_point("kv_c192", 192, 192, 16384, 32, _CG_B300_192, host_kv=True),
    ),
)


def _mi_point(name, conc, tp, seqs=None, tokens=None, cap=None, *, resident=False, default=False) -> Point:
    pairs = []
    if resident:  # TP4 keeps the Engram tables in HBM
        pairs.append(("--engram-config", {"cpu_offload": False}))
    if seqs is not None:
        pairs.append(("--max-num-seqs", seqs))
    if tokens is not None:
        pairs.append(("--max-num-batched-tokens", tokens))
    if cap is not None:
        pairs.append(("--max-cudagraph-capture-size", cap))
    return Point(name, conc, tp, 1, _flags(*pairs), default=default)


MI355X_AGENTX = Preset(
    "mi355x_agentx", "MI355X", "tp", "InferenceX #4480 (dsv41flash-fp4-mi355x-vllm-agentic-dspark, 8ea833ccd)",
    _flags(("--max-num-batched-tokens", 16384), ("--max-cudagraph-capture-size", 1024)),
    (("OMP_NUM_THREADS", "1"),),
    (
        _mi_point("tp2_c1", 1, 2, 1, 32768, 8),
        _mi_point("tp2_c2", 2, 2, 1, 32768, 8),
        _mi_point("tp2_c4", 4, 2, 1, 32768, 8),
        _mi_point("tp2_c8", 8, 2, 2, 8192, 16, default=True),
        _mi_point("tp2_c16", 16, 2, 4, 8192),
        _mi_point("tp2_c32", 32, 2, 8, 8192),
        _mi_point("tp2_c64", 64, 2),
        _mi_point("tp4_c1", 1, 4, 1, 32768, 8, resident=True),
        _mi_point("tp4_c2", 2, 4, 1, 32768, 8, resident=True),
    ),
)

PRESETS: dict[str, Preset] = {p.name: p for p in (B200_AGENTX_TP, B200_AGENTX_DEP, B300_AGENTX_DEP, MI355X_AGENTX)}
PROFILE_OF_STRATEGY = {"tp": "low-latency", "dep": "high-throughput"}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown AgentX preset {name!r}; known: {', '.join(PRESETS)}") from None


def select_point(p: Preset, tp: int, dp: int, wanted: str = "", max_num_seqs: int | None = None,
                 host_kv: bool = False) -> Point:
    """The point a role runs: the named one, else among the points measured at this role's TP x DP
    (host-KV points only when the role asks for host KV) the one whose --max-num-seqs is the smallest
    that holds ``max_num_seqs`` (the role's, or what the recipe rows render), else the largest; with no
    sequence cap to match, the preset's default point. Ties go to the preset default, then to the
    lower concurrency. Raises ValueError naming what to change when nothing fits."""
    if wanted:
        point = p.point(wanted)
        if point is None:
            raise ValueError(f"{p.name} has no point {wanted!r}; points: {', '.join(x.name for x in p.points)}")
        if (point.tp, point.dp) != (tp, dp):
            raise ValueError(f"point {wanted} of {p.name} runs TP{point.tp} x DP{point.dp}; this role runs "
                             f"TP{tp} x DP{dp}: set tensorParallelSize/dataParallelSize to match")
        return point
    layout = [x for x in p.points if (x.tp, x.dp) == (tp, dp)]
    candidates = [x for x in layout if (x.host_kv is not None) == host_kv] or layout
    if not candidates:
        shapes = sorted({f"TP{x.tp} x DP{x.dp}" for x in p.points})
        raise ValueError(f"{p.name} has no point for TP{tp} x DP{dp}; its points run {', '.join(shapes)}")
    if p.default_point in candidates and max_num_seqs is None:
        return p.default_point

    def rank(x: Point):
        return (not x.default, x.concurrency)

    if max_num_seqs is None:
        return min(candidates, key=rank)
    holding = [x for x in candidates if (x.max_num_seqs or 0) >= max_num_seqs]
    if holding:
        least = min(x.max_num_seqs or 0 for x in holding)
        return min((x for x in holding if (x.max_num_seqs or 0) == least), key=rank)
    most = max(x.max_num_seqs or 0 for x in candidates)
    return min((x for x in candidates if (x.max_num_seqs or 0) == most), key=rank)
