"""The rollout of a new serving revision, as a pure state machine (docs/decisions/2026-12-01-rollouts.md §4).

``decide(state, observed, policy) -> RolloutDecision``: frozen data in, frozen data out, no clock and no I/O. The
whole state is ``State``, which the controller keeps in ``status.rollout`` (``State.from_status`` /
``to_status``), so an operator restart resumes a rollout where it was: the step clock is wall time in
status, never in memory.

A live revision occupies a slot (render/slots.py): "" (a deployment's first revision: workloads ``<cr>-<role>``),
then "a" and "b" in turn. A candidate always goes to the slot the serving revision does
not use, so at most two revisions run at once. ``RolloutDecision.slots`` says which slots must exist, at what
size, with what share of new sessions; every other slot is deleted.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..api import v1alpha1 as api
from ..defaults import ENGINE_STARTUP_MIN_SECONDS, PROGRESS_MARGIN_SECONDS
from ..roles import FIRST_SLOT, ROLLOUT_SLOTS

# Phases of status.rollout.phase.
STARTING = "Starting"  # candidate slot created or grown, not Ready yet (step 0: no sessions; k: step k's share)
WAITING = "WaitingForSurgeRoom"  # no GPUs for the candidate: nothing created (Wait) or pods Pending
CANARY = "Canary"  # candidate takes steps[step-1] % of new sessions, judged at the end of the step
PAUSED = "Paused"  # held at the current step
DRAINING = "Draining"  # promoted: the old revision takes no new sessions, its live ones finish
RECREATING = "Recreating"  # strategy Recreate: serving slot deleted, candidate starting at full size
ROLLED_BACK = "RolledBack"  # candidate deleted after a failure; not retried for the same revision
ABORTED = "Aborted"  # candidate deleted on request; not retried for the same revision
COMPLETE = "Complete"  # the last rollout finished; servingSlot says where the serving revision lives
ENDED = (ROLLED_BACK, ABORTED, COMPLETE)

SLOTS = ROLLOUT_SLOTS


def other_slot(slot: str) -> str:
    return "b" if slot == "a" else "a"


# The defaults of spec.rollout and spec.slo: one home, the API models.
_ROLLOUT, _SLO = api.RolloutSpec(), api.SLOSpec()


@dataclass(frozen=True)
class Policy:
    """spec.rollout and spec.slo as the machine needs them (``policy_from_spec``); the defaults are the API's."""
    strategy: str = _ROLLOUT.strategy
    steps: tuple[int, ...] = tuple(_ROLLOUT.steps)
    step_seconds: float = _ROLLOUT.step_seconds
    min_requests_per_step: int = _ROLLOUT.min_requests_per_step
    max_surge_gpus: int = _ROLLOUT.max_surge_gpus  # 0: the candidate at the serving size (State.surge_gpus)
    # the API's 0 means the engines' startup budget + the margin (policy_from_spec); here the smallest budget's
    progress_deadline_seconds: float = ENGINE_STARTUP_MIN_SECONDS + PROGRESS_MARGIN_SECONDS
    when_no_surge_room: str = _ROLLOUT.when_no_surge_room
    drain_deadline_seconds: float = _ROLLOUT.drain_deadline_seconds
    ttft_target_seconds: float = _SLO.ttft.target_seconds
    ttft_percentile: int = _SLO.ttft.percentile
    e2e_target_seconds: float = _SLO.e2e_p95_seconds
    ttft_tolerance: float = _ROLLOUT.gate.ttft_tolerance
    e2e_tolerance: float = _ROLLOUT.gate.e2e_tolerance
    max_error_ratio: float = _ROLLOUT.gate.max_error_ratio
    gpu_budget: int = api.AutoscalingSpec().gpu_budget  # 0 = none
    paused: bool = _ROLLOUT.paused
    promote: str = _ROLLOUT.promote
    abort: str = _ROLLOUT.abort


def policy_from_spec(spec: Any, startup_seconds: float) -> Policy:
    """The Policy of a V41FlashDeploymentSpec; ``startup_seconds`` is the engines' startup budget (the
    default progress deadline is it + PROGRESS_MARGIN_SECONDS, as the engine Deployments' own)."""
    r, slo = spec.rollout, spec.slo
    return Policy(strategy=r.strategy, steps=tuple(r.steps), step_seconds=r.step_seconds,
                  min_requests_per_step=r.min_requests_per_step, max_surge_gpus=r.max_surge_gpus,
                  progress_deadline_seconds=r.progress_deadline_seconds or startup_seconds + PROGRESS_MARGIN_SECONDS,
                  when_no_surge_room=r.when_no_surge_room, drain_deadline_seconds=r.drain_deadline_seconds,
                  ttft_target_seconds=slo.ttft.target_seconds, ttft_percentile=slo.ttft.percentile,
                  e2e_target_seconds=slo.e2e_p95_seconds, ttft_tolerance=r.gate.ttft_tolerance,
                  e2e_tolerance=r.gate.e2e_tolerance, max_error_ratio=r.gate.max_error_ratio,
                  gpu_budget=spec.autoscaling.gpu_budget, paused=r.paused, promote=r.promote, abort=r.abort)


@dataclass(frozen=True)
class RoleObs:
    """One role of one slot as observed: its workload's replicas and ready replicas, and why pods wait."""
    replicas: int = 0
    ready: int = 0
    unschedulable: str = ""  # the PodScheduled=False message of a Pending pod ("" = none)
    problems: tuple[str, ...] = ()  # e.g. "decode-b-0: CrashLoopBackOff", "not Ready for 600s"


@dataclass(frozen=True)
class SlotObs:
    roles: Mapping[str, RoleObs]
    router_ready: bool = True

    def ready(self) -> bool:
        return self.router_ready and bool(self.roles) and all(
            r.replicas >= 1 and r.ready >= r.replicas for r in self.roles.values())

    def unschedulable(self) -> str:
        return next((f"{role}: {r.unschedulable}" for role, r in sorted(self.roles.items()) if r.unschedulable), "")

    def problems(self) -> str:
        out = [f"{role}: {r.ready}/{r.replicas} Ready" for role, r in sorted(self.roles.items()) if r.ready < r.replicas]
        out += [p for _, r in sorted(self.roles.items()) for p in r.problems]
        if not self.router_ready:
            out.append("router not Ready")
        return "; ".join(out) or "no engine pods"


@dataclass(frozen=True)
class Figures:
    """The candidate's own figures (its router) over the current step so far."""
    requests: int = 0
    ttft_seconds: float | None = None  # at the SLO percentile
    e2e_p95_seconds: float | None = None
    error_ratio: float | None = None


@dataclass(frozen=True)
class Action:
    """A consumed rollout-action annotation (spec fields are in the Policy)."""
    verb: str
    revision: str
    key: str = ""  # the annotation's value, so one annotation is consumed once


@dataclass(frozen=True)
class RolloutObserved:
    now: float  # epoch seconds
    spec_revision: str  # the revision the current spec renders
    serving_revision: str  # status.servingRevision ("" before anything served)
    gpus_per_replica: Mapping[str, int]  # of each enabled role (candidate's spec)
    serving_replicas: Mapping[str, int] = field(default_factory=dict)  # desired replicas of the serving slot
    serving_gpus_per_replica: Mapping[str, int] = field(default_factory=dict)  # {} = gpus_per_replica
    serving: SlotObs | None = None
    # Only the candidate slot's workloads and pods that carry the candidate revision: after the candidate
    # was replaced by a newer change, pods of the older one in the same slot are not the candidate's.
    candidate: SlotObs | None = None
    figures: Figures | None = None
    old_live_requests: int | None = None  # running requests + live sessions on the draining slot (None: unknown)
    # Requests the serving revision served over the current step (None: unknown). 0 means nobody uses the
    # deployment: a step with too few candidate requests then passes unjudged after stepSeconds instead of
    # running into the progress deadline (an idle deployment must be able to roll out).
    serving_requests: int | None = None
    action: Action | None = None


@dataclass(frozen=True)
class State:
    """status.rollout."""
    phase: str = ""
    candidate_revision: str = ""
    candidate_slot: str = ""
    serving_slot: str = FIRST_SLOT
    draining_revision: str = ""
    draining_slot: str = ""
    step: int = 0
    steps: int = 0
    share: int = 0
    since: float = 0.0
    step_started_at: float = 0.0
    drain_started_at: float = 0.0
    in_place: int = 0
    # The candidate's replicas per role (() = one per role plus what InPlace handed over: a status written before
    # the candidate was sized by its share); waiting_since: when its growth for the next step began to wait for
    # surge room (the step passed; 0 = not waiting).
    candidate_replicas: tuple[tuple[str, int], ...] = ()
    waiting_since: float = 0.0
    # With maxSurgeGPUs 0: the surge this rollout may hold, fixed at its start (the candidate's GPUs at the serving
    # slot's replicas then), so a planner scale-up during the rollout does not raise its own budget.
    surge_gpus: int = 0
    reason: str = ""
    message: str = ""
    gate: tuple[tuple[str, str], ...] = ()
    # After a rollback or abort: the candidate's slot, out of the routing table, whose requests in flight the
    # controller lets finish before it is deleted (rollout/world.py); ended_at: when it ended.
    retiring_slot: str = ""
    ended_at: float = 0.0
    last_action: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def from_status(d: Mapping[str, Any] | None) -> State:
        d = d or {}
        ts = lambda k: _parse_time(d.get(k))  # noqa: E731
        return State(phase=d.get("phase", ""), candidate_revision=d.get("candidateRevision", ""),
                     candidate_slot=d.get("candidateSlot", ""), serving_slot=d.get("servingSlot", FIRST_SLOT),
                     draining_revision=d.get("drainingRevision", ""), draining_slot=d.get("drainingSlot", ""),
                     step=int(d.get("step") or 0), steps=int(d.get("steps") or 0), share=int(d.get("share") or 0),
                     since=ts("since"), step_started_at=ts("stepStartedAt"), drain_started_at=ts("drainStartedAt"),
                     in_place=int(d.get("inPlace") or 0), reason=d.get("reason", ""), message=d.get("message", ""),
                     candidate_replicas=tuple(sorted((str(k), int(v)) for k, v in
                                                     (d.get("candidateReplicas") or {}).items())),
                     waiting_since=ts("waitingSince"), surge_gpus=int(d.get("surgeGPUs") or 0),
                     retiring_slot=d.get("retiringSlot", ""), ended_at=ts("endedAt"),
                     gate=tuple(sorted((d.get("gate") or {}).items())),
                     last_action=tuple(sorted((d.get("lastAction") or {}).items())))

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase, "candidateRevision": self.candidate_revision, "candidateSlot": self.candidate_slot,
            "servingSlot": self.serving_slot, "drainingRevision": self.draining_revision,
            "drainingSlot": self.draining_slot, "step": self.step, "steps": self.steps, "share": self.share,
            "since": _format_time(self.since), "stepStartedAt": _format_time(self.step_started_at),
            "drainStartedAt": _format_time(self.drain_started_at), "inPlace": self.in_place,
            "candidateReplicas": dict(self.candidate_replicas), "waitingSince": _format_time(self.waiting_since),
            "surgeGPUs": self.surge_gpus,
            "reason": self.reason, "message": self.message, "gate": dict(self.gate),
            "retiringSlot": self.retiring_slot, "endedAt": _format_time(self.ended_at),
            "lastAction": dict(self.last_action)}
        return {k: v for k, v in out.items() if v not in ("", 0, {}, None)} | {"phase": self.phase}


def _format_time(t: float) -> str:
    if not t:
        return ""
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(s: Any) -> float:
    if not s:
        return 0.0
    import datetime as dt
    try:
        return dt.datetime.strptime(str(s), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class SlotPlan:
    """A slot that must exist. ``replicas`` None: the serving slot's own size (planner / minReplicas),
    less ``minus`` per role (InPlace hands that many replicas to the candidate)."""
    slot: str
    revision: str
    kind: str  # serving | candidate | draining
    share: int  # percent of new sessions
    accept_new: bool
    replicas: Mapping[str, int] | None = None
    minus: int = 0


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class RolloutDecision:
    state: State
    serving_revision: str
    slots: tuple[SlotPlan, ...]
    reconciling: str = ""  # kstatus Reconciling message ("" = not reconciling because of a rollout)
    reconciling_reason: str = ""
    stalled: tuple[str, str] | None = None  # (reason, message)
    events: tuple[Event, ...] = ()

    @property
    def serving_slot(self) -> str:
        return self.state.serving_slot


# ---------------------------------------------------------------------------------------------------
# helpers

def _gpus(per_replica: Mapping[str, int], replicas: Mapping[str, int]) -> int:
    return sum(per_replica.get(r, 0) * n for r, n in replicas.items())


def candidate_gpus(obs: RolloutObserved) -> int:
    """GPUs of the minimum canary: one replica of each enabled role."""
    return sum(obs.gpus_per_replica.values())


def full_size_gpus(obs: RolloutObserved) -> int:
    """GPUs of the candidate at the serving slot's replicas (at least one per role): the default surge."""
    return _gpus(obs.gpus_per_replica, target_replicas(obs, 100))


def surge_gpus(state: State, obs: RolloutObserved, policy: Policy) -> int:
    """The GPUs the candidate may hold beyond what the serving slot handed over: maxSurgeGPUs, or (0) the
    candidate's full size when this rollout started (status.rollout.surgeGPUs; now, for a status without it)."""
    return policy.max_surge_gpus or state.surge_gpus or full_size_gpus(obs)


def target_replicas(obs: RolloutObserved, share: int) -> dict[str, int]:
    """The candidate's replicas per role for a share of new sessions: ceil(serving replicas x share / 100), at
    least 1 (a role the serving slot does not run: 1)."""
    return {r: max(1, math.ceil(obs.serving_replicas.get(r, 1) * share / 100)) for r in obs.gpus_per_replica}


def candidate_size(state: State) -> dict[str, int] | None:
    """The candidate's replicas per role as status records them (None: a status from before sizing by share)."""
    return dict(state.candidate_replicas) if state.candidate_replicas else None


def _size(state: State, obs: RolloutObserved) -> dict[str, int]:
    size = candidate_size(state)
    if size is None:  # written by an operator that sized the candidate at one replica plus the in-place hand-over
        return {r: 1 + state.in_place for r in obs.gpus_per_replica}
    return {r: max(size.get(r, 1), state.in_place) for r in obs.gpus_per_replica}


def size_text(size: Mapping[str, int], obs: RolloutObserved) -> str:
    """'prefill 1/2, decode 1/2 replicas': the candidate's replicas per role of the serving slot's."""
    order = sorted(size, key=lambda r: (("prefill", "decode").index(r) if r in ("prefill", "decode") else 2, r))
    return ", ".join(f"{r} {size[r]}/{obs.serving_replicas.get(r, size[r])}" for r in order) + " replicas"


def surge_room(obs: RolloutObserved, policy: Policy, size: Mapping[str, int] | None = None,
               in_place: int = 0, state: State | None = None) -> tuple[bool, str]:
    """(room for a candidate of ``size`` replicas per role (default: one each) while the serving slot has handed
    ``in_place`` replicas per role over, the message when there is none). The candidate may hold the surge
    (``surge_gpus``: maxSurgeGPUs, 0 = its full size) beyond what the serving slot handed over, and with a
    gpuBudget both slots together at most gpuBudget + the surge."""
    size = dict(size) if size is not None else {r: 1 for r in obs.gpus_per_replica}
    need = _gpus(obs.gpus_per_replica, size)
    surge = surge_gpus(state or State(), obs, policy)
    sper = obs.serving_gpus_per_replica or obs.gpus_per_replica
    if policy.gpu_budget:
        serving = sum(sper.get(r, 0) * max(0, n - in_place) for r, n in obs.serving_replicas.items())
        left = policy.gpu_budget + surge - serving
    else:
        left = surge + in_place * sum(sper.get(r, 0) for r in obs.serving_replicas)
    parts = " + ".join(f"{obs.gpus_per_replica.get(r, 0) * n} {r}" for r, n in sorted(size.items()))
    if need <= left:
        return True, ""
    named = f"maxSurgeGPUs {surge}" if policy.max_surge_gpus else f"the surge {surge} (maxSurgeGPUs 0: the full size)"
    where = (f"gpuBudget {policy.gpu_budget} + {named} leaves {max(0, left)}" if policy.gpu_budget
             else f"{named} leaves {left}")
    held = f" with {in_place} replica(s) per role handed over in place" if in_place else ""
    return False, f"needs {need} GPUs ({parts}){held}; {where}"


def _plan_size(state: State, obs: RolloutObserved, policy: Policy, share: int,
               current: Mapping[str, int] | None = None) -> tuple[State, dict[str, int] | None, str]:
    """The candidate's next size for ``share``: (state with in_place, size, "") when it is at or can grow to
    ceil(serving x share), or one InPlace round towards it (one more replica per role handed over, the candidate
    one more per role); (state, None, why) when it cannot: no surge room (Wait), or the serving slot cannot spare
    another replica per role (InPlace; why names both)."""
    want = target_replicas(obs, share)
    cur = dict(current) if current is not None else _size(state, obs)
    if all(cur.get(r, 0) >= n for r, n in want.items()):
        return state, cur, ""
    size = {r: max(cur.get(r, 0), want[r]) for r in want}
    ok, why = surge_room(obs, policy, size, state.in_place, state)
    if ok:
        return state, size, ""
    if policy.when_no_surge_room != "InPlace":
        return state, None, why
    blocker = _in_place_blocker(obs, state)
    if blocker:
        return state, None, f"{why}; {blocker}"
    st = replace(state, in_place=state.in_place + 1)
    return st, {r: max(cur.get(r, 0), min(want[r], max(cur.get(r, 0) + 1, st.in_place))) for r in want}, ""


def _in_place_blocker(obs: RolloutObserved, state: State) -> str:
    """Why the serving slot cannot hand one more replica per role to the candidate ("" = it can): every role
    keeps at least one ready replica."""
    for role in sorted(obs.serving_replicas):
        want = obs.serving_replicas[role] - state.in_place
        ready = obs.serving.roles[role].ready if obs.serving and role in obs.serving.roles else 0
        if want < 2 or ready < 2:
            n = (obs.serving_gpus_per_replica or obs.gpus_per_replica).get(role, 0)
            return f"in-place needs 2 ready {role} replicas or room for one ({n} GPUs)"
    return ""


def _fmt_s(x: float) -> str:
    return f"{x:.2f}s"


def judge(fig: Figures, policy: Policy) -> tuple[bool, str, dict[str, str]]:
    """(passed, the failed figure vs its target, the gate figures for status). Missing latency figures
    with requests served count as a failure to measure, never as a pass."""
    ttft_max = policy.ttft_target_seconds * (1 + policy.ttft_tolerance)
    e2e_max = policy.e2e_target_seconds * (1 + policy.e2e_tolerance)
    p = policy.ttft_percentile
    gate = {"requests": str(fig.requests),
            "ttft": f"{'-' if fig.ttft_seconds is None else _fmt_s(fig.ttft_seconds)} / {_fmt_s(ttft_max)} p{p}",
            "e2e": f"{'-' if fig.e2e_p95_seconds is None else _fmt_s(fig.e2e_p95_seconds)} / {_fmt_s(e2e_max)} p95",
            "errors": f"{'-' if fig.error_ratio is None else f'{fig.error_ratio:.1%}'} / {policy.max_error_ratio:.1%}"}
    if fig.ttft_seconds is None or not math.isfinite(fig.ttft_seconds):
        return False, f"no TTFT p{p} figure from the candidate's router", gate
    if fig.ttft_seconds > ttft_max:
        return False, f"TTFT p{p} {_fmt_s(fig.ttft_seconds)} > {_fmt_s(ttft_max)} target", gate
    if fig.e2e_p95_seconds is not None and fig.e2e_p95_seconds > e2e_max:
        return False, f"e2e p95 {_fmt_s(fig.e2e_p95_seconds)} > {_fmt_s(e2e_max)} target", gate
    if fig.error_ratio is not None and fig.error_ratio > policy.max_error_ratio:
        return False, f"error ratio {fig.error_ratio:.1%} > {policy.max_error_ratio:.1%}", gate
    return True, "", gate


# ---------------------------------------------------------------------------------------------------
# the machine

def _serving_plan(state: State, obs: RolloutObserved, share: int = 100, accept_new: bool = True) -> SlotPlan:
    return SlotPlan(state.serving_slot, obs.serving_revision, "serving", share, accept_new, None, state.in_place)


def _candidate_plan(state: State, obs: RolloutObserved) -> SlotPlan:
    """The candidate takes sessions from step 1 on (also while it grows for the next step, at the step's share);
    its size is status.rollout.candidateReplicas (never below what InPlace handed over)."""
    serving = state.step > 0
    return SlotPlan(state.candidate_slot, state.candidate_revision, "candidate", state.share if serving else 0,
                    serving, _size(state, obs))


def _steady(state: State, obs: RolloutObserved, *, reconciling: str = "", stalled: tuple[str, str] | None = None,
            events: tuple[Event, ...] = ()) -> RolloutDecision:
    slots = [_serving_plan(state, obs)]
    if state.phase == DRAINING:
        slots.append(SlotPlan(state.draining_slot, state.draining_revision, "draining", 0, False))
    return RolloutDecision(state, obs.serving_revision, tuple(slots), reconciling, "RolloutProgressing" if reconciling else "",
                    stalled, events)


def at_rest(state: State, serving_revision: str) -> RolloutDecision:
    """decide() for a rollout that is over (Complete, nothing retiring) while the spec renders the serving
    revision: the serving slot alone, nothing to say. What an observe pass uses instead of a full rollout pass."""
    return _steady(state, RolloutObserved(now=0.0, spec_revision=serving_revision, serving_revision=serving_revision,
                                   gpus_per_replica={}))


def _ended(state: State, phase: str, reason: str, message: str, obs: RolloutObserved, event: str) -> RolloutDecision:
    """Candidate deleted (rollback or abort): the serving slot was never scaled down for a surge canary;
    InPlace gives back what it took (the serving slot returns to its size)."""
    st = replace(state, phase=phase, reason=reason, message=message, share=0, in_place=0, candidate_slot="",
                 candidate_replicas=(), waiting_since=0.0, retiring_slot=state.candidate_slot, ended_at=obs.now)
    stalled = (reason, f"rolled back {state.candidate_revision}: {message}") if phase == ROLLED_BACK else None
    ev = Event(event, f"{state.candidate_revision}: {message}", warning=phase == ROLLED_BACK)
    return RolloutDecision(st, obs.serving_revision, (_serving_plan(st, obs),), "", "", stalled, (ev,))


def _start(state: State, obs: RolloutObserved, policy: Policy) -> RolloutDecision:
    """A new candidate: the spec renders a revision that neither serves nor was already given up on."""
    slot = other_slot(state.serving_slot) if state.serving_slot else "a"
    base = State(serving_slot=state.serving_slot, candidate_revision=obs.spec_revision, candidate_slot=slot,
                 steps=len(policy.steps), since=obs.now, last_action=state.last_action,
                 surge_gpus=0 if policy.max_surge_gpus else full_size_gpus(obs))
    if not obs.serving_revision:  # nothing has served yet: the serving slot simply runs the spec
        return RolloutDecision(state, obs.spec_revision,
                        (SlotPlan(state.serving_slot, obs.spec_revision, "serving", 100, True),))
    if policy.strategy == "Recreate":
        st = replace(base, phase=RECREATING)
        return _recreating(st, obs, policy, (Event("RolloutStarted", f"recreating on {obs.spec_revision} (strategy "
                                                                    "Recreate: the serving engines are deleted)"),))
    # Sized for step 1's share (InPlace: one replica per role handed over first when that does not fit).
    first = policy.steps[0]
    st, size, why = _plan_size(base, obs, policy, first, current={r: 0 for r in obs.gpus_per_replica})
    if size is None:
        st = replace(base, phase=WAITING, candidate_slot="", reason="WaitingForSurgeRoom",
                     message=f"candidate {obs.spec_revision} {why}")
        return _waiting(st, obs, policy, (Event("WaitingForSurgeRoom", st.message, warning=True),))
    st = replace(st, phase=STARTING, candidate_replicas=tuple(sorted(size.items())))
    events = (Event("RolloutStarted", f"candidate {obs.spec_revision} in slot {slot} beside {obs.serving_revision} "
                                      f"at {size_text(size, obs)} (steps {', '.join(map(str, policy.steps))} % of new "
                                      "sessions)"),)
    if st.in_place:
        _, why = surge_room(obs, policy, size, state=st)
        st = replace(st, message=f"in place: {why}")
    return _with_events(_progress(st, obs), events)  # created now: judged from the next pass on


def _waiting(state: State, obs: RolloutObserved, policy: Policy, events: tuple[Event, ...] = ()) -> RolloutDecision:
    _, size, why = _plan_size(state, obs, policy, policy.steps[0], current={r: 0 for r in obs.gpus_per_replica})
    if size is not None:
        return _start(replace(state, phase=""), obs, policy)
    msg = f"candidate {state.candidate_revision} {why}"
    st = replace(state, message=msg)
    stalled = ("WaitingForSurgeRoom", msg) if obs.now - state.since > policy.progress_deadline_seconds else None
    d = _steady(st, obs, reconciling=msg if not stalled else "", stalled=stalled, events=events)
    return replace(d, reconciling_reason="WaitingForSurgeRoom" if d.reconciling else "")


def _progress(state: State, obs: RolloutObserved) -> RolloutDecision:
    msg = {STARTING: f"candidate {state.candidate_revision} starting in slot {state.candidate_slot}",
           CANARY: f"canary step {state.step}/{state.steps}: {state.share}% of new sessions on "
                   f"{state.candidate_revision}",
           PAUSED: f"paused at canary step {state.step}/{state.steps} ({state.share}% of new sessions on "
                   f"{state.candidate_revision})"}[state.phase]
    gate = dict(state.gate)
    if gate and state.phase in (CANARY, PAUSED):
        msg += f"; TTFT {gate['ttft']}, e2e {gate['e2e']}, errors {gate['errors']}, {gate['requests']} requests"
    if state.phase == STARTING and state.step:
        msg += f" (growing; {state.share}% of new sessions meanwhile)"
    msg += f"; candidate {size_text(_size(state, obs), obs)}"
    if state.in_place:
        msg += f"; in place: {state.in_place} replica(s) per role moved from {obs.serving_revision}"
    slots = (_serving_plan(state, obs, 100 - (state.share if state.step else 0)), _candidate_plan(state, obs))
    return RolloutDecision(state, obs.serving_revision, slots, msg, "RolloutProgressing")


def _starting(state: State, obs: RolloutObserved, policy: Policy, events: tuple[Event, ...] = ()) -> RolloutDecision:
    """The candidate slot was created (step 0) or grown for the step after ``step`` (it keeps that step's share
    meanwhile): on to the next share once every pod of it is Ready, within progressDeadlineSeconds of the start
    (step 0) or of the growth."""
    cand = obs.candidate
    growing = state.step > 0
    since = state.step_started_at if growing else state.since
    size = _size(state, obs)
    if cand is not None and cand.ready() and (cand.roles.keys() >= obs.gpus_per_replica.keys()):
        st = replace(state, reason="", message="")
        if growing and policy.paused:  # grown; held at its step until resumed (then judged afresh)
            return _with_events(_progress(replace(st, phase=PAUSED), obs), events)
        return _advance(st, obs, policy, events, f"passed {state.steps} steps")
    if growing and (cand is None or any(r.ready == 0 for r in cand.roles.values()) or not cand.router_ready):
        why = cand.problems() if cand is not None else "candidate workloads gone"
        return _ended(state, ROLLED_BACK, "CandidateUnavailable", f"lost readiness at step {state.step}/{state.steps} "
                                                                  f"while growing: {why}", obs, "RolledBack")
    if cand is not None and cand.unschedulable() and policy.when_no_surge_room == "Wait" and not state.in_place:
        # The cluster has no room (the budget had): the pods wait Pending, the serving revision is untouched.
        msg = (f"candidate {state.candidate_revision} needs {_gpus(obs.gpus_per_replica, size)} GPUs for "
               f"{size_text(size, obs)}: {cand.unschedulable()}")
        stalled = ("WaitingForSurgeRoom", msg) if obs.now - since > policy.progress_deadline_seconds else None
        st = replace(state, reason="WaitingForSurgeRoom", message=msg)
        d = _progress(st, obs)
        return replace(d, reconciling="" if stalled else msg, reconciling_reason="WaitingForSurgeRoom",
                       stalled=stalled, events=events)
    if cand is not None and cand.unschedulable() and policy.when_no_surge_room == "InPlace" \
            and state.in_place < max(size.values()) and not _in_place_blocker(obs, state):
        st = replace(state, in_place=state.in_place + 1, message=f"in place: {cand.unschedulable()}")
        return _with_events(_progress(st, obs), events)
    if obs.now - since > policy.progress_deadline_seconds:
        why = cand.problems() if cand is not None else "no candidate workloads"
        what = f"growing to {size_text(size, obs)}" if growing else "it started"
        return _ended(state, ROLLED_BACK, "CandidateNotReady",
                      f"not Ready {int(obs.now - since)}s after {what} (progressDeadlineSeconds "
                      f"{int(policy.progress_deadline_seconds)}): {why}", obs, "RolledBack")
    return _with_events(_progress(state, obs), events)


def _advance(state: State, obs: RolloutObserved, policy: Policy, events: tuple[Event, ...], how: str,
             final: bool = False) -> RolloutDecision:
    """Step ``state.step`` is over (0: the candidate came up; ``final``: promote now): on to the next share, or
    promotion after the last. When the next share needs more replicas (ceil(serving x share)) the candidate grows
    first and goes back to Starting at the current share; promotion needs the serving slot's size, so it never
    moves new sessions to a smaller fleet. No surge room: Wait holds at the current share (the step passed);
    InPlace proceeds at the size it reached once the serving slot cannot spare another replica per role."""
    last = final or state.step >= len(policy.steps)
    share = 100 if last else policy.steps[state.step]
    what = "promotion" if last else f"step {state.step + 1}/{state.steps} ({share}%)"
    cur = _size(state, obs)
    st, size, why = _plan_size(state, obs, policy, share, cur)
    if size is None and policy.when_no_surge_room == "Wait" and state.step > 0:
        want = target_replicas(obs, share)
        msg = f"candidate {state.candidate_revision} {why}, to grow to {size_text(want, obs)} for {what}"
        first = not state.waiting_since or state.message != msg
        st = replace(state, phase=CANARY, waiting_since=state.waiting_since or obs.now, reason="WaitingForSurgeRoom",
                     message=msg)
        stalled = (("WaitingForSurgeRoom", msg) if obs.now - st.waiting_since > policy.progress_deadline_seconds
                   else None)
        d = _progress(st, obs)
        return replace(d, reconciling="" if stalled else msg, reconciling_reason="WaitingForSurgeRoom",
                       stalled=stalled,
                       events=events + ((Event("WaitingForSurgeRoom", msg, warning=True),) if first else ()))
    if size is None:  # InPlace: the serving slot keeps its last ready replica per role (or step 0: re-sized later)
        st, size = state, cur
    st = replace(st, waiting_since=0.0, reason="", message="")
    if any(size[r] > cur.get(r, 0) for r in size) or st.in_place != state.in_place:
        st = replace(st, phase=STARTING, candidate_replicas=tuple(sorted(size.items())), step_started_at=obs.now)
        grow = Event("CandidateGrowing", f"{state.candidate_revision}: growing to {size_text(size, obs)} for {what}"
                     + (f"; {state.share}% of new sessions meanwhile" if state.step else "")
                     + (f"; in place: {st.in_place} replica(s) per role handed over" if st.in_place else ""))
        return _with_events(_progress(st, obs), events + (grow,))
    if last:
        return _with_events(_promote(st, obs, how), events)
    st = replace(st, phase=CANARY, step=state.step + 1, share=share, step_started_at=obs.now)
    if state.step == 0:
        events = events + (Event("CandidateReady", f"{state.candidate_revision}: step 1/{st.steps}, {st.share}% of "
                                                   f"new sessions at {size_text(size, obs)}"),)
    return _with_events(_progress(st, obs), events)


def _with_events(d: RolloutDecision, events: tuple[Event, ...]) -> RolloutDecision:
    return replace(d, events=tuple(events) + d.events) if events else d


def _promote(state: State, obs: RolloutObserved, how: str) -> RolloutDecision:
    st = State(phase=DRAINING, serving_slot=state.candidate_slot, draining_revision=obs.serving_revision,
               draining_slot=state.serving_slot, drain_started_at=obs.now, steps=state.steps, step=state.step,
               share=100, since=state.since, gate=state.gate, last_action=state.last_action,
               reason="Promoted", message=f"{state.candidate_revision} promoted ({how}); draining "
                                          f"{obs.serving_revision}")
    slots = (SlotPlan(st.serving_slot, state.candidate_revision, "serving", 100, True),
             SlotPlan(st.draining_slot, obs.serving_revision, "draining", 0, False))
    return RolloutDecision(st, state.candidate_revision, slots, f"draining {obs.serving_revision}: no new sessions",
                    "RolloutProgressing", None, (Event("Promoted", st.message),))


def _canary(state: State, obs: RolloutObserved, policy: Policy) -> RolloutDecision:
    cand = obs.candidate
    if cand is None or any(r.ready == 0 for r in cand.roles.values()) or not cand.router_ready:
        why = cand.problems() if cand is not None else "candidate workloads gone"
        return _ended(state, ROLLED_BACK, "CandidateUnavailable", f"lost readiness at step {state.step}/{state.steps}: "
                                                                  f"{why}", obs, "RolledBack")
    if state.phase == PAUSED:
        if policy.paused:
            return _progress(state, obs)
        # a resumed step is judged afresh (also one that had passed and waited for room to grow)
        state = replace(state, phase=CANARY, step_started_at=obs.now, waiting_since=0.0, reason="", message="")
    elif policy.paused:
        return _progress(replace(state, phase=PAUSED), obs)
    if state.waiting_since:  # the step passed; its growth waits for surge room
        return _advance(state, obs, policy, (), f"passed {state.steps} steps")
    fig = obs.figures or Figures()
    held = obs.now - state.step_started_at
    ok, why, gate = judge(fig, policy)
    state = replace(state, gate=tuple(sorted(gate.items())))
    idle = obs.serving_requests == 0 and fig.requests < policy.min_requests_per_step
    if held >= policy.step_seconds and idle:
        ok, why = True, ""
        state = replace(state, gate=tuple(sorted({**gate, "note": "no traffic: passed unjudged"}.items())))
        gate = dict(state.gate)
    elif held < policy.step_seconds or fig.requests < policy.min_requests_per_step:
        if held > policy.progress_deadline_seconds:
            return _ended(state, ROLLED_BACK, "StepNotJudged",
                          f"step {state.step}/{state.steps} ({state.share}%) saw {fig.requests} requests in "
                          f"{int(held)}s, fewer than minRequestsPerStep {policy.min_requests_per_step} within "
                          f"progressDeadlineSeconds {int(policy.progress_deadline_seconds)}", obs, "RolledBack")
        return _progress(state, obs)  # not judged yet: a few slow requests early in a step fail nothing
    if not ok:
        return _ended(state, ROLLED_BACK, "GateFailed", f"{why} at step {state.step}/{state.steps} ({state.share}%)",
                      obs, "RolledBack")
    passed = Event("StepPassed", f"{state.candidate_revision} step {state.step}/{state.steps} ({state.share}%): "
                                 f"TTFT {gate['ttft']}, e2e {gate['e2e']}, errors {gate['errors']}, "
                                 f"{fig.requests} requests" + (f"; {gate['note']}" if "note" in gate else ""))
    return _advance(state, obs, policy, (passed,), f"passed {state.steps} steps")


def _draining(state: State, obs: RolloutObserved, policy: Policy) -> RolloutDecision:
    held = obs.now - state.drain_started_at
    idle = obs.old_live_requests == 0
    if idle or held >= policy.drain_deadline_seconds:
        how = "its live sessions ended" if idle else f"drainDeadlineSeconds {int(policy.drain_deadline_seconds)}"
        st = replace(state, phase=COMPLETE, draining_revision="", draining_slot="", drain_started_at=0.0,
                     candidate_revision="", candidate_slot="", share=0, reason="Complete",
                     message=f"{obs.serving_revision} serves; {state.draining_revision} deleted ({how})")
        d = RolloutDecision(st, obs.serving_revision, (_serving_plan(st, obs),), "", "", None,
                     (Event("RolloutComplete", st.message),))
        if obs.spec_revision != obs.serving_revision:  # another change waited for the drain
            return _with_events(decide(st, obs, policy), d.events)
        return d
    live = "unknown" if obs.old_live_requests is None else str(obs.old_live_requests)
    return _steady(state, obs, reconciling=f"draining {state.draining_revision}: {live} live requests/sessions, "
                                           f"{int(held)}s of drainDeadlineSeconds {int(policy.drain_deadline_seconds)}")


def _recreating(state: State, obs: RolloutObserved, policy: Policy, events: tuple[Event, ...] = ()) -> RolloutDecision:
    cand = obs.candidate
    if cand is not None and cand.ready():
        st = replace(state, phase=COMPLETE, serving_slot=state.candidate_slot, candidate_revision="",
                     candidate_slot="", reason="Complete", message=f"{state.candidate_revision} serves (recreated)")
        return RolloutDecision(st, state.candidate_revision, (SlotPlan(st.serving_slot, state.candidate_revision, "serving",
                                                                100, True),),
                        events=events + (Event("RolloutComplete", st.message),))
    plan = SlotPlan(state.candidate_slot, state.candidate_revision, "candidate", 100, True, None)
    msg = f"recreating on {state.candidate_revision}: {cand.problems() if cand else 'starting'}"
    stalled = (("CandidateNotReady", msg) if obs.now - state.since > policy.progress_deadline_seconds else None)
    return RolloutDecision(state, obs.serving_revision, (plan,), "" if stalled else msg, "RolloutProgressing", stalled, events)


def _record_action(state: State, obs: RolloutObserved, verb: str, revision: str, source: str, result: str) -> State:
    return replace(state, last_action=tuple(sorted({"verb": verb, "revision": revision, "source": source,
                                                    "at": _format_time(obs.now), "result": result,
                                                    **({"key": obs.action.key} if source == "annotation" and obs.action
                                                       else {})}.items())))


def _actions(state: State, obs: RolloutObserved, policy: Policy) -> tuple[State, Policy, str]:
    """Fold the annotation action into the policy for this pass (pause/resume set paused, promote/abort name a
    revision); an action that names no current candidate is recorded as ignored, never applied silently.
    Returns (state with lastAction, effective policy, verb applied now or '')."""
    last = dict(state.last_action)
    applied = ""
    if obs.action is not None and last.get("key") != obs.action.key:
        a = obs.action
        live = state.phase in (STARTING, CANARY, PAUSED, WAITING)
        given_up = state.phase in (ROLLED_BACK, ABORTED) and a.verb == "resume"
        if a.revision != state.candidate_revision or not (live or given_up):
            why = (f"{a.revision} is not the current candidate ({state.candidate_revision or 'none'})"
                   if a.revision != state.candidate_revision or state.phase not in (ROLLED_BACK, ABORTED)
                   else f"{a.revision} was {state.phase.lower()}: resume/{a.revision} retries it")
            state = _record_action(state, obs, a.verb, a.revision, "annotation", f"ignored: {why}")
        else:
            state = _record_action(state, obs, a.verb, a.revision, "annotation", "applied")
            applied = a.verb
    elif obs.action is not None and last.get("key") == obs.action.key and last.get("result") == "applied" \
            and obs.action.revision == state.candidate_revision:
        # A pause holds while it is set; so does a promote (a candidate smaller than the serving slot grows first).
        applied = obs.action.verb if obs.action.verb in ("pause", "promote") else ""
    if applied == "pause":
        policy = replace(policy, paused=True)
    elif applied == "resume":
        policy = replace(policy, paused=False)
    elif applied == "promote":
        policy = replace(policy, promote=state.candidate_revision)
    elif applied == "abort":
        policy = replace(policy, abort=state.candidate_revision)
    for verb, rev in (("promote", policy.promote), ("abort", policy.abort)):
        if rev and rev != state.candidate_revision and last.get("revision") != rev:
            state = _record_action(state, obs, verb, rev, "spec",
                                   f"ignored: {rev} is not the current candidate ({state.candidate_revision or 'none'})")
    return state, policy, applied


def decide(state: State, obs: RolloutObserved, policy: Policy) -> RolloutDecision:
    """The next rollout state, the slots that must exist and what status and Events say."""
    state, policy, applied = _actions(state, obs, policy)
    spec, serving = obs.spec_revision, obs.serving_revision
    phase = state.phase
    if phase == DRAINING:
        return _draining(state, obs, policy)
    if phase == RECREATING:
        if spec != state.candidate_revision:
            state = replace(state, candidate_revision=spec, since=obs.now)
        return _recreating(state, obs, policy)
    live = phase in (STARTING, CANARY, PAUSED, WAITING)
    if live and spec == serving:
        return _ended(state, ABORTED, "SpecReverted", "the spec renders the serving revision again", obs,
                      "RolloutAborted")
    if live and spec != state.candidate_revision:  # a newer change replaces the candidate (same slot)
        d = _start(replace(state, phase=""), obs, policy)
        return _with_events(d, (Event("CandidateReplaced", f"{state.candidate_revision} replaced by {spec}"),))
    if live and policy.abort == state.candidate_revision:
        return _ended(state, ABORTED, "Aborted", f"aborted ({'annotation' if applied == 'abort' else 'spec.rollout.abort'})",
                      obs, "RolloutAborted")
    if live and policy.promote == state.candidate_revision and phase != WAITING:
        if obs.candidate is not None and obs.candidate.ready():  # at the serving size first (it may grow)
            return _advance(state, obs, policy, (), "promote " + ("annotation" if applied == "promote"
                                                                  else "spec.rollout.promote"), final=True)
        if phase == CANARY or phase == PAUSED:
            return _canary(state, obs, policy)
        return _starting(state, obs, policy)
    if phase == WAITING:
        return _waiting(state, obs, policy)
    if phase == STARTING:
        return _starting(state, obs, policy)
    if phase in (CANARY, PAUSED):
        return _canary(state, obs, policy)
    # No rollout in progress.
    if spec == serving or not spec:
        if phase in (ROLLED_BACK, ABORTED):  # the spec went back to what serves: the failure is history
            state = replace(state, phase=COMPLETE, reason="", message="", candidate_revision="")
        return _steady(state, obs)
    if phase in (ROLLED_BACK, ABORTED) and spec == state.candidate_revision:
        if applied != "resume":
            stalled = (state.reason, f"rolled back {spec}: {state.message}") if phase == ROLLED_BACK else None
            return _steady(state, obs, stalled=stalled,
                           reconciling="" if stalled else f"{spec} was aborted: change the spec, or "
                                                          f"resume/{spec} to retry")
        d = _start(replace(state, phase=""), obs, policy)
        return d
    return _start(state, obs, policy)


def candidate_figures(windows: Mapping[str, Any], router: Any) -> Figures:
    """The candidate's own Figures over the step from its engines' role windows (metrics WindowFigures by role)
    and its router's window (RouterFigures), read as status.slo reads the whole deployment: TTFT from prefill
    when prefill finished requests (else decode), e2e and requests from the router when it saw any (else decode),
    errors per router request."""
    pre, dec = windows.get("prefill"), windows.get("decode")
    ttft_w = pre if pre is not None and pre.requests else dec
    ttft = ttft_w.ttft_s if ttft_w is not None else None
    routed = router is not None and router.requests > 0
    e2e = router.e2e_p95_s if routed and router.e2e_p95_s is not None else (dec.e2e_p95_s if dec is not None else None)
    requests = router.requests if routed else (dec.requests if dec is not None else 0.0)
    errors = (router.errors / (router.requests + router.errors)) if router is not None and (
        router.requests + router.errors) > 0 else None
    return Figures(requests=int(round(requests)), ttft_seconds=ttft, e2e_p95_seconds=e2e, error_ratio=errors)
