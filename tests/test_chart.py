"""The Helm chart (charts/v41flash-operator) and the kustomize install (manifests/) it generates.

Needs helm built by `bash e2e/build-tools.sh helm` (pinned in e2e/versions.env; `make unit` builds it first);
without it the tests that render the chart skip locally and fail under CI (tests/prereq.py). Everything
else (CRD copies, RBAC derived from the code) runs without helm.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import fields
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from prereq import require_tool
from v41flash.api import v1alpha1 as api
from v41flash.cli.main import build_parser
from v41flash.cli.operator import flag, tunables
from v41flash.controller.config import OperatorConfig, floats, strings
from v41flash.controller.kube import CHILD_KINDS
from v41flash.render import render

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "v41flash-operator"
K8S_VERSION = "1.36.0"

_spec = importlib.util.spec_from_file_location("manifests_sync", REPO / "manifests" / "sync.py")
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)

# What the operator may do, resource by resource: (apiGroup, resource) -> verbs. Each line is justified in
# charts/v41flash-operator/templates/_helpers.tpl; a change to the code's API use must change this table.
CHILD = {"get", "list", "create", "patch", "delete"}  # apply (patch + create), no adoption (get), prune, delete
NAMESPACED_RULES = {
    ("v41flash.io", "v41flashdeployments"): {"get", "list", "watch", "patch"},
    ("v41flash.io", "v41flashdeployments/status"): {"patch"},
    ("v41flash.io", "v41flashdeployments/finalizers"): {"update"},
    ("apps", "deployments"): CHILD | {"get", "watch"},  # workloads: also watched (status) and read by name
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): CHILD | {"get", "watch"},
    ("apps", "controllerrevisions"): {"get", "list", "create", "delete"},  # rollouts: create-only records
    ("apps", "daemonsets"): CHILD,  # the weight prefetcher (spec.startup.weightCache.prefetch)
    ("", "services"): CHILD,
    ("", "serviceaccounts"): CHILD,
    ("", "configmaps"): CHILD,
    ("rbac.authorization.k8s.io", "roles"): CHILD,
    ("rbac.authorization.k8s.io", "rolebindings"): CHILD,
    ("policy", "poddisruptionbudgets"): CHILD,
    ("autoscaling", "horizontalpodautoscalers"): CHILD,
    ("networking.k8s.io", "networkpolicies"): CHILD,
    ("inference.networking.k8s.io", "inferencepools"): CHILD | {"watch"},  # mode Gateway; watch: the picker's Role
    ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "list", "watch"},  # the picker's Role grants it
    ("gateway.networking.k8s.io", "httproutes"): CHILD,
    ("resource.nvidia.com", "computedomains"): CHILD,  # multi-node NVLink replicas (render/compute_domain.py)
    ("resource.k8s.io", "resourceclaimtemplates"): CHILD,  # spec.gpu.allocation: DRA (render/dra.py)
    ("", "pods"): {"get", "list", "watch", "patch", "delete"},
    ("", "events"): {"create"},
    ("events.k8s.io", "events"): {"create"},
}
CRD_OBSERVATION = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
                   ("", "nodes"): {"get"}}  # the node of an engine pod that is not Ready (NodeNotReady)
NAMESPACE_OBSERVATION = {("", "namespaces"): {"list", "watch"}}
LEADER_ELECTION = {("coordination.k8s.io", "leases"): {"create", "get", "update"}}  # get/update: its own Lease


def leader_election_role(objs: list[dict]) -> dict:
    (role,) = [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "v41flash-system"
    assert rules_of(role, named=True) == LEADER_ELECTION
    named = [r for r in role["rules"] if set(r["verbs"]) & {"get", "update"}]
    assert all(r.get("resourceNames") == ["v41flash-operator"] for r in named)
    return role
def camel(field_name: str) -> str:
    """The chart's key of an OperatorConfig field: timer_interval_seconds -> timerIntervalSeconds."""
    head, *rest = field_name.split("_")
    return head + "".join(word.title() for word in rest)


# every tunable off its default
TUNED = OperatorConfig(timer_interval_seconds=3, drift_every=6, drift_recent_ticks=2, pass_workers=8, urgent_workers=2,
                       pass_deadline_seconds=30, backoff_seconds=(1, 2.5), rollout_pass_seconds=2, planner_workers=4,
                       planner_deadline_seconds=10, apply_workers=6, urgent_apply_workers=16, connection_pool=48,
                       request_timeout_seconds=(2, 10), weight_cache_host_paths=("/mnt/nvme/v41flash", "/data/w"),
                       weight_cache_shared_host_paths=("/mnt/shared",),
                       prometheus_endpoints=("http://prometheus-operated.monitoring:9090",),
                       prometheus_namespaces=("monitoring", "observability"))

VALUE_SETS = {
    "defaults": [],
    "tuned": ["--set-json", "controller=" + json.dumps({camel(f.name): getattr(TUNED, f.name) for f in fields(TUNED)})],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "namespaced-no-observer": ["--set", "watchNamespaces={team-a}", "--set", "rbac.clusterObservation=false"],
    "everything-on": ["--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                      "--set", "prometheusRule.enabled=true", "--set", "dashboard.enabled=true",
                      "--set", "image.digest=sha256:" + "0" * 64, "--set", "verbose=true",
                      "--set", "nodeSelector.pool=system", "--set", "tolerations[0].operator=Exists"],
}


@pytest.fixture(scope="session")
def helm() -> Path:
    return require_tool(sync.helm_binary(), "bash e2e/build-tools.sh helm")


def template(helm: Path, *args: str) -> list[dict]:
    out = subprocess.run([str(helm), "template", "v41flash-operator", str(CHART), "--namespace", "v41flash-system",
                          *args], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def rules_of(role: dict, named: bool = False) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs; fails on any wildcard or a resource granted twice (a grant limited to
    resourceNames may sit beside an unnamed one only where `named` says so: the leader-election Lease)."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        assert named or "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in group and "*" not in resource and "*" not in rule["verbs"], rule
                assert not out.get((group, resource), set()) & set(rule["verbs"]), f"{group}/{resource} granted twice"
                out[(group, resource)] = out.get((group, resource), set()) | set(rule["verbs"])
    return out


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


# --- CRD copies -------------------------------------------------------------------------------------------

def test_chart_and_kustomize_carry_the_generated_crd_byte_for_byte():
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        for copy in (CHART / "crds" / crd.name, REPO / "manifests" / "base" / "crds" / crd.name):
            assert copy.exists() and copy.read_bytes() == crd.read_bytes(), \
                f"{copy.relative_to(REPO)} differs from crds/: run .venv/bin/python manifests/sync.py"
    assert {p.name for p in (CHART / "crds").glob("*.yaml")} == {p.name for p in (REPO / "crds").glob("*.yaml")}


# --- Rendering --------------------------------------------------------------------------------------------

def test_helm_lint_is_clean(helm):
    for name, args in VALUE_SETS.items():
        r = subprocess.run([str(helm), "lint", "--strict", str(CHART), *args], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
        assert "[WARNING]" not in r.stdout and "[ERROR]" not in r.stdout, f"{name}: {r.stdout}"


# Kinds of the Prometheus Operator: no upstream schema in kubernetes_validate; their content is checked in
# tests/test_chart_observability.py.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_every_rendered_object_is_valid_kubernetes(helm, values):
    objs = template(helm, *VALUE_SETS[values])
    assert objs
    for obj in objs:
        if obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # Helm installs crds/ itself; validate that copy too (kubectl and Helm send it as is).
    for crd in (CHART / "crds").glob("*.yaml"):
        kubernetes_validate.validate(yaml.safe_load(crd.read_text()), K8S_VERSION, strict=True)


def test_optional_objects_follow_their_toggles(helm):
    kinds = lambda objs: sorted(o["kind"] for o in objs)  # noqa: E731
    policy = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert kinds(template(helm)) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget",
                                     "Role", "RoleBinding", "Service", "ServiceAccount", *policy]
    on = template(helm, *VALUE_SETS["everything-on"])
    assert kinds(on) == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "PodDisruptionBudget",
                         "PodMonitor", "PrometheusRule", "Role", "RoleBinding", "Service", "ServiceAccount",
                         "ServiceMonitor", *policy]
    none = template(helm, "--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                    "--set", "serviceAccount.name=existing", "--set", "metrics.service.enabled=false",
                    "--set", "podDisruptionBudget.enabled=false")
    assert kinds(none) == ["Deployment"]
    assert none[0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


# --- RBAC: least privilege, derived from what the code does ------------------------------------------------

def test_clusterwide_rbac_has_exactly_the_verbs_the_operator_uses(helm):
    objs = template(helm)
    (role,) = by_kind(objs, "ClusterRole")
    assert rules_of(role) == NAMESPACED_RULES | CRD_OBSERVATION
    (binding,) = by_kind(objs, "ClusterRoleBinding")
    (sa,) = by_kind(objs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "v41flash-system"}]
    assert by_kind(objs, "Role") == [leader_election_role(objs)]


def test_namespaced_rbac_is_a_role_per_watched_namespace(helm):
    objs = template(helm, *VALUE_SETS["namespaced"])
    lease_role = leader_election_role(objs)
    roles = [r for r in by_kind(objs, "Role") if r is not lease_role]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rules_of(role) == NAMESPACED_RULES
    bindings = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"] != lease_role["metadata"]["name"]]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role" and b["subjects"][0]["namespace"] == "v41flash-system"
    # The only cluster-scoped grant is read-only: kopf's observation of CRDs and namespaces, nodes by name.
    (observer,) = by_kind(objs, "ClusterRole")
    assert rules_of(observer) == CRD_OBSERVATION | NAMESPACE_OBSERVATION
    assert not by_kind(template(helm, *VALUE_SETS["namespaced-no-observer"]), "ClusterRole")


def test_rbac_covers_every_child_kind_the_controller_prunes():
    """kube.CHILD_KINDS is what reconcile lists and deletes; each needs the full child verb set."""
    plural = {"Deployment": "deployments", "DaemonSet": "daemonsets", "LeaderWorkerSet": "leaderworkersets",
              "Service": "services",
              "ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
              "PodDisruptionBudget": "poddisruptionbudgets", "ConfigMap": "configmaps",
              "HorizontalPodAutoscaler": "horizontalpodautoscalers",
              "NetworkPolicy": "networkpolicies", "InferencePool": "inferencepools", "HTTPRoute": "httproutes",
              "ComputeDomain": "computedomains", "ResourceClaimTemplate": "resourceclaimtemplates"}
    for api_version, kind in CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        assert CHILD <= NAMESPACED_RULES[(group, plural[kind])], kind


def _examples() -> list[api.V41FlashDeployment]:
    out = []
    for path in sorted((REPO / "manifests" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == api.KIND:
                out.append(api.V41FlashDeployment.model_validate(doc))
    return out


def test_operator_holds_every_permission_it_grants_and_creates_every_kind_it_renders():
    """RBAC escalation prevention: the operator can only create a Role granting what it holds itself."""
    examples = _examples()
    assert examples, "manifests/examples/ has no V41FlashDeployment"
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "x", "uid": "u"}
    seen_roles = 0
    for ex in examples:
        for obj in render(ex, owner=owner):
            group = obj["apiVersion"].rpartition("/")[0]
            kind = obj["kind"].lower()
            resource = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
            assert CHILD <= NAMESPACED_RULES.get((group, resource), set()), f"cannot apply {obj['kind']}"
            if obj["kind"] == "Role":
                seen_roles += 1
                for (g, r), verbs in rules_of(obj).items():
                    assert verbs <= NAMESPACED_RULES.get((g, r), set()), f"router Role grants {g}/{r} {verbs}"
    assert seen_roles


# --- The operator Deployment -------------------------------------------------------------------------------

def test_one_replica_without_leader_election_is_recreated_not_rolled(helm):
    objs = template(helm, "--set", "replicaCount=1", "--set", "leaderElection.enabled=false")
    deploy, c = _operator(objs)
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-elect" in c["args"]
    assert "affinity" not in deploy["spec"]["template"]["spec"]
    assert not by_kind(objs, "PodDisruptionBudget")
    assert not [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-leader-election")]


def _operator(objs: list[dict]) -> tuple[dict, dict]:
    (deploy,) = by_kind(objs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return deploy, container


def test_operator_deployment_is_hardened_and_highly_available(helm):
    objs = template(helm)
    deploy, c = _operator(objs)
    spec, pod = deploy["spec"], deploy["spec"]["template"]["spec"]
    # two replicas, one acting (the Lease); a rolling update never leaves none running
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "--leader-elect" in c["args"] and "--leader-election-namespace=v41flash-system" in c["args"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
        "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (pdb,) = by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    rb = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"].endswith("-leader-election")]
    assert rb and rb[0]["subjects"][0]["name"] == pod["serviceAccountName"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["image"] == "v41flash/operator:0.1.0"
    assert pod["serviceAccountName"] == "v41flash-operator"
    # Selector labels must not look like the operator's children (those carry managed-by: v41flash-operator).
    assert deploy["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "v41flash-operator"


@pytest.mark.parametrize("values,namespaces", [("defaults", None), ("namespaced", ["team-a", "team-b"])])
def test_operator_args_are_what_the_cli_accepts(helm, values, namespaces):
    """The container args parse with the operator's own argparse (the image's entrypoint is `v41flash`)."""
    _, c = _operator(template(helm, *VALUE_SETS[values]))
    args = build_parser().parse_args(c["args"])
    assert args.command == "operator"
    assert (args.metrics_port, args.health_port, args.bind_address) == (8080, 8081, "0.0.0.0")
    assert args.log_format == "json" and args.namespace == namespaces


def test_every_tunable_reaches_the_operator_as_its_flag(helm):
    """values.controller -> container args -> the operator's own argparse -> the same OperatorConfig; with none
    set, no tunable flag at all (the default render stays as it was)."""
    assert all(getattr(TUNED, f.name) != f.default for f in fields(OperatorConfig))  # each one shows
    _, c = _operator(template(helm, *VALUE_SETS["tuned"]))
    assert tunables(build_parser().parse_args(c["args"])) == TUNED
    _, plain = _operator(template(helm))
    assert not {a.split("=")[0] for a in plain["args"]} & {flag(f.name) for f in fields(OperatorConfig)}


def test_the_values_schema_has_every_tunable_and_only_those():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["controller"]["properties"]
    types = {int: "integer", float: "number", floats: "array", strings: "array"}
    assert {key: s["type"] for key, s in schema.items()} == \
        {camel(f.name): types[f.metadata["parse"]] for f in fields(OperatorConfig)}
    described = (CHART / "values.yaml").read_text()
    assert [camel(f.name) for f in fields(OperatorConfig) if camel(f.name) not in described] == []


def test_metrics_service_selects_the_operator_pod(helm):
    objs = template(helm)
    deploy, _ = _operator(objs)
    (svc,) = by_kind(objs, "Service")
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]


# --- kustomize ---------------------------------------------------------------------------------------------

def test_kustomize_base_is_the_chart_rendered(helm):
    """manifests/ is generated from the chart by manifests/sync.py; nothing may be edited by hand."""
    r = subprocess.run([".venv/bin/python", "manifests/sync.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _kustomize(path: str) -> list[dict]:
    out = subprocess.run([str(REPO / ".venv" / "bin" / "kubectl"), "kustomize", str(REPO / path)],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_kustomize_installs_the_same_objects_as_helm(helm):
    built = _kustomize("manifests/base")
    helm_objs = [sync.strip_helm_labels(o) for o in template(helm)]
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    by_key = {key(o): o for o in built}
    for obj in helm_objs:
        assert by_key.get(key(obj)) == obj, f"{key(obj)} differs between the chart and manifests/base"
    crd = yaml.safe_load(next((REPO / "crds").glob("*.yaml")).read_text())
    assert by_key[("CustomResourceDefinition", "", crd["metadata"]["name"])] == crd
    assert {k[0] for k in by_key} == {o["kind"] for o in helm_objs} | {"CustomResourceDefinition", "Namespace"}
    for obj in built:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_top_level_kustomization_includes_every_example():
    built = _kustomize("manifests")
    names = {o["metadata"]["name"] for o in built if o["kind"] == api.KIND}
    assert names == {e.metadata["name"] for e in _examples()}
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "v41flash-operator" for o in built)


@pytest.mark.parametrize("bad,message", [
    (["--set", "logFormat=yaml"], "/logFormat"),
    (["--set", "watchNamspaces={a}"], "watchNamspaces"),  # a typo must not silently mean cluster-wide
    (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["--set", "image.digest=latest"], "/image/digest"),
    (["--set", "controller.timerInterval=3"], "timerInterval"),  # a typo must not silently mean the default
    (["--set", "controller.passWorkers=0"], "/controller/passWorkers"),
])
def test_values_schema_refuses_mistakes(helm, bad, message):
    r = subprocess.run([str(helm), "template", "x", str(CHART), *bad], capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr, r.stderr


# --- writes narrowed to what the operator owns (ValidatingAdmissionPolicy) -----------------------------------

OPERATOR_USER = "system:serviceaccount:v41flash-system:v41flash-operator"
OWNER = [{"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "name": "x", "uid": "u",
          "controller": True}]
OURS = {"app.kubernetes.io/managed-by": "v41flash-operator", "v41flash.io/deployment": "x"}


def _policy(objs: list[dict]) -> tuple[dict, dict]:
    (policy,) = by_kind(objs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(objs, "ValidatingAdmissionPolicyBinding")
    return policy, binding


def admitted(policy: dict, user: str, op: str, resource: tuple[str, str], obj: dict | None,
             old: dict | None) -> bool:
    """The policy's verdict on one request, evaluated as the apiserver does: match, variables, validations."""
    import cel
    group, plural = resource
    spec = policy["spec"]
    if not any(group in r["apiGroups"] and plural in r["resources"] and op in r["operations"]
               for r in spec["matchConstraints"]["resourceRules"]):
        return True
    ctx = {"request": {"operation": op, "userInfo": {"username": user}, "namespace": "ns", "name": "n",
                       "resource": {"group": group, "resource": plural}}, "object": obj, "oldObject": old}
    if not all(cel.evaluate(c["expression"], ctx) is True for c in spec["matchConditions"]):
        return True
    ctx["variables"] = {}
    for v in spec["variables"]:
        ctx["variables"][v["name"]] = cel.evaluate(v["expression"], ctx)
    return all(cel.evaluate(v["expression"], ctx) is True for v in spec["validations"])


def test_the_operator_may_write_only_what_a_v41flashdeployment_owns(helm):
    policy, binding = _policy(template(helm))
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    owned, mine = {"metadata": {"ownerReferences": OWNER}}, {"metadata": {}}
    foreign_owner = {"metadata": {"ownerReferences": [{**OWNER[0], "apiVersion": "apps/v1", "kind": "ReplicaSet"}]}}
    svc = ("", "services")
    ok = lambda *a: admitted(policy, OPERATOR_USER, *a)  # noqa: E731
    assert ok("CREATE", svc, owned, None) and ok("UPDATE", svc, owned, owned) and ok("DELETE", svc, None, owned)
    assert not ok("CREATE", svc, mine, None)  # a child without its owner
    assert not ok("UPDATE", svc, owned, mine)  # adopting the user's object
    assert not ok("UPDATE", svc, mine, owned)  # dropping the owner
    assert not ok("DELETE", svc, None, mine) and not ok("DELETE", svc, None, foreign_owner)
    pod = lambda labels, ann=None: {"metadata": {"labels": labels, "annotations": ann or {}}}  # noqa: E731
    pods = ("", "pods")
    cost = {"controller.kubernetes.io/pod-deletion-cost": "-5"}
    assert ok("UPDATE", pods, pod(OURS, cost), pod(OURS))  # the deletion-cost annotation on its pod
    assert not ok("UPDATE", pods, pod({"app": "db"}, cost), pod({"app": "db"}))  # someone else's pod
    assert not ok("UPDATE", pods, pod({**OURS, "extra": "1"}), pod(OURS))  # relabelling its own
    assert ok("DELETE", pods, None, pod(OURS))  # a hung or straggling engine replaced (controller/engine_health.py)
    assert not ok("DELETE", pods, None, pod({"app": "db"})) and not ok("CREATE", pods, pod(OURS), None)
    # anyone else (the garbage collector, users, controllers) is not this policy's business
    assert admitted(policy, "system:serviceaccount:kube-system:generic-garbage-collector", "DELETE", svc, None, mine)
    assert admitted(policy, "alice", "UPDATE", pods, pod({"app": "db"}, cost), pod({"app": "db"}))


def test_the_policy_covers_every_resource_the_operator_may_write(helm):
    """Derived from the RBAC table: a resource the operator may create/patch/delete that the policy does not
    match would be writable cluster-wide again (the CR itself and Events are its own to write)."""
    policy, _ = _policy(template(helm, *VALUE_SETS["namespaced"]))  # in both scopes
    matched = {(g, r): set(rule["operations"]) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    ops = {"create": "CREATE", "patch": "UPDATE", "update": "UPDATE", "delete": "DELETE"}
    own = {("v41flash.io", "v41flashdeployments"), ("v41flash.io", "v41flashdeployments/status"),
           ("v41flash.io", "v41flashdeployments/finalizers"), ("", "events"), ("events.k8s.io", "events")}
    written = {res: {ops[v] for v in verbs if v in ops} for res, verbs in NAMESPACED_RULES.items() if res not in own}
    assert {res for res, o in written.items() if o} == set(matched)
    for res, o in written.items():
        assert o <= matched.get(res, set()), res  # a read-only grant (o empty) needs no match
    assert not by_kind(template(helm, "--set", "rbac.ownedOnly=false"), "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"][0]["expression"].endswith(f"'{OPERATOR_USER}'")
