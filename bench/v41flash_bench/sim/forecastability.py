"""How much of the load one cold start ahead is visible now: the bound on any forecast from live sessions.

`v41flash bench forecastability --suite tune --seeds 1-48 --out DIR` draws the suite's scenarios, simulates each
workload on its reference capacity (every role at its upper bound, as for the oracle's reference run: the
demand unthrottled by too little capacity) and, every ``step_s`` from the end of the warm-up, compares the
arrivals one horizon ahead (H = the cold start + one decision interval: what a replica ordered now misses) with
what is known at that moment:

- **known share**: of the requests in the busiest minute of (t, t + H], the share sent by sessions that had sent
  a request by t (sub-agents count with their root session, as the session proxy keys them). A forecast built
  from the sessions live at t can foresee at most this share; the rest comes from sessions not started yet.
- **under-forecast**: how often the busiest minute's arrival rate is more than ``under_margin`` above a
  predictor, for ``now`` (the last minute's arrival rate) and ``sessions`` (now × the live sessions projected one
  horizon ahead as an M/G/∞ queue: S·e^(−H/τ) + λ·τ·(1 − e^(−H/τ)), λ the new sessions per second of the last
  two minutes, τ = S ÷ the sessions going idle per second; a session is live while it sent a request within
  ``idle_s``; never below ``now``). The busiest minute is the busiest of the whole minutes (t, t + 60], (t + 60,
  t + 120], … that end by t + H.

Prints one row per scenario and per family and writes DIR/report.json. Tuning seeds only, unless the point is a
report: it reads the workloads, not the planner, but a held-out set looked at this way is a held-out set no more.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from v41flash.roles import ROLES

UNDER_MARGIN = 0.10  # a future peak more than this above the predictor counts as under-forecast
IDLE_S = 120.0  # a session with no request for this long counts as gone (think times are capped at 60 s)
STEP_S = 30.0  # one decision interval


@dataclass(frozen=True)
class Visibility:
    times: np.ndarray  # decision times
    now: np.ndarray  # arrivals per second over the last minute
    future_peak: np.ndarray  # the busiest minute's arrivals per second over (t, t + H]
    known: np.ndarray  # of that minute's requests, the share from sessions seen by t
    sessions: np.ndarray  # the M/G/∞ projection of the live sessions, as a rate (see the module docstring)


def visibility(arrive: np.ndarray, root: np.ndarray, horizon_s: float, start_s: float, end_s: float,
               step_s: float = STEP_S, idle_s: float = IDLE_S) -> Visibility:
    """Per decision time in [start_s, end_s − horizon_s]: the figures of the module docstring.

    ``arrive``: every request's arrival time; ``root``: its root session's id (same length)."""
    order = np.argsort(arrive, kind="stable")
    arrive, root = np.asarray(arrive, float)[order], np.asarray(root)[order]
    uniq, inv = np.unique(root, return_inverse=True)
    first = np.full(len(uniq), np.inf)
    last = np.full(len(uniq), -np.inf)
    np.minimum.at(first, inv, arrive)
    np.maximum.at(last, inv, arrive)
    first_sorted, last_sorted = np.sort(first), np.sort(last)
    first_of_request = first[inv]

    def count(sorted_t: np.ndarray, lo: float, hi: float) -> int:  # values in (lo, hi]
        return int(np.searchsorted(sorted_t, hi, "right") - np.searchsorted(sorted_t, lo, "right"))

    rows = []
    t = start_s
    while t + horizon_s <= end_s:
        now = count(arrive, t - 60.0, t) / 60.0
        best, best_known = 0, 0
        u = t + 60.0
        while u <= t + horizon_s + 1e-9:
            a, b = np.searchsorted(arrive, u - 60.0, "right"), np.searchsorted(arrive, u, "right")
            if b - a > best:
                best, best_known = b - a, int((first_of_request[a:b] <= t).sum())
            u += 60.0
        a, b = np.searchsorted(arrive, t - idle_s, "right"), np.searchsorted(arrive, t, "right")
        live = len(np.unique(root[a:b]))
        new_rate = count(first_sorted, t - 120.0, t) / 120.0
        gone_rate = count(last_sorted, t - idle_s - 120.0, t - idle_s) / 120.0
        if live > 0:
            tau = max(live / max(gone_rate, 1e-3), step_s)
            decay = math.exp(-horizon_s / tau)
            projected = live * decay + new_rate * tau * (1.0 - decay)
            sessions = max(now, now * projected / live)
        else:
            sessions = now
        rows.append((t, now, best / 60.0, best_known / best if best else 1.0, sessions))
        t += step_s
    arr = np.array(rows, dtype=float).reshape(-1, 5)
    return Visibility(*(arr[:, i] for i in range(5)))


def summarize(v: Visibility, under_margin: float = UNDER_MARGIN) -> dict:
    if len(v.times) == 0:
        return {"decisions": 0}
    out = {"decisions": int(len(v.times)),
           "known_share_median": float(np.median(v.known)), "known_share_p10": float(np.percentile(v.known, 10))}
    for name, pred in (("now", v.now), ("sessions", v.sessions)):
        ratio = v.future_peak / np.maximum(pred, 1e-9)
        out[f"under_{name}"] = float(np.mean(ratio > 1.0 + under_margin))
        out[f"peak_over_{name}_p90"] = float(np.percentile(ratio, 90))
    return out


def _roots(sessions) -> dict[int, int]:
    """Session id → its root session's id (sub-agents with their parent)."""
    out: dict[int, int] = {}
    stack = [(s, s.sid) for s in sessions]
    while stack:
        s, r = stack.pop()
        out[s.sid] = r
        for kids in s.children.values():
            stack.extend((c, r) for c in kids)
    return out


def scenario_visibility(family: str, sc) -> dict:
    """Simulate ``sc``'s workload on the reference capacity and summarize it."""
    from v41flash_bench.sim.autoscale_bench import _itl_target, simulate
    from v41flash_bench.sim.policies import PolicyContext, StaticPolicy
    from v41flash_bench.sim.scenario import profiles
    from v41flash_bench.sim.workload import build_workload

    truth, _ = profiles(sc, None)
    duration = float(sc.duration_s)
    wl = build_workload(sc.workload, sc.arrivals, duration, sc.seed)
    bounds = {r: tuple(getattr(sc.bounds, r)) for r in ROLES}
    ref = {r: bounds[r][1] for r in ROLES}
    slo = sc.slo.to_slo()
    ctx = PolicyContext(slo=slo, bounds=bounds, profile=truth, gpu_budget=sc.bounds.gpu_budget,
                        itl_target_s=slo.itl_s or _itl_target(sc))
    sim, _ = simulate(sc, wl, truth, StaticPolicy(ctx, ref), ref, duration)
    tel = sim.telemetry
    roots = _roots(wl.sessions)
    horizon = truth.prefill.cold_start_seconds + STEP_S
    v = visibility(np.asarray(tel.arrive_t), np.array([roots.get(s, s) for s in tel.sid]), horizon,
                   float(sc.warmup_s), duration)
    return {"scenario": sc.name, "family": family, "horizon_s": round(horizon, 1), **summarize(v)}


def _one(item):
    return scenario_visibility(*item)


def run(args: argparse.Namespace) -> int:
    from v41flash_bench.sim.suite import FAMILIES, HELD_OUT_SEEDS, TUNING_SEEDS, draw_suite, parse_seeds, seeds_text

    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        print(f"error: --seeds: {exc}", file=sys.stderr)
        return 2
    drawn = draw_suite(seeds, args.suite)
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("fork")) as ex:
            rows = list(ex.map(_one, drawn))
    else:
        rows = [_one(x) for x in drawn]
    cols = ("known_share_median", "known_share_p10", "under_now", "under_sessions")
    lines = ["| scenario | H (s) | known share: median / p10 | under-forecast: now / sessions |", "|---|---|---|---|"]
    for r in rows:
        if r["decisions"]:
            lines.append(f"| {r['scenario']} | {r['horizon_s']:.0f} | {r['known_share_median']:.2f} / "
                         f"{r['known_share_p10']:.2f} | {r['under_now'] * 100:.0f} % / {r['under_sessions'] * 100:.0f} % |")
    families = {}
    for f in (*FAMILIES, "overall"):
        sel = [r for r in rows if r["decisions"] and (f == "overall" or r["family"] == f)]
        if sel:
            families[f] = {c: float(np.median([r[c] for r in sel])) for c in cols} | {"n": len(sel)}
    lines += ["", "| family | n | known share (median of medians / of p10s) | under-forecast (median): now / sessions |",
              "|---|---|---|---|"]
    for f, d in families.items():
        lines.append(f"| {f} | {d['n']} | {d['known_share_median']:.2f} / {d['known_share_p10']:.2f} | "
                     f"{d['under_now'] * 100:.0f} % / {d['under_sessions'] * 100:.0f} % |")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"suite": args.suite, "seeds": seeds_text(seeds), "tuning_seeds": seeds_text(TUNING_SEEDS),
              "held_out_seeds": seeds_text(HELD_OUT_SEEDS), "under_margin": UNDER_MARGIN, "idle_s": IDLE_S,
              "step_s": STEP_S, "scenarios": rows, "families": families}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"report: {out / 'report.json'}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("forecastability", help="How much of the load one cold start ahead the live sessions show.",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="tune", help="suite name (scenario names; default: %(default)s)")
    p.add_argument("--seeds", required=True, help="suite seeds: 'A-B' or a comma list")
    p.add_argument("--out", required=True, help="output directory (report.json)")
    p.add_argument("--jobs", type=int, default=2, help="scenarios simulated in parallel (default: %(default)s)")
    p.set_defaults(func=run)
