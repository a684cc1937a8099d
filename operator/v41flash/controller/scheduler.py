"""The one scheduler every trigger asks for a pass: passes on a bounded pool, at most one at a time per
deployment, each with a deadline (one stuck deployment never delays another), urgent ones first and on workers
of their own, failures retried with exponential backoff and one log line per step.

Requests for a deployment whose pass is queued or running coalesce into one ``Work``.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..rollout import progress
from .autoscale import PlannerOutcome
from .config import OperatorConfig
from .kube import NotLeader
from .memory import Memory
from .metrics import BACKOFFS, PASS_OVERRUNS, PASS_WAIT, PASSES_RUNNING, PERIODIC_CYCLE, QUEUE_DEPTH

log = logging.getLogger(__name__)

URGENT = ("create", "update", "resume")  # passes that go before periodic, watch-driven and planner ones


@dataclass
class Work:
    trigger: str = "periodic"
    full: bool = False  # apply the children (else observe)
    prune: bool = False  # list and prune whatever the desired set
    planner: PlannerOutcome | None = None
    requested: float = 0.0
    cycles: tuple = ()  # the periodic ticks waiting for this pass

    def merge(self, other: Work) -> Work:
        return Work(trigger=self.trigger if self.trigger != "periodic" else other.trigger,
                    full=self.full or other.full, prune=self.prune or other.prune,
                    planner=other.planner or self.planner, requested=min(self.requested, other.requested),
                    cycles=self.cycles + other.cycles)

    def done(self, uid: str) -> None:
        for cycle in self.cycles:
            cycle.done(uid)


class CapacityRefused(Exception):
    """The cluster has no room for a child (Service range full, quota): retried with backoff."""


class Cycle:
    """One periodic tick: how long until every deployment it asked for had its pass."""

    def __init__(self, uids: set[str]):
        self.started = time.monotonic()
        self.left = set(uids)
        if not self.left:
            PERIODIC_CYCLE.observe(0.0)

    def done(self, uid: str) -> None:
        if uid in self.left:
            self.left.discard(uid)
            if not self.left:
                PERIODIC_CYCLE.observe(time.monotonic() - self.started)


RunPass = Callable[[str, Work], Any]  # (uid, work) -> the pass's Outcome, or None: the deployment is gone


class Scheduler:
    def __init__(self, run_pass: RunPass, memory: Memory, config: OperatorConfig = OperatorConfig()):
        """config.pass_workers passes at once, config.urgent_workers of them for urgent passes only."""
        self.run_pass, self.memory = run_pass, memory
        self.workers, self.reserved, self.deadline = config.pass_workers, config.urgent_workers, \
            config.pass_deadline_seconds
        self.backoff_seconds, self.rollout_pass_seconds = config.backoff_seconds, config.rollout_pass_seconds
        self.pool = ThreadPoolExecutor(self.workers * 2, thread_name_prefix="pass")  # room beside stuck passes
        # (priority, sequence, uid): a spec change or a new CR goes before the periodic and watch-driven
        # refreshes, so one more CR among hundreds does not wait for a whole tick's worth of them
        self.queue: asyncio.PriorityQueue[tuple[int, int, str]] = asyncio.PriorityQueue()
        # urgent entries are also put here, for the reserved workers; whichever worker takes an entry first
        # runs it, the other copy is then stale and skipped like any other
        self.urgent_queue: asyncio.Queue[tuple[int, int, str]] = asyncio.Queue()
        self.seq = 0
        self.pending: dict[str, Work] = {}
        self.queued: dict[str, int] = {}  # uid -> the best priority it is queued at
        self.running: set[str] = set()
        self.failures: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.tasks: list[asyncio.Task] = []
        self.follow_ups: set[str] = set()  # uids with a rollout pass scheduled (rollout_pass_seconds)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker(self.queue)) for _ in range(self.workers - self.reserved)]
        self.tasks += [asyncio.create_task(self._worker(self.urgent_queue)) for _ in range(self.reserved)]

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def request(self, uid: str, work: Work) -> None:
        work.requested = work.requested or time.monotonic()
        if work.trigger == "periodic" and time.monotonic() < self.not_before.get(uid, 0.0):
            work.done(uid)  # backing off: its pass comes at the backoff's time
            return
        self.pending[uid] = self.pending[uid].merge(work) if uid in self.pending else work
        self._enqueue(uid)

    def _enqueue(self, uid: str) -> None:
        if uid in self.running:
            return  # queued again when the running pass finishes
        prio = 0 if self.pending[uid].trigger in URGENT else 1
        if self.queued.get(uid, 2) <= prio:
            return
        self.queued[uid] = prio
        self.seq += 1
        self.queue.put_nowait((prio, self.seq, uid))
        if prio == 0 and self.reserved:
            self.urgent_queue.put_nowait((prio, self.seq, uid))
        QUEUE_DEPTH.set(len(self.queued))

    def forget(self, uid: str) -> None:
        work = self.pending.pop(uid, None)
        if work is not None:
            work.done(uid)
        self.queued.pop(uid, None)
        self.failures.pop(uid, None)
        self.not_before.pop(uid, None)

    async def _worker(self, queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, uid = await queue.get()
            if uid in self.running or uid not in self.pending:
                continue  # a stale entry (it was queued again at a better priority, or taken from the other queue)
            if queue is self.urgent_queue and self.pending[uid].trigger not in URGENT:
                continue  # taken already; what is pending now is background work, queued as such
            self.queued.pop(uid, None)
            QUEUE_DEPTH.set(len(self.queued))
            work = self.pending.pop(uid)
            PASS_WAIT.labels("urgent" if work.trigger in URGENT else "background").observe(
                max(0.0, time.monotonic() - work.requested))
            self.running.add(uid)
            PASSES_RUNNING.set(len(self.running))
            fut = loop.run_in_executor(self.pool, self.run_pass, uid, work)
            done, _ = await asyncio.wait({fut}, timeout=self.deadline)
            if not done:
                PASS_OVERRUNS.labels("reconcile").inc()
                log.warning("pass of %s still running after %.0f s; other deployments go on", self._name(uid),
                            self.deadline)
            fut.add_done_callback(lambda f, uid=uid, work=work: self._finished(uid, work, f))

    def _name(self, uid: str) -> str:
        meta = (self.memory.body(uid) or {}).get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def _finished(self, uid: str, work: Work, fut: asyncio.Future) -> None:
        self.running.discard(uid)
        PASSES_RUNNING.set(len(self.running))
        work.done(uid)
        exc = None if fut.cancelled() else fut.exception()
        if exc is None:
            outcome = fut.result()
            if outcome is not None and progress.active(outcome.status) and uid not in self.follow_ups:
                # a rollout acts on its own clock (steps, deadlines, drains): its next pass comes soon
                self.follow_ups.add(uid)
                asyncio.get_running_loop().call_later(self.rollout_pass_seconds, self._follow_up, uid)
            if self.failures.pop(uid, None):
                log.info("%s: pass succeeded again", self._name(uid))
            self.not_before.pop(uid, None)
        elif isinstance(exc, NotLeader):
            return  # leadership ended: the process restarts as a candidate
        elif self.memory.body(uid) is not None:
            self._backoff(uid, work, exc)
        if uid in self.pending:
            self._enqueue(uid)

    def _follow_up(self, uid: str) -> None:
        self.follow_ups.discard(uid)
        if self.memory.body(uid) is not None:
            self.request(uid, Work(trigger="rollout", full=True))

    def _backoff(self, uid: str, work: Work, exc: BaseException) -> None:
        n = self.failures.get(uid, 0)
        self.failures[uid] = n + 1
        steps = self.backoff_seconds
        delay = steps[min(n, len(steps) - 1)] * random.uniform(0.9, 1.1)
        self.not_before[uid] = time.monotonic() + delay
        cause = "capacity" if isinstance(exc, CapacityRefused) else "error"
        BACKOFFS.labels(cause).inc()
        what = str(exc) if isinstance(exc, CapacityRefused) else \
            f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
        # one line per backoff step; the traceback only the first time (a bug, not a busy cluster)
        log.warning("%s: pass failed (%s); retry %d in %.0f s", self._name(uid), what, n + 1, delay,
                    exc_info=exc if n == 0 and cause == "error" else None)
        retry = Work(trigger="retry", full=True, prune=work.prune, planner=work.planner)
        asyncio.get_running_loop().call_later(delay, self.request, uid, retry)
