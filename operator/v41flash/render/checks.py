"""What only the operator can check (at runtime these make the deployment Stalled, not refused).

- every engine command the renderer would run passes vLLM 0.33.0's parser snapshot and the argument
  builder's own rules (v41flash.vllm.args.validate_engine_config), each problem mapped to its spec field;
- the GPU budget covers every enabled role at its minReplicas;
- a canary can start (rollout_problems) and vLLM's KV handshake check stays on;
- each engine pod's host memory holds what it pins: the Engram tables when they are in host memory, the
  host KV tier of every DP rank in the pod, /dev/shm, and a headroom (host_memory_problems).
- the rendered children pass what the apiserver checks of names, labels and int32s (render/preflight.py);
- with the operator's configuration (``AdminPolicy``; `v41flash validate` has none and skips these): a weight
  cache's host path is one the administrator allows (api/host_paths.py), and the Prometheus URL is an endpoint
  the administrator allows and no metadata, loopback or link-local address unless named (api/endpoints.py).
"""
from __future__ import annotations

from collections.abc import Callable

from kubernetes.utils.quantity import parse_quantity
from pydantic.alias_generators import to_camel

from .. import cron
from ..api import endpoints, host_paths
from ..api.admin import AdminPolicy
from ..api import v1alpha1 as api
from ..api.validation import Problem
from ..vllm import args as vargs
from ..vllm import features as vfeatures
from .engine import engine_config
from .preflight import node_selector_problems, rendered_problems
from .resolve import resolve

# EngineConfig fields that are not the role's own: where the user sets them in the spec.
_SPEC_PATHS = {
    "gpu_product": "spec.gpu.product",
    "gpus_per_node": "spec.gpu.gpusPerNode",
    "model": "spec.model.checkpoint",
    "revision": "spec.model.revision",
    "served_model_name": "spec.model.servedModelName",
    "kv_transfer": "spec.kvTransfer",
    "kv_events": "spec.routing.kvEvents",
    "features": "spec.features",
    "preset": "spec.preset",
    # derived from dataParallelSize / nodesPerReplica by the renderer
    "data_parallel_size_local": "{role}.nodesPerReplica",
    # the renderer's own choices (not user fields): blamed on the role as a whole
    "args": "{role}",
    "role": "{role}",
    "port": "{role}",
    "data_parallel_rpc_port": "{role}",
}


def spec_path(role: str, engine_path: str) -> str:
    """EngineConfig field path (e.g. eplb.num_redundant_experts) → the spec field a user edits."""
    head, _, rest = engine_path.partition(".")
    role_path = f"spec.{role}"
    base = _SPEC_PATHS.get(head)
    if base is None:
        base = f"{role_path}.{to_camel(head)}"
    elif base.startswith("{role}"):
        base = base.replace("{role}", role_path)
    if rest and head != "kv_events":
        base += "." + ".".join(to_camel(part) for part in rest.split("."))
    return base


def engine_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    """Each enabled role's engine command, as rendered, against vLLM 0.33.0 and the builder's rules."""
    spec = obj.spec
    res = resolve(spec)
    problems: list[Problem] = []
    for rr in res.enabled_roles:
        for path, message in vargs.validate_engine_config(engine_config(spec, res, rr.role)):
            problems.append(Problem(spec_path(rr.role, path), message))
    return list(dict.fromkeys(problems))


def gpu_budget_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    budget = obj.spec.autoscaling.gpu_budget
    if budget <= 0:
        return []
    res = resolve(obj.spec)
    need = res.min_gpus()
    if budget >= need:
        return []
    parts = " + ".join(f"{rr.role} {rr.min_replicas} x {rr.gpus_per_replica}" for rr in res.enabled_roles)
    return [Problem("spec.autoscaling.gpuBudget",
                    f"gpuBudget {budget} is below the {need} GPUs the roles hold at minReplicas ({parts}); "
                    f"raise gpuBudget to at least {need} or lower minReplicas")]


SCHEDULE_CHECK_DAYS = 8  # overlaps are looked for over a week and a day of starts (daily and weekly patterns)
SCHEDULE_CHECK_STARTS = 3000  # per window (a window every 5 minutes has 2,300 in 8 days)


def schedule_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    """Schedules whose floors, alone or combined with the windows running at the same time (by maximum per role),
    hold more GPUs than autoscaling.gpuBudget: the planner could not keep them."""
    spec = obj.spec
    budget = spec.autoscaling.gpu_budget
    if budget <= 0 or not spec.autoscaling.schedules:
        return []
    res = resolve(spec)
    gpus = {rr.role: rr.gpus_per_replica for rr in res.enabled_roles}
    events: list[tuple[float, int, int]] = []  # (time, +1 start / -1 end, window)
    t0 = cron.REFERENCE_TIME
    for k, w in enumerate(spec.autoscaling.schedules):
        s = cron.last_start(w.cron, w.time_zone, t0)
        s = s if s is not None and s + w.duration_seconds > t0 else cron.next_start(w.cron, w.time_zone, t0)
        for _ in range(SCHEDULE_CHECK_STARTS):
            if s is None or s > t0 + SCHEDULE_CHECK_DAYS * 86400:
                break
            events += [(s, 1, k), (s + w.duration_seconds, -1, k)]
            s = cron.next_start(w.cron, w.time_zone, s)
    active: set[int] = set()
    for _, step, k in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same second
        if step < 0:
            active.discard(k)
            continue
        active.add(k)
        windows = [spec.autoscaling.schedules[i] for i in sorted(active)]
        floors = {r: max((getattr(w.min_replicas, r) or 0) if w.min_replicas else 0 for w in windows) for r in gpus}
        need = sum(floors[r] * gpus[r] for r in gpus)
        if need > budget:
            names = ", ".join(w.name for w in windows)
            parts = " + ".join(f"{r} {floors[r]} x {gpus[r]}" for r in gpus if floors[r])
            return [Problem("spec.autoscaling.schedules",
                            f"{'the windows ' if len(windows) > 1 else 'the window '}{names} "
                            f"{'hold together' if len(windows) > 1 else 'holds'} {need} GPUs ({parts}) > gpuBudget "
                            f"{budget}: lower their minReplicas, or raise gpuBudget")]
    return []


def rollout_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    """A canary that could never start (maxSurgeGPUs below one replica of each role, no gpuBudget to add room,
    and no InPlace), and vLLM's KV handshake check turned off (the second guard against cross-revision P/D
    pairs, docs/decisions/2026-12-01-rollouts.md §4.2)."""
    spec = obj.spec
    problems: list[Problem] = []
    r = spec.rollout
    if r.strategy == "Canary" and r.when_no_surge_room == "Wait" and r.max_surge_gpus and not spec.autoscaling.gpu_budget:
        res = resolve(spec)
        need = sum(rr.gpus_per_replica for rr in res.enabled_roles)
        if r.max_surge_gpus < need:
            parts = " + ".join(f"{rr.gpus_per_replica} {rr.role}" for rr in res.enabled_roles)
            problems.append(Problem("spec.rollout.maxSurgeGPUs", (
                f"maxSurgeGPUs {r.max_surge_gpus} is below the {need} GPUs of the smallest canary (one replica "
                f"per role: {parts}): every rollout would wait; raise it to {need} (or 0, which means that), or set "
                "whenNoSurgeRoom: InPlace")))
    if spec.kv_transfer.extra_config.get("enforce_handshake_compat") is False:
        problems.append(Problem("spec.kvTransfer.extraConfig.enforce_handshake_compat", (
            "false turns off vLLM's check that a prefill and a decode can exchange KV blocks (vLLM version, model, "
            "KV layout); it is the second guard against pairing engines of different revisions: remove it")))
    return problems


def _gib(quantity: str) -> float:
    return float(parse_quantity(quantity)) / vfeatures.GIB


def host_memory_gib(args: tuple[str, ...], pod_share: float, dp_ranks_in_pod: int) -> dict[str, float]:
    """GiB an engine pod pins in host memory, by part, read from its rendered args.

    Engram: the recipe's 183.1 GiB of FP8 tables when --engram-config cpu_offload is on, sharded evenly over
    the replica's pods (pod_share = the pod's GPUs / the replica's). Host KV: cpu_bytes_to_use of each DP rank.
    """
    engram = vfeatures.ENGRAM_TABLES_GIB * pod_share if vfeatures.engram_in_host_memory(args) else 0.0
    return {"engram": engram,
            "hostKV": vfeatures.host_kv_bytes_per_rank(args) / vfeatures.GIB * dp_ranks_in_pod}


def host_memory_problems(obj: api.V41FlashDeployment) -> list[Problem]:
    spec = obj.spec
    res = resolve(spec)
    problems: list[Problem] = []
    for rr in res.enabled_roles:
        cfg = engine_config(spec, res, rr.role)
        if vargs.validate_engine_config(cfg):
            continue  # engine_problems reports why it cannot render
        rs: api.RoleSpec = getattr(spec, rr.role)
        parts = host_memory_gib(vargs.build_replica(cfg).leader.args, rr.gpus_per_pod / rr.gpus_per_replica,
                                rr.data_parallel_size_local)
        try:
            memory, shm, headroom = (_gib(q) for q in (rs.resources.memory, rs.resources.shm_size,
                                                        rs.resources.memory_headroom))
        except ValueError as exc:
            problems.append(Problem(f"spec.{rr.role}.resources", f"not a Kubernetes quantity: {exc}"))
            continue
        need = parts["engram"] + parts["hostKV"] + shm + headroom
        if need > memory:
            problems.append(Problem(
                f"spec.{rr.role}.resources.memory",
                f"{rs.resources.memory} does not hold what one {rr.role} pod pins in host memory: Engram tables "
                f"{parts['engram']:.1f} GiB + host KV {parts['hostKV']:.1f} GiB ({rr.data_parallel_size_local} DP "
                f"rank(s)) + shmSize {shm:.0f} GiB + memoryHeadroom {headroom:.0f} GiB = {need:.1f} GiB; raise "
                f"memory to at least {need:.0f}Gi or lower kvOffload.sizeGiB"))
    return problems


def admin_problems(admin: AdminPolicy) -> Callable[[api.V41FlashDeployment], list[Problem]]:
    """A weight cache or Prometheus URL the administrator does not allow, naming the field."""
    def check(obj: api.V41FlashDeployment) -> list[Problem]:
        spec = obj.spec
        out: list[Problem] = []
        cache = spec.startup.weight_cache
        if cache is not None:
            why = admin.host_paths.problem(cache.host_path, cache.shared_across_namespaces)
            if why:
                out.append(Problem(host_paths.FIELD, why))
        prom = spec.autoscaling.metrics.prometheus
        if spec.autoscaling.metrics.source == "Prometheus" and prom is not None:
            why = endpoints.static_problem(prom.url, admin.endpoints)
            if why:
                out.append(Problem(endpoints.FIELD, why))
        return out
    check.__name__ = "admin_problems"
    return check


def operator_checks(admin: AdminPolicy | None = None) -> list[Callable[[api.V41FlashDeployment], list[Problem]]]:
    """The operator's checks; with ``admin`` (the running operator's policy) also what it allows."""
    checks = [engine_problems, gpu_budget_problems, schedule_problems, host_memory_problems, rollout_problems,
              node_selector_problems, rendered_problems]
    return checks if admin is None else [admin_problems(admin), *checks]
