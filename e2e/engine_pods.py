"""Engine pods (prefill, decode): the llm-d-inference-sim that stands for a pod's vLLM, from the pod's `vllm serve`
command line; or, for the scraper's test, e2e/hostile_metrics.py. Pure functions."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from e2e.pod_spec import int_flag, flag_values
from v41flash_bench.inference_sim import FAIL_START, SimKnobs, SimLatency, sim_command

DEFAULT_VLLM_PORT = 8000
SIM_KV_BLOCKS_PER_ENGINE = 65536  # x 16 tokens: ~1M cached tokens per engine (DP rank)


# Simulated engine behaviour. Every engine can run a whole request (an aggregated deployment uses role
# decode), so all get prefill costs; prefill engines are tuned for prompt throughput, decode engines for
# inter-token latency. Latency grows linearly with running requests up to x2 at max-num-seqs. Extra args
# per role can be appended with V41F_SIM_ARGS_PREFILL / V41F_SIM_ARGS_DECODE (benchmarks), and per pod with
# the engine container's env V41F_SIM_ARGS (a deployment's spec.<role>.extraEnv; real vLLM ignores it).
SIM_BLOCK_SIZE = 16
SIM_KV_TRANSFER_MS = 10.0
SIM_ROLE_LATENCY = {
    "prefill": SimLatency(prefill_overhead_ms=15, prefill_us_per_token=20, inter_token_ms=20, time_factor_under_load=2.0),
    "decode": SimLatency(prefill_overhead_ms=25, prefill_us_per_token=40, inter_token_ms=10, time_factor_under_load=2.0),
}
POD_SIM_ARGS_ENV = "V41F_SIM_ARGS"
# An engine container with V41F_HOSTILE_METRICS=flood|drip gets e2e/hostile_metrics.py instead of the simulator:
# healthy, but its /metrics floods or drips (the scraper's byte cap and deadline under test).
HOSTILE_METRICS_ENV = "V41F_HOSTILE_METRICS"
HOSTILE_METRICS = Path(__file__).resolve().parent / "hostile_metrics.py"


@dataclass(frozen=True)
class VllmArgs:
    served_names: tuple
    port: int
    max_num_seqs: int | None
    max_model_len: int | None
    dp_ranks: int          # engines (DP ranks) this pod's API server fronts
    headless: bool


def parse_vllm(tokens: list[str], container_port: int | None = None) -> VllmArgs:
    """The settings a simulator needs from a `vllm serve` command line."""
    model = None
    if "serve" in tokens:
        i = tokens.index("serve")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            model = tokens[i + 1]
    model = (flag_values(tokens, "--model") or [model])[0]
    names = tuple(flag_values(tokens, "--served-model-name") or ([model] if model else []))
    if not names:
        raise ValueError("no model: neither `vllm serve <model>`, --model nor --served-model-name")
    dp = int_flag(tokens, "--data-parallel-size", "-dp", default=1)
    local = int_flag(tokens, "--data-parallel-size-local", "-dpl")
    ranks = 1 if flag_values(tokens, "--data-parallel-rank") is not None else (local or dp)
    return VllmArgs(served_names=names,
                    port=int_flag(tokens, "--port", default=container_port or DEFAULT_VLLM_PORT),
                    max_num_seqs=int_flag(tokens, "--max-num-seqs"),
                    max_model_len=int_flag(tokens, "--max-model-len"),
                    dp_ranks=ranks, headless="--headless" in tokens)


def pod_sim_command(binary: str, role: str, pod_ip: str, v: VllmArgs, extra: list[str] = ()) -> tuple[list[str], dict]:
    """llm-d-inference-sim argv and env for one vLLM pod.

    vLLM's API server fronts all of the pod's DP ranks on one port (--max-num-seqs is per rank); the
    simulator's own --data-parallel-size would put rank r on port+r instead, where neither clients nor the
    router send anything. So one simulated engine on the pod's port stands for all its ranks, with their
    summed concurrency and KV blocks."""
    return sim_command(binary, bind_host=pod_ip, port=v.port, served_names=v.served_names,
                       max_num_seqs=(v.max_num_seqs or 256) * v.dp_ranks, max_model_len=v.max_model_len or 262144,
                       kv_cache_blocks=SIM_KV_BLOCKS_PER_ENGINE * v.dp_ranks, block_size=SIM_BLOCK_SIZE,
                       latency=SIM_ROLE_LATENCY[role], kv_transfer_ms=SIM_KV_TRANSFER_MS, extra=extra)


def hostile_command(pod_ip: str, port: int, mode: str) -> list[str]:
    """e2e/hostile_metrics.py argv for one engine pod (ValueError naming the variable on an unknown mode)."""
    from e2e.hostile_metrics import MODES
    if mode not in MODES:
        raise ValueError(f"{HOSTILE_METRICS_ENV}={mode!r}: one of {', '.join(MODES)}")
    return [sys.executable, str(HOSTILE_METRICS), "--host", pod_ip, "--port", str(port), "--mode", mode]


def start_plan(knobs: SimKnobs, now: float) -> tuple[float, str]:
    """When to start a pod's simulator (monotonic seconds) and why never (``problem``): a start delay holds the
    pod Running and unready for that long; a forced start failure keeps it unready for good."""
    if knobs.fail_start:
        return float("inf"), f"forced start failure ({FAIL_START})"
    return now + knobs.start_delay_s, ""
