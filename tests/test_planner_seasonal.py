"""The learned seasonal forecaster (planner/seasonal.py): a season where there is one, nothing where there is none."""
from __future__ import annotations

import json
import math
import random

import pytest

from v41flash.planner import seasonal as SE

BUCKET = 60.0
DAY = 1800.0  # a compressed "day" of 30 buckets (as in the simulator)
S = SE.Settings(periods_s=(DAY, 7 * DAY), level_buckets=4)
HORIZON = 600.0


def hist(rates, start=0.0):
    return SE.seeded(BUCKET, start, list(rates))


def daily(t, trough=0.4):
    return 10.0 * (trough + (1 - trough) * 0.5 * (1 - math.cos(2 * math.pi * t / DAY)))


def series(f, days, noise=0.05, seed=1):
    rng = random.Random(seed)
    n = int(days * DAY / BUCKET)
    return [f(i * BUCKET) * math.exp(rng.gauss(0, noise)) for i in range(n)]


def test_a_daily_season_is_found_and_forecasts_the_coming_rise():
    h = hist(series(daily, 4))
    model = SE.fit(h, HORIZON, S)
    assert model is not None and model.period_s == DAY and model.error < S.skill * model.persistence_error
    now = 4 * DAY  # the trough: the next 10 minutes climb to ~5.6 req/s (the shape's value at t + 600 s)
    rate, level = SE.peak(h, model, now, HORIZON, S)
    assert 0.9 < level < 1.1
    assert daily(HORIZON) * 0.95 <= rate <= daily(HORIZON) * model.headroom * 1.1
    assert 1.0 <= model.headroom <= 1.2  # 5 % noise: a small learned headroom


def test_white_noise_has_no_season():
    rng = random.Random(2)
    assert SE.fit(hist([10 * math.exp(rng.gauss(0, 0.3)) for _ in range(200)]), HORIZON, S) is None


def test_a_trend_without_a_season_has_no_season():
    assert SE.fit(hist(series(lambda t: 2.0 + t / 600.0, 5, noise=0.03)), HORIZON, S) is None
    assert SE.fit(hist(series(lambda t: 40.0 - t / 400.0, 5, noise=0.03)), HORIZON, S) is None


def test_one_off_spikes_on_flat_traffic_make_no_season():
    rates = series(lambda t: 10.0, 5, noise=0.05)
    for i in (17, 61, 95, 140):  # four incidents of 3× demand, at unrelated times
        rates[i] = rates[i + 1] = 30.0
    assert SE.fit(hist(rates), HORIZON, S) is None


def test_a_one_off_spike_on_a_seasonal_day_does_not_come_back_tomorrow():
    rates = series(daily, 4)
    spike = int(3 * DAY / BUCKET) + 2  # day 3, 2 minutes in: the trough, × 4
    rates[spike] = rates[spike + 1] = 16.0
    h = hist(rates)
    model = SE.fit(h, HORIZON, S)
    rate, _ = SE.peak(h, model, 4 * DAY, 180.0, S)  # the same time of day, a day later
    assert rate < 6.0  # a median of four past days: the spike is one of them


def test_zero_length_and_short_histories_forecast_nothing():
    assert SE.fit(SE.History(BUCKET), HORIZON, S) is None
    assert SE.fit(hist(series(daily, 1.5)), HORIZON, S) is None  # fewer than two past periods to backtest on


def test_a_weekly_shape_is_told_from_a_daily_one():
    week = 7 * DAY

    def weekly(t):
        day = int((t % week) // DAY)
        return daily(t) * (0.35 if day >= 5 else 1.0)  # weekends at a third

    h = hist(series(weekly, 21))
    model = SE.fit(h, HORIZON, S)
    assert model is not None and model.period_s == week
    # Monday's rise after a quiet weekend: the daily median of the last days (Fri, Sat, Sun) would say a third
    monday_trough = 21 * DAY
    rate, _ = SE.peak(h, model, monday_trough, HORIZON, S)
    assert rate >= 0.9 * daily(HORIZON)


def test_record_closes_buckets_fills_gaps_and_keeps_the_newest():
    h = SE.History(BUCKET)
    for t, r in ((5, 2.0), (30, 4.0), (70, 6.0), (200, 8.0), (230, 1.0)):
        h = SE.record(h, t, r, keep=3)
    # buckets 0 (mean 3) and 1 (6) closed, bucket 3 open (8 and 1: 4.5 when it closes)
    assert (h.last, h.values, h.open_index, h.open_n) == (1, (3.0, 6.0), 3, 2)
    h = SE.record(h, 241 + 60, 1.0, keep=3)  # bucket 2 had no sample
    assert h.values == (6.0, None, 4.5) and h.last == 3
    assert SE.record(h, 10.0, 99.0, keep=3) == h  # the clock went back: nothing changes


def test_status_round_trip_is_coarse_and_capped_in_bytes():
    h = hist([10.0 + i / 7 for i in range(3000)])
    d = SE.to_status(h, 8192)
    assert len(json.dumps(d, separators=(",", ":"))) <= 8192
    back = SE.from_status(json.loads(json.dumps(d)), BUCKET)
    assert back.last == h.last and len(back.values) < 3000 and back.values[-1] == pytest.approx(h.values[-1], 1e-3)
    assert SE.from_status(d, 900.0) == SE.History(900.0)  # another bucket size: start again
    assert SE.from_status({"bucketSeconds": 60, "values": ["x"]}, BUCKET) == SE.History(BUCKET)
