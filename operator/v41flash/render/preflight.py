"""Before the first apply: would the apiserver take every child? (issue 12: no half-applied stacks)

The CRD's patterns and CEL rules refuse most such specs at admission. What they cannot say (map keys,
values that only exist once rendered) is checked here on the rendered objects themselves, so a reconcile
Stalls with the field named instead of applying half the stack and failing on the first bad child.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..api import formats as F
from ..api import v1alpha1 as api
from ..api.validation import Problem
from ..vllm.args import InvalidEngineConfig
from . import render

_LABEL_KEY = re.compile(F.LABEL_KEY)
_LABEL_VALUE = re.compile(F.LABEL_VALUE)
_DNS1035 = re.compile(F.DNS1035_LABEL)
_DNS1123 = re.compile(F.DNS1123_SUBDOMAIN)
# Kinds whose names must be DNS-1035 labels (Services), the rest DNS-1123 subdomains.
_LABEL_NAMED = {"Service"}


def node_selector_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    """nodeSelector keys (values are held to the label-value pattern by the CRD)."""
    out = []
    for key in obj.spec.gpu.node_selector:
        if len(key) > F.LABEL_KEY_MAX or not _LABEL_KEY.match(key):
            out.append(Problem(f"spec.gpu.nodeSelector[{key[:80]!r}]",
                               "not a label key: an optional DNS prefix and '/', then at most 63 letters, digits, "
                               "'-', '_' or '.', starting and ending with a letter or digit"))
    return out


def _ints(node: Any, path: str) -> Iterator[tuple[str, int]]:
    stack = [(node, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            yield where, value


def object_problems(objs: list[dict[str, Any]]) -> list[Problem]:
    """Names, labels and integers of rendered objects against what the apiserver accepts."""
    out: list[Problem] = []
    for o in objs:
        where = f"rendered {o['kind']}/{o['metadata']['name']}"
        name = o["metadata"]["name"]
        pattern, limit = (_DNS1035, 63) if o["kind"] in _LABEL_NAMED else (_DNS1123, 253)
        if len(name) > limit or not pattern.match(name):
            out.append(Problem("metadata.name", f"{where}: {name!r} is not a valid {o['kind']} name"))
        for key, value in (o["metadata"].get("labels") or {}).items():
            if not _LABEL_KEY.match(key) or len(str(value)) > F.LABEL_VALUE_MAX or not _LABEL_VALUE.match(str(value)):
                out.append(Problem("metadata.name", f"{where}: label {key}={value!r} is not a valid label"))
        for path, value in _ints(o.get("spec", {}), "spec"):
            if not -F.INT32_MAX - 1 <= value <= F.INT32_MAX:
                out.append(Problem("spec", f"{where}: {path} = {value} is outside int32"))
    return out


def rendered_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    """Render as the controller would and check the result; a renderer failure is a problem, not a crash."""
    try:
        objs = render(obj, owner={"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "preflight", "uid": "0"})
    except InvalidEngineConfig:
        return []  # engine_problems names each field already
    except Exception as exc:  # noqa: BLE001 - any renderer failure must become Stalled, never a crash loop
        return [Problem("spec", f"the operator cannot render this spec: {type(exc).__name__}: {str(exc)[:200]}")]
    return object_problems(objs)
