"""Every Kubernetes API call the operator makes carries a request timeout (issue 12): a hung connection
must not hold a reconcile, and the per-deployment lock, forever."""
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import MagicMock

from v41flash.controller.kube import REQUEST_TIMEOUT, ChildRef, Kube


def _kube():
    k = object.__new__(Kube)
    k.core, k.custom, k.dynamic = MagicMock(), MagicMock(), MagicMock()
    k.fence = None
    k._pool = ThreadPoolExecutor(2)
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
    k.post_event({"metadata": {"name": "x", "namespace": "ns", "uid": "u"}}, "Normal", "R", "m")
    for call in (k.core.list_namespaced_pod, k.core.patch_namespaced_pod, k.core.create_namespaced_event,
                 k.custom.patch_namespaced_custom_object_status):
        assert call.call_args.kwargs["_request_timeout"] == REQUEST_TIMEOUT, call
