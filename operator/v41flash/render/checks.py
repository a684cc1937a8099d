"""What only the operator can check (at runtime these make the deployment Stalled, not refused).

- every engine command the renderer would run passes vLLM 0.33.0's parser snapshot and the argument
  builder's own rules (v41flash.vllm.args.validate_engine_config), each problem mapped to its spec field;
- the GPU budget covers every enabled role at its minReplicas;
- the rendered children pass what the apiserver checks of names, labels and int32s (render/preflight.py).
"""
from __future__ import annotations

from collections.abc import Callable

from pydantic.alias_generators import to_camel

from ..api import v1alpha1 as api
from ..api.validation import Problem
from ..vllm import args as vargs
from .engine import engine_config
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


def operator_checks() -> list[Callable[[api.V41FlashDeployment], list[Problem]]]:
    from .preflight import node_selector_problems, rendered_problems
    return [engine_problems, gpu_budget_problems, node_selector_problems, rendered_problems]
