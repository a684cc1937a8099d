#!/usr/bin/env python3
"""The main job, one command (`make demo`): a local real Kubernetes with simulated GPU nodes, the operator,
an example V41FlashDeployment becoming Ready, and a chat completion through the router.

    .venv/bin/python -m e2e.demo [--example manifests/examples/tp4-h200-low-latency.yaml]

Everything keeps running afterwards so you can explore (`kubectl get v41f`); `make down` stops it all.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from e2e.harness import Cluster
from e2e.tools import REPO, log, operator_argv
from v41flash_bench.procs import free_port, spawn

DEFAULT_EXAMPLE = REPO / "manifests" / "examples" / "tp4-h200-low-latency.yaml"
NAMESPACE = "demo"


def start_operator(c: Cluster) -> None:
    if any(p.name == "operator" and p.alive() for p in c.procs()):
        log("operator already running")
        return
    argv = operator_argv(c.kubeconfig, free_port(), free_port())
    proc = spawn("operator", argv, c.logs / "operator.log", env=dict(os.environ, KUBECONFIG=str(c.kubeconfig)))
    c.register(proc)  # `make down` stops it with the rest
    log(f"operator started (pid {proc.pid}); logs: {c.logs / 'operator.log'}")


def kubectl(c: Cluster, *args: str, input: str | None = None) -> str:
    return c.kubectl(*args, input=input, capture=True)


def wait_ready(c: Cluster, name: str, timeout: float = 300) -> dict:
    t0, last = time.monotonic(), ""
    while time.monotonic() - t0 < timeout:
        cr = json.loads(kubectl(c, "get", "v41f", name, "-n", NAMESPACE, "-o", "json"))
        st = cr.get("status") or {}
        ready = next((x for x in st.get("conditions", []) if x["type"] == "Ready"), {})
        line = (f"prefill {st.get('prefill', {}).get('ready', '-')}, decode {st.get('decode', {}).get('ready', '-')}, "
                f"router {st.get('router', {}).get('readyReplicas', 0)}; Ready={ready.get('status', '?')} "
                f"({ready.get('reason', 'waiting for the operator')})")
        if line != last:
            log(f"  {name}: {line}")
            last = line
        if ready.get("status") == "True" and st.get("observedGeneration") == cr["metadata"]["generation"]:
            return cr
        if any(x["type"] == "Stalled" and x["status"] == "True" for x in st.get("conditions", [])):
            raise SystemExit(f"{name} is Stalled: {ready.get('message')}")
        time.sleep(2)
    raise SystemExit(f"{name} not Ready after {timeout:.0f}s; see `make status` and {c.logs}/operator.log")


def chat(c: Cluster, name: str, model: str, prompt: str) -> str:
    pods = json.loads(kubectl(c, "get", "pods", "-n", NAMESPACE, "-l",
                              f"v41flash.io/deployment={name},v41flash.io/role=router,v41flash.io/front=true", "-o", "json"))["items"]
    ip = pods[0]["status"]["podIP"]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32}).encode()
    url = f"http://{ip}:30000/v1/chat/completions"
    deadline = time.monotonic() + 60
    while True:  # the router discovers engines through the apiserver: give it a moment after Ready
        try:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json", "x-session-id": "demo"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())["choices"][0]["message"]["content"]
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"no answer from the router at {url}: {exc}")
            time.sleep(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE, help="a V41FlashDeployment manifest")
    a = ap.parse_args()
    t0 = time.monotonic()
    c = Cluster()
    log("1/5 local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes, LWS)")
    c.up()  # idempotent: an already running cluster gets this checkout's CRD re-applied
    log("2/5 operator")
    start_operator(c)
    import yaml
    doc = yaml.safe_load(a.example.read_text())
    name = doc["metadata"]["name"]
    log(f"3/5 applying {a.example.relative_to(REPO)} in namespace {NAMESPACE}")
    kubectl(c, "create", "namespace", NAMESPACE) if NAMESPACE not in kubectl(c, "get", "ns", "-o", "name") else None
    kubectl(c, "apply", "-n", NAMESPACE, "-f", str(a.example))
    log("4/5 waiting until it is Ready")
    cr = wait_ready(c, name)
    model = cr["spec"]["model"].get("servedModelName") or cr["spec"]["model"]["checkpoint"]
    log("5/5 a chat completion through the router (client -> session proxy -> vllm-router -> prefill sim -> decode sim)")
    answer = chat(c, name, model, "Say hello to the platform team.")
    print()
    print(f"answer from {model}: {answer!r}")
    print()
    print(kubectl(c, "get", "v41f", "-n", NAMESPACE, "-o", "wide"))
    print(f"done in {time.monotonic() - t0:.0f}s. Explore with:")
    print(f"  export KUBECONFIG={c.kubeconfig}")
    print(f"  .venv/bin/kubectl get v41f,deploy,pods -n {NAMESPACE}")
    print(f"  .venv/bin/kubectl describe v41f {name} -n {NAMESPACE}")
    print("Tear everything down (every process stopped by PID, state removed):  make down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
