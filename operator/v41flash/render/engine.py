"""Engine workloads: the API mapped onto the vLLM argument builder, and the pods that run it.

vLLM flags come only from v41flash.vllm.args (the single source); this module decides where they run:
a Deployment when a replica fits one node, a LeaderWorkerSet (sigs.k8s.io/lws v0.8.0) when it spans
nodes, with the pod details a vLLM deployment needs (shm, GPUs, placement, probes, NIXL side channel).
"""
from __future__ import annotations

import math
from typing import Any

from ..api import host_paths
from ..api import v1alpha1 as api
from ..defaults import PROGRESS_MARGIN_SECONDS
from ..vllm import args as vargs
from ..vllm import features as vfeatures
from . import labels as L
from .compute_domain import claim_channel, needs_domain
from .dra import claim_gpus, template_spec
from .dra import template_name as dra_template_name
from .gateway import sidecar_container, uses_sidecar
from .ports import ENGINE_PORT, VLLM_BEHIND_SIDECAR_PORT
from .resolve import LEADER_WORKER_SET, Resolved, RoleResolved
from .timing import DRAIN_CONFIG_KEY, DRAIN_MOUNT_DIR, PodTiming, pre_stop_script

MODELS_DIR = "/models"
CACHE_DIR = "/cache"
# spec.startup.weightCache: the node's directory (api/host_paths.node_path), read-only in the engines, written only by
# the prefetcher
WEIGHT_CACHE_DIR = "/weight-cache"
WEIGHT_CACHE_HF_HOME = f"{WEIGHT_CACHE_DIR}/huggingface"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
# A plain roll never takes a role below its ready replicas: one new replica starts beside the old ones
# and an old one goes only once it is Ready. The surge replica needs its GPUs free (one replica's
# worth per rolling role); without them it stays Pending and the old replicas keep serving.
SURGE_ONE = {"maxSurge": 1, "maxUnavailable": 0}


def model_path(spec: api.V41FlashDeploymentSpec) -> str:
    """vllm serve's model: the PVC mount (+subPath) or the hub checkpoint id."""
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.checkpoint
    sub = pvc.sub_path.strip("/")
    return f"{MODELS_DIR}/{sub}" if sub else MODELS_DIR


def engine_features(spec: api.V41FlashDeploymentSpec) -> vfeatures.EngineFeatures:
    f = spec.features
    sd = f.speculative_decoding
    return vfeatures.EngineFeatures(
        tool_calling=f.tool_calling, reasoning=f.reasoning, text_only=f.text_only,
        speculative_decoding=(vfeatures.SpeculativeDecoding(sd.num_speculative_tokens, sd.adaptive_verification)
                              if sd.enabled else None))


def engine_kv_offload(r: api.RoleSpec) -> vfeatures.KvOffload | None:
    kv = r.kv_offload
    return None if kv is None else vfeatures.KvOffload(kv.backend, kv.size_gib, kv.lazy)


def engine_config(spec: api.V41FlashDeploymentSpec, res: Resolved, role: str) -> vargs.EngineConfig:
    """The API, resolved, mapped onto the argument builder's input."""
    r: api.RoleSpec = getattr(spec, role)
    rr = res.roles[role]
    eplb = None
    if r.eplb.enabled:
        eplb = vargs.EplbConfig(
            enabled=True, num_redundant_experts=r.eplb.num_redundant_experts, window_size=r.eplb.window_size,
            step_interval=r.eplb.step_interval, use_async=r.eplb.use_async, communicator=r.eplb.communicator,
            log_balancedness=r.eplb.log_balancedness)
    kv = spec.kv_transfer
    return vargs.EngineConfig(
        role=role if res.disaggregated else "aggregated",
        gpu_product=spec.gpu.product,
        model=model_path(spec),
        tensor_parallel_size=rr.tensor_parallel_size,
        data_parallel_size=rr.data_parallel_size,
        data_parallel_size_local=rr.data_parallel_size_local if rr.multi_node else None,
        expert_parallel=rr.expert_parallel,
        nodes_per_replica=rr.nodes_per_replica,
        gpus_per_node=res.gpu.gpus_per_node,
        revision=spec.model.revision,
        served_model_name=res.served_model_name,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        max_model_len=r.max_model_len,
        gpu_memory_utilization=r.gpu_memory_utilization,
        eplb=eplb,
        kv_transfer=(vargs.KvTransfer(connector=kv.connector, load_failure_policy=kv.load_failure_policy,
                                      ucx_tls=kv.ucx_tls, extra_config=dict(kv.extra_config))
                     if res.disaggregated else None),
        kv_events=vargs.KvEvents() if spec.routing.kv_events else None,
        port=vllm_port(spec, res, role),
        extra_args=tuple(r.extra_args),
        extra_env={e.name: e.value for e in r.extra_env},
        features=engine_features(spec),
        kv_offload=engine_kv_offload(r),
        preset=spec.preset,
        point=r.point,
        load_format=spec.startup.load_format,
    )


def behind_sidecar(spec: api.V41FlashDeploymentSpec, res: Resolved, role: str) -> bool:
    """A decode pod of mode Gateway with prefill: the routing sidecar owns ENGINE_PORT, vLLM listens behind it."""
    return role == "decode" and uses_sidecar(spec, res)


def vllm_port(spec: api.V41FlashDeploymentSpec, res: Resolved, role: str) -> int:
    return VLLM_BEHIND_SIDECAR_PORT if behind_sidecar(spec, res, role) else ENGINE_PORT


def replica_commands(spec: api.V41FlashDeploymentSpec, res: Resolved, role: str) -> vargs.ReplicaCommands:
    return vargs.build_replica(engine_config(spec, res, role))


# --- pod template ----------------------------------------------------------------------------------

def _env(cmd: vargs.EngineCommand, spec: api.V41FlashDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    for name, field_path in cmd.env_from_field.items():
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
    hub = spec.model.source.hub
    if hub is not None and hub.token_secret_ref is not None:
        ref = hub.token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env.append({"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_DIR}/vllm"})
    if hub is not None and spec.startup.weight_cache is not None:
        # the node's copy, prefetched: the hub client finds the files and downloads nothing
        env.append({"name": "HF_HOME", "value": WEIGHT_CACHE_HF_HOME})
    elif hub is not None and spec.model.cache.claim_name:
        # A persistent cache also keeps hub downloads (~511 GB) across restarts; an emptyDir is too small.
        env.append({"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"})
    env += [{"name": k, "value": v} for k, v in cmd.env.items()]  # builder env, user extraEnv last
    # One entry per name, the last one winning in place: server-side apply refuses duplicate keys.
    by_name: dict[str, dict[str, Any]] = {}
    for entry in env:
        by_name[entry["name"]] = entry
    return list(by_name.values())


def _volumes(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec,
             role_spec: api.RoleSpec) -> tuple[list[dict], list[dict]]:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": role_spec.resources.shm_size}},
        # The preStop deadline (sized from the SLO) as a file that kubelet updates in place: an SLO edit
        # changes the ConfigMap, never this template. Optional: the hook has a default without it.
        {"name": "drain", "configMap": {"name": L.config_name(cr_name), "optional": True,
                                        "items": [{"key": DRAIN_CONFIG_KEY, "path": DRAIN_CONFIG_KEY}]}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                    {"name": "drain", "mountPath": DRAIN_MOUNT_DIR, "readOnly": True}]
    cache = spec.model.cache
    if cache.claim_name:
        volumes.append({"name": "cache", "persistentVolumeClaim": {"claimName": cache.claim_name}})
    else:
        volumes.append({"name": "cache", "emptyDir": {"sizeLimit": cache.size_limit}})
    mounts.append({"name": "cache", "mountPath": CACHE_DIR})
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append({"name": "weights",
                        "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}})
        mounts.append({"name": "weights", "mountPath": MODELS_DIR, "readOnly": True})
    if spec.startup.weight_cache is not None:
        volumes.append(weight_cache_volume(spec.startup.weight_cache, namespace))
        # engines only read the node's copy: a compromised engine cannot poison the weights the next one loads
        mounts.append({"name": "weight-cache", "mountPath": WEIGHT_CACHE_DIR, "readOnly": True})
    return volumes, mounts


def weight_cache_volume(cache: api.WeightCacheSpec, namespace: str) -> dict[str, Any]:
    """The node's directory: <hostPath>/<namespace> unless shared (api/host_paths.py; the operator allows it)."""
    path = host_paths.node_path(cache.host_path, namespace, cache.shared_across_namespaces)
    return {"name": "weight-cache", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _ports(cfg: vargs.EngineConfig, serving: bool) -> list[dict[str, Any]]:
    """Ports the serving pod binds. Workers share one template across node ranks whose ports differ
    (base + global DP rank), so only the leader/single pod lists its side ports (documentation only).
    vLLM's own port is "http" unless a routing sidecar owns that name (mode Gateway decode: "vllm")."""
    if not serving:
        return []
    ports: list[dict[str, Any]] = [{"name": "http" if cfg.port == ENGINE_PORT else "vllm",
                                    "containerPort": cfg.port, "protocol": "TCP"}]
    for i, port in enumerate(vargs.nixl_side_channel_ports(cfg, 0)):
        ports.append({"name": f"nixl-{i}", "containerPort": port, "protocol": "TCP"})
    for i, port in enumerate(vargs.kv_event_ports(cfg, 0)):
        ports.append({"name": f"kv-events-{i}", "containerPort": port, "protocol": "TCP"})
    if cfg.nodes_per_replica > 1:
        ports.append({"name": "dp-rpc", "containerPort": cfg.data_parallel_rpc_port, "protocol": "TCP"})
    return ports


def startup_seconds(cmd: vargs.EngineCommand, timing: PodTiming) -> int:
    """How long an engine may take to become ready: the engine's own ready timeout plus a margin."""
    ready_timeout = int(cmd.env.get("VLLM_ENGINE_READY_TIMEOUT_S", "0") or 0)
    return max(timing.startup_min_seconds, ready_timeout + timing.startup_margin_seconds)


def _probes(cmd: vargs.EngineCommand, timing: PodTiming, port: int = ENGINE_PORT) -> dict[str, Any]:
    startup_s = startup_seconds(cmd, timing)
    health = {"path": "/health", "port": port}
    return {
        # /health: connection refused while loading, 200 serving, 503 once the engine died.
        "startupProbe": {"httpGet": dict(health), "periodSeconds": timing.startup_period_seconds,
                         "timeoutSeconds": 10,
                         "failureThreshold": math.ceil(startup_s / timing.startup_period_seconds)},
        "readinessProbe": {"httpGet": dict(health), "periodSeconds": 10, "timeoutSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": dict(health), "periodSeconds": timing.liveness_period_seconds,
                          "timeoutSeconds": 10, "failureThreshold": timing.liveness_failure_threshold},
    }


def _affinity(cr_name: str, role: str, res: Resolved, rr: RoleResolved) -> dict[str, Any]:
    affinity: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": res.gpu.product_label, "operator": "In", "values": [res.gpu.product_label_value]},
        ]}]}}}
    if rr.multi_node:
        # All pods of one group (LWS group-key, filled in per group by the scheduler) in one NVLink
        # domain; groups may share a rack (LWS exclusive-topology would give a whole NVL72 to one group).
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": L.selector_labels(cr_name, role)},
            "matchLabelKeys": [LWS_GROUP_KEY],
            "topologyKey": res.gpu.topology_key,
        }]}
    return affinity


def _engine_security(res: Resolved) -> dict[str, Any]:
    """Pod Security `baseline` unless RDMA is requested. IPC_LOCK (outside baseline) only with an RDMA
    resource: ibv_reg_mr pins KV buffers against RLIMIT_MEMLOCK; NIXL over cuda_ipc/cuda_copy/TCP pins
    through the CUDA driver, which that limit does not cover. vLLM's image runs as root, so not `restricted`."""
    sc: dict[str, Any] = {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
    if res.gpu.rdma_resource:
        sc["capabilities"] = {"add": ["IPC_LOCK"]}
    return sc


def _tolerations(spec: api.V41FlashDeploymentSpec) -> list[dict[str, Any]]:
    out = []
    for t in spec.gpu.tolerations:
        tol: dict[str, Any] = {"operator": t.operator}
        if t.key:
            tol["key"] = t.key
        if t.operator == "Equal":
            tol["value"] = t.value
        if t.effect:
            tol["effect"] = t.effect
        if t.toleration_seconds is not None:
            tol["tolerationSeconds"] = t.toleration_seconds
        out.append(tol)
    return out


def pod_template(cr_name: str, spec: api.V41FlashDeploymentSpec, res: Resolved, role: str,
                 cmd: vargs.EngineCommand, cfg: vargs.EngineConfig, *, serving: bool, timing: PodTiming,
                 namespace: str) -> dict[str, Any]:
    rs: api.RoleSpec = getattr(spec, role)
    rr = res.roles[role]
    pod_labels = L.common_labels(cr_name, role)
    if serving:
        pod_labels[L.SERVING_LABEL] = "true"
    volumes, mounts = _volumes(cr_name, namespace, spec, rs)
    limits = {"cpu": rs.resources.cpu, "memory": rs.resources.memory}
    if not res.gpu.dra:  # with DRA the pod's GPUs are its claim's (below)
        limits[res.gpu.resource_name] = str(rr.gpus_per_pod)
    if res.gpu.rdma_resource:
        limits[res.gpu.rdma_resource] = "1"
    container: dict[str, Any] = {
        "name": "vllm",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(cmd.command),
        "args": list(cmd.args),
        "env": _env(cmd, spec),
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": mounts,
        "securityContext": _engine_security(res),
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", pre_stop_script()]}}},
    }
    if serving:  # headless LWS workers serve no HTTP: LWS recreates their group when one fails
        container["ports"] = _ports(cfg, serving)
        container.update(_probes(cmd, timing, cfg.port))
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        # engines never call the apiserver: no token to steal from a compromised engine
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": timing.termination_grace_period_seconds,
        "affinity": _affinity(cr_name, role, res, rr),
        "tolerations": _tolerations(spec),
        "containers": [container],
        "volumes": volumes,
    }
    if serving and behind_sidecar(spec, res, role):
        pod_spec["containers"] = [sidecar_container(spec, res), container]
    if spec.gpu.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.gpu.node_selector.items()))
    workload = L.child_name(cr_name, role)
    if res.gpu.dra:
        claim_gpus(pod_spec, container, dra_template_name(workload, gpu_claim_spec(res, rr)))
    if needs_domain(spec.gpu.product, rr.nodes_per_replica):  # MNNVL across trays: an IMEX channel per pod
        claim_channel(pod_spec, container, workload)
    return {"metadata": {"labels": pod_labels}, "spec": pod_spec}


def gpu_claim_spec(res: Resolved, rr: RoleResolved) -> dict[str, Any]:
    """spec.gpu.allocation DRA: the ResourceClaimTemplate spec of one role's pods (render/dra.py)."""
    return template_spec(res.gpu.product, res.gpu.device_class, rr.gpus_per_pod)


# --- workloads -------------------------------------------------------------------------------------

def _replicas_field(rr: RoleResolved, replicas: dict[str, int | None] | None) -> dict[str, int]:
    """spec.replicas, or nothing when an HPA/KEDA owns it (server-side apply then never claims it)."""
    if rr.replicas_managed_by == "external":
        return {}
    want = (replicas or {}).get(rr.role)
    return {"replicas": rr.min_replicas if want is None else want}


def engine_workload(cr_name: str, namespace: str, spec: api.V41FlashDeploymentSpec, res: Resolved, role: str,
                    replicas: dict[str, int | None] | None, owner: dict[str, Any] | None,
                    timing: PodTiming = PodTiming()) -> dict[str, Any]:
    rr = res.roles[role]
    cfg = engine_config(spec, res, role)
    commands = vargs.build_replica(cfg)
    name = L.child_name(cr_name, role)
    leader = pod_template(cr_name, spec, res, role, commands.leader, cfg, serving=True, timing=timing,
                          namespace=namespace)
    if rr.workload_kind != LEADER_WORKER_SET:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": L.metadata(cr_name, namespace, name, role, owner),
            "spec": {
                **_replicas_field(rr, replicas),
                "selector": {"matchLabels": L.selector_labels(cr_name, role)},
                # The default 600 s would mark a rollout failed (kstatus: Stalled) during a normal weight load.
                "progressDeadlineSeconds": startup_seconds(commands.leader, timing) + PROGRESS_MARGIN_SECONDS,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(SURGE_ONE)},
                "template": leader,
            },
        }
    assert commands.worker is not None
    worker = pod_template(cr_name, spec, res, role, commands.worker, cfg, serving=False, timing=timing,
                          namespace=namespace)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": L.metadata(cr_name, namespace, name, role, owner),
        "spec": {
            **_replicas_field(rr, replicas),
            # Workers start once the leader pod exists: they need its address, not its readiness.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": rr.nodes_per_replica,
                # One failed pod breaks the DP group's collectives: recreate the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": dict(SURGE_ONE)},
            # A headless Service per group (named after the leader pod) for LWS_LEADER_ADDRESS, so
            # LWS's shared Service would not collide with the role Service of the same name.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
        },
    }
