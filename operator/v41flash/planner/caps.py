"""What bounds P/D prefill's scale-up besides the model (``act``'s rules ``proven_capacity``, ``proven_down`` and
``foreseen_capacity``): the replicas that held this work's TTFT before (``proven_cap``), and what its Ready replicas
do at the rise a learned season forecasts (``foreseen_cap``)."""
from __future__ import annotations

import math
from dataclasses import replace

from v41flash.planner.datatypes import PlannerConfig, RoleObservation, RoleState, Slo
from v41flash.planner.judge import RoleJudgement
from v41flash.planner.learn import Learned, a_wave, after_scale_down
from v41flash.planner.profile import CapacityProfile


def proven_cap(observed: RoleObservation, judged: RoleJudgement, demand_rate: float, learned: Learned, slo: Slo,
               state: RoleState, now: float, config: PlannerConfig, profile: CapacityProfile,
               new_share: float | None = None) -> tuple[RoleState, float | None]:
    """(state with this window's proof recorded, replicas proven to hold ``demand_rate``; None: no proof yet).

    A window with trustworthy data, enough requests, no rollout and no scale-down within ``down_breach_window_s``
    (its moved sessions re-prefill, and the replicas it removed served part of the window) whose TTFT held
    ``proven_ttft_margin`` × the target proves that ``ready ÷ work`` replicas per unit of prompt work (req/s × the
    profile's seconds for the mean request) suffice: replicas still starting served nothing, so the proof is
    conservative. At the same utilisation per rank more ranks queue no longer, so the demand's work × that ratio
    is enough. The ``proven_min_windows``-th lowest ratio of the last ``proven_history_s`` is the proof (one
    lucky window proves nothing), among the proofs made at a share of new sessions (``new_share``: the session
    proxy's new sessions ÷ arrivals) no lower than about the current one's (``proven_share_slack``); a breach at a
    ratio at or above a proof withdraws it."""
    cfg, rep, w = config, observed.replicas, observed.window
    if cfg.act.proven_min_windows <= 0:
        return state, None
    per_request = profile.prefill.request_seconds(learned.sized.new_tokens, learned.sized.cached_tokens)
    proven = tuple(x for x in state.proven if x[0] > now - cfg.act.proven_history_s)
    steady = (judged.data == "ok" and w is not None and not observed.rolling_out and rep.ready > 0
              and not after_scale_down(state, now, cfg) and w.requests >= cfg.learn.min_requests_for_feedback
              and w.request_rate > 0 and per_request > 0)
    if steady:
        ratio = rep.ready / (w.request_rate * per_request)
        if judged.breached:
            proven = tuple(x for x in proven if x[1] > ratio)
        elif judged.observed_ttft_s is not None and judged.observed_ttft_s <= cfg.act.proven_ttft_margin * slo.ttft_s:
            proven = proven + ((now, ratio, new_share),)
    state = replace(state, proven=proven)
    valid = [x[1] for x in proven if cfg.act.proven_share_slack <= 0 or new_share is None
             or (x[2] is not None and not a_wave(new_share, x[2], cfg))]
    if len(valid) < cfg.act.proven_min_windows or demand_rate <= 0:
        return state, None
    ratio = sorted(valid)[cfg.act.proven_min_windows - 1]
    return state, ratio * demand_rate * per_request


def foreseen_cap(ready: int, breach: float | None, foreseen: tuple[float, float], cfg: PlannerConfig
                 ) -> tuple[int | None, str]:
    """(the most replicas a P/D prefill scale-up asks for while a learned season forecasts the horizon, why; None: no
    cap). ``breach``: None while the SLO holds, else the observed TTFT ÷ its target; ``foreseen``: (the demand
    observed now, the season's forecast). The SLO holding at the observed demand proves that the Ready replicas hold
    it: the season's rise scales them, with ``foreseen_margin``. A modest breach at a demand the season foresaw steps
    up by ``foreseen_breach_up_ratio`` × Ready; one above the forecast (a surprise) or further out (short of
    capacity): no cap."""
    observed, forecast = foreseen
    if ready <= 0 or observed <= 0:
        return None, ""
    if breach is None:
        if cfg.act.foreseen_margin <= 0:
            return None, ""
        rise = max(1.0, forecast / observed)
        cap = math.ceil(ready * rise * (1 + cfg.act.foreseen_margin) - 1e-9)
        return cap, (f"the SLO holds at {observed:.2f} req/s with {ready} Ready: ×{rise:.2f} for the season's "
                     f"{forecast:.2f} and ×{1 + cfg.act.foreseen_margin:g} margin is {cap}")
    if cfg.act.foreseen_breach_up_ratio <= 0 or observed > forecast or breach > cfg.act.foreseen_breach_ttft_ratio:
        return None, ""
    cap = math.ceil(ready * cfg.act.foreseen_breach_up_ratio - 1e-9)
    return cap, (f"TTFT ×{breach:.2f} its target at a demand the season foresaw: at most "
                 f"×{cfg.act.foreseen_breach_up_ratio:g} the {ready} Ready")
