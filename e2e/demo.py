#!/usr/bin/env python3
"""The one-command demo (`make demo`): local cluster up, operator running, an example V41FlashDeployment
Ready, one chat completion through the router (client -> router -> prefill -> decode simulators).

    .venv/bin/python e2e/demo.py [--example manifests/examples/tp4-h200-low-latency.yaml] [--namespace demo]

Leaves everything running for you to explore; `make down` stops it all (the operator included).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, VENV_BIN, Cluster, free_port, log, spawn, wait_until  # noqa: E402

DEFAULT_EXAMPLE = REPO / "manifests" / "examples" / "tp4-h200-low-latency.yaml"


def ensure_operator(c: Cluster):
    """Start `v41flash operator` as a harness-managed process (so `down` stops it), unless it runs."""
    running = [p for p in c.procs() if p.name == "operator" and p.alive()]
    if running:
        log(f"operator already running (pid {running[0].pid})")
        return running[0]
    metrics, health = free_port(), free_port()
    argv = [VENV_BIN / "v41flash", "operator", "--kubeconfig", c.kubeconfig, "--bind-address", "127.0.0.1",
            "--metrics-port", str(metrics), "--health-port", str(health)]
    p = spawn("operator", argv, c.logs / "operator.log", port=metrics,
              env=dict(os.environ, KUBECONFIG=str(c.kubeconfig)))
    c.register(p)
    log(f"operator started (pid {p.pid}, metrics http://127.0.0.1:{metrics}/metrics, log {p.log})")
    return p


def conditions(cr: dict) -> dict:
    return {x["type"]: x for x in (cr.get("status") or {}).get("conditions") or []}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE)
    ap.add_argument("--namespace", default="demo")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    t0 = time.monotonic()
    c = Cluster()
    c.up()
    operator = ensure_operator(c)

    cr = yaml.safe_load(a.example.read_text())
    name, ns = cr["metadata"]["name"], a.namespace
    if not c.kubectl("get", "namespace", ns, check=False, capture=True):
        c.kubectl("create", "namespace", ns)
    log(f"applying {a.example.relative_to(REPO) if a.example.is_relative_to(REPO) else a.example} "
        f"as {ns}/{name}")
    c.kubectl("apply", "--server-side", "-n", ns, "-f", str(a.example))

    def ready():
        got = json.loads(c.kubectl("get", "v41f", name, "-n", ns, "-o", "json", capture=True))
        conds = conditions(got)
        r = conds.get("Ready", {})
        pods = c.kubectl("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}", "--no-headers",
                         capture=True).splitlines()
        ready_pods = sum(1 for p in pods if p.split()[1].split("/")[0] == p.split()[1].split("/")[1])
        detail = f"Ready={r.get('status', '?')} {r.get('reason', '')}; pods ready {ready_pods}/{len(pods)}"
        if (conds.get("Stalled") or {}).get("status") == "True":
            raise RuntimeError(f"{name} is Stalled: {conds['Stalled'].get('message')}")
        return r.get("status") == "True", detail
    try:
        wait_until(ready, a.timeout, f"V41FlashDeployment {ns}/{name} to become Ready", operator, interval=1)
    except (RuntimeError, TimeoutError):
        log(f"last operator log lines ({operator.log}):\n" + "\n".join(
            Path(operator.log).read_text(errors="replace").splitlines()[-20:]))
        raise
    log(f"{ns}/{name} is Ready")

    router_ip = c.kubectl("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name},v41flash.io/role=router",
                          "-o", "jsonpath={.items[0].status.podIP}", capture=True).strip()
    port = 30000
    url = f"http://{router_ip}:{port}/v1/chat/completions"
    model = cr["spec"].get("model", {}).get("servedModelName", "deepseek-v4.1-flash")
    body = {"model": model, "max_tokens": 32,
            "messages": [{"role": "user", "content": "In one sentence: why split prefill from decode?"}]}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "x-session-id": "demo-session"})
    log(f"POST {url} (model {model})")
    answer = None
    for _ in range(30):  # the router may still be discovering its workers for a moment
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                answer = json.loads(r.read())
            break
        except (urllib.error.URLError, OSError) as e:
            last = e
            time.sleep(1)
    if answer is None:
        raise RuntimeError(f"no answer from the router: {last}")
    print("\n=== answer (simulated DeepSeek-V4.1-Flash: prefill -> KV transfer -> decode) ===")
    print(answer["choices"][0]["message"]["content"])
    print(f"usage: {answer.get('usage')}\n")
    print(f"$ kubectl get v41f -n {ns}")
    print(c.kubectl("get", "v41f", "-n", ns, capture=True))
    print(f"$ kubectl get pods -n {ns} -o wide")
    print(c.kubectl("get", "pods", "-n", ns, "-o", "wide", capture=True))
    log(f"demo done in {time.monotonic() - t0:.0f}s. Everything keeps running:")
    print(f"  export KUBECONFIG={c.kubeconfig}\n"
          f"  .venv/bin/kubectl get v41f,pods -A\n"
          f"  curl -s {shlex.quote(url)} -H 'Content-Type: application/json' -H 'x-session-id: s1' \\\n"
          f"    -d '{json.dumps({'model': model, 'messages': [{'role': 'user', 'content': 'hi'}]})}'\n"
          f"  .venv/bin/python e2e/harness.py status     # processes, PIDs, ports\n"
          f"  make down                                  # stop everything and remove the state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
