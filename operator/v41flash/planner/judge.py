"""Step 1, ``judge``: how far each role's data can be trusted, what users saw, and which role can fix a breach."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from v41flash.figures import WindowFigures
from v41flash.planner.datatypes import Observation, PlannerConfig, RoleObservation, Slo
from v41flash.planner.demand import Budgets
from v41flash.planner.profile import CapacityProfile
from v41flash.roles import Role

DataStatus = Literal["ok", "partial", "stale", "missing"]


@dataclass(frozen=True)
class RoleJudgement:
    """How far one role's data can be trusted, what users saw, and whether this role is to blame."""

    role: Role
    data: DataStatus
    data_why: str  # "" when ok
    breached: bool  # an observed SLO breach this role can fix
    observed_ttft_s: float | None = None  # user-facing figures this role reports on (None: not judged)
    observed_e2e_p95_s: float | None = None
    observed_itl_s: float | None = None
    own_breach: bool = True  # the breach is this role's doing (False: another role's, this one only stays on guard)

    @property
    def usable(self) -> bool:
        """Data good enough to size on (partial data may scale up, never down)."""
        return self.data in ("ok", "partial")


@dataclass(frozen=True)
class Judgement:
    decode: RoleJudgement
    prefill: RoleJudgement | None  # None: aggregated
    notes: tuple[str, ...] = ()  # for a human (replicas stuck starting)

    def role(self, role: Role) -> RoleJudgement:
        j = self.prefill if role == "prefill" else self.decode
        assert j is not None
        return j


def _missing_why(w) -> list[str]:
    """Each of the first three missing pods: the window's note on it ('pod: body over 8388608 bytes', the
    scrape's error: a flooding or dripping pod is named as such) or else its name."""
    notes = {n.split(": ", 1)[0]: n for n in w.notes if ": " in n}
    return [notes.get(p, p) for p in w.missing_pods[:3]]


def data_status(obs: RoleObservation, now: float, cfg: PlannerConfig) -> tuple[DataStatus, str]:
    """('ok' | 'partial' | 'stale' | 'missing', why)."""
    w = obs.window
    if w is None:
        return "missing", "no metrics for this role"
    if w.error is not None:
        return "missing", w.error
    age = now - w.end
    if age > cfg.judge.max_metrics_age_s:
        return "stale", f"metrics are {age:.0f}s old (> {cfg.judge.max_metrics_age_s:.0f}s)"
    if w.pods_observed == 0 and (w.pods_expected > 0 or obs.replicas.ready > 0):
        why = [n for n in _missing_why(w) if n not in w.missing_pods]  # the scrape errors, when the window has them
        return "missing", f"no pod of {w.pods_expected or obs.replicas.ready} answered its metrics scrape" + \
            (f" ({'; '.join(why)})" if why else "")
    if not w.complete:
        parts = []
        if w.missing_pods:
            parts.append(f"{len(w.missing_pods)} pod(s) missing ({'; '.join(_missing_why(w))})")
        if w.partial_pods:
            parts.append(f"{len(w.partial_pods)} pod(s) with partial data ({', '.join(w.partial_pods[:3])})")
        if not parts:
            parts.append(f"{w.pods_observed}/{w.pods_expected} pods observed")
        return "partial", "; ".join(parts)
    return "ok", ""


def cold_start_of(obs: RoleObservation, role_profile) -> float:
    """Seconds until a replica ordered now serves: measured on this cluster when known, else the profile's."""
    measured = obs.cold_start_s
    return measured if measured is not None and measured > 0 else role_profile.cold_start_seconds


def judge(observed: Observation, profile: CapacityProfile, slo: Slo, budgets: Budgets, now: float,
          config: PlannerConfig) -> Judgement:
    """Judge each role's data, measure the user-facing figures and attribute a breach to the role that can fix it."""
    cfg = config
    disagg = observed.prefill is not None
    dw = observed.decode.window
    pw = observed.prefill.window if observed.prefill is not None else None

    def enough(w: WindowFigures | None) -> bool:
        return w is not None and w.requests >= cfg.judge.min_requests_for_slo

    if disagg:
        # user TTFT ≈ prefill pods' TTFT + decode's first token; user e2e ≈ decode pods' e2e + prefill
        decode_first = (dw.ttft_mean_s or 0.0) if dw is not None else 0.0
        prefill_mean = (pw.ttft_mean_s or 0.0) if pw is not None else 0.0
        obs_ttft = pw.ttft_s + decode_first if enough(pw) and pw.ttft_s is not None else None
        obs_e2e = dw.e2e_p95_s + prefill_mean if enough(dw) and dw.e2e_p95_s is not None else None
    else:
        obs_ttft = dw.ttft_s if enough(dw) else None
        obs_e2e = dw.e2e_p95_s if enough(dw) else None
    rt = observed.router
    if rt is not None and rt.e2e_p95_s is not None and rt.requests >= cfg.judge.min_requests_for_slo:
        obs_e2e = rt.e2e_p95_s  # measured where users are, instead of summed from the roles
    obs_itl = dw.itl_mean_s if enough(dw) else None
    ttft_breach = obs_ttft is not None and obs_ttft > slo.ttft_s
    # decode's own first token (its wait for a sequence slot + one step) took longer than the room prefill left
    # it: the TTFT breach is decode's too (with max-num-seqs 32 a saturated decode queues requests for seconds)
    decode_ttft_breach = (
        disagg and cfg.judge.decode_owns_its_ttft and ttft_breach and pw is not None and pw.ttft_s is not None
        and decode_first > max(budgets.handover_s, slo.ttft_s - pw.ttft_s))
    e2e_breach = obs_e2e is not None and obs_e2e > slo.e2e_p95_s
    itl_breach = obs_itl is not None and obs_itl > budgets.itl_s

    notes: list[str] = []

    def one(role: Role, obs: RoleObservation) -> RoleJudgement:
        status, why = data_status(obs, now, cfg)
        cold_start = cold_start_of(obs, profile.prefill if role == "prefill" else profile.decode)
        stuck = [s for s in obs.replicas.starting_for_s if s > 2 * cold_start]
        if stuck:  # still counted as coming capacity, but a human should look (unschedulable? crash loop?)
            notes.append(
                f"{len(stuck)} {role} replica(s) starting for over {max(stuck):.0f}s "
                f"(> 2× the profile's {cold_start:.0f}s cold start): check their pods"
            )
        if role == "prefill":
            # a TTFT breach decode owns (its slot wait) while prefill's own TTFT fits keeps prefill on guard (no
            # scale-down) but is not prefill's to scale up for (issue 40: attributed to the role that causes it)
            own = not (decode_ttft_breach and pw is not None and pw.ttft_s is not None
                       and pw.ttft_s + budgets.handover_s <= slo.ttft_s and not (e2e_breach and not itl_breach))
            breached = ttft_breach or (e2e_breach and not itl_breach)
        else:
            own = True
            breached = ((e2e_breach and (itl_breach or not disagg or not ttft_breach)) or (ttft_breach and not disagg)
                        or decode_ttft_breach)
        return RoleJudgement(
            role=role, data=status, data_why=why, breached=breached, own_breach=breached and own,
            observed_ttft_s=obs_ttft if (role == "prefill" or not disagg) else None,
            observed_e2e_p95_s=obs_e2e if role == "decode" else None,
            observed_itl_s=obs_itl if role == "decode" else None,
        )

    prefill = one("prefill", observed.prefill) if observed.prefill is not None else None
    decode = one("decode", observed.decode)
    return Judgement(decode=decode, prefill=prefill, notes=tuple(notes))
