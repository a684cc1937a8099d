"""Agent features (spec.features), the host KV tier (kvOffload) and the AgentX presets: hostile and careless
combinations first, then the matrix of GPU products x profiles x features x presets against vLLM 0.33.0's
parser snapshot."""
import json

import pytest

from v41flash import lanes as agentx
from v41flash.api import v1alpha1 as api
from v41flash.cli.manifests import _problems
from v41flash.gpus import GPU_PRODUCTS
from v41flash.render.checks import host_memory_gib
from v41flash.render.engine import engine_config
from v41flash.render.resolve import resolve
from v41flash.vllm.args import (
    EngineConfig, KvTransfer, build_replica, effective_kv_offload, expand_k8s_vars, validate_engine_config,
)
from v41flash.vllm.catalog import FEATURE_SETS, feature_configs, preset_configs
from v41flash.vllm.features import EngineFeatures, KvOffload, SpeculativeDecoding, flag_value, json_flag
from v41flash.vllm.flags import check_serve_args

M = "deepseek-ai/DeepSeek-V4.1-Flash-1017"


def cr(spec: dict) -> dict:
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": "t"},
            "spec": spec}


def args_of(spec: dict, role: str = "decode") -> list[str]:
    s = api.V41FlashDeploymentSpec.model_validate(spec)
    return list(build_replica(engine_config(s, resolve(s), role)).leader.args)


def problems_of(spec: dict) -> list[str]:
    return _problems(cr(spec))


# --- hostile and careless combinations -----------------------------------------------------------

def test_dspark_on_mi355x_runs_without_adaptive_verification_and_refuses_it_when_asked():
    args = args_of({"gpu": {"product": "MI355X"}})
    spec = json_flag(args, "--speculative-config")
    assert spec["method"] == "dspark" and spec["num_speculative_tokens"] == 5
    assert spec["enable_adaptive_verification"] is False  # recipe features.spec_decoding amd override
    problems = problems_of({"gpu": {"product": "MI355X"},
                            "features": {"speculativeDecoding": {"adaptiveVerification": True}}})
    assert problems and problems[0].startswith("spec.features.speculativeDecoding.adaptiveVerification:")
    # the builder refuses it too (a config that never went through the CRD)
    cfg = EngineConfig("aggregated", "MI355X", M, 4, features=EngineFeatures(
        speculative_decoding=SpeculativeDecoding(adaptive_verification=True)))
    assert [p[0] for p in validate_engine_config(cfg)] == ["features.speculative_decoding.adaptive_verification"]


def test_adaptive_verification_on_nvidia_is_rendered():
    args = args_of({"gpu": {"product": "GB300"}, "features": {"speculativeDecoding": {"adaptiveVerification": True}}})
    assert json_flag(args, "--speculative-config")["enable_adaptive_verification"] is True


def test_kv_offload_larger_than_memory_is_refused_naming_memory():
    spec = {"profile": "high-throughput", "gpu": {"product": "B200"}, "decode": {"kvOffload": {"sizeGiB": 200}}}
    problems = problems_of(spec)
    assert len(problems) == 1 and problems[0].startswith("spec.decode.resources.memory:")
    assert "host KV 400.0 GiB (2 DP rank(s))" in problems[0] and "Engram tables 183.1 GiB" in problems[0]
    # the same tier fits once the pod asks for the memory it pins
    spec["decode"]["resources"] = {"memory": "720Gi"}
    assert problems_of(spec) == []


def test_host_memory_counts_engram_only_when_the_tables_are_in_host_memory():
    mi_tp4 = args_of({"gpu": {"product": "MI355X"}})  # TP4 keeps the tables resident (1152 GB of HBM)
    assert host_memory_gib(tuple(mi_tp4), 1.0, 1)["engram"] == 0
    h200 = args_of({"gpu": {"product": "H200"}})
    assert host_memory_gib(tuple(h200), 1.0, 1) == {"engram": 183.1, "hostKV": 0.0}
    # a multi-node replica shards them over its pods
    assert host_memory_gib(tuple(h200), 0.25, 4)["engram"] == pytest.approx(45.775)


def test_too_little_memory_for_the_engram_tables_alone_is_refused():
    problems = problems_of({"decode": {"resources": {"memory": "192Gi"}}})
    assert problems and problems[0].startswith("spec.decode.resources.memory:")


def test_preset_with_explicit_override_keeps_the_explicit_field():
    spec = {"profile": "high-throughput", "gpu": {"product": "B200"}, "preset": "b200_agentx_dep",
            "decode": {"point": "dep2_c32", "maxNumSeqs": 40, "gpuMemoryUtilization": 0.9}}
    assert problems_of(spec) == []
    args = args_of(spec)
    assert flag_value(args, "--max-num-seqs") == "40"  # the point says 32
    assert flag_value(args, "--gpu-memory-utilization") == "0.9"  # the lane says 0.97
    assert flag_value(args, "--prefill-schedule-interval") == "64"  # the rest of the point stays
    assert args.count("--max-num-seqs") == 1


def test_point_defaults_to_the_one_that_holds_max_num_seqs():
    lane = agentx.preset("b200_agentx_tp")
    assert agentx.select_point(lane, 4, 1, max_num_seqs=20).name == "tp4_c16"  # 32 seqs holds 20
    assert agentx.select_point(lane, 4, 1, max_num_seqs=128).name == "tp4_c32"
    assert agentx.select_point(lane, 4, 1, max_num_seqs=1000).name == "tp4_c128"  # none holds it: the largest
    assert agentx.select_point(lane, 2, 1).name == "tp2_c1"  # the lane's default
    dep = agentx.preset("b200_agentx_dep")
    assert agentx.select_point(dep, 1, 2, max_num_seqs=16).name == "dep2_c8"
    assert agentx.select_point(dep, 1, 2, max_num_seqs=32).name == "dep2_c32"  # tie: the lane default
    assert agentx.select_point(dep, 1, 2, host_kv=True, max_num_seqs=None).name == "dep2_kv_c64"
    assert agentx.select_point(dep, 1, 4).name == "dep4_c96"
    # rendered: aggregated B200 TP4 renders 128 seqs (recipe blackwell row) -> tp4_c32
    args = args_of({"gpu": {"product": "B200"}, "preset": "b200_agentx_tp", "prefill": {"enabled": False}})
    assert flag_value(args, "--max-num-seqs") == "128" and flag_value(args, "--gpu-memory-utilization") == "0.97"
    assert json_flag(args, "--engram-config") == {"cpu_offload": True, "use_thp": True}
    # P/D renders 32 (recipe pd_cluster) -> tp4_c16; an explicit 8 -> tp4_c1 (first of the 8-seq points)
    args = args_of({"gpu": {"product": "B200"}, "preset": "b200_agentx_tp"})
    assert flag_value(args, "--max-num-seqs") == "32" and flag_value(args, "--max-num-batched-tokens") == "8192"
    args = args_of({"gpu": {"product": "B200"}, "preset": "b200_agentx_tp", "decode": {"maxNumSeqs": 8}})
    assert flag_value(args, "--max-num-batched-tokens") == "4096"


def test_point_of_another_layout_or_preset_is_refused():
    spec = {"profile": "high-throughput", "gpu": {"product": "B200"}, "preset": "b200_agentx_dep",
            "decode": {"point": "dep4_c96"}}
    assert problems_of(spec)[0].startswith("spec.decode.point: point dep4_c96 of b200_agentx_dep runs TP1 x DP4")
    spec["decode"]["dataParallelSize"] = 4
    assert problems_of(spec) == []
    assert problems_of({"decode": {"point": "tp4_c8"}})[0].startswith("spec.preset:")
    assert problems_of({"gpu": {"product": "B200"}, "preset": "b200_agentx_dep"})[0].startswith("spec.preset:")


def test_host_kv_point_brings_its_tier_and_an_explicit_kv_offload_replaces_it():
    base = {"profile": "high-throughput", "gpu": {"product": "B200"}, "preset": "b200_agentx_dep",
            "prefill": {"enabled": False}, "decode": {"point": "dep2_kv_c128"}}
    args = args_of(base)
    assert flag_value(args, "--kv-offloading-size") == "32" and flag_value(args, "--gpu-memory-utilization") == "0.955"
    base["decode"]["kvOffload"] = {"sizeGiB": 16}
    assert flag_value(args_of(base), "--kv-offloading-size") == "16"


def test_features_in_aggregated_mode_and_kv_offload_in_pd():
    agg = {"prefill": {"enabled": False}, "decode": {"kvOffload": {"sizeGiB": 24}}}
    args = args_of(agg)
    assert "--kv-transfer-config" not in args
    assert (flag_value(args, "--kv-offloading-backend"), flag_value(args, "--kv-offloading-size")) == ("native", "24")
    for flag in ("--tool-call-parser", "--reasoning-parser", "--speculative-config", "--language-model-only"):
        assert flag in args
    pd = {"prefill": {"kvOffload": {"backend": "simple", "sizeGiB": 70, "lazy": True}}}
    prefill = args_of(pd, "prefill")
    assert "--kv-offloading-size" not in prefill  # it would replace NIXL in vLLM 0.33.0
    kv = json_flag(prefill, "--kv-transfer-config")
    assert kv["kv_connector"] == "MultiConnector" and kv["kv_role"] == "kv_producer"
    nixl, host = kv["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector" and nixl["kv_role"] == "kv_producer"
    assert host == {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"cpu_bytes_to_use": 70 << 30, "lazy_offload": True}}
    decode = args_of(pd, "decode")  # only prefill asked for a host tier
    assert json_flag(decode, "--kv-transfer-config")["kv_connector"] == "NixlConnector"


def test_every_feature_off_renders_none_of_their_flags():
    spec = {"features": {"toolCalling": False, "reasoning": False, "speculativeDecoding": {"enabled": False},
                         "textOnly": False}}
    for role in ("prefill", "decode"):
        args = args_of(spec, role)
        for flag in ("--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser", "--speculative-config",
                     "--language-model-only"):
            assert flag not in args


def test_parsers_and_dspark_on_both_pd_roles_by_default():
    for role in ("prefill", "decode"):
        args = args_of({}, role)
        assert flag_value(args, "--tool-call-parser") == "deepseek_v41" and "--enable-auto-tool-choice" in args
        assert flag_value(args, "--reasoning-parser") == "deepseek_v41" and "--language-model-only" in args
        assert json_flag(args, "--speculative-config") == {
            "method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic",
            "rejection_sample_method": "block", "enable_adaptive_verification": False}


def test_extra_args_duplicating_a_feature_flag_is_refused_naming_the_feature():
    problems = problems_of({"decode": {"extraArgs": ["--reasoning-parser", "deepseek_r1"]}})
    assert any(p.startswith("spec.decode.extraArgs: extraArgs may not set --reasoning-parser") and
               "spec.features.reasoning" in p for p in problems)
    # the field owns the flag with the feature off too (one rule for every flag a field owns, issue 39)
    assert problems_of({"features": {"reasoning": False},
                        "decode": {"extraArgs": ["--reasoning-parser", "deepseek_r1"]}})
    problems = problems_of({"prefill": {"extraArgs": ["--kv-offloading-size=8"]}})
    assert any(p.startswith("spec.prefill.extraArgs: extraArgs may not set --kv-offloading-backend") for p in problems)


def test_speculative_tokens_range():
    assert problems_of({"features": {"speculativeDecoding": {"numSpeculativeTokens": 6}}})
    assert json_flag(args_of({"features": {"speculativeDecoding": {"numSpeculativeTokens": 3}}}),
                     "--speculative-config")["num_speculative_tokens"] == 3


def test_every_lane_is_selectable_and_has_one_default_point():
    from v41flash.api.crd import crd
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["preset"]["enum"] == ["", *agentx.PRESETS]
    for lane in agentx.PRESETS.values():
        assert sum(p.default for p in lane.points) == 1, lane.name


def test_effective_kv_offload():
    cfg = EngineConfig("aggregated", "B200", M, 1, data_parallel_size=2, expert_parallel=True,
                       preset="b200_agentx_dep", point="dep2_kv_c64")
    assert effective_kv_offload(cfg) == KvOffload("native", 32)


# --- the matrix: GPU products x profiles x features (x presets) through the parser snapshot ----------

MATRIX = {**feature_configs(), **preset_configs()}


def test_matrix_covers_every_gpu_role_feature_set_and_preset_point():
    names = set(MATRIX)
    assert {c.gpu_product for c in MATRIX.values()} == set(GPU_PRODUCTS)
    assert {c.role for c in MATRIX.values()} == {"aggregated", "prefill", "decode"}
    assert {n.rsplit("-", 1)[-1] for n in feature_configs()} >= {"default", "off", "parsers", "dspark3", "adaptive"}
    assert all(any(n.endswith(f"-{f}") for n in names) for f in FEATURE_SETS)
    assert {(c.preset, c.point) for c in preset_configs().values()} == {
        (lane.name, p.name) for lane in agentx.PRESETS.values() for p in lane.points}


@pytest.mark.parametrize("name", list(MATRIX))
def test_every_feature_combination_passes_the_0_33_0_parser(name):
    cfg = MATRIX[name]
    assert validate_engine_config(cfg) == []
    replica = build_replica(cfg)
    for command in (c for c in (replica.leader, replica.worker) if c):
        argv = expand_k8s_vars(command.args, {"LWS_LEADER_ADDRESS": "l.svc", "LWS_WORKER_INDEX": "1"})
        assert check_serve_args(argv) == []
        spec = json_flag(argv, "--speculative-config")
        if spec and GPU_PRODUCTS[cfg.gpu_product].vendor == "amd":
            assert spec["enable_adaptive_verification"] is False
        if cfg.role != "aggregated":
            assert "--kv-offloading-size" not in argv  # never next to NIXL
            kv = json.loads(flag_value(argv, "--kv-transfer-config"))
            assert "NixlConnector" in json.dumps(kv)
