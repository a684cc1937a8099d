"""Engine pods' drain deadline: sized from the SLO's p95 e2e latency, within bounds the fixed grace
period covers."""
from __future__ import annotations

from v41flash.render.timing import (DEFAULT_DRAIN_SECONDS, DRAIN_MAX_SECONDS, SHUTDOWN_SECONDS, PodTiming,
                                    drain_seconds)


def test_drain_seconds_follow_p95_latency_with_bounds():
    assert drain_seconds(20.0) == 40
    assert drain_seconds(60.0) == 100
    assert drain_seconds(1.0) == 30  # floor
    assert drain_seconds(10_000.0) == DRAIN_MAX_SECONDS == 3600  # cap
    assert drain_seconds(None) == DEFAULT_DRAIN_SECONDS == 460  # no figure: 300 s assumed
    assert drain_seconds(float("inf")) == 460


def test_grace_period_covers_the_largest_drain_and_the_shutdown():
    assert PodTiming().termination_grace_period_seconds == DRAIN_MAX_SECONDS + SHUTDOWN_SECONDS
    assert all(drain_seconds(e) + SHUTDOWN_SECONDS <= PodTiming().termination_grace_period_seconds
               for e in (0.0, 60.0, 2399.0, 1e9, None))
