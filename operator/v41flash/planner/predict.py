"""After the steps, ``predict``: what the model expects users to see at the decided replicas."""
from __future__ import annotations

from dataclasses import dataclass

from v41flash.planner import capacity
from v41flash.planner.datatypes import PlannerConfig, Slo
from v41flash.planner.demand import Budgets
from v41flash.planner.learn import Learned
from v41flash.planner.profile import CapacityProfile


@dataclass(frozen=True)
class Prediction:
    ttft_s: float | None = None
    e2e_p95_s: float | None = None
    itl_s: float | None = None


@dataclass(frozen=True)
class Predictions:
    decode: Prediction
    prefill: Prediction | None = None  # None: aggregated


def predict(prefill_load: tuple[float, int] | None, decode_rate: float, decode_replicas: int, learned: Learned,
            budgets: Budgets, profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> Predictions:
    """What the model expects users to see at the decided replicas. ``prefill_load``: (req/s, replicas) of
    prefill, None when aggregated."""
    cfg = config
    pp, dp = profile.prefill, profile.decode
    d, p = learned.sized, slo.ttft_percentile
    kp, kd = learned.prefill_correction, learned.decode_correction
    pred_ttft = None
    if prefill_load is not None:
        prefill_rate, prefill_replicas = prefill_load
        pred_ttft = capacity.prefill_ttft(
            pp, prefill_rate, prefill_replicas, d.new_tokens, d.cached_tokens, p, kp, None, cfg.size.service_cv2
        ) + budgets.handover_s
    pred_itl = capacity.decode_itl(dp, decode_rate, decode_replicas, d.osl, d.context, kd) if d.osl > 0 else None
    if prefill_load is None:
        dshare = capacity.decode_replicas_needed(dp, decode_rate, d.osl, d.context, budgets.itl_s, kd, 1.0).replicas
        pred_ttft = capacity.prefill_ttft(
            pp, decode_rate, max(0.1 * decode_replicas, decode_replicas - dshare), d.new_tokens, d.cached_tokens, p, kp,
            dp.data_parallel_size, cfg.size.service_cv2,
        )
    pred_e2e = pred_ttft + d.osl_p95 * pred_itl if pred_itl is not None and pred_ttft is not None else None
    if prefill_load is None:  # the one role computes prompts too: its TTFT is the deployment's
        return Predictions(decode=Prediction(ttft_s=pred_ttft, e2e_p95_s=pred_e2e, itl_s=pred_itl))
    return Predictions(decode=Prediction(e2e_p95_s=pred_e2e, itl_s=pred_itl), prefill=Prediction(ttft_s=pred_ttft))
