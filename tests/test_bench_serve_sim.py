"""`v41flash bench serve` against bare llm-d-inference-sim engines on loopback, whose latency flags are known:
one run measured against its flags, and the same agent-session replay on a "self-hosted" engine (priced per
GPU-hour) and on a second simulator standing in for a managed API (priced per token, seed 004's prices), compared
by cost per completed session. Loose bounds only (a loaded 2-core machine); the 10 % comparison is the benchmark's,
docs/benchmarking.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prereq import require_tool, tool_cache, versions

from v41flash_bench.inference_sim import SimLatency, binary_path, sim_command
from v41flash_bench.procs import free_port, spawn, stop_procs
from v41flash_bench.serve import records as R
from v41flash_bench.serve.simcheck import against, configured

SELF_HOSTED = SimLatency(prefill_overhead_ms=25, prefill_us_per_token=40, inter_token_ms=10)
MANAGED = SimLatency(prefill_overhead_ms=40, prefill_us_per_token=60, inter_token_ms=20)
MAX_NUM_SEQS = 16


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    binary = require_tool(binary_path(tool_cache(), versions()["INFERENCE_SIM_VERSION"]),
                          "bash e2e/build-tools.sh inference-sim")
    logs = tmp_path_factory.mktemp("sims")
    procs, urls = [], {}
    try:
        for name, lat in (("self", SELF_HOSTED), ("managed", MANAGED)):
            port = free_port()
            argv, env = sim_command(binary, bind_host="127.0.0.1", port=port, served_names=["m"],
                                    max_num_seqs=MAX_NUM_SEQS, max_model_len=65536, kv_cache_blocks=8192,
                                    block_size=16, latency=lat, quiet=True)
            procs.append(spawn(f"bench-serve-{name}", argv, logs / f"{name}.log", env=env, port=port))
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        for url in urls.values():
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"simulator {url} never healthy (logs: {logs})"
                time.sleep(0.1)
        yield urls
    finally:
        stop_procs(procs, timeout=5)


def serve(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "v41flash.cli.main", "bench", "serve", "--no-plots", *args],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_measured_ttft_and_itl_follow_the_simulators_flags(sims, tmp_path):
    serve("--url", sims["self"], "--model", "m", "--workload", "fixed", "--isl", "1000", "--osl", "40",
          "--concurrency", "1", "--warmup", "1", "--duration", "5", "--repeats", "1", "--out", str(tmp_path))
    (rec,) = R.read(tmp_path)
    assert rec["figures"]["requests"]["success_rate"] == 1.0
    assert rec["figures"]["tokens"]["output"]["p50"] == 40  # ignore_eos: exactly the asked length
    expected = configured(SELF_HOSTED, rec["figures"]["tokens"]["input"]["mean"])
    rows = against(rec, expected)
    for row in rows:
        print(f"{row['figure']}: configured {row['configured'] * 1000:.1f} ms, measured {row['measured'] * 1000:.1f} "
              f"ms ({row['error']:+.1%})")
        # never faster than configured; slower only by the machine's load, which under CI (the unit suite niced beside
        # two e2e clusters) reached +69 % on a 65 ms TTFT: the bound is a sanity check of what is measured, the 10 %
        # comparison is the benchmark's (docs/decisions/2026-12-07-bench-serve.md), never a timed assertion here
        assert -0.05 < row["error"] < 3.0, row


def test_self_hosted_and_managed_on_the_same_sessions_by_cost_per_session(sims, tmp_path):
    common = ["--model", "m", "--workload", "agentx", "--agentx-set", "turns_max=6", "--rate", "4", "--seed", "7",
              "--warmup", "1", "--duration", "6", "--repeats", "1", "--slo-ttft", "2", "--slo-e2e-p95", "10"]
    serve("--url", sims["self"], "--gpus", "8", "--gpu-hour-price", "2.26", "--system", "gpu_model=H200",
          "--out", str(tmp_path / "self"), *common)
    out = serve("--url", sims["managed"], "--price-input", "0.30", "--price-output", "1.20", "--price-cached", "0.03",
                "--out", str(tmp_path / "managed"), *common)
    assert "usd_per_session" in out.stdout
    (a,), (b,) = R.read(tmp_path / "self"), R.read(tmp_path / "managed")
    assert a["workload"]["requests_sha256"] == b["workload"]["requests_sha256"]  # the same requests
    for rec in (a, b):
        assert rec["figures"]["sessions_completed"] > 0 and rec["cost"]["usd_per_completed_session"] > 0
        assert rec["figures"]["tokens"]["hit_rate"] > 0.3  # turns resend their context: the engines' cache hits
    assert a["cost"]["basis"].startswith("self-hosted") and b["cost"]["basis"].startswith("managed")
    cmp = subprocess.run([sys.executable, "-m", "v41flash.cli.main", "bench", "compare", str(tmp_path / "self"),
                          str(tmp_path / "managed"), "--variable", "system", "--out", str(tmp_path)],
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    print(cmp.stdout)
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["points"][0]["figures"]["cost.usd_per_completed_session"]["b_over_a"] > 0
    refused = subprocess.run([sys.executable, "-m", "v41flash.cli.main", "bench", "compare", str(tmp_path / "self"),
                              str(tmp_path / "managed"), "--variable", "system.gpu_model"],
                             capture_output=True, text=True)
    assert refused.returncode == 3 and "REFUSED" in refused.stdout
