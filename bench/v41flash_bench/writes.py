"""Which objects a field manager wrote between two snapshots of a namespace, and what moved in each.

A write is told from the object's own record: its resourceVersion moved and the manager's managedFields entry
(its time or its field set) moved with it, or the object is new and lists the manager. A server-side apply that
changed nothing moves neither, so it is not a write (it is still an API request). Events count when the
manager created them. Used by `v41flash bench operator` (idle writes per minute) and the e2e idle test.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Snapshot = dict[str, dict[str, Any]]  # "Kind/name" -> the object as a plain dict

IGNORED_META = ("resourceVersion", "managedFields", "generation")


@dataclass(frozen=True)
class Write:
    key: str  # Kind/name
    paths: tuple[str, ...]  # what moved (JSON paths, lists by their entries' type/name where they have one)


def snapshot(objects: Iterable[Mapping[str, Any]]) -> Snapshot:
    return {f"{o['kind']}/{o['metadata']['name']}": dict(o) for o in objects}


def _entries(obj: Mapping[str, Any], manager: str) -> list[tuple[Any, ...]]:
    return sorted((e.get("operation"), e.get("subresource") or "", e.get("time") or "",
                   repr(e.get("fieldsV1"))) for e in (obj.get("metadata") or {}).get("managedFields") or []
                  if e.get("manager") == manager)


def _label(item: Any, i: int) -> str:
    if isinstance(item, Mapping):
        for k in ("type", "name"):
            if isinstance(item.get(k), str):
                return item[k]
    return str(i)


def changed_paths(before: Any, after: Any, path: str = "", depth: int = 6) -> list[str]:
    """The JSON paths where two values differ (metadata bookkeeping ignored), down to `depth` levels."""
    if before == after:
        return []
    if depth == 0 or not (isinstance(before, type(after)) and isinstance(before, (Mapping, list))):
        return [path or "."]
    if isinstance(before, list):
        b = {_label(x, i): x for i, x in enumerate(before)}
        a = {_label(x, i): x for i, x in enumerate(after)}
    else:
        b, a = before, after
    out: list[str] = []
    for k in sorted(set(b) | set(a), key=str):
        if path == ".metadata" and k in IGNORED_META:
            continue
        if k not in b or k not in a:
            out.append(f"{path}.{k}")
        else:
            out += changed_paths(b[k], a[k], f"{path}.{k}", depth - 1)
    return out


def _managers(obj: Mapping[str, Any]) -> set[str]:
    return {e.get("manager") for e in (obj.get("metadata") or {}).get("managedFields") or []}


def writes(before: Snapshot, after: Snapshot) -> list[tuple[str, Write]]:
    """(manager, write) for each object written between the snapshots, by each manager whose managedFields
    entry moved (new objects: by every manager they list). Deleted objects are left out."""
    out = []
    for key, obj in sorted(after.items()):
        old = before.get(key)
        if old is not None and obj["metadata"].get("resourceVersion") == old["metadata"].get("resourceVersion"):
            continue
        if old is None:  # a new object; an Event by its reason (what the idle report needs to tell them apart)
            paths = (f"reason={obj['reason']}",) if obj.get("kind") == "Event" and obj.get("reason") else (".",)
        else:
            paths = tuple(changed_paths(old, obj)) or (".metadata.managedFields",)
        for manager in sorted(_managers(obj), key=str):
            if old is None or _entries(obj, manager) != _entries(old, manager):
                out.append((manager, Write(key, paths)))
    return out


def writes_by(manager: str, before: Snapshot, after: Snapshot) -> list[Write]:
    """The objects `manager` wrote between the snapshots (new ones it created included)."""
    return [w for m, w in writes(before, after) if m == manager]


def settle(take: Callable[[], Snapshot], manager: str, quiet_s: float, sample_s: float, timeout: float) -> Snapshot:
    """Snapshots (from `take`) every sample_s until no writer but `manager` changed an object for quiet_s (new
    Events aside: they record news, they are not state); '' for `manager`: until nobody did. Returns the last
    snapshot. Raises after timeout, saying who wrote what last."""
    t0 = time.monotonic()
    snap, quiet_from, last = take(), time.monotonic(), []
    while time.monotonic() - quiet_from < quiet_s:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"no {quiet_s:g} s without {'other ' if manager else ''}writers within {timeout:.0f} s; "
                               f"the last writes: {last[:8]}")
        time.sleep(sample_s)
        nxt = take()
        moved = [(m, w) for m, w in writes(snap, nxt) if m != manager and not w.key.startswith("Event/")]
        if moved:
            quiet_from, last = time.monotonic(), moved
        snap = nxt
    return snap


def summary(writes: Iterable[Write]) -> dict[str, int]:
    """How many writes touched each (kind, path) — the idle report's breakdown."""
    counts: dict[str, int] = {}
    for w in writes:
        kind = w.key.split("/", 1)[0]
        for p in w.paths:
            counts[f"{kind} {p}"] = counts.get(f"{kind} {p}", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def namespace_snapshot(api_client: Any, namespace: str, group: str, version: str, plural: str) -> Snapshot:
    """Every object the operator may write in the namespace: its CRs, their children and Events."""
    from kubernetes import client
    custom = client.CustomObjectsApi(api_client)
    objs = [dict(o, kind=o.get("kind") or "V41FlashDeployment")
            for o in custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]]
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    rbac, policy = client.RbacAuthorizationV1Api(api_client), client.PolicyV1Api(api_client)
    net = client.NetworkingV1Api(api_client)
    for kind, fn in (("Deployment", apps.list_namespaced_deployment),
                     ("ControllerRevision", apps.list_namespaced_controller_revision),
                     ("Service", core.list_namespaced_service),
                     ("ServiceAccount", core.list_namespaced_service_account),
                     ("ConfigMap", core.list_namespaced_config_map),
                     ("Role", rbac.list_namespaced_role), ("RoleBinding", rbac.list_namespaced_role_binding),
                     ("PodDisruptionBudget", policy.list_namespaced_pod_disruption_budget),
                     ("NetworkPolicy", net.list_namespaced_network_policy),
                     ("Event", core.list_namespaced_event)):
        objs += [dict(api_client.sanitize_for_serialization(o), kind=kind) for o in fn(namespace).items]
    return snapshot(objs)
