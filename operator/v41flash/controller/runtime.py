"""The operator process's long-lived objects, made once at startup (cli/operator.py) and handed to every kopf
handler in kopf's memo: the configuration, the apiserver client (whose fence stops writes when leadership
may have ended), what the process remembers per deployment, and the scheduler and periodic loop once started
(controller/periodic.py)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .autoscale import Autoscaler
from .config import OperatorConfig
from .kube import Kube
from .memory import Memory
from .scheduler import Scheduler, Work


@dataclass
class Runtime:
    kube: Kube  # the concrete client: kopf's login reads its configuration, leader election sets its fence;
    # a pass, the planner and reconcile use it only as controller.kube.KubeAPI (tests hand in FakeKube)
    config: OperatorConfig = OperatorConfig()
    memory: Memory = field(default_factory=Memory)
    scheduler: Scheduler | None = None  # from startup until cleanup
    periodic: asyncio.Task | None = None  # the periodic loop
    health: asyncio.Task | None = None  # the engine health loop (controller/engine_health.py)

    def autoscaler(self) -> Autoscaler:
        """The planner's edge, made with the first planner pass (its series register then); memory keeps it,
        as it holds the planner's per-deployment histories."""
        if self.memory.autoscaler is None:
            self.memory.autoscaler = Autoscaler(self.kube)
        return self.memory.autoscaler

    def request(self, uid: str, work: Work) -> None:
        """Ask for a pass (before startup, or after cleanup, there is no scheduler to ask)."""
        if self.scheduler is not None:
            self.scheduler.request(uid, work)
