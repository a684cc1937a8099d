"""Our workloads (Deployments, LeaderWorkerSets) as their watch last delivered them, by owner uid: the
periodic pass and a child's status change read status from here, with no API read."""
from __future__ import annotations

import threading
from typing import Any

from ..api import v1alpha1 as api
from .kube import ChildRef


def resource_version(obj: dict[str, Any]) -> int:
    """resourceVersion as a number (etcd's revision, as clients commonly read it); -1 when it is not one."""
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


class ChildCache:
    """Only what status needs is kept of each workload."""

    def __init__(self) -> None:
        self._by_owner: dict[str, dict[ChildRef, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _owner(body: dict[str, Any]) -> str | None:
        for o in body.get("metadata", {}).get("ownerReferences") or []:
            if o.get("kind") == api.KIND and o.get("apiVersion", "").startswith(api.GROUP + "/"):
                return o.get("uid")
        return None

    def update(self, event_type: str | None, body: dict[str, Any]) -> tuple[str | None, bool]:
        """Record an event (or "APPLIED": what our apply returned, kept only if newer); returns (owner uid,
        whether what status reads changed)."""
        owner = self._owner(body)
        if owner is None:
            return None, False
        meta = body["metadata"]
        ref = ChildRef(body["apiVersion"], body["kind"], meta["name"])
        slim = {"apiVersion": body["apiVersion"], "kind": body["kind"],
                "metadata": {"name": meta["name"], "generation": meta.get("generation"),
                             "resourceVersion": meta.get("resourceVersion")},
                "spec": {"replicas": (body.get("spec") or {}).get("replicas")},
                "status": dict(body.get("status") or {})}
        with self._lock:
            children = self._by_owner.setdefault(owner, {})
            old = children.get(ref)
            if event_type == "APPLIED" and old is not None and resource_version(old) >= resource_version(slim):
                return owner, False  # what an apply returned, older than what the watch delivered meanwhile
            if event_type == "DELETED":
                children.pop(ref, None)
                return owner, True
            children[ref] = slim
        strip = lambda o: None if o is None else (o["metadata"]["generation"], o["spec"], o["status"])  # noqa: E731
        return owner, strip(old) != strip(slim)

    def seen(self, workload: dict[str, Any]) -> None:
        """A workload as our apply returned it: known before its watch event, which then asks for no pass."""
        self.update("APPLIED", workload)

    def get(self, body: dict[str, Any]) -> dict[str, Any] | None:
        owner = self._owner(body)
        ref = ChildRef(body["apiVersion"], body["kind"], body["metadata"]["name"])
        with self._lock:
            return (self._by_owner.get(owner) or {}).get(ref) if owner else None

    def of(self, namespace: str, uid: str) -> dict[ChildRef, dict[str, Any]]:
        with self._lock:
            return dict(self._by_owner.get(uid) or {})

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_owner.pop(uid, None)
