"""Home of the model, engine and proxy facts the API's schema is generated from.

The CRD (api/v1alpha1.py: defaults, bounds, enums, CEL rules), the argument builder (vllm/args.py, vllm/flags.py,
vllm/features.py) and the session proxy (proxy/, cli/proxy.py) all read them from here. Plain values: a leaf that
imports nothing, so the API imports it without the argument builder.
"""
from __future__ import annotations

# The recipe's checkpoint (2026-10-17), the CR's default spec.model.checkpoint.
DEFAULT_CHECKPOINT = "deepseek-ai/DeepSeek-V4.1-Flash-1017"
ROUTED_EXPERTS = 384  # recipe: "routing is 6 of 384 experts per token plus one shared expert"
DSPARK_BLOCK = 5  # recipe: "DSpark multi-token drafting, 5 tokens per round (the trained block size)"

# What vLLM 0.33.0's parser accepts, as its snapshot records it (vllm/vllm_0_33_0_serve_flags.json;
# tests/test_vllm_flags.py fails when they drift apart):
# EPLBConfig.communicator literals, in the parser's order; the recipe's "symm_mem" is not among them.
EPLB_COMMUNICATORS: tuple[str, ...] = ("torch_nccl", "torch_gloo", "torch_xccl", "nixl", "pynccl")
# KVTransferConfig.kv_load_failure_policy literals, in the parser's order.
KV_LOAD_FAILURE_POLICIES: tuple[str, ...] = ("recompute", "fail")
# Transcribed from vllm/config/parallel.py EPLBConfig's pydantic validator (it runs while the parser parses the
# JSON, so a bad combination fails `vllm serve` at startup): NCCL-based communicators conflict with async EPLB.
EPLB_SYNC_ONLY_COMMUNICATORS = ("torch_nccl", "pynccl")

# spec.routing.sessionKey, the proxy's --session-key: derive sets x-session-id when a client sent none; client
# forwards only what clients send. The proxy runs in both (it is the router admin API's only guard).
SESSION_KEY_MODES = ("derive", "client")
# --load-format is a free string in the parser; the model loader refuses any other value at startup (after the pod
# was scheduled and its image pulled). Transcribed from the 0.33.0 release wheel,
# vllm/model_executor/model_loader/__init__.py: LoadFormats / _LOAD_FORMAT_TO_MODEL_LOADER.
LOAD_FORMATS: tuple[str, ...] = (
    "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "ipc_cache", "mistral", "modelexpress", "npcache",
    "pt", "runai_streamer", "runai_streamer_sharded", "safetensors", "sharded_state", "tensorizer")
# spec.startup.loadFormat: the loaders that read the checkpoint's safetensors faster than the default one;
# fastsafetensors and instanttensor are requirements of the 0.33.0 CUDA wheel (in every vLLM image), runai_streamer
# needs vllm[runai] (runai-model-streamer) in the image
STARTUP_LOAD_FORMATS: tuple[str, ...] = ("safetensors", "fastsafetensors", "instanttensor", "runai_streamer")
