"""Regression, found by the e2e autoscaling run (e2e/test_autoscale.py): when max-num-seqs caps the
decode batch below what the ITL budget would allow, capacity.decode_replicas_needed divided by the
budget instead of the (faster) ITL of that capped batch and sized decode several times too large."""
from __future__ import annotations

import math

import pytest

from v41flash.planner import capacity
from v41flash.planner.profile import DecodeProfile

# the decode section of e2e/autoscale/sim-profile.yaml (one simulated TP4 engine, max-num-seqs 16)
SIM_DECODE = DecodeProfile.model_validate({
    "parallelism": "TP4", "gpusPerReplica": 4, "dataParallelSize": 1, "coldStartSeconds": 10.0,
    "curve": {"overhead": 0.00936, "perSequence": 0.000617, "perSequenceContext": 0.0},
    "tokensPerStep": 1.0, "maxNumSeqs": 16, "kvCacheTokens": 1048576})


def test_decode_need_agrees_with_the_models_own_itl_when_max_num_seqs_caps_the_batch():
    rate, osl, context, itl_budget = 8.0, 64, 1032, 0.086  # the e2e run: 8 req/s, 64 tokens, e2e 6 s
    # the model's own prediction: one replica at 8 req/s runs ~9 sequences at ~14 ms ITL, far inside the budget
    assert capacity.decode_itl(SIM_DECODE, rate, 1, osl, context) < itl_budget / 5
    need = capacity.decode_replicas_needed(SIM_DECODE, rate, osl, context, itl_budget)
    assert math.ceil(need.replicas) == 1, need  # was 3.06 replicas before the fix
