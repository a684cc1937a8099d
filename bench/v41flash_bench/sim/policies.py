"""Autoscaling policies compared by the benchmark. Each returns desired replicas per role.

- ``ours``: the real ``v41flash.planner.plan`` fed simulated ``WindowFigures`` at the operator cadence.
- ``dynamo``: Dynamo Planner, SLA mode: a throughput loop every 180 s (predictor + profile
  interpolation with correction factors) that sets a floor, and a load loop every 5 s (±1 replica when
  every engine's regression-predicted TTFT/ITL is above the SLA, or all are below 0.8 × SLA).
- ``keda``: the llm-d/KEDA recipe: prefill on in-flight (uncached) prompt tokens ÷ peak prefill
  throughput with threshold = TTFT budget in seconds; decode on the sum of KV-cache usage with
  threshold 0.8; the HPA algorithm applies (10 % tolerance, 300 s scale-down stabilization).
- ``hpa``: HPA proportional on queue depth (waiting requests per replica), 300 s scale-down window.
- ``static``: fixed replicas (the benchmark uses the oracle's peak).
- ``oracle``: a precomputed schedule (see ``oracle.py``), requested a cold start ahead.
- ``ceiling``: the no-foresight ceiling (``oracle.no_foresight``): the oracle's per-minute need known exactly as
  each minute starts, the highest so far held (× a standing headroom), requested with no lead: what perfect
  knowledge of the present buys without a forecast (the windows it misses are the cost of reacting).

Every policy clamps its answer to the scenario's bounds and GPU budget itself (tests check it).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from v41flash.planner.plan import plan as planner_plan
from v41flash.planner.profile import CapacityProfile
from v41flash.api.v1alpha1 import AutoscalingSpec
from v41flash.planner import seasonal
from v41flash.planner.datatypes import Bounds, PlannerConfig, PlannerState, RoleBounds, Slo
from v41flash.planner.schedule import Window
from v41flash.roles import ROLES
from v41flash_bench.sim.telemetry import observation, role_gauges, window_figures


@dataclass(frozen=True)
class PolicyContext:
    """What every policy is told: the SLO, bounds, and its (possibly wrong) capacity profile."""

    slo: Slo
    bounds: dict[str, tuple[int, int]]  # role → (min, max)
    profile: CapacityProfile  # the policy's model of the hardware (not the simulator's truth)
    gpu_budget: int | None = None
    itl_target_s: float = 0.05  # for baselines that need an explicit ITL SLA (Dynamo)

    def clamp(self, desired: dict[str, int]) -> dict[str, int]:
        out = {}
        for role in ROLES:
            lo, hi = self.bounds[role]
            out[role] = max(lo, min(hi, int(desired[role])))
        if self.gpu_budget is not None:
            gp, gd = self.profile.prefill.gpus_per_replica, self.profile.decode.gpus_per_replica
            while out["prefill"] * gp + out["decode"] * gd > self.gpu_budget:
                # trim the role with more GPUs first, never below its minimum
                role = "prefill" if out["prefill"] * gp >= out["decode"] * gd else "decode"
                other = "decode" if role == "prefill" else "prefill"
                if out[role] > self.bounds[role][0]:
                    out[role] -= 1
                elif out[other] > self.bounds[other][0]:
                    out[other] -= 1
                else:
                    break
        return out


def _current(view) -> dict[str, int]:
    return {role: view.count(role) for role in ROLES}


class StaticPolicy:
    name = "static"
    interval_s = 60.0

    def __init__(self, ctx: PolicyContext, replicas: dict[str, int]) -> None:
        self.ctx = ctx
        self.replicas = ctx.clamp(replicas)
        self.last_note = "static"

    def decide(self, now, view):
        return dict(self.replicas)


class SchedulePolicy:
    """Replays a per-interval replica schedule, requesting each replica ``lead_s`` ahead of need."""

    def __init__(self, ctx: PolicyContext, name: str, schedule: dict[str, list[int]], interval_s: float,
                 lead_s: dict[str, float], tick_s: float = 10.0) -> None:
        self.ctx = ctx
        self.name = name
        self.schedule = schedule
        self.step = interval_s
        self.lead = lead_s
        self.interval_s = tick_s
        self.last_note = name
        self.pre_until = {r: 0.0 for r in ROLES}  # what it ordered before t = 0 is held until then

    def at(self, role: str, t: float) -> int:
        s = self.schedule[role]
        return s[min(len(s) - 1, max(0, int(t // self.step)))]

    def prestart(self, initial: dict[str, int], cold_s: dict[str, float]) -> dict[str, list[float]]:
        """The replicas it had ordered before t = 0 (a schedule known in advance, ordered ``lead_s`` ahead as
        during the run): those its schedule needs within the first lead, each Ready when its interval begins.
        Nothing for a policy without a lead (the no-foresight ceiling)."""
        out: dict[str, list[float]] = {}
        for r in ROLES:
            lead = self.lead[r]
            if lead <= 0:
                continue
            have, ready = initial[r], []
            j = 1
            while j * self.step < lead:
                want = self.ctx.clamp({**initial, r: self.at(r, j * self.step)})[r]
                if want > have:
                    ready += [j * self.step] * (want - have)
                    have = want
                j += 1
            if ready:
                out[r] = ready
                self.pre_until[r] = lead
        return out

    def decide(self, now, view):
        want = {r: max(self.at(r, now), self.at(r, now + self.lead[r])) for r in ROLES}
        for r in ROLES:
            if now < self.pre_until[r]:  # replicas ordered before t = 0 for a later interval: keep them coming
                u = now
                while u < self.pre_until[r]:
                    want[r] = max(want[r], self.at(r, u))
                    u += self.step
        return self.ctx.clamp(want)


def operator_default_config(a: AutoscalingSpec | None = None) -> PlannerConfig:
    """What the operator runs for a V41FlashDeployment's spec.autoscaling (default: the defaults)."""
    a = a or AutoscalingSpec()
    return PlannerConfig.for_spec(a.interval_seconds, a.scale_down_stabilization_seconds,
                                  a.scale_up_stabilization_seconds, a.moved_sessions_hold_seconds,
                                  tuple(Window.from_spec(w) for w in a.schedules), a.forecast.quantile,
                                  a.outage_memory_seconds)


def scenario_config(sc, overrides: dict | None = None) -> PlannerConfig:
    """Ours for a scenario: the operator's config for its spec.autoscaling.schedules, on the scenario's clock (its
    epoch), with the season at the scenario's compressed day and week when it has a history (``overrides``: an
    ablation's PlannerConfig fields)."""
    cfg = operator_default_config(AutoscalingSpec(schedules=list(sc.schedules))).with_knobs(epoch_s=sc.epoch_s)
    if sc.history is not None:
        h = sc.history
        keep = int(math.ceil((h.span_s + sc.duration_s) / h.bucket_s)) + 1
        cfg = cfg.with_knobs(season_bucket_s=h.bucket_s, season_periods_s=tuple(h.season_periods_s), season_keep=keep)
    return cfg.with_knobs(**(overrides or {}))


def scenario_state(sc) -> PlannerState:
    """The planner's memory at t = 0: empty, or the scenario's demand history as status would hold it."""
    if sc.history is None:
        return PlannerState()
    from v41flash_bench.sim.workload import AgentSessionSpec, past_demand
    if not isinstance(sc.workload, AgentSessionSpec):
        raise ValueError("history: only agentx workloads have a shape to take a past from")
    h = sc.history
    rates = past_demand(sc.workload, sc.arrivals, sc.seed, -h.span_s, h.bucket_s, h.noise_cv, sc.duration_s,
                        h.shift_s)
    rates = [r * h.level for r in rates]
    return PlannerState(season=seasonal.seeded(h.bucket_s, -h.span_s, rates))


class PlannerPolicy:
    """Ours: the operator's planner, called like the controller calls it."""

    name = "ours"

    def __init__(self, ctx: PolicyContext, config: PlannerConfig | None = None,
                 state: PlannerState | None = None) -> None:
        self.ctx = ctx
        self.config = config or operator_default_config()
        self.interval_s = self.config.interval_s
        self.state = state or PlannerState()
        lo_p, hi_p = ctx.bounds["prefill"]
        lo_d, hi_d = ctx.bounds["decode"]
        self.bounds = Bounds(
            prefill=RoleBounds(min_replicas=lo_p, max_replicas=hi_p),
            decode=RoleBounds(min_replicas=lo_d, max_replicas=hi_d),
            gpu_budget=ctx.gpu_budget,
        )
        self.last_note = ""
        self.decisions: list = []

    def prestart(self, initial: dict[str, int], cold_s: dict[str, float]) -> dict[str, list[float]]:
        """The replicas a long-running planner had ordered before t = 0 on its learned season.

        Replayed at its decision times t' in [−cold start, 0): the season fitted to the history closed by t' (what
        status held then), its forecast over the part of [t', t' + cold start + interval] from t = 0 on, and the
        fleet at t = 0 (``initial``: sized for the demand at t = 0) scaled by that forecast ÷ the forecast for the
        first interval at t = 0 — the season's shape, with its level and headroom cancelling. A replica ordered at
        t' is Ready at t' + cold start (``cold_s``: what the planner measures at t = 0). No season, no orders."""
        cfg = self.config
        h = self.state.season
        out: dict[str, list[float]] = {}
        if cfg.foresight.forecast_quantile <= 0 or h.last is None:
            return out
        b = h.bucket_s
        for r in ROLES:
            cold = cold_s[r]
            horizon = cold + cfg.interval_s
            have, ready = initial[r], []
            t = -math.floor(cold / cfg.interval_s) * cfg.interval_s
            while t < 0:
                last = math.floor(t / b) - 1  # the buckets closed by t'
                past = seasonal.History(b, last, h.values[:max(0, len(h.values) - (h.last - last))]) \
                    if last < h.last else h
                model = seasonal.fit(past, horizon, cfg.foresight.season) if past.values else None
                ahead = seasonal.peak(past, model, 0.0, t + horizon, cfg.foresight.season) if model else None
                base = seasonal.peak(past, model, 0.0, cfg.interval_s, cfg.foresight.season) if model else None
                if ahead is not None and base is not None and base[0] > 0:
                    want = self.ctx.clamp({**initial, r: math.ceil(initial[r] * ahead[0] / base[0] - 1e-9)})[r]
                    if want > have:
                        ready += [t + cold] * (want - have)
                        have = want
                t += cfg.interval_s
            if ready:
                out[r] = [max(x, 1e-3) for x in ready]
        return out

    def decide(self, now, view):
        obs = observation(view.sim, self.ctx.slo.window_s, self.ctx.slo.ttft_percentile)
        d = planner_plan(obs, self.ctx.profile, self.ctx.slo, self.bounds, self.state, now, self.config)
        self.state = d.state
        self.last_note = " | ".join(f"{r.role}: {r.reason}" for r in d.roles())
        self.decisions.append((now, d.prefill.desired, d.decode.desired, d.prefill.correction, d.decode.correction))
        return self.ctx.clamp({"prefill": d.prefill.desired, "decode": d.decode.desired})


class _Kalman:
    """Local-level Kalman filter (Dynamo's 'kalman' load predictor): predicts the next value."""

    def __init__(self, q: float = 1.0, r: float = 4.0) -> None:
        self.x = None
        self.p = 1.0
        self.q, self.r = q, r

    def update(self, z: float) -> float:
        if self.x is None:
            self.x, self.p = z, 1.0
            return z
        p = self.p + self.q
        k = p / (p + self.r)
        self.x = self.x + k * (z - self.x)
        self.p = (1 - k) * p
        return self.x


class DynamoPolicy:
    """Dynamo Planner (SLA mode), as its docs and code describe it (see the module docstring)."""

    name = "dynamo"

    def __init__(self, ctx: PolicyContext, throughput_interval_s: float = 180.0, load_interval_s: float = 5.0,
                 predictor: str = "constant", regression_window: int = 60) -> None:
        self.ctx = ctx
        self.interval_s = load_interval_s
        self.throughput_interval_s = throughput_interval_s
        self.predictor = predictor
        self.preds = {k: _Kalman() for k in ("num_req", "isl", "osl")}
        self.next_throughput = 0.0
        self.floor: dict[str, int] | None = None  # until the first throughput loop: the initial replicas
        self.samples = {r: deque(maxlen=regression_window) for r in ROLES}  # (load x, latency y) per engine
        self.p_corr = 1.0
        self.d_corr = 1.0
        self.last_note = ""

    # --- profile interpolation (Dynamo's pre-deployment profiling results) ---
    def _prefill_thpt_per_gpu(self, isl: float) -> float:
        pp = self.ctx.profile.prefill
        return isl / pp.request_seconds(isl, 0.0) * pp.data_parallel_size / pp.gpus_per_replica

    def _expected_ttft(self, isl: float) -> float:
        return self.ctx.profile.prefill.request_seconds(isl, 0.0)

    def _decode_thpt_per_gpu(self, itl: float, ctx_len: float) -> float:
        dp = self.ctx.profile.decode
        b = dp.batch_at_itl(itl, ctx_len)
        if b < 1.0:
            b = 1.0
        return b * dp.data_parallel_size / dp.itl_seconds(b, ctx_len) / dp.gpus_per_replica

    def _throughput_loop(self, now, view) -> None:
        sim, slo = view.sim, self.ctx.slo
        w = self.throughput_interval_s
        dw = window_figures(sim, "decode", w, slo.ttft_percentile)
        pw = window_figures(sim, "prefill", w, slo.ttft_percentile)
        if dw.requests <= 0 or dw.mean_input_tokens is None:
            return
        num_req, isl, osl = dw.requests, dw.mean_input_tokens, dw.mean_output_tokens or 1.0
        # correction factors: observed vs profile-expected latency (Dynamo's planner_core)
        if pw.ttft_mean_s:
            self.p_corr = pw.ttft_mean_s / self._expected_ttft(isl)
        nd = max(1, view.count("decode"))
        conc = dw.request_rate / nd * (dw.e2e_mean_s or 0.0)
        if dw.itl_mean_s and conc > 0:
            dp = self.ctx.profile.decode
            self.d_corr = dw.itl_mean_s / dp.itl_seconds(conc / dp.data_parallel_size, isl + osl / 2)
        if self.predictor == "kalman":
            num_req = self.preds["num_req"].update(num_req)
            isl = self.preds["isl"].update(isl)
            osl = self.preds["osl"].update(osl)
        pp, dp = self.ctx.profile.prefill, self.ctx.profile.decode
        pred_prefill = num_req * isl / w * min(1.0, self.p_corr)
        n_p = math.ceil(pred_prefill / self._prefill_thpt_per_gpu(isl) / pp.gpus_per_replica)
        corrected_itl = self.ctx.itl_target_s / max(1e-6, self.d_corr)
        pred_decode = num_req * osl / w
        n_d = math.ceil(pred_decode / self._decode_thpt_per_gpu(corrected_itl, isl + osl / 2) / dp.gpus_per_replica)
        self.floor = self.ctx.clamp({"prefill": n_p, "decode": n_d})

    def _regress(self, role: str, x_now: list[float], target: float) -> tuple[bool, bool]:
        """Fit latency ≈ a + b·load on recent samples; (all engines above SLA, all below 0.8·SLA)."""
        pts = self.samples[role]
        if len(pts) < 5 or not x_now:
            return False, False
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        if np.ptp(x) > 0:
            b, a = np.polyfit(x, y, 1)
        else:
            a, b = float(y.mean()), 0.0
        pred = [a + b * xi for xi in x_now]
        return all(p > target for p in pred), all(p < 0.8 * target for p in pred)

    def decide(self, now, view):
        sim, slo = view.sim, self.ctx.slo
        if self.floor is None:
            self.floor = _current(view)
        if now >= self.next_throughput:
            self._throughput_loop(now, view)
            self.next_throughput = now + self.throughput_interval_s
        cur = _current(view)
        # per-engine load and the latest latency, as the load planner's regression samples
        pw = window_figures(sim, "prefill", 30.0, slo.ttft_percentile)
        dw = window_figures(sim, "decode", 30.0, slo.ttft_percentile)
        p_load = [sum(len(k.starts) for k in r.ranks) for r in sim.replicas["prefill"] if r.state == "ready"]
        d_load = [sum(k.n for k in r.ranks) for r in sim.replicas["decode"] if r.state == "ready"]
        if pw.ttft_s is not None and p_load:
            self.samples["prefill"].append((float(np.mean(p_load)), pw.ttft_s))
        if dw.itl_mean_s is not None and d_load:
            self.samples["decode"].append((float(np.mean(d_load)), dw.itl_mean_s))
        want = dict(cur)
        up, down = self._regress("prefill", p_load, slo.ttft_s)
        want["prefill"] += 1 if up else -1 if down else 0
        up, down = self._regress("decode", d_load, self.ctx.itl_target_s)
        want["decode"] += 1 if up else -1 if down else 0
        want = {r: max(want[r], self.floor[r]) for r in ROLES}
        self.last_note = f"dynamo floor {self.floor}, p_corr {self.p_corr:.2f}, d_corr {self.d_corr:.2f}"
        return self.ctx.clamp(want)


class _HpaScaler:
    """The HPA algorithm for one metric: desired = ceil(current × metric/target), tolerance, and the
    scale-down stabilization window (the highest recommendation of the window wins)."""

    def __init__(self, tolerance: float = 0.1, down_window_s: float = 300.0) -> None:
        self.tolerance = tolerance
        self.down_window_s = down_window_s
        self.recs: deque = deque()

    def desired(self, now: float, current: int, ratio: float) -> int:
        """``ratio`` = metric / target (per replica averaged, i.e. total / (target × current))."""
        if not self.recs:
            # the replicas the deployment starts with count as a recommendation (a fair start: no
            # policy may drop the initial capacity before its stabilization window has passed)
            self.recs.append((now, current))
        if abs(ratio - 1.0) <= self.tolerance:
            rec = current
        else:
            rec = math.ceil(current * ratio - 1e-9)
        self.recs.append((now, rec))
        while self.recs and self.recs[0][0] < now - self.down_window_s:
            self.recs.popleft()
        best = max(r for _, r in self.recs)
        return rec if rec > current else min(current, best)


class KedaPolicy:
    """llm-d's KEDA recipe (HPA semantics on two external metrics)."""

    name = "keda"

    def __init__(self, ctx: PolicyContext, interval_s: float = 15.0, kv_threshold: float = 0.8) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.kv_threshold = kv_threshold
        self.hpa = {r: _HpaScaler() for r in ROLES}
        pp = ctx.profile.prefill
        budget = pp.max_num_batched_tokens
        # peak prefill throughput of one replica: full token-budget chunks, nothing cached
        self.peak_prefill_tps = pp.tokens_per_second(budget, 0.0)
        self.last_note = ""

    def decide(self, now, view):
        sim, cur = view.sim, _current(view)
        inflight = sum(r.inflight_new_tokens for r in sim.replicas["prefill"] if r.state in ("ready", "draining"))
        inflight += sum(q.prompt - q.cached for q in sim.waiting_for_prefill)
        work_s = inflight / self.peak_prefill_tps  # seconds of prefill work queued, cluster-wide
        # external metric with an AverageValue target: desired = ceil(total / threshold)
        p = self.hpa["prefill"].desired(now, cur["prefill"], work_s / (self.ctx.slo.ttft_s * max(1, cur["prefill"])))
        kv_sum = role_gauges(sim, "decode")["kv_usage_sum"]
        d = self.hpa["decode"].desired(now, cur["decode"], kv_sum / (self.kv_threshold * max(1, cur["decode"])))
        self.last_note = f"keda prefill work {work_s:.1f}s, decode kv sum {kv_sum:.2f}"
        return self.ctx.clamp({"prefill": p, "decode": d})


class HpaQueuePolicy:
    """HPA proportional on queue depth: waiting requests per replica vs a target per replica."""

    name = "hpa"

    def __init__(self, ctx: PolicyContext, interval_s: float = 15.0, target_waiting: float = 2.0) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.target = target_waiting
        self.hpa = {r: _HpaScaler() for r in ROLES}
        self.last_note = ""

    def decide(self, now, view):
        sim, cur = view.sim, _current(view)
        want = {}
        for role in ROLES:
            waiting = role_gauges(sim, role)["waiting"]
            ready = max(1, sum(1 for r in sim.replicas[role] if r.state == "ready"))
            # HPA averages the metric over the pods that report it (Ready ones)
            ratio = (waiting / ready) / self.target
            want[role] = self.hpa[role].desired(now, cur[role], ratio * ready / max(1, cur[role]))
        self.last_note = "hpa queue depth"
        return self.ctx.clamp(want)
