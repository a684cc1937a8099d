"""What a unit test needs from outside the Python environment: tools e2e/build-tools.sh builds into the
cache, or a loopback address. Missing locally: the test skips and says how to get it. Under CI (CI=true,
as .ci/run and every CI service set it) it fails instead, so a green CI run has run every test."""
from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def versions() -> dict[str, str]:
    """The pins in e2e/versions.env (the cache key of every tool)."""
    return {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in
            (REPO / "e2e" / "versions.env").read_text().splitlines() if "=" in line and not line.lstrip().startswith("#"))}


def tool_cache() -> Path:
    """Where e2e/build-tools.sh puts what it builds: ${V41F_CACHE:-~/.cache/v41flash}/bin."""
    return Path(os.environ.get("V41F_CACHE") or Path.home() / ".cache" / "v41flash") / "bin"


def unavailable(reason: str) -> NoReturn:
    """Skip with `reason` locally; fail with it under CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails the test instead of skipping it)", pytrace=False)
    pytest.skip(reason)


def require_tool(path: Path, how_to_build: str) -> Path:
    """`path` if it exists; otherwise skip (locally) or fail (CI) with the command that builds it."""
    if not path.exists():
        unavailable(f"{path} not built: run `{how_to_build}`")
    return path
