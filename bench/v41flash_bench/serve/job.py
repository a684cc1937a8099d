"""`v41flash bench serve --job`: the same measurement as a Kubernetes Job next to the deployment.

The Job runs `v41flash bench serve` with the arguments it was given (less --job*, --kubeconfig and --out) in the
deployment's namespace, under a ServiceAccount that may read V41FlashDeployments and list pods there (the system
facts and cold starts); it reaches the front through the Service's DNS name. Progress goes to the pod's log
(`kubectl logs -f job/NAME`) as the run goes; the records land in /results (an emptyDir unless --job-pvc names a
claim) and are printed to the log at the end, one JSON line each, so that
`kubectl logs job/NAME | grep '^{"schema"' > records.jsonl` brings them home.
"""
from __future__ import annotations

import hashlib
import shlex

import yaml

DROP_WITH_VALUE = ("--job-image", "--job-pvc", "--kubeconfig", "--out")
DROP_BARE = ("--job",)


def job_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in DROP_BARE:
            continue
        if name in DROP_WITH_VALUE:
            skip = "=" not in a
            continue
        out.append(a)
    return out + ["--out", "/results"]


def job_manifest(argv: list[str], deployment: str | None, namespace: str, image: str, pvc: str = "") -> str:
    if not deployment:
        raise ValueError("--job runs next to a deployment: give --deployment NAME --namespace NS")
    if not image:
        raise ValueError("--job needs --job-image: an image with `pip install 'v41flash[bench]'` (the operator "
                         "image holds the product only)")
    args = job_args(argv)
    name = f"bench-{deployment}"[:52] + "-" + hashlib.sha256(" ".join(args).encode()).hexdigest()[:8]
    labels = {"app.kubernetes.io/name": "v41flash-bench", "v41flash.io/deployment": deployment}
    script = ("set -o pipefail; v41flash bench serve " + " ".join(shlex.quote(a) for a in args)
              + " && grep '^{' /results/records.jsonl")
    volume = ({"name": "results", "persistentVolumeClaim": {"claimName": pvc}} if pvc
              else {"name": "results", "emptyDir": {}})
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "v41flash-bench", "namespace": namespace,
                                                                    "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "v41flash-bench", "namespace": namespace, "labels": labels},
         "rules": [{"apiGroups": ["v41flash.io"], "resources": ["v41flashdeployments"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "v41flash-bench", "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "v41flash-bench"},
         "subjects": [{"kind": "ServiceAccount", "name": "v41flash-bench", "namespace": namespace}]},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace, "labels": labels},
         "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": "v41flash-bench", "restartPolicy": "Never",
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {
                          "type": "RuntimeDefault"}},
                      "containers": [{"name": "bench", "image": image, "command": ["bash", "-c", script],
                                      "env": [{"name": "PYTHONUNBUFFERED", "value": "1"},
                                              {"name": "MPLCONFIGDIR", "value": "/tmp"}],
                                      "securityContext": {"allowPrivilegeEscalation": False,
                                                          "capabilities": {"drop": ["ALL"]}},
                                      "volumeMounts": [{"name": "results", "mountPath": "/results"}]}],
                      "volumes": [volume]}}}},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)
