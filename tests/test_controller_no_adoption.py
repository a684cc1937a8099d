"""No adoption, no half-apply (issue 12): an object of a child's name that is not this deployment's
Stalls the reconcile before anything is applied, and is never overwritten or given our ownerReference;
a spec the apiserver would refuse in a child never reaches apply."""
from __future__ import annotations

import copy

from v41flash.controller.kube import ChildRef
from v41flash.controller.reconcile import reconcile

UID = "uid-1"


class FakeKube:
    """Holds objects by (kind, name); records every write."""

    def __init__(self, objects=()):
        self.objects = {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
        self.applied: list[str] = []
        self.deleted: list[str] = []
        self.status = None

    def list_children(self, namespace, instance, owner_uid):
        return [copy.deepcopy(o) for o in self.objects.values()
                if any(r.get("uid") == owner_uid for r in o["metadata"].get("ownerReferences") or [])]

    def has_kind(self, api_version, kind):
        return True

    def get(self, api_version, kind, name, namespace):
        o = self.objects.get((kind, name))
        return copy.deepcopy(o) if o else None

    def apply(self, obj, namespace):
        self.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
        out = copy.deepcopy(obj)
        out["metadata"]["resourceVersion"] = str(len(self.applied))
        self.objects[(obj["kind"], obj["metadata"]["name"])] = out
        return out

    def delete(self, ref: ChildRef, namespace):
        self.deleted.append(f"{ref.kind}/{ref.name}")
        self.objects.pop((ref.kind, ref.name), None)

    def patch_status(self, namespace, name, status, resource_version):
        self.status = status


def body(name="app", spec=None):
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
            "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": 1, "resourceVersion": "1"},
            "spec": spec or {}}


def stalled(kube):
    return next(c for c in kube.status["conditions"] if c["type"] == "Stalled")


def users_config_map(owner=None):
    meta = {"name": "app-config", "namespace": "ns", "labels": {"team": "web"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"key": "the user's"}}


def test_a_users_object_with_a_childs_name_stalls_and_is_untouched():
    kube = FakeKube([users_config_map()])
    out = reconcile(kube, body(), lambda *a: None, now="t")
    assert out.stall is not None and out.stall.reason == "NameCollision"
    assert "ConfigMap/app-config (no owner)" in out.stall.message
    assert kube.applied == [] and kube.deleted == []  # nothing applied: not even the other children
    assert kube.objects[("ConfigMap", "app-config")] == users_config_map()
    cond = stalled(kube)
    assert cond["status"] == "True" and cond["reason"] == "NameCollision"


def test_an_object_owned_by_something_else_names_its_owner():
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "other-uid"}
    kube = FakeKube([users_config_map(other)])
    out = reconcile(kube, body(), lambda *a: None, now="t")
    assert "ConfigMap/app-config (owned by Deployment/web)" in out.stall.message
    assert kube.applied == []


def test_own_children_are_applied_and_a_fresh_deployment_applies_everything():
    kube = FakeKube()
    out = reconcile(kube, body(), lambda *a: None, now="t")
    assert out.stall is None and "ConfigMap/app-config" in kube.applied
    n = len(kube.applied)
    # our own object, even with its labels stripped (so not listed), is not a collision
    kube.objects[("ConfigMap", "app-config")]["metadata"]["labels"] = {}
    out = reconcile(kube, body(), lambda *a: None, now="t")
    assert out.stall is None and len(kube.applied) == 2 * n


def test_a_spec_refused_in_a_child_never_reaches_apply():
    for spec in ({"gpu": {"nodeSelector": {"bad key!": "x"}}},
                 {"decode": {"extraEnv": [{"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": "abc"}]}}):
        kube = FakeKube()
        out = reconcile(kube, body(spec=spec), lambda *a: None, now="t")
        assert out.stall is not None and out.stall.reason == "InvalidSpec", spec
        assert kube.applied == []
    kube = FakeKube()
    out = reconcile(kube, body(name="1st-deploy"), lambda *a: None, now="t")
    assert out.stall.reason == "InvalidSpec" and "metadata.name" in out.stall.message and kube.applied == []
