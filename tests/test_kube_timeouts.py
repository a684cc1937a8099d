"""Every Kubernetes API call the operator makes carries a request timeout (issue 12): a hung connection
must not hold a reconcile, and the per-deployment lock, forever."""
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import MagicMock

from v41flash.controller.config import OperatorConfig
from v41flash.controller.kube import ChildRef, Kube

REQUEST_TIMEOUT = OperatorConfig().request_timeout_seconds


def _kube():
    k = object.__new__(Kube)
    k.core, k.custom, k.dynamic = MagicMock(), MagicMock(), MagicMock()
    k.fence = None
    k.request_timeout = REQUEST_TIMEOUT
    k._shared_pool = k._urgent_pool = ThreadPoolExecutor(2)
    k._lane = threading.local()
    k._discovery_lock = threading.RLock()
    return k


def test_every_call_has_a_request_timeout():
    k = _kube()
    res = k.dynamic.resources.get.return_value
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, "ns")
    k.read(ChildRef("v1", "ConfigMap", "x"), "ns")
    k.list_children("ns", "x", "uid")
    k.delete(ChildRef("v1", "ConfigMap", "x"), "ns")
    for call in (res.server_side_apply, res.get, res.delete):
        assert call.call_args_list and all(c.kwargs["_request_timeout"] == REQUEST_TIMEOUT
                                           for c in call.call_args_list), call
    k.list_pods("ns", "a=b")
    k.patch_pod_annotations("ns", "p", {"a": "b"})
    k.patch_status("ns", "x", {}, "1")
    k.read_cr("ns", "x")
    k.post_event({"metadata": {"name": "x", "namespace": "ns", "uid": "u"}}, "Normal", "R", "m")
    for call in (k.core.list_namespaced_pod, k.core.patch_namespaced_pod, k.core.create_namespaced_event,
                 k.custom.patch_namespaced_custom_object_status, k.custom.get_namespaced_custom_object):
        assert call.call_args.kwargs["_request_timeout"] == REQUEST_TIMEOUT, call


def test_an_event_in_a_namespace_being_deleted_is_dropped_quietly(caplog):
    import json

    from kubernetes.client.exceptions import ApiException
    k = _kube()
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({"details": {"causes": [{"reason": "NamespaceTerminating"}]}})
    k.core.create_namespaced_event.side_effect = exc
    obj = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
           "metadata": {"name": "x", "namespace": "ns", "uid": "u"}}
    k.post_event(obj, "Normal", "Applied", "created")
    assert "could not post event" not in caplog.text
    k.core.create_namespaced_event.side_effect = ApiException(status=403, reason="Forbidden")  # RBAC: said
    k.post_event(obj, "Normal", "Applied", "created")
    assert "could not post event Applied" in caplog.text


def test_node_readiness_is_read_from_the_watch_cache_with_a_timeout():
    k = _kube()
    res = k.dynamic.resources.get.return_value
    res.get.return_value.to_dict.return_value = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert k.node_ready("n1") is False
    assert res.get.call_args.kwargs == {"name": "n1", "resource_version": "0", "_request_timeout": REQUEST_TIMEOUT}
    res.get.return_value.to_dict.return_value = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert k.node_ready("n1") is True
    res.get.return_value.to_dict.return_value = {"status": {}}
    assert k.node_ready("n1") is None


def _not_found():
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic.exceptions import NotFoundError
    return NotFoundError(ApiException(status=404, reason="Not Found"))


def test_a_404_on_apply_of_a_kind_no_longer_served_is_kind_not_installed():
    """Discovery still lists a kind whose CRD was removed: the apply's 404 drops the cache, and a kind the fresh
    discovery lacks is KindNotInstalled (a Stall with its condition), not an error retried forever."""
    import pytest
    from kubernetes.dynamic.exceptions import ResourceNotFoundError
    from v41flash.controller.kube import KindNotInstalled
    k = _kube()
    res = MagicMock()
    res.server_side_apply.side_effect = _not_found()
    resources = k.dynamic.resources
    resources.get.side_effect = [res, ResourceNotFoundError("gone"), ResourceNotFoundError("gone")]
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"}}
    with pytest.raises(KindNotInstalled, match="InferencePool"):
        k.apply(pool, "ns")
    assert resources.invalidate_cache.called
    # still served (the namespace was what was missing): the 404 itself
    resources.get.side_effect = None
    resources.get.return_value = res
    with pytest.raises(type(_not_found())):
        k.apply(pool, "ns")


def test_a_404_on_listing_a_kind_no_longer_served_lists_nothing_of_it():
    from kubernetes.dynamic.exceptions import ResourceNotFoundError
    k = _kube()
    resources = k.dynamic.resources
    stale_pool = MagicMock()
    stale_pool.get.side_effect = _not_found()  # listed by discovery, its CRD removed since
    empty = MagicMock()
    empty.get.return_value.to_dict.return_value = {"items": []}

    def discover(api_version, kind):
        if kind != "InferencePool":
            return empty
        if resources.invalidate_cache.called:
            raise ResourceNotFoundError("gone")
        return stale_pool
    resources.get.side_effect = discover
    assert k.list_children("ns", "demo", "uid") == []
