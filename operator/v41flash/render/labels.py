"""Home of the names and labels of every child object, and of the selectors over them.

The renderer, the controller (pruning, scraping, pod-deletion costs) and the router's discovery all take
them from here, so selectors and discovery always agree.
"""
from __future__ import annotations

from typing import Any

from ..api.v1alpha1 import GROUP

APP = "v41flash"
MANAGED_BY = "v41flash-operator"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
DEPLOYMENT_LABEL = f"{GROUP}/deployment"
ROLE_LABEL = f"{GROUP}/role"
# Only pods that answer HTTP carry it: the router discovers engines by it (LWS workers run --headless).
SERVING_LABEL = f"{GROUP}/serving"
# On every engine workload and pod: the serving revision (render/revision.py) the pod runs.
REVISION_LABEL = f"{GROUP}/serving-revision"
# Slots (render/slots.py): on a slot's engine workloads and pods (and in their selectors), and on its router
# ("0" for slot ""); the front (session proxy) pods carry FRONT_LABEL.
SLOT_LABEL = f"{GROUP}/slot"
FRONT_LABEL = f"{GROUP}/front"
ROUTER = "router"
# The component label of a slot's vllm-router pods. The front's pods keep ROUTER's, and the front Service selects
# on it: the pods of a router from before every deployment had a front (proxy and vllm-router in one pod) match
# it too, so they keep serving until the front's own pods are Ready (the upgrade path, render/slots.py).
SLOT_ROUTER_COMPONENT = "slot-router"
# On a pod template whose process reads a mounted ConfigMap only when it starts (the endpoint picker): a hash of
# that content, so a change rolls the pods instead of waiting for their next restart.
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# On the operator's own pods (chart): what the engines' NetworkPolicy lets scrape /metrics.
SCRAPER_LABEL = f"{GROUP}/scraper"


def child_name(cr_name: str, suffix: str) -> str:
    return f"{cr_name}-{suffix}"


def slot_tag(slot: str) -> str:
    """A slot's label value and name suffix on its router or endpoint picker: "0" for slot "" (render/slots.py)."""
    return slot or "0"


def config_name(cr_name: str) -> str:
    return child_name(cr_name, "config")


def common_labels(cr_name: str, component: str) -> dict[str, str]:
    """Labels on every object (and pod) of one component (prefill, decode, router, config)."""
    labels = {
        NAME_LABEL: APP,
        INSTANCE_LABEL: cr_name,
        COMPONENT_LABEL: component,
        MANAGED_BY_LABEL: MANAGED_BY,
        DEPLOYMENT_LABEL: cr_name,
    }
    if component not in ("config", "network"):
        labels[ROLE_LABEL] = component
    return labels


def selector_labels(cr_name: str, role: str) -> dict[str, str]:
    """The stable selector of a role's pods (never a hash: it must not change between renders)."""
    return {DEPLOYMENT_LABEL: cr_name, ROLE_LABEL: role}


def serving_selector(cr_name: str, role: str) -> dict[str, str]:
    """Pods of a role that serve HTTP: what Services and the router's discovery select."""
    return {**selector_labels(cr_name, role), SERVING_LABEL: "true"}


def serving_pods_selector(cr_name: str) -> dict[str, str]:
    """Every engine pod of one deployment that answers HTTP, of all roles (the router's pods do not carry
    SERVING_LABEL, so none of them match: router_pods_selector lists those)."""
    return {DEPLOYMENT_LABEL: cr_name, SERVING_LABEL: "true"}


def router_pods_selector(cr_name: str) -> dict[str, str]:
    """The router pods of one deployment (vllm-router and the session proxy: the planner scrapes both)."""
    return {DEPLOYMENT_LABEL: cr_name, ROLE_LABEL: ROUTER}


def owned_selector(cr_name: str) -> dict[str, str]:
    """Every object the operator rendered for one deployment (what pruning lists)."""
    return {INSTANCE_LABEL: cr_name, MANAGED_BY_LABEL: MANAGED_BY}


def selector_args(labels: dict[str, str]) -> list[str]:
    """vllm-router's selector format: one key=value token each."""
    return [f"{k}={v}" for k, v in labels.items()]


def label_selector(labels: dict[str, str]) -> str:
    """The Kubernetes API's labelSelector string: key=value,key=value."""
    return ",".join(selector_args(labels))


def metadata(cr_name: str, namespace: str, name: str, component: str,
             owner: dict[str, Any] | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": common_labels(cr_name, component)}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["name"],
        "uid": owner["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
