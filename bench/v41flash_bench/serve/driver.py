"""Run one measured point: start scripts open-loop or closed-loop for warm-up + window, then drain.

Requests that *start* inside the window ``[warmup, warmup + duration)`` are measured; the warm-up's are kept
apart (they are the cold figures of a first point). After the window no script starts and no script sends its
next step; what is in flight may finish until the drain deadline, then it is cancelled and counted as such.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from v41flash_bench.serve.client import Outcome, send
from v41flash_bench.serve.workloads import Script


@dataclass(frozen=True)
class Load:
    """closed: ``value`` clients, each running scripts back to back; open: scripts start at ``value`` per second
    (Poisson, seeded), or for a replay at the log's own times sped up ``value`` times."""
    kind: str  # "concurrency" | "rate"
    value: float

    def label(self) -> str:
        return f"concurrency {self.value:g}" if self.kind == "concurrency" else f"rate {self.value:g}/s"


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    headers: dict = field(default_factory=dict)
    ignore_eos: bool = False
    timeout_s: float = 600.0


@dataclass
class PointRun:
    outcomes: list[Outcome]
    scripts: list[Script]  # every script started, in start order
    completed: dict[str, float]  # script id -> seconds after start when its last step answered (all steps ok)
    warmup_s: float
    duration_s: float
    wall_s: float


async def run_point(ep: Endpoint, scripts: Iterator[Script], load: Load, *, warmup_s: float, duration_s: float,
                    drain_s: float = 60.0, seed: int = 0, replay: bool = False,
                    progress: Callable[[str], None] | None = None, progress_every_s: float = 10.0) -> PointRun:
    end = warmup_s + duration_s
    outcomes: list[Outcome] = []
    started: list[Script] = []
    completed: dict[str, float] = {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(ep.timeout_s, connect=10.0), limits=limits) as http:
        t0 = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - t0

        async def run_script(s: Script) -> None:
            started.append(s)
            all_ok = True
            for pause, req in s.steps:
                if pause > 0:
                    await asyncio.sleep(pause)
                if now() >= end:
                    return  # cut by the window's end: incomplete, not failed
                o = Outcome(s.id, now())
                outcomes.append(o)
                await send(http, ep.url, ep.model, req, o, t0=t0, ignore_eos=ep.ignore_eos, headers=ep.headers)
                if not o.ok:
                    all_ok = False
                    break  # an agent cannot go on without the answer
            if all_ok:
                completed[s.id] = now()

        tasks: set[asyncio.Task] = set()

        async def closed_worker() -> None:
            while now() < end:
                try:
                    s = next(scripts)
                except StopIteration:
                    return
                await run_script(s)

        async def open_arrivals() -> None:
            rng = random.Random(seed)
            t = 0.0
            for s in scripts:
                t = s.at / load.value if replay else t + rng.expovariate(load.value)
                if t >= end:
                    return
                wait = t - now()
                if wait > 0:
                    await asyncio.sleep(wait)
                task = asyncio.create_task(run_script(s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        async def report() -> None:
            while True:
                await asyncio.sleep(progress_every_s)
                if progress:
                    ok = sum(o.ok for o in outcomes)
                    bad = sum(1 for o in outcomes if o.error)
                    phase = "warm-up" if now() < warmup_s else "window" if now() < end else "drain"
                    progress(f"  {load.label()}: {now():5.0f}s ({phase}) {len(outcomes)} requests sent, {ok} ok, "
                             f"{bad} failed, {len(completed)} scripts done")

        reporter = asyncio.create_task(report())
        if load.kind == "concurrency":
            workers = [asyncio.create_task(closed_worker()) for _ in range(int(load.value))]
            tasks.update(workers)
        else:
            await open_arrivals()
        # wait for the window to end, then drain what is in flight until the deadline
        while now() < end and tasks:
            await asyncio.wait(set(tasks), timeout=max(0.01, end - now()))
        if tasks:
            await asyncio.wait(set(tasks), timeout=max(0.01, end + drain_s - now()))
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        reporter.cancel()
        wall = now()
    for o in outcomes:
        if not o.ok and not o.error:
            o.error = "cancelled"
    return PointRun(outcomes, started, completed, warmup_s, duration_s, wall)
