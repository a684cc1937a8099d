"""Kube and the tests' one FakeKube both implement controller.kube.KubeAPI, names and signatures alike: a method
that changes on one side and not the other fails here, not in a test that happens to call it."""
from __future__ import annotations

import inspect

import pytest

from fake_kube import TEST_SIDE, FakeKube
from v41flash.controller.kube import Kube, KubeAPI


def protocol_methods(proto: type) -> list[str]:
    return sorted(n for n, v in vars(proto).items() if callable(v) and not n.startswith("_"))


def public_methods(cls: type) -> set[str]:
    return {n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_")}


@pytest.mark.parametrize("impl", [Kube, FakeKube])
@pytest.mark.parametrize("method", protocol_methods(KubeAPI))
def test_implements_the_protocol_method_with_its_signature(impl, method):
    assert inspect.signature(getattr(impl, method)) == inspect.signature(getattr(KubeAPI, method))


@pytest.mark.parametrize("impl", [Kube, FakeKube])
def test_has_the_protocol_attributes(impl):
    attributes = sorted(getattr(KubeAPI, "__annotations__", {}))
    assert attributes == ["core"]
    assert [a for a in attributes if a not in vars(Kube(api_client=None) if impl is Kube else FakeKube())] == []


def test_the_protocol_is_what_the_controller_calls():
    assert protocol_methods(KubeAPI) == [
        "apply_many", "create", "delete", "delete_pod", "has_kind", "list_children", "list_controller_revisions",
        "list_pods", "node_ready", "patch_pod_annotations", "patch_status", "post_event_soon", "read", "read_cr",
        "read_many", "urgent"]


def test_every_other_method_of_the_fake_is_kube_s_with_its_signature_or_the_test_s_side():
    extra = public_methods(FakeKube) - set(protocol_methods(KubeAPI))
    assert sorted(extra - set(TEST_SIDE)) == ["apply"]  # Kube.apply: what apply_many applies each object with
    assert inspect.signature(FakeKube.apply) == inspect.signature(Kube.apply)
    assert not public_methods(FakeKube) & set(TEST_SIDE) & public_methods(Kube)
