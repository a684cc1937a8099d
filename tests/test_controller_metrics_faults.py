"""Engines' /metrics failing in the ways real ones do — garbage, a timeout, a counter reset (an engine
restarted), one role unreachable — while the deployment runs above its minimum: the planner holds, says why
in lastDecision, and never scales down on missing data."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from test_controller_autoscale import BODY, IPS, SPEC, Autoscaler, busy_page, cluster, seed_history, servers  # noqa: F401

from v41flash.planner.datatypes import PlannerConfig

# No scale-down stabilization: with good data this quiet minute IS a scale-down (the control test), so a
# hold under a fault is the fault's doing.
EAGER = PlannerConfig.for_spec(SPEC.autoscaling.interval_seconds, 0)

# Running at 2 replicas per role (min 1): a scale-down is possible, so holding is a choice.
STATUS = {"prefill": {"desiredReplicas": 2, "readyReplicas": 2, "replicas": 2},
          "decode": {"desiredReplicas": 2, "readyReplicas": 2, "replicas": 2}}
BODY2 = {**BODY, "status": STATUS}


def due(scaler: Autoscaler) -> None:
    """Make the planner's interval have passed (it decided once already)."""
    state = scaler.states["u1"]
    scaler.states["u1"] = replace(state, last_decision_time=state.last_decision_time - SPEC.autoscaling.interval_seconds)


def idle_history(scaler: Autoscaler, servers, t: float) -> None:  # noqa: F811
    """A quiet minute: few requests, fast; with good data this would be a reason to shrink."""
    seed_history(scaler, {"prefill": busy_page(10, 0.05), "decode": busy_page(10, 0.05)}, t - 120)
    seed_history(scaler, {"prefill": busy_page(12, 0.05), "decode": busy_page(12, 0.05)}, t - 60)


def decide(scaler: Autoscaler):
    first = scaler.step(BODY2, SPEC)
    if first is None or not first.status.get("lastDecision"):
        due(scaler)
        return scaler.step(BODY2, SPEC)
    due(scaler)
    return scaler.step({**BODY2, "status": {**STATUS, **first.status}}, SPEC)


@pytest.mark.parametrize("fault", ["garbage", "empty", "reset"])
def test_bad_metrics_never_scale_down(servers, fault):  # noqa: F811
    scaler = Autoscaler(cluster(), config=EAGER)
    idle_history(scaler, servers, time.time())
    page = {"garbage": "<html>502 Bad Gateway</html>\n\x00\x01 not prometheus {{{",
            "empty": "",
            "reset": busy_page(1, 0.05)}[fault]  # counters below the last scrape: an engine restarted
    for ip in IPS.values():
        servers.text[ip] = page
    out = decide(scaler)
    assert out is not None
    for role in ("prefill", "decode"):
        assert out.desired.get(role, 2) >= 2, out.status["lastDecision"]["reason"]
    assert out.status["lastDecision"]["action"] != "scale_down"
    assert out.status["lastDecision"]["reason"]  # says why it holds


def test_one_role_unreachable_holds_that_role(servers):  # noqa: F811
    scaler = Autoscaler(cluster(), config=EAGER)
    idle_history(scaler, servers, time.time())
    servers.text[IPS["prefill"]] = busy_page(14, 0.05)
    servers.text[IPS["decode"]] = "not metrics"
    out = decide(scaler)
    assert out.desired.get("decode", 2) >= 2, out.status["lastDecision"]["reason"]


def test_control_the_same_quiet_minute_with_good_metrics_scales_down(servers):  # noqa: F811
    """Without a fault the same minute shrinks the deployment: the holds above are the faults' doing."""
    scaler = Autoscaler(cluster(), config=EAGER)
    idle_history(scaler, servers, time.time())
    for ip in IPS.values():
        servers.text[ip] = busy_page(14, 0.05)
    out = decide(scaler)
    assert out.status["lastDecision"]["action"] == "scale_down", out.status["lastDecision"]["reason"]
