"""One reconcile pass's rollout part (pure): the objects the controller observed -> what it must apply.

``rollout_pass(obj, status, world, ...)`` reads status.rollout and status.servingRevision, the deployment's
engine workloads, engine pods, slot routers and ControllerRevisions, the candidate's step figures and the
rollout-action annotation; runs ``machine.decide``; and returns every desired object (``render()`` of the slots
it decided), the ControllerRevisions to create, status.rollout / status.revisions and Events.

A deployment that has never rolled out and whose spec renders the serving revision renders slot "" alone (plus
the ControllerRevision that records its spec, so a later rollout can still render it). ``resting_slot`` and
``rest_pass`` are the same for a pass that needs no decision: the slot it renders, and what status keeps.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..api import v1alpha1 as api
from ..render import gateway
from ..render import labels as L
from ..render import render
from ..render.engine import replica_commands, startup_seconds
from ..render.resolve import resolve
from ..render.slots import SlotSpec, spec_revision
from ..render.timing import PodTiming
from ..roles import FIRST_SLOT
from . import machine as M
from .slots import controller_revision, slot_observation, slot_specs, spec_of


@dataclass(frozen=True)
class World:
    """What the controller observed for one deployment (plain API objects)."""
    now: float
    workloads: Sequence[dict[str, Any]] = ()  # its Deployments and LeaderWorkerSets (engines and routers)
    pods: Sequence[dict[str, Any]] = ()  # its engine pods and router pods
    controller_revisions: Sequence[dict[str, Any]] = ()
    figures: M.Figures | None = None  # the candidate's, over the current step
    old_live_requests: int | None = None  # running requests + live sessions of the draining slot
    serving_requests: int | None = None  # requests the serving revision served over the current step
    # running + waiting requests on a rolled-back candidate's engines, measured after it left the routing
    # table (None: not measured yet)
    retiring_live_requests: int | None = None


@dataclass(frozen=True)
class RolloutPass:
    objects: list[dict[str, Any]]  # every desired object (apply; prune the rest)
    create: list[dict[str, Any]]  # ControllerRevisions to create if absent (they are immutable)
    rollout_status: dict[str, Any] | None  # status.rollout (None: absent)
    revisions_status: list[dict[str, Any]]
    serving_revision: str  # what the serving slot runs ("" before anything served)
    decision: M.RolloutDecision | None
    events: tuple[M.Event, ...] = field(default=())


def annotation_action(obj: api.V41FlashDeployment) -> tuple[M.Action | None, M.Event | None]:
    value = (obj.metadata.get("annotations") or {}).get(api.ROLLOUT_ACTION_ANNOTATION)
    if not value:
        return None, None
    try:
        verb, rev = api.parse_rollout_action(value)
    except ValueError as e:
        return None, M.Event("RolloutActionIgnored", str(e), warning=True)
    return M.Action(verb, rev, key=value.strip()), None


def _recorded(world: World) -> dict[str, tuple[api.V41FlashDeploymentSpec, int]]:
    out = {}
    for cr in world.controller_revisions:
        rev = ((cr.get("metadata") or {}).get("labels") or {}).get(L.REVISION_LABEL)
        if rev:
            out[rev] = (spec_of(cr), int(cr.get("revision") or 0))
    return out


def rollout_pass(obj: api.V41FlashDeployment, status: dict[str, Any], world: World,
                 replicas: dict[str, int | None] | None = None, owner: dict[str, Any] | None = None,
                 timing: PodTiming | None = None, operator_namespace: str | None = None) -> RolloutPass:
    name = obj.metadata["name"]
    namespace = obj.metadata.get("namespace") or "default"
    timing = timing or PodTiming()
    spec_rev = spec_revision(obj, timing)
    serving_rev = status.get("servingRevision") or ""
    state = M.State.from_status(status.get("rollout"))
    recorded = _recorded(world)
    specs = {rev: spec for rev, (spec, _) in recorded.items()}
    specs[spec_rev] = obj.spec
    number = max((n for _, n in recorded.values()), default=0)

    def record(rev: str, spec: api.V41FlashDeploymentSpec) -> list[dict[str, Any]]:
        if rev in recorded or not rev:
            return []
        return [controller_revision(name, namespace, rev, spec, number + 1, owner)]

    action, bad = annotation_action(obj)
    extra_events = (bad,) if bad else ()
    if state.phase == "" and (not serving_rev or spec_rev == serving_rev) and state.serving_slot == FIRST_SLOT:
        # Never rolled out and nothing to roll: slot "" alone, and the record of what serves.
        objects = render(obj, replicas=replicas, owner=owner, timing=timing, operator_namespace=operator_namespace)
        return RolloutPass(objects, record(spec_rev, obj.spec), None, [], serving_rev or spec_rev, None, extra_events)
    if serving_rev and serving_rev not in specs:
        raise ValueError(f"no ControllerRevision {name}-{serving_rev} records the serving revision's spec: it cannot "
                         "be rendered after the spec changed (delete status.servingRevision to adopt the spec as is)")

    res = resolve(obj.spec)
    gpus = {rr.role: rr.gpus_per_replica for rr in res.enabled_roles}
    serving_spec = specs.get(serving_rev, obj.spec)
    if serving_spec.routing.mode != obj.spec.routing.mode and obj.spec.rollout.strategy != "Recreate":
        # what the CRD refuses against the previous object, here against what serves (a spec changed with Recreate,
        # then set back to Canary mid-rollout, passes the CRD): applying would prune the serving front door
        raise ValueError(f"spec.routing.mode: {serving_spec.routing.mode} serves, the spec asks for "
                         f"{obj.spec.routing.mode}: {api.ROUTING_MODE_CHANGE}")
    sres = resolve(serving_spec)
    roles_of = lambda r: [rr.role for rr in r.enabled_roles]  # noqa: E731
    routers = [w for w in world.workloads  # vllm-router's Deployments, or mode Gateway's endpoint pickers
               if (w.get("metadata") or {}).get("labels", {}).get(L.ROLE_LABEL) in (L.ROUTER, gateway.EPP)]
    serving_obs = slot_observation(name, state.serving_slot, serving_rev, world.workloads, world.pods, routers,
                                   roles_of(sres)) if serving_rev else None
    cand_obs = None
    if state.candidate_revision and (state.candidate_slot or state.phase == M.RECREATING):
        cslot = state.candidate_slot
        cand_obs = slot_observation(name, cslot, state.candidate_revision, world.workloads, world.pods, routers,
                                    roles_of(resolve(specs.get(state.candidate_revision, obj.spec))))
    startup = max(startup_seconds(replica_commands(obj.spec, res, rr.role).leader, timing) for rr in res.enabled_roles)
    policy = M.policy_from_spec(obj.spec, startup)
    serving_replicas = {rr.role: ((replicas or {}).get(rr.role) if (replicas or {}).get(rr.role) is not None
                                  else rr.min_replicas) for rr in sres.enabled_roles}
    observed = M.RolloutObserved(now=world.now, spec_revision=spec_rev, serving_revision=serving_rev, gpus_per_replica=gpus,
                          serving_replicas=serving_replicas,
                          serving_gpus_per_replica={rr.role: rr.gpus_per_replica for rr in sres.enabled_roles},
                          serving=serving_obs, candidate=cand_obs, figures=world.figures,
                          old_live_requests=world.old_live_requests, serving_requests=world.serving_requests,
                          action=action)
    d = M.decide(state, observed, policy)
    st = d.state
    retiring = None
    if st.retiring_slot:
        retiring = _retiring(name, st, world, policy, specs, {p.slot for p in d.slots})
        if retiring is None:
            st = replace(st, retiring_slot="")
            d = replace(d, state=st)
    live = {p.revision for p in d.slots}
    plans = slot_specs(d.slots, specs, replicas)
    if unscoped_router_live(world.pods) and any(p.kind == "serving" for p in d.slots):
        # A router from before every deployment had a front discovers engines of every revision: no candidate pod
        # may exist until the front (the session proxy before revision-scoped routers) has replaced it. (Recreate
        # has no serving slot: its outage is accepted, and the front waits for the candidate's router.)
        plans = [p if p.replicas is None or p.slot == state.serving_slot else
                 replace(p, replicas={r: 0 for r in p.replicas}) for p in plans]
    if retiring is not None:
        plans = [*plans, retiring]
    objects = render(obj, plans, owner=owner, timing=timing, operator_namespace=operator_namespace)
    # Records: every live revision, and the previous serving one (a fast way back after promotion).
    create = [cr for rev in sorted(live) for cr in record(rev, specs.get(rev, obj.spec))]
    if st.phase == "":
        rollout_status = None
    else:
        rollout_status = st.to_status()
    revisions = [{"revision": p.revision, "slot": p.slot, "share": p.share, "acceptNew": p.accept_new,
                  **{role: _ready(o) for role, o in _obs_roles(p, serving_obs, cand_obs, st, serving_rev)}}
                 for p in d.slots]
    return RolloutPass(objects, create, rollout_status, revisions, d.serving_revision, d, extra_events + d.events)


def resting_slot(status: dict[str, Any]) -> str:
    """The slot a pass renders the spec in when no rollout decides: the serving one status records ("" before
    any rollout)."""
    return M.State.from_status(status.get("rollout")).serving_slot


def rest_pass(status: dict[str, Any], objects: Sequence[dict[str, Any]]) -> RolloutPass:
    """rollout_pass for a deployment at rest after a rollout (``rollout.progress.at_rest``), from status alone and
    the objects render() made of the spec in ``resting_slot``: status.rollout as it is. An observe pass then needs
    no pod, ControllerRevision or child list. status.revisions is carried; its ready counts are the last full
    pass's (status.prefill / status.decode are current)."""
    state = M.State.from_status(status.get("rollout"))
    rev = status.get("servingRevision") or ""
    return RolloutPass(list(objects), [], state.to_status(), list(status.get("revisions") or []), rev,
                       M.at_rest(state, rev))


RETIRE_MAX_SECONDS = 120.0  # a rolled-back candidate's requests in flight get at most this long (or drainDeadline)


def _retiring(name: str, st: M.State, world: World, policy: M.Policy, specs: dict, taken: set[str]):
    """The SlotSpec keeping a rolled-back (or aborted) candidate's slot out of the routing table until its
    requests in flight finished (None: it may go now). New requests no longer reach it; a session of it is
    reassigned by the front (re-prefills once)."""
    if st.phase not in (M.ROLLED_BACK, M.ABORTED) or st.retiring_slot in taken or st.candidate_revision not in specs:
        return None
    if world.now - st.ended_at >= min(policy.drain_deadline_seconds, RETIRE_MAX_SECONDS) or \
            world.retiring_live_requests == 0:
        return None
    replicas = {}
    for w in world.workloads:
        labels = (w.get("metadata") or {}).get("labels") or {}
        if labels.get(L.SLOT_LABEL) == st.retiring_slot and labels.get(L.REVISION_LABEL) == st.candidate_revision \
                and labels.get(L.ROLE_LABEL) in ("prefill", "decode"):
            replicas[labels[L.ROLE_LABEL]] = int((w.get("spec") or {}).get("replicas") or 0)
    if not replicas:
        return None  # already gone
    return SlotSpec(st.retiring_slot, specs[st.candidate_revision], replicas, share=0, accept_new=False, routed=False)


def unscoped_router_live(pods: Sequence[dict[str, Any]]) -> bool:
    """A router pod from before every deployment had a front (session proxy and vllm-router in one pod: neither a
    front nor a slot router) still runs: a deployment created by an operator before 2026-12-07, on its way to the
    front-plus-slots layout (docs/decisions/2026-12-07-one-renderer.md)."""
    for p in pods:
        labels = (p.get("metadata") or {}).get("labels") or {}
        if labels.get(L.ROLE_LABEL) == L.ROUTER and L.FRONT_LABEL not in labels and L.SLOT_LABEL not in labels \
                and not p["metadata"].get("deletionTimestamp"):
            return True
    return False


def _obs_roles(p: M.SlotPlan, serving: M.SlotObs | None, cand: M.SlotObs | None, st: M.State, serving_rev: str):
    o = serving if p.revision == serving_rev else cand if p.revision == st.candidate_revision else None
    return sorted(o.roles.items()) if o is not None else []


def _ready(r: M.RoleObs) -> str:
    return f"{r.ready}/{r.replicas}"
