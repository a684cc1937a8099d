"""Engine pods' drain timing: sized from the SLO's p95 e2e latency, within bounds."""
from __future__ import annotations

from v41flash.render.timing import PodTiming, drain_timing


def drain(pre_stop: int, grace: int) -> PodTiming:
    return PodTiming(pre_stop_sleep_seconds=pre_stop, termination_grace_period_seconds=grace)


def test_drain_timing_follows_p95_latency_with_bounds():
    assert drain_timing(20.0) == drain(40, 70)
    assert drain_timing(1.0) == drain(30, 60)  # floor
    assert drain_timing(10_000.0) == drain(3600, 3630)  # cap
    assert drain_timing(None) == drain(460, 490)  # no figure: 300 s assumed
    assert drain_timing(float("inf")).pre_stop_sleep_seconds == 460
