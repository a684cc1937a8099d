"""Install the operator the way users do — `helm install` of charts/v41flash-operator, or
`kubectl apply --server-side -k manifests/` — on the local real control plane, and prove what was installed
is enough and is all there is:

* the operator runs under the installed ServiceAccount and RBAC only: its kubeconfig holds a token from the
  TokenRequest API for that ServiceAccount, no admin credentials; its log shows no permission error;
* an example V41FlashDeployment becomes Ready, as `kubectl wait --for=condition=Ready` sees it (kstatus);
* uninstalling leaves nothing behind: no custom resources, no children, no RBAC, no ServiceAccount.

The operator Deployment that the chart installs is scheduled onto a kwok node, where no container runtime
exists, so it never really runs. A local `v41flash operator` process with the ServiceAccount's token stands
in for that pod: same identity, same RBAC, the same arguments as the rendered container (only the kubeconfig
and loopback ports for metrics/health differ).
"""
from __future__ import annotations

import importlib.util
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from e2e.kit import CHILD_RESOURCES, OperatorProcess, kubectl, wait_for
from e2e.test_operator import wait_ready
from v41flash_bench.procs import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "v41flash-operator"
OP_NS = "v41flash-system"
EXAMPLE = "aggregated-h200"  # decode-only on H200 + router: fits the fake nodes next to anything else
READY_TIMEOUT = 240
# Kinds the operator creates for a deployment, and their pods (what must be gone after uninstall).
CHILD_KINDS = f"{CHILD_RESOURCES},pods"

_spec = importlib.util.spec_from_file_location("manifests_sync", REPO / "manifests" / "sync.py")
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)


def sa_kubeconfig(cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig for the ServiceAccount: the admin kubeconfig's server and CA, a TokenRequest token."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "e2e", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": sa}}],
    }))
    return path


class ServiceAccountOperator(OperatorProcess):
    """The operator as the installed Deployment would run it, but as a local process under the SA's token."""

    name = "operator-install"

    def __init__(self, cluster, kubeconfig: Path, container_args: list[str]):
        super().__init__(SimpleNamespace(cluster=cluster.cluster, kubeconfig=kubeconfig), name=self.name)
        self.log_path = cluster.cluster.logs / f"{self.name}.log"  # its own log: checked for permission errors
        self.metrics_port, self.health_port = free_port(), free_port()
        self.container_args = container_args

    @property
    def argv(self) -> list[str]:
        # The rendered args first; argparse keeps the last value, so loopback ports override the pod's.
        return [str(REPO / ".venv" / "bin" / "v41flash"), *self.container_args, "--kubeconfig",
                str(self.handle.kubeconfig), f"--metrics-port={self.metrics_port}",
                f"--health-port={self.health_port}", "--bind-address=127.0.0.1"]

    def get(self, port: int, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()


@pytest.fixture
def admin_operator_stopped(operator_process):
    """The suite's admin-credential operator must not reconcile while the installed one is under test."""
    operator_process.stop()
    yield
    operator_process.start()


def operator_deployment(cluster) -> dict:
    deploys = cluster.kubectl_json("get", "deployments", "-n", OP_NS,
                                   "-l", "app.kubernetes.io/component=operator")["items"]
    assert len(deploys) == 1, [d["metadata"]["name"] for d in deploys]
    return deploys[0]


def check_installed_operator(cluster, tmp_path: Path, example_ns: str) -> None:
    """Run the installed identity, make the example Ready, then delete it and see its children go."""
    deploy = operator_deployment(cluster)
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    sa = pod["serviceAccountName"]
    kubeconfig = sa_kubeconfig(cluster, OP_NS, sa, tmp_path / "sa.kubeconfig")
    can_i = lambda *a: subprocess.run(  # noqa: E731
        [str(REPO / ".venv" / "bin" / "kubectl"), f"--kubeconfig={kubeconfig}", "auth", "can-i", *a],
        capture_output=True, text=True).stdout.strip()
    # Least privilege as the apiserver sees it: what the operator needs, and nothing like admin.
    assert can_i("patch", "v41flashdeployments.v41flash.io", "-n", example_ns) == "yes"
    assert can_i("create", "deployments.apps", "-n", example_ns) == "yes"
    assert can_i("update", "leases.coordination.k8s.io/v41flash-operator", "-n", OP_NS) == "yes"
    assert can_i("update", "leases.coordination.k8s.io/someone-else", "-n", OP_NS) == "no"
    for verb, what in (("get", "secrets"), ("create", "clusterroles"), ("delete", "namespaces"),
                       ("update", "deployments.apps"), ("escalate", "roles")):
        assert can_i(verb, what, "-n", example_ns) == "no", f"the operator may {verb} {what}"
    # RBAC allows patching any ConfigMap; the installed admission policy (rbac.ownedOnly) refuses one it does
    # not own (the rest of the run proves the operator still applies, prunes and annotates its own)
    cluster.kubectl("create", "configmap", "users-config", "-n", example_ns, "--from-literal=k=v")
    as_sa = lambda *a: subprocess.run(  # noqa: E731
        [str(REPO / ".venv" / "bin" / "kubectl"), f"--kubeconfig={kubeconfig}", *a], capture_output=True, text=True)
    wait_for(lambda: "writes only objects a V41FlashDeployment owns" in as_sa(
        "patch", "configmap", "users-config", "-n", example_ns, "--type=merge",
        "-p", '{"data":{"k":"hijacked"}}').stderr, 30, "the admission policy refusing a user's ConfigMap")

    (container,) = pod["containers"]
    op = ServiceAccountOperator(cluster, kubeconfig, container["args"]).start()
    try:
        wait_for(lambda: op.get(op.health_port, "/healthz")[0] == 200, 60, "the operator's /healthz (the probe)")
        example = (REPO / "manifests" / "examples" / f"{EXAMPLE}.yaml").read_text()
        if not cluster.kubectl("get", "v41f", EXAMPLE, "-n", example_ns, check=False).returncode == 0:
            cluster.kubectl("apply", "--server-side", "-n", example_ns, "-f", "-", input=example)
        try:  # polled: `kubectl wait` errors out on a status without conditions yet
            wait_ready(cluster, example_ns, EXAMPLE, READY_TIMEOUT)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; operator log {op.log_path}") from None
        status = cluster.kubectl_json("get", "v41f", EXAMPLE, "-n", example_ns)
        assert status["status"]["observedGeneration"] == status["metadata"]["generation"]
        _, metrics = op.get(op.metrics_port, "/metrics")
        assert 'v41flash_deployment_ready{name="%s",namespace="%s"} 1.0' % (EXAMPLE, example_ns) in metrics
        # The operator never writes the spec (GitOps tools own it): no manager but the applier holds spec fields.
        managed = cluster.kubectl_json("get", "v41f", EXAMPLE, "-n", example_ns, "--show-managed-fields")
        for entry in managed["metadata"]["managedFields"]:
            if entry["manager"] != "kubectl":
                assert "f:spec" not in entry.get("fieldsV1", {}), f"{entry['manager']} wrote spec fields"
        # Applying the same CR again changes nothing (GitOps tools re-apply constantly).
        rv = status["metadata"]["resourceVersion"]
        cluster.kubectl("apply", "--server-side", "-n", example_ns, "-f", "-", input=example)
        assert cluster.kubectl_json("get", "v41f", EXAMPLE, "-n", example_ns)["metadata"]["resourceVersion"] == rv
    finally:
        # Uninstall, step 1 (also after a failure): the custom resources go first, while the operator still runs
        # to remove its finalizer; otherwise they, and any later CRD deletion, would hang.
        try:
            cluster.kubectl("delete", "v41f", "--all", "-n", example_ns, "--wait=true", "--timeout=120s",
                            timeout=150)
            selector = "app.kubernetes.io/managed-by=v41flash-operator"
            wait_for(lambda: not cluster.kubectl_json("get", CHILD_KINDS, "-n", example_ns, "-l", selector)["items"],
                     120, f"the children in {example_ns} to be garbage-collected")
        finally:
            op.stop()
    log = op.log_text()
    for sign in ("Forbidden", "forbidden", "Not enough permissions"):
        assert sign not in log, f"permission problem in {op.log_path}: {sign}"


def assert_nothing_left(cluster, example_ns: str, release_label: str) -> None:
    left = cluster.kubectl("get", "v41f", "-n", example_ns, "-o", "name", check=False)
    assert left.returncode == 0 and not left.stdout.strip() or "could not find the requested resource" in left.stderr, \
        f"custom resources left: {left.stdout}{left.stderr}"  # (no CRD at all counts as none left)
    for kind in ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies",
                 "validatingadmissionpolicybindings"):
        left = cluster.kubectl_json("get", kind, "-l", release_label)["items"]
        assert not left, f"{kind} left: {[o['metadata']['name'] for o in left]}"
    wait_for(lambda: cluster.kubectl("get", "namespace", OP_NS, check=False).returncode != 0, 120,
             f"namespace {OP_NS} to be gone")


def test_helm_install_runs_under_the_chart_rbac_and_uninstalls_cleanly(cluster, admin_operator_stopped, tmp_path):
    helm = sync.helm_binary()
    if not helm.exists():
        pytest.fail(f"{helm} missing: bash e2e/build-tools.sh helm")
    kc = f"--kubeconfig={cluster.kubeconfig}"
    ns = "install-helm"
    cluster.kubectl("create", "namespace", ns)
    try:
        subprocess.run([str(helm), kc, "install", "v41flash-operator", str(CHART), "-n", OP_NS, "--create-namespace"],
                       check=True, capture_output=True, text=True)
        # Helm's own record of what it installed: the same objects `helm template` renders.
        manifest = subprocess.run([str(helm), kc, "get", "manifest", "v41flash-operator", "-n", OP_NS],
                                  check=True, capture_output=True, text=True).stdout
        kinds = sorted(d["kind"] for d in yaml.safe_load_all(manifest) if d)
        assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding",
                         "Service", "ServiceAccount",  # Role/RoleBinding: the leader-election Lease
                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        check_installed_operator(cluster, tmp_path, ns)
    finally:
        subprocess.run([str(helm), kc, "uninstall", "v41flash-operator", "-n", OP_NS, "--wait"],
                       capture_output=True, text=True)
        cluster.kubectl("delete", "namespace", OP_NS, "--ignore-not-found", "--wait=true", timeout=150)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert_nothing_left(cluster, ns, "app.kubernetes.io/instance=v41flash-operator")
    # Helm keeps CRDs from crds/ on uninstall (its policy: deleting a CRD deletes every user's resources).
    assert cluster.kubectl("get", "crd", "v41flashdeployments.v41flash.io", check=False).returncode == 0


def test_kustomize_install_runs_under_its_rbac_and_uninstalls_cleanly(cluster, admin_operator_stopped, tmp_path):
    stale = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "manifests" / "sync.py"), "--check"],
                           capture_output=True, text=True)
    assert stale.returncode == 0, f"manifests/ is out of date (it would install an old CRD): {stale.stdout}"
    ns = "install-kustomize"
    cluster.kubectl("create", "namespace", ns)
    # The examples carry no namespace: they land in the kubeconfig context's, here the test namespace.
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    admin["contexts"][0]["context"]["namespace"] = ns
    kc = tmp_path / "admin-in-ns.kubeconfig"
    kc.write_text(yaml.safe_dump(admin))
    others = [f"{o['metadata']['namespace']}/{o['metadata']['name']}"
              for o in cluster.kubectl_json("get", "v41f", "-A")["items"]]
    try:
        kubectl("apply", "--server-side", "--force-conflicts", "-k", str(REPO / "manifests"), kubeconfig=kc)
        check_installed_operator(cluster, tmp_path, ns)  # deletes every example in ns on its way out
    finally:
        if others:
            # Deleting the CRD would delete other tests' resources: remove only what is not the CRD.
            print(f"[e2e] other V41FlashDeployments exist ({others}); keeping the CRD")
            cluster.kubectl("delete", "-k", str(REPO / "manifests" / "base"), "--ignore-not-found", "--wait=true",
                            "-l", "app.kubernetes.io/component=operator", timeout=150, check=False)
            cluster.kubectl("delete", "namespace", OP_NS, "--ignore-not-found", "--wait=true", timeout=150)
        else:
            kubectl("delete", "-k", str(REPO / "manifests"), "--ignore-not-found", "--wait=true", "--timeout=150s",
                    kubeconfig=kc, timeout=200)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        crd_gone = cluster.kubectl("get", "crd", "v41flashdeployments.v41flash.io", check=False).returncode != 0
        if crd_gone:
            # Put the CRD back as the harness installed it, for the rest of the session (also after a failure:
            # otherwise every later test of the session fails on a missing CRD instead of on its own).
            crds = sorted((REPO / "crds").glob("*.yaml"))
            cluster.kubectl("apply", "--server-side", "--force-conflicts", *[f"-f={c}" for c in crds])
            # polled, not `kubectl wait`: that errors out on a CRD the apiserver has not given conditions yet
            wait_for(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in (cluster.kubectl_json(
                "get", "crd", "v41flashdeployments.v41flash.io").get("status") or {}).get("conditions") or []),
                60, "the CRD Established again")
    assert_nothing_left(cluster, ns, "app.kubernetes.io/instance=v41flash-operator")
    assert crd_gone or others, "kubectl delete -k manifests/ left the CRD"
