"""Traffic the planner was not tuned for (issue 40): eleven families drawn from a seed, one generator each.

They are the shapes of the issue's thirteen scenarios written apart from the project, as families — drawn, never
copied from those files: a daily peak drifting above the days the status holds, a week that starts on a Saturday, a
day after a one-hour clock change, a daily 30-minute job at 02:00 learned at the operator's own 15-minute buckets
(and the same job declared as a schedule), an office-hours ramp, an 8× surge from a low base, a 40-minute slow
ramp, an outage after which everyone returns at once, a capacity profile 20–35 % wrong either way, and noisy
periodic bursts. The common draws (product, serving profile, SLO, cold start, peak) are the suite's
(``suite.draw_scenario``); ``shape`` draws the rest. Seeds from ``UNSEEN_FROM`` draw these families round-robin.
"""
from __future__ import annotations

import numpy as np

UNSEEN_FROM = 2001
UNSEEN_FAMILIES = ("drift", "weekend_start", "clock_shift", "daily_job", "daily_job_scheduled", "office_ramp",
                   "surge_8x", "slow_ramp", "outage_return", "profile_wrong", "noisy_periodic")
UNSEEN_TUNING_SEEDS = tuple(range(2001, 2101))
UNSEEN_HELD_OUT_SEEDS = tuple(range(3001, 3101))

RANGES = {
    "drift": (1.1, 1.3),  # today's level over the past days'
    "clock_shift_h": (1.0, 1.0),  # hours (of a 24-hour day) the past is shifted by, either way
    "job_s": (1800.0, 1800.0),
    "job_base": (0.15, 0.35),
    "office_base": (0.25, 0.35),
    "office_ramp_s": (300.0, 600.0),
    "surge8_base": (0.1, 0.15),
    "surge8_ramp_s": (60.0, 150.0),
    "slow_ramp_s": (1500.0, 1700.0),
    "outage_level": (0.02, 0.05),
    "outage_s": (900.0, 1200.0),
    "outage_return_s": (60.0, 120.0),
    "profile_optimistic": (0.65, 0.8),  # × on the policies' latency curves: they think the engines faster
    "profile_pessimistic": (1.25, 1.4),
    "measured_profile_error": (0.9, 1.1),  # the other families: a profile measured on this hardware
    "noisy_every_s": (240.0, 600.0),
    "noisy_burst_s": (60.0, 180.0),
    "noisy_cv": (2.0, 3.0),
    "cold_start_s": (240.0, 900.0),
}
JOB_EPOCH = "2026-12-07T01:35:00Z"  # the run starts at 01:35: scored from 01:45, the job runs 02:00–02:30


def family_of(seed: int) -> str:
    return UNSEEN_FAMILIES[(seed - UNSEEN_FROM) % len(UNSEEN_FAMILIES)]


def _u(rng: np.random.Generator, key: str) -> float:
    lo, hi = RANGES[key]
    return float(rng.uniform(lo, hi))


def _minutes(x: float) -> float:
    return 60.0 * round(x / 60.0)


def shape(family: str, rng: np.random.Generator, peak: float) -> tuple[dict, str, dict, float, float]:
    """(arrivals, description, scenario fields, peak, the policies' profile error) of one unseen family."""
    error = _u(rng, "measured_profile_error")
    extra: dict = {}
    cv = float(rng.uniform(1.0, 2.0))
    if family in ("drift", "clock_shift", "weekend_start"):
        day = _minutes(float(rng.uniform(1200.0, 2400.0))) if family != "weekend_start" else \
            _minutes(float(rng.uniform(600.0, 900.0)))
        arrivals = {"pattern": "diurnal", "trough": float(rng.uniform(0.3, 0.6)), "period_s": day,
                    "phase": float(rng.uniform(0.0, 0.5)), "cv": cv}
        periods = (day, 7 * day)
        history = {"spanS": 4 * (7 * day if family == "weekend_start" else day), "bucketS": 60.0,
                   "seasonPeriodsS": list(periods)}
        if family == "drift":
            d = _u(rng, "drift")
            history["level"] = round(1.0 / d, 4)
            desc = f"daily, a {day / 60:.0f}-min day, today ×{d:.2f} over the past days"
        elif family == "clock_shift":
            sign = 1.0 if rng.uniform() < 0.5 else -1.0
            history["shiftS"] = round(sign * day * _u(rng, "clock_shift_h") / 24.0, 1)
            desc = f"daily, a {day / 60:.0f}-min day, the past {history['shiftS']:+.0f}s shifted (a one-hour clock change)"
        else:
            arrivals.update(weekend=float(rng.uniform(0.3, 0.6)), weekday_at_0=5, phase=float(rng.uniform(0.0, 0.3)))
            desc = f"weekly, a {day / 60:.0f}-min day, weekend ×{arrivals['weekend']:.2f}, the run starts on a Saturday"
        extra["history"] = history
    elif family in ("daily_job", "daily_job_scheduled"):
        length = _u(rng, "job_s")
        peak *= 0.6  # sessions outlive the job, as for the suite's burst families
        arrivals = {"pattern": "batch", "base": _u(rng, "job_base"), "burst_level": 1.0, "burst_every_s": 86400.0,
                    "burst_s": length, "burst_offset_s": 1500.0, "cv": cv}
        extra["epoch"] = JOB_EPOCH
        desc = f"a {length / 60:.0f}-min job at 02:00 daily over base {arrivals['base']:.2f}, real time"
        if family == "daily_job":
            # the operator's own season: 15-minute buckets, a day and a week, four days of them in status
            extra["history"] = {"spanS": 4 * 86400.0, "bucketS": 900.0, "seasonPeriodsS": [86400.0, 7 * 86400.0]}
            desc += ", four days learned at 15-min buckets"
        else:
            from v41flash_bench.sim.suite import _job_rate
            extra["schedules"] = [{"name": "nightly-job", "cron": "0 2 * * *", "durationSeconds": int(length),
                                   "timeZone": "UTC", "requestsPerSecond": _job_rate(arrivals, peak, length)}]
            desc += f", declared as a schedule ({extra['schedules'][0]['requestsPerSecond']} req/s)"
    elif family == "office_ramp":
        at, ramp = float(rng.uniform(700.0, 1000.0)), _u(rng, "office_ramp_s")
        arrivals = {"pattern": "surge", "base": _u(rng, "office_base"), "surge_at_s": at, "surge_ramp_s": ramp, "cv": cv}
        desc = f"office-hours ramp {arrivals['base']:.2f} → 1.0 at {at:.0f}s over {ramp:.0f}s"
    elif family == "surge_8x":
        at, ramp = float(rng.uniform(900.0, 1300.0)), _u(rng, "surge8_ramp_s")
        arrivals = {"pattern": "surge", "base": _u(rng, "surge8_base"), "surge_at_s": at, "surge_ramp_s": ramp, "cv": cv}
        if rng.uniform() < 0.5:
            arrivals["surge_end_s"] = at + float(rng.uniform(600.0, 900.0))
        desc = (f"surge ×{1 / arrivals['base']:.0f} from {arrivals['base']:.2f} at {at:.0f}s over {ramp:.0f}s"
                + (f", back at {arrivals['surge_end_s']:.0f}s" if "surge_end_s" in arrivals else ", stays"))
    elif family == "slow_ramp":
        ramp = _u(rng, "slow_ramp_s")
        arrivals = {"pattern": "surge", "base": 0.3, "surge_at_s": 650.0, "surge_ramp_s": ramp, "cv": cv}
        desc = f"slow ramp 0.3 → 1.0 from 650s over {ramp / 60:.0f} min"
    elif family == "outage_return":
        at, length, back = float(rng.uniform(900.0, 1100.0)), _u(rng, "outage_s"), _u(rng, "outage_return_s")
        arrivals = {"pattern": "outage", "level": float(rng.uniform(0.7, 1.0)), "base": _u(rng, "outage_level"),
                    "surge_at_s": at, "surge_end_s": at + length, "surge_ramp_s": back, "cv": cv}
        desc = (f"outage: {arrivals['level']:.2f} → {arrivals['base']:.2f} at {at:.0f}s for {length / 60:.0f} min, "
                f"everyone back within {back:.0f}s")
    elif family == "profile_wrong":
        optimistic = rng.uniform() < 0.5
        error = _u(rng, "profile_optimistic" if optimistic else "profile_pessimistic")
        arrivals = {"pattern": "diurnal", "trough": float(rng.uniform(0.4, 0.8)), "period_s": 1800.0,
                    "phase": float(rng.uniform(0.0, 1.0)), "cv": cv}
        desc = f"capacity profile {'optimistic' if optimistic else 'pessimistic'} (×{error:.2f} on its latencies)"
    elif family == "noisy_periodic":
        every, burst = _u(rng, "noisy_every_s"), _u(rng, "noisy_burst_s")
        peak *= 0.6
        arrivals = {"pattern": "batch", "base": float(rng.uniform(0.3, 0.5)), "burst_level": 1.0,
                    "burst_every_s": round(every, 1), "burst_s": round(burst, 1),
                    "burst_offset_s": round(float(rng.uniform(0.0, every)), 1), "cv": _u(rng, "noisy_cv")}
        desc = f"noisy periodic bursts of {burst:.0f}s every {every:.0f}s, CV {arrivals['cv']:.1f}, no schedule"
    else:
        raise ValueError(f"unknown unseen family {family!r}")
    return arrivals, desc, extra, peak, error
