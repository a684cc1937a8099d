"""Capacity profiles: how fast one replica of a (serving profile, GPU product) pair prefills and decodes.

A profile is the planner's model of the hardware and the benchmark simulator's "truth" model, so it is
one shared format. It holds per-role latency curves, not opaque capacities, so that any TTFT / ITL
target can be turned into a capacity:

- prefill, per DP rank, one request with ``new`` uncached prompt tokens on top of ``cached`` tokens
  already in the prefix cache (causal attention: each new token attends to the cache and to the new
  tokens before it)::

      prefill_seconds(new, cached) = overhead + perToken * new + perTokenContext * new * (new + 2 * cached)

  With nothing cached this is the familiar ``a + b*ISL + c*ISL**2``.
- decode, per DP rank, one engine step with ``batch`` running sequences of mean context ``ctx``::

      step_seconds(batch, ctx) = overhead + perSequence * batch + perSequenceContext * batch * ctx
      itl_seconds = step_seconds / tokensPerStep          # DSpark drafting emits >1 token per step

  bounded by ``maxNumSeqs`` per rank and by the KV cache (``kvCacheTokens`` per rank / ctx).

Profiles are YAML documents (``kind: CapacityProfile``); the shipped ones live next to this module in
``profiles/`` and their derivation is written down in ``docs/decisions/2026-11-30-capacity-profiles.md``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from v41flash.roles import ROLES
from v41flash.vllm import features as vfeatures
from v41flash.gpus import GPU_PRODUCTS

API_VERSION = "v41flash.io/v1alpha1"
KIND = "CapacityProfile"
SHIPPED_DIR = Path(__file__).parent / "profiles"

GpuProductName = Literal[tuple(GPU_PRODUCTS)]  # type: ignore[valid-type]
ServingProfile = Literal["low-latency", "high-throughput"]


class _Frozen(BaseModel):
    # camelCase in YAML (like the CR), snake_case in Python; unknown keys are typos, so refuse them.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class PrefillCurve(_Frozen):
    """Seconds to prefill one request on one DP rank (see the module docstring for the formula)."""

    overhead: float = Field(ge=0, description="Fixed seconds per prefill (scheduling, sampling, launch).")
    per_token: float = Field(ge=0, description="Seconds per new prompt token (linear/MoE work).")
    per_token_context: float = Field(
        ge=0, description="Seconds per new token per attended token (attention; the ISL**2 term)."
    )


class DecodeCurve(_Frozen):
    """Seconds for one decode step on one DP rank (see the module docstring for the formula)."""

    overhead: float = Field(ge=0, description="Fixed seconds per step (weight reads, launch, sync).")
    per_sequence: float = Field(ge=0, description="Seconds per running sequence per step.")
    per_sequence_context: float = Field(
        ge=0, description="Seconds per running sequence per context token per step (KV reads)."
    )


class RoleProfile(_Frozen):
    """What one replica of a role is made of and how long it takes to come up."""

    parallelism: str = Field(description="Human label of the engine layout, e.g. TP4, DEP2, DEP16.")
    gpus_per_replica: int = Field(ge=1, description="GPUs one replica occupies (all its nodes).")
    data_parallel_size: int = Field(
        default=1, ge=1, description="DP ranks per replica; each rank schedules its own requests."
    )
    cold_start_seconds: float = Field(
        gt=0, description="Seconds from pod creation to Ready (weight load, autotune, graph capture)."
    )


class PrefillProfile(RoleProfile):
    curve: PrefillCurve
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="Chunked-prefill token budget per step per rank."
    )

    def request_seconds(self, new_tokens: float, cached_tokens: float = 0.0) -> float:
        """Seconds one rank spends prefilling a request (no queueing)."""
        c = self.curve
        n = max(0.0, new_tokens)
        return c.overhead + c.per_token * n + c.per_token_context * n * (n + 2.0 * max(0.0, cached_tokens))

    def step_seconds(self, chunks: Iterable[tuple[float, float]]) -> float:
        """Seconds of one chunked-prefill step over ``(new_tokens, tokens_before_chunk)`` chunks.

        The overhead is paid once per step, not once per chunk: that is what batching buys.
        """
        c = self.curve
        work = sum(c.per_token * n + c.per_token_context * n * (n + 2.0 * before) for n, before in chunks)
        return c.overhead + work

    def tokens_per_second(self, new_tokens: float, cached_tokens: float = 0.0) -> float:
        """Peak new-token prefill throughput of one replica (all ranks busy, no queueing)."""
        seconds = self.request_seconds(new_tokens, cached_tokens)
        return self.data_parallel_size * new_tokens / seconds if seconds > 0 else math.inf


class DecodeProfile(RoleProfile):
    curve: DecodeCurve
    tokens_per_step: float = Field(
        default=1.0, ge=1.0, description="Mean tokens emitted per step (speculative/DSpark acceptance)."
    )
    max_num_seqs: int = Field(ge=1, description="vLLM --max-num-seqs (per DP rank).")
    kv_cache_tokens: int = Field(ge=1, description="KV-cache capacity in tokens per DP rank.")

    def step_seconds(self, batch: float, context: float) -> float:
        c = self.curve
        b = max(0.0, batch)
        return c.overhead + c.per_sequence * b + c.per_sequence_context * b * max(0.0, context)

    def itl_seconds(self, batch: float, context: float) -> float:
        """Mean inter-token latency a sequence sees at ``batch`` running sequences per rank."""
        return self.step_seconds(batch, context) / self.tokens_per_step

    def max_batch_per_rank(self, context: float) -> float:
        """Most sequences one rank can hold: max-num-seqs, or what fits in the KV cache."""
        return float(min(self.max_num_seqs, self.kv_cache_tokens / max(1.0, context)))

    def batch_at_itl(self, itl_target: float, context: float, scale: float = 1.0) -> float:
        """Sequences per rank whose ITL (step time × ``scale``) stays within ``itl_target``.

        Returns 0 when even one sequence misses the target; ``scale`` is the planner's learned
        correction of this profile (1.0 = trust it).
        """
        c = self.curve
        budget = itl_target * self.tokens_per_step / scale - c.overhead
        slope = c.per_sequence + c.per_sequence_context * max(0.0, context)
        if budget <= 0:
            return 0.0
        fit = budget / slope if slope > 0 else math.inf
        return max(0.0, min(fit, self.max_batch_per_rank(context)))


class KvTransferProfile(_Frozen):
    """Prefill → decode KV hand-over time (NIXL), added to TTFT in disaggregated mode."""

    overhead_seconds: float = Field(default=0.002, ge=0)
    seconds_per_token: float = Field(default=0.0, ge=0, description="Seconds per transferred prompt token.")

    def seconds(self, tokens: float) -> float:
        return self.overhead_seconds + self.seconds_per_token * max(0.0, tokens)


class ProfileMetadata(_Frozen):
    name: str
    description: str = ""
    source: str = Field(default="", description="How the numbers were derived (see the capacity-profile doc).")


class CapacityProfile(_Frozen):
    """Capacity model of one (serving profile, GPU product[, per-role layout]) combination."""

    api_version: Literal["v41flash.io/v1alpha1"] = API_VERSION
    kind: Literal["CapacityProfile"] = KIND
    metadata: ProfileMetadata
    serving_profile: ServingProfile
    gpu_product: GpuProductName
    prefill: PrefillProfile
    decode: DecodeProfile
    kv_transfer: KvTransferProfile = KvTransferProfile()

    @model_validator(mode="after")
    def _ranks_divide_gpus(self) -> CapacityProfile:
        for role in ROLES:
            rp: RoleProfile = getattr(self, role)
            if rp.gpus_per_replica % rp.data_parallel_size:
                raise ValueError(
                    f"{role}.dataParallelSize {rp.data_parallel_size} must divide "
                    f"{role}.gpusPerReplica {rp.gpus_per_replica}"
                )
        return self

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def for_rendered_engines(profile: CapacityProfile, speculative_tokens: int, host_kv_tokens_per_rank: int,
                         max_num_seqs: int | None = None) -> CapacityProfile:
    """A shipped profile adjusted to what the decode engines were actually rendered with.

    - tokensPerStep: the shipped profiles assume DSpark (5-token drafts, 3.45 tokens per step). Without
      speculative decoding a step emits 1 token; with k draft tokens a step emits at most k + 1.
    - kvCacheTokens: a host KV tier (kvOffload) adds its tokens per rank (bytes / 890 B per token): preempted
      and evicted blocks reload from host memory instead of being recomputed, so a rank keeps that much more
      session context.
    - maxNumSeqs: the rendered --max-num-seqs (per DP rank; P/D renders 32, the GB300 AgentX P/D preset 40)
      is the most sequences a rank batches, whatever the profile was measured at (128/256): decode capacity
      per replica is that many sequences at their ITL. None (nothing rendered): the profile's.
    """
    d = profile.decode
    tokens_per_step = 1.0 if speculative_tokens <= 0 else min(d.tokens_per_step, speculative_tokens + 1.0)
    kv_tokens = d.kv_cache_tokens + max(0, host_kv_tokens_per_rank)
    seqs = d.max_num_seqs if max_num_seqs is None else max_num_seqs
    if (tokens_per_step, kv_tokens, seqs) == (d.tokens_per_step, d.kv_cache_tokens, d.max_num_seqs):
        return profile
    decode = d.model_copy(update={"tokens_per_step": tokens_per_step, "kv_cache_tokens": kv_tokens,
                                  "max_num_seqs": seqs})
    return profile.model_copy(update={"decode": decode})


def for_rendered_args(profile: CapacityProfile, decode_args: Sequence[str]) -> CapacityProfile:
    """``for_rendered_engines`` with every figure read back from the decode engine's rendered argv (the one
    home of those numbers is the renderer: the operator and the benchmark both pass what it built)."""
    return for_rendered_engines(profile, vfeatures.speculative_tokens(decode_args),
                                vfeatures.host_kv_bytes_per_rank(decode_args) // vfeatures.KV_BYTES_PER_TOKEN,
                                vfeatures.max_num_seqs(decode_args))


def profile_from_dict(data: dict) -> CapacityProfile:
    return CapacityProfile.model_validate(data)


def load_profile(path: str | Path) -> CapacityProfile:
    with open(path, encoding="utf-8") as fh:
        return profile_from_dict(yaml.safe_load(fh))


@lru_cache(maxsize=1)
def shipped_profiles() -> tuple[CapacityProfile, ...]:
    """All profiles shipped with the package, sorted by file name."""
    return tuple(load_profile(p) for p in sorted(SHIPPED_DIR.glob("*.yaml")))


def find_profile(
    serving_profile: str,
    gpu_product: str,
    prefill_parallelism: str | None = None,
    decode_parallelism: str | None = None,
    profiles: Sequence[CapacityProfile] | None = None,
) -> CapacityProfile | None:
    """The profile for a deployment: exact per-role layout first, else the preset's default layout.

    The default layout of a (serving profile, GPU) pair is the profile whose metadata name has no
    layout suffix, i.e. the one listed first for that pair (shipped files sort that way).
    """
    pool = [
        p
        for p in (shipped_profiles() if profiles is None else profiles)
        if p.serving_profile == serving_profile and p.gpu_product == gpu_product
    ]
    for p in pool:
        if (prefill_parallelism is None or p.prefill.parallelism == prefill_parallelism) and (
            decode_parallelism is None or p.decode.parallelism == decode_parallelism
        ):
            return p
    return pool[0] if pool else None
