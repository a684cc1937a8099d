"""The planner off the reconcile path: per autoscaled deployment, scrape and plan in a bounded pool with a
deadline, one at a time per deployment; a decision becomes a pass (new replicas applied, a hold observed)."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from .autoscale import PlannerOutcome
from .metrics import PASS_OVERRUNS, PLANNER_ERRORS
from .runtime import Runtime
from .scheduler import Work

log = logging.getLogger(__name__)


def plan(rt: Runtime, body: dict[str, Any]) -> PlannerOutcome | None:
    """The planner's pass; any failure leaves replicas as they are (and says so), never breaks reconcile."""
    try:
        spec = api.V41FlashDeploymentSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return None  # reconcile reports the invalid spec as Stalled
    if not spec.autoscaling.enabled:
        return None
    try:
        return rt.autoscaler().step(body, spec)
    except Exception as exc:
        PLANNER_ERRORS.inc()
        # the apiserver away (a restart) is one line; anything else is a bug and keeps its traceback
        away = isinstance(exc, (ApiException, urllib3.exceptions.HTTPError, OSError))
        log.warning("planner pass of %s/%s failed (%s: %s); replicas stay as they are",
                    body["metadata"]["namespace"], body["metadata"]["name"], type(exc).__name__,
                    getattr(exc, "reason", None) or exc, exc_info=None if away else exc)
        return None


def autoscaled(body: dict[str, Any]) -> bool:
    return bool(((body.get("spec") or {}).get("autoscaling") or {}).get("enabled", False))


class Planners:
    def __init__(self, rt: Runtime):
        self.rt = rt
        workers = rt.config.planner_workers
        self.pool = ThreadPoolExecutor(workers * 2, thread_name_prefix="planner")
        self.sem = asyncio.Semaphore(workers)
        self.deadline = rt.config.planner_deadline_seconds
        self.running: set[str] = set()
        self.tasks: set[asyncio.Task] = set()  # held until done (the loop keeps only weak references)

    def spawn(self, uid: str) -> None:
        task = asyncio.create_task(self.run(uid))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self, uid: str) -> None:
        body = self.rt.memory.body(uid)
        if body is None or uid in self.running:
            return
        if self.rt.memory.of(uid).applied_generation != body["metadata"].get("generation", 1):
            # its first pass (or the one for a new spec) has not run yet: there is nothing to scale, and a
            # decision now would compare against a status without replicas and queue one more full pass
            # (after a burst of 500 new CRs, each one's planner did)
            return
        self.running.add(uid)
        async with self.sem:
            fut = asyncio.get_running_loop().run_in_executor(self.pool, plan, self.rt, body)
            fut.add_done_callback(lambda f: self.running.discard(uid))
            done, _ = await asyncio.wait({fut}, timeout=self.deadline)
        if not done:
            PASS_OVERRUNS.labels("planner").inc()
            log.warning("planner pass of %s/%s still running after %.0f s (slow engines' /metrics?)",
                        body["metadata"]["namespace"], body["metadata"]["name"], self.deadline)
            return
        outcome = fut.result()
        if outcome is not None:
            # new replicas are applied; a hold (or the same numbers) only refreshes status
            status = body.get("status") or {}
            moved = any(n != (status.get(role) or {}).get("desiredReplicas") for role, n in outcome.desired.items())
            self.rt.request(uid, Work(trigger="planner", full=moved, planner=outcome))
