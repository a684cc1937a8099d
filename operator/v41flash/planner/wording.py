"""How the planner's reasons write numbers (seconds, token counts, percentiles)."""
from __future__ import annotations

import math


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.2f}s")


def fmt_k(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def pct(p: float) -> str:
    return f"p{p * 100:g}"
