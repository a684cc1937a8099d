"""spec.kvTransfer.extraConfig is free-form JSON, yet its depth and width are bounded in the CRD itself
(a tree of schemas, one level per level), so the apiserver refuses a hostile one at admission naming the
path; the operator's iterative check (api/formats.check_json_value) is the second line with the same limits.
A small evaluator of the OpenAPI keywords the tree uses stands in for the apiserver here; e2e/test_security.py
runs the real one."""
from __future__ import annotations

import itertools

import pytest

from v41flash.api import formats as F
from v41flash.api.crd import crd


def _extra_config_schema() -> dict:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["kvTransfer"]["properties"]["extraConfig"]


def refusals(schema: dict, value, path: str = "spec.kvTransfer.extraConfig") -> list[str]:
    """Where the apiserver would refuse `value` against the keywords used (maxProperties, maxItems,
    additionalProperties, items; a node without them admits anything)."""
    out = []
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            out.append(path)
        sub = schema.get("additionalProperties")
        if isinstance(sub, dict):
            out += [e for k, v in value.items() for e in refusals(sub, v, f"{path}.{k}")]
    elif isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            out.append(path)
        if isinstance(schema.get("items"), dict):
            out += [e for i, v in enumerate(value) for e in refusals(schema["items"], v, f"{path}[{i}]")]
    return out


def operator_accepts(value) -> bool:
    try:
        F.check_json_value(value, F.EXTRA_CONFIG_MAX_DEPTH)
        return True
    except ValueError:
        return False


def nest(depth: int, kinds: str, leaf: object = "ok") -> object:
    """extraConfig with `leaf` at level `depth` (the extraConfig object itself is level 1), the containers
    between cycling `kinds` (d: object, l: list)."""
    value = leaf
    for _, kind in zip(range(depth - 2), itertools.cycle(kinds)):
        value = {"k": value} if kind == "d" else [value]
    return {"top": value}


@pytest.mark.parametrize("kinds", ["d", "l", "dl", "ld", "ddl"])
@pytest.mark.parametrize("depth", range(2, F.EXTRA_CONFIG_MAX_DEPTH + 4))
def test_admission_and_the_operator_agree_on_depth(depth, kinds):
    value = nest(depth, kinds)
    admitted = not refusals(_extra_config_schema(), value)
    assert admitted == operator_accepts(value) == (depth <= F.EXTRA_CONFIG_MAX_DEPTH), (depth, kinds)


def test_a_refusal_names_the_path_and_empty_containers_fit_at_the_last_level():
    schema = _extra_config_schema()
    deep = nest(F.EXTRA_CONFIG_MAX_DEPTH + 1, "d")
    assert refusals(schema, deep)[0].startswith("spec.kvTransfer.extraConfig.top.k")
    for empty in ({}, [], None):  # the last level holds a scalar or an empty container
        value = nest(F.EXTRA_CONFIG_MAX_DEPTH, "dl", empty)
        assert not refusals(schema, value) and operator_accepts(value)
    for full in ({"x": 1}, [1]):
        value = nest(F.EXTRA_CONFIG_MAX_DEPTH, "dl", full)
        assert refusals(schema, value) and not operator_accepts(value)


def test_too_many_values_in_one_place_are_refused_at_admission():
    schema = _extra_config_schema()
    n = F.EXTRA_CONFIG_MAX_ITEMS
    for value in ({"v": list(range(n + 1))}, {f"k{i}": i for i in range(n + 1)}, {"a": {"b": [[0] * (n + 1)]}}):
        assert refusals(schema, value) and not operator_accepts(value)
    fits = {"v": list(range(n - 2))}  # with the object and the list: n values
    assert not refusals(schema, fits) and operator_accepts(fits)
    # spread over many places, more than n values pass admission: the operator counts them (second line)
    spread = {f"k{i}": list(range(n // 2)) for i in range(3)}
    assert not refusals(schema, spread) and not operator_accepts(spread)


def test_the_tree_is_structural_and_small():
    schema = _extra_config_schema()
    assert schema["type"] == "object" and schema["default"] == {}
    nodes, stack = 0, [schema]
    while stack:
        node = stack.pop()
        nodes += 1
        if node is not schema:  # below the top any JSON value: no type, unknown fields kept
            assert "type" not in node and node["x-kubernetes-preserve-unknown-fields"] is True
        stack += [node[k] for k in ("additionalProperties", "items") if k in node]
    assert nodes == 2 ** (F.EXTRA_CONFIG_MAX_DEPTH - 1)  # one per container kind and level: keep the depth small
    assert f"at most {F.EXTRA_CONFIG_MAX_DEPTH} levels" in schema["description"]
