"""Observe: scrape vLLM/router /metrics, keep snapshots, compute evaluation-window figures."""
from v41flash.figures import RouterFigures, WindowFigures
from v41flash.metrics.window import PodSnapshot, SnapshotHistory, compute_router_window, compute_window, role_windows

__all__ = [
    "PodSnapshot", "RouterFigures", "SnapshotHistory", "WindowFigures", "compute_router_window", "compute_window",
    "role_windows",
]
