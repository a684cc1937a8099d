"""After the steps, predict (planner/predict.py): what users should see at the decided replicas."""
from __future__ import annotations

import pytest

from planner_kit import CFG, aggregated, learned_for, observe, steps_to_learned
from planner_sim import OSL95, PROFILE, SLO
from v41flash.planner import capacity
from v41flash.planner.predict import predict


def test_predictions_at_the_decided_replicas():
    obs = observe(14, prefill=2)
    dem, budgets, _, lrn = steps_to_learned(obs)
    out = predict((14.0, 3), 14.0, 1, lrn, budgets, PROFILE, SLO, CFG)
    assert out.prefill.ttft_s < SLO.ttft_s < predict((14.0, 2), 14.0, 1, lrn, budgets, PROFILE, SLO, CFG).prefill.ttft_s
    assert out.decode.ttft_s is None and out.prefill.itl_s is None
    s = lrn.sized
    assert out.prefill.ttft_s == capacity.prefill_ttft(PROFILE.prefill, 14.0, 3, s.new_tokens, s.cached_tokens, 0.9,
                                                       lrn.prefill_correction, cs2=CFG.size.service_cv2) + budgets.handover_s
    assert out.decode.e2e_p95_s == pytest.approx(out.prefill.ttft_s + OSL95 * out.decode.itl_s)
    agg = predict(None, 14.0, 4, learned_for(aggregated(14)), budgets, PROFILE, SLO, CFG)
    assert agg.prefill is None and agg.decode.ttft_s is not None
    assert agg.decode.e2e_p95_s == pytest.approx(agg.decode.ttft_s + OSL95 * agg.decode.itl_s)
