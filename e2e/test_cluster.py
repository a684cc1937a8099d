"""Smoke tests of the local control plane itself: fake GPU nodes, scheduling by GPU count, simulated vLLM
pods answering on their pod IP, the real router's P/D flow under pod RBAC, LeaderWorkerSet, and garbage
collection by the real controller-manager."""
from __future__ import annotations

import ipaddress
import json
from collections import Counter

import httpx
import pytest
import yaml

from e2e.kit import wait_for
from v41flash_bench.procs import proc_start_ticks

pytestmark = pytest.mark.e2e

MODEL = "deepseek-v4.1-flash"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def apply(cluster, *docs: dict, ns: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))


def vllm_deployment(name: str, role: str, gpus: int, extra_args=(), node_selector=None, labels=None) -> dict:
    labels = {"app": name, "v41flash.io/role": role, **(labels or {})}
    spec = {"tolerations": [GPU_TOLERATION], "containers": [{
        "name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
        "command": ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1-Flash-1017"],
        "args": ["--served-model-name", MODEL, "--max-num-seqs", "16", *extra_args],
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def running_pod(cluster, ns: str, selector: str) -> dict:
    def ready():
        items = cluster.kubectl_json("get", "pods", "-n", ns, "-l", selector)["items"]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return live[0] if live and live[0]["status"].get("phase") == "Running" and live[0]["status"].get("podIP") \
            else None
    return wait_for(ready, 60, f"a Running pod with {selector} in {ns}")


def test_nodes_ready_with_gpu_capacity(cluster):
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    assert len(nodes) == 26
    assert all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]) for n in nodes)
    gpus = Counter()
    for n in nodes:
        product = n["metadata"]["labels"].get("nvidia.com/gpu.product", "cpu")
        gpus[product] += int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))
    assert gpus == {"NVIDIA-H200": 32, "NVIDIA-B200": 16, "NVIDIA-GB300": 72, "cpu": 0}
    gb300 = [n for n in nodes if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-GB300"]
    assert {n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in gb300} == {"gb300-rack-0"}


def test_gpu_pod_scheduled_simulated_and_stopped(cluster, ns):
    apply(cluster, vllm_deployment("dec", "decode", 4, node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"}),
          ns=ns)
    pod = running_pod(cluster, ns, "app=dec")
    node = cluster.kubectl_json("get", "node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in cluster.pod_network
    assert cluster.pod_network.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
    sim = cluster.sim_for(pod["metadata"]["name"], ns)
    assert (sim["ip"], sim["port"], sim["role"], sim["kind"]) == (ip, 8000, "decode", "sim")

    base = f"http://{ip}:8000"
    wait_for(lambda: httpx.get(base + "/health", timeout=2).status_code == 200, 20, "simulator /health")
    r = httpx.post(base + "/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == MODEL and body["choices"][0]["message"]["content"]
    assert 'vllm:request_success_total{finish_reason=' in httpx.get(base + "/metrics", timeout=5).text

    cluster.kubectl("delete", "deployment", "dec", "-n", ns)
    wait_for(lambda: proc_start_ticks(sim["pid"]) != sim["start"], 30, "the simulator to stop with its pod")
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/health", timeout=2)


def test_a_deleted_pod_terminates_as_kubelet_terminates_it(cluster, ns):
    """Deleted, the pod stays (kwok leaves it to the supervisor) with Ready False at once while its simulator
    still serves; the container's preStop hook reads the deadline from its configMap volume and sleeps it
    (3 s); then SIGTERM; the pod object goes only once the simulator has exited, well within the grace."""
    import time
    spec = vllm_deployment("term", "decode", 4)["spec"]["template"]["spec"]
    c = spec["containers"][0]
    c["readinessProbe"] = {"httpGet": {"path": "/health", "port": 8000}}
    c["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", 's=$(cat /etc/drain/seconds); exec sleep "$s"']}}}
    c["volumeMounts"] = [{"name": "drain", "mountPath": "/etc/drain", "readOnly": True}]
    spec.update(volumes=[{"name": "drain", "configMap": {"name": "drain"}}], terminationGracePeriodSeconds=30)
    apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "drain"}, "data": {"seconds": "3"}},
          {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "term", "labels": {"v41flash.io/role": "decode"}},
           "spec": spec}, ns=ns)

    def get():
        r = cluster.kubectl("get", "pod", "term", "-n", ns, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def ready(p) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    pod = wait_for(lambda: (p := get()) and ready(p) and p, 60, "the pod Ready")
    sim = cluster.sim_for("term", ns)
    base = f"http://{pod['status']['podIP']}:8000"
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", "term", "-n", ns, "--wait=false")
    p = wait_for(lambda: (p := get()) and p["metadata"].get("deletionTimestamp") and not ready(p) and p, 10,
                 "the deleted pod still there, not Ready")
    unready = time.monotonic() - t0
    assert unready < 3, unready  # before the hook is over
    assert proc_start_ticks(sim["pid"]) == sim["start"] and httpx.get(base + "/health", timeout=2).status_code == 200
    assert p["status"]["podIP"] == pod["status"]["podIP"]  # it keeps its IP while it terminates
    wait_for(lambda: get() is None, 25, "the pod removed once terminated")
    took = time.monotonic() - t0
    assert 3 <= took < 30, took  # the hook's 3 s first, then SIGTERM and the simulator's exit: never the grace's kill
    assert proc_start_ticks(sim["pid"]) != sim["start"]
    trace = (cluster.state / "logs" / f"prestop-{ns}-term-vllm.log").read_text()
    assert '+ exec sleep 3' in trace, trace  # the hook read its configMap file


def test_scheduler_respects_gpu_capacity(cluster, ns):
    apply(cluster, vllm_deployment("too-big", "decode", 9), ns=ns)  # no node has 9 GPUs

    def unschedulable():
        pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", "app=too-big")["items"]
        conds = [c for p in pods for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return next((c for c in conds if c.get("reason") == "Unschedulable"), None)
    cond = wait_for(unschedulable, 30, "the scheduler to report the 9-GPU pod Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond["message"]


def test_router_pd_flow_under_pod_rbac(cluster, ns):
    """client -> vllm-router (pod discovery through the apiserver, as the pod's ServiceAccount) -> prefill
    sim -> decode sim, with kv_transfer_params passed along."""
    sel = {"v41flash.io/deployment": "smoke"}
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "router"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "router"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "router"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "router"},
         "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": ns}]},
    ]
    router_labels = {"app": "router", "v41flash.io/role": "router", **sel}
    router = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "router"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": router_labels},
        "template": {"metadata": {"labels": router_labels}, "spec": {"serviceAccountName": "router", "containers": [{
            "name": "router", "image": "vllm-router:0.1.17", "command": ["vllm-router"],
            "args": ["--host", "0.0.0.0", "--port", "30000", "--prometheus-host", "0.0.0.0",
                     "--vllm-pd-disaggregation", "--service-discovery", "--service-discovery-port", "8000",
                     "--service-discovery-namespace", "$(POD_NAMESPACE)",
                     "--prefill-selector", "v41flash.io/deployment=smoke", "v41flash.io/role=prefill",
                     "--decode-selector", "v41flash.io/deployment=smoke", "v41flash.io/role=decode",
                     "--policy", "round_robin"],
            "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
            "ports": [{"name": "http", "containerPort": 30000}]}]}}}}
    apply(cluster, *rbac, vllm_deployment("pre", "prefill", 4, labels=sel),
          vllm_deployment("dec", "decode", 4, labels=sel), router, ns=ns)
    pre, dec, rtr = (running_pod(cluster, ns, f"app={a}") for a in ("pre", "dec", "router"))
    for p in (pre, dec, rtr):
        cluster.sim_for(p["metadata"]["name"], ns)

    url = f"http://{rtr['status']['podIP']}:30000/v1/chat/completions"
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "What is disaggregated serving?"}],
               "max_tokens": 12}

    def completion():
        r = httpx.post(url, json=payload, timeout=10)
        return r.json() if r.status_code == 200 else None
    body = wait_for(completion, 60, "a completion through the router (it discovers both pods first)")
    assert body["choices"][0]["message"]["content"]

    def successes(pod) -> dict:
        text = httpx.get(f"http://{pod['status']['podIP']}:8000/metrics", timeout=5).text
        return {ln.split('finish_reason="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines() if ln.startswith("vllm:request_success_total{")}
    assert successes(pre).get("remote_decode", 0) >= 1  # prefill ran with do_remote_decode
    assert sum(successes(dec).values()) >= 1


def test_leaderworkerset_creates_groups(cluster, ns):
    tmpl = {"metadata": {"labels": {"v41flash.io/role": "decode"}}, "spec": {
        "tolerations": [GPU_TOLERATION], "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
                        "command": ["vllm", "serve", "m", "--served-model-name", MODEL,
                                    "--data-parallel-size", "8", "--data-parallel-size-local", "4"],
                        "ports": [{"name": "http", "containerPort": 8000}],
                        "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}
    worker = json.loads(json.dumps(tmpl))
    worker["spec"]["containers"][0]["command"] += ["--data-parallel-start-rank", "4", "--headless"]
    apply(cluster, {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                    "metadata": {"name": "grp"},
                    "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": tmpl,
                                                                     "workerTemplate": worker}}}, ns=ns)
    leader = running_pod(cluster, ns, "leaderworkerset.sigs.k8s.io/name=grp,leaderworkerset.sigs.k8s.io/worker-index=0")
    worker_pod = running_pod(cluster, ns, "leaderworkerset.sigs.k8s.io/name=grp,leaderworkerset.sigs.k8s.io/worker-index=1")
    env = {e["name"]: e.get("value") for e in worker_pod["spec"]["containers"][0].get("env", [])}
    assert env["LWS_LEADER_ADDRESS"] == f"grp-0.grp.{ns}" and env["LWS_GROUP_SIZE"] == "2"  # pod webhook ran
    sim = cluster.sim_for(leader["metadata"]["name"], ns)
    assert sim["dp_ranks"] == 4  # the leader's API server fronts its 4 local ranks; the headless worker none
    assert not [s for s in cluster.supervised(ns) if s["pod"] == worker_pod["metadata"]["name"]]


def test_garbage_collector_deletes_owned_objects(cluster, ns):
    owner = cluster.kubectl_json("create", "configmap", "owner", "-n", ns)
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]}}
    apply(cluster, child, ns=ns)
    cluster.kubectl("delete", "configmap", "owner", "-n", ns)
    wait_for(lambda: cluster.kubectl("get", "configmap", "child", "-n", ns, check=False).returncode != 0, 60,
             "the garbage collector to delete the owned ConfigMap")


def test_down_leaves_nothing_running(tmp_path):
    """A second, throwaway cluster: after `down` none of its processes (simulators included) runs, nothing
    listens on its pod network, and its state is gone."""
    from e2e.harness import Cluster
    from e2e.nodes import loopback_listener_nets
    c = Cluster(tmp_path / "state")
    try:
        assert c.up()
        net = int(c.info()["pod_network"].split(".")[1])
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(vllm_deployment("d", "decode", 8)), capture=True)
        # A supervised simulator is recorded as soon as it is spawned; it listens a moment later.
        wait_for(lambda: [s for s in c.supervised() if proc_start_ticks(s["pid"]) == s["start"]]
                 and net in loopback_listener_nets(), 60, "a simulator listening in the throwaway cluster")
        procs = [(p.name, p.pid, p.start) for p in c.procs()] + [(s["name"], s["pid"], s["start"])
                                                                 for s in c.supervised()]
    finally:
        c.down()
    assert not [name for name, pid, start in procs if proc_start_ticks(pid) == start]
    assert net not in loopback_listener_nets()
    assert not (tmp_path / "state" / "pids.json").exists() and not (tmp_path / "state" / "etcd").exists()
