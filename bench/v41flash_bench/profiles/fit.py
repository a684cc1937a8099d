"""Fit capacity-profile curves to measured points (non-negative least squares on relative error).

Used by ``v41flash profile build`` (from a benchmark run) and by the aiconfigurator derivation script.
The curves have three non-negative coefficients each, so exact NNLS is a search over the 2³ subsets of
active coefficients: small, exact, no extra dependency.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from v41flash.planner.profile import CapacityProfile, DecodeCurve, PrefillCurve, find_profile, profile_from_dict


@dataclass(frozen=True)
class Fit:
    coefficients: tuple[float, ...]
    max_relative_error: float
    mean_relative_error: float
    points: int


def nnls_relative(columns: np.ndarray, y: np.ndarray) -> Fit:
    """Non-negative x minimising Σ((A x - y) / y)²; exact by enumerating active sets."""
    if len(y) == 0:
        raise ValueError("no points to fit")
    if np.any(y <= 0):
        raise ValueError("measured latencies must be positive")
    a = columns / y[:, None]
    ones = np.ones_like(y)
    best: tuple[float, np.ndarray] | None = None
    n = columns.shape[1]
    for k in range(1, n + 1):
        for active in itertools.combinations(range(n), k):
            sol, *_ = np.linalg.lstsq(a[:, active], ones, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(n)
            x[list(active)] = sol
            err = float(np.sum((a @ x - ones) ** 2))
            if best is None or err < best[0] - 1e-15:
                best = (err, x)
    if best is None:  # cannot happen with positive y and a positive column, kept for clarity
        raise ValueError("no non-negative fit")
    x = best[1]
    rel = np.abs(columns @ x - y) / y
    return Fit(tuple(float(v) for v in x), float(rel.max()), float(rel.mean()), len(y))


def fit_prefill(points: Sequence[tuple[float, float, float]]) -> tuple[PrefillCurve, Fit]:
    """Points are (new tokens, cached tokens, seconds) of single, unqueued prefills on one rank."""
    p = np.asarray(points, dtype=float).reshape(-1, 3)
    new, cached, secs = p[:, 0], p[:, 1], p[:, 2]
    cols = np.column_stack([np.ones_like(new), new, new * (new + 2 * cached)])
    fit = nnls_relative(cols, secs)
    a, b, c = fit.coefficients
    return PrefillCurve(overhead=a, per_token=b, per_token_context=c), fit


def fit_decode(points: Sequence[tuple[float, float, float]]) -> tuple[DecodeCurve, Fit]:
    """Points are (running sequences per rank, mean context tokens, seconds per engine step)."""
    p = np.asarray(points, dtype=float).reshape(-1, 3)
    batch, ctx, secs = p[:, 0], p[:, 1], p[:, 2]
    cols = np.column_stack([np.ones_like(batch), batch, batch * ctx])
    fit = nnls_relative(cols, secs)
    a, b, c = fit.coefficients
    return DecodeCurve(overhead=a, per_sequence=b, per_sequence_context=c), fit


def _g(d: dict, *names: str, default: Any = None) -> Any:
    for n in names:
        if n in d:
            return d[n]
    return default


def build_profile(run: dict) -> tuple[CapacityProfile, dict[str, Fit]]:
    """A profile from a benchmark-run document (format in docs/decisions/2026-11-30-capacity-profiles.md).

    Fields not measured (cold start, KV capacity, layout) come from the run's ``prefill``/``decode``
    sections, else from the shipped profile named by ``base`` or matching (servingProfile, gpuProduct).
    """
    serving, gpu = run["servingProfile"], run["gpuProduct"]
    base = None
    if run.get("base"):
        base = next((p for p in _shipped() if p.metadata.name == run["base"]), None)
        if base is None:
            raise ValueError(f"base profile {run['base']!r} is not shipped")
    if base is None and run.get("base", True) is not None:
        base = find_profile(serving, gpu)
    doc = base.to_dict() if base is not None else {}
    doc.update(
        {
            "apiVersion": "v41flash.io/v1alpha1",
            "kind": "CapacityProfile",
            "metadata": {
                "name": run.get("name", f"{gpu.lower()}-{serving}-measured"),
                "description": run.get("description", f"Fitted from benchmark run {run.get('run', '')}".strip()),
                "source": f"v41flash profile build from {run.get('run', 'a benchmark run')}"
                + (f"; unmeasured fields from {base.metadata.name}" if base else ""),
            },
            "servingProfile": serving,
            "gpuProduct": gpu,
        }
    )
    if run.get("kvTransfer"):
        doc["kvTransfer"] = run["kvTransfer"]
    fits: dict[str, Fit] = {}
    for role in ("prefill", "decode"):
        section = dict(run.get(role) or {})
        points = section.pop("points", [])
        merged = {**doc.get(role, {}), **section}
        if points and role == "prefill":
            usable = [p for p in points if _g(p, "concurrency", default=1) <= 1]
            if not usable:
                raise ValueError("prefill points need at least one unqueued measurement (concurrency 1)")
            rows = [
                (float(_g(p, "isl")) - float(_g(p, "cachedTokens", "cached", default=0)),
                 float(_g(p, "cachedTokens", "cached", default=0)),
                 float(_g(p, "ttftSeconds", "ttft"))) for p in usable
            ]
            curve, fits[role] = fit_prefill(rows)
            merged["curve"] = curve.model_dump(by_alias=True)
        elif points:
            tps = float(merged.get("tokensPerStep", 1.0))
            # a point gives either the engine step time or the ITL users saw (step / tokens per step)
            rows = [
                (float(_g(p, "batch")), float(_g(p, "context")),
                 float(p["stepSeconds"]) if "stepSeconds" in p else float(_g(p, "itlSeconds", "itl")) * tps)
                for p in points
            ]
            curve, fits[role] = fit_decode(rows)
            merged["curve"] = curve.model_dump(by_alias=True)
        if "curve" not in merged:
            raise ValueError(f"{role}: no points measured and no base profile to take the curve from")
        doc[role] = merged
    return profile_from_dict(doc), fits


def _shipped():
    from v41flash.planner.profile import shipped_profiles

    return shipped_profiles()
