"""A tiny closed-form "true" deployment for planner tests: the profile's own formulas × a true factor.

The planner is handed the nominal profile; the truth may be slower or faster (k_prefill, k_decode),
which is exactly the "profile wrong by ±30 %" case the feedback loop must absorb.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from v41flash.figures import WindowFigures
from v41flash.planner import capacity
from v41flash.planner.plan import plan
from v41flash.planner.profile import profile_from_dict
from v41flash.planner.datatypes import (
    Bounds,
    Observation,
    PlannerConfig,
    PlannerState,
    RoleBounds,
    RoleObservation,
    RoleReplicas,
    Slo,
)

# a fixed profile for tests (shipped profiles get recalibrated; these numbers must not move)
PROFILE = profile_from_dict({
    "metadata": {"name": "test-tp4"},
    "servingProfile": "low-latency",
    "gpuProduct": "H200",
    "prefill": {"parallelism": "TP4", "gpusPerReplica": 4, "coldStartSeconds": 600,
                "curve": {"overhead": 0.02, "perToken": 1.53e-05, "perTokenContext": 1.2e-10}},
    "decode": {"parallelism": "TP4", "gpusPerReplica": 4, "coldStartSeconds": 600, "tokensPerStep": 2.5,
               "maxNumSeqs": 128, "kvCacheTokens": 80_000_000,
               "curve": {"overhead": 0.007, "perSequence": 0.00017, "perSequenceContext": 6.0e-11}},
    "kvTransfer": {"overheadSeconds": 0.003, "secondsPerToken": 2.0e-08},
})
SLO = Slo(ttft_s=1.5, e2e_p95_s=20.0, ttft_percentile=0.9, window_s=60.0)
ISL, HIT, OSL, OSL95 = 12000.0, 0.5, 400.0, 1200.0
CAP = 600.0  # an overloaded queue's latency within one window: large, finite
CV2 = PlannerConfig().size.service_cv2  # this world's prefill queues have the tail shape the planner assumes


def truth(rate: float, prefill_ready: int, decode_ready: int, kp: float = 1.0, kd: float = 1.0) -> dict:
    new, cached = ISL * (1 - HIT), ISL * HIT
    pp, dp = PROFILE.prefill, PROFILE.decode
    ttft = min(CAP, capacity.prefill_ttft(pp, rate, prefill_ready, new, cached, SLO.ttft_percentile, kp, cs2=CV2))
    ttft_mean = min(CAP, capacity.prefill_ttft(pp, rate, prefill_ready, new, cached, 0.5, kp, cs2=CV2))
    itl = min(1.0, capacity.decode_itl(dp, rate, decode_ready, OSL, ISL + OSL / 2, kd))
    return {"ttft": ttft, "ttft_mean": ttft_mean, "itl": itl, "e2e95": itl + OSL95 * itl}


def windows(rate: float, prefill_ready: int, decode_ready: int, t: float, kp=1.0, kd=1.0, noise=None) -> tuple[WindowFigures, WindowFigures]:
    f = truth(rate, prefill_ready, decode_ready, kp, kd)
    n = (lambda x: x * noise()) if noise else (lambda x: x)
    r = n(rate)
    pw = WindowFigures(
        start=t - 60, end=t, pods_expected=prefill_ready, pods_observed=prefill_ready,
        requests=r * 60, request_rate=r, ttft_percentile=SLO.ttft_percentile, ttft_s=n(f["ttft"]),
        ttft_mean_s=f["ttft_mean"], mean_input_tokens=ISL, prefix_cache_hit_rate=HIT,
        prefill_time_mean_s=n(PROFILE.prefill.request_seconds(ISL * (1 - HIT), ISL * HIT) * kp),
    )
    dw = WindowFigures(
        start=t - 60, end=t, pods_expected=decode_ready, pods_observed=decode_ready,
        requests=r * 60, request_rate=r, ttft_s=f["itl"], ttft_mean_s=f["itl"], e2e_p95_s=n(f["e2e95"]),
        itl_mean_s=n(f["itl"]), mean_input_tokens=ISL, mean_output_tokens=OSL, output_tokens_p95=OSL95,
    )
    return pw, dw


@dataclass
class Cluster:
    """Replicas per role with a cold start measured in decisions."""

    prefill: int
    decode: int
    cold_steps: int = 0
    pending: dict = field(default_factory=lambda: {"prefill": [], "decode": []})  # ready-at step

    def ready(self, role: str, step: int) -> int:
        return getattr(self, role) - sum(1 for s in self.pending[role] if s > step)

    def starting(self, role: str, step: int) -> int:
        return sum(1 for s in self.pending[role] if s > step)

    def apply(self, role: str, desired: int, step: int) -> None:
        cur = getattr(self, role)
        if desired > cur:
            self.pending[role] += [step + self.cold_steps] * (desired - cur)
        elif desired < cur:
            self.pending[role] = sorted(self.pending[role])[: max(0, len(self.pending[role]) - (cur - desired))]
        setattr(self, role, desired)


def run(
    rates,
    cluster: Cluster,
    kp: float = 1.0,
    kd: float = 1.0,
    interval: float = 30.0,
    bounds: Bounds = Bounds(prefill=RoleBounds(1, 20), decode=RoleBounds(1, 20)),
    config: PlannerConfig = PlannerConfig(),
    noise_seed: int | None = None,
    noise_cv: float = 0.1,
):
    """Feed the planner one decision per rate; returns the decisions and the final state."""
    rng = random.Random(noise_seed)
    noise = (lambda: max(0.05, rng.gauss(1.0, noise_cv))) if noise_seed is not None else None
    state = PlannerState()
    decisions = []
    for step, rate in enumerate(rates):
        t = 1_000_000.0 + step * interval
        pr, dr = cluster.ready("prefill", step), cluster.ready("decode", step)
        pw, dw = windows(rate, pr, dr, t, kp, kd, noise)
        obs = Observation(
            prefill=RoleObservation(RoleReplicas(cluster.prefill, pr, cluster.starting("prefill", step)), pw),
            decode=RoleObservation(RoleReplicas(cluster.decode, dr, cluster.starting("decode", step)), dw),
        )
        d = plan(obs, PROFILE, SLO, bounds, state, t, config)
        state = d.state
        cluster.apply("prefill", d.prefill.desired, step)
        cluster.apply("decode", d.decode.desired, step)
        decisions.append(d)
    return decisions, state


def ideal(rate: float, kp: float, kd: float, config: PlannerConfig = PlannerConfig()) -> tuple[int, int]:
    """Replicas the truth needs (what a planner with a perfect profile would ask for)."""
    import math

    new, cached = ISL * (1 - HIT), ISL * HIT
    itl_budget = (SLO.e2e_p95_s - SLO.ttft_s) / OSL95
    handover = PROFILE.kv_transfer.seconds(ISL) + itl_budget
    p = capacity.prefill_replicas_needed(
        PROFILE.prefill, rate, new, cached, SLO.ttft_s - handover, SLO.ttft_percentile, kp, config.size.target_utilization,
        cs2=config.size.service_cv2,
    )
    d = capacity.decode_replicas_needed(PROFILE.decode, rate, OSL, ISL + OSL / 2, itl_budget, kd, config.size.target_utilization)
    return math.ceil(p.replicas - 1e-9), math.ceil(d.replicas - 1e-9)
