"""Before the steps: what the window says users ask for (``workload_demand``), and how the SLO divides between
the phases (``split_slo``)."""
from __future__ import annotations

from dataclasses import dataclass

from v41flash.figures import WindowFigures
from v41flash.planner.datatypes import Observation, Slo
from v41flash.planner.profile import CapacityProfile

ASSUMED_OUTPUT_TOKENS = 1000.0  # AgentX mean output (shared/reference/workload-and-performance.md)


@dataclass(frozen=True)
class Demand:
    """Workload figures the model needs, merged from the roles' windows."""

    prefill_rate: float  # req/s entering prefill (disaggregated) or the engines (aggregated)
    decode_rate: float
    isl: float  # mean prompt tokens
    hit_rate: float  # token-weighted prefix-cache hit rate
    osl: float  # mean output tokens
    osl_p95: float
    prefill_backlog: float  # waiting requests
    decode_backlog: float

    @property
    def new_tokens(self) -> float:
        return self.isl * (1.0 - self.hit_rate)

    @property
    def cached_tokens(self) -> float:
        return self.isl * self.hit_rate

    @property
    def context(self) -> float:
        return self.isl + self.osl / 2.0


def _scaled_rate(w: WindowFigures) -> float:
    """Request rate, scaled up when only some pods reported (never underestimate demand)."""
    if w.pods_observed and w.pods_expected > w.pods_observed:
        return w.request_rate * w.pods_expected / w.pods_observed
    return w.request_rate


def workload_demand(observed: Observation) -> Demand:
    """Rates, lengths, cache hits and backlogs of this window (prompts from the role that computes them)."""
    dw = observed.decode.window
    pw = observed.prefill.window if observed.prefill is not None else None
    front = pw if observed.prefill is not None else dw  # where prompts are computed

    def first(*vals: float | None, default: float = 0.0) -> float:
        for v in vals:
            if v is not None:
                return float(v)
        return default

    isl = first(front.mean_input_tokens if front else None, dw.mean_input_tokens if dw else None)
    osl = first(dw.mean_output_tokens if dw else None)
    return Demand(
        prefill_rate=_scaled_rate(front) if front else 0.0,
        decode_rate=_scaled_rate(dw) if dw else 0.0,
        isl=isl,
        hit_rate=min(0.999, max(0.0, first(front.prefix_cache_hit_rate if front else None))),
        osl=osl,
        osl_p95=first(dw.output_tokens_p95 if dw else None, default=2.0 * osl),
        prefill_backlog=front.waiting if front else 0.0,
        decode_backlog=dw.waiting if dw else 0.0,
    )


@dataclass(frozen=True)
class Budgets:
    """The SLO split between the phases."""

    itl_s: float  # decode's time per output token
    handover_s: float  # KV hand-over plus decode's first step (0 when aggregated)
    prefill_ttft_s: float  # what prefill's own TTFT may use


def split_slo(demand: Demand, slo: Slo, profile: CapacityProfile, disaggregated: bool) -> Budgets:
    # A window where nothing finished says nothing about output lengths: split the SLO as for a typical
    # answer, not for 0 tokens (that would hand the whole e2e headroom to one decode step). Sizing still
    # uses the observed demand, so an empty window never asks for capacity.
    osl_for_budget = demand.osl_p95 if demand.osl_p95 > 0 else 2.0 * ASSUMED_OUTPUT_TOKENS
    itl_budget = slo.itl_s or max(1e-4, (slo.e2e_p95_s - slo.ttft_s) / max(1.0, osl_for_budget))
    # KV hand-over plus decode's first step (at its budget: decode is sized separately to meet it)
    handover = (profile.kv_transfer.seconds(demand.isl) + itl_budget) if disaggregated else 0.0
    return Budgets(itl_s=itl_budget, handover_s=handover, prefill_ttft_s=max(1e-3, slo.ttft_s - handover))


def new_session_share(observed: Observation) -> float | None:
    """The window's share of new sessions among arriving requests (the session proxy's counts; None: unknown)."""
    router = observed.router
    if router is None or not router.arrival_rate or router.new_session_rate is None:
        return None
    return router.new_session_rate / router.arrival_rate
