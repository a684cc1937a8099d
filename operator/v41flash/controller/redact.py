"""Escape-hatch values (extraEnv, extraArgs) stay out of what the operator writes about a spec.

kopf keeps the last handled spec in an annotation (`v41flash.io/last-handled-configuration`) that anyone
who can read the CR's metadata sees, in every tool that lists annotations. A value set in extraEnv (often a
credential someone should have put in a Secret) would be copied there in plain text. The diff base keeps a
digest instead: a changed value still changes the essence (so kopf still sees an update), the text never
appears.
"""
from __future__ import annotations

import copy
import hashlib
from typing import Any

import kopf

from ..roles import ROLES


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def redact_spec(spec: Any) -> Any:
    """spec with each role's extraEnv values and extraArgs replaced by digests (pure; input untouched)."""
    if not isinstance(spec, dict):
        return spec
    out = copy.deepcopy(spec)
    for role in ROLES:
        rs = out.get(role)
        if not isinstance(rs, dict):
            continue
        env = rs.get("extraEnv")
        if isinstance(env, list):
            rs["extraEnv"] = [{**e, "value": _digest(e.get("value"))} if isinstance(e, dict) and "value" in e else e
                              for e in env]
        if isinstance(rs.get("extraArgs"), list) and rs["extraArgs"]:
            rs["extraArgs"] = [_digest(rs["extraArgs"])]
    return out


class RedactingDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, with escape-hatch values as digests."""

    def build(self, *, body, extra_fields=None):  # type: ignore[no-untyped-def]
        essence = super().build(body=body, extra_fields=extra_fields)
        if isinstance(essence, dict) and "spec" in essence:
            essence = {**essence, "spec": redact_spec(essence["spec"])}
        return essence  # type: ignore[return-value]
