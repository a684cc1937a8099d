"""reconcile() as one operator process runs it: with that process's memory between passes
(controller/memory.py). conftest.py's `memory` fixture makes a new process for each test."""
from __future__ import annotations

from v41flash.controller import reconcile as rec
from v41flash.controller.memory import Memory

MEMORY = Memory()


def new_process() -> Memory:
    global MEMORY
    MEMORY = Memory()
    return MEMORY


def reconcile(kube, body, emit, **kw) -> rec.Outcome:
    """One pass, remembering what this test's process remembers."""
    return rec.reconcile(kube, body, emit, memory=MEMORY, **kw)
