"""llm-d-inference-sim, the simulated vLLM engine: where the build lives and the one command line that
starts it (for the routing benchmark and for the e2e supervisor's simulated pods).

The build is e2e/build-tools.sh's bind-host patch of the pinned release (``-<SIM_PATCH>`` in the cache
folder name): it listens on ``V41F_SIM_BIND_HOST`` only, so engines on loopback addresses never collide.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
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

    def scaled(self, factor: float) -> SimLatency:
        """The same engine with prefill (so TTFT) ``factor`` times slower; decode's inter-token latency kept."""
        if factor == 1.0:
            return self
        return replace(self, prefill_overhead_ms=self.prefill_overhead_ms * factor,
                       prefill_us_per_token=self.prefill_us_per_token * factor)

    def scaled_itl(self, factor: float) -> SimLatency:
        """The same engine with its inter-token latency (so ITL) ``factor`` times slower; prefill kept."""
        return self if factor == 1.0 else replace(self, inter_token_ms=self.inter_token_ms * factor)


# Launcher knobs, given among a pod's simulator arguments and taken out before the simulator sees them:
#   --v41f-start-delay=SECONDS   start the engine this long after its pod runs (a slow cold start)
#   --v41f-fail-start            never start it: the pod stays Running and never Ready (an OOM at start)
#   --v41f-latency-factor=X      prefill overhead and per-token prefill time x X (a slower TTFT)
#   --v41f-itl-factor=X          inter-token latency x X (a slower ITL: a straggler made on purpose)
KNOB_PREFIX = "--v41f-"
START_DELAY, FAIL_START, LATENCY_FACTOR = "--v41f-start-delay", "--v41f-fail-start", "--v41f-latency-factor"
ITL_FACTOR = "--v41f-itl-factor"


@dataclass(frozen=True)
class SimKnobs:
    start_delay_s: float = 0.0
    fail_start: bool = False
    latency_factor: float = 1.0
    itl_factor: float = 1.0


def _knob_number(flag: str, value: str | None, *, positive: bool) -> float:
    if value is None:
        raise ValueError(f"{flag} needs a value")
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{flag}={value!r} is not a number") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise ValueError(f"{flag}={value!r} must be a finite number {'> 0' if positive else '>= 0'}")
    return x


def split_knobs(args: Sequence[str]) -> tuple[SimKnobs, list[str]]:
    """The launcher knobs among ``args`` and the arguments left for the simulator. An unknown ``--v41f-``
    flag or a bad value is a ValueError naming the flag (a typo must not silently run a normal engine)."""
    knobs: dict[str, float | bool] = {}
    rest: list[str] = []
    args = [str(a) for a in args]
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith(KNOB_PREFIX):
            rest.append(a)
            continue
        flag, eq, value = a.partition("=")
        if flag == FAIL_START:
            if eq:
                raise ValueError(f"{FAIL_START} takes no value (got {a!r})")
            knobs["fail_start"] = True
            continue
        if flag not in (START_DELAY, LATENCY_FACTOR, ITL_FACTOR):
            raise ValueError(f"unknown simulator launcher flag {flag} (known: {START_DELAY}, {FAIL_START}, "
                             f"{LATENCY_FACTOR}, {ITL_FACTOR})")
        if not eq:
            value = args[i] if i < len(args) and not args[i].startswith("--") else None
            i += value is not None
        if flag == START_DELAY:
            knobs["start_delay_s"] = _knob_number(flag, value, positive=False)
        else:
            knobs["latency_factor" if flag == LATENCY_FACTOR else "itl_factor"] = _knob_number(flag, value,
                                                                                              positive=True)
    return SimKnobs(**knobs), rest


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
    ``extra`` comes last, so its flags override the ones before (the simulator keeps a flag's last value);
    launcher knobs in it (``split_knobs``) are taken out, and the latency factor scales ``latency``. Start
    delay and forced failure are the caller's to honour (the process it starts is the simulator).
    """
    knobs, extra = split_knobs(extra)
    latency = latency.scaled(knobs.latency_factor).scaled_itl(knobs.itl_factor)
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
