"""A measured point's figures from its outcomes (pure): what seed 004 asks a benchmark record to report.

Only requests that started inside the window count, and only successful ones give latency and tokens (output
tokens the endpoint reported, never the requested maximum); failures and cancellations are counted and their
reasons kept. Throughputs are the counted requests' tokens ÷ the window (steady state: as many requests start
per second as finish). Tokens are AgentX's three kinds: cached prompt tokens (``cached_tokens`` in usage),
computed (uncached) prompt tokens, and output tokens. A request with ``cached_tokens`` > 0 is a cache hit; hits
and misses get their own latency figures.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from v41flash_bench.serve.client import Outcome
from v41flash_bench.serve.driver import PointRun


def pct(xs: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100), linear between order statistics; None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist(xs: Sequence[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": statistics.fmean(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p95": pct(xs, 95),
            "p99": pct(xs, 99), "min": min(xs), "max": max(xs)}


def latency(ok: Sequence[Outcome]) -> dict:
    tpots = [o.tpot for o in ok if o.tpot]
    return {"ttft_s": dist([o.ttft for o in ok]), "itl_s": dist(tpots), "e2e_s": dist([o.e2e for o in ok]),
            "decode_tokens_per_s": dist([1.0 / t for t in tpots])}


def summarize(run: PointRun, *, window: tuple[float, float] | None = None, gpus: int | None = None,
              decode_ranks: int | None = None) -> dict:
    """Figures of the requests that started in ``window`` (default: the measured window).

    ``gpus``: GPUs serving (per-GPU figures); ``decode_ranks``: decode DP ranks serving (the mean batch per rank
    the profile fit needs: time-averaged requests in their decode phase ÷ ranks)."""
    w0, w1 = window or (run.warmup_s, run.warmup_s + run.duration_s)
    span = w1 - w0
    counted = [o for o in run.outcomes if w0 <= o.start < w1]
    ok = [o for o in counted if o.ok]
    errors = Counter(o.error.split(":")[0] if o.error != "cancelled" else "cancelled" for o in counted if not o.ok)
    cancelled = errors.get("cancelled", 0)
    out_tok = sum(o.output_tokens for o in ok)
    prompt_tok = sum(o.prompt_tokens for o in ok)
    cached_known = [o for o in ok if o.cached_tokens is not None]
    cached_tok = sum(o.cached_tokens for o in cached_known)
    computed_tok = prompt_tok - cached_tok
    hits = [o for o in cached_known if o.cached_tokens > 0]
    misses = [o for o in cached_known if o.cached_tokens == 0]
    fig = {
        "window_s": span,
        "requests": {"sent": len(counted), "succeeded": len(ok), "failed": len(counted) - len(ok) - cancelled,
                     "cancelled": cancelled, "success_rate": len(ok) / len(counted) if counted else None,
                     "errors": dict(errors)},
        "tokens": {"input": dist([o.prompt_tokens for o in ok]), "output": dist([o.output_tokens for o in ok]),
                   "cached_known": len(cached_known) == len(ok), "usage_reported": all(o.usage for o in ok),
                   "hit_rate": cached_tok / prompt_tok if cached_known and prompt_tok else None},
        "throughput": {"requests_per_s": len(ok) / span, "output_tokens_per_s": out_tok / span,
                       "input_tokens_per_s": computed_tok / span, "cached_tokens_per_s": cached_tok / span,
                       "total_tokens_per_s": (prompt_tok + out_tok) / span},
        "latency": latency(ok),
        "cache": {"hit": {"requests": len(hits), **latency(hits)}, "miss": {"requests": len(misses), **latency(misses)}},
        "sessions_completed": sum(1 for t in run.completed.values() if w0 <= t < w1),
    }
    if gpus:
        fig["per_gpu"] = {k.replace("_tokens_per_s", ""): v / gpus for k, v in fig["throughput"].items()
                          if k.endswith("tokens_per_s")}
    # the profile fit's inputs: requests in decode (first token → last) and in prefill, time-averaged
    decode_busy = sum(o.decode_s for o in ok if o.decode_s)
    ctx_weight = sum(o.decode_s * (o.prompt_tokens + o.output_tokens / 2) for o in ok if o.decode_s)
    fig["fit"] = {"running_decode": decode_busy / span, "running_prefill": sum(o.ttft for o in ok) / span,
                  "decode_context": ctx_weight / decode_busy if decode_busy else None,
                  "decode_batch_per_rank": decode_busy / span / decode_ranks if decode_ranks else None}
    return fig


def slo_met(fig: dict, slo: dict | None) -> bool | None:
    """TTFT at the SLO percentile ≤ target and e2e p95 ≤ target, with every request successful; None: no SLO."""
    if not slo:
        return None
    lat = fig["latency"]
    if not lat["ttft_s"].get("n"):
        return False
    ttft = pct_of(lat["ttft_s"], slo["ttft_percentile"])
    ok = ttft <= slo["ttft_s"] and (slo.get("e2e_p95_s") is None or lat["e2e_s"]["p95"] <= slo["e2e_p95_s"])
    return ok and fig["requests"]["success_rate"] == 1.0


def pct_of(d: dict, p: float) -> float:
    """A distribution's figure nearest at or above percentile p (p50/p90/p95/p99)."""
    for k in (50, 90, 95, 99):
        if p <= k:
            return d[f"p{k}"]
    return d["max"]


def cost(fig: dict, *, gpus: int | None, usd_per_gpu_hour: float | None, prices: dict | None) -> dict:
    """Cost figures: self-hosted from GPU-hours (tokens per TCO dollar, as AgentX counts: cached + input + output),
    managed from per-million-token prices (input = uncached prompt tokens, cached billed at its own price)."""
    span, thr, n = fig["window_s"], fig["throughput"], fig["sessions_completed"]
    if prices:
        usd = span * (thr["input_tokens_per_s"] * prices["input"] + thr["output_tokens_per_s"] * prices["output"]
                      + thr["cached_tokens_per_s"] * prices["cached"]) / 1e6
        basis = (f"managed API: ${prices['input']:g} / ${prices['output']:g} / ${prices['cached']:g} per million "
                 f"input / output / cached tokens")
    elif gpus and usd_per_gpu_hour:
        usd = gpus * usd_per_gpu_hour * span / 3600.0
        basis = f"self-hosted: {gpus} GPUs × ${usd_per_gpu_hour:g}/GPU-h over the window"
    else:
        return {"basis": "unknown: give a $/GPU-hour (or the CR's autoscaling.costPerGpuHour) or token prices"}
    total = thr["total_tokens_per_s"] * span
    return {"basis": basis, "usd_window": usd, "tokens_per_usd": total / usd if usd else None,
            "usd_per_completed_session": usd / n if n else None,
            "usd_per_million_output_tokens": usd / (thr["output_tokens_per_s"] * span) * 1e6
            if thr["output_tokens_per_s"] else None}
