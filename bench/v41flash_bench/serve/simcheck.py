"""What llm-d-inference-sim was configured to do, to hold a measurement against: TTFT = prefill overhead + time
per uncached prompt token × tokens, ITL = inter-token latency, both × the load factor
1 + (time-factor-under-load − 1) × (running − 1) ÷ (max-num-seqs − 1) (the simulator's own rule)."""
from __future__ import annotations

from v41flash_bench.inference_sim import SimLatency


def load_factor(lat: SimLatency, running: float, max_num_seqs: int) -> float:
    if max_num_seqs <= 1:
        return 1.0
    return 1.0 + (lat.time_factor_under_load - 1.0) * max(0.0, running - 1.0) / (max_num_seqs - 1)


def configured(lat: SimLatency, prompt_tokens: float, *, cached_tokens: float = 0.0, running: float = 1.0,
               max_num_seqs: int = 1, kv_transfer_ms: float = 0.0) -> dict:
    f = load_factor(lat, running, max_num_seqs)
    ttft = (lat.prefill_overhead_ms + lat.prefill_us_per_token / 1000.0 * (prompt_tokens - cached_tokens)) * f
    return {"ttft_s": (ttft + kv_transfer_ms) / 1000.0, "itl_s": lat.inter_token_ms * f / 1000.0}


def against(record: dict, expected: dict) -> list[dict]:
    """Measured (p50 of the record) against configured, with the relative error."""
    lat = record["figures"]["latency"]
    rows = []
    for key, figure in (("ttft_s", "TTFT p50"), ("itl_s", "ITL p50")):
        measured = lat[key]["p50"]
        rows.append({"figure": figure, "configured": expected[key], "measured": measured,
                     "error": measured / expected[key] - 1.0})
    return rows
