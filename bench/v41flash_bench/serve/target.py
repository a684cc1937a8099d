"""What is being measured: a V41FlashDeployment (read from its CR) or a bare OpenAI-compatible URL.

For a deployment the record's system facts come from the CR the way the operator renders it: checkpoint and
revision, image and vLLM version, GPU product and per-role layout (TP/DP/EP, GPUs per replica, replicas Ready),
the interconnect of the product, the engines' exact `vllm serve` arguments (precision flags among them), the
serving revision, the SLO; and the engines' cold start (pod created → Ready) from the pods. For a URL only what
the flags declare (``--system KEY=VALUE``) is known. What could not be read is listed in ``unknown``.

The address: ``--url`` when given (e.g. a `kubectl port-forward`); inside a cluster the front Service's DNS name
(status.router.service); on the local e2e cluster the front pod's simulated address (its state directory).
Mode Gateway deployments are measured through the Gateway: pass its address as ``--url``.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from datetime import datetime

# Facts a record about a URL cannot know unless declared (seed 004's list).
SYSTEM_KEYS = ("checkpoint", "model_revision", "runtime", "image", "gpu_model", "gpu_count", "interconnect",
               "precision", "parallelism")


@dataclass
class Target:
    kind: str  # deployment | url
    url: str
    model: str
    identity: dict  # names, addresses, revision hashes: may differ between A and B
    system: dict  # what must match between A and B except the named variable
    unknown: list[str] = field(default_factory=list)
    gpus: int | None = None
    decode_ranks: int | None = None
    slo: dict | None = None
    usd_per_gpu_hour: float | None = None
    prices: dict | None = None  # managed API: $ per million input / output / cached tokens


def _flag_map(args) -> dict:
    """`vllm serve` argv → {flag: value} ("" for a bare flag)."""
    out, items = {}, [str(a) for a in args]
    i = 0
    while i < len(items):
        a = items[i]
        i += 1
        if not a.startswith("-"):
            continue
        name, eq, value = a.partition("=")
        if not eq and i < len(items) and not items[i].startswith("-"):
            value = items[i]
            i += 1
        out[name] = value
    return out


def url_target(url: str, model: str, declared: dict, *, gpus: int | None, prices: dict | None,
               usd_per_gpu_hour: float | None, slo: dict | None) -> Target:
    system = {k: declared.get(k) for k in SYSTEM_KEYS}
    system.update({k: v for k, v in declared.items() if k not in system})
    system["model"] = model
    if gpus:
        system["gpu_count"] = gpus
    unknown = [k for k in SYSTEM_KEYS if system.get(k) in (None, "")]
    if prices:
        unknown = [k for k in unknown if k not in ("gpu_model", "gpu_count", "interconnect", "parallelism")]
        system["billing"] = "per token"
    return Target("url", url.rstrip("/"), model, {"url": url.rstrip("/")}, system, unknown,
                  gpus=gpus, slo=slo, usd_per_gpu_hour=usd_per_gpu_hour, prices=prices)


def _seconds(a: str, b: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(b, fmt) - datetime.strptime(a, fmt)).total_seconds()


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def cold_starts(pods: list) -> list[float]:
    """Seconds from creation to Ready of the engine pods that are Ready (kubernetes V1Pod objects)."""
    out = []
    for p in pods:
        ready = next((c for c in (p.status.conditions or []) if c.type == "Ready" and c.status == "True"), None)
        if ready and ready.last_transition_time and p.metadata.creation_timestamp:
            out.append((ready.last_transition_time - p.metadata.creation_timestamp).total_seconds())
    return out


def system_from_cr(cr: dict) -> tuple[dict, dict, list[str], int, int | None, dict]:
    """(system, identity, unknown, gpus serving, decode ranks serving, slo) of a V41FlashDeployment object."""
    from v41flash.api import v1alpha1 as api
    from v41flash.gpus import gpu
    from v41flash.render.engine import engine_config
    from v41flash.render.resolve import resolve
    from v41flash.vllm import args as vargs

    spec = api.V41FlashDeploymentSpec.model_validate(cr.get("spec") or {})
    st = cr.get("status") or {}
    res = resolve(spec)
    unknown: list[str] = []
    system = {"checkpoint": res.checkpoint, "model_revision": spec.model.revision or "(the hub's main)",
              "runtime": f"vLLM {spec.vllm_version}", "image": spec.image, "gpu_model": spec.gpu.product,
              "interconnect": gpu(spec.gpu.product).fabric, "serving_profile": spec.profile,
              "disaggregated": res.disaggregated, "routing": spec.routing.mode + "/" + spec.routing.policy,
              "roles": {}}
    gpus, ranks = 0, None
    for role in ("prefill", "decode"):
        rr = res.roles[role]
        if not rr.enabled:
            continue
        rs = st.get(role) or {}
        ready = int(rs.get("readyReplicas") or 0)
        try:
            cmd = vargs.build_replica(engine_config(spec, res, role)).leader
            args, env = _flag_map(cmd.args), dict(cmd.env)
        except vargs.InvalidEngineConfig as exc:
            args, env = {}, {}
            unknown.append(f"{role}.args ({exc})")
        env.update({e.name: e.value for e in getattr(spec, role).extra_env if getattr(e, "value", None) is not None})
        system["roles"][role] = {
            "tp": rr.tensor_parallel_size, "dp": rr.data_parallel_size,
            "ep": rr.expert_parallel_size if rr.expert_parallel else 1, "gpus_per_replica": rr.gpus_per_replica,
            "nodes_per_replica": rr.nodes_per_replica, "replicas_ready": ready,
            "precision": {"quantization": args.get("--quantization", "the checkpoint's own"),
                          "kv_cache_dtype": args.get("--kv-cache-dtype", "auto")},
            "args": args, "env": env}
        gpus += ready * rr.gpus_per_replica
        if role == "decode":
            ranks = ready * rr.data_parallel_size
    system["gpu_count"] = gpus
    system["parallelism"] = " / ".join(f"{r} TP{v['tp']} DP{v['dp']} EP{v['ep']}" for r, v in system["roles"].items())
    identity = {"serving_revision": st.get("servingRevision", ""), "router_service": (st.get("router") or {}).get("service", "")}
    slo = {"ttft_s": spec.slo.ttft.target_seconds, "ttft_percentile": spec.slo.ttft.percentile,
           "e2e_p95_s": spec.slo.e2e_p95_seconds}
    return system, identity, unknown, gpus, ranks, slo


def deployment_target(name: str, namespace: str, *, url: str | None, model: str | None, kubeconfig: str | None,
                      usd_per_gpu_hour: float | None, slo: dict | None) -> Target:
    import kubernetes

    if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
        kubernetes.config.load_incluster_config()
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig)
    custom = kubernetes.client.CustomObjectsApi()
    core = kubernetes.client.CoreV1Api()
    cr = custom.get_namespaced_custom_object("v41flash.io", "v1alpha1", namespace, "v41flashdeployments", name)
    system, identity, unknown, gpus, ranks, cr_slo = system_from_cr(cr)
    identity.update({"deployment": name, "namespace": namespace})
    from v41flash.render import labels as L  # noqa: N812
    pods = core.list_namespaced_pod(namespace, label_selector=f"{L.DEPLOYMENT_LABEL}={name}").items
    engines = [p for p in pods if (p.metadata.labels or {}).get(L.ROLE_LABEL) in ("prefill", "decode")]
    starts = cold_starts(engines)
    if starts:
        system_cold = {"median_s": statistics.median(starts), "min_s": min(starts), "max_s": max(starts),
                       "pods": len(starts)}
    else:
        system_cold = None
        unknown.append("engine cold start (no Ready engine pod)")
    address = url or _front_address(cr, namespace, pods)
    served = model or system["checkpoint"]
    spec_model = (cr.get("spec") or {}).get("model") or {}
    served = model or spec_model.get("servedModelName") or served
    spec_cost = float(((cr.get("spec") or {}).get("autoscaling") or {}).get("costPerGpuHour") or 0) or None
    t = Target("deployment", address.rstrip("/"), served, identity, system, unknown, gpus=gpus or None,
               decode_ranks=ranks, slo=slo or cr_slo, usd_per_gpu_hour=usd_per_gpu_hour or spec_cost)
    t.identity["url"] = t.url
    t.identity["engine_cold_start"] = system_cold
    return t


def _front_address(cr: dict, namespace: str, pods: list) -> str:
    st = cr.get("status") or {}
    service = (st.get("router") or {}).get("service", "")
    if not service:
        raise LookupError("status.router.service is empty (mode Gateway, or not Ready yet): pass the Gateway's or a "
                          "port-forward's address as --url")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        host, _, port = service.rpartition(":")
        return f"http://{host}:{port}" if "." in host else f"http://{host}.{namespace}.svc:{port}"
    from v41flash.render import labels as L  # noqa: N812
    from v41flash_bench.local_cluster import ClusterRecords
    from v41flash_bench.procs import proc_start_ticks
    local = ClusterRecords()
    front = [p.metadata.name for p in pods if (p.metadata.labels or {}).get(L.ROLE_LABEL) == "router"
             and (p.metadata.labels or {}).get(L.FRONT_LABEL) == "true" and _ready(p)]
    sims = [s for s in local.supervised() if s.get("namespace") == namespace and s.get("pod") in front
            and s.get("kind") in ("front", "proxy", None) and proc_start_ticks(s.get("pid", 0)) == s.get("start")]
    if sims:
        return f"http://{sims[0]['ip']}:{sims[0]['port']}"
    raise LookupError(f"the front Service {service} is not reachable from here: run `kubectl port-forward -n "
                      f"{namespace} svc/{service.split(':')[0].split('.')[0]} 8080:{service.rpartition(':')[2]}` "
                      f"and pass --url http://127.0.0.1:8080")
