"""check_serve_args against the snapshot of vLLM 0.33.0's own `vllm serve` parser."""

import json

import pytest

from v41flash import facts
from v41flash.vllm import flags
from v41flash.vllm.flags import check_serve_args

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash-1017"

# Command lines of recipes/models/deepseek-ai/DeepSeek-V4.1-Flash.yaml (vLLM 0.33.0 sdist), layer by
# layer as the recipe composes them.
BASE = ["--tokenizer-mode", "deepseek_v41"]
BLACKWELL_TP = [
    "--attention-config",
    '{"backend":"FLASHINFER_MLA_SPARSE_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
    "--kv-cache-dtype", "fp8", "--max-num-seqs", "128",
]
ENGRAM_OFFLOAD = ["--engram-config", '{"cpu_offload":true}']
B300_TP = [
    "--engram-config", '{"cpu_offload":true}',
    "--compilation-config",
    '{"mode":"VLLM_COMPILE","cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[6,12,18,24,30,'
    '36,48,60,72,96,120,144,192,240,288,384,480,576,768,1020,1536,2046,3072,4092,6144,8190]}',
    "--max-cudagraph-capture-size", "8190", "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
]
H100_VARIANT = ["--engram-config", '{"cpu_offload":true}', "--max-num-batched-tokens", "4096",
                "--gpu-memory-utilization", "0.92"]
AMD = ["--gpu-memory-utilization", "0.9", "--moe-backend", "aiter"]
MI355X_TP = [
    "--engram-config", '{"cpu_offload":true}',
    "--attention-config", '{"indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
    "--block-size", "128", "--monokernel",
]
BLACKWELL_DEP = [
    "--kernel-config", '{"moe_backend":"deep_gemm_mega_moe"}',
    "--attention-config",
    '{"backend":"FLASHMLA_MEGA_ATTN_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
    "--kv-cache-dtype", "fp8", "--max-num-seqs", "128", "--engram-config", '{"embedding_across_dp":true}',
]
FEATURES = [
    "--tool-call-parser", "deepseek_v41", "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_v41",
    "--speculative-config",
    '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic",'
    '"rejection_sample_method":"block","enable_adaptive_verification":true}',
    "--language-model-only",
]
B200_AGENTX_DEP = [
    "--data-parallel-size", "2",
    "--attention-config",
    '{"backend":"FLASHINFER_MLA_SPARSE_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
    "--kernel-config", '{"enable_flashinfer_autotune":true,"moe_backend":"deep_gemm_mega_moe"}',
    "--engram-config", '{"cpu_offload":true,"embedding_across_dp":true}',
    "--gpu-memory-utilization", "0.97", "--max-num-batched-tokens", "4096",
    # point dep2_kv_c64
    "--max-num-seqs", "48", "--gpu-memory-utilization", "0.955",
    "--kv-offloading-backend", "native", "--kv-offloading-size", "32",
]
GB300_AGENTX_PD = [
    "--kv-cache-dtype", "fp8",
    "--attention-config",
    '{"backend":"FLASHMLA_MEGA_ATTN_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
    "--kernel-config", '{"moe_backend":"deep_gemm_mega_moe","sparse_indexer_topk_backend":"deep_select"}',
    "--engram-config", '{"cpu_offload":true}', "--enable-ep-weight-filter",
    "--gpu-memory-utilization", "0.95", "--numa-bind",
]
GB300_AGENTX_PD_PREFILL = [
    "--max-num-seqs", "64", "--max-num-batched-tokens", "32768", "--long-prefill-token-threshold", "8192",
    "--compilation-config",
    '{"mode":"VLLM_COMPILE","cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[6,12,18,24,30,'
    '36,48,60,72,96,120,144,192,240,288,384,480,576,768,1020,1536,2046],"max_cudagraph_capture_size":2046}',
]
GB300_AGENTX_PD_DECODE = [
    "--max-num-seqs", "40", "--max-num-batched-tokens", "400",
    "--compilation-config",
    '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[6,12,18,24,30,36,42,48,54,60,66,72,'
    '78,84,90,96,102,108,114,120,126,132,138,144,150,156,162,168,174,180,186,192,198,204,210,216,222,228,'
    '234,240],"max_cudagraph_capture_size":240}',
    "--no-enable-prefix-caching",
]
DGX_STATION = [
    "--offload-backend", "uva", "--cpu-offload-gb", "60", "--cpu-offload-params",
    "routed_experts.w13_weight", "routed_experts.w2_weight", "--engram-config", '{"cpu_offload":true}',
    "--gpu-memory-utilization", "0.97", "--max-model-len", "1048576", "--max-num-batched-tokens", "8192",
    "--long-prefill-token-threshold", "6144",
    "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4,6,8,12,16,18,24,32,40,48,64,96,128]}',
]


def recipe_command(*layers: list[str]) -> list[str]:
    """Compose recipe layers with last-wins dedupe per flag, as the recipe's command builder does."""
    merged: dict[str, list[str]] = {}
    for layer in layers:
        i = 0
        while i < len(layer):
            flag, values = layer[i], []
            i += 1
            while i < len(layer) and not layer[i].startswith("--"):
                values.append(layer[i])
                i += 1
            merged[flag] = values
    out = [MODEL]
    for flag, values in merged.items():
        out += [flag, *values]
    return out


RECIPE_COMMANDS = {
    "h100 tp8": recipe_command(BASE, ["--tensor-parallel-size", "8"], H100_VARIANT),
    "h200 tp4": recipe_command(BASE, ["--tensor-parallel-size", "4"], ENGRAM_OFFLOAD),
    "b200 tp2": recipe_command(BASE, ["--tensor-parallel-size", "2"], BLACKWELL_TP, ENGRAM_OFFLOAD),
    "b300 tp2": recipe_command(BASE, ["--tensor-parallel-size", "2"], BLACKWELL_TP, B300_TP),
    "gb300 dep4": recipe_command(BASE, ["--data-parallel-size", "4", "--enable-expert-parallel"],
                                 BLACKWELL_DEP),
    "mi355x tp2": recipe_command(BASE, ["--tensor-parallel-size", "2"], AMD, MI355X_TP),
    "b200 features": recipe_command(BASE, ["--tensor-parallel-size", "4"], BLACKWELL_TP, FEATURES),
    "b200 agentx dep": recipe_command(BASE, ["--enable-expert-parallel"], B200_AGENTX_DEP),
    "gb300 agentx pd prefill": recipe_command(BASE, ["--data-parallel-size", "4", "--enable-expert-parallel"],
                                              GB300_AGENTX_PD, GB300_AGENTX_PD_PREFILL),
    "gb300 agentx pd decode": recipe_command(BASE, ["--data-parallel-size", "16", "--enable-expert-parallel"],
                                             GB300_AGENTX_PD, GB300_AGENTX_PD_DECODE),
    "dgx station": recipe_command(BASE, ["--tensor-parallel-size", "1"], DGX_STATION),
}


@pytest.mark.parametrize("name", RECIPE_COMMANDS)
def test_recipe_command_lines_pass(name):
    assert check_serve_args(RECIPE_COMMANDS[name]) == []


def test_snapshot_names_its_source_and_how_to_regenerate():
    header = flags.snapshot()["header"]
    assert header["vllm_version"] == "0.33.0"
    assert "tools/vllm_flags/dump.py" in header["regenerate"]
    assert "make_arg_parser" in header["parser"]
    assert "torch" in header["stubbed_modules"]


def test_snapshot_records_boolean_pairs_and_aliases():
    opts = flags.options()
    assert opts["--enable-eplb"]["sets"] is True
    assert opts["--disable-eplb"]["sets"] is False
    assert opts["--no-enable-eplb"]["sets"] is False
    assert opts["--enable-prefix-caching"]["dest"] == opts["--no-enable-prefix-caching"]["dest"]
    assert opts["-tp"]["dest"] == opts["--tensor-parallel-size"]["dest"] == "tensor_parallel_size"
    assert opts["--kv-transfer-config"]["config"] == "KVTransferConfig"
    assert "deepep_low_latency" in opts["--all2all-backend"]["choices"]


def test_eplb_communicators_are_the_0_33_0_literals_without_symm_mem():
    values = flags.literal_values("EPLBConfig", "communicator")
    assert values == ["torch_nccl", "torch_gloo", "torch_xccl", "nixl", "pynccl"]
    assert "symm_mem" not in values


def test_the_parser_facts_the_api_uses_are_the_snapshots():
    """facts.py spells out what the API's enums take from vLLM 0.33.0's parser (it imports nothing, so it cannot
    read the snapshot): each is the snapshot's, in its order."""
    assert facts.EPLB_COMMUNICATORS == tuple(flags.literal_values("EPLBConfig", "communicator"))
    assert facts.KV_LOAD_FAILURE_POLICIES == tuple(flags.literal_values("KVTransferConfig", "kv_load_failure_policy"))
    assert set(facts.EPLB_SYNC_ONLY_COMMUNICATORS) <= set(facts.EPLB_COMMUNICATORS)


def test_json_configs_we_render_have_field_sets():
    for config in ("KVTransferConfig", "EPLBConfig", "KVEventsConfig", "AttentionConfig", "KernelConfig",
                   "EngramConfig", "SpeculativeConfig", "CompilationConfig"):
        assert flags.config_fields(config), config
    assert set(flags.config_fields("EngramConfig")) == {
        "cpu_offload", "embedding_across_dp", "dp_shared_memory", "use_thp"}


BAD = [
    (["--tensor-paralel-size", "4"], "unknown flag --tensor-paralel-size"),
    (["--all2all-backend", "deepep"], "--all2all-backend 'deepep' is not one of"),
    (["--moe-backend", "mega-moe"], "--moe-backend 'mega_moe' is not one of"),
    (["--enable-eplb", "--eplb-config", '{"communicator":"symm_mem"}'], 'communicator "symm_mem" is not one of'),
    (["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_ip":"1.2.3.4"}'],
     "unknown key 'kv_ip' for KVTransferConfig"),
    (["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"producer"}'],
     'kv_role "producer" is not one of'),
    (["--max-num-seqs"], "--max-num-seqs needs a value"),
    (["--max-num-seqs", "--enforce-eager"], "--max-num-seqs needs a value"),
    (["--tensor-parallel-size", "four"], "--tensor-parallel-size needs an int"),
    (["--max-num-batched-tokens", "8x"], "integer like 8192 or 8k"),
    (["--kv-events-config", "{'enable_kv_cache_events': true}"], "not valid JSON"),
    (["--eplb-config", '{"communicator":"torch_nccl"}'], "rejected with async EPLB"),
    (["--eplb-config", '{"window_size":0}'], "window_size must be > 0"),
    (["--eplb-config", '{"num_redundant_experts":"16"}'], 'num_redundant_experts "16" is not an int'),
    (["--engram-config", "[1]"], "must be a JSON object"),
    (["--compilation-config", '{"pass_config":{"fuse_everything":true}}'], "unknown key 'pass_config.fuse_everything'"),
    (["--compilation-config", '{"cudagraph_mode":"FULL_GRAPHS"}'], "is not a CUDAGraphMode name"),
    (["--attention-config", '{"backend":"FLASHMLA_TURBO"}'], "is not a AttentionBackendEnum name"),
    (["--headless=yes"], "--headless is a switch and takes no value"),
    (["--max-num-seqs", "8", "--max-num-seqs", "16"], "repeats --max-num-seqs"),
    (["--enable-eplb", "--disable-eplb"], "repeats --enable-eplb"),
    (["--eplb-config.communicatr", "nixl"], "unknown key 'communicatr' for EPLBConfig"),
    (["--port.x", "1"], "--port is not a JSON config flag"),
    (["other-model"], "unexpected positional argument 'other-model'"),
]


@pytest.mark.parametrize(("tail", "expected"), BAD, ids=[b[1] for b in BAD])
def test_rejections_name_the_problem(tail, expected):
    problems = check_serve_args([MODEL, *tail])
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_typo_suggests_the_real_flag():
    (problem,) = check_serve_args([MODEL, "--max-num-seq", "8"])
    assert "did you mean --max-num-seqs?" in problem


ACCEPTED = [
    "--max_num_seqs=8",  # FlexibleArgumentParser: underscores and --x=value
    "-tp", "4",
    "--max-model-len", "auto",
    "--max-num-batched-tokens", "8k",
    "--numa-bind", "--numa-bind-nodes", "0", "0", "1", "1",
    "--eplb-config.num_redundant_experts", "16",
    "--eplb-config.window_size", "1000",
    "-O3",
    "--kv-transfer-config", "None",
    "--compilation-config", '{"mode":3,"cudagraph_mode":"full_decode_only"}',
    "--attention-config", '{"backend":"flashmla_mega_attn_dsv41"}',  # names are case-insensitive
    "--moe-backend", "DEEP-GEMM-MEGA-MOE",  # the parser lowercases backend names, '-' -> '_'
]


def test_accepted_spellings_of_the_real_parser():
    assert check_serve_args([MODEL, *ACCEPTED]) == []
    assert check_serve_args(["vllm", "serve", MODEL, "--enforce-eager"]) == []


def test_speculative_config_keys_are_checked_against_speculative_config():
    spec = {"method": "dspark", "num_speculative_tokens": 5, "draft-sample-method": "probabilistic"}
    assert check_serve_args([MODEL, "--speculative-config", json.dumps(spec)]) == []
    (problem,) = check_serve_args([MODEL, "--speculative-config", '{"num_spec_tokens":5}'])
    assert "unknown key 'num_spec_tokens' for SpeculativeConfig" in problem
