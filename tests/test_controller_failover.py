"""The planner's memory survives a failover: what a new leader (a fresh Autoscaler, no history) needs is in
status, so it neither decides again before the interval nor forgets what it learned or when it last scaled."""
from __future__ import annotations

import time

from test_controller_autoscale import BODY, IPS, SPEC, busy_page, cluster, seed_history, servers  # noqa: F401

from v41flash.controller.autoscale import Autoscaler, durable_state
from v41flash.controller.desired import desired_replicas
from v41flash.planner.datatypes import PlannerState


def test_a_new_leader_resumes_from_status(servers):  # noqa: F811
    old = Autoscaler(cluster())
    now = time.time()
    seed_history(old, {"prefill": busy_page(100, 0.05), "decode": busy_page(100, 0.05)}, now - 60)
    servers.text[IPS["prefill"]] = busy_page(1000, 4.5)
    servers.text[IPS["decode"]] = busy_page(1000, 0.05)
    out = old.step(BODY, SPEC)
    assert out.status["lastDecision"]["action"] == "scale_up"
    # what the old leader's reconcile wrote: its decision as desiredReplicas, the planner's fields
    status = {**BODY["status"], **out.status,
              **{role: {**BODY["status"][role], "desiredReplicas": n} for role, n in out.desired.items()}}
    body = {**BODY, "status": status}

    new = Autoscaler(cluster())  # the standby, taking over: no history, no in-memory state
    assert new.step(body, SPEC) is None  # the interval runs from the old leader's decision
    assert desired_replicas(SPEC, status, None) == desired_replicas(SPEC, BODY["status"], out.desired)
    restored = PlannerState.from_dict(status["plannerState"])
    assert durable_state(restored) == status["plannerState"] == durable_state(old.states["u1"])
    assert restored.prefill.last_scale_time == old.states["u1"].prefill.last_scale_time
