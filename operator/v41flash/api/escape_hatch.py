"""What extraArgs / extraEnv may not do, and why: the operator owns these, or they break the deployment.

Each entry becomes a CEL rule on RoleSpec (refused at admission, the message says why), evaluated offline
too by `v41flash validate`. Creating a V41FlashDeployment is as powerful as creating a pod in its
namespace (image, command arguments, environment); these rules stop accidents and silent overrides of
what the operator wires, not a user who may already create pods.
"""
from __future__ import annotations

# vllm serve flags the operator sets or whose effect it must know, with the reason shown on refusal.
REFUSED_ARGS: dict[tuple[str, ...], str] = {
    ("--host",): "the operator binds engines to the pod IP the router discovers; another host makes the pod "
                 "unreachable",
    ("--port",): "the Service, probes, router discovery and NetworkPolicy use port 8000",
    ("--headless",): "a headless engine serves no HTTP: probes fail and the router finds no worker (the "
                     "operator sets it on LeaderWorkerSet workers itself)",
    ("--data-parallel-size", "-dp"): "the GPU request is sized from dataParallelSize: set that field instead",
    ("--data-parallel-size-local", "-dpl"): "derived from nodesPerReplica: set that field instead",
    ("--tensor-parallel-size", "-tp"): "the GPU request is sized from tensorParallelSize: set that field instead",
    ("--pipeline-parallel-size", "-pp"): "the operator requests GPUs for TP x DP only: pipeline stages would "
                                         "need GPUs the pod does not have",
    ("--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp", "--data-parallel-start-rank",
     "-dpr"): "multi-node wiring is the operator's (LeaderWorkerSet leader address and ranks)",
    ("--api-key",): "the router is not given the key, so every request it forwards would be refused; use "
                    "spec.routing.apiKeySecretRef for client authentication at the proxy",
    ("--config",): "a config file hides arguments from the operator's checks against vLLM's parser",
    ("--kv-transfer-config",): "set by the operator from spec.kvTransfer (P/D needs the NIXL connector it wires)",
    ("--kv-events-config",): "set by the operator from spec.routing.kvEvents",
    ("--served-model-name",): "set spec.model.servedModelName: the router and clients use that name",
    ("--model",): "set spec.model.checkpoint (the operator passes the model path itself)",
    ("--uds",): "a Unix socket instead of TCP makes the engine unreachable for probes and the router",
}

# Environment the operator sets (or that subverts every process in the container), with why.
REFUSED_ENV: dict[tuple[str, ...], str] = {
    ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
        "the NIXL side channel is wired by the operator (pod IP, per-rank ports); another value breaks P/D KV "
        "transfer",
    ("UCX_TLS",): "set spec.kvTransfer.ucxTls instead (the operator picks the fabric default)",
    ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        "set spec.model.source.hub.tokenSecretRef: a plain value would sit in the pod spec and the CR",
    ("HF_HOME", "VLLM_CACHE_ROOT"): "the cache volume's paths are the operator's",
    ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME"):
        "loads foreign code into every process of the engine",
    ("VLLM_HOST_IP", "VLLM_PORT", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT"):
        "engine addressing is the operator's",
    ("LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE"): "set by the LeaderWorkerSet controller",
    ("VLLM_API_KEY",): "the router is not given the key: use spec.routing.apiKeySecretRef",
    ("VLLM_SERVER_DEV_MODE",): "exposes unauthenticated development endpoints (sleep, reset, collective RPC)",
}

# The one env value the operator parses: the startup probe is sized from it (int32 failureThreshold).
READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
READY_TIMEOUT_MAX_DIGITS = 6  # <= 999,999 s (11.5 days)


def _cel_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def arg_rule(flags: tuple[str, ...]) -> str:
    """CEL over self.extraArgs: none is one of flags, alone or as flag=value."""
    parts = " && ".join(f"a != {_cel_str(f)} && !a.startsWith({_cel_str(f + '=')})" for f in flags)
    return f"self.extraArgs.all(a, {parts})"


def env_rule(names: tuple[str, ...]) -> str:
    return f"self.extraEnv.all(e, !(e.name in [{', '.join(map(_cel_str, names))}]))"
