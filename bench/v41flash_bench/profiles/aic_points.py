"""Sample aiconfigurator-core latency predictions into benchmark-run documents for `v41flash profile build`.

Runs only where PyPI ``aiconfigurator-core==0.12.0`` is installed (it is not a dependency of the operator):

    python bench/v41flash_bench/profiles/aic_points.py --out operator/v41flash/planner/profiles/derivation

aiconfigurator-core 0.12.0 models DeepSeek-V4-Flash (not V4.1-Flash); the differences and the
calibration applied on top are written down in docs/decisions/2026-11-30-capacity-profiles.md. Only the standard
library and aiconfigurator_core are imported here, so it runs in a separate virtualenv.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
SYSTEMS = {"H200": "h200_sxm", "B200": "b200_sxm", "B300": "b300_sxm", "GB300": "gb300"}
# V4-Flash MoE on Hopper has perf data only for FP8 block scaling; Blackwell uses the checkpoint's default
MOE_QUANT = {"H200": "fp8_block"}
COLD_START_S = {"single": 600, "multi": 900}  # documented estimates (weights load + autotune + graphs)
# aiconfigurator-core 0.12.0's Blackwell decode tables give a batch-1 step slower than H200's and slower
# than batch 32 (implausible for a bandwidth-bound step); decode there is taken from H200's curve scaled
# by the HBM bandwidth ratio instead (H200 4.8 TB/s vs 8 TB/s) — see the capacity-profiles doc.
DECODE_FROM_H200 = {"B200": 4.8 / 8.0, "B300": 4.8 / 8.0, "GB300": 4.8 / 8.0}
# DSpark drafting: mean tokens per decode step, calibrated so GB300 low-latency at batch 1 gives the
# published best interactivity of 599 tok/s/user (see the doc); a model property, the same on every GPU.
TOKENS_PER_STEP = 3.45
KV_TOKENS_PER_GPU = {"H200": 20_000_000, "B200": 35_000_000, "B300": 70_000_000, "GB300": 70_000_000}
MAX_NUM_SEQS = {"TP4": 128, "DEP2": 256, "DEP4": 256, "DEP16": 256}  # per rank
KV_SECONDS_PER_TOKEN = {"H200": 2.2e-8, "B200": 1.8e-8, "B300": 1.8e-8, "GB300": 9e-9}  # 890 B/token over NIXL

# (name suffix, serving profile, role layouts): layout = (label, tp, attention dp, moe tp, moe ep, gpus)
LAYOUTS = {
    "low-latency": ("low-latency", ("TP4", 4, 1, 4, 1, 4), ("TP4", 4, 1, 4, 1, 4)),
    "high-throughput": ("high-throughput", ("DEP2", 1, 2, 1, 2, 2), ("DEP2", 1, 2, 1, 2, 2)),
    "pd-dep4-dep16": ("high-throughput", ("DEP4", 1, 4, 1, 4, 4), ("DEP16", 1, 16, 1, 16, 16)),
}
# the API's high-throughput default on H200 is DEP4: two 141 GB GPUs cannot hold the weights
LAYOUT_OVERRIDES = {("H200", "high-throughput"): ("high-throughput", ("DEP4", 1, 4, 1, 4, 4), ("DEP4", 1, 4, 1, 4, 4))}
PREFILL_GRID = [(isl, 0) for isl in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)] + [
    (4096 + p, p) for p in (16384, 65536, 131072)
] + [(8192 + p, p) for p in (32768, 136000)]
DECODE_GRID = [(b, c) for b in (1, 4, 16, 32, 64, 128, 256) for c in (4096, 32768, 131072)]


def engine(gpu: str, layout: tuple, systems_path: str | None):
    from aiconfigurator_core.sdk.engine import EngineHandle

    _, tp, adp, mtp, mep, _ = layout
    kw = dict(tp_size=tp, attention_dp_size=adp, moe_tp_size=mtp, moe_ep_size=mep)
    if gpu in MOE_QUANT:
        kw["moe_quant_mode"] = MOE_QUANT[gpu]
    return EngineHandle.compile(MODEL, SYSTEMS[gpu], "vllm", systems_path=systems_path, **kw)


def run_doc(gpu: str, name: str, systems_path: str | None = None) -> dict:
    serving, pre, dec = LAYOUT_OVERRIDES.get((gpu, name), LAYOUTS[name])
    pe = engine(gpu, pre, systems_path)
    scale = DECODE_FROM_H200.get(gpu, 1.0)
    # per-rank decode layout on H200 for Blackwell: its own TP4, or H200's DEP4 ranks for any DEPn
    dec_src = dec if gpu not in DECODE_FROM_H200 else (
        LAYOUT_OVERRIDES[("H200", "high-throughput")][2] if dec[0].startswith("DEP") else dec)
    de = engine("H200" if gpu in DECODE_FROM_H200 else gpu, dec_src, systems_path)
    prefill_points = [
        {"isl": isl, "cachedTokens": cached, "ttftSeconds": pe.predict_prefill_latency(1, isl, cached) / 1000.0, "concurrency": 1}
        for isl, cached in PREFILL_GRID
    ]
    decode_points = [
        {"batch": b, "context": c, "stepSeconds": scale * de.decode_step_latency(b, c, 2) / 1000.0} for b, c in DECODE_GRID
    ]

    def role(layout, points):
        label, tp, adp, _, _, gpus = layout
        return {
            "parallelism": label,
            "gpusPerReplica": gpus,
            "dataParallelSize": adp,
            "coldStartSeconds": COLD_START_S["multi" if gpus > 8 else "single"],
            "points": points,
        }

    profile_name = f"{gpu.lower()}-{name}"
    return {
        "name": profile_name,
        "run": f"aiconfigurator-core 0.12.0 {MODEL} {SYSTEMS[gpu]} vllm",
        "servingProfile": serving,
        "gpuProduct": gpu,
        "prefill": role(pre, prefill_points),
        "decode": {
            **role(dec, decode_points),
            "tokensPerStep": TOKENS_PER_STEP,
            "maxNumSeqs": MAX_NUM_SEQS[dec[0]],
            "kvCacheTokens": KV_TOKENS_PER_GPU[gpu] * dec[5] // dec[2],
        },
        "kvTransfer": {"overheadSeconds": 0.003, "secondsPerToken": KV_SECONDS_PER_TOKEN[gpu]},
        "decodeSource": "aiconfigurator-core" if gpu not in DECODE_FROM_H200 else f"H200 {dec_src[0]} x {scale:.2f}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--systems-path", default=None)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    combos = [(g, n) for g in SYSTEMS for n in ("low-latency", "high-throughput")] + [("GB300", "pd-dep4-dep16")]
    for gpu, name in combos:
        try:
            doc = run_doc(gpu, name, args.systems_path)
        except Exception as exc:  # report and continue: one missing perf table must not hide the rest
            print(f"{gpu} {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        path = args.out / f"{doc['name']}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
