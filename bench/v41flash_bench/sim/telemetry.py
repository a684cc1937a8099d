"""Simulated metrics: the same ``WindowFigures`` the operator's scraper builds, from simulator telemetry.

Figures are what vLLM pods of each role would export in a disaggregated deployment:

- a prefill pod sees a request from router arrival to the end of its prefill (its TTFT and e2e);
- a decode pod sees it from the end of prefill (KV hand-over, admission wait, first step: its TTFT)
  to the last token (its e2e).

Latency percentiles are exact over the window (the real scraper interpolates histogram buckets).
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from v41flash.figures import RouterFigures, WindowFigures
from v41flash.planner import headroom
from v41flash.planner.datatypes import Observation, RoleObservation, RoleReplicas


def _slice(times: list, lo: float, hi: float) -> tuple[int, int]:
    return bisect.bisect_right(times, lo), bisect.bisect_right(times, hi)


def _pct(values: list, a: int, b: int, q: float) -> float | None:
    if b <= a:
        return None
    return float(np.percentile(np.asarray(values[a:b]), q * 100.0))


def _mean(values: list, a: int, b: int) -> float | None:
    if b <= a:
        return None
    return float(np.mean(np.asarray(values[a:b])))


def role_gauges(sim, role: str) -> dict[str, float]:
    """Instantaneous sums over the role's engines (Ready and draining replicas)."""
    now = sim.now
    running = waiting = 0
    per_engine, kv = [], []
    if role == "prefill":
        for r in sim.replicas["prefill"]:
            if r.state in ("ready", "draining"):
                for k in r.ranks:
                    while k.starts and k.starts[0][1] <= now:
                        k.starts.popleft()
                    busy = sum(1 for st, _ in k.starts if st <= now)
                    running += busy
                    waiting += len(k.starts) - busy
                    per_engine.append(len(k.starts))
        waiting += len(sim.waiting_for_prefill)
    else:
        cap = sim.truth.decode.kv_cache_tokens
        for r in sim.replicas["decode"]:
            if r.state in ("ready", "draining"):
                for k in r.ranks:
                    sim._advance(k)
                    running += k.n
                    waiting += len(k.waiting)
                    per_engine.append(k.n)
                    kv.append(k.context() / cap)
        waiting += len(sim.waiting_for_decode)
    mean = sum(per_engine) / len(per_engine) if per_engine else 0.0
    return {
        "running": float(running),
        "waiting": float(waiting),
        "engines": float(len(per_engine)),
        "kv_usage": sum(kv) / len(kv) if kv else None,
        "kv_usage_sum": float(sum(kv)),
        "load_spread": (max(per_engine) / mean) if mean > 0 else None,
    }


def window_figures(sim, role: str, window_s: float, ttft_percentile: float) -> WindowFigures:
    """The role's figures over (now − window_s, now]."""
    tel, now = sim.telemetry, sim.now
    lo = now - window_s
    ready = sum(1 for r in sim.replicas[role] if r.state in ("ready", "draining"))
    g = role_gauges(sim, role)
    common = dict(
        start=lo, end=now, pods_expected=ready, pods_observed=ready, running=g["running"],
        waiting=g["waiting"], kv_cache_usage=g["kv_usage"], load_spread=g["load_spread"],
        engines=int(g["engines"]), ttft_percentile=ttft_percentile,
    )
    if role == "prefill":
        a, b = _slice(tel.pf_t, lo, now)
        n = b - a
        prompt = float(sum(tel.pf_prompt[a:b]))
        cached = float(sum(tel.pf_cached[a:b]))
        return WindowFigures(
            requests=float(n), request_rate=n / window_s,
            ttft_s=_pct(tel.pf_latency, a, b, ttft_percentile), ttft_mean_s=_mean(tel.pf_latency, a, b),
            e2e_p95_s=_pct(tel.pf_latency, a, b, 0.95), e2e_mean_s=_mean(tel.pf_latency, a, b),
            prefill_time_mean_s=_mean(tel.pf_service, a, b),
            prompt_tokens_rate=prompt / window_s, generation_tokens_rate=n / window_s,
            mean_input_tokens=prompt / n if n else None, mean_output_tokens=1.0 if n else None,
            prefix_cache_hit_rate=cached / prompt if prompt > 0 else None,
            **common,
        )
    a, b = _slice(tel.done_t, lo, now)
    fa, fb = _slice(tel.ft_t, lo, now)
    n = b - a
    out = float(sum(tel.out[a:b]))
    prompt = float(sum(tel.prompt[a:b]))
    return WindowFigures(
        requests=float(n), request_rate=n / window_s,
        ttft_s=_pct(tel.ft_decode_ttft, fa, fb, ttft_percentile), ttft_mean_s=_mean(tel.ft_decode_ttft, fa, fb),
        e2e_p95_s=_pct(tel.decode_e2e, a, b, 0.95), e2e_mean_s=_mean(tel.decode_e2e, a, b),
        queue_p95_s=_pct(tel.queue_s, a, b, 0.95), itl_mean_s=_mean(tel.itl, a, b),
        prompt_tokens_rate=prompt / window_s, generation_tokens_rate=out / window_s,
        mean_input_tokens=prompt / n if n else None, mean_output_tokens=out / n if n else None,
        output_tokens_p95=_pct(tel.out, a, b, 0.95),
        **common,
    )


def role_replicas(sim, role: str) -> RoleReplicas:
    now = sim.now
    starting = [r for r in sim.replicas[role] if r.state == "starting"]
    ready = sum(1 for r in sim.replicas[role] if r.state == "ready")
    return RoleReplicas(
        desired=ready + len(starting), ready=ready, starting=len(starting),
        starting_for_s=tuple(now - r.requested for r in starting),
    )


def router_figures(sim, window_s: float) -> RouterFigures:
    """The router's view: requests it completed in the window and their whole latency."""
    tel, now = sim.telemetry, sim.now
    a, b = _slice(tel.done_t, now - window_s, now)
    i, j = _slice(tel.arr_t, now - window_s, now)  # what the session proxy counts on arrival
    n, m = _slice(tel.new_t, now - window_s, now)
    return RouterFigures(
        start=now - window_s, end=now, requests=float(b - a), request_rate=(b - a) / window_s,
        e2e_p95_s=_pct(tel.e2e, a, b, 0.95), e2e_mean_s=_mean(tel.e2e, a, b), pods_observed=1,
        arrival_rate=(j - i) / window_s, new_session_rate=(m - n) / window_s,
    )


def measured_cold_start(sim, role: str) -> float | None:
    """What the controller reads off pod timestamps: created → Ready of the role's newest replicas (the
    initial ones are Ready at t=0 here; on a cluster their pods went through the same cold start)."""
    cold = getattr(sim.truth, role).cold_start_seconds
    samples = [(r.requested, r.ready - r.requested if r.ready > r.requested else cold) for r in sim.replicas[role]
               if math.isfinite(r.ready)]
    return headroom.measured_cold_start(samples)


def observation(sim, window_s: float, ttft_percentile: float) -> Observation:
    """What the operator's controller would hand the planner at this moment."""
    return Observation(
        prefill=RoleObservation(role_replicas(sim, "prefill"), window_figures(sim, "prefill", window_s, ttft_percentile),
                                cold_start_s=measured_cold_start(sim, "prefill")),
        decode=RoleObservation(role_replicas(sim, "decode"), window_figures(sim, "decode", window_s, ttft_percentile),
                               cold_start_s=measured_cold_start(sim, "decode")),
        router=router_figures(sim, window_s),
    )
