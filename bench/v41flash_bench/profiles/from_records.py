"""The benchmark-run document `build_profile` fits, made from `v41flash bench serve` records (records.jsonl).

* prefill: every warm point measured one request at a time (closed loop, concurrency 1: nothing queued) gives
  (prompt tokens, cached tokens, TTFT p50 − the KV hand-over the profile adds back, i.e. its kvTransfer);
* decode: every warm point gives (mean requests in their decode phase per decode rank, their mean context, mean
  time per output token): the client measures the first → last token of each request, so the batch is
  time-averaged by Little's law from what it saw, not read from the engines;
* the layout (parallelism, GPUs per replica, DP ranks, --max-num-seqs) comes from the records' system facts, the
  cold start from the engines' measured pod created → Ready; what the records cannot say (KV-cache capacity,
  tokens per step, KV hand-over) from the shipped profile of the same serving profile and GPU (``base``).

A prefill replica may run several prompts at once (vLLM batches chunks; the simulators run max-num-seqs at a
time, each slower): the planner models it as ``dataParallelSize`` serial queues. The records estimate those
serial-equivalent slots as the most prefill work per second any point kept a replica busy with (requests/s per
prefill replica × the fitted unqueued prefill seconds at that point's prompt), which is the capacity at a
point that saturated prefill and a lower bound below it; the profile takes the divisor of gpusPerReplica nearest
to it, never below the rendered DP ranks (``prefill_slots``: include a point that saturates prefill).

``held_out`` names a load ("concurrency=8", "rate=2") whose points are left out of the fit and predicted instead.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

from v41flash.planner.profile import CapacityProfile


def load_key(r: dict) -> str:
    ld = r["workload"]["load"]
    return f"{ld['kind']}={ld['value']:g}"


def _layout(role: dict) -> tuple[dict, int | None]:
    dp = int(role.get("dp") or 1)
    label = f"DEP{role['tp'] * dp}" if dp > 1 else f"TP{role['tp']}"
    out = {"parallelism": label, "gpusPerReplica": int(role["gpus_per_replica"]), "dataParallelSize": dp}
    mns = (role.get("args") or {}).get("--max-num-seqs")
    return out, (int(mns) if mns else None)


def prefill_points(records: Sequence[dict], kv_seconds) -> list[dict]:
    pts = []
    for r in records:
        f = r["figures"]
        ld = r["workload"]["load"]
        if r["state"] != "warm" or ld["kind"] != "concurrency" or ld["value"] != 1:
            continue
        ttft = f["latency"]["ttft_s"].get("p50")
        n = f["requests"]["succeeded"]
        if not ttft or not n:
            continue
        isl = f["tokens"]["input"]["mean"]
        cached = f["throughput"]["cached_tokens_per_s"] / f["throughput"]["requests_per_s"]
        pts.append({"isl": isl, "cachedTokens": cached, "concurrency": 1,
                    "ttftSeconds": max(1e-6, ttft - kv_seconds(isl - cached))})
    return pts


def decode_points(records: Sequence[dict]) -> list[dict]:
    pts = []
    for r in records:
        fit, lat = r["figures"]["fit"], r["figures"]["latency"]
        if r["state"] != "warm" or not fit.get("decode_batch_per_rank") or not lat["itl_s"].get("mean"):
            continue
        pts.append({"batch": fit["decode_batch_per_rank"], "context": fit["decode_context"],
                    "itlSeconds": lat["itl_s"]["mean"], "load": load_key(r)})
    return pts


def run_from_records(records: Sequence[dict], *, held_out: str | None = None, name: str | None = None) -> dict:
    from v41flash.planner.profile import find_profile

    if not records:
        raise ValueError("no records")
    systems = {(r["system"].get("serving_profile"), r["system"].get("gpu_model")) for r in records}
    if len(systems) != 1:
        raise ValueError(f"records of {len(systems)} systems {sorted(map(str, systems))}: fit one system at a time")
    serving, gpu = next(iter(systems))
    if not serving or not gpu:
        raise ValueError("the records do not say the serving profile and GPU (a --url run): measure a deployment, "
                         "or declare --system serving_profile=low-latency --system gpu_model=H200 and roles")
    roles = records[0]["system"].get("roles") or {}
    base = find_profile(serving, gpu)
    if "decode" not in roles:  # a --url target: the layout is the shipped profile's, as the source says
        if base is None:
            raise ValueError("the records carry no decode layout (system.roles) and no shipped profile has one for "
                             f"{serving} on {gpu}")
        roles = {r: {"tp": int(getattr(base, r).parallelism.removeprefix("TP")) if getattr(base, r).parallelism
                     .startswith("TP") else 1, "dp": getattr(base, r).data_parallel_size,
                     "gpus_per_replica": getattr(base, r).gpus_per_replica, "replicas_ready": 1,
                     "args": {"--max-num-seqs": str(base.decode.max_num_seqs)} if r == "decode" else {}}
                 for r in ("prefill", "decode")}
    kv = base.kv_transfer if base is not None else None
    disagg = bool(records[0]["system"].get("disaggregated"))
    kv_seconds = (lambda toks: kv.seconds(toks)) if (kv is not None and disagg) else (lambda toks: 0.0)
    fit_on = [r for r in records if held_out is None or load_key(r) != held_out]
    if held_out is not None and len(fit_on) == len(records):
        raise ValueError(f"--hold-out {held_out}: no record at that load (loads: "
                         f"{', '.join(sorted({load_key(r) for r in records}))})")
    run: dict = {"name": name or f"{gpu.lower()}-{serving}-measured", "servingProfile": serving, "gpuProduct": gpu,
                 "run": f"bench serve run {records[0]['run']} ({len(fit_on)} points"
                        + (f", {held_out} held out" if held_out else "") + ")"}
    cold = (records[0]["target"].get("engine_cold_start") or {}).get("median_s")
    for role in ("prefill", "decode"):
        layout, mns = _layout(roles.get(role) or roles["decode"])
        section = dict(layout)
        if cold:
            section["coldStartSeconds"] = max(1.0, float(cold))
        if role == "decode" and mns:
            section["maxNumSeqs"] = mns
        pts = prefill_points(fit_on, kv_seconds) if role == "prefill" else \
            [{k: v for k, v in p.items() if k != "load"} for p in decode_points(fit_on)]
        if pts:
            section["points"] = pts
        run[role] = section
    slots = prefill_slots(run, fit_on, roles, disagg)
    if slots:
        run["prefillSlots"] = slots
        gpus_r = run["prefill"]["gpusPerReplica"]
        best = min((d for d in range(1, gpus_r + 1) if gpus_r % d == 0), key=lambda d: abs(d - slots["estimate"]))
        run["prefill"]["dataParallelSize"] = max(run["prefill"]["dataParallelSize"], best)
    if not run["prefill"].get("points") and not run["decode"].get("points"):
        raise ValueError("no point to fit: prefill needs a warm point at concurrency 1, decode any warm point "
                         "with a decode batch (a deployment target: its decode ranks come from the CR)")
    return run


def prefill_slots(run: dict, records: Sequence[dict], roles: dict, disagg: bool) -> dict | None:
    """The most serial-equivalent prefill slots a point kept busy per prefill replica (see the module docstring)."""
    from v41flash_bench.profiles.fit import fit_prefill
    pts = run["prefill"].get("points")
    if not pts:
        return None
    curve, _ = fit_prefill([(p["isl"] - p["cachedTokens"], p["cachedTokens"], p["ttftSeconds"]) for p in pts])
    best = None
    for r in records:
        f = r["figures"]
        replicas = ((r["system"].get("roles") or {}).get("prefill" if disagg else "decode") or {}).get("replicas_ready")
        if r["state"] != "warm" or not replicas or not f["requests"]["succeeded"]:
            continue
        cached = f["throughput"]["cached_tokens_per_s"] / f["throughput"]["requests_per_s"]
        new = f["tokens"]["input"]["mean"] - cached
        s = curve.overhead + curve.per_token * new + curve.per_token_context * new * (new + 2 * cached)
        busy = f["throughput"]["requests_per_s"] / replicas * s
        if best is None or busy > best["estimate"]:
            best = {"estimate": busy, "load": load_key(r)}
    return best


def check_held_out(profile: CapacityProfile, records: Sequence[dict], held_out: str) -> list[dict]:
    """Predicted against measured at the held-out load: decode ITL and output tokens/s per rank at the batch and
    context measured there; prefill TTFT where the load was concurrency 1."""
    out = []
    kv = profile.kv_transfer
    disagg = bool(records and records[0]["system"].get("disaggregated"))
    for p in decode_points([r for r in records if load_key(r) == held_out]):
        itl = profile.decode.itl_seconds(p["batch"], p["context"])
        out.append({"figure": "decode ITL (s)", "load": held_out, "predicted": itl, "measured": p["itlSeconds"]})
        out.append({"figure": "output tokens/s per decode rank", "load": held_out, "predicted": p["batch"] / itl,
                    "measured": p["batch"] / p["itlSeconds"]})
    for p in prefill_points([r for r in records if load_key(r) == held_out], lambda toks: 0.0):
        new = p["isl"] - p["cachedTokens"]
        pred = profile.prefill.request_seconds(new, p["cachedTokens"]) + (kv.seconds(new) if disagg else 0.0)
        out.append({"figure": "TTFT at concurrency 1 (s)", "load": held_out, "predicted": pred,
                    "measured": p["ttftSeconds"]})
    for row in out:
        row["error"] = row["predicted"] / row["measured"] - 1.0
    return out


def median_error(rows: Sequence[dict]) -> float | None:
    return statistics.median(abs(r["error"]) for r in rows) if rows else None
