"""Generate the CustomResourceDefinition from the pydantic models (the models are the source of truth).

pydantic emits JSON Schema with $refs and anyOf-null for optionals; Kubernetes wants a structural
OpenAPI v3 schema: everything inlined, one type per node, no titles. Nested objects get their fully
expanded defaults so the apiserver applies them at admission (what `kubectl get -o yaml` shows is what runs).
"""
from __future__ import annotations

import copy
from typing import Any

import yaml

from . import formats as F
from . import v1alpha1 as api

_KEEP = {
    "type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "items", "properties", "required",
    "additionalProperties", "minItems", "maxItems", "maxProperties", "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields", "format",
}
_OPTIONAL = "x-v41flash-optional"  # marks Optional fields while converting: absent stays absent
MAX_NAME_LENGTH = 40
MAX_STRING = 4096
MAX_ITEMS = 64  # leaves room for role suffixes and ReplicaSet/pod hashes in child names


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **extra}, defs)
    if "anyOf" in node:  # Optional[X] -> X (absent means unset; the operator never writes null)
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']}")
        merged = {**{k: v for k, v in node.items() if k != "anyOf"}, **branches[0], _OPTIONAL: True}
        if merged.get("default", 0) is None:
            merged.pop("default")
        return _inline(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _inline(value, defs)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    return out


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _materialize(node: dict[str, Any], value: Any) -> Any:
    """`value` with every absent property that has a default filled in, recursively."""
    if not isinstance(value, dict) or "properties" not in node:
        return value
    out = dict(value)
    for name, sub in node["properties"].items():
        if name in out:
            out[name] = _materialize(sub, out[name])
        elif "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
    return out


def _strip_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_strip_defaults(v) for v in node]
    return node


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    optional = node.get(_OPTIONAL, False)
    if BOUNDED_JSON in node:
        return {"description": node["description"], **bounded_json_schema(*node[BOUNDED_JSON]),
                "default": _drop_none(node.get("default", {}))}
    node = {k: v for k, v in node.items() if k in _KEEP}
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if type(node.get(exclusive)) in (int, float):  # JSON Schema's number form; OpenAPI v3.0 (CRDs) wants a bool
            node[bound], node[exclusive] = node[exclusive], True
    if "default" in node:
        node["default"] = _drop_none(node["default"])
    if isinstance(node.get("additionalProperties"), bool):  # structural schemas forbid it beside properties
        node.pop("additionalProperties")
    if "enum" in node and "type" not in node:
        kinds = {type(v) for v in node["enum"]}
        node["type"] = "integer" if kinds == {int} else "string"
    # Bounded sizes keep the apiserver's CEL cost estimate within budget (it assumes the worst case).
    if node.get("type") == "string" and "maxLength" not in node:
        node["maxLength"] = max(map(len, node["enum"])) if "enum" in node else MAX_STRING
    if node.get("type") == "array" and "maxItems" not in node:
        node["maxItems"] = MAX_ITEMS
    if isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
        node["maxProperties"] = MAX_ITEMS
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.pop("additionalProperties", None)
        node.setdefault("type", "object")
    if "properties" in node:
        node["type"] = "object"
        node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
        if "default" in node or (not node.get("required") and not optional):
            # Fully expanded: the apiserver checks a default against the CEL rules as it stands.
            node["default"] = _materialize(node, node.get("default", {}))
    elif node.get("type") in ("array", "object") and "default" not in node and not optional:
        node["default"] = [] if node["type"] == "array" else {}  # lists and maps: empty, as pydantic's
    if isinstance(node.get("items"), dict):
        node["items"] = _structural(node["items"])
        # an item is never absent, so a default for it as a whole means nothing; the apiserver would still
        # check it against the item's CEL rules (a default Toleration is the keyless one they refuse)
        node["items"].pop("default", None)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"])
    return node


BOUNDED_JSON = "x-v41flash-bounded-json"  # marks a free-form JSON field: [max depth, max values per container]


def bounded_json_schema(max_depth: int, max_items: int) -> dict[str, Any]:
    """Free-form JSON at most max_depth levels deep (the object itself is level 1) with at most max_items
    entries in any one object or list, as a structural schema: below the top every node is typeless (any JSON
    value, unknown fields kept), with the next level under both additionalProperties (if it is an object)
    and items (if a list); the last level admits scalars and empty containers only. The apiserver refuses a
    deeper or wider value at admission with the path (`spec.kvTransfer.extraConfig.a.a...: Too many`). CEL
    cannot do it: the apiserver hides x-kubernetes-preserve-unknown-fields data from CEL rules."""
    def level(depth: int) -> dict[str, Any]:
        node: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
        if depth == max_depth:
            return {**node, "maxProperties": 0, "maxItems": 0}
        return {**node, "maxProperties": max_items, "maxItems": max_items,
                "additionalProperties": level(depth + 1), "items": level(depth + 1)}
    return {"type": "object", "maxProperties": max_items, "additionalProperties": level(2)}


def openapi_schema(model: type[api.Model]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_inline(raw, raw.get("$defs", {})))


def _column(name: str, path: str, type_: str = "string", priority: int = 0, desc: str = "") -> dict[str, Any]:
    col = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    if desc:
        col["description"] = desc
    return col


def crd() -> dict[str, Any]:
    spec = openapi_schema(api.V41FlashDeploymentSpec)
    spec["description"] = "Desired state: one disaggregated DeepSeek-V4.1-Flash serving stack."
    status = _strip_defaults(openapi_schema(api.V41FlashDeploymentStatus))  # only the operator writes status
    status["description"] = "Observed state (kstatus: observedGeneration, Ready/Reconciling/Stalled)."
    root = {
        "type": "object",
        "description": "A DeepSeek-V4.1-Flash deployment on vLLM: prefill and decode engines, a KV-aware "
                       "P/D router and an SLO autoscaler. Creating one is as powerful as creating pods in its "
                       "namespace (it chooses images, vLLM arguments and environment that the operator's pods "
                       "run): grant create/update on v41flashdeployments only to whom you would let create pods.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # The apiserver allows restricting metadata.name (and generateName) only; children are named
            # <name>-router, <name>-decode, ...: Service names must be DNS-1035 labels.
            "metadata": {"type": "object", "properties": {"name": {
                "type": "string", "maxLength": MAX_NAME_LENGTH, "pattern": F.DNS1035_LABEL,
                "description": f"At most {MAX_NAME_LENGTH} lowercase letters, digits and '-', starting with a letter "
                               f"(child Services are named <name>-<role>)."}}},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [api.cel(
            f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters (child objects add suffixes)")],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND, "listKind": f"{api.KIND}List", "plural": api.PLURAL,
                "singular": api.SINGULAR, "shortNames": api.SHORT_NAMES, "categories": ["v41flash"],
            },
            "versions": [{
                "name": api.VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": root},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    _column("Profile", ".spec.profile"),
                    _column("GPU", ".spec.gpu.product"),
                    _column("Prefill", ".status.prefill.ready", desc="ready/desired prefill replicas"),
                    _column("Decode", ".status.decode.ready", desc="ready/desired decode replicas"),
                    _column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
                    _column("TTFT", ".status.slo.ttft", desc="observed TTFT at the SLO percentile"),
                    _column("Revision", ".status.servingRevision",
                            desc="serving revision: what every engine pod runs"),
                    _column("Reason", '.status.conditions[?(@.type=="Ready")].reason', priority=1),
                    _column("Age", ".metadata.creationTimestamp", "date"),
                ],
            }],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `v41flash crd` from operator/v41flash/api/v1alpha1.py. Do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
