"""Role Services, PodDisruptionBudgets and the ConfigMap that records what the operator decided."""
from __future__ import annotations

from typing import Any

from ..api import v1alpha1 as api
from ..vllm import args as vargs
from . import labels as L
from .dra import device_class
from .engine import model_path
from .ports import ENGINE_PORT
from .timing import DRAIN_CONFIG_KEY, PodTiming
from .resolve import Resolved, RoleResolved
from .router import KV_EVENT_SOURCES, intra_node_dp_size
from .yamlout import to_yaml_doc


def role_service(cr_name: str, namespace: str, role: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Headless: DNS names of a role's serving pods (leaders only: LWS workers serve no HTTP)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": L.metadata(cr_name, namespace, L.child_name(cr_name, role), role, owner),
        "spec": {
            "clusterIP": "None",
            "selector": L.serving_selector(cr_name, role),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pdb(cr_name: str, namespace: str, component: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """One voluntary disruption at a time (a drain never takes a whole role down at once)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": L.metadata(cr_name, namespace, L.child_name(cr_name, component), component, owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": L.selector_labels(cr_name, component)},
        },
    }


HIDDEN = "<not shown: extraEnv value>"


def _shown_args(args: list[str], extra_args: list[str]) -> list[str]:
    """Container args with the user's extraArgs (they come last) replaced by a count: escape-hatch values
    may be credentials, and a ConfigMap is readable more widely than a pod spec."""
    if not extra_args or len(args) < len(extra_args):
        return args
    return [*args[:len(args) - len(extra_args)], f"<{len(extra_args)} extraArgs not shown>"]


def _role_summary(rr: RoleResolved, commands: vargs.ReplicaCommands | None,
                  replicas: int | None, role_spec: api.RoleSpec | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"enabled": rr.enabled}
    if not rr.enabled:
        return out
    out.update({
        "workload": rr.workload_kind,
        "replicas": "external (HPA/KEDA)" if rr.replicas_managed_by == "external" else replicas,
        "minReplicas": rr.min_replicas,
        "maxReplicas": rr.max_replicas,
        "tensorParallelSize": rr.tensor_parallel_size,
        "dataParallelSize": rr.data_parallel_size,
        "dataParallelSizeLocal": rr.data_parallel_size_local,
        "expertParallel": rr.expert_parallel,
        "expertParallelSize": rr.expert_parallel_size,
        "nodesPerReplica": rr.nodes_per_replica,
        "gpusPerReplica": rr.gpus_per_replica,
        "gpusPerPod": rr.gpus_per_pod,
        "kvRole": rr.kv_role or "none (aggregated)",
    })
    assert commands is not None
    pods = {"leader" if rr.multi_node else "pod": commands.leader}
    if commands.worker is not None:
        pods["worker"] = commands.worker
    extra_args = list(role_spec.extra_args) if role_spec else []
    extra_env = {e.name for e in role_spec.extra_env} if role_spec else set()
    out["commands"] = {
        kind: {"command": [*cmd.command, *_shown_args(list(cmd.args), extra_args)],
               "env": {**{k: f"fieldRef {v}" for k, v in cmd.env_from_field.items()},
                       **{k: HIDDEN if k in extra_env else v for k, v in cmd.env.items()}},
               **({"notes": list(cmd.notes)} if cmd.notes else {})}
        for kind, cmd in pods.items()
    }
    return out


def config_map(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved,
               commands: dict[str, vargs.ReplicaCommands], replicas: dict[str, int | None],
               router_command: list[str], proxy_command: list[str], timing: PodTiming, drain_s: int, revision: str,
               owner: dict[str, Any] | None) -> dict[str, Any]:
    """resolved.yaml (what the operator decided, for people: ``router_command`` and ``proxy_command`` are the
    serving slot's vllm-router's and the front's, as their containers run them) and the engines' preStop deadline
    (a file the engine pods mount: an SLO change updates it in place and restarts nothing)."""
    resolved = {
        "deployment": cr_name,
        "servingRevision": revision,
        "vllmVersion": spec.vllm_version,
        "image": spec.image,
        "profile": res.profile,
        "mode": "prefill/decode disaggregated" if res.disaggregated else "aggregated (decode only)",
        "model": {"checkpoint": res.checkpoint, "servedModelName": res.served_model_name,
                  "path": model_path(spec), "revision": spec.model.revision or "default branch"},
        "gpu": {"product": res.gpu.product, "gpusPerNode": res.gpu.gpus_per_node,
                "resource": f"DRA claims of DeviceClass {device_class(res.gpu.device_class)}" if res.gpu.dra
                else res.gpu.resource_name,
                "nodeLabel": f"{res.gpu.product_label}={res.gpu.product_label_value}",
                "topologyKey": res.gpu.topology_key, "rdmaResource": res.gpu.rdma_resource or "none"},
        "gpusAtMinReplicas": res.min_gpus(),
        # a plain roll surges one replica per role beside the running ones (render/engine.py SURGE_ONE)
        "extraGpusDuringRoll": sum(rr.gpus_per_replica for rr in res.enabled_roles),
        "roles": {name: _role_summary(rr, commands.get(name), replicas.get(name), getattr(spec, name))
                  for name, rr in res.roles.items()},
        "router": {
            "command": router_command,
            "intraNodeDataParallelSize": intra_node_dp_size(res),
            "kvEventSources": KV_EVENT_SOURCES if spec.routing.kv_events else "none (kvEvents off)",
            # vllm-router 0.1.17 reads only its built-in headers; the front makes sure x-session-id is set
            "sessionKey": ("derive: the front sets x-session-id when a client sent none"
                           + (f" (from header {spec.routing.session_header}, else derived)"
                              if spec.routing.session_header else " (derived from the conversation)")
                           if spec.routing.session_key == "derive" else
                           "client: the front forwards the x-session-id clients send, unchanged"),
            # in every mode: vllm-router's admin API is reachable only through the front's path allowlist
            "front": {"image": spec.routing.front_or_default.image, "command": proxy_command} if proxy_command else "none",
        },
        "podTiming": {"preStopDrainSeconds": drain_s,
                      "preStopDrainSource": f"this ConfigMap's {DRAIN_CONFIG_KEY} (updated in place)",
                      "terminationGracePeriodSeconds": timing.termination_grace_period_seconds},
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": L.metadata(cr_name, namespace, L.config_name(cr_name), "config", owner),
        "data": {"resolved.yaml": to_yaml_doc(resolved), DRAIN_CONFIG_KEY: str(drain_s)},
    }
