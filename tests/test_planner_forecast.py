"""Step 3, forecast (planner/forecast.py): one role's demand over its cold-start horizon."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_kit import CFG, OK, T, demand
from planner_sim import ISL, OSL, OSL95
from v41flash.planner.datatypes import RoleState
from v41flash.planner.demand import Demand
from v41flash.planner.forecast import forecast


def test_the_first_forecast_is_the_observed_rate_plus_the_backlog_to_drain():
    fc = forecast(OK, demand(10.0, backlog=30.0), True, 600.0, RoleState(), T, CFG)
    assert fc.demand_rate == pytest.approx(10.0 + 30.0 / CFG.forecast.backlog_drain_s)
    assert (fc.state.rate_level, fc.state.rate_trend, fc.state.rate_time, fc.state.last_waiting) == (10.0, 0.0, T, 30.0)


def test_a_rising_rate_is_forecast_ahead_but_capped():
    rs = RoleState(rate_level=8.0, rate_trend=0.05, rate_time=T - 30)
    fc = forecast(OK, demand(12.0), True, 600.0, rs, T, CFG)
    level = fc.state.rate_level
    assert 8.0 < level < 12.0 and fc.state.rate_trend > 0.05
    assert level < fc.demand_rate <= level * CFG.forecast.max_forecast_growth


def test_a_breach_sizes_for_the_raw_rate_when_the_smoothed_one_lags():
    rs = RoleState(rate_level=4.0, rate_time=T - 30)
    calm = forecast(OK, demand(12.0), True, 600.0, rs, T, CFG)
    hurt = forecast(replace(OK, breached=True), demand(12.0), True, 600.0, rs, T, CFG)
    assert calm.demand_rate < 12.0 and hurt.demand_rate == 12.0 and hurt.state == calm.state


def test_decode_forecasts_its_own_rate_and_backlog():
    d = Demand(10.0, 7.0, ISL, 0.5, OSL, OSL95, 100.0, 14.0)
    fc = forecast(replace(OK, role="decode"), d, False, 600.0, RoleState(), T, CFG)
    assert fc.demand_rate == pytest.approx(7.0 + 14.0 / CFG.forecast.backlog_drain_s)


def test_unusable_data_forecasts_nothing_and_forgets_the_queue():
    rs = RoleState(rate_level=8.0, rate_trend=0.01, rate_time=T - 30, last_waiting=5.0)
    fc = forecast(replace(OK, data="stale"), demand(12.0), True, 600.0, rs, T, CFG)
    assert fc.demand_rate is None and fc.state == replace(rs, last_waiting=None)
