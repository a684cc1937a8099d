"""Foresight the user gives: recurring windows with a floor per role or a capacity in requests per second.

A window starts at its cron expression's times in its time zone (``v41flash.cron``) and runs for its duration in
seconds of elapsed time. While a window runs, and from one measured cold start (+ one decision interval) before
it starts, the planner keeps each role at least at the window's floor: capacity ordered then is Ready when the
window opens. At its end the floor is gone; the replicas it added go by the ordinary scale-down rules.

Overlapping windows combine by maximum per role (KEDA's cron triggers and HPA metrics combine the same way): a
role's floor is the largest floor of the windows in force, its capacity target the largest rate. What cannot be
combined is refused at admission (api/v1alpha1.py: a window as long as the gap between its own starts, a floor
above the role's maxReplicas, a name used twice; render/checks.py: floors above the GPU budget).

Pure: times are seconds of the planner's clock (Unix time in the operator; ``PlannerConfig.epoch_s`` + the
simulator's time in the benchmark).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from v41flash.cron import last_start, next_start, zone
from v41flash.roles import ROLES, Role


@dataclass(frozen=True)
class Window:
    """One recurring window of spec.autoscaling.schedules."""

    name: str
    cron: str
    duration_s: float
    time_zone: str = "UTC"
    min_replicas: tuple[tuple[Role, int], ...] = ()  # (role, floor) for the roles it names
    requests_per_second: float | None = None  # capacity for this request rate while the window runs

    def floor_of(self, role: Role) -> int:
        return dict(self.min_replicas).get(role, 0)

    @classmethod
    def from_spec(cls, w) -> Window:
        """From a spec.autoscaling.schedules item (api.ScheduleWindow, read by attribute: the planner imports no
        API); the controller and the benchmark both use it."""
        floors = w.min_replicas
        return cls(name=w.name, cron=w.cron, duration_s=float(w.duration_seconds), time_zone=w.time_zone,
                   min_replicas=tuple((r, int(getattr(floors, r))) for r in ROLES
                                      if floors is not None and getattr(floors, r) is not None),
                   requests_per_second=w.requests_per_second)


@dataclass(frozen=True)
class Floor:
    """What the windows in force ask of one role now."""

    replicas: int = 0  # no fewer replicas than this (0: no window names the role)
    rate: float | None = None  # size for at least this request rate (None: no capacity target in force)
    why: str = ""  # the windows, for the decision's reason


def _clock(t: float, tz) -> str:
    return datetime.fromtimestamp(t, tz).strftime("%a %H:%M")


def role_floor(windows: tuple[Window, ...], role: Role, now: float, cold_start_s: float, interval_s: float,
               current: int) -> Floor:
    """The role's floor at ``now``: the largest of the windows running or starting within one cold start and one
    decision interval (``cold_start_s``: the role's measured cold start; ``current``: its replicas now, starting
    ones included).

    A window already running that replicas ordered now would reach only after its end (joined late: a restart, or
    a window shorter than the cold start) keeps the replicas it has up to its floor and orders none."""
    lead = cold_start_s + interval_s
    replicas, rate, why = 0, None, []
    for w in windows:
        floor, wrate = w.floor_of(role), w.requests_per_second
        if not floor and wrate is None:
            continue
        start = last_start(w.cron, w.time_zone, now)
        tz = zone(w.time_zone)
        if start is not None and now < start + w.duration_s:
            end = start + w.duration_s
            if now + cold_start_s >= end and floor > current:
                floor = current  # too late to order any: what is there stays, nothing more
                note = f"running until {_clock(end, tz)} {w.time_zone}, too late to add replicas"
            else:
                note = f"running until {_clock(end, tz)} {w.time_zone}"
        else:
            start = next_start(w.cron, w.time_zone, now)
            if start is None or start - now > lead:
                continue
            note = (f"starts {_clock(start, tz)} {w.time_zone}, in {start - now:.0f}s: ordered one cold start "
                    f"({cold_start_s:.0f}s) ahead")
        parts = []
        if floor:
            replicas = max(replicas, floor)
            parts.append(f"{floor} {role}")
        if wrate is not None:
            rate = wrate if rate is None else max(rate, wrate)
            parts.append(f"{wrate:g} req/s")
        why.append(f"schedule {w.name!r} ({' + '.join(parts)}, {note})")
    return Floor(replicas, rate, "; ".join(why))


def windows_in_force(windows: tuple[Window, ...], now: float) -> tuple[str, ...]:
    """Names of the windows running at ``now`` (status and tests)."""
    out = []
    for w in windows:
        s = last_start(w.cron, w.time_zone, now)
        if s is not None and now < s + w.duration_s:
            out.append(w.name)
    return tuple(out)
