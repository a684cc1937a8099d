"""llm-d-inference-sim, the simulated vLLM engine: where the build lives and the one command line that
starts it (for the routing benchmark and for the e2e supervisor's simulated pods).

The build is e2e/build-tools.sh's bind-host patch of the pinned release (``-<SIM_PATCH>`` in the cache
folder name): it listens on ``V41F_SIM_BIND_HOST`` only, so engines on loopback addresses never collide.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Must match e2e/build-tools.sh's SIM_PATCH (the cache folder of the patched simulator).
SIM_PATCH = "v41f1"
BINARY = "llm-d-inference-sim"


def binary_path(cache_bin: Path, version: str, patched: bool = True) -> Path:
    """Where build-tools.sh puts the simulator of a version (the bind-host patched build by default)."""
    return cache_bin / (f"inference-sim-{version}-{SIM_PATCH}" if patched else f"inference-sim-{version}") / BINARY


@dataclass(frozen=True)
class SimLatency:
    """The simulator's latency model: per request, per uncached prompt token, per output token, and how
    much slower all of it gets at max-num-seqs running requests (linear from x1 at one)."""
    prefill_overhead_ms: float
    prefill_us_per_token: float
    inter_token_ms: float
    time_factor_under_load: float = 2.0


def _num(x: float) -> str:
    """A duration's number without a float's noise: 5.0 -> '5', 0.5 -> '0.5' (never an exponent)."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def sim_command(binary: str | Path, *, bind_host: str, port: int, served_names: Sequence[str], max_num_seqs: int,
                max_model_len: int, kv_cache_blocks: int, block_size: int, latency: SimLatency,
                kv_transfer_ms: float | None = None, zmq_endpoint: str | None = None, vllm_map_events: bool = False,
                seed: int | None = None, max_waiting: int | None = None, quiet: bool = False,
                extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one simulated engine on bind_host:port.

    Prompts are tokenized by the dummy tokenizer (one word, one token), answers are random words, the
    prefix cache is on (hits counted in whole blocks). ``zmq_endpoint`` None: no KV-event publisher.
    ``extra`` comes last, so its flags override the ones before (the simulator keeps a flag's last value).
    """
    argv = [str(binary), "--port", str(port), "--model", served_names[0], "--served-model-name", *served_names,
            "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
            "--kv-cache-size", str(kv_cache_blocks), "--block-size", str(block_size),
            "--force-dummy-tokenizer", "--mode", "random", "--enable-kvcache",
            f"--zmq-endpoint={zmq_endpoint or ''}"]
    if vllm_map_events:
        argv.append("--use-vllm-map-event-format")
    if seed is not None:
        argv += ["--seed", str(seed)]
    if max_waiting is not None:
        argv += ["--max-waiting-queue-length", str(max_waiting)]
    argv += ["--time-factor-under-load", str(float(latency.time_factor_under_load))]
    if kv_transfer_ms is not None:
        argv += ["--kv-cache-transfer-latency", f"{_num(kv_transfer_ms)}ms"]
    argv += ["--prefill-overhead", f"{_num(latency.prefill_overhead_ms)}ms",
             "--prefill-time-per-token", f"{_num(latency.prefill_us_per_token)}us",
             "--inter-token-latency", f"{_num(latency.inter_token_ms)}ms"]
    if quiet:
        argv += ["-v", "0"]
    argv += [str(a) for a in extra]
    # The patched build binds V41F_SIM_BIND_HOST; its KV cache needs POD_IP.
    return argv, {"V41F_SIM_BIND_HOST": bind_host, "POD_IP": bind_host}
