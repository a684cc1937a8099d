"""The one fake of controller/kube.py's Kube: an in-memory apiserver implementing controller.kube.KubeAPI, what
reconcile, the autoscaler and the pass scheduler use of Kube (tests/test_fake_kube.py holds both to its names and
signatures).

It keeps what a real one keeps and refuses what a real one refuses: server-side apply stores the object
and bumps resourceVersion (and generation, on a spec change) only when something changed; children are
listed by the instance and managed-by labels AND the owner's uid; the CR's status is replaced under an
optimistic lock on resourceVersion; a kind the cluster does not serve cannot be applied. Every call is
recorded in ``calls``, and every write that changed something in ``writes``.

What a test sets up: CRs (add_cr, update_spec), objects someone else made (put), the pods the workloads run
(``pods``, or settle()), node health (``nodes``), discovery that lags the apiserver (``discovered``), and faults:
``fail`` raises once per (method, what), ``refuse`` on every apply or create of a kind.
"""
from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from v41flash.api import v1alpha1 as api
from v41flash.controller.kube import CHILD_KINDS, CONTROLLER_REVISION, ChildRef, KindNotInstalled
from v41flash.render.gateway import WATCHED_KINDS
from v41flash.render import labels as L
from v41flash.render.engine import LWS_API_VERSION
from v41flash.render.resolve import DEPLOYMENT, LEADER_WORKER_SET

LWS = (LWS_API_VERSION, LEADER_WORKER_SET)
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp")
# What FakeKube has beyond KubeAPI: the test's side of the apiserver (tests/test_fake_kube.py keeps this list).
TEST_SIDE = ("add_cr", "cr", "update_spec", "put", "get", "names", "children", "settle")


def api_error(status: int, reason: str, message: str = "") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "message": message}) if message else None
    return exc


class _CoreV1:
    """The part of kubernetes' CoreV1Api the controller calls through Kube.core: reading a ConfigMap."""

    def __init__(self, kube: FakeKube):
        self._kube = kube

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> client.V1ConfigMap:
        self._kube.calls.append(("read_namespaced_config_map", name))
        obj = self._kube.objects.get(("v1", "ConfigMap", namespace, name))
        if obj is None:
            raise api_error(404, "Not Found", f'configmaps "{name}" not found')
        return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                  data=copy.deepcopy(obj.get("data")))


class FakeKube:
    def __init__(self, kinds: Iterable[tuple[str, str]] = (*CHILD_KINDS, *WATCHED_KINDS), *,
                 discovered: Iterable[tuple[str, str]] | None = None, pods: Iterable[Any] = (),
                 refuse: dict[str, Exception] | None = None):
        self.kinds = set(kinds) | {CONTROLLER_REVISION}  # what this cluster serves
        # what discovery says is served (has_kind); None: what is. A CRD removed meanwhile is still discovered.
        self.discovered = None if discovered is None else set(discovered) | {CONTROLLER_REVISION}
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (apiVersion, kind, ns, name)
        self.crs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[Any] = list(pods)  # what the workloads run: V1Pods (or alike), each with its namespace
        self.nodes: dict[str, bool] = {}  # node name -> Ready; a node not here cannot be told
        self.calls: list[tuple[str, Any]] = []  # (method, what) for every call the controller made
        self.writes: list[tuple[str, str]] = []  # (verb, Kind/name) for every call that changed state
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message) of every Event posted
        self.annotated: list[tuple[str, dict[str, str | None]]] = []  # (pod, annotations) patched
        self.fail: dict[tuple[str, str], Exception] = {}  # (method, Kind/name, CR or pod name) → raised once
        self.refuse: dict[str, Exception] = dict(refuse or {})  # kind → raised by every apply or create of it
        self.core = _CoreV1(self)
        self.fence: Any = None  # Kube's: handlers set it; nothing here reads it
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)

    # ---------------------------------------------------------------- the test's side (not the controller's)
    def add_cr(self, doc: dict[str, Any], namespace: str = "ns") -> dict[str, Any]:
        """A CR as the apiserver stores it; a uid, generation or resourceVersion the doc has already is kept."""
        body = copy.deepcopy(doc)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.setdefault("uid", f"cr-uid-{next(self._uid)}")
        meta.setdefault("generation", 1)
        meta.setdefault("resourceVersion", str(next(self._rv)))
        self.crs[(namespace, meta["name"])] = body
        return self.cr(meta["name"], namespace)

    def cr(self, name: str, namespace: str = "ns") -> dict[str, Any]:
        """A fresh read of the CR (the test's side; the controller's is read_cr)."""
        return copy.deepcopy(self.crs[(namespace, name)])

    def update_spec(self, name: str, spec: dict[str, Any], namespace: str = "ns") -> dict[str, Any]:
        body = self.crs[(namespace, name)]
        body["spec"] = copy.deepcopy(spec)
        body["metadata"]["generation"] += 1
        body["metadata"]["resourceVersion"] = str(next(self._rv))
        return self.cr(name, namespace)

    def put(self, obj: dict[str, Any], namespace: str = "ns") -> None:
        """An object someone else created (another controller, a user)."""
        obj = copy.deepcopy(obj)
        obj["metadata"].update(namespace=namespace, resourceVersion=str(next(self._rv)), generation=1,
                               uid=f"uid-{next(self._uid)}")
        self.objects[(obj["apiVersion"], obj["kind"], namespace, obj["metadata"]["name"])] = obj

    def get(self, kind: str, name: str, namespace: str = "ns") -> dict[str, Any] | None:
        return next((o for (_, k, ns, n), o in self.objects.items() if (k, ns, n) == (kind, namespace, name)), None)

    def names(self, namespace: str = "ns") -> set[str]:
        return {f"{k}/{n}" for (_, k, ns, n) in self.objects if ns == namespace}

    def children(self, namespace: str = "ns") -> dict[ChildRef, dict[str, Any]]:
        """The objects of the kinds a deployment's children are (what pruning can see), by reference."""
        return {ChildRef(av, k, n): o for (av, k, ns, n), o in self.objects.items()
                if ns == namespace and (av, k) in CHILD_KINDS}

    def settle(self, namespace: str = "ns", ready: bool = True) -> None:
        """The workload controllers catch up: every Deployment/LWS reports its replicas (Ready or not), and
        its pods (the serving ones: Deployment pods, LWS leaders) are exactly its replicas of its template."""
        for (_, kind, ns, name), obj in self.objects.items():
            if ns != namespace or kind not in (DEPLOYMENT, LEADER_WORKER_SET):
                continue
            n = obj["spec"].get("replicas", self._autoscaled(ns, name))
            template = (obj["spec"]["template"] if kind == DEPLOYMENT
                        else obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
            self.pods = [p for p in self.pods if not (p.metadata.namespace == ns
                                                      and p.metadata.name.startswith(f"{name}-pod-"))]
            for i in range(n):
                meta = client.V1ObjectMeta(name=f"{name}-pod-{i}", namespace=ns,
                                           labels=dict(template["metadata"]["labels"]))
                self.pods.append(client.V1Pod(metadata=meta, status=client.V1PodStatus(
                    conditions=[client.V1PodCondition(type="Ready", status="True" if ready else "False")])))
            obj["status"] = {"replicas": n, "updatedReplicas": n, "readyReplicas": n if ready else 0,
                             "observedGeneration": obj["metadata"]["generation"]}
            obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def _autoscaled(self, namespace: str, name: str) -> int:
        """A Deployment without spec.replicas: its HorizontalPodAutoscaler's minReplicas (the autoscaler raises it
        to that at once), else the apiserver's default 1."""
        return next((o["spec"]["minReplicas"] for (_, kind, ns, _), o in self.objects.items()
                     if kind == "HorizontalPodAutoscaler" and ns == namespace
                     and o["spec"]["scaleTargetRef"]["name"] == name), 1)

    def _failure(self, method: str, what: str) -> None:
        exc = self.fail.pop((method, what), None)
        if exc is not None:
            raise exc

    def _refused(self, obj: dict[str, Any]) -> None:
        exc = self.refuse.get(obj["kind"])
        if exc is not None:
            raise exc

    # ---------------------------------------------------------------- KubeAPI: what the controller calls
    @contextmanager
    def urgent(self, on: bool = True) -> Iterator[None]:
        self.calls.append(("urgent", on))
        yield

    def has_kind(self, api_version: str, kind: str) -> bool:
        self.calls.append(("has_kind", kind))
        return (api_version, kind) in (self.kinds if self.discovered is None else self.discovered)

    def list_children(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]:
        self.calls.append(("list_children", instance))
        selector = L.owned_selector(instance).items()
        found = []
        for (api_version, kind, ns, _), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            owners = obj["metadata"].get("ownerReferences") or []
            if (ns == namespace and (api_version, kind) in self.kinds and (api_version, kind) in CHILD_KINDS
                    and selector <= labels.items() and any(o.get("uid") == owner_uid for o in owners)):
                found.append(copy.deepcopy(obj))
        return found

    def list_controller_revisions(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]:
        self.calls.append(("list_controller_revisions", instance))
        selector = L.owned_selector(instance).items()
        return [copy.deepcopy(o) for (av, kind, ns, _), o in self.objects.items()
                if (av, kind) == CONTROLLER_REVISION and ns == namespace
                and selector <= (o["metadata"].get("labels") or {}).items()
                and any(r.get("uid") == owner_uid for r in o["metadata"].get("ownerReferences") or [])]

    def create(self, obj: dict[str, Any], namespace: str) -> dict[str, Any] | None:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        self.calls.append(("create", what))
        self._failure("create", what)
        self._refused(obj)
        key = (obj["apiVersion"], obj["kind"], namespace, obj["metadata"]["name"])
        if key in self.objects:
            return None
        mine = copy.deepcopy(obj)
        mine["metadata"].update(namespace=namespace, uid=f"uid-{next(self._uid)}", resourceVersion=str(next(self._rv)))
        self.objects[key] = mine
        self.writes.append(("create", what))
        return copy.deepcopy(mine)

    def list_pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        self.calls.append(("list_pods", selector))
        want = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [copy.deepcopy(p) for p in self.pods
                if p.metadata.namespace == namespace and want.items() <= (p.metadata.labels or {}).items()]

    def node_ready(self, name: str) -> bool | None:
        self.calls.append(("node_ready", name))
        return self.nodes.get(name)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self.calls.append(("patch_pod_annotations", name))
        self._failure("patch_pod_annotations", name)
        self.annotated.append((name, annotations))
        self.writes.append(("annotate", f"Pod/{name}"))

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        self.calls.append(("delete_pod", name, grace_seconds))
        self._failure("delete_pod", name)
        self.pods = [p for p in self.pods if not (p.metadata.namespace == namespace and p.metadata.name == name
                                                  and p.metadata.uid == uid)]
        self.writes.append(("delete", f"Pod/{name}"))

    def apply(self, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        self.calls.append(("apply", what))
        if (obj["apiVersion"], obj["kind"]) not in self.kinds:
            raise KindNotInstalled(f"{obj['kind']}.{obj['apiVersion']} is not served by this cluster")
        self._failure("apply", what)
        self._refused(obj)
        key = (obj["apiVersion"], obj["kind"], namespace, obj["metadata"]["name"])
        mine = copy.deepcopy(obj)
        mine["metadata"]["namespace"] = namespace
        old = self.objects.get(key)
        if old is None:
            mine["metadata"].update(uid=f"uid-{next(self._uid)}", resourceVersion=str(next(self._rv)), generation=1,
                                    creationTimestamp="2026-12-01T00:00:00Z")
            self.objects[key] = mine
            self.writes.append(("create", what))
            return copy.deepcopy(mine)
        server = {k: old["metadata"][k] for k in SERVER_FIELDS if k in old["metadata"]}
        before = {k: v for k, v in old.items() if k != "status"}
        before["metadata"] = {k: v for k, v in old["metadata"].items() if k not in SERVER_FIELDS}
        if before == mine:  # server-side apply of what is already there: no write, no new resourceVersion
            return copy.deepcopy(old)
        mine["metadata"].update(server, resourceVersion=str(next(self._rv)))
        if mine.get("spec") != old.get("spec"):
            mine["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if "status" in old:
            mine["status"] = old["status"]
        self.objects[key] = mine
        self.writes.append(("update", what))
        return copy.deepcopy(mine)

    def apply_many(self, objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any] | BaseException]:
        """Kube.apply_many: each object's result or the exception it raised (in order; the real one is concurrent)."""
        out: list[dict[str, Any] | BaseException] = []
        for obj in objs:
            try:
                out.append(self.apply(obj, namespace))
            except Exception as exc:
                out.append(exc)
        return out

    def read(self, ref: ChildRef, namespace: str, cached: bool = False) -> dict[str, Any] | None:
        """Kube.read: one object by name, None when absent or its kind is not served."""
        self.calls.append(("read", f"{ref.kind}/{ref.name}"))
        if (ref.api_version, ref.kind) not in self.kinds:
            return None
        return copy.deepcopy(self.objects.get((ref.api_version, ref.kind, namespace, ref.name)))

    def read_many(self, refs: list[ChildRef], namespace: str, cached: bool = False
                  ) -> list[dict[str, Any] | None | BaseException]:
        """Kube.read_many: read() of each (in order; the real one is concurrent)."""
        out: list[dict[str, Any] | None | BaseException] = []
        for ref in refs:
            try:
                out.append(self.read(ref, namespace))
            except Exception as exc:
                out.append(exc)
        return out

    def delete(self, ref: ChildRef, namespace: str) -> None:
        what = f"{ref.kind}/{ref.name}"
        self.calls.append(("delete", what))
        if self.objects.pop((ref.api_version, ref.kind, namespace, ref.name), None) is not None:
            self.writes.append(("delete", what))

    def read_cr(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read_cr", name))
        body = self.crs.get((namespace, name))
        return None if body is None else copy.deepcopy(body)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str
                     ) -> dict[str, Any]:
        self.calls.append(("patch_status", name))
        self._failure("patch_status", name)
        body = self.crs[(namespace, name)]
        if body["metadata"]["resourceVersion"] != resource_version:  # the JSON-patch `test` op fails
            raise api_error(409, "Conflict", "the object has been modified")
        body["status"] = copy.deepcopy(status)
        body["metadata"]["resourceVersion"] = str(next(self._rv))
        self.writes.append(("status", f"{api.KIND}/{name}"))
        return copy.deepcopy(body)

    def post_event_soon(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.calls.append(("post_event_soon", reason))
        self.events.append((type_, reason, message))
