"""Checks only the operator can make (placeholder list filled by the renderer: vLLM args, GPU budget)."""
from __future__ import annotations


def operator_checks() -> list:
    return []
