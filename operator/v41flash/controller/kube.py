"""The operator's I/O with the apiserver: server-side apply, listing and deleting children, status patches.

Everything else in the controller is pure and takes what this module reads.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes import client
from kubernetes import config as kubeconfig_loader
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, ResourceNotFoundError

from ..api import v1alpha1 as api
from ..render import compute_domain, dra
from ..render import labels as L
from ..render.engine import LWS_API_VERSION
from ..render.gateway import HTTPROUTE_API_VERSION, INFERENCE_POOL_API_VERSION
from ..render.resolve import DEPLOYMENT, LEADER_WORKER_SET
from .config import OperatorConfig
from .metrics import API_REQUESTS

FIELD_MANAGER = "v41flash-operator"
log = logging.getLogger(__name__)

# Every kind the renderer can produce: what pruning lists (a role turned off must lose its objects).
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", DEPLOYMENT),
    ("apps/v1", "DaemonSet"),  # spec.startup.weightCache.prefetch (render/prefetch.py)
    (LWS_API_VERSION, LEADER_WORKER_SET),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("policy/v1", "PodDisruptionBudget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),  # the front's (render/router.py)
    ("v1", "ConfigMap"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    (INFERENCE_POOL_API_VERSION, "InferencePool"),  # spec.routing.mode: Gateway (render/gateway.py)
    (HTTPROUTE_API_VERSION, "HTTPRoute"),
    (compute_domain.API_VERSION, compute_domain.KIND),  # multi-node NVLink replicas (render/compute_domain.py)
    (dra.RESOURCE_API_VERSION, "ResourceClaimTemplate"),  # spec.gpu.allocation: DRA (render/dra.py)
)


# The record of each revision's spec (rollouts): create-only, listed and deleted on its own (not a child kind).
CONTROLLER_REVISION = ("apps/v1", "ControllerRevision")


class NotLeader(Exception):
    """This replica's leadership term may have ended: it writes nothing until it leads again."""


class KindNotInstalled(Exception):
    """The cluster lacks a kind the deployment needs (e.g. the LeaderWorkerSet CRD)."""


@dataclass(frozen=True)
class ChildRef:
    api_version: str
    kind: str
    name: str

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ChildRef:
        return cls(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


class TimeoutApiClient(client.ApiClient):
    """An ApiClient whose every request carries a deadline (connect, read seconds) unless the caller passes its
    own: a hung connection fails the pass, which is retried, instead of holding a worker forever. Watches are
    kopf's and have their own timeouts (kopf_setup.harden)."""

    def __init__(self, configuration: client.Configuration | None = None,
                 request_timeout: tuple[float, ...] = OperatorConfig().request_timeout_seconds):
        super().__init__(configuration)
        self.request_timeout = request_timeout

    def call_api(self, method: str, *args: Any, _request_timeout: Any = None, **kwargs: Any):  # type: ignore[override]
        API_REQUESTS.labels(method).inc()
        return super().call_api(method, *args, _request_timeout=_request_timeout or self.request_timeout, **kwargs)


def load_config(kubeconfig: str | None = None, config: OperatorConfig = OperatorConfig()) -> client.ApiClient:
    """A client for the given kubeconfig, else in-cluster, else ~/.kube/config (or $KUBECONFIG).

    The configuration is our own object, never the library's process-wide default, and the path is
    passed explicitly: the library reads $KUBECONFIG once at import, so setting it later does nothing.
    """
    cfg = client.Configuration()
    if kubeconfig:
        kubeconfig_loader.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            kubeconfig_loader.load_incluster_config(client_configuration=cfg)
        except kubeconfig_loader.ConfigException:
            kubeconfig_loader.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = config.connection_pool  # both call pools and the passes' status writes
    return TimeoutApiClient(cfg, config.request_timeout_seconds)


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None, config: OperatorConfig = OperatorConfig()):
        self.request_timeout = config.request_timeout_seconds  # (connect, read) seconds of every call
        self.api_client = api_client or TimeoutApiClient(request_timeout=self.request_timeout)
        # Concurrent reads and applies, in two pools. Urgent passes (a new CR, a spec change) have their own, so
        # their calls never queue behind background ones waiting in the shared pool. The background pool is the
        # smaller: its calls in flight are what an urgent call waits behind at the apiserver (on the 2-core test
        # machine at 500 deployments, 32 background calls in flight made every call of a new CR take 0.3-1 s)
        self._shared_pool = ThreadPoolExecutor(config.apply_workers, thread_name_prefix="apply")
        self._urgent_pool = ThreadPoolExecutor(config.urgent_apply_workers, thread_name_prefix="apply-urgent")
        self._lane = threading.local()
        self.fence: Any = None  # () -> bool: may we write? (leader election); None = always
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        # Discovery: the library's default cache is one file in /tmp shared by every process of this user, so a
        # restarted operator read another process's (or its own former) view of which kinds exist, and a reset
        # from one thread while another read it failed with KeyError. One file per process, one lock for it.
        self._discovery_lock = threading.RLock()
        self._discovery_dir = tempfile.mkdtemp(prefix="v41flash-discovery-")
        atexit.register(shutil.rmtree, self._discovery_dir, True)

    @contextmanager
    def urgent(self, on: bool = True) -> Iterator[None]:
        """Within this block (in this thread) concurrent reads and applies go to the urgent pool."""
        before = getattr(self._lane, "urgent", False)
        self._lane.urgent = on
        try:
            yield
        finally:
            self._lane.urgent = before

    @property
    def _pool(self) -> ThreadPoolExecutor:
        return self._urgent_pool if getattr(self._lane, "urgent", False) else self._shared_pool

    @cached_property
    def dynamic(self) -> DynamicClient:
        # discovery is a request, so not at construction
        return DynamicClient(self.api_client, cache_file=os.path.join(self._discovery_dir, "discovery.json"))

    def _may_write(self) -> None:
        if self.fence is not None and not self.fence():
            raise NotLeader("not the leader (or the Lease could not be renewed in time): not writing")

    def _resource(self, api_version: str, kind: str, *, rediscover: bool = False):
        """The kind's API resource; KindNotInstalled when the cluster does not serve it. A kind not in the
        discovery cache is looked up again (a CRD installed after start-up); ``rediscover``: the cache is
        dropped first (a kind it lists answered 404: its CRD was removed)."""
        with self._discovery_lock:
            if rediscover:
                self.dynamic.resources.invalidate_cache()
            try:
                return self.dynamic.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                self.dynamic.resources.invalidate_cache()
                try:
                    return self.dynamic.resources.get(api_version=api_version, kind=kind)
                except ResourceNotFoundError as exc:
                    raise KindNotInstalled(f"{kind}.{api_version} is not served by this cluster") from exc

    def has_kind(self, api_version: str, kind: str) -> bool:
        try:
            self._resource(api_version, kind)
            return True
        except KindNotInstalled:
            return False

    def apply(self, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Server-side apply under our field manager; force: the operator fully owns its children's fields."""
        res = self._resource(obj["apiVersion"], obj["kind"])
        self._may_write()
        try:
            out = res.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=namespace,
                                        field_manager=FIELD_MANAGER, force_conflicts=True,
                                        _request_timeout=self.request_timeout)
        except NotFoundError:
            # an apply creates what is missing, so a 404 is the namespace gone or the kind no longer served (its
            # CRD removed since discovery): KindNotInstalled in the latter case
            self._resource(obj["apiVersion"], obj["kind"], rediscover=True)
            raise
        return out.to_dict()

    def _each(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """fn over items on the pool (in order); each result is fn's value or the exception it raised, so the
        caller decides per item (stall, retry)."""
        def one(item: Any) -> Any:
            try:
                return fn(item)
            except Exception as exc:
                return exc
        if len(items) <= 1:
            return [one(i) for i in items]
        return list(self._pool.map(one, items))

    def apply_many(self, objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any] | BaseException]:
        """Apply objects concurrently; each result is the applied object or the exception it raised."""
        return self._each(lambda obj: self.apply(obj, namespace), objs)

    def list_children(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]:
        """Our children of one deployment: labelled by us AND owned by this very CR (uid); kinds listed concurrently."""
        selector = L.label_selector(L.owned_selector(instance))

        def of_kind(kind_ref: tuple[str, str]) -> list[dict[str, Any]]:
            api_version, kind = kind_ref
            try:
                res = self._resource(api_version, kind)
            except KindNotInstalled:
                return []
            out = []
            try:
                items = res.get(namespace=namespace, label_selector=selector, _request_timeout=self.request_timeout)
            except NotFoundError:  # listed by discovery, gone since (its CRD removed): nothing of it to prune
                try:
                    self._resource(api_version, kind, rediscover=True)
                except KindNotInstalled:
                    return []
                raise
            for item in items.to_dict().get("items", []):
                owners = item["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == owner_uid for o in owners):
                    item.setdefault("apiVersion", api_version)
                    item.setdefault("kind", kind)
                    out.append(item)
            return out
        return [item for items in self._pool.map(of_kind, CHILD_KINDS) for item in items]

    def list_controller_revisions(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]:
        """The ControllerRevisions recording one deployment's revisions (labelled by us AND owned by its uid).
        Not among CHILD_KINDS: they are never rendered, so pruning must not see them."""
        api_version, kind = CONTROLLER_REVISION
        items = self._resource(api_version, kind).get(
            namespace=namespace, label_selector=L.label_selector(L.owned_selector(instance)),
            _request_timeout=self.request_timeout).to_dict().get("items", [])
        out = []
        for item in items:
            if any(o.get("uid") == owner_uid for o in item["metadata"].get("ownerReferences") or []):
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                out.append(item)
        return out

    def create(self, obj: dict[str, Any], namespace: str) -> dict[str, Any] | None:
        """Create an object that is never changed afterwards (a ControllerRevision); None: it exists already."""
        res = self._resource(obj["apiVersion"], obj["kind"])
        self._may_write()
        try:
            return res.create(body=obj, namespace=namespace, field_manager=FIELD_MANAGER,
                              _request_timeout=self.request_timeout).to_dict()
        except ConflictError:
            return None

    def read(self, ref: ChildRef, namespace: str, cached: bool = False) -> dict[str, Any] | None:
        """One object by name, None when absent or its kind is not served. cached: from the apiserver's watch
        cache (resourceVersion=0: no etcd read, possibly a moment old) — for checks that tolerate that."""
        try:
            out = self._resource(ref.api_version, ref.kind).get(
                name=ref.name, namespace=namespace, resource_version="0" if cached else None,
                _request_timeout=self.request_timeout).to_dict()
        except (NotFoundError, KindNotInstalled):
            return None
        out.setdefault("apiVersion", ref.api_version)
        out.setdefault("kind", ref.kind)
        return out

    def read_many(self, refs: list[ChildRef], namespace: str, cached: bool = False
                  ) -> list[dict[str, Any] | None | BaseException]:
        """read() of each ref concurrently; each result is the object, None (absent) or the exception raised."""
        return self._each(lambda ref: self.read(ref, namespace, cached), refs)

    def delete(self, ref: ChildRef, namespace: str) -> None:
        self._may_write()
        try:
            self._resource(ref.api_version, ref.kind).delete(
                name=ref.name, namespace=namespace, body={"propagationPolicy": "Background"},
                _request_timeout=self.request_timeout)
        except NotFoundError:
            pass

    def list_pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(namespace, label_selector=selector,
                                             _request_timeout=self.request_timeout).items

    def node_ready(self, name: str) -> bool | None:
        """Whether a node's Ready condition is True; None when it cannot be told (absent, not allowed to read).
        Read from the apiserver's watch cache (resourceVersion=0): no etcd read."""
        try:
            node = self._resource("v1", "Node").get(name=name, resource_version="0",
                                                     _request_timeout=self.request_timeout).to_dict()
        except (NotFoundError, KindNotInstalled):
            return None
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        return None if ready is None else ready.get("status") == "True"

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self._may_write()
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                       field_manager=FIELD_MANAGER, _request_timeout=self.request_timeout)

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None:
        """Delete one pod (its workload replaces it), the uid a precondition: never a new pod of the same name.
        grace_seconds None: the pod's own grace period (its preStop drain runs)."""
        self._may_write()
        body = client.V1DeleteOptions(grace_period_seconds=grace_seconds, preconditions=client.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or another pod by now
                raise

    def read_cr(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A fresh read of one V41FlashDeployment (not the watch's copy); None when it is gone."""
        try:
            return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                            _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str
                     ) -> dict[str, Any]:
        """Replace the status with an optimistic lock: a stale view fails the `test` op (422/409) and the next
        pass retries from a fresh read. Returns the object as written."""
        self._may_write()
        body = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
                {"op": "add", "path": "/status", "value": status}]
        return self.custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name, body,
                                                                 _content_type="application/json-patch+json",
                                                                 field_manager=FIELD_MANAGER,
                                                                 _request_timeout=self.request_timeout)


    def post_event_soon(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """post_event on the pool: the pass does not wait for it (best effort either way)."""
        self._may_write()
        self._shared_pool.submit(self.post_event, obj, type_, reason, message)

    def post_event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about obj (written directly: works from any thread, unlike kopf.event)."""
        meta = obj["metadata"]
        now = datetime.now(timezone.utc)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=obj.get("apiVersion", api.API_VERSION), kind=obj.get("kind", api.KIND),
                name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                resource_version=meta.get("resourceVersion")),
            type=type_, reason=reason, message=message[:1024], first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=FIELD_MANAGER), reporting_component=FIELD_MANAGER,
            reporting_instance=FIELD_MANAGER)
        try:
            self._may_write()
            self.core.create_namespaced_event(meta["namespace"], event, field_manager=FIELD_MANAGER,
                                              _request_timeout=self.request_timeout)
        except NotLeader:
            return
        except ApiException as exc:  # an Event is best effort: never fail a reconcile over it
            if namespace_terminating(exc):  # the namespace goes, and its Events with it
                return
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc.reason)


def namespace_terminating(exc: ApiException) -> bool:
    if exc.status != 403:
        return False
    try:
        causes = (json.loads(exc.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return False
    return any(c.get("reason") == "NamespaceTerminating" for c in causes)


def is_conflict(exc: Exception) -> bool:
    """A write lost to a concurrent one (stale resourceVersion): retry from a fresh read, not an error."""
    return isinstance(exc, ApiException) and exc.status in (409, 422)


# --- KubeAPI: the apiserver as the controller uses it -----------------------------------------------------------

class KubeAPI(Protocol):
    """What reconcile, the autoscaler and a pass (controller/passes.py) call on Kube; the controller's functions
    that take a kube are annotated with it. tests/fake_kube.py's FakeKube implements
    it too, and tests/test_fake_kube.py holds Kube and FakeKube to these names and signatures."""

    core: Any  # kubernetes' CoreV1Api: the autoscaler reads a capacity-profile ConfigMap through it

    @contextmanager
    def urgent(self, on: bool = True) -> Iterator[None]: ...

    def has_kind(self, api_version: str, kind: str) -> bool: ...

    def apply_many(self, objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any] | BaseException]: ...

    def list_children(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]: ...

    def list_controller_revisions(self, namespace: str, instance: str, owner_uid: str) -> list[dict[str, Any]]: ...

    def create(self, obj: dict[str, Any], namespace: str) -> dict[str, Any] | None: ...

    def read(self, ref: ChildRef, namespace: str, cached: bool = False) -> dict[str, Any] | None: ...

    def read_many(self, refs: list[ChildRef], namespace: str, cached: bool = False
                  ) -> list[dict[str, Any] | None | BaseException]: ...

    def delete(self, ref: ChildRef, namespace: str) -> None: ...

    def list_pods(self, namespace: str, selector: str) -> list[client.V1Pod]: ...

    def node_ready(self, name: str) -> bool | None: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None: ...

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> None: ...

    def read_cr(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str
                     ) -> dict[str, Any]: ...

    def post_event_soon(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None: ...
