"""Run a scenario under every policy on the same workload, score the runs, write report.json + plots.

Scores (over [warmup, duration), requests bucketed by arrival minute):
- window attainment: share of 1-minute windows whose TTFT at the SLO percentile and p95 e2e both
  meet their targets (a request still unfinished when the simulation ends counts as infinitely slow);
- request attainment: share of requests meeting both targets;
- GPU-hours: replicas' GPUs × time from the moment they are requested (starting replicas count) to
  their removal; tokens per dollar: (cached + uncached prompt + output tokens) of the scored
  requests ÷ (GPU-hours × $/GPU-h) — the seed's unit;
- scale actions (changes of a role's replica count after warmup), peak and mean replicas per role,
  token-weighted prefix-cache hit rate.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import subprocess
import time
from concurrent.futures import Future, ProcessPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from v41flash import cron
from v41flash.planner.profile import CapacityProfile
from v41flash.roles import ROLES
from v41flash_bench.sim import oracle as oracle_mod
from v41flash_bench.sim.simulator import Simulator, SimulatorConfig
from v41flash_bench.sim.policies import (
    DynamoPolicy,
    HpaQueuePolicy,
    KedaPolicy,
    PlannerPolicy,
    PolicyContext,
    SchedulePolicy,
    StaticPolicy,
    operator_default_config,
    scenario_config,
    scenario_state,
)
from v41flash_bench.sim.scenario import HINDSIGHT, POLICIES, AutoscaleScenario, profiles
from v41flash_bench.sim.workload import Workload, build_workload


@dataclass
class RunResult:
    """What the report and the plots need from one simulation (small enough to cross processes)."""

    policy: str
    score: dict
    series: dict
    arr_t: list
    speed: dict
    stats: dict
    demand: object | None = None  # reference run only: the oracle's demand
    actions: list | None = None  # (t, role, from, to, the policy's reason)


def simulator_config(sc: AutoscaleScenario) -> SimulatorConfig:
    d = sc.deployment
    return SimulatorConfig(router=d.router, prefix_cache_tokens=d.prefix_cache_tokens,
                           **({"sticky_session_ttl_s": d.router_session_ttl_s} if d.router_session_ttl_s else {}))


def simulate(sc: AutoscaleScenario, wl: Workload, truth: CapacityProfile, policy, initial: dict[str, int],
             duration: float, starting: dict[str, list[float]] | None = None) -> tuple[Simulator, float]:
    bounds = {"prefill": tuple(sc.bounds.prefill), "decode": tuple(sc.bounds.decode)}
    sim = Simulator(wl, truth, policy, duration, initial, simulator_config(sc), bounds, starting)
    t, c = time.perf_counter(), time.process_time()
    sim.run()
    sim.cpu_s = time.process_time() - c  # CPU seconds of this run (the machine may be shared)
    return sim, time.perf_counter() - t


def minute_windows(sim: Simulator, sc: AutoscaleScenario, duration: float) -> list[dict]:
    """Per scored 1-minute window (by arrival): TTFT at the SLO percentile, p95 e2e, verdicts."""
    tel = sim.telemetry
    arrive = np.asarray(tel.arrive_t, dtype=float)
    ttft = np.asarray(tel.ttft, dtype=float)
    e2e = np.asarray(tel.e2e, dtype=float)
    if sim.inflight_requests:
        left = np.array([r.arrive for r in sim.inflight_requests.values()])
        arrive = np.concatenate([arrive, left])
        ttft = np.concatenate([ttft, np.full(len(left), np.inf)])
        e2e = np.concatenate([e2e, np.full(len(left), np.inf)])
    slo = sc.slo
    w = slo.window_s
    out = []
    n = int(math.ceil((duration - sc.warmup_s) / w))
    idx = np.floor((arrive - sc.warmup_s) / w).astype(int)
    for i in range(n):
        m = idx == i
        if not m.any():
            continue
        t = np.sort(ttft[m])
        e = np.sort(e2e[m])
        tp = float(np.percentile(t, slo.ttft_percentile * 100)) if np.isfinite(t).all() else _q_inf(t, slo.ttft_percentile)
        ep = float(np.percentile(e, 95)) if np.isfinite(e).all() else _q_inf(e, 0.95)
        out.append({"start": sc.warmup_s + i * w, "requests": int(m.sum()), "ttft": tp, "e2e_p95": ep,
                    "ttft_ok": tp <= slo.ttft_s, "e2e_ok": ep <= slo.e2e_p95_s})
    return out


def _q_inf(sorted_vals: np.ndarray, q: float) -> float:
    """Nearest-rank quantile that tolerates infinities."""
    k = min(len(sorted_vals) - 1, int(math.ceil(q * len(sorted_vals))) - 1)
    return float(sorted_vals[max(0, k)])


def in_schedule(sc: AutoscaleScenario, start: float, length: float, not_before: float = -math.inf) -> bool:
    """Whether the minute [start, start + length) lies inside one of the scenario's scheduled windows (one that
    starts at ``not_before`` or later: simulated seconds)."""
    for w in sc.schedules:
        s = cron.last_start(w.cron, w.time_zone, sc.epoch_s + start)
        if s is not None and sc.epoch_s + start + length <= s + w.duration_seconds and s - sc.epoch_s >= not_before:
            return True
    return False


def score(sim: Simulator, sc: AutoscaleScenario, duration: float) -> dict:
    tel, slo = sim.telemetry, sc.slo
    windows = minute_windows(sim, sc, duration)
    arrive = np.asarray(tel.arrive_t, dtype=float)
    scored = (arrive >= sc.warmup_s) & (arrive < duration)
    ttft = np.asarray(tel.ttft)[scored]
    e2e = np.asarray(tel.e2e)[scored]
    prompt = np.asarray(tel.prompt, dtype=float)[scored]
    cached = np.asarray(tel.cached, dtype=float)[scored]
    out = np.asarray(tel.out, dtype=float)[scored]
    unfinished = sum(1 for r in sim.inflight_requests.values() if sc.warmup_s <= r.arrive < duration)
    both = int(((ttft <= slo.ttft_s) & (e2e <= slo.e2e_p95_s)).sum())
    total = len(ttft) + unfinished
    gs = sim.gpu_seconds(sc.warmup_s, duration)
    gpu_h = sum(gs.values()) / 3600.0
    tokens = float(prompt.sum() + out.sum())
    series = tel.series
    t = np.asarray(series["t"])
    keep = t >= sc.warmup_s
    peak, mean = {}, {}
    for role in ROLES:
        active = np.asarray(series[f"{role}_ready"]) + np.asarray(series[f"{role}_starting"])
        peak[role] = int(active[keep].max()) if keep.any() else 0
        mean[role] = float(active[keep].mean()) if keep.any() else 0.0
    actions = [a for a in tel.actions if a[0] >= sc.warmup_s]
    ok_windows = sum(1 for w in windows if w["ttft_ok"] and w["e2e_ok"])
    inside = [w for w in windows if in_schedule(sc, w["start"], sc.slo.window_s)]
    # ... of windows that start at least one cold start and one decision after t = 0: the run begins with the
    # replicas the oracle sized for t = 0, so a window sooner than that could not be prepared by any policy
    lead = max(getattr(sim.truth, r).cold_start_seconds for r in ROLES) + 30.0
    prepared = [w for w in inside if in_schedule(sc, w["start"], sc.slo.window_s, not_before=lead)]
    return {
        "windows": len(windows),
        "windows_ok": ok_windows,
        "window_attainment": ok_windows / len(windows) if windows else None,
        # the scored minutes inside a scheduled window (null: the scenario has no schedules, or none falls in), and
        # of those inside a window starting a cold start (+ a decision) or more after the run began
        "scheduled_windows": len(inside) if sc.schedules else None,
        "scheduled_window_attainment_all": (sum(1 for w in inside if w["ttft_ok"] and w["e2e_ok"]) / len(inside)
                                            if inside else None),
        "scheduled_window_attainment": (sum(1 for w in prepared if w["ttft_ok"] and w["e2e_ok"]) / len(prepared)
                                        if prepared else None),
        "request_attainment": both / total if total else None,
        "requests": total,
        "unfinished": unfinished,
        "gpu_hours": gpu_h,
        "gpu_hours_by_role": {k: v / 3600.0 for k, v in gs.items()},
        "tokens_served": tokens,
        "tokens_per_dollar": tokens / (gpu_h * sc.cost_per_gpu_hour) if gpu_h > 0 else None,
        "tokens_counted": "cached + uncached prompt tokens + output tokens of scored, finished requests",
        "scale_actions": len(actions),
        "scale_actions_by_role": {r: sum(1 for a in actions if a[1] == r) for r in ROLES},
        "peak_replicas": peak,
        "mean_replicas": mean,
        "prefix_cache_hit_rate": float(cached.sum() / prompt.sum()) if prompt.sum() > 0 else None,
        "ttft_p": float(np.percentile(ttft, slo.ttft_percentile * 100)) if len(ttft) else None,
        "e2e_p95": float(np.percentile(e2e, 95)) if len(e2e) else None,
        "minute_windows": windows,
    }


def make_policy(name: str, ctx: PolicyContext, extra: dict):
    if name == "ours":
        # the operator's config for the scenario's spec (an ablation changes some knobs), its status at t = 0
        sc, overrides = _STATE.get("sc"), _STATE.get("planner_overrides", {})
        if sc is None:  # a policy made outside a benchmark run: the operator's defaults
            return PlannerPolicy(ctx, replace(operator_default_config(), **overrides))
        return PlannerPolicy(ctx, scenario_config(sc, overrides), scenario_state(sc))
    if name == "dynamo":
        return DynamoPolicy(ctx)
    if name == "keda":
        return KedaPolicy(ctx)
    if name == "hpa":
        return HpaQueuePolicy(ctx)
    if name == "static":
        return StaticPolicy(ctx, extra["static"])
    if name == "oracle":
        return SchedulePolicy(ctx, "oracle", extra["schedule"], extra["interval"], extra["lead"])
    if name == "ceiling":
        return SchedulePolicy(ctx, "ceiling", extra["schedule"], extra["interval"], {r: 0.0 for r in ROLES})
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


# Set in the parent before worker processes fork, so the workload is built once and shared.
_STATE: dict = {}


def _job(kind: str, name: str, arg, initial: dict[str, int]) -> RunResult:
    st = _STATE
    sc, wl, truth, duration = st["sc"], st["wl"], st["truth"], st["duration"]
    if kind == "reference":
        pol = StaticPolicy(st["truth_ctx"], arg)
    elif kind == "schedule":
        pol = SchedulePolicy(st["truth_ctx"], "oracle", arg, sc.oracle_interval_s, st["lead"])
    else:
        pol = make_policy(name, st["ctx"], arg)
    # what it ordered before t = 0 (its foresight, a cold start ahead: see run_benchmark's ``prestart``)
    starting = pol.prestart(initial, st["lead"]) if st.get("prestart", True) and hasattr(pol, "prestart") else None
    sim, wall = simulate(sc, wl, truth, pol, initial, duration, starting)
    tel = sim.telemetry
    stats = {}
    if tel.prompt:
        p, o = np.asarray(tel.prompt), np.asarray(tel.out)
        stats = {"input_tokens_p50": float(np.median(p)), "input_tokens_p90": float(np.percentile(p, 90)),
                 "output_tokens_p50": float(np.median(o)), "output_tokens_mean": float(o.mean())}
    return RunResult(
        policy=name, score=score(sim, sc, duration), series=tel.series, arr_t=tel.arr_t,
        speed=_speed(sim, wall, duration), stats=stats,
        demand=oracle_mod.demand_from_telemetry(tel) if kind == "reference" else None,
        actions=[(round(t, 1), role, a, b, note[:600]) for t, role, a, b, note in tel.actions],
    )


class _Pool:
    """Runs simulations in forked worker processes (or inline with jobs=1); results do not depend on it."""

    def __init__(self, jobs: int) -> None:
        self.ex = None
        if jobs > 1:
            self.ex = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))

    def submit(self, *args):
        if self.ex is None:
            res = _job(*args)
            f: Future = Future()
            f.set_result(res)
            return f
        return self.ex.submit(_job, *args)

    def close(self) -> None:
        if self.ex is not None:
            self.ex.shutdown()


def run_benchmark(sc: AutoscaleScenario, out_dir: Path, policies: tuple[str, ...] | None = None,
                  duration: float | None = None, progress: Callable[[str], None] = print,
                  base_dir: Path | None = None, plots: bool = True, jobs: int = 1,
                  planner_overrides: dict | None = None, ceiling_headroom: float = 1.0,
                  prestart: bool = True) -> dict:
    """Every selected policy on the same workload; returns (and writes) the report.

    ``prestart``: every policy with foresight (a season ours learned from the history in its status, the oracle's
    schedule) starts with the replicas it would have ordered before t = 0 still starting (``policy.prestart``):
    a long-running deployment's planner acted on its forecast before the scored run began.

    ``planner_overrides``: PlannerConfig fields to change for ``ours`` (ablations; recorded in the report).
    ``ceiling_headroom``: the no-foresight ceiling's standing headroom (``oracle.no_foresight``)."""
    oracle_mod.check_headroom(ceiling_headroom)
    duration = float(duration or sc.duration_s)
    policies = tuple(policies or sc.policies)
    truth, planner = profiles(sc, base_dir)
    slo = sc.slo.to_slo()
    t0 = time.perf_counter()
    wl = build_workload(sc.workload, sc.arrivals, duration, sc.seed)
    gen_s = time.perf_counter() - t0
    progress(f"workload: {len(wl.sessions)} sessions, {wl.total_requests()} requests planned "
             f"({gen_s:.1f}s); {'; '.join(wl.notes)}")
    bounds = {"prefill": tuple(sc.bounds.prefill), "decode": tuple(sc.bounds.decode)}
    ctx = PolicyContext(slo=slo, bounds=bounds, profile=planner, gpu_budget=sc.bounds.gpu_budget,
                        itl_target_s=slo.itl_s or _itl_target(sc))
    truth_ctx = PolicyContext(slo=slo, bounds=bounds, profile=truth, gpu_budget=sc.bounds.gpu_budget,
                              itl_target_s=ctx.itl_target_s)
    lead = {"prefill": truth.prefill.cold_start_seconds, "decode": truth.decode.cold_start_seconds}
    _STATE.clear()
    _STATE.update(sc=sc, wl=wl, truth=truth, duration=duration, ctx=ctx, truth_ctx=truth_ctx, lead=lead,
                  planner_overrides=dict(planner_overrides or {}), prestart=prestart)
    pool = _Pool(jobs)
    speed: dict[str, dict] = {}
    results: dict[str, RunResult] = {}
    oracle_info: dict = {}
    online = [p for p in policies if p not in HINDSIGHT]
    need_oracle = any(p in policies for p in HINDSIGHT) or sc.initial is None
    pending = {}
    try:
        initial = dict(sc.initial) if sc.initial else None
        if initial is not None:  # online policies do not wait for the oracle
            pending = {p: pool.submit("policy", p, {}, initial) for p in online}
        if need_oracle:
            # Reference run (generous static capacity) → demand → the oracle's schedule shape.
            ref_repl = {r: bounds[r][1] for r in ROLES}
            progress(f"reference run (static {ref_repl}) for the oracle's demand ...")
            ref = pool.submit("reference", "reference", ref_repl, ref_repl).result()
            speed["reference"] = ref.speed
            need = oracle_mod.present_need(truth, ref.demand, slo, duration, sc.oracle_interval_s, bounds)
            shape = oracle_mod.initial_schedule(need, truth, sc.oracle_interval_s)
            if initial is None:
                initial = {r: shape[r][0] for r in ROLES}
                pending = {p: pool.submit("policy", p, {}, initial) for p in online}
        if need_oracle and any(p in policies for p in HINDSIGHT):
            steps = []

            def record(label: str, res: RunResult) -> None:
                s_ = res.score
                steps.append({"step": label, "window_attainment": s_["window_attainment"], "gpu_hours": s_["gpu_hours"]})
                progress(f"oracle {label}: attainment {s_['window_attainment']:.3f}, {s_['gpu_hours']:.1f} GPU-h "
                         f"({res.speed['cpu_s']:.1f}s CPU)")

            # 1) the smallest prefill scale factor whose schedule meets the SLO in most windows
            #    (oracleGridAttainment): the grid simulated in parallel, then widened and bisected until it settles
            #    (oracle.settle_factor: the answer does not move with the grid)
            grid = {f: oracle_mod.scaled(shape, {"prefill": f}, bounds, sc.oracle_interval_s, lead)
                    for f in sc.oracle_factors}
            futs = {f: pool.submit("schedule", "oracle", sch, initial) for f, sch in grid.items()}
            trials = {round(f, 4): fut.result() for f, fut in futs.items()}
            for f in sorted(trials):
                record(f"scale {f:.2f}", trials[f])

            def attainment(f: float) -> float:
                if f not in trials:
                    grid[f] = oracle_mod.scaled(shape, {"prefill": f}, bounds, sc.oracle_interval_s, lead)
                    trials[f] = pool.submit("schedule", "oracle", grid[f], initial).result()
                    record(f"scale {f:.2f}", trials[f])
                return trials[f].score["window_attainment"] or 0.0

            grid = {round(f, 4): v for f, v in grid.items()}
            factor = oracle_mod.settle_factor(attainment, tuple(trials), sc.oracle_grid_attainment,
                                              sc.oracle_max_factor, sc.oracle_tolerance)
            schedule, orc = grid[factor], trials[factor]
            # 2) local fix-ups where 1-minute windows still fail
            for rnd in range(sc.oracle_rounds):
                failed = [(int(w["start"] // sc.oracle_interval_s), not w["ttft_ok"], not w["e2e_ok"])
                          for w in orc.score["minute_windows"] if not (w["ttft_ok"] and w["e2e_ok"])]
                if not failed:
                    break
                schedule = {r: list(v) for r, v in schedule.items()}
                oracle_mod.bump_failures(schedule, failed, bounds)
                for r in ROLES:
                    schedule[r] = oracle_mod.keep_through_gaps(schedule[r], sc.oracle_interval_s, lead[r])
                orc = pool.submit("schedule", "oracle", schedule, initial).result()
                record(f"fix-up {rnd + 1}", orc)
            speed["oracle"] = orc.speed
            if "oracle" in policies:
                results["oracle"] = orc
            static = {r: max(schedule[r]) for r in ROLES}
            if "static" in policies:
                progress(f"static at the oracle's peak {static} ...")
                pending["static"] = pool.submit("policy", "static", {"static": static}, static)
            oracle_info = {"interval_s": sc.oracle_interval_s, "prefill_scale": factor, "steps": steps,
                           "schedule": schedule, "pooled_shape": shape,
                           "pooled_lower_bound_gpu_hours": _schedule_gpu_hours(shape, truth, sc, duration),
                           "method": oracle_mod.__doc__.strip()}
            if "ceiling" in policies:
                ceiling = oracle_mod.no_foresight(need, {"prefill": factor}, ceiling_headroom, bounds)
                progress(f"no-foresight ceiling ×{ceiling_headroom:g}, peak {({r: max(v) for r, v in ceiling.items()})} ...")
                # it starts where the online policies start, and orders its first interval's need at once
                pending["ceiling"] = pool.submit("policy", "ceiling", {"schedule": ceiling, "interval": sc.oracle_interval_s},
                                                 initial)
                oracle_info["ceiling"] = {"headroom": ceiling_headroom, "schedule": ceiling,
                                          "method": oracle_mod.no_foresight.__doc__.strip()}
        for name, fut in pending.items():
            res = fut.result()
            results[name] = res
            speed[name] = res.speed
            s = res.score
            progress(f"{name}: attainment {s['window_attainment']:.3f}, {s['gpu_hours']:.1f} GPU-h "
                     f"({res.speed['cpu_s']:.1f}s CPU, {res.speed['requests_per_cpu_s']:.0f} req/CPU-s)")
    finally:
        pool.close()

    order = [p for p in POLICIES if p in results]
    stats = {"sessions": len(wl.sessions), "planned_requests": wl.total_requests(), "notes": list(wl.notes)}
    if order:
        stats.update(results[order[0]].stats)
    report = {
        "scenario": sc.model_dump(mode="json", by_alias=True),
        "duration_s": duration,
        "initial_replicas": initial,
        "profiles": {"truth": truth.metadata.name, "planner": planner.metadata.name,
                     "planner_profile_error": sc.deployment.planner_profile_error},
        "workload": stats,
        "planner_overrides": dict(planner_overrides or {}),
        "prestart": prestart,
        "policies": {p: {k: v for k, v in results[p].score.items() if k != "minute_windows"} for p in order},
        "minute_windows": {p: results[p].score["minute_windows"] for p in order},
        "scale_actions": {p: results[p].actions for p in order},
        "relative": _relative(results),
        "oracle": oracle_info,
        "simulator_speed": speed,
        "code_version": _code_version(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=_json_default))
    if plots:
        from v41flash_bench.sim.plots import write_plots

        write_plots(out_dir, sc, {p: results[p] for p in order}, duration)
    return report


def _schedule_gpu_hours(schedule: dict[str, list[int]], truth: CapacityProfile, sc: AutoscaleScenario, duration: float) -> float:
    """GPU-hours of a per-interval schedule over the scored time, with no start-up or drain time: with
    the perfectly pooled prefill shape, a floor no cache-affine deployment reaches (not simulated)."""
    total = 0.0
    for role in ROLES:
        gpus = getattr(truth, role).gpus_per_replica
        for i, n in enumerate(schedule[role]):
            a, b = max(sc.warmup_s, i * sc.oracle_interval_s), min(duration, (i + 1) * sc.oracle_interval_s)
            if b > a:
                total += n * gpus * (b - a)
    return total / 3600.0


def _code_version() -> dict:
    """The checkout the run used (the planner evolves; a table is only comparable at one commit)."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "operator/v41flash", "bench/v41flash_bench"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": commit, "uncommitted_changes": bool(dirty)}


def _itl_target(sc: AutoscaleScenario) -> float:
    # Dynamo takes an ITL SLA as input: the e2e budget after TTFT spread over a long (p95) answer.
    p95_out = sc.workload.output_tokens.median * math.exp(1.645 * sc.workload.output_tokens.sigma) \
        if hasattr(sc.workload, "output_tokens") else 2000.0
    return max(1e-3, (sc.slo.e2e_p95_s - sc.slo.ttft_s) / p95_out)


def _speed(sim: Simulator, wall: float, duration: float) -> dict:
    n = sim.requests_finished
    cpu = getattr(sim, "cpu_s", wall)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "requests": n, "simulated_s": duration,
            "requests_per_cpu_s": round(n / cpu, 1) if cpu > 0 else None,
            "mean_req_per_simulated_s": round(n / duration, 1)}


def _relative(results: dict[str, RunResult]) -> dict:
    if "ours" not in results:
        return {}
    ours = results["ours"].score["gpu_hours"]
    out = {}
    for p, r in results.items():
        g = r.score["gpu_hours"]
        if p != "ours" and g > 0:
            out[f"ours_gpu_hours_vs_{p}"] = ours / g
    return out


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, float) and math.isinf(o):
        return None
    raise TypeError(type(o))


def format_table(report: dict) -> str:
    rows = [("policy", "win-SLO", "req-SLO", "GPU-h", "vs ours", "Mtok/$", "actions", "peak P/D", "mean P/D",
             "hit", "TTFT-p", "e2e p95")]
    ours = report["policies"].get("ours", {}).get("gpu_hours")
    for p, s in report["policies"].items():
        rows.append((
            p, _pc(s["window_attainment"]), _pc(s["request_attainment"]), f"{s['gpu_hours']:.1f}",
            f"{ours / s['gpu_hours']:.2f}" if ours and s["gpu_hours"] else "-",
            f"{(s['tokens_per_dollar'] or 0) / 1e6:.2f}", str(s["scale_actions"]),
            f"{s['peak_replicas']['prefill']}/{s['peak_replicas']['decode']}",
            f"{s['mean_replicas']['prefill']:.1f}/{s['mean_replicas']['decode']:.1f}",
            _pc(s["prefix_cache_hit_rate"]), _sec(s["ttft_p"]), _sec(s["e2e_p95"]),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pc(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _sec(x) -> str:
    return "-" if x is None else ("inf" if math.isinf(x) else f"{x:.2f}s")
