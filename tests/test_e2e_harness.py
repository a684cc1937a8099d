"""Exact tests of the e2e harness's pure functions (e2e/harness.py, e2e/supervisor.py; the supervisor's pod
termination: tests/test_supervisor_termination.py; no cluster needed)."""
from __future__ import annotations

import base64
import ipaddress
from collections import Counter

import pytest
import yaml

from e2e.cluster_config import kwok_stages as harness_kwok_stages
from e2e.cluster_config import lws_webhooks
from e2e.engine_pods import VllmArgs, parse_vllm, pod_sim_command
from e2e.harness import supervised_procs
from e2e.nodes import GPU_RESOURCE, claim_pod_network, fake_nodes, loopback_listener_nets, release_pod_network
from e2e.pod_processes import pick_container
from e2e.pod_spec import command_tokens, container_env, expand_vars, flag_values, wants_process
from e2e.probes import readiness_url, ready_status
from e2e.router_pods import proxy_command, proxy_container, router_command
from e2e.tools import Tools, read_versions

POD = {"metadata": {"name": "p-0", "namespace": "ns1", "uid": "u1", "labels": {"app": "x"}},
       "spec": {"nodeName": "h200-0", "containers": []},
       "status": {"phase": "Running", "podIP": "127.1.1.5"}}


def test_expand_vars():
    env = {"POD_NAMESPACE": "ns1", "A": "1"}
    assert expand_vars("--ns=$(POD_NAMESPACE)", env) == "--ns=ns1"
    assert expand_vars("$(UNKNOWN)-$(A)", env) == "$(UNKNOWN)-1"
    assert expand_vars("$$(A)", env) == "$(A)"


def test_container_env_resolves_values_and_field_refs():
    c = {"env": [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                 {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                 {"name": "URL", "value": "http://$(IP):8000"},
                 {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    assert container_env(POD, c) == {"NS": "ns1", "IP": "127.1.1.5", "APP": "x", "URL": "http://127.1.1.5:8000"}


def test_command_tokens_unwraps_shell():
    c = {"command": ["/bin/sh", "-c"], "args": ["ulimit -n 65536 && exec vllm serve m --port $(PORT)"]}
    assert command_tokens(c, {"PORT": "8000"}) == ["vllm", "serve", "m", "--port", "8000"]
    assert command_tokens({"command": ["vllm"], "args": ["serve", "m"]}, {}) == ["vllm", "serve", "m"]


def test_flag_values():
    toks = ["--served-model-name", "a", "b", "--max-num-seqs=64", "--x", "-1"]
    assert flag_values(toks, "--served-model-name") == ["a", "b"]
    assert flag_values(toks, "--max-num-seqs") == ["64"]
    assert flag_values(toks, "--x") == ["-1"]
    assert flag_values(toks, "--absent") is None


def test_parse_vllm_multi_node_dp():
    toks = ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1-Flash-1017", "--served-model-name", "dsv41",
            "--data-parallel-size", "16", "--data-parallel-size-local", "8", "--max-num-seqs", "64",
            "--max-model-len", "131072", "--enable-expert-parallel"]
    assert parse_vllm(toks) == VllmArgs(("dsv41",), 8000, 64, 131072, 8, False)


def test_parse_vllm_defaults_and_variants():
    assert parse_vllm(["vllm", "serve", "m"], 8100) == VllmArgs(("m",), 8100, None, None, 1, False)
    assert parse_vllm(["--model", "m", "--port=9000", "--data-parallel-size", "4", "--data-parallel-rank", "2"]) \
        == VllmArgs(("m",), 9000, None, None, 1, False)
    assert parse_vllm(["vllm", "serve", "m", "--data-parallel-size", "4", "--headless"]).headless
    with pytest.raises(ValueError):
        parse_vllm(["vllm", "serve", "--max-num-seqs", "4"])


def test_pod_sim_command_binds_pod_ip_and_sums_dp_ranks():
    v = VllmArgs(("dsv41", "alias"), 8000, 64, None, 16, False)
    argv, env = pod_sim_command("/bin/sim", "decode", "127.1.2.3", v, ["--seed", "1"])
    assert env == {"V41F_SIM_BIND_HOST": "127.1.2.3", "POD_IP": "127.1.2.3"}
    assert argv[:8] == ["/bin/sim", "--port", "8000", "--model", "dsv41", "--served-model-name", "dsv41", "alias"]
    assert flag_values(argv, "--max-num-seqs") == [str(64 * 16)]  # one port fronting 16 ranks of 64
    assert flag_values(argv, "--kv-cache-size") == [str(65536 * 16)]
    assert flag_values(argv, "--data-parallel-size") is None
    assert flag_values(argv, "--inter-token-latency") == ["10ms"]
    assert argv[-2:] == ["--seed", "1"]
    argv1, _ = pod_sim_command("/bin/sim", "prefill", "127.1.2.3", VllmArgs(("m",), 8000, None, None, 1, False))
    assert flag_values(argv1, "--max-num-seqs") == ["256"]
    assert flag_values(argv1, "--max-model-len") == ["262144"]
    assert flag_values(argv1, "--inter-token-latency") == ["20ms"]


def test_router_command_keeps_flags_and_rebinds():
    toks = ["vllm-router", "--host", "0.0.0.0", "--port", "30000", "--service-discovery",
            "--prefill-selector", "v41flash.io/role=prefill", "app.kubernetes.io/instance=x",
            "--prometheus-host=0.0.0.0", "--log-dir", "/var/log/router", "--policy", "consistent_hash"]
    argv = router_command(toks, "127.1.9.1", "/state/logs/r")
    assert argv[0].endswith("/.venv/bin/vllm-router")
    assert argv[1:] == ["--port", "30000", "--service-discovery", "--prefill-selector", "v41flash.io/role=prefill",
                        "app.kubernetes.io/instance=x", "--policy", "consistent_hash", "--host", "127.1.9.1",
                        "--prometheus-host", "127.1.9.1", "--log-dir", "/state/logs/r"]
    # args-only containers (the image's entrypoint is vllm-router)
    assert router_command(["--port", "30000"], "127.1.9.1", "/l")[1:3] == ["--port", "30000"]


def test_session_proxy_rebinds_to_the_pod_ip_and_is_found_in_the_rendered_pod():
    """The one-pod router of operators before 2026-12-07 (the upgrade path): proxy and vllm-router together."""
    from v41flash.render import resolve
    from v41flash.render.router import router_objects
    from v41flash.api.v1alpha1 import V41FlashDeployment
    obj = V41FlashDeployment.model_validate({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                             "metadata": {"name": "t", "namespace": "ns"},
                                             "spec": {"routing": {"sessionHeader": "x-conv"}}})
    dep = next(o for o in router_objects("t", "ns", obj.spec, resolve(obj.spec), None) if o["kind"] == "Deployment")
    old_proxy = {"name": "session-proxy", "command": ["v41flash"],  # as those operators rendered it
                 "args": ["session-proxy", "--listen", "0.0.0.0:30000", "--upstream", "http://127.0.0.1:30001",
                          "--session-header", "x-conv"]}
    pod = {**POD, "spec": {**dep["spec"]["template"]["spec"],
                           "containers": [old_proxy, *dep["spec"]["template"]["spec"]["containers"]]}}
    router = pod["spec"]["containers"][1]
    router["args"][router["args"].index("--host") + 1] = "127.0.0.1"  # the one-pod router listened on loopback
    pc = proxy_container(pod)
    assert pc is not None and pc["name"] == "session-proxy"
    assert pick_container(pod, "router")["name"] == "router"  # the router process still comes from its container
    argv, port = proxy_command(command_tokens(pc, {}), "127.1.9.1")
    assert argv[0].endswith("/.venv/bin/v41flash") and port == 30000
    assert argv[1:] == ["session-proxy", "--listen", "127.1.9.1:30000", "--upstream", "http://127.1.9.1:30001",
                        "--session-header", "x-conv"]
    # the router behind it: the rendered loopback port, rebound to the pod IP where the proxy sends
    r = router_command(command_tokens(pick_container(pod, "router"), {}), "127.1.9.1", "/l")
    assert flag_values(r, "--port") == ["30001"] and flag_values(r, "--host") == ["127.1.9.1"]
    no_proxy = {**POD, "spec": {"containers": [{"name": "router", "command": ["vllm-router"]}]}}
    assert proxy_container(no_proxy) is None


def test_pick_container_and_wants_process():
    pod = {**POD, "spec": {"containers": [{"name": "sidecar"}, {"name": "main", "ports": [
        {"name": "http", "containerPort": 8000}]}]}}
    assert pick_container(pod, "decode")["name"] == "main"
    assert wants_process(POD)
    assert not wants_process({**POD, "status": {"phase": "Pending"}})
    assert not wants_process({**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}})


def test_fake_nodes_inventory():
    nodes = fake_nodes()
    assert len(nodes) == 26
    products = Counter(n["metadata"]["labels"].get("nvidia.com/gpu.product") for n in nodes)
    assert products == {"NVIDIA-H200": 4, "NVIDIA-B200": 2, "NVIDIA-GB300": 18, None: 2}
    assert sum(int(n["status"]["capacity"].get(GPU_RESOURCE, 0)) for n in nodes) == 4 * 8 + 2 * 8 + 18 * 4
    cidrs = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes]
    assert len(set(cidrs)) == 26 and all(c.subnet_of(ipaddress.ip_network("127.1.0.0/16")) for c in cidrs)
    for n in nodes:
        labels = n["metadata"]["labels"]
        assert n["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]
        gpu = GPU_RESOURCE in n["status"]["capacity"]
        assert (n["spec"]["taints"] == [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]) == gpu
        assert labels.get("nvidia.com/gpu.count") == (n["status"]["capacity"][GPU_RESOURCE] if gpu else None)
        assert (labels.get("nvidia.com/gpu.clique") == "gb300-rack-0") == (
            labels.get("nvidia.com/gpu.product") == "NVIDIA-GB300")
    assert [n["metadata"]["name"] for n in nodes][6:8] == ["gb300-rack0-tray-00", "gb300-rack0-tray-01"]


MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mleaderworkerset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-lws}}
  rules: [{apiGroups: [leaderworkerset.x-k8s.io], resources: [leaderworkersets]}]
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], resources: [pods]}]
"""


def test_lws_webhooks_point_at_loopback():
    [doc] = lws_webhooks(MANIFESTS, "https://127.0.0.1:9443/", b"CA")
    assert doc["metadata"]["name"] == "lws-mutating-webhook-configuration"
    lws, pod = doc["webhooks"]
    assert lws["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-lws", "caBundle": base64.b64encode(b"CA").decode()}
    assert "objectSelector" not in lws
    assert pod["objectSelector"] == {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name",
                                                           "operator": "Exists"}]}


def test_versions_env_pins_every_component():
    v = read_versions()
    assert set(v) == {"KUBERNETES_VERSION", "ETCD_VERSION", "KWOK_VERSION", "INFERENCE_SIM_VERSION", "HELM_VERSION",
                      "LWS_VERSION", "PROMTOOL_VERSION", "LLM_D_INFERENCE_SCHEDULER_VERSION",
                      "GATEWAY_API_INFERENCE_EXTENSION_VERSION", "GATEWAY_API_VERSION", "TOKENIZERS_VERSION"}
    assert all(x.startswith("v") and x.count(".") == 2 for x in v.values())


def test_readiness_url_resolves_named_ports():
    c = {"ports": [{"name": "http", "containerPort": 30000}],
         "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}}}
    assert readiness_url(POD, c) == "http://127.1.1.5:30000/readiness"
    assert readiness_url(POD, {"readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}}) == \
        "http://127.1.1.5:8000/health"
    assert readiness_url(POD, {"readinessProbe": {"exec": {"command": ["true"]}}}) is None
    assert readiness_url(POD, {"readinessProbe": {"httpGet": {"port": "nope"}}}) is None


def test_ready_status_sets_conditions_and_containers():
    pod = {"status": {"conditions": [
        {"type": "Initialized", "status": "True", "lastTransitionTime": "t0"},
        {"type": "Ready", "status": "False", "lastTransitionTime": "t0"},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "t0"}],
        "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0}]}}
    assert ready_status(pod, True, "t1") == {"status": {"conditions": [
        {"type": "Initialized", "status": "True", "lastTransitionTime": "t0"},
        {"type": "Ready", "status": "True", "lastTransitionTime": "t1"},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "t0"}],
        "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0, "started": True}]}}


KWOK_READY_TEMPLATE = (
    'conditions:\n- status: "True"\n  type: Ready\n- status: "True"\n  type: ContainersReady\n'
    'containerStatuses:\n{{ range .spec.containers }}\n- name: x\n  ready: true\n  restartCount: 0\n'
    '  state:\n    running:\n      startedAt: now\n{{ end }}\nphase: Running\n')


# kwok v0.8.0's kustomize/stage/pod/general/pod-delete.yaml
POD_DELETE = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "pod-delete"},
              "spec": {"resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                       "selector": {"matchExpressions": [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}]},
                       "next": {"delete": True}}}


def _kwok_assets(tmp_path, pod_delete: dict = POD_DELETE) -> str:
    """Stand-in kwok assets: the pod-ready template below, the stock pod-delete, stubs for the rest."""
    stage = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "pod-ready"},
             "spec": {"selector": {"matchExpressions": []}, "next": {"statusTemplate": KWOK_READY_TEMPLATE}}}
    for f in ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-complete.yaml", "node-not-ready.yaml"):
        (tmp_path / f).write_text(yaml.safe_dump({"kind": "Stage", "metadata": {"name": f[:-5]}}))
    (tmp_path / "pod-ready.yaml").write_text(yaml.safe_dump(stage))
    (tmp_path / "pod-delete.yaml").write_text(yaml.safe_dump(pod_delete))
    return harness_kwok_stages(tmp_path)


def test_kwok_stages_leave_role_pods_unready(tmp_path):
    tmpl = KWOK_READY_TEMPLATE
    docs = list(yaml.safe_load_all(_kwok_assets(tmp_path)))
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert set(by_name) == {"node-initialize", "node-heartbeat-with-lease", "pod-complete", "pod-delete", "pod-ready",
                            "node-not-ready", "v41flash-pod-running-unready"}
    key = '.metadata.labels["v41flash.io/role"]'
    assert by_name["pod-ready"]["spec"]["selector"]["matchExpressions"] == [{"key": key, "operator": "DoesNotExist"}]
    unready = by_name["v41flash-pod-running-unready"]
    assert unready["spec"]["selector"]["matchExpressions"] == [{"key": key, "operator": "Exists"}]
    assert unready["spec"]["next"]["statusTemplate"] == tmpl.replace('"True"\n  type: Ready', '"False"\n  type: Ready') \
        .replace('"True"\n  type: ContainersReady', '"False"\n  type: ContainersReady').replace("ready: true", "ready: false")
    assert by_name["pod-ready"]["spec"]["next"]["statusTemplate"] == tmpl


def test_kwok_deletes_no_pod_the_supervisor_terminates(tmp_path):
    """kwok's pod-delete stage (remove a pod once it has a deletionTimestamp) leaves out the roles the supervisor
    plays kubelet for: it removes those pods itself once their processes have ended. Other pods, with or without
    the label, keep kwok's behaviour."""
    by_name = {d["metadata"]["name"]: d for d in yaml.safe_load_all(_kwok_assets(tmp_path))}
    delete = by_name["pod-delete"]
    assert delete["spec"]["next"] == {"delete": True} and delete["spec"]["resourceRef"] == POD_DELETE["spec"]["resourceRef"]
    assert delete["spec"]["selector"]["matchExpressions"] == [
        {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
        {"key": '.metadata.labels["v41flash.io/role"]', "operator": "NotIn", "values": ["prefill", "decode", "router", "epp"]}]
    from e2e.supervisor import SELECTOR
    assert SELECTOR == "v41flash.io/role in (prefill,decode,router,epp)"  # the pods the supervisor watches
    # a kwok that no longer deletes in that stage is refused, not silently worked around
    changed = {**POD_DELETE, "spec": {**POD_DELETE["spec"], "next": {"finalizers": {}}}}
    with pytest.raises(AssertionError, match="pod-delete"):
        _kwok_assets(tmp_path, changed)


@pytest.mark.skipif(not (Tools.load().kwok_assets / "pod-delete.yaml").exists(), reason="kwok not built (make tools)")
def test_kwok_stages_from_the_built_kwok_assets():
    """The same changes applied to the pinned kwok's own stage files."""
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(harness_kwok_stages(Tools.load().kwok_assets))}
    assert docs["pod-delete"]["spec"]["selector"]["matchExpressions"][-1]["operator"] == "NotIn"
    assert docs["pod-delete"]["spec"]["next"] == {"delete": True}
    assert "v41flash-pod-running-unready" in docs


def test_supervised_procs_include_the_pre_stop_hooks_of_terminating_pods():
    """`down` stops what the supervisor recorded, a terminating pod's preStop hook too."""
    rec = {"name": "sim-ns-p", "pid": 10, "start": 1, "argv": ["sim"], "log": "l", "uid": "u", "ip": "127.1.1.5"}
    hook = {"name": "prestop-ns-p-vllm", "pid": 11, "start": 2, "argv": ["sh"], "log": "h"}
    procs = supervised_procs([rec, {**rec, "pid": 12, "terminating": {"sigterm_at": None, "hook": hook}}])
    assert [(p.name, p.pid, p.start) for p in procs] == [("sim-ns-p", 10, 1), ("sim-ns-p", 12, 1),
                                                         ("prestop-ns-p-vllm", 11, 2)]


def test_fake_nodes_use_the_claimed_network():
    assert {n["spec"]["podCIDR"] for n in fake_nodes(net=7)} == {f"127.7.{i}.0/24" for i in range(1, 27)}


def test_pod_network_claims(tmp_path):
    reg = tmp_path / "reg"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    na = claim_pod_network(a, reg)
    nb = claim_pod_network(b, reg)
    assert na != nb and 1 <= na <= 254 and 1 <= nb <= 254
    assert claim_pod_network(a, reg) == na  # re-claiming one's own network is stable
    release_pod_network(a, reg)
    assert not (reg / f"{na}.json").exists() and (reg / f"{nb}.json").exists()


def test_loopback_listener_nets(tmp_path):
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st\n"
        "   0: 0101017F:1F40 00000000:0000 0A\n"     # 127.1.1.1:8000 LISTEN
        "   1: 0100007F:1F41 00000000:0000 0A\n"     # 127.0.0.1 LISTEN
        "   2: 0101097F:1F40 0100007F:A000 01\n"     # 127.9.1.1 ESTABLISHED: not a listener
        "   3: 0200000A:0050 00000000:0000 0A\n")    # 10.0.0.2 LISTEN: not loopback
    assert loopback_listener_nets([str(table)]) == {0, 1}


def test_rollout_front_and_slot_routers_in_the_supervisor():
    """A rollout's front runs the session proxy alone; its routing table comes from the ConfigMap with each
    Service URL resolved to a Ready pod (no cluster DNS here)."""
    import json as _json

    from e2e.router_pods import (front_container, has_router, local_front_bootstrap, local_front_clusters,
                                 resolve_service_url, routes_volume)
    from v41flash.render.revision import revision_of
    from v41flash.api.v1alpha1 import V41FlashDeployment
    from v41flash.render import SlotSpec, render
    obj = V41FlashDeployment.model_validate({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                             "metadata": {"name": "t", "namespace": "ns"}, "spec": {}})
    new = V41FlashDeployment.model_validate({**obj.model_dump(by_alias=True), "spec": {"model": {"revision": "r2"}}})
    objs = render(new, [SlotSpec("", obj.spec, share=95), SlotSpec("a", new.spec, share=5)])
    get = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    front = {**POD, "spec": get[("Deployment", "t-router")]["spec"]["template"]["spec"]}
    slot_router = {**POD, "spec": get[("Deployment", "t-router-a")]["spec"]["template"]["spec"]}
    assert not has_router(front) and has_router(slot_router) and proxy_container(front) is None
    fc = front_container(front)
    assert fc is not None and fc["name"] == "front" and front_container(slot_router) is None
    path = fc["args"][fc["args"].index("-c") + 1]
    assert routes_volume(front, fc, path) == ("t-config", "front-envoy.json")
    services = {("ns", o["metadata"]["name"]): o for o in objs if o["kind"] == "Service"}

    def pod(name, ip, tmpl, ready=True):
        return {"metadata": {"name": name, "namespace": "ns", "labels": tmpl["metadata"]["labels"]},
                "spec": tmpl["spec"], "status": {"podIP": ip, "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False"}]}}
    r0 = pod("t-router-0-x", "127.1.0.5", get[("Deployment", "t-router-0")]["spec"]["template"])
    ra = pod("t-router-a-x", "127.1.0.6", get[("Deployment", "t-router-a")]["spec"]["template"], ready=False)
    assert resolve_service_url("http://t-router-0.ns.svc:8000", services, [r0, ra]) == "http://127.1.0.5:30001"
    assert resolve_service_url("http://t-router-a.ns.svc:8000", services, [r0, ra]) is None  # not Ready
    assert resolve_service_url("http://127.0.0.1:30001", services, []) == "http://127.0.0.1:30001"
    assert resolve_service_url("http://nope.ns.svc:8000", services, [r0]) is None
    data = get[("ConfigMap", "t-config")]["data"]

    def addresses(text):
        return {c["name"]: [(e["endpoint"]["address"]["socket_address"]["address"],
                             e["endpoint"]["address"]["socket_address"]["port_value"])
                            for e in c["load_assignment"]["endpoints"][0]["lb_endpoints"]]
                for c in _json.loads(text)["resources"]}
    # a Service without a Ready pod refuses connections (no endpoints); the rest still route
    got = addresses(local_front_clusters(data["front-clusters.json"], services, [r0, ra]))
    rev_a = [k for k in got if k not in ("serving", f"revision-{revision_of(render(obj))}")]
    assert got["serving"] == [("127.1.0.5", 30001)] and got[rev_a[0]] == [("127.0.0.1", 9)]
    ra["status"]["conditions"][0]["status"] = "True"
    assert addresses(local_front_clusters(data["front-clusters.json"], services, [r0, ra]))[rev_a[0]] == [
        ("127.1.0.6", 30001)]
    boot = _json.loads(local_front_bootstrap(data["front-envoy.json"], "127.1.0.9", 41001, 41002, "/s/front/x"))
    assert boot["static_resources"]["listeners"][0]["address"]["socket_address"] == {
        "address": "127.1.0.9", "port_value": 30000}
    assert boot["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 41001}
    assert "/etc/v41flash" not in _json.dumps(boot)
    assert boot["dynamic_resources"]["cds_config"]["path_config_source"]["path"] == "/s/front/x/front-clusters.json"


def test_the_e2e_child_kinds_are_the_product_s():
    """The e2e checks list children with the product's CHILD_KINDS (what pruning lists), never a copy: two copies had
    drifted (no DaemonSet, the weight prefetcher)."""
    from e2e.kit import CHILD_RESOURCES, kubectl_resource
    from v41flash.controller.kube import CHILD_KINDS
    assert kubectl_resource("apps/v1", "DaemonSet") == "daemonsets.apps"
    assert kubectl_resource("v1", "Service") == "services"
    assert kubectl_resource("networking.k8s.io/v1", "NetworkPolicy") == "networkpolicies.networking.k8s.io"
    assert len(CHILD_RESOURCES.split(",")) == len(CHILD_KINDS) and "daemonsets.apps" in CHILD_RESOURCES.split(",")


def test_a_timer_pass_later_is_read_from_the_operator_s_periodic_cycle_count():
    """OperatorProcess.wait_timer_passes: "a pass later" as the operator's own count of finished periodic ticks
    (v41flash_periodic_cycle_seconds_count), not a sleep sized for an idle machine; a tick under way does not count."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from e2e.kit import OperatorProcess
    count = {"n": 4}

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            count["n"] += 1  # one more tick finished between two reads
            body = ("# TYPE v41flash_periodic_cycle_seconds histogram\n"
                    f'v41flash_periodic_cycle_seconds_bucket{{le="+Inf"}} {count["n"]}\n'
                    f"v41flash_periodic_cycle_seconds_count {count['n']}\n"
                    "v41flash_periodic_cycle_seconds_sum 1.5\n").encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        op = OperatorProcess.__new__(OperatorProcess)
        op.metrics_port = server.server_address[1]
        assert op.timer_cycles() == 5
        op.wait_timer_passes(2, timeout=10)  # read at 6, returns once a read says 6 + 3
        assert count["n"] == 9
    finally:
        server.shutdown()
