"""Smoke of `v41flash bench routing` with the real components (vllm-router + llm-d-inference-sim), < 30 s.

Needs no control plane: two simulated engines and the router run as local processes on 127.0.0.1. One
session-keyed policy with and without the real session proxy in front, a tiny trace, both session-key
modes: with a header, or with the proxy, each session stays on its engine (hit rate = oracle); without
either, everything lands on one engine; the report and the table come out whole.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from v41flash_bench.routing import runner as b

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]

TINY = """\
scenario: {name: tiny, engines: 2, sessions: 3, turns_min: 3, turns_max: 3, system_tokens: 64,
           first_turn_tokens: 32, new_tokens_median: 20, new_tokens_mean: 24, new_tokens_max: 60,
           output_tokens_median: 4, output_tokens_mean: 5, output_tokens_max: 8, subagent_fraction: 0.0,
           kv_cache_blocks: 2000}
run_timeout_s: 20
modes: [header, none]
variants:
  - {name: sticky, policy: sticky_least_loaded}
  - {name: sticky+proxy, policy: sticky_least_loaded, session_key: proxy, ours: true}
"""


@pytest.fixture(scope="module")
def binaries():
    if b.find_sim_binary() is None:
        pytest.skip(f"llm-d-inference-sim {b.SIM_VERSION} not built: run e2e/build-tools.sh inference-sim")
    if b.find_router_binary() is None:
        pytest.skip("vllm-router not installed in this venv: pip install -e '.[dev]'")


def test_bench_routing_smoke(binaries, tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "v41flash_bench.cli_routing", "--out", str(out),
                        "--scenario", str(scenario)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mode" in r.stdout and "sticky_least_loaded" in r.stdout and "report.json" in r.stdout

    report = json.loads((out / "report.json").read_text())
    assert report["trace"]["requests"] == 9
    assert 0.0 < report["oracle_hit_rate"] < 1.0
    by_mode = {x["mode"]: x for x in report["results"] if x["variant"] == "sticky"}
    proxied = {x["mode"]: x for x in report["results"] if x["variant"] == "sticky+proxy"}
    assert set(by_mode) == set(proxied) == {"header", "none"}
    for res in [*by_mode.values(), *proxied.values()]:
        assert res["errors"] == 0 and res["requests"] == 9
        assert sum(e["requests"] for e in res["engines"]) == 9  # every request reached an engine
        assert res["p95_ms"] >= res["p50_ms"] > 0
        assert res["router_cpu_s"] is not None
    # With the header each session sticks to one engine: the engines count as many hits as the oracle.
    assert by_mode["header"]["hit_vs_oracle"] == pytest.approx(1.0, abs=0.02)
    # Without a header the proxy derives one: sessions still stick, and they spread over both engines.
    assert proxied["none"]["hit_vs_oracle"] == pytest.approx(1.0, abs=0.02)
    assert all(e["requests"] > 0 for e in proxied["none"]["engines"])
    assert proxied["none"]["proxy_cpu_s"] is not None and by_mode["none"]["proxy_cpu_s"] is None
    assert max(e["requests"] for e in by_mode["none"]["engines"]) == 9  # no key, no proxy: one engine
    assert (out / "logs").is_dir()
