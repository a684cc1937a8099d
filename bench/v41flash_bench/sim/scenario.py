"""Benchmark scenario: one YAML file describing workload, arrivals, hardware, SLO, cost and bounds.

Example (every field but ``name`` has a default; see docs/decisions/2026-11-30-autoscale-bench.md)::

    name: diurnal
    durationS: 3600          # simulated seconds (``--duration`` overrides)
    warmupS: 300             # not scored (caches fill, policies settle)
    seed: 7                  # same seed → same sessions → same report
    workload: {kind: agentx} # or {kind: agentx_trace, path: ...} / {kind: mooncake_trace, path: ...}
    arrivals: {pattern: diurnal, peakRps: 100, trough: 0.55}
                             # or {pattern: trace, trace: azure-code-2023 | mine.json, traceOffsetS, traceTimeScale}
    deployment:
      gpuProduct: H200
      servingProfile: low-latency
      truthProfile: null     # path to a CapacityProfile YAML; null: the shipped one for product/profile
      plannerProfile: null   # the policies' model; null: same as the truth
      plannerProfileError: 1.0   # × on the policies' latency curves (1.3: they think it 30 % slower)
      coldStartS: null       # overrides both profiles' cold start
      router: cache_aware    # cache_aware (cost-based) | session_hash | round_robin | sticky_least_loaded |
                             # vllm_cache_aware (the last two: vllm-router's, as the operator renders them)
      routerSessionTtlS: null  # sticky_least_loaded's session TTL; null: the operator's (600); 7200: vllm-router's
      decodeMaxNumSeqs: null # spec.decode.maxNumSeqs; null: what the operator renders (P/D: 32 per rank)
    slo: {ttftS: 2.0, ttftPercentile: 0.95, e2eP95S: 60.0}
    costPerGpuHour: 2.26
    bounds: {prefill: [1, 160], decode: [1, 40], gpuBudget: null}
    initial: null            # {prefill: n, decode: m}; null: the oracle's need at t=0
    policies: [ours, dynamo, keda, hpa, static, oracle]
"""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from v41flash.api import v1alpha1 as api
from v41flash.planner.profile import CapacityProfile, find_profile, for_rendered_args, load_profile
from v41flash.render.engine import engine_config
from v41flash.render.resolve import resolve as resolve_spec
from v41flash.vllm import args as vargs
from v41flash.planner.datatypes import Slo
from v41flash_bench.sim import startup
from v41flash_bench.sim.simulator import ROUTERS
from v41flash_bench.sim.workload import AgentSessionSpec, AgentxTraceSpec, ArrivalSpec, MooncakeTraceSpec

POLICIES = ("ours", "dynamo", "keda", "hpa", "static", "oracle", "ceiling")
EPOCH = "2026-12-07T00:00:00Z"  # a Monday, midnight UTC
HINDSIGHT = ("static", "oracle", "ceiling")  # sized from the reference run's demand: wait for the oracle


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class DeploymentSpec(_M):
    gpu_product: str = "H200"
    serving_profile: str = "low-latency"
    truth_profile: str | None = Field(default=None, description="CapacityProfile YAML the simulator obeys.")
    planner_profile: str | None = Field(default=None, description="CapacityProfile YAML the policies use.")
    planner_profile_error: float = Field(default=1.0, gt=0, description="× on the policies' latency curves.")
    cold_start_s: float | None = Field(default=None, gt=0)
    planner_knows_cold_start: bool = Field(
        default=True, description="False: coldStartS applies to the truth only; the policies' profile keeps its own.")
    router: Literal[ROUTERS] = "cache_aware"  # type: ignore[valid-type]
    router_session_ttl_s: float | None = Field(
        default=None, gt=0, description="sticky_least_loaded: how long an idle session counts on its engine (null: "
                                        "what the operator renders, routing.sessionAffinityTtlSeconds' default; "
                                        "7200: vllm-router's own default).")
    prefix_cache_tokens: int | None = Field(default=None, ge=1, description="Per prefill replica.")
    decode_max_num_seqs: int | None = Field(
        default=None, ge=1, le=4096,
        description="spec.decode.maxNumSeqs of the modelled deployment (null: what the operator renders for it).")
    startup: StartupSpec = Field(
        default_factory=lambda: StartupSpec(),
        description="spec.startup and model.cache of the modelled deployment: the simulated cold start is coldStartS "
                    "shortened by each option's published factor (sim/startup.py); the policies are not told.")


class StartupSpec(_M):
    load_format: str = ""  # spec.startup.loadFormat
    weight_cache: bool = False  # spec.startup.weightCache (prefetched)
    compile_cache: bool = False  # spec.model.cache.claimName (a warm VLLM_CACHE_ROOT)

    def model(self) -> startup.Startup:
        return startup.Startup(self.load_format, self.weight_cache, self.compile_cache)


class HistorySpec(_M):
    """The demand history the planner's status holds when the run starts (a forecastable scenario's past)."""

    span_s: float = Field(gt=0, description="How far back it reaches (a few of the longest season's periods).")
    bucket_s: float = Field(default=60.0, gt=0, description="Its resolution (the planner's season bucket).")
    season_periods_s: tuple[float, ...] = Field(
        min_length=1, description="The planner's season periods: the scenario's (compressed) day and week.")
    noise_cv: float = Field(default=0.05, ge=0, description="Per-bucket noise of the recorded means.")
    level: float = Field(default=1.0, gt=0, description="The past at this × the run's shape (below 1: today's demand "
                                                         "drifted above the days the status holds).")
    shift_s: float = Field(default=0.0, description="The past is the run's shape this many seconds later (a clock "
                                                     "change or a job moved since: the run's shape is shifted by it).")


class SloSpec(_M):
    ttft_s: float = Field(default=2.0, gt=0)
    ttft_percentile: float = Field(default=0.95, gt=0, lt=1)
    e2e_p95_s: float = Field(default=60.0, gt=0, alias="e2eP95S")
    itl_s: float | None = Field(default=None, gt=0, description="Explicit ITL target (Dynamo's SLA input).")
    window_s: float = Field(default=60.0, gt=0)

    def to_slo(self) -> Slo:
        return Slo(ttft_s=self.ttft_s, e2e_p95_s=self.e2e_p95_s, ttft_percentile=self.ttft_percentile,
                   window_s=self.window_s, itl_s=self.itl_s)


class BoundsSpec(_M):
    prefill: tuple[int, int] = (1, 160)
    decode: tuple[int, int] = (1, 40)
    gpu_budget: int | None = None


class AutoscaleScenario(_M):
    name: str
    description: str = ""
    duration_s: float = Field(default=3600.0, gt=0)
    warmup_s: float = Field(default=300.0, ge=0)
    seed: int = 1
    workload: Annotated[
        AgentSessionSpec | AgentxTraceSpec | MooncakeTraceSpec, Field(discriminator="kind")
    ] = AgentSessionSpec()
    arrivals: ArrivalSpec = ArrivalSpec()
    deployment: DeploymentSpec = DeploymentSpec()
    slo: SloSpec = SloSpec()
    cost_per_gpu_hour: float = Field(default=2.26, gt=0, description="Modelled TCO $/GPU-h.")
    bounds: BoundsSpec = BoundsSpec()
    initial: dict[str, int] | None = None
    policies: tuple[str, ...] = POLICIES
    oracle_interval_s: float = Field(default=60.0, gt=0)
    oracle_rounds: int = Field(default=1, ge=0, description="Fix-up simulations after the scale search.")
    oracle_grid_attainment: float = Field(
        default=0.95, gt=0, le=1, description="The scale search keeps the smallest factor reaching this share."
    )
    oracle_factors: tuple[float, ...] = Field(
        default=(1.3, 1.6, 2.0), min_length=1, description="Prefill scale factors tried (in parallel)."
    )
    oracle_max_factor: float = Field(
        default=5.0, ge=1, description="The scale search widens ×1.5 above the grid up to this when none passes.")
    oracle_tolerance: float = Field(
        default=0.05, gt=0, description="The scale search bisects until its failing and passing factors are this "
                                        "close (relative): the oracle settles whatever grid it starts from.")
    epoch: str = Field(default=EPOCH, description="The wall clock (UTC, ISO 8601) at t = 0: where schedules' crons "
                                                  "fall (the default is a Monday 00:00).")
    schedules: tuple[api.ScheduleWindow, ...] = Field(
        default=(), description="spec.autoscaling.schedules of the modelled deployment (ours is given them).")
    history: HistorySpec | None = Field(
        default=None, description="The demand history in the planner's status at t = 0 (null: none, a fresh start).")

    @property
    def epoch_s(self) -> float:
        return datetime.fromisoformat(self.epoch.replace("Z", "+00:00")).timestamp()


def _snake(d):
    """Accept camelCase in the nested workload/arrival blocks (their models are snake_case)."""
    if isinstance(d, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in d.items()}
    return d


def with_startup(sc: AutoscaleScenario, options: startup.Startup) -> AutoscaleScenario:
    """The scenario with the deployment's startup options replaced (the same traffic, other cold starts)."""
    st = StartupSpec(load_format=options.load_format, weight_cache=options.weight_cache,
                     compile_cache=options.compile_cache)
    return sc.model_copy(update={"deployment": sc.deployment.model_copy(update={"startup": st})})


def with_router(sc: AutoscaleScenario, router: str | None = None, session_ttl_s: float | None = None
                ) -> AutoscaleScenario:
    """The scenario with another deployment.router and/or routerSessionTtlS (validated like the YAML fields)."""
    d = sc.deployment.model_dump()
    d.update({k: v for k, v in (("router", router), ("router_session_ttl_s", session_ttl_s)) if v is not None})
    return sc.model_copy(update={"deployment": DeploymentSpec.model_validate(d)})


def load_scenario(path: str | Path, base_dir: Path | None = None) -> AutoscaleScenario:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    for key in ("workload", "arrivals"):
        if key in data:
            data[key] = _snake(data[key])
    wl = data.get("workload") or {}
    if "path" in wl and not Path(wl["path"]).is_absolute():
        wl["path"] = str((base_dir or Path(path).parent) / wl["path"])
    arr = data.get("arrivals") or {}
    if str(arr.get("trace", "")).endswith(".json") and not Path(arr["trace"]).is_absolute():
        arr["trace"] = str((base_dir or Path(path).parent) / arr["trace"])  # a team's own shape, beside the file
    return AutoscaleScenario.model_validate(data)


def scaled_profile(p: CapacityProfile, factor: float) -> CapacityProfile:
    """The same profile with every latency coefficient × ``factor`` (a deliberately wrong model)."""
    if factor == 1.0:
        return p
    pc, dc = p.prefill.curve, p.decode.curve
    return p.model_copy(update={
        "prefill": p.prefill.model_copy(update={"curve": pc.model_copy(update={
            "overhead": pc.overhead * factor, "per_token": pc.per_token * factor,
            "per_token_context": pc.per_token_context * factor})}),
        "decode": p.decode.model_copy(update={"curve": dc.model_copy(update={
            "overhead": dc.overhead * factor, "per_sequence": dc.per_sequence * factor,
            "per_sequence_context": dc.per_sequence_context * factor})}),
    })


def with_cold_start(p: CapacityProfile, seconds: float | None) -> CapacityProfile:
    if seconds is None:
        return p
    return p.model_copy(update={
        "prefill": p.prefill.model_copy(update={"cold_start_seconds": seconds}),
        "decode": p.decode.model_copy(update={"cold_start_seconds": seconds}),
    })


def rendered_decode_args(dep: DeploymentSpec) -> tuple[str, ...]:
    """The decode engine's argv the operator renders for the modelled (P/D) deployment."""
    decode: dict = {} if dep.decode_max_num_seqs is None else {"maxNumSeqs": dep.decode_max_num_seqs}
    spec = api.V41FlashDeploymentSpec.model_validate(
        {"profile": dep.serving_profile, "gpu": {"product": dep.gpu_product}, "decode": decode})
    return tuple(vargs.build_replica(engine_config(spec, resolve_spec(spec), "decode")).leader.args)


def profiles(sc: AutoscaleScenario, base_dir: Path | None = None) -> tuple[CapacityProfile, CapacityProfile]:
    """(truth, planner) profiles of a scenario, both as the engines are rendered (--max-num-seqs, DSpark, host
    KV): the simulated engines batch what the rendered ones would, and the policies know it."""
    dep = sc.deployment

    def resolve(path: str | None) -> CapacityProfile:
        if path:
            p = Path(path)
            if not p.is_absolute() and base_dir is not None:
                p = base_dir / p
            return load_profile(p)
        found = find_profile(dep.serving_profile, dep.gpu_product)
        if found is None:
            raise ValueError(f"no shipped capacity profile for {dep.serving_profile} on {dep.gpu_product}")
        return found

    cold = dep.cold_start_s
    truth = resolve(dep.truth_profile)
    if dep.startup.model().any and cold is None:  # without coldStartS: the truth profile's own, per role, shortened
        truth = truth.model_copy(update={r: getattr(truth, r).model_copy(update={"cold_start_seconds": startup.cold_start(
            getattr(truth, r).cold_start_seconds, dep.startup.model())}) for r in ("prefill", "decode")})
    elif cold is not None and dep.startup.model().any:
        cold = startup.cold_start(cold, dep.startup.model())
    truth = with_cold_start(truth, cold)
    planner = resolve(dep.planner_profile) if dep.planner_profile else truth
    if dep.planner_knows_cold_start:
        planner = with_cold_start(planner, cold)
    elif not dep.planner_profile:
        planner = resolve(None)  # the shipped profile with its own cold start
    planner = scaled_profile(planner, dep.planner_profile_error)
    args = rendered_decode_args(dep)
    return for_rendered_args(truth, args), for_rendered_args(planner, args)
