"""Regression, found by the e2e autoscaling run (e2e/test_autoscale.py): in a window without finished requests
while the smoothed rate is still decaying, plan.py derived the ITL budget from a p95 output length of 0, so
the whole e2e headroom became "decode's first step", the KV hand-over ate the TTFT budget and the reason said
"target unattainable with this profile even unloaded" on an idle deployment."""
from __future__ import annotations

from test_planner import T, decide, observe
from v41flash.planner.datatypes import PlannerState, RoleState

IDLE = dict(requests=0.0, request_rate=0.0, ttft_s=None, ttft_mean_s=None, e2e_p95_s=None, e2e_mean_s=None,
            mean_input_tokens=None, mean_output_tokens=None, output_tokens_p95=None, itl_mean_s=None)


def test_an_idle_window_is_not_reported_as_an_unattainable_target():
    rs = RoleState(rate_level=0.5, rate_time=T - 30)  # the load just stopped: the smoothed rate is decaying
    d = decide(observe(0.0, pw=IDLE, dw=IDLE), state=PlannerState(prefill=rs, decode=rs))
    assert d.prefill.desired <= 2  # the decision itself is fine
    assert "unattainable" not in d.prefill.reason, d.prefill.reason


def test_an_idle_window_never_asks_for_decode_capacity():
    """The assumed output length only splits the SLO; it must not size decode on an empty window."""
    rs = RoleState(rate_level=60.0, rate_time=T - 30)  # load just stopped; the smoothed rate still reads 60/s
    d = decide(observe(0.0, pw=IDLE, dw=IDLE), state=PlannerState(prefill=rs, decode=rs))
    assert d.decode.action != "scale_up", d.decode.reason
    assert d.prefill.action != "scale_up", d.prefill.reason
