"""No adoption, no half-apply (issue 12), against the in-memory apiserver (tests/fake_kube.py): an object
of a child's name that is not this deployment's Stalls the reconcile before anything is applied, and is
never overwritten or given our ownerReference; a spec the apiserver would refuse in a child never reaches
apply."""
from __future__ import annotations

import copy

from fake_kube import FakeKube
from process_memory import reconcile


def cr(name="app", spec=None):
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": name},
            "spec": spec or {}}


def run(kube, name="app"):
    return reconcile(kube, kube.cr(name), lambda *a: None, now="2026-12-01T10:00:00Z")


def users_config_map(owner=None):
    meta = {"name": "app-config", "labels": {"team": "web"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"key": "the user's"}}


def stalled(kube, name="app"):
    return next(c for c in kube.cr(name)["status"]["conditions"] if c["type"] == "Stalled")


def test_a_users_object_with_a_childs_name_stalls_and_is_untouched():
    kube = FakeKube()
    kube.add_cr(cr())
    kube.put(users_config_map())
    before = copy.deepcopy(kube.get("ConfigMap", "app-config"))
    out = run(kube)
    assert out.stall is not None and out.stall.reason == "NameCollision"
    assert "ConfigMap/app-config (no owner)" in out.stall.message
    assert [w for w in kube.writes if w[0] != "status"] == []  # nothing applied: not even the other children
    assert kube.get("ConfigMap", "app-config") == before
    c = stalled(kube)
    assert c["status"] == "True" and c["reason"] == "NameCollision"


def test_an_object_owned_by_something_else_names_its_owner():
    kube = FakeKube()
    kube.add_cr(cr())
    kube.put(users_config_map({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "other-uid"}))
    out = run(kube)
    assert "ConfigMap/app-config (owned by Deployment/web)" in out.stall.message
    assert [w for w in kube.writes if w[0] != "status"] == []


def test_own_children_are_not_collisions_even_unlabelled():
    kube = FakeKube()
    kube.add_cr(cr())
    out = run(kube)
    assert out.stall is None and "ConfigMap/app-config" in out.applied
    # our own object with its labels stripped (so not listed as a child) is still ours by its ownerReference
    kube.get("ConfigMap", "app-config")["metadata"]["labels"] = {}
    out = run(kube)
    assert out.stall is None
    # the steady state costs no lookups: every child is listed already
    kube.calls.clear()
    out = run(kube)
    assert out.stall is None and not [c for c in kube.calls if c[0] == "read"]


def test_a_spec_refused_in_a_child_never_reaches_apply():
    for i, spec in enumerate(({"gpu": {"nodeSelector": {"bad key!": "x"}}},
                              {"decode": {"extraEnv": [{"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": "abc"}]}})):
        kube = FakeKube()
        kube.add_cr(cr(f"app{i}", spec))
        out = run(kube, f"app{i}")
        assert out.stall is not None and out.stall.reason == "InvalidSpec", spec
        assert [w for w in kube.writes if w[0] != "status"] == []
    kube = FakeKube()
    kube.add_cr(cr("1st-deploy"))
    out = run(kube, "1st-deploy")
    assert out.stall.reason == "InvalidSpec" and "metadata.name" in out.stall.message
    assert [w for w in kube.writes if w[0] != "status"] == []
