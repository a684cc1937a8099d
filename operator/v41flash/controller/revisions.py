"""A pass's revision records and rollout I/O: the ControllerRevision that records each spec the deployment
served, and a rollout pass (rollout/world.py, pure) fed from what runs: pods, workloads, records, figures."""
from __future__ import annotations

import logging
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import v1alpha1 as api
from ..render import labels as L
from ..rollout.slots import controller_revision
from ..rollout import progress
from ..rollout import machine as M
from ..rollout.world import RolloutPass, World, rollout_pass
from .apply import WORKLOAD_KINDS, label
from .autoscale import PlannerOutcome
from .desired import desired_replicas, operator_namespace, owner_reference
from .kube import CONTROLLER_REVISION, ChildRef, KindNotInstalled, KubeAPI, namespace_terminating
from .memory import DeploymentMemory

log = logging.getLogger(__name__)


def rollout_from_what_runs(kube: KubeAPI, mem: DeploymentMemory, figures: progress.StepFigures,
                           body: dict[str, Any], obj: api.V41FlashDeployment, previous: dict[str, Any],
                           live: dict[ChildRef, dict[str, Any]], planner: PlannerOutcome | None
                           ) -> tuple[RolloutPass, list[dict[str, Any]]]:
    """One rollout pass from what runs: pods, workloads, ControllerRevisions, the step's figures."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    pods = progress.pod_dicts(kube.list_pods(namespace, L.label_selector({L.DEPLOYMENT_LABEL: name})))
    records = kube.list_controller_revisions(namespace, name, uid)
    mem.recorded.update((r["metadata"].get("labels") or {}).get(L.REVISION_LABEL, "") for r in records)
    # the newest annotations (a rollout action is an annotation: it moves no generation, so the prepared
    # model may carry older ones)
    obj = obj.model_copy(update={"metadata": {**obj.metadata, "annotations": dict(meta.get("annotations") or {})}})
    state = M.State.from_status(previous.get("rollout"))
    now = time.time()
    view = figures.observe(uid, state, pods, now, obj.spec.slo.ttft.percentile / 100)
    world = World(now=now, workloads=[o for r, o in live.items() if r.kind in WORKLOAD_KINDS], pods=pods,
                  controller_revisions=records, figures=view.figures, old_live_requests=view.old_live_requests,
                  serving_requests=view.serving_requests, retiring_live_requests=view.retiring_live_requests)
    replicas = desired_replicas(obj.spec, previous, planner.desired if planner else None)
    out = rollout_pass(obj, previous, world, replicas, owner_reference(body), operator_namespace=operator_namespace())
    return out, records


def record(kube: KubeAPI, mem: DeploymentMemory, body: dict[str, Any], obj: api.V41FlashDeployment,
           revision: str) -> None:
    """The ControllerRevision of the spec being rendered, once per revision: after the spec moves on, the
    serving revision is rendered from it (a rollout's serving slot)."""
    meta = body["metadata"]
    cr = controller_revision(meta["name"], meta["namespace"], revision, obj.spec, int(time.time()),
                             owner_reference(body))
    try:
        kube.create(cr, meta["namespace"])
    except KindNotInstalled:
        return
    except ApiException as exc:
        if namespace_terminating(exc):  # the deployment goes with its namespace: nothing to record
            return
        if exc.status not in (403, 422):
            raise
        # not allowed (RBAC from before rollouts) or refused: serving goes on; a rollout later stalls naming
        # the missing record. Said once per revision, not every pass.
        log.warning("%s/%s: cannot record revision %s in ControllerRevision %s (%s %s): a later rollout of this "
                    "deployment will stall until it can", meta["namespace"], meta["name"], revision,
                    cr["metadata"]["name"], exc.status, exc.reason)
    mem.recorded.add(revision)


def keep_records(kube: KubeAPI, mem: DeploymentMemory, namespace: str, rolled: RolloutPass,
                 records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Create the records the pass needs; delete all but the live revisions' and the previous serving one.
    Returns (created, deleted) as Kind/name."""
    created, deleted = [], []
    for cr in rolled.create:
        if kube.create(cr, namespace) is not None:
            created.append(label(cr))
        mem.recorded.add(cr["metadata"]["labels"][L.REVISION_LABEL])
    live_revs = {p.revision for p in (rolled.decision.slots if rolled.decision else ())} | {rolled.serving_revision}
    have = {r["metadata"]["name"]: r for r in [*records, *rolled.create]}
    for cr_name in progress.records_to_delete(list(have.values()), live_revs):
        kube.delete(ChildRef(*CONTROLLER_REVISION, cr_name), namespace)
        rev = (have[cr_name]["metadata"].get("labels") or {}).get(L.REVISION_LABEL, "")
        mem.recorded.discard(rev)
        deleted.append(f"ControllerRevision/{cr_name}")
    return created, deleted
