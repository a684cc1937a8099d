"""Home of the cron semantics of spec.autoscaling.schedules: when a window starts, in its time zone.

A window's start is a standard 5-field cron expression (minute hour day-of-month month day-of-week) evaluated in
an IANA time zone by ``cronsim``, with cron's own rules at daylight-saving changes: a start that a spring-forward
skips fires at the first minute after the gap, one that a fall-back repeats fires once (the first). The API
validates with it, the planner plans with it (a leaf: it imports neither). Times are Unix seconds.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

CRON_FIELDS = 5  # minute hour day-of-month month day-of-week: the standard syntax, no seconds, no @macros
# how far back/ahead a window's starts are looked for: a cron fires at least once every 4 years (Feb 29)
SEARCH_DAYS = 4 * 366 + 1
# The zones of the tz database the project pins (tzdata in pyproject.toml): its own list, never the machine's files
# (zoneinfo would also open `localtime`, a directory such as `America`, or a path).
TIME_ZONES: frozenset[str] = frozenset(
    line.strip() for line in resources.files("tzdata").joinpath("zones").read_text().splitlines() if line.strip())
TZDATA_VERSION = "2026.6"  # pyproject.toml's pin (a unit test ties the two)
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")


def time_zone_problem(name: str) -> str | None:
    """Why name is not a zone of the pinned tz database, or None."""
    if name in TIME_ZONES:
        return None
    shown = name[:64] if _ZONE_NAME.fullmatch(name[:64]) else repr(name[:64])
    dirs = sorted({z.split("/")[0] for z in TIME_ZONES if z.startswith(name + "/")})
    hint = f" ({shown} is a region of it: name a city, e.g. {min(z for z in TIME_ZONES if z.startswith(name + '/'))})" \
        if dirs else ""
    return (f"unknown time zone {shown}: an IANA zone of the tz database {TZDATA_VERSION} such as Europe/Berlin or "
            f"UTC{hint}")


def cron_problem(cron: str, time_zone: str = "UTC") -> str | None:
    """Why ``cron`` in ``time_zone`` is not a window start the planner can use, or None."""
    if len(cron.split()) != CRON_FIELDS:
        return (f"{cron!r} is not a 5-field cron expression (minute hour day-of-month month day-of-week; no "
                "seconds field, no @macros)")
    problem = time_zone_problem(time_zone)
    if problem:
        return problem
    tz = zone(time_zone)
    try:
        next(CronSim(cron, datetime(2026, 1, 1, tzinfo=tz)))
    except (CronSimError, StopIteration) as exc:  # cronsim refuses a day that never comes (Feb 30) by name
        return f"{cron!r}: {exc or 'never fires'}"
    return None


@lru_cache(maxsize=64)
def zone(name: str):
    """The pinned tz database's zone (ZoneInfoNotFoundError for any other name: never a file of the machine)."""
    if name in ("UTC", ""):
        return timezone.utc
    if name not in TIME_ZONES:
        raise ZoneInfoNotFoundError(name)
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as f:
        return ZoneInfo.from_file(f, key=name)


def _starts(cron: str, time_zone: str, t: float, reverse: bool):
    tz = zone(time_zone)
    # cronsim yields starts after dt (before it when reversed); whole seconds, so a start at t itself counts
    # as the latest start going back and not as the next one going forward
    at = datetime.fromtimestamp(math.floor(t) + (1 if reverse else 0), tz)
    return CronSim(cron, at, reverse=reverse)


def _first_after(it, t: float, limit: int = 4) -> float | None:
    """The first start the iterator yields after ``t``: cronsim compares wall-clock times, so in the hour a
    fall-back repeats it can yield the hour's first (earlier) start once more; those are skipped."""
    for _ in range(limit):
        s = next(it).timestamp()
        if s > t:
            return s
    return None


def next_start(cron: str, time_zone: str, t: float) -> float | None:
    """The cron's first start after ``t`` (None: none within ``SEARCH_DAYS``)."""
    try:
        s = _first_after(_starts(cron, time_zone, t, reverse=False), t)
    except (CronSimError, StopIteration):
        return None
    return s if s is not None and s - t <= SEARCH_DAYS * 86400 else None


def last_start(cron: str, time_zone: str, t: float) -> float | None:
    """The cron's latest start at or before ``t`` (None: none within ``SEARCH_DAYS``).

    cronsim's reverse walk compares wall-clock times, which in a repeated (fall-back) hour can skip that day's
    start: the candidate it gives is moved forward over every start still at or before ``t``."""
    try:
        it = _starts(cron, time_zone, t, reverse=True)
        s = next(it).timestamp()
        while s > t:
            s = next(it).timestamp()
    except (CronSimError, StopIteration):
        return None
    while True:
        after = next_start(cron, time_zone, s)
        if after is None or after > t:
            break
        s = after
    return s if t - s <= SEARCH_DAYS * 86400 else None


# a fixed start for what does not depend on "now" (the API's check of a window against its own starts)
REFERENCE_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()


@lru_cache(maxsize=256)
def shortest_gap(cron: str, time_zone: str) -> float | None:
    """``shortest_gap_s`` from ``REFERENCE_TIME`` (cached: the API checks every window of every spec it parses)."""
    return shortest_gap_s(cron, time_zone, REFERENCE_TIME)


def shortest_gap_s(cron: str, time_zone: str, t: float, starts: int = 400) -> float | None:
    """The shortest time between two consecutive starts of the window over its next ``starts`` starts after
    ``t`` (a bounded look: enough for every minute/hour/day/month pattern to repeat)."""
    try:
        it = _starts(cron, time_zone, t, reverse=False)
        prev, gap = next(it).timestamp(), math.inf
        for _ in range(starts):
            s = next(it).timestamp()
            gap, prev = min(gap, s - prev), s
            if s - t > SEARCH_DAYS * 86400:
                break
    except (CronSimError, StopIteration):
        return None
    return gap if math.isfinite(gap) else None
