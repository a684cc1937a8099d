"""What the rollout reads of a pod (or a workload) given as an API dict: its labels and whether it is Ready.
One home for rollout/slots.py (what each slot runs) and rollout/progress.py (which pods a step scrapes)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def labels_of(o: Mapping[str, Any]) -> Mapping[str, str]:
    return (o.get("metadata") or {}).get("labels") or {}


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
