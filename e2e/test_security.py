"""Security and hostile input on the real apiserver (issue 12): the hostile corpus at admission, the
router's admin API closed to clients, NetworkPolicies accepted (not enforced: the local cluster has no
CNI), a name collision Stalls and leaves the user's object, engine pods admitted under Pod Security
`baseline`."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.hostile_corpus import hostile_cases
from e2e.kit import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "manifests/examples/tp4-h200-low-latency.yaml"


def _apply(cluster, doc, ns, check=True):
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def _condition(cr, type_):
    return next((c for c in (cr.get("status") or {}).get("conditions", []) if c["type"] == type_), None)


def _ready(cluster, ns, name, timeout=240):
    def ready():
        cr = cluster.kubectl_json("get", "v41f", name, "-n", ns)
        c = _condition(cr, "Ready")
        return cr if c and c["status"] == "True" else None
    return wait_for(ready, timeout, f"{ns}/{name} Ready")


@pytest.mark.parametrize("case", [c for c in hostile_cases() if c.admission == "refused"], ids=lambda c: c.name)
def test_hostile_spec_refused_at_admission_naming_the_field(cluster, case):
    r = cluster.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(case.path), check=False)
    assert r.returncode != 0, f"{case.name} was admitted"
    field = case.field.split("[")[0]
    assert field in r.stderr or (field == "metadata.name" and "name" in r.stderr), r.stderr


@pytest.mark.parametrize("session_key", ["derive", "client"])
def test_router_admin_api_is_closed_and_network_policies_are_accepted(cluster, operator_process, ns, session_key):
    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    if session_key == "client":  # the proxy stays in front, forwarding what clients send
        doc["spec"]["routing"] = {"sessionKey": "client", "policy": "cache_aware"}
    _apply(cluster, doc, ns)
    _ready(cluster, ns, name)
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}")["items"]
    front_pod = next(p for p in pods if p["metadata"]["labels"].get("v41flash.io/front") == "true")
    router_pod = next(p for p in pods if p["metadata"]["labels"].get("v41flash.io/slot") == "0")  # slot ""'s router
    front = wait_for(lambda: next((x for x in cluster.supervised(ns) if x["pod"] == front_pod["metadata"]["name"]
                                   and x["port"] == 30000), None), 30, "the front's process on the Service's port")
    base = f"http://{front['ip']}:{front['port']}"
    for method, path in (("POST", "/add_worker?url=http://attacker:8000"), ("POST", "/remove_worker?url=x"),
                         ("GET", "/list_workers")):
        r = httpx.request(method, base + path, timeout=10)
        assert r.status_code == 404, (path, r.status_code, r.text)
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 200
    served = doc["spec"]["model"]["servedModelName"]
    r = httpx.post(base + "/v1/chat/completions", headers={"x-session-id": "s-1"}, timeout=30,
                   json={"model": served, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    # vllm-router listens on its internal port, never the Service's; the Service selects the front's pods only, and
    # the router NetworkPolicy opens that port to the deployment's router pods only
    router_args = next(c for c in router_pod["spec"]["containers"] if c["name"] == "router")["args"]
    assert router_args[router_args.index("--port") + 1] == "30001"
    svc = cluster.kubectl_json("get", "service", f"{name}-router", "-n", ns)["spec"]["selector"]
    assert svc.items() <= front_pod["metadata"]["labels"].items()
    assert not svc.items() <= router_pod["metadata"]["labels"].items()
    # The apiserver took both policies; each selects what it should (enforcement needs a CNI: not here).
    pols = {p["metadata"]["name"]: p for p in
            cluster.kubectl_json("get", "networkpolicies", "-n", ns, "-l", f"app.kubernetes.io/instance={name}")["items"]}
    assert set(pols) == {f"{name}-engines", f"{name}-router-ingress"}
    sel = pols[f"{name}-engines"]["spec"]["podSelector"]
    engines = cluster.kubectl_json("get", "pods", "-n", ns, "-l",
                                   f"v41flash.io/deployment={name},v41flash.io/role in (prefill,decode)")["items"]
    assert engines and sel["matchExpressions"][0]["values"] == ["decode", "prefill"]
    assert {p["metadata"]["labels"]["v41flash.io/role"] for p in engines} == {"prefill", "decode"}


def test_name_collision_stalls_and_deleting_the_cr_leaves_the_users_object(cluster, operator_process, ns):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = "app"
    cluster.kubectl("create", "configmap", "app-config", "-n", ns, "--from-literal=key=the-users")
    _apply(cluster, doc, ns)

    def stalled():
        cr = cluster.kubectl_json("get", "v41f", "app", "-n", ns)
        c = _condition(cr, "Stalled")
        return c if c and c["status"] == "True" else None
    c = wait_for(stalled, 60, "app Stalled on the name collision")
    assert c["reason"] == "NameCollision" and "ConfigMap/app-config" in c["message"]
    cm = cluster.kubectl_json("get", "configmap", "app-config", "-n", ns)
    assert cm["data"] == {"key": "the-users"} and not cm["metadata"].get("ownerReferences")
    assert not cluster.kubectl_json("get", "deployments", "-n", ns, "-l", "app.kubernetes.io/instance=app")["items"]
    cluster.kubectl("delete", "v41f", "app", "-n", ns)
    wait_for(lambda: not cluster.kubectl("get", "v41f", "app", "-n", ns, check=False).returncode == 0, 30, "CR gone")
    cm = cluster.kubectl_json("get", "configmap", "app-config", "-n", ns)
    assert cm["data"] == {"key": "the-users"}


def test_engine_pods_run_in_a_baseline_enforced_namespace(cluster, operator_process, ns):
    cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline",
                    "pod-security.kubernetes.io/enforce-version=latest")
    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    _apply(cluster, doc, ns)
    _ready(cluster, ns, name)
    roles = {p["metadata"]["labels"]["v41flash.io/role"] for p in cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}")["items"]}
    assert roles == {"prefill", "decode", "router"}


def test_the_operator_identity_writes_only_what_a_v41flashdeployment_owns(cluster, ns, tmp_path):
    """The chart's cluster-wide RBAC plus its ValidatingAdmissionPolicy (rbac.ownedOnly), installed for a
    release of its own: as that ServiceAccount, children with an ownerReference to a V41FlashDeployment are
    writable, the user's Services, ConfigMaps and pods in another namespace are not."""
    import subprocess

    from e2e.test_install import CHART, sa_kubeconfig, sync
    release, op_ns = "vap-e2e", ns
    rendered = subprocess.run([str(sync.helm_binary()), "template", release, str(CHART), "-n", op_ns,
                               "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
                               "--show-only", "templates/admission-policy.yaml"],
                              check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",  # Role: the leader Lease
                     "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"], kinds
    cluster_scoped = [(d["kind"], d["metadata"]["name"]) for d in docs
                      if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                                       "ValidatingAdmissionPolicyBinding")]
    user_ns = f"{ns}-user"
    cluster.kubectl("create", "namespace", user_ns)
    try:
        cluster.kubectl("apply", "-n", op_ns, "-f", "-", input=rendered)
        sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
        kc = sa_kubeconfig(cluster, op_ns, sa, tmp_path / "sa.kubeconfig")

        def as_operator(*args, input=None):
            return subprocess.run([str(REPO / ".venv" / "bin" / "kubectl"), f"--kubeconfig={kc}", *args],
                                  input=input, capture_output=True, text=True)

        # the user's objects, made by an admin
        cluster.kubectl("create", "service", "clusterip", "db", "--tcp=5432", "-n", user_ns)
        cluster.kubectl("create", "configmap", "app-config", "-n", user_ns, "--from-literal=k=v")
        pod = lambda name, labels: {"apiVersion": "v1", "kind": "Pod",  # noqa: E731
                                    "metadata": {"name": name, "labels": labels},
                                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        ours = {"app.kubernetes.io/managed-by": "v41flash-operator"}
        for doc in (pod("user-pod", {"app": "db"}), pod("engine-like", ours)):
            _apply(cluster, doc, user_ns)

        patch = ["--type=merge", "-p", '{"metadata":{"labels":{"hijacked":"yes"}}}']
        denied = "writes only objects a V41FlashDeployment owns"
        # a new policy takes a moment to be in force: wait on an object of its own, then try the user's
        cluster.kubectl("create", "configmap", "policy-probe", "-n", user_ns)
        wait_for(lambda: denied in as_operator("patch", "configmap", "policy-probe", "-n", user_ns, *patch).stderr,
                 30, "the policy in force")
        for args in (("patch", "service", "db", "-n", user_ns, *patch),
                     ("patch", "configmap", "app-config", "-n", user_ns, *patch),
                     ("delete", "service", "db", "-n", user_ns),
                     ("delete", "configmap", "app-config", "-n", user_ns)):
            r = as_operator(*args)
            assert r.returncode != 0 and denied in r.stderr, (args, r.stderr)
        # adopting the user's object by adding our ownerReference is refused too (it was not ours before)
        # a real owner, or the garbage collector deletes the child: one the operator Stalls without applying
        # anything (an extraArgs flag vLLM does not know)
        cr = yaml.safe_load((REPO / "tests/invalid/30-bad-vllm-extra-arg.yaml").read_text())
        _apply(cluster, cr, user_ns)
        uid = cluster.kubectl_json("get", "v41f", cr["metadata"]["name"], "-n", user_ns)["metadata"]["uid"]
        owner = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "name": cr["metadata"]["name"],
                 "uid": uid}
        adopt = json.dumps({"metadata": {"ownerReferences": [owner]}})
        r = as_operator("patch", "configmap", "app-config", "-n", user_ns, "--type=merge", "-p", adopt)
        assert r.returncode != 0 and denied in r.stderr, r.stderr
        # a child with the owner's reference: created, patched, deleted
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x-config", "ownerReferences": [owner]},
                 "data": {"k": "v"}}
        r = as_operator("create", "-n", user_ns, "-f", "-", input=json.dumps(child))
        assert r.returncode == 0, r.stderr
        r = as_operator("create", "-n", user_ns, "-f", "-",
                        input=json.dumps({**child, "metadata": {"name": "unowned"}}))
        assert r.returncode != 0 and denied in r.stderr, r.stderr
        assert as_operator("patch", "configmap", "x-config", "-n", user_ns, *patch).returncode == 0
        # pods: only the deletion-cost annotation, only on pods labelled as the operator's
        cost = ["controller.kubernetes.io/pod-deletion-cost=-5"]
        assert as_operator("annotate", "pod", "engine-like", "-n", user_ns, *cost).returncode == 0
        r = as_operator("annotate", "pod", "user-pod", "-n", user_ns, *cost)
        assert r.returncode != 0 and "only annotates its own pods" in r.stderr, r.stderr
        r = as_operator("label", "pod", "engine-like", "-n", user_ns, "extra=1")
        assert r.returncode != 0 and "only annotates its own pods" in r.stderr, r.stderr
        # and deletes only its own (a hung or straggling engine replaced, controller/engine_health.py)
        r = as_operator("delete", "pod", "user-pod", "-n", user_ns, "--wait=false")
        assert r.returncode != 0 and "only annotates its own pods" in r.stderr, r.stderr
        assert as_operator("delete", "pod", "engine-like", "-n", user_ns, "--wait=false").returncode == 0, \
            "the operator may delete a pod labelled as its own"
        assert as_operator("delete", "configmap", "x-config", "-n", user_ns).returncode == 0
        # the user's objects are untouched
        cm = cluster.kubectl_json("get", "configmap", "app-config", "-n", user_ns)
        assert cm["data"] == {"k": "v"} and not cm["metadata"].get("ownerReferences")
        assert "hijacked" not in (cluster.kubectl_json("get", "service", "db", "-n", user_ns)["metadata"]
                                  .get("labels") or {})
    finally:
        for kind, name in cluster_scoped:
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", user_ns, "--wait=false", check=False)


def _as(kubeconfig, *args, input=None):
    import subprocess
    return subprocess.run([str(REPO / ".venv" / "bin" / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
                          input=input, capture_output=True, text=True)


def _host_paths(cluster, ns: str) -> dict[str, tuple[str, bool | None]]:
    """'Kind/name container' -> (hostPath, readOnly) of every weight-cache mount in the namespace's workloads."""
    out = {}
    for kind in ("deployments", "daemonsets"):
        for o in cluster.kubectl_json("get", kind, "-n", ns)["items"]:
            pod = o["spec"]["template"]["spec"]
            paths = {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
            for c in pod["containers"] + pod.get("initContainers", []):
                for m in c.get("volumeMounts", []):
                    if m["name"] in paths:
                        out[f"{o['kind']}/{o['metadata']['name']} {c['name']}"] = (paths[m["name"]], m.get("readOnly"))
    return out


def test_a_namespace_user_gets_no_host_path_the_admin_did_not_allow(cluster, operator_process, ns, tmp_path):
    """Issue 39: a user with only the CR's verbs in a namespace (no pods, no DaemonSets) cannot get a host directory
    mounted that the operator's administrator did not allow: a dangerous one is refused at admission, a plain one
    Stalls naming the field with nothing applied; once the admin allows a directory, the namespace gets its own
    subdirectory, read-only in the engines, and another namespace's is still refused."""
    from e2e.test_install import sa_kubeconfig
    cluster.kubectl("create", "serviceaccount", "cr-author", "-n", ns)
    cluster.kubectl("create", "role", "cr-author", "-n", ns, "--resource=v41flashdeployments.v41flash.io",
                    "--verb=get,list,watch,create,update,patch,delete")
    cluster.kubectl("create", "rolebinding", "cr-author", "-n", ns, "--role=cr-author",
                    f"--serviceaccount={ns}:cr-author")
    kc = sa_kubeconfig(cluster, ns, "cr-author", tmp_path / "cr-author.kubeconfig")
    assert _as(kc, "auth", "can-i", "create", "v41flashdeployments", "-n", ns).stdout.strip() == "yes"
    for what in ("pods", "daemonsets", "deployments"):
        assert _as(kc, "auth", "can-i", "create", what, "-n", ns).stdout.strip() == "no", what

    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    field = "spec.startup.weightCache.hostPath"
    # in or above the kubelet's directory, the host root by another spelling: refused by the apiserver
    for path in ("/var/lib/kubelet", "/mnt/..", "/ETC", "/proc/1/root"):
        doc["spec"]["startup"] = {"weightCache": {"hostPath": path}}
        r = _as(kc, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
        assert r.returncode != 0 and field in r.stderr, (path, r.stderr)
    # a plain directory the default operator does not allow: admitted, Stalled naming the field, nothing applied
    doc["spec"]["startup"] = {"weightCache": {"hostPath": "/mnt/nvme/v41flash"}}
    r = _as(kc, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    assert r.returncode == 0, r.stderr

    def stalled():
        c = _condition(cluster.kubectl_json("get", "v41f", name, "-n", ns), "Stalled")
        return c if c and c["status"] == "True" else None
    c = wait_for(stalled, 60, f"{name} Stalled on the host path")
    assert c["reason"] == "InvalidSpec" and field in c["message"] and "allows no weight cache host path" in c["message"]
    assert _host_paths(cluster, ns) == {}
    assert not cluster.kubectl_json("get", "deployments,daemonsets", "-n", ns)["items"]  # nothing half-applied

    # the administrator opts in: the namespace's own directory, read-only in the engines, written by the prefetcher
    before = list(operator_process.extra_args)
    operator_process.extra_args = [*before, "--weight-cache-host-paths", "/mnt/nvme/v41flash"]
    operator_process.restart()
    try:
        mine = f"/mnt/nvme/v41flash/{ns}"
        mounts = wait_for(lambda: (lambda m: m if len(m) >= 3 else None)(_host_paths(cluster, ns)), 90,
                          "the engines and the prefetcher rendered with the allowed directory")
        assert {path for path, _ in mounts.values()} == {mine}, mounts
        writers = [k for k, (_, read_only) in mounts.items() if not read_only]
        assert writers == [f"DaemonSet/{name}-weight-prefetch download"], mounts
        # reaching into another namespace's directory: Stalled again, what runs keeps its own directory
        doc["spec"]["startup"] = {"weightCache": {"hostPath": "/mnt/nvme/v41flash/other-team"}}
        assert _as(kc, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc)).returncode == 0
        c = wait_for(stalled, 60, f"{name} Stalled on another namespace's directory")
        assert field in c["message"] and "is not a weight cache directory the operator allows" in c["message"]
        assert {path for path, _ in _host_paths(cluster, ns).values()} == {mine}
    finally:
        cluster.kubectl("delete", "v41f", name, "-n", ns, "--wait=false", check=False)
        operator_process.extra_args = before
        operator_process.restart()
