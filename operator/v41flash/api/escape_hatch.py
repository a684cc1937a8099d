"""What extraArgs / extraEnv may not do, and why: the operator owns these, or they break the deployment.

Each entry becomes a CEL rule on RoleSpec (refused at admission, the message says why), evaluated offline
too by `v41flash validate`. Creating a V41FlashDeployment is as powerful as creating a pod in its
namespace (image, command arguments, environment); these rules stop accidents and silent overrides of
what the operator wires, not a user who may already create pods.
"""
from __future__ import annotations

from ..serve_flags import dests_of, spelling_terms

# vllm serve settings the operator sets, a field owns, or that change which weights load or what the engine is, with
# the reason (naming the field that owns it) shown on refusal. Each key lists one option string per setting; every
# other spelling vLLM 0.33.0's parser accepts for it (aliases such as -tp, --no-/--disable- forms, '_' for '-',
# `=value`, dotted JSON keys, abbreviations, `-n2`) is refused too: arg_rule() derives them from the parser snapshot
# (serve_flags.spelling_terms). tests/test_escape_hatch.py checks that every flag the builder renders is here or in
# RECIPE_FLAGS.
REFUSED_ARGS: dict[tuple[str, ...], str] = {
    ("--host",): "the operator binds engines to the pod IP the router discovers; another host makes the pod "
                 "unreachable",
    ("--port",): "the Service, probes, router discovery and NetworkPolicy use port 8000",
    ("--uds",): "a Unix socket instead of TCP makes the engine unreachable for probes and the router",
    ("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs", "--ssl-ciphers", "--enable-ssl-refresh",
     "--grpc", "--grpc-port"):
        "engines serve plain HTTP on port 8000: probes, the router, the endpoint picker and the operator's scraper "
        "speak it",
    ("--headless",): "a headless engine serves no HTTP: probes fail and the router finds no worker (the "
                     "operator sets it on LeaderWorkerSet workers itself)",
    ("--data-parallel-size",): "the GPU request is sized from dataParallelSize: set that field instead",
    ("--data-parallel-size-local",): "derived from nodesPerReplica: set that field instead",
    ("--tensor-parallel-size",): "the GPU request is sized from tensorParallelSize: set that field instead",
    ("--pipeline-parallel-size", "--prefill-context-parallel-size"):
        "the operator requests GPUs for TP x DP only: pipeline stages or prefill context ranks would need GPUs the "
        "pod does not have",
    ("--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-start-rank", "--data-parallel-rank",
     "--data-parallel-external-lb", "--data-parallel-hybrid-lb", "--data-parallel-multi-port-external-lb",
     "--nnodes", "--node-rank", "--master-addr", "--master-port"):
        "multi-node wiring is the operator's (LeaderWorkerSet leader address and ranks): set nodesPerReplica",
    ("--api-key",): "the router is not given the key, so every request it forwards would be refused; use "
                    "spec.routing.apiKeySecretRef for client authentication at the proxy",
    ("--config",): "a config file hides arguments from the operator's checks against vLLM's parser",
    ("--kv-transfer-config",): "set by the operator from spec.kvTransfer (P/D needs the NIXL connector it wires)",
    ("--kv-events-config",): "set by the operator from spec.routing.kvEvents",
    ("--served-model-name",): "set spec.model.servedModelName: the router and clients use that name",
    ("--model", "--tokenizer", "--tokenizer-revision", "--tokenizer-mode", "--hf-config-path", "--code-revision",
     "--hf-overrides", "--quantization", "--runner", "--convert"):
        "the engine serves spec.model.checkpoint (the operator passes it, with its tokenizer and config) as the "
        "router, the planner's capacity profiles and clients know it: set spec.model.checkpoint",
    ("--revision",): "set spec.model.revision: the weight cache, the prefetcher and the serving revision's hash "
                     "follow it",
    ("--hf-token",): "set spec.model.source.hub.tokenSecretRef: a token in the arguments sits in the pod spec and "
                     "the CR",
    ("--load-format", "--model-loader-extra-config"):
        "set spec.startup.loadFormat: which loader reads which weights is the field's (--load-format dummy serves "
        "random weights), and the planner's measured cold start follows it",
    ("--download-dir",): "where weights are kept is the operator's (spec.model.cache, spec.startup.weightCache): "
                         "another directory bypasses the weight cache",
    ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens"):
        "set spec.features.speculativeDecoding: the planner sizes decode from it (tokens per step)",
    ("--tool-call-parser", "--enable-auto-tool-choice", "--tool-parser-plugin"): "set spec.features.toolCalling",
    ("--reasoning-parser", "--reasoning-parser-plugin"): "set spec.features.reasoning",
    ("--language-model-only",): "set spec.features.textOnly",
    ("--kv-offloading-backend", "--kv-offloading-size"):
        "set this role's kvOffload: vLLM 0.33.0 would replace the NIXL connector with its offloading one, and the "
        "planner counts the host tier as KV capacity",
    ("--max-num-seqs",): "set this role's maxNumSeqs: the planner's capacity follows it",
    ("--max-num-batched-tokens",): "set this role's maxNumBatchedTokens",
    ("--max-model-len",): "set this role's maxModelLen",
    ("--gpu-memory-utilization",): "set this role's gpuMemoryUtilization: the planner's KV capacity follows it",
    ("--enable-expert-parallel",): "set this role's expertParallel (or the profile): EPLB and the GPU layout "
                                   "follow it",
    ("--enable-eplb", "--eplb-config"): "set this role's eplb",
}

# Flags the recipe rows render with no field of their own (vllm/args.py): a copy in extraArgs where one is rendered
# is refused by the parser check as a repeat ("vLLM silently keeps only the last one"); where none is rendered it is
# the escape hatch's to tune.
RECIPE_FLAGS = (
    "--attention-config", "--block-size", "--compilation-config", "--enable-ep-weight-filter", "--engram-config",
    "--kernel-config", "--kv-cache-dtype", "--long-prefill-token-threshold", "--max-cudagraph-capture-size",
    "--moe-backend", "--monokernel", "--no-enable-prefix-caching", "--numa-bind", "--prefill-schedule-interval",
)


# Environment the operator sets (or that subverts every process in the container), with why.
REFUSED_ENV: dict[tuple[str, ...], str] = {
    ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
        "the NIXL side channel is wired by the operator (pod IP, per-rank ports); another value breaks P/D KV "
        "transfer",
    ("UCX_TLS",): "set spec.kvTransfer.ucxTls instead (the operator picks the fabric default)",
    ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        "set spec.model.source.hub.tokenSecretRef: a plain value would sit in the pod spec and the CR",
    # huggingface_hub's constants.py (every path it derives from an env variable), transformers' legacy caches,
    # vLLM's envs.py data paths: where the checkpoint and the hub token are kept is the operator's
    ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HUGGINGFACE_ASSETS_CACHE", "HF_XET_CACHE",
     "HF_TOKEN_PATH", "XDG_CACHE_HOME", "TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE",
     "PYTORCH_PRETRAINED_BERT_CACHE", "HF_MODULES_CACHE", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_ASSETS_CACHE",
     "MODELSCOPE_CACHE"):
        "the cache volume's paths are the operator's (spec.model.cache, spec.startup.weightCache): another one "
        "bypasses the weight cache or reads weights and tokens someone else left there",
    ("HF_ENDPOINT", "HUGGINGFACE_CO_STAGING", "VLLM_USE_MODELSCOPE", "VLLM_MODEL_REDIRECT_PATH"):
        "where the weights come from is spec.model.source: the hub token (spec.model.source.hub.tokenSecretRef) goes "
        "to the Hugging Face hub only, never to another endpoint, and the checkpoint is not redirected",
    ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME"):
        "loads foreign code into every process of the engine",
    ("VLLM_HOST_IP", "VLLM_PORT", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT"):
        "engine addressing is the operator's",
    ("LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE"): "set by the LeaderWorkerSet controller",
    ("VLLM_API_KEY",): "the router is not given the key: use spec.routing.apiKeySecretRef",
    ("VLLM_SERVER_DEV_MODE", "VLLM_TORCH_PROFILER_DIR", "VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        "exposes unauthenticated endpoints (sleep, reset, collective RPC, profiler, loading LoRA adapters) that change "
        "what the engine serves",
}

# The one env value the operator parses: the startup probe is sized from it (int32 failureThreshold).
READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
READY_TIMEOUT_MAX_DIGITS = 6  # <= 999,999 s (11.5 days)


def _cel_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def arg_rule(flags: tuple[str, ...]) -> str:
    """CEL over self.extraArgs: no token sets what one of flags sets, in any spelling vLLM 0.33.0 accepts."""
    exact, prefixes = spelling_terms(dests_of(flags))
    tests = ([f"a in [{', '.join(map(_cel_str, exact))}]"] if exact else []) + \
        [f"a.startsWith({_cel_str(p)})" for p in prefixes]
    return f"self.extraArgs.all(a, !({' || '.join(tests)}))"


def env_rule(names: tuple[str, ...]) -> str:
    return f"self.extraEnv.all(e, !(e.name in [{', '.join(map(_cel_str, names))}]))"
