"""A sweep: every load point repeated, each repeat a warm-up and a measured window on fresh requests; one record
per point (the median and range of the repeats) appended to DIR/records.jsonl as soon as it is measured, so a
long run that is stopped keeps what it measured. The sweep stops after the first point that breaks the SLO
(the best point is the highest load that still meets it). With ``cold``, the first repeat's warm-up traffic is
also recorded as a point of its own, state cold: the endpoint before it served any of this run's requests.
"""
from __future__ import annotations

import asyncio
import itertools
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from v41flash_bench.serve import figures as F  # noqa: N812
from v41flash_bench.serve import records as R  # noqa: N812
from v41flash_bench.serve.driver import Endpoint, Load, run_point
from v41flash_bench.serve.target import Target
from v41flash_bench.serve import workloads as W  # noqa: N812


@dataclass(frozen=True)
class Method:
    warmup_s: float = 10.0
    duration_s: float = 30.0
    repeats: int = 3
    drain_s: float = 60.0
    seed: int = 41
    cold: bool = False
    stop_at_breach: bool = True


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str  # agentx | replay | fixed
    agentx: dict = field(default_factory=dict)  # --agentx-set overrides
    replay: str = ""  # path
    isl: int = 1000
    osl: int = 100

    def scripts(self, seed: int, tag: str) -> Iterator[W.Script]:
        if self.kind == "agentx":
            return W.agentx_scripts(seed, tag, self.agentx)
        if self.kind == "fixed":
            return W.fixed_scripts(seed, tag, self.isl, self.osl)
        return iter(W.read_replay(Path(self.replay)))

    def params(self) -> dict:
        if self.kind == "agentx":
            return {"shape": asdict(W.agentx_scenario(self.agentx))}
        if self.kind == "fixed":
            return {"isl_words": self.isl, "osl": self.osl}
        return {"log": Path(self.replay).name}


def arrival(kind: str, load: Load) -> str:
    if load.kind == "concurrency":
        return f"closed loop: {load.value:g} clients, each sending its next script when the last one ended"
    if kind == "replay":
        return f"open loop: the log's own times × 1/{load.value:g}"
    return f"open loop: Poisson arrivals, {load.value:g} scripts/s"


DIGEST_SCRIPTS = 64


def _digest(wl: WorkloadSpec, seed: int, tag: str) -> str:
    """The digest of the repeat's request stream: its first DIGEST_SCRIPTS scripts (how many of them started
    depends on the endpoint's speed in a closed loop; which ones, in which order, does not)."""
    return W.digest(list(itertools.islice(wl.scripts(seed, tag), DIGEST_SCRIPTS)))


def make_record(target: Target, wl: WorkloadSpec, method: Method, load: Load, state: str, point: int,
                run_id: str, reps: list[dict], digests: list[str], wall_s: float) -> dict:
    med = R.median_tree(reps)
    met = F.slo_met(med, target.slo)
    return {
        "schema": R.SCHEMA, "run": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "point": point, "state": state,
        "target": {"kind": target.kind, **target.identity},
        "system": target.system, "unknown": target.unknown,
        "workload": {"kind": wl.kind, "params": wl.params(), "requests_sha256": digests,
                     "load": {"kind": load.kind, "value": load.value}, "arrival": arrival(wl.kind, load),
                     "input_tokens": med["tokens"]["input"], "output_tokens": med["tokens"]["output"]},
        "method": {"warmup_s": method.warmup_s if state == "warm" else 0.0, "window_s": med["window_s"],
                   "repeats": len(reps), "drain_s": method.drain_s, "seed": method.seed,
                   "ignore_eos": None},
        "duration_s": wall_s,
        "slo": {**(target.slo or {}), "met": met},
        "figures": med, "range": R.ranges(reps), "repeats": reps,
        "cost": F.cost(med, gpus=target.gpus, usd_per_gpu_hour=target.usd_per_gpu_hour, prices=target.prices),
    }


def sweep(target: Target, ep: Endpoint, wl: WorkloadSpec, loads: list[Load], method: Method, out: Path,
          progress: Callable[[str], None], run_id: str | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    run_id = run_id or uuid.uuid4().hex[:8]
    written: list[dict] = []
    for i, load in enumerate(loads):
        reps, digests, cold_rec = [], [], None
        t_point = time.perf_counter()
        for rep in range(method.repeats):
            tag = f"p{i}r{rep}"
            progress(f"point {i + 1}/{len(loads)} ({load.label()}), repeat {rep + 1}/{method.repeats}: "
                     f"{method.warmup_s:g}s warm-up + {method.duration_s:g}s window")
            run = asyncio.run(run_point(ep, wl.scripts(method.seed, tag), load, warmup_s=method.warmup_s,
                                        duration_s=method.duration_s, drain_s=method.drain_s,
                                        seed=zlib.crc32(f"{method.seed}/{tag}".encode()), replay=wl.kind == "replay",
                                        progress=progress))
            fig = F.summarize(run, gpus=target.gpus, decode_ranks=target.decode_ranks)
            reps.append(fig)
            digests.append(_digest(wl, method.seed, tag))
            if method.cold and i == 0 and rep == 0 and method.warmup_s > 0:
                cold_fig = F.summarize(run, window=(0.0, method.warmup_s), gpus=target.gpus,
                                       decode_ranks=target.decode_ranks)
                if cold_fig["requests"]["sent"]:
                    cold_rec = make_record(target, wl, method, load, "cold", i, run_id, [cold_fig], [digests[-1]],
                                           run.wall_s)
                else:
                    progress("  no request started in the warm-up: no cold point (a longer --warmup or a higher "
                             "first load gives one)")
            progress(f"  -> {_line(fig)}")
        rec = make_record(target, wl, method, load, "warm", i, run_id, reps, digests, time.perf_counter() - t_point)
        new = [r for r in (cold_rec, rec) if r is not None]
        for r in new:
            r["method"]["ignore_eos"] = ep.ignore_eos
        R.write(out / R.RECORDS, new)
        written.extend(new)
        progress(f"point {i + 1}: {_line(rec['figures'])}; SLO {'met' if rec['slo']['met'] else 'not met' if rec['slo']['met'] is False else 'none given'}")
        if not rec["figures"]["requests"]["succeeded"]:
            errors = rec["figures"]["requests"]["errors"]
            progress(f"stopping: no request succeeded at {load.label()} ({errors}); check the endpoint (--url, "
                     "--model, --api-key-env) with one request before measuring")
            break
        if method.stop_at_breach and rec["slo"]["met"] is False:
            progress(f"stopping: {load.label()} breaks the SLO (the points after it would only break it more)")
            break
    return written


def _line(fig: dict) -> str:
    lat, thr, req = fig["latency"], fig["throughput"], fig["requests"]

    def ms(d, k):
        return f"{d[k] * 1000:.0f}ms" if d.get(k) is not None else "-"
    return (f"{req['succeeded']}/{req['sent']} ok, {thr['requests_per_s']:.2f} req/s, "
            f"{thr['output_tokens_per_s']:.0f} out tok/s, TTFT p50 {ms(lat['ttft_s'], 'p50')} p90 "
            f"{ms(lat['ttft_s'], 'p90')}, ITL p50 {ms(lat['itl_s'], 'p50')}, e2e p95 {ms(lat['e2e_s'], 'p95')}")
