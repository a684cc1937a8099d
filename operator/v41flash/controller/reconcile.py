"""One level-triggered reconcile pass: named steps in order, then one status, then what to report.

    prepare_spec -> STEPS, stopping at the first stall -> observe -> status -> report

* ``prepare_spec`` validates and renders the spec in the slot that serves (cached per deployment); a spec the
  operator cannot realize stalls BEFORE anything is applied, so a running deployment keeps running on its last
  good spec.
* ``STEPS``, the same for every pass, each doing only what its pass needs:
  ``decide_slots`` (a rollout recorded in status, or a spec that renders another revision than the serving one:
  list what runs and let the rollout decide the slots, rollout/world.rollout_pass; the pass then applies and
  prunes), ``list_children`` (when the pass prunes), ``check_kinds``, ``apply_children`` (never adopting someone
  else's name), ``prune``, ``keep_records`` (the ControllerRevisions: the spec's, or those a rollout needs).
  An observe pass lists nothing and applies nothing, before or after a rollout.
* ``observe`` reads what runs for status; ``status.deployment_status`` computes it (the one place);
  ``report`` posts the Events and writes the status only when it changed.

Runs on create/update/resume, on the timer and on our workloads' events, always the whole pipeline (an
observe pass applies nothing), so any drift or missed event is repaired by a later pass.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..pods import is_ready
from ..render import compute_domain, dra, gateway
from ..render import labels as L
from ..render.resolve import LEADER_WORKER_SET
from ..render.revision import revision_of
from ..rollout import progress
from ..rollout.progress import StepFigures
from ..rollout.world import RolloutPass, rest_pass
from .apply import WORKLOAD_KINDS, apply_all, name_collisions
from .autoscale import PlannerOutcome, iso_time
from .desired import prepare
from .kube import ChildRef, KubeAPI, is_conflict
from .memory import DeploymentMemory, Memory
from .revisions import keep_records as keep_rollout_records
from .revisions import record, rollout_from_what_runs
from .status import Stall, deployment_status

log = logging.getLogger(__name__)

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message) → a Kubernetes Event


def now_iso() -> str:
    return iso_time(time.time())


@dataclass
class Outcome:
    status: dict[str, Any]
    status_written: bool = False
    applied: list[str] = field(default_factory=list)  # objects created or changed by this pass
    pruned: list[str] = field(default_factory=list)
    stall: Stall | None = None
    capacity: bool = False  # the cluster refused an object for capacity: retry later, with backoff
    conflict: bool = False  # the status changed under us: the caller re-reads and passes again
    body: dict[str, Any] | None = None  # the CR as our status write returned it
    desired: frozenset[ChildRef] = frozenset()  # what this spec renders (prune needs a list only when it moves)


@dataclass(frozen=True)
class Pass:
    """What one pass does besides computing status. The default is everything (create/update/resume).

    apply=False observes only: the workloads come from `workloads` (a watch cache) or are read by name.
    prune=False skips listing what exists, for passes where nothing undesired can be there (a new CR);
    a set of refs lists only when the desired set differs from it (the set a previous pass pruned against).
    """
    apply: bool = True
    prune: bool | frozenset[ChildRef] = True
    workloads: Callable[[str, str], dict[ChildRef, dict[str, Any]]] | None = None  # (namespace, uid) → live
    # told each workload this pass applied or listed (as the apiserver returned it): the watch cache behind
    # `workloads` may deliver it much later
    seen: Callable[[dict[str, Any]], None] | None = None


FULL = Pass()


@dataclass(frozen=True)
class Io:
    """What the steps use besides the pass's data: the apiserver, and what this process remembers."""
    kube: KubeAPI
    mem: DeploymentMemory  # of this deployment
    figures: StepFigures  # the rollout's scrapes


@dataclass(frozen=True)
class PassState:
    """One pass's data, handed from step to step: the CR as delivered, what the spec wants, what runs, what
    the pass did, and why it stopped (a stall)."""
    body: dict[str, Any]
    how: Pass
    planner: PlannerOutcome | None
    previous: dict[str, Any]  # the status the CR carries
    problems: tuple = ()  # what validation refused
    model: api.V41FlashDeployment | None = None
    desired: tuple[dict[str, Any], ...] = ()  # every object this pass applies (the rest is pruned)
    spec_revision: str | None = None  # the serving revision the spec renders
    rolled: RolloutPass | None = None
    records: tuple[dict[str, Any], ...] | None = None  # the ControllerRevisions a rollout pass listed
    live: Mapping[ChildRef, dict[str, Any]] = field(default_factory=dict)  # what runs, as read or applied
    listed: bool = False  # live holds every child this deployment owns
    applied: tuple[str, ...] = ()  # Kind/name created or changed
    pruned: tuple[str, ...] = ()
    stall: Stall | None = None
    capacity: bool = False  # the stall is the cluster's lack of room: retried with backoff

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def uid(self) -> str:
        return self.body["metadata"]["uid"]

    @property
    def planned(self) -> dict[str, int] | None:
        return self.planner.desired if self.planner else None

    @property
    def want(self) -> frozenset[ChildRef]:
        return frozenset(ChildRef.of(o) for o in self.desired)

    @property
    def prunes(self) -> bool:
        """The pass applies, and deletes what exists and is no longer desired (so it lists first)."""
        how = self.how
        return how.apply and (how.prune if isinstance(how.prune, bool) else self.want != how.prune)


Step = Callable[[Io, PassState], PassState]


def prepare_spec(io: Io, s: PassState) -> PassState:
    """The spec validated and rendered at the replicas the operator writes (cached per deployment)."""
    p = prepare(io.mem, s.body, s.previous, s.planned)
    stall = Stall("InvalidSpec", "; ".join(str(x) for x in p.problems)) if p.problems else \
        Stall("RenderFailed", p.render_failure) if p.render_failure else None
    revision = revision_of(list(p.objects)) if stall is None else None
    return replace(s, problems=p.problems, model=p.model, desired=p.objects, spec_revision=revision, stall=stall)


def decide_slots(io: Io, s: PassState) -> PassState:
    """The slots to render. A rollout (or one to start) lists what runs and decides from it; the pass then
    applies and prunes. Otherwise the serving slot, as prepare_spec rendered it: after a rollout, status.rollout
    is kept (an observe pass at rest; every other pass after a rollout takes the rollout's decision)."""
    if not progress.needed(s.previous, s.spec_revision):
        return s
    if not s.how.apply and progress.at_rest(s.previous, s.spec_revision):
        return replace(s, rolled=rest_pass(s.previous, s.desired))
    live = {ChildRef.of(o): o for o in io.kube.list_children(s.namespace, s.name, s.uid)}
    s = replace(s, how=replace(s.how, apply=True, prune=True), live=live, listed=True)
    try:
        rolled, records = rollout_from_what_runs(io.kube, io.mem, io.figures, s.body, s.model, s.previous, live,
                                                 s.planner)
    except ValueError as exc:
        return replace(s, stall=Stall("RolloutBlocked", str(exc)[:1000]))
    return replace(s, rolled=rolled, records=tuple(records), desired=tuple(rolled.objects))


def list_children(io: Io, s: PassState) -> PassState:
    """What exists of the deployment's children, when the pass prunes (a new CR owns nothing: no list)."""
    if not s.prunes or s.listed:
        return s
    live = {ChildRef.of(o): o for o in io.kube.list_children(s.namespace, s.name, s.uid)}
    return replace(s, live=live, listed=True)


def check_kinds(io: Io, s: PassState) -> PassState:
    """Every kind the spec renders (and, in mode Gateway, the InferenceObjective its picker watches) is served by
    the cluster: the LeaderWorkerSet CRD for multi-node replicas, the NVIDIA DRA driver's ComputeDomain for those on
    NVL72 trays, resource.k8s.io/v1 for GPUs allocated by DRA, the Gateway API Inference Extension's CRDs."""
    need = {(o["apiVersion"], o["kind"]) for o in s.desired}
    if any(kind == "InferencePool" for _, kind in need):
        need |= set(gateway.WATCHED_KINDS)
    missing = sorted((kind, api_version) for api_version, kind in need if not io.kube.has_kind(api_version, kind))
    if not missing:
        return s
    known = {**gateway.INSTALL_HINTS, **compute_domain.INSTALL_HINTS, **dra.INSTALL_HINTS}
    hints = {known.get(kind, "the LeaderWorkerSet controller (multi-node replicas)"
                       if kind == LEADER_WORKER_SET else f"the CRD of {kind}") for kind, _ in missing}
    served = ", ".join(f"{kind}.{api_version}" for kind, api_version in missing)
    return replace(s, stall=Stall("KindNotInstalled", f"the cluster does not serve {served}: install "
                                                      f"{' and '.join(sorted(hints))}"))


def apply_children(io: Io, s: PassState) -> PassState:
    """Server-side apply of every desired object, once no name is someone else's (never adopt)."""
    if not s.how.apply:
        return s
    live, applied, capacity = dict(s.live), [], False
    stall = name_collisions(io.kube, s.namespace, s.uid, list(s.desired), live, io.mem.applied_rv)
    if stall is None:
        stall, capacity = apply_all(io.kube, s.namespace, list(s.desired), live, applied, io.mem.applied_rv)
    want = s.want
    for ref, o in live.items() if s.how.seen is not None else ():
        if ref.kind in WORKLOAD_KINDS and ref in want:
            s.how.seen(o)
    return replace(s, live=live, applied=tuple(applied), stall=stall, capacity=capacity)


def prune(io: Io, s: PassState) -> PassState:
    """Delete what the deployment owns and no longer wants. An IMEX ComputeDomain waits until no pod claims its
    channel any more (a drained slot's pods terminate after their workload is gone); a later pass deletes it."""
    if not s.prunes:
        return s
    want, live, pruned = s.want, dict(s.live), list(s.pruned)
    stale = [r for r in live if r not in want]
    held = _held_domains(io.kube, s, [r for r in stale if r.kind == compute_domain.KIND])
    io.mem.domains_draining = bool(held)
    for ref in [r for r in stale if r not in held]:
        io.kube.delete(ref, s.namespace)
        io.mem.applied_rv.pop(ref, None)
        pruned.append(f"{ref.kind}/{ref.name}")
        del live[ref]
    return replace(s, live=live, pruned=tuple(pruned))


def _held_domains(kube: KubeAPI, s: PassState, domains: list[ChildRef]) -> set[ChildRef]:
    """The ComputeDomains among `domains` whose channel template a live pod of the deployment still claims."""
    if not domains:
        return set()
    pods = kube.list_pods(s.namespace, L.label_selector({L.DEPLOYMENT_LABEL: s.name}))
    claimed = compute_domain.template_holders(pods)
    return {r for r in domains
            if (s.live[r].get("spec") or {}).get("channel", {}).get("resourceClaimTemplate", {}).get("name") in claimed}


def keep_records(io: Io, s: PassState) -> PassState:
    """The ControllerRevisions. A rollout pass's: those it needs created, those no longer live deleted. Any
    other pass's: the spec's revision, once (a later rollout renders the serving slot from it)."""
    if s.records is not None:
        created, deleted = keep_rollout_records(io.kube, io.mem, s.namespace, s.rolled, list(s.records))
        return replace(s, applied=s.applied + tuple(created), pruned=s.pruned + tuple(deleted))
    if s.rolled is None and s.spec_revision and s.spec_revision not in io.mem.recorded:
        record(io.kube, io.mem, s.body, s.model, s.spec_revision)
    return s


STEPS: tuple[Step, ...] = (decide_slots, list_children, check_kinds, apply_children, prune, keep_records)


def observe(io: Io, s: PassState) -> PassState:
    """What runs, for status: what the pass listed (one that stalled first lists now), else the watch cache,
    and a workload the watch has not delivered yet read by name (not reported missing: no status flapping)."""
    s = list_children(io, s)
    if s.how.apply and not (s.problems and not s.prunes):
        return s
    cached = s.how.workloads(s.namespace, s.uid) if s.how.workloads else {}
    live = {**s.live, **cached}
    live.update(_read_workloads(io.kube, s.namespace, frozenset(r for r in s.want if r not in cached)))
    return replace(s, live=live)


def report(io: Io, s: PassState, status: dict[str, Any], emit: Emit) -> Outcome:
    """Events for what the pass did and why it stopped; the status, written only when it changed."""
    outcome = Outcome(status=status, applied=list(s.applied), pruned=list(s.pruned), stall=s.stall,
                      capacity=s.capacity, desired=s.want)
    if s.applied:
        emit("Normal", "Applied", "created or updated " + ", ".join(s.applied))
    if s.pruned:
        emit("Normal", "Pruned", "deleted " + ", ".join(s.pruned) + " (no longer desired)")
    if s.stall and not _was_stalled_same(s.previous, s.stall):
        emit("Warning", s.stall.reason, s.stall.message)
    for event in (s.planner.events if s.planner and s.stall is None else ()):
        emit(*event)
    for ev in (s.rolled.events if s.rolled is not None and s.stall is None else ()):
        emit("Warning" if ev.warning else "Normal", ev.reason, ev.message)
    if status != s.previous:
        try:
            outcome.body = io.kube.patch_status(s.namespace, s.name, status, s.body["metadata"]["resourceVersion"])
            outcome.status_written = True
        except ApiException as exc:
            if not is_conflict(exc):
                raise
            outcome.conflict = True
            log.info("status of %s/%s changed under us; passing again from a fresh read", s.namespace, s.name)
    return outcome


def reconcile(kube: KubeAPI, body: dict[str, Any], emit: Emit, *, memory: Memory, now: str | None = None,
              planner: PlannerOutcome | None = None, how: Pass = FULL) -> Outcome:
    now = now or now_iso()
    io = Io(kube, memory.of(body["metadata"]["uid"]), memory.step_figures)
    s = prepare_spec(io, PassState(body=body, how=how, planner=planner, previous=dict(body.get("status") or {})))
    for step in STEPS if s.stall is None else ():
        s = step(io, s)
        if s.stall is not None:
            break
    s = observe(io, s)
    status = deployment_status(body=body, model=s.model, live=s.live, stall=s.stall, now=now, planner=planner,
                               desired=s.desired, rolled=s.rolled,
                               pod_revisions=lambda: _pod_revisions(kube, s.namespace, s.name))
    return report(io, s, status, emit)


def _read_workloads(kube: KubeAPI, namespace: str, want: frozenset[ChildRef]) -> dict[ChildRef, dict[str, Any]]:
    out = {}
    for ref in want:
        if ref.kind in WORKLOAD_KINDS and (obj := kube.read(ref, namespace)) is not None:
            out[ref] = obj
    return out


def _was_stalled_same(previous: dict[str, Any], stall: Stall) -> bool:
    return any(c.get("type") == "Stalled" and c.get("status") == "True" and c.get("message") == stall.message
               for c in previous.get("conditions") or [])


def _pod_revisions(kube: KubeAPI, namespace: str, name: str) -> dict[str, tuple[int, int]]:
    """(live, Ready) serving engine pods per serving-revision label; terminating pods are not counted."""
    out: dict[str, tuple[int, int]] = {}
    for pod in kube.list_pods(namespace, L.label_selector(L.serving_pods_selector(name))):
        if pod.metadata.deletion_timestamp:
            continue
        rev = (pod.metadata.labels or {}).get(L.REVISION_LABEL, "")
        ready = is_ready(pod)
        live, n_ready = out.get(rev, (0, 0))
        out[rev] = (live + 1, n_ready + int(ready))
    return out
