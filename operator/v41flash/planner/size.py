"""Step 4, ``size``: the fractional replicas one role needs at the forecast demand, with the corrected profile, and
whether removing one would itself break the TTFT percentile (``moved_sessions_checks``)."""
from __future__ import annotations

from dataclasses import dataclass

from v41flash.planner import capacity
from v41flash.planner.datatypes import PlannerConfig, RoleObservation, Slo
from v41flash.planner.demand import Budgets
from v41flash.planner.learn import Learned
from v41flash.planner.profile import CapacityProfile
from v41flash.planner.wording import fmt_k, pct
from v41flash.roles import Role


@dataclass(frozen=True)
class Sizing:
    need: capacity.Need | None  # fractional replicas; None: nothing to size on (missing or stale data)
    kv_note: str = ""  # set when KV-cache memory, not compute, decided the need
    down_guard: str = ""  # set when removing a replica would itself break the TTFT percentile (moved sessions)
    # ... because the replicas left could not do the moved turns' work (never passed, however long it holds)
    down_guard_overload: bool = False


def moved_sessions_checks(role: Role, disaggregated: bool, current: int, learned: Learned, budgets: Budgets,
                          profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> tuple[str, str]:
    """Why removing one replica that computes prompts would break the TTFT percentile by itself: (the tail check's
    reason, the overload check's reason), "" where a check passes.

    Session affinity keeps each session's prefix on one replica; removing one of N moves 1/N of the sessions,
    and each moved session's next turn re-prefills its whole context. For about one turn, 1/N of the requests
    are such full prefills. That breaks the window however the queueing model sizes the fleet when

    - the share is above the percentile's tail (1 − p) and one full-context prefill alone takes longer than
      prefill's TTFT budget (the moved turns are slow, not queued), or
    - the N − 1 replicas left cannot do that turn's work: at the window's request rate, with 1/N of the
      requests full prefills and the rest at the cache-hit level, their utilisation reaches 1 (everyone queues
      behind the moved turns; at 97 % hits a full prefill is ~20–30× a cached turn's work).

    ``act`` passes the first after ``moved_sessions_hold_s`` of holding (one replica, then a new hold), never the
    second.
    """
    if not config.size.guard_moved_sessions or current <= 1 or (role != "prefill" and disaggregated):
        return "", ""
    moved = min(1.0, config.act.max_scale_down_step / current)
    tail = 1.0 - slo.ttft_percentile
    sized, pp, k = learned.sized, profile.prefill, learned.prefill_correction
    full = pp.request_seconds(sized.isl, 0.0) * k
    tail_why = overload_why = ""
    if moved > tail and full > budgets.prefill_ttft_s:
        tail_why = (f"a scale-down would move {moved:.0%} of the sessions (> the {pct(slo.ttft_percentile)} tail of "
                    f"{tail:.0%}) and each re-prefills its {fmt_k(sized.isl)}-token context in ~{full:.1f}s "
                    f"(> the {budgets.prefill_ttft_s:.2f}s TTFT budget)")
    ranks = pp.data_parallel_size if disaggregated else profile.decode.data_parallel_size
    turn = (1 - moved) * pp.request_seconds(sized.new_tokens, sized.cached_tokens) * k + moved * full
    left = max(1, current - config.act.max_scale_down_step)  # a scale-down never removes the last replica
    rho = sized.prefill_rate * turn / (ranks * left)
    if rho >= 1.0:
        overload_why = (f"the {left} replicas left would be {rho:.0%} busy while the "
                        f"{moved:.0%} of sessions a scale-down moves re-prefill their {fmt_k(sized.isl)}-token "
                        f"contexts")
    return tail_why, overload_why


def size(role: Role, demand_rate: float | None, observed: RoleObservation, disaggregated: bool, learned: Learned,
         budgets: Budgets, profile: CapacityProfile, slo: Slo, config: PlannerConfig) -> Sizing:
    """Fractional replicas that keep TTFT (prefill) and ITL (decode) within their budgets at the demand, with
    the corrected profile; decode also keeps its KV cache under the target."""
    if demand_rate is None:
        return Sizing(need=None)
    cfg = config
    pp, dp = profile.prefill, profile.decode
    sized = learned.sized

    def size_prefill(rate: float, ranks: int) -> capacity.Need:
        return capacity.prefill_replicas_needed(
            pp, rate, sized.new_tokens, sized.cached_tokens, budgets.prefill_ttft_s, slo.ttft_percentile,
            learned.prefill_correction, cfg.size.target_utilization, ranks, cfg.size.service_cv2,
        )

    def size_decode(rate: float) -> capacity.Need:
        need = capacity.decode_replicas_needed(
            dp, rate, sized.osl, sized.context, budgets.itl_s, learned.decode_correction, cfg.size.target_utilization)
        if cfg.size.decode_slot_staffing and disaggregated:
            # a request waiting for a free sequence slot waits in its TTFT: enough slots for the percentile
            slots = capacity.decode_slots_needed(dp, rate, sized.osl, sized.context, budgets.itl_s,
                                                 slo.ttft_percentile, learned.decode_correction)
            need = capacity.Need(max(need.replicas, slots.replicas), need.feasible)
        return need

    if role == "prefill":
        need = size_prefill(demand_rate, pp.data_parallel_size)
    elif disaggregated:
        need = size_decode(demand_rate)
    else:
        dn, pn = size_decode(demand_rate), size_prefill(demand_rate, dp.data_parallel_size)
        need = capacity.Need(dn.replicas + pn.replicas, dn.feasible and pn.feasible)
    kv_note = ""
    if role == "decode" and observed.window.kv_cache_usage is not None and observed.replicas.ready > 0:
        # KV memory binds before compute (long agentic contexts): keep usage under the target
        # (also when below target: it stops a scale-down that would push usage over it)
        kv = observed.window.kv_cache_usage
        kv_need = observed.replicas.ready * kv / cfg.size.kv_cache_target
        if kv_need > need.replicas:
            need = capacity.Need(kv_need, need.feasible)
            kv_note = f"KV cache {kv:.0%} full ({cfg.size.kv_cache_target:.0%} target)"
    tail, overload = moved_sessions_checks(role, disaggregated, observed.replicas.desired, learned, budgets, profile,
                                           slo, cfg)
    return Sizing(need=need, kv_note=kv_note, down_guard=tail or overload, down_guard_overload=bool(overload))
