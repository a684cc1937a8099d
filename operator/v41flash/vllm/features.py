"""What agents need from the engine: tool calling, reasoning, DSpark speculative decoding, text-only, and a
host-DRAM KV tier, as `vllm serve` arguments for vLLM 0.33.0.

Source: the vLLM 0.33.0 recipe recipes/models/deepseek-ai/DeepSeek-V4.1-Flash.yaml, sections `features`
(tool_calling, reasoning, spec_decoding with its AMD override, text_only), `presets` (the AgentX lanes:
adaptive verification off, host KV points) and the guide ("With Speculative decoding on, DSpark runs in
both pools so the transferred KV stays compatible"); vLLM 0.33.0's VllmConfig._post_init_kv_transfer_config
(`--kv-offloading-size` REPLACES any --kv-transfer-config connector with the offloading one, so in P/D
the host tier has to be a MultiConnector child next to NIXL) and the connectors' extra-config keys
(OffloadingConnector / SimpleCPUOffloadConnector: cpu_bytes_to_use, lazy_offload).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..facts import DSPARK_BLOCK

PARSER = "deepseek_v41"  # recipe features.tool_calling / features.reasoning
# recipe guide, Memory: "Engram tables (FP8) 196.6B entries, 183.1 GiB stored"
ENGRAM_TABLES_GIB = 183.1
# reference (DeepSeek): global KV is 890 bytes per token
KV_BYTES_PER_TOKEN = 890
# recipe b200_agentx_dep runbook: host-KV points "lower GPU memory to 0.955 to keep headroom for the
# indexer logits" (from the lane's 0.97)
HOST_KV_GPU_MEMORY_UTILIZATION = 0.955
KV_OFFLOAD_BACKENDS = ("native", "simple")
GIB = 1 << 30

# flag -> the spec field that renders it (an extraArgs copy is refused naming that field)
FEATURE_FLAGS = {
    "--tool-call-parser": "spec.features.toolCalling",
    "--enable-auto-tool-choice": "spec.features.toolCalling",
    "--reasoning-parser": "spec.features.reasoning",
    "--speculative-config": "spec.features.speculativeDecoding",
    "--language-model-only": "spec.features.textOnly",
    "--kv-offloading-backend": "spec.<role>.kvOffload",
    "--kv-offloading-size": "spec.<role>.kvOffload",
}


@dataclass(frozen=True)
class SpeculativeDecoding:
    num_speculative_tokens: int = DSPARK_BLOCK
    adaptive_verification: bool = False  # every AgentX lane verifies the whole block


@dataclass(frozen=True)
class EngineFeatures:
    tool_calling: bool = True
    reasoning: bool = True
    speculative_decoding: SpeculativeDecoding | None = SpeculativeDecoding()
    text_only: bool = True


@dataclass(frozen=True)
class KvOffload:
    """Host-DRAM KV tier of one engine; size_gib is per DP rank (vLLM: summed over the rank's TP workers)."""
    backend: str = "native"  # native: OffloadingConnector; simple: SimpleCPUOffloadConnector
    size_gib: float = 32.0
    lazy: bool = False  # simple only: write blocks to DRAM only when evicted from HBM


def speculative_json(spec: SpeculativeDecoding, vendor: str) -> dict[str, Any]:
    """recipe features.spec_decoding (NVIDIA) / its amd override: vLLM refuses adaptive verification on ROCm."""
    return {
        "method": "dspark",
        "num_speculative_tokens": spec.num_speculative_tokens,
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
        "enable_adaptive_verification": spec.adaptive_verification and vendor != "amd",
    }


def feature_args(features: EngineFeatures, vendor: str) -> list[tuple[str, tuple[str, ...]]]:
    out: list[tuple[str, tuple[str, ...]]] = []
    if features.tool_calling:
        out += [("--tool-call-parser", (PARSER,)), ("--enable-auto-tool-choice", ())]
    if features.reasoning:
        out.append(("--reasoning-parser", (PARSER,)))
    if features.speculative_decoding is not None:
        out.append(("--speculative-config", (_j(speculative_json(features.speculative_decoding, vendor)),)))
    if features.text_only:
        out.append(("--language-model-only", ()))
    return out


def offload_connector(kv: KvOffload) -> dict[str, Any]:
    """The host tier as a KV connector entry (a MultiConnector child next to NIXL, or alone)."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": int(kv.size_gib * GIB)}
    if kv.backend == "simple":
        extra["lazy_offload"] = kv.lazy
        name = "SimpleCPUOffloadConnector"
    else:
        name = "OffloadingConnector"
    return {"kv_connector": name, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def with_host_tier(nixl: dict[str, Any], kv: KvOffload) -> dict[str, Any]:
    """P/D: NIXL first (it hands KV to the peer), the host tier second, as in the recipe's Dynamo lanes."""
    return {"kv_connector": "MultiConnector", "kv_role": nixl["kv_role"],
            "kv_connector_extra_config": {"connectors": [nixl, offload_connector(kv)]}}


def _j(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


# ------------------------------------------------------------------ reading a rendered argv back
def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The last value given to ``flag`` (None when absent; '' for a switch)."""
    value = None
    for i, token in enumerate(args):
        if token == flag:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def json_flag(args, flag: str) -> dict[str, Any]:
    value = flag_value(args, flag)
    try:
        parsed = json.loads(value) if value else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def host_kv_bytes_per_rank(args) -> int:
    """Host KV bytes one DP rank holds, read from what was rendered (flags or connector config)."""
    size = flag_value(args, "--kv-offloading-size")
    if size:
        return int(float(size) * GIB)
    kv = json_flag(args, "--kv-transfer-config")
    entries = [kv, *kv.get("kv_connector_extra_config", {}).get("connectors", [])]
    return sum(int(e.get("kv_connector_extra_config", {}).get("cpu_bytes_to_use", 0)) for e in entries
               if e.get("kv_connector") in ("OffloadingConnector", "SimpleCPUOffloadConnector"))


def max_num_seqs(args) -> int | None:
    """--max-num-seqs the engine was rendered with (per DP rank; None: vLLM's own default applies)."""
    value = flag_value(args, "--max-num-seqs")
    try:
        return int(value) if value else None
    except ValueError:
        return None


def speculative_tokens(args) -> int:
    """Draft tokens per step the engine verifies (0: no speculative decoding rendered)."""
    return int(json_flag(args, "--speculative-config").get("num_speculative_tokens", 0) or 0)


def engram_in_host_memory(args) -> bool:
    return bool(json_flag(args, "--engram-config").get("cpu_offload", False))
