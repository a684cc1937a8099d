"""The periodic tick, our own loop rather than a kopf timer (kopf puts a finalizer on every object that has a
timer or daemon, which would block `kubectl delete` whenever the operator is down).

Every tick each deployment gets a pass: most only observe (status from the watch cache, written only when it
changed); every drift_every-th tick per deployment (staggered) re-applies its children and prunes strays
(drift repair). Autoscaled deployments also get a planner pass. ``start``/``stop`` bring up and down the
scheduler, the planners and this loop.
"""
from __future__ import annotations

import asyncio
import time
import zlib
from functools import partial

from .config import OperatorConfig
from .engine_health import HealthLoop
from .passes import run_pass
from .planners import Planners, autoscaled
from .runtime import Runtime
from .scheduler import Cycle, Scheduler, Work


def periodic_work(uid: str, tick: int, applied_at: float, config: OperatorConfig, cycle: Cycle | None = None,
                  now: float | None = None, draining: bool = False) -> Work:
    """A tick's pass for one deployment: observe, or at its staggered drift slot (every drift_every-th tick)
    re-apply and prune — unless a full pass applied its children (at `applied_at`, monotonic) within the last
    drift_recent_ticks ticks. `draining` (an undesired ComputeDomain waits for its pods): every tick prunes."""
    now = time.monotonic() if now is None else now
    slot = (zlib.crc32(uid.encode()) + tick) % config.drift_every == 0
    recent = now - applied_at < config.drift_recent_ticks * config.timer_interval_seconds
    drift = (slot and not recent) or draining
    return Work(trigger="periodic", full=drift, prune=drift, cycles=(cycle,) if cycle else ())


async def loop(rt: Runtime, scheduler: Scheduler, planners: Planners) -> None:
    tick = 0
    while True:
        await asyncio.sleep(rt.config.timer_interval_seconds)
        tick += 1
        uids = rt.memory.known()
        cycle = Cycle(set(uids))
        for uid in uids:
            mem = rt.memory.of(uid)
            scheduler.request(uid, periodic_work(uid, tick, mem.applied_at, rt.config, cycle,
                                                 draining=mem.domains_draining))
            if autoscaled(rt.memory.body(uid) or {}):
                planners.spawn(uid)


def start(rt: Runtime) -> None:
    rt.scheduler = Scheduler(partial(run_pass, rt), rt.memory, rt.config)
    rt.scheduler.start()
    rt.periodic = asyncio.create_task(loop(rt, rt.scheduler, Planners(rt)))
    rt.health = asyncio.create_task(HealthLoop(rt).run())  # engines' hangs and stragglers (engine_health.py)


def stop(rt: Runtime) -> None:
    if rt.periodic is not None:
        rt.periodic.cancel()
    if rt.health is not None:
        rt.health.cancel()
    if rt.scheduler is not None:
        rt.scheduler.stop()
