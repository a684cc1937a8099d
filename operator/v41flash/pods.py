"""Home of what the operator reads of a pod (or a workload): its labels and its Ready condition, whether it comes
as an API dict (camelCase, what the rollout reads) or as a kubernetes-client V1Pod (what the controller lists).
A leaf: it imports nothing of the package."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def labels_of(o: Mapping[str, Any]) -> Mapping[str, str]:
    return (o.get("metadata") or {}).get("labels") or {}


def _get(o: Any, key: str) -> Any:
    return o.get(key) if isinstance(o, Mapping) else getattr(o, key, None)


def ready_condition(pod: Any) -> Any | None:
    """The pod's Ready condition when it is True (a dict or a V1PodCondition, as the pod came), else None."""
    for c in _get(_get(pod, "status") or {}, "conditions") or []:
        if _get(c, "type") == "Ready" and _get(c, "status") == "True":
            return c
    return None


def is_ready(pod: Any) -> bool:
    return ready_condition(pod) is not None
