#!/usr/bin/env python3
"""Measure the simulated engines the e2e supervisor runs and write the benchmark-run document that
`v41flash profile build` fits into a capacity profile for them.

One prefill simulator and one decode simulator are started on free loopback ports with exactly the
supervisor's flags (`supervisor.pod_sim_command`, so changes to the supervisor's simulator settings are picked up) and the
max-num-seqs of the autoscaling e2e deployment. Latencies are read from the simulator's own histograms
(sum/count deltas), i.e. the figures the operator's scraper sees:

* prefill: one request at a time (concurrency 1, as `profile build` requires) at several prompt lengths;
  unique random words per request so the prefix cache never hits; then max-num-seqs requests kept
  running for a few seconds: throughput x unloaded prefill time = the serial-equivalent prefill slots,
  which the profile states as dataParallelSize (the planner models each rank as one M/G/1 queue);
* decode: `batch` concurrent streams of OUTPUT_TOKENS tokens at two prompt lengths; mean inter-token
  latency per batch (the simulator slows every token by 1 + (factor-1)(running-1)/(max-num-seqs-1)).

    .venv/bin/python -m e2e.autoscale.calibrate --out e2e/autoscale/sim-run.json
    .venv/bin/v41flash profile build --from e2e/autoscale/sim-run.json --no-base --out e2e/autoscale/sim-profile.yaml
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.engine_pods import VllmArgs, pod_sim_command
from e2e.tools import Tools
from v41flash_bench.procs import free_port, spawn, stop_procs

MODEL = "deepseek-v4.1-flash"
# The e2e deployment's engine settings (e2e/test_autoscale.py puts them in its spec: maxNumSeqs, and the
# extra simulator flags through extraEnv V41F_SIM_ARGS). Prefill is slowed per token so that seconds of
# simulated prefill cost milliseconds of CPU: on a small machine long prompts would make the simulator
# CPU-bound and its latency a measure of the machine, not of the flags.
PREFILL_MAX_NUM_SEQS = 4
DECODE_MAX_NUM_SEQS = 16
PREFILL_SIM_ARGS = "--prefill-time-per-token 300us"
DECODE_SIM_ARGS = ""
PREFILL_ISLS = (250, 500, 1000, 2000)
DECODE_BATCHES = (1, 4, 8, 16)
DECODE_PROMPTS = (200, 2000)
OUTPUT_TOKENS = 48
REPEATS = 3
SATURATION_SECONDS = 8.0
GPUS_PER_REPLICA = 4
WORDS = [f"w{i}" for i in range(5000)]


def prompt(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def hist(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram over all label sets."""
    s = c = 0.0
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == f"{name}_sum":
                s += smp.value
            elif smp.name == f"{name}_count":
                c += smp.value
    return s, c


class Sim:
    def __init__(self, role: str, max_num_seqs: int, extra: str, logdir: Path):
        self.port = free_port()
        v = VllmArgs(served_names=(MODEL,), port=self.port, max_num_seqs=max_num_seqs, max_model_len=None,
                     dp_ranks=1, headless=False)
        argv, env = pod_sim_command(str(Tools.load().sim), role, "127.0.0.1", v, shlex.split(extra))
        self.proc = spawn(f"calibrate-{role}", argv, logdir / f"sim-{role}.log", env=env, port=self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = argv

    async def wait(self, client: httpx.AsyncClient) -> None:
        for _ in range(200):
            try:
                if (await client.get(f"{self.url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"simulator on {self.url} never became healthy")

    async def hist(self, client: httpx.AsyncClient, name: str) -> tuple[float, float]:
        return hist((await client.get(f"{self.url}/metrics")).text, name)


async def completion(client: httpx.AsyncClient, url: str, text: str, max_tokens: int) -> dict:
    r = await client.post(f"{url}/v1/completions", json={
        "model": MODEL, "prompt": text, "max_tokens": max_tokens, "ignore_eos": True}, timeout=60)
    r.raise_for_status()
    return r.json()


async def measure_prefill(sim: Sim, client: httpx.AsyncClient, rng: random.Random) -> list[dict]:
    points = []
    for words in PREFILL_ISLS:
        s0, c0 = await sim.hist(client, "vllm:time_to_first_token_seconds")
        tokens = []
        for _ in range(REPEATS):  # sequential: concurrency 1, nothing queued
            tokens.append((await completion(client, sim.url, prompt(words, rng), 1))["usage"]["prompt_tokens"])
        s1, c1 = await sim.hist(client, "vllm:time_to_first_token_seconds")
        points.append({"isl": round(sum(tokens) / len(tokens)), "cachedTokens": 0, "concurrency": 1,
                       "ttftSeconds": round((s1 - s0) / (c1 - c0), 6)})
        print(f"prefill  isl {points[-1]['isl']:>6}  ttft {points[-1]['ttftSeconds'] * 1000:7.1f} ms", flush=True)
    return points


async def prefill_slots(sim: Sim, client: httpx.AsyncClient, rng: random.Random, ttft_alone: float,
                        words: int) -> dict:
    """Serial-equivalent prefill slots: closed-loop throughput with max-num-seqs requests always running,
    times the unloaded prefill time. The planner models a replica as that many M/G/1 ranks."""
    done = 0
    stop = time.monotonic() + SATURATION_SECONDS

    async def worker():
        nonlocal done
        while time.monotonic() < stop:
            await completion(client, sim.url, prompt(words, rng), 1)
            done += 1
    t0 = time.monotonic()
    await asyncio.gather(*[worker() for _ in range(PREFILL_MAX_NUM_SEQS)])
    rate = done / (time.monotonic() - t0)
    slots = rate * ttft_alone
    print(f"prefill  saturated at {PREFILL_MAX_NUM_SEQS} running: {rate:.2f} req/s x {ttft_alone * 1000:.0f} ms "
          f"= {slots:.2f} serial-equivalent slots", flush=True)
    return {"requestsPerSecond": round(rate, 3), "ttftAloneSeconds": ttft_alone, "slots": round(slots, 3)}


async def measure_decode(sim: Sim, client: httpx.AsyncClient, rng: random.Random) -> list[dict]:
    points = []
    for words in DECODE_PROMPTS:
        for batch in DECODE_BATCHES:
            s0, c0 = await sim.hist(client, "vllm:inter_token_latency_seconds")
            outs = await asyncio.gather(*[completion(client, sim.url, prompt(words, rng), OUTPUT_TOKENS)
                                          for _ in range(batch)])
            s1, c1 = await sim.hist(client, "vllm:inter_token_latency_seconds")
            isl = sum(o["usage"]["prompt_tokens"] for o in outs) / batch
            points.append({"batch": batch, "context": round(isl + OUTPUT_TOKENS / 2),
                           "itlSeconds": round((s1 - s0) / (c1 - c0), 6)})
            print(f"decode   batch {batch:>3}  context {points[-1]['context']:>5}  "
                  f"itl {points[-1]['itlSeconds'] * 1000:6.2f} ms", flush=True)
    return points


async def run(logdir: Path) -> dict:
    rng = random.Random(7)
    sims = {"prefill": Sim("prefill", PREFILL_MAX_NUM_SEQS, PREFILL_SIM_ARGS, logdir),
            "decode": Sim("decode", DECODE_MAX_NUM_SEQS, DECODE_SIM_ARGS, logdir)}
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
            for s in sims.values():
                await s.wait(client)
            prefill = await measure_prefill(sims["prefill"], client, rng)
            longest = max(prefill, key=lambda p: p["isl"])
            saturation = await prefill_slots(sims["prefill"], client, rng, longest["ttftSeconds"], PREFILL_ISLS[-1])
            decode = await measure_decode(sims["decode"], client, rng)
    finally:
        stop_procs([s.proc for s in sims.values()], timeout=5)
    # the simulator runs max-num-seqs prefills at once, each slowed up to --time-factor-under-load: as
    # capacity that is `slots` serial ranks (dataParallelSize must divide gpusPerReplica)
    ranks = min((d for d in range(1, GPUS_PER_REPLICA + 1) if GPUS_PER_REPLICA % d == 0),
                key=lambda d: abs(d - saturation["slots"]))
    return {
        "name": "e2e-sim-tp4-h200",
        "run": f"e2e/autoscale/calibrate.py {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "description": "llm-d-inference-sim engines as the e2e supervisor runs them: "
                       + " ".join(sims["prefill"].argv[7:]) + " | decode: " + " ".join(sims["decode"].argv[7:]),
        "servingProfile": "low-latency", "gpuProduct": "H200",
        "prefillSaturation": saturation,
        "prefill": {"parallelism": "TP4", "gpusPerReplica": GPUS_PER_REPLICA, "dataParallelSize": ranks,
                    # a simulated pod is Ready within seconds of being scheduled
                    "coldStartSeconds": 10, "maxNumBatchedTokens": 8192, "points": prefill},
        "decode": {"parallelism": "TP4", "gpusPerReplica": GPUS_PER_REPLICA, "dataParallelSize": 1, "coldStartSeconds": 10,
                   "tokensPerStep": 1.0, "maxNumSeqs": DECODE_MAX_NUM_SEQS,
                   "kvCacheTokens": 65536 * 16, "points": decode},
        # --kv-cache-transfer-latency 10ms, independent of the prompt length
        "kvTransfer": {"overheadSeconds": 0.01, "secondsPerToken": 0.0},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="benchmark-run JSON to write")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="v41f-calibrate-") as tmp:
        doc = asyncio.run(run(Path(tmp)))
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
