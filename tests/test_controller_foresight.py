"""The foresight's edge: spec.autoscaling → the planner's schedules and forecast, and the season in status."""
from __future__ import annotations

import json

from v41flash.api import v1alpha1 as api
from v41flash.controller.autoscale import durable_state, planner_config
from v41flash.planner import seasonal
from v41flash.planner.datatypes import PlannerConfig, PlannerState
from v41flash.planner.schedule import Window


def test_spec_autoscaling_sets_the_schedules_and_the_forecast_quantile():
    a = api.AutoscalingSpec.model_validate({"schedules": [
        {"name": "bh", "cron": "0 9 * * 1-5", "durationSeconds": 32400, "timeZone": "Europe/Berlin",
         "minReplicas": {"decode": 6}},
        {"name": "batch", "cron": "0 2 * * *", "durationSeconds": 3600, "requestsPerSecond": 40}],
        "forecast": {"quantile": 0.95}})
    cfg = planner_config(a)
    assert cfg.foresight.schedules == (Window("bh", "0 9 * * 1-5", 32400.0, "Europe/Berlin", (("decode", 6),)),
                             Window("batch", "0 2 * * *", 3600.0, "UTC", (), 40.0))
    assert cfg.foresight.forecast_quantile == 0.95
    assert planner_config(api.AutoscalingSpec()) == PlannerConfig.for_spec(30, 600)  # the defaults: as before


def test_the_season_survives_a_restart_through_status_within_its_byte_cap():
    rates = [10.0 + (i % 96) / 7 for i in range(3 * 672)]  # three weeks of 15-min buckets
    state = PlannerState(season=seasonal.seeded(900.0, 1_700_000_000.0, rates))
    status = json.loads(json.dumps(durable_state(state)))
    assert len(json.dumps(status["season"], separators=(",", ":"))) <= PlannerConfig.foresight.season_status_bytes
    back = PlannerState.from_dict(status)
    assert back.season.last == state.season.last and back.season.bucket_s == 900.0
    assert len(back.season.values) == len(state.season.values)  # 2,016 buckets at 3 digits fit the cap
    assert back.season.values[-1] == float(f"{rates[-1]:.3g}")
    assert len(json.dumps(durable_state(state, season_bytes=4096)["season"], separators=(",", ":"))) <= 4096
