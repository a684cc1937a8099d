"""How long a replica takes to serve under each spec.startup option, from published figures (the simulator's truth).

A drawn cold start C (the suite's 2–20 min) is what a deployment pays today: the hub or a network volume read by
vLLM's default safetensors loader, and an emptyDir VLLM_CACHE_ROOT (every new pod compiles, autotunes and captures
its CUDA graphs again). It is split into stages — an assumption, stated here and in docs/decisions/2026-12-05-foresight.md,
not a measurement of this model: weights ``WEIGHTS`` (~511 GB), compile/autotune/graph capture ``COMPILE``, and the
rest ``FIXED`` (scheduling on a node that has the image, engine init, KV allocation, NIXL registration). Each
option shortens its stage by a published factor:

- ``loadFormat`` on the weights stage: runai_streamer ÷3.35 (Run:ai Model Streamer benchmarks, 2024: Llama-3-8B
  on a GP3 SSD, 47.99 s with vLLM's safetensors loader, 14.34 s streamed at concurrency 16); fastsafetensors ÷2.55
  (fastsafetensors' README: vLLM with Llama-2-13B on 4×L40S, ~12 s → ~4.7 s). instanttensor has no published
  figure we could find: modelled as the default loader.
- a node-local weight cache (``weightCache``, prefetched) on the weights stage: a faster disk pays with a concurrent
  loader, ×1.9 (the same benchmarks: the streamer 14.34 s on GP3, 7.53 s on IO2), and barely with the default one,
  ×1.1 (safetensors on IO2 is "nearly 6×" the streamer's 7.53 s: ~44 s against 47.99 s on GP3).
- a warm compile cache (``model.cache.claimName``: VLLM_CACHE_ROOT on a PVC) on the compile stage: ×0.2 (vLLM's
  torch.compile cache skips Dynamo/Inductor compilation; hosted vLLM platforms report 5–20 s with a warm cache
  where a cold one takes minutes; the shipped note for this model: a warm cache turns a 75–90 min first boot with
  FlashInfer autotune into minutes).
"""
from __future__ import annotations

from dataclasses import dataclass

WEIGHTS, COMPILE, FIXED = 0.6, 0.3, 0.1
LOADER_SPEEDUP = {"": 1.0, "safetensors": 1.0, "instanttensor": 1.0, "fastsafetensors": 2.55,
                  "runai_streamer": 3.35}
CONCURRENT_LOADERS = ("fastsafetensors", "runai_streamer")
LOCAL_DISK_SPEEDUP = {True: 1.9, False: 1.1}  # with a concurrent loader, with the default one
WARM_COMPILE_FACTOR = 0.2


@dataclass(frozen=True)
class Startup:
    load_format: str = ""
    weight_cache: bool = False
    compile_cache: bool = False

    @property
    def any(self) -> bool:
        return bool(self.load_format) or self.weight_cache or self.compile_cache


def cold_start(drawn_s: float, s: Startup) -> float:
    """The cold start with the options of ``s`` of a deployment whose cold start without them is ``drawn_s``."""
    if s.load_format not in LOADER_SPEEDUP:
        raise ValueError(f"load format {s.load_format!r}: modelled are {', '.join(k for k in LOADER_SPEEDUP if k)}")
    weights = WEIGHTS / LOADER_SPEEDUP[s.load_format]
    if s.weight_cache:
        weights /= LOCAL_DISK_SPEEDUP[s.load_format in CONCURRENT_LOADERS]
    compile_ = COMPILE * (WARM_COMPILE_FACTOR if s.compile_cache else 1.0)
    return drawn_s * (FIXED + weights + compile_)


FAST = Startup(load_format="runai_streamer", weight_cache=True, compile_cache=True)  # `--fast-starts`
