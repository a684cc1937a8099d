"""Exact `vllm serve` argv per GPU/profile/role, validation problems, and a parser-checked matrix."""

import pytest

from v41flash import facts
from v41flash.gpus import GPU_PRODUCTS, gpu, smallest_fitting_dp
from v41flash.vllm import args as A
from v41flash.vllm.args import (
    EngineConfig,
    EplbConfig,
    KvEvents,
    KvTransfer,
    build_command,
    build_replica,
    expand_k8s_vars,
    validate_engine_config,
)
from v41flash.vllm.catalog import reference_configs
from v41flash.vllm.flags import check_serve_args

M = "deepseek-ai/DeepSeek-V4.1-Flash-1017"
HEAD = [M, "--port", "8000", "--tokenizer-mode", "deepseek_v41"]
NIXL_PRODUCER = '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail"}'
NIXL_CONSUMER = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"fail"}'
MEGA_ATTN = '{"backend":"FLASHMLA_MEGA_ATTN_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}'
ENV_BASE = {"VLLM_ENGINE_READY_TIMEOUT_S": "3600"}
POD_IP = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "status.podIP"}


def tp4(role="aggregated", product="H200", **kw):
    kv = KvTransfer() if role != "aggregated" else None
    return EngineConfig(role, product, M, gpu(product).low_latency_tp, kv_transfer=kv, **kw)


def dep(role="aggregated", product="B200", dp=2, nodes=1, **kw):
    kv = KvTransfer() if role != "aggregated" else None
    return EngineConfig(role, product, M, 1, data_parallel_size=dp, expert_parallel=True,
                        nodes_per_replica=nodes, kv_transfer=kv, **kw)


# ------------------------------------------------------------------------------- exact argv
def test_tp4_aggregated_on_h200():
    cmd = build_command(tp4())
    assert cmd.command == ("vllm", "serve")
    assert list(cmd.args) == HEAD + ["--tensor-parallel-size", "4", "--engram-config", '{"cpu_offload":true}']
    assert cmd.env == ENV_BASE
    assert cmd.env_from_field == {}


def test_tp4_prefill_and_decode_on_h200():
    prefill = build_command(tp4("prefill"))
    decode = build_command(tp4("decode"))
    common = HEAD + ["--tensor-parallel-size", "4", "--engram-config", '{"cpu_offload":true}',
                     "--max-num-seqs", "32", "--kv-transfer-config"]
    assert list(prefill.args) == common + [NIXL_PRODUCER]
    assert list(decode.args) == common + [NIXL_CONSUMER]
    for cmd in (prefill, decode):
        assert cmd.env == {**ENV_BASE, "VLLM_DEEP_GEMM_WARMUP": "skip"}  # recipe pd_cluster env
        assert cmd.env_from_field == POD_IP  # no UCX_TLS override on NVLink-in-node H200


def test_dep2_on_b200():
    cmd = build_command(dep())
    assert list(cmd.args) == HEAD + [
        "--tensor-parallel-size", "1", "--data-parallel-size", "2", "--enable-expert-parallel",
        "--kernel-config", '{"moe_backend":"deep_gemm_mega_moe"}',
        "--attention-config", MEGA_ATTN,
        "--kv-cache-dtype", "fp8", "--max-num-seqs", "128",
        "--engram-config", '{"cpu_offload":true,"embedding_across_dp":true}',
    ]
    assert cmd.env == ENV_BASE


GB300_PD_COMMON = [
    "--kernel-config", '{"moe_backend":"deep_gemm_mega_moe","sparse_indexer_topk_backend":"deep_select"}',
    "--attention-config", MEGA_ATTN, "--kv-cache-dtype", "fp8",
]
GB300_PD_ENV = {
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600", "VLLM_DEEP_GEMM_WARMUP": "skip", "VLLM_USE_V2_MODEL_RUNNER": "1",
    "UCX_TLS": "cuda_copy,cuda_ipc,tcp", "UCX_CUDA_IPC_ENABLE_MNNVL": "y",
}


def test_gb300_dep4_prefill_one_tray():
    replica = build_replica(dep("prefill", "GB300", dp=4))
    assert replica.worker is None
    assert list(replica.leader.args) == HEAD + [
        "--tensor-parallel-size", "1", "--data-parallel-size", "4", "--enable-expert-parallel",
        *GB300_PD_COMMON, "--max-num-seqs", "64", "--engram-config", '{"cpu_offload":true}',
        "--enable-ep-weight-filter", "--gpu-memory-utilization", "0.95", "--numa-bind",
        "--max-num-batched-tokens", "32768", "--long-prefill-token-threshold", "8192",
        "--compilation-config",
        '{"mode":"VLLM_COMPILE","cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[6,12,18,24,'
        '30,36,48,60,72,96,120,144,192,240,288,384,480,576,768,1020,1536,2046],"max_cudagraph_capture_size":2046}',
        "--kv-transfer-config", NIXL_PRODUCER,
    ]
    assert replica.leader.env == GB300_PD_ENV
    assert replica.leader.env_from_field == POD_IP


def test_gb300_dep16_decode_over_four_trays_with_eplb():
    cfg = dep("decode", "GB300", dp=16, nodes=4, eplb=EplbConfig(num_redundant_experts=16))
    replica = build_replica(cfg)
    decode_graphs = ('{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":['
                     + ",".join(str(n) for n in range(6, 241, 6)) + '],"max_cudagraph_capture_size":240}')

    def expected(node_rank):
        return HEAD + [
            "--tensor-parallel-size", "1", "--data-parallel-size", "16",
            "--data-parallel-size-local", "4", "--data-parallel-address", "$(LWS_LEADER_ADDRESS)",
            "--data-parallel-rpc-port", "13345", "--nnodes", "4", "--node-rank", node_rank,
            "--enable-expert-parallel", "--enable-eplb",
            "--eplb-config", '{"window_size":1000,"step_interval":3000,"num_redundant_experts":16,"use_async":true}',
            *GB300_PD_COMMON, "--max-num-seqs", "40", "--engram-config", '{"cpu_offload":true}',
            "--enable-ep-weight-filter", "--gpu-memory-utilization", "0.95", "--numa-bind",
            "--max-num-batched-tokens", "400", "--compilation-config", decode_graphs,
            "--no-enable-prefix-caching", "--kv-transfer-config", NIXL_CONSUMER,
        ]

    assert list(replica.leader.args) == expected("0")
    assert list(replica.worker.args) == expected("$(LWS_WORKER_INDEX)") + ["--headless"]
    for cmd in (replica.leader, replica.worker):
        assert cmd.env == {**GB300_PD_ENV, "VLLM_ENGINE_READY_TIMEOUT_S": "7200"}
        assert cmd.env_from_field == POD_IP


def test_lws_expansion_gives_each_worker_its_node_rank():
    replica = build_replica(dep("decode", "GB300", dp=16, nodes=4, eplb=EplbConfig(num_redundant_experts=16)))
    for index in ("1", "2", "3"):
        argv = expand_k8s_vars(replica.worker.args, {"LWS_WORKER_INDEX": index, "LWS_LEADER_ADDRESS": "l.svc"})
        assert argv[argv.index("--node-rank") + 1] == index
        assert argv[argv.index("--data-parallel-address") + 1] == "l.svc"
        assert check_serve_args(argv) == []


def test_mi355x_tp4_keeps_engram_resident():
    cmd = build_command(tp4(product="MI355X"))
    assert list(cmd.args) == HEAD + [
        "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.9", "--moe-backend", "aiter",
        "--engram-config", '{"cpu_offload":false}',
        "--attention-config", '{"indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
        "--block-size", "128", "--monokernel",
    ]
    assert cmd.env == {
        **ENV_BASE, "VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "1",
        "AITER_TRITON_LOG_LEVEL": "ERROR", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1",
        "VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA": "1", "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT4",
    }


def test_mi355x_tp2_offloads_engram_like_the_recipe_row():
    cfg = EngineConfig("aggregated", "MI355X", M, 2)
    args = list(build_command(cfg).args)
    assert args[args.index("--engram-config") + 1] == '{"cpu_offload":true}'


def test_mi355x_dep_offloads_engram_even_when_the_replica_is_large():
    for cfg in (dep(product="MI355X"), dep("decode", "MI355X", dp=16, nodes=2)):
        args = list(build_replica(cfg).leader.args)
        assert args[args.index("--engram-config") + 1] == '{"cpu_offload":true}'
        assert "--monokernel" not in args  # the mono decode kernels are a recipe TP row


def test_h100_tp8_memory_levers():
    cmd = build_command(tp4(product="H100"))
    assert list(cmd.args) == HEAD + [
        "--tensor-parallel-size", "8", "--engram-config", '{"cpu_offload":true}',
        "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.92",
    ]
    assert cmd.env == {**ENV_BASE, "VLLM_USE_V2_MODEL_RUNNER": "1",
                       "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_user_values_replace_recipe_values_in_place_and_extras_come_last():
    cfg = tp4(product="B200", max_num_seqs=64, max_model_len=262144, gpu_memory_utilization=0.93,
              served_model_name="dsv41", revision="abc123", extra_args=("--enable-auto-tool-choice",),
              extra_env={"FOO": "1"})
    cmd = build_command(cfg)
    assert list(cmd.args) == [
        M, "--served-model-name", "dsv41", "--revision", "abc123", "--port", "8000",
        "--tokenizer-mode", "deepseek_v41", "--tensor-parallel-size", "4",
        "--attention-config",
        '{"backend":"FLASHINFER_MLA_SPARSE_DSV41","indexer_kv_dtype":"mxfp4","indexer_sparse_logits":true}',
        "--kv-cache-dtype", "fp8", "--max-num-seqs", "64", "--engram-config", '{"cpu_offload":true}',
        "--max-model-len", "262144", "--gpu-memory-utilization", "0.93", "--enable-auto-tool-choice",
    ]
    assert cmd.env["FOO"] == "1"


def test_kv_events_endpoint_and_ports_per_dp_rank():
    cfg = dep("decode", "GB300", dp=16, nodes=4, kv_events=KvEvents())
    args = list(build_replica(cfg).leader.args)
    assert args[args.index("--kv-events-config") + 1] == (
        '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv-events"}')
    assert A.kv_event_ports(cfg, node_rank=2) == [5565, 5566, 5567, 5568]
    assert A.nixl_side_channel_ports(cfg, node_rank=2) == [5608, 5609, 5610, 5611]


def test_kv_transfer_extra_config_and_ucx_override():
    kv = KvTransfer(ucx_tls="rc,cuda_copy", extra_config={"backends": ["UCX"]})
    cmd = build_command(EngineConfig("prefill", "H200", M, 4, kv_transfer=kv))
    args = list(cmd.args)
    assert args[args.index("--kv-transfer-config") + 1] == (
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"fail",'
        '"kv_connector_extra_config":{"backends":["UCX"]}}')
    assert cmd.env["UCX_TLS"] == "rc,cuda_copy"


def test_extra_env_overrides_downward_api_env():
    cmd = build_command(tp4("decode", extra_env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7"}))
    assert cmd.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    assert cmd.env_from_field == {}


def test_model_facts():
    assert facts.EPLB_COMMUNICATORS == ("torch_nccl", "torch_gloo", "torch_xccl", "nixl", "pynccl")
    assert facts.ROUTED_EXPERTS == 384
    assert facts.KV_LOAD_FAILURE_POLICIES == ("recompute", "fail")


def test_gpu_catalog():
    assert set(GPU_PRODUCTS) == {"H100", "H200", "B200", "B300", "GB200", "GB300", "MI355X"}
    assert [gpu(n).gpus_per_node for n in ("H100", "GB200", "GB300", "MI355X")] == [8, 4, 4, 8]
    assert gpu("MI355X").resource_name == "amd.com/gpu"
    assert gpu("MI355X").node_label_key == "amd.com/gpu.product-name"
    assert gpu("H100").node_label_value == "NVIDIA-H100-80GB-HBM3"
    assert {n: p.recipe_min_tp for n, p in GPU_PRODUCTS.items()} == {
        "H100": 8, "H200": 4, "B200": 2, "B300": 2, "GB200": 2, "GB300": 2, "MI355X": 2}
    assert {n: p.low_latency_tp for n, p in GPU_PRODUCTS.items() if p.low_latency_tp != 4} == {"H100": 8}
    assert {n: smallest_fitting_dp(p) for n, p in GPU_PRODUCTS.items()} == {
        "H100": 8, "H200": 4, "B200": 2, "B300": 2, "GB200": 2, "GB300": 2, "MI355X": 2}
    with pytest.raises(ValueError, match="unknown GPU product 'A100'"):
        gpu("A100")


# --------------------------------------------------------------------------------- validation
INVALID = [
    (dep(eplb=EplbConfig(num_redundant_experts=3)), "eplb.num_redundant_experts",
     "384 routed + 3 redundant experts do not split evenly over 2 expert-parallel ranks"),
    (tp4(product="B200", eplb=EplbConfig()), "eplb.enabled", "EPLB needs expert parallelism"),
    (EngineConfig("aggregated", "GB300", M, 1, data_parallel_size=2, eplb=EplbConfig()), "eplb.enabled",
     "EPLB needs expert parallelism"),
    (dep(eplb=EplbConfig(enabled=False, num_redundant_experts=16)), "eplb.num_redundant_experts",
     "redundant experts need EPLB enabled"),
    (dep(eplb=EplbConfig(communicator="symm_mem")), "eplb.communicator", "'symm_mem' is not accepted"),
    (dep(eplb=EplbConfig(communicator="torch_nccl")), "eplb.communicator", "conflicts with async EPLB"),
    (dep(eplb=EplbConfig(window_size=0)), "eplb.window_size", "must be > 0"),
    (EngineConfig("aggregated", "B300", M, 1, expert_parallel=True, eplb=EplbConfig()), "eplb.enabled",
     "EPLB needs TP x DP > 1"),
    (EngineConfig("aggregated", "GB300", M, 8), "tensor_parallel_size", "TP8 does not fit a GB300 node of 4 GPUs"),
    (dep(dp=16), "data_parallel_size", "a replica needs TP x DP = 16 GPUs but a B200 node has 8"),
    (dep("decode", "GB300", dp=12, nodes=4), "nodes_per_replica", "a 4-node replica must fill its nodes"),
    (dep("decode", "GB300", dp=16, nodes=4, data_parallel_size_local=8), "data_parallel_size_local",
     "must be data_parallel_size / nodes_per_replica = 4"),
    (dep(product="H200"), "tensor_parallel_size", "a replica of 2 x H200 holds 282 GB"),
    (EngineConfig("aggregated", "H100", M, 4), "tensor_parallel_size", "a replica of 4 x H100 holds 320 GB"),
    (EngineConfig("prefill", "H200", M, 4), "kv_transfer", "a prefill engine needs kv_transfer"),
    (EngineConfig("aggregated", "H200", M, 4, kv_transfer=KvTransfer()), "kv_transfer",
     "an aggregated engine has no KV transfer"),
    (EngineConfig("decode", "H200", M, 4, kv_transfer=KvTransfer(load_failure_policy="retry")),
     "kv_transfer.load_failure_policy", "one of recompute, fail"),
    (tp4("decode", kv_events=KvEvents(port_base=5600)), "kv_events.port_base",
     "collide with ports [5600]"),
    (dep("decode", "GB300", dp=16, nodes=4, kv_events=KvEvents(port_base=5598)), "kv_events.port_base",
     "collide with ports [5600, 5601]"),
    (tp4(kv_events=KvEvents(port_base=8000)), "kv_events.port_base", "collide with ports [8000]"),
    (tp4(max_model_len=2_000_000), "max_model_len", "1,048,576 tokens"),
    (tp4(gpu_memory_utilization=1.2), "gpu_memory_utilization", "must be in (0, 1]"),
    (tp4(extra_args=("--max-num-seqs", "8", "--max-num-seqs", "16")), "extra_args", "repeats --max-num-seqs"),
    (tp4(extra_args=("--enable-expert-paralel",)), "extra_args", "unknown flag --enable-expert-paralel"),
    (EngineConfig("aggregated", "A100", M, 4), "gpu_product", "unknown GPU product 'A100'"),
    (tp4(revision="--main"), "args", "--revision needs a value"),
]


@pytest.mark.parametrize(("cfg", "path", "message"), INVALID, ids=[i[2] for i in INVALID])
def test_validation_problems(cfg, path, message):
    problems = validate_engine_config(cfg)
    assert any(p == path and message in m for p, m in problems), problems
    with pytest.raises(A.InvalidEngineConfig):
        build_replica(cfg)


def test_build_command_refuses_multi_node():
    with pytest.raises(A.InvalidEngineConfig, match="use build_replica"):
        build_command(dep("decode", "GB300", dp=16, nodes=4))


# ------------------------------------------------------------- every combination passes vLLM's parser
REFERENCE = reference_configs()


def test_reference_set_covers_every_gpu_shape_role_and_option():
    per_shape = {"tp": 3 * 2, "dep": 3 * 2 * 2}  # roles x KV events (x EPLB on/off for DEP)
    # every GPU: TP + single-node DEP; 8-GPU nodes: DEP16 over 2 nodes; NVL72 trays: 3 multi-tray DEPs
    assert len(REFERENCE) == 7 * (per_shape["tp"] + per_shape["dep"]) + 5 * per_shape["dep"] + 2 * 3 * per_shape["dep"]
    assert "GB300-dep16x4n-decode-events-eplb" in REFERENCE
    assert {c.gpu_product for c in REFERENCE.values()} == set(GPU_PRODUCTS)
    assert {c.role for c in REFERENCE.values()} == {"aggregated", "prefill", "decode"}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_every_rendered_command_passes_the_0_33_0_parser(name):
    cfg = REFERENCE[name]
    assert validate_engine_config(cfg) == []
    replica = build_replica(cfg)
    for index, command in enumerate(c for c in (replica.leader, replica.worker) if c):
        for worker_index in (range(1, cfg.nodes_per_replica) if index else (0,)):
            env = {"LWS_LEADER_ADDRESS": "leader.ns.svc", "LWS_WORKER_INDEX": str(worker_index)}
            assert check_serve_args(expand_k8s_vars(command.args, env)) == []
        if cfg.role != "aggregated":
            assert command.env_from_field == POD_IP
