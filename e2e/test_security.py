"""Security and hostile input on the real apiserver (issue 12): the hostile corpus at admission, the
router's admin API closed to clients, NetworkPolicies accepted (not enforced: the local cluster has no
CNI), a name collision Stalls and leaves the user's object, engine pods admitted under Pod Security
`baseline`."""
from __future__ import annotations

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
    router_pod = next(p for p in pods if p["metadata"]["labels"]["v41flash.io/role"] == "router")
    router = cluster.sim_for(router_pod["metadata"]["name"], ns)
    base = f"http://{router['ip']}:{router['port']}"
    for method, path in (("POST", "/add_worker?url=http://attacker:8000"), ("POST", "/remove_worker?url=x"),
                         ("GET", "/list_workers")):
        r = httpx.request(method, base + path, timeout=10)
        assert r.status_code == 404, (path, r.status_code, r.text)
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 200
    served = doc["spec"]["model"]["servedModelName"]
    r = httpx.post(base + "/v1/chat/completions", headers={"x-session-id": "s-1"}, timeout=30,
                   json={"model": served, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    router_args = next(c for c in router_pod["spec"]["containers"] if c["name"] == "router")["args"]
    assert router_args[router_args.index("--host") + 1] == "127.0.0.1"  # never on the Service's port
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
