"""Scheduled windows (planner/schedule.py): cron starts in a time zone, floors ordered a cold start ahead."""
from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from v41flash import cron as C
from v41flash.planner import schedule as S

BERLIN = ZoneInfo("Europe/Berlin")


def at(*args, tz=BERLIN) -> float:
    return datetime(*args, tzinfo=tz).timestamp()


BUSINESS = S.Window("business-hours", "0 9 * * 1-5", 9 * 3600, "Europe/Berlin", (("prefill", 4), ("decode", 6)))


def test_a_window_runs_from_its_cron_start_for_its_duration():
    monday_9 = at(2026, 12, 7, 9, 0)  # a Monday
    assert C.last_start(BUSINESS.cron, BUSINESS.time_zone, monday_9) == monday_9
    assert C.next_start(BUSINESS.cron, BUSINESS.time_zone, monday_9) == at(2026, 12, 8, 9, 0)
    assert S.windows_in_force((BUSINESS,), monday_9 + 3600) == ("business-hours",)
    assert S.windows_in_force((BUSINESS,), at(2026, 12, 7, 18, 0)) == ()  # the end is not in the window
    assert S.windows_in_force((BUSINESS,), at(2026, 12, 12, 10, 0)) == ()  # Saturday


def test_capacity_is_ordered_one_cold_start_and_one_interval_ahead_and_released_at_the_end():
    start = at(2026, 12, 7, 9, 0)
    assert S.role_floor((BUSINESS,), "prefill", start - 631, 600, 30, 1).replicas == 0  # not yet
    early = S.role_floor((BUSINESS,), "prefill", start - 629, 600, 30, 1)
    assert early.replicas == 4 and "ordered one cold start (600s) ahead" in early.why
    assert S.role_floor((BUSINESS,), "decode", start + 3600, 600, 30, 6).replicas == 6
    end = start + 9 * 3600
    assert S.role_floor((BUSINESS,), "prefill", end - 1, 600, 30, 4).replicas == 4
    after = S.role_floor((BUSINESS,), "prefill", end, 600, 30, 4)
    assert after == S.Floor()  # never held past its end


def test_a_restart_mid_window_keeps_the_floor():
    # the planner's memory is gone; the window is read off the clock again
    floor = S.role_floor((BUSINESS,), "decode", at(2026, 12, 9, 14, 0), 600, 30, 6)
    assert floor.replicas == 6 and "running until Wed 18:00" in floor.why


def test_joined_too_late_to_add_replicas_keeps_what_is_there_and_orders_nothing():
    short = S.Window("burst", "*/30 * * * *", 300, "UTC", (("prefill", 8),))  # 5 minutes, shorter than a cold start
    start = at(2026, 12, 7, 10, 0, tz=ZoneInfo("UTC"))
    # ordered ahead: one cold start (600 s) + one interval before the start
    assert S.role_floor((short,), "prefill", start - 620, 600, 30, 2).replicas == 8
    # the planner came up in the window: what it orders now would be Ready after the end
    late = S.role_floor((short,), "prefill", start + 60, 600, 30, 3)
    assert late.replicas == 3 and "too late to add replicas" in late.why
    assert S.role_floor((short,), "prefill", start + 60, 600, 30, 9).replicas == 8  # no scale-down below it either


def test_a_window_crossing_midnight_runs_into_the_next_day():
    night = S.Window("nightly-batch", "0 23 * * *", 4 * 3600, "Europe/Berlin", (("decode", 3),))
    assert S.windows_in_force((night,), at(2026, 12, 8, 1, 30)) == ("nightly-batch",)
    assert C.last_start(night.cron, night.time_zone, at(2026, 12, 8, 1, 30)) == at(2026, 12, 7, 23, 0)
    assert S.windows_in_force((night,), at(2026, 12, 8, 3, 0)) == ()


def test_dst_spring_forward_starts_at_the_first_minute_after_the_gap_and_runs_elapsed_seconds():
    w = S.Window("early", "30 2 * * *", 3600, "Europe/Berlin", (("prefill", 2),))
    # 2027-03-28: 02:00 → 03:00 in Berlin; 02:30 does not exist, cron fires at 03:00 (cronie's rule)
    start = C.next_start(w.cron, w.time_zone, at(2027, 3, 28, 0, 0))
    assert datetime.fromtimestamp(start, BERLIN).strftime("%H:%M %Z") == "03:00 CEST"
    assert S.windows_in_force((w,), start + 3599) == ("early",)
    assert S.windows_in_force((w,), start + 3600) == ()


def test_dst_fall_back_fires_once_and_a_duration_is_elapsed_time():
    w = S.Window("late", "30 2 * * *", 3600, "Europe/Berlin", (("prefill", 2),))
    # 2026-10-25: 03:00 CEST → 02:00 CET; 02:30 comes twice, the window starts once, at the first
    day = at(2026, 10, 25, 0, 0)
    first = C.next_start(w.cron, w.time_zone, day)
    assert datetime.fromtimestamp(first, BERLIN).strftime("%H:%M %Z") == "02:30 CEST"
    assert C.next_start(w.cron, w.time_zone, first) - first == 25 * 3600  # the next day's 02:30: a 25-hour day
    # an hour of elapsed time: it ends at 02:30 CET (the repeated hour), not 03:30
    assert S.windows_in_force((w,), first + 3599) == ("late",) and S.windows_in_force((w,), first + 3600) == ()
    # in the repeated hour (02:10 CET) the next start is the next day's, never the hour's first 02:30 again
    assert C.next_start(w.cron, w.time_zone, first + 2400) == first + 25 * 3600
    assert C.last_start(w.cron, w.time_zone, first + 2400) == first


def test_overlapping_windows_combine_by_maximum_per_role():
    a = S.Window("a", "0 8 * * *", 4 * 3600, "UTC", (("prefill", 4), ("decode", 2)))
    b = S.Window("b", "0 10 * * *", 4 * 3600, "UTC", (("prefill", 2), ("decode", 5)), requests_per_second=30.0)
    t = at(2026, 12, 7, 11, 0, tz=ZoneInfo("UTC"))
    p, d = (S.role_floor((a, b), r, t, 600, 30, 1) for r in ("prefill", "decode"))
    assert (p.replicas, d.replicas, p.rate) == (4, 5, 30.0)
    assert "schedule 'a'" in p.why and "schedule 'b'" in p.why
    assert S.role_floor((a, b), "prefill", at(2026, 12, 7, 12, 30, tz=ZoneInfo("UTC")), 600, 30, 1).replicas == 2


def test_a_capacity_window_floors_the_rate_not_the_replicas():
    w = S.Window("launch", "0 12 * * *", 3600, "UTC", requests_per_second=40.0)
    f = S.role_floor((w,), "decode", at(2026, 12, 7, 12, 5, tz=ZoneInfo("UTC")), 600, 30, 1)
    assert f.replicas == 0 and f.rate == 40.0 and "40 req/s" in f.why


@pytest.mark.parametrize(("cron", "tz", "why"), [
    ("0 0 31 2 *", "UTC", "Bad day-of-month"),  # February 31st never comes
    ("0 0 * * * *", "UTC", "not a 5-field cron"),  # a seconds field
    ("@daily", "UTC", "not a 5-field cron"),
    ("0 25 * * *", "UTC", "Bad hour"),
    ("0 9 * * 1-5", "Mars/Olympus", "unknown time zone"),
])
def test_cron_problems_name_what_is_wrong(cron, tz, why):
    assert why in C.cron_problem(cron, tz)


def test_a_rare_cron_is_accepted_and_found():
    w = S.Window("leap", "0 0 29 2 *", 3600, "UTC", (("decode", 2),))
    assert C.cron_problem(w.cron) is None
    assert datetime.fromtimestamp(C.next_start(w.cron, w.time_zone, at(2026, 1, 1, tz=ZoneInfo("UTC"))),
                                  ZoneInfo("UTC")).year == 2028


def test_shortest_gap_between_starts():
    assert C.shortest_gap_s(BUSINESS.cron, BUSINESS.time_zone, at(2026, 12, 7, 0, 0)) == 86400
    assert C.shortest_gap_s("0,10 * * * *", "UTC", at(2026, 12, 7, 0, 0)) == 600


def test_a_window_from_a_spec_item_reads_it_by_attribute():
    from types import SimpleNamespace as NS
    item = NS(name="bh", cron="0 9 * * 1-5", duration_seconds=3600, time_zone="UTC",
              min_replicas=NS(prefill=None, decode=6), requests_per_second=None)
    assert S.Window.from_spec(item) == S.Window("bh", "0 9 * * 1-5", 3600.0, "UTC", (("decode", 6),))
    rate = NS(name="b", cron="0 2 * * *", duration_seconds=60, time_zone="UTC", min_replicas=None,
              requests_per_second=40.0)
    assert S.Window.from_spec(rate).requests_per_second == 40.0 and S.Window.from_spec(rate).min_replicas == ()
