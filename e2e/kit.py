"""Helpers for e2e tests: kubectl against the local cluster, polling with progress, simulator lookups.

Tests import them directly (`from kit import kubectl, wait_for`); conftest.py provides the fixtures.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import VENV_BIN, Cluster, proc_start_ticks  # noqa: E402

T = TypeVar("T")


def kubectl(*args: str, input: str | None = None, check: bool = True, kubeconfig: str | Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run .venv/bin/kubectl with the e2e cluster's kubeconfig; raises on a non-zero exit when check."""
    kc = kubeconfig or Cluster().kubeconfig
    r = subprocess.run([str(VENV_BIN / "kubectl"), f"--kubeconfig={kc}", *args], input=input,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        raise AssertionError(f"kubectl {' '.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def kubectl_json(*args: str, **kw) -> dict:
    return json.loads(kubectl(*args, "-o", "json", **kw).stdout)


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll predicate until it returns something truthy and return that; prints progress every 5s.
    Exceptions from predicate count as 'not yet' and the last one is reported on timeout."""
    t0 = time.monotonic()
    last_print = t0
    last: object = None
    while True:
        try:
            v = predicate()
            if v:
                return v
            last = v
        except Exception as e:  # noqa: BLE001 - e.g. connection refused while a process starts
            last = e
        now = time.monotonic()
        if now - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last result: {last!r}")
        if now - last_print >= 5:
            print(f"[e2e] waiting for {what} ({now - t0:.0f}s/{timeout:.0f}s; last: {str(last)[:120]})", flush=True)
            last_print = now
        time.sleep(interval)


@dataclass
class ClusterHandle:
    """What the `cluster` fixture yields."""
    cluster: Cluster
    started_here: bool

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def state(self) -> Path:
        return self.cluster.state

    @property
    def pod_network(self):
        """This cluster's pod network (an ipaddress.IPv4Network inside 127.0.0.0/8)."""
        import ipaddress
        return ipaddress.ip_network(self.cluster.info()["pod_network"])

    @cached_property
    def api(self):
        """A kubernetes.client.ApiClient for the admin kubeconfig."""
        from kubernetes import config
        return config.new_client_from_config(str(self.kubeconfig))

    @cached_property
    def core(self):
        from kubernetes import client
        return client.CoreV1Api(self.api)

    @cached_property
    def apps(self):
        from kubernetes import client
        return client.AppsV1Api(self.api)

    @cached_property
    def custom(self):
        from kubernetes import client
        return client.CustomObjectsApi(self.api)

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return kubectl(*args, kubeconfig=self.kubeconfig, **kw)

    def kubectl_json(self, *args: str, **kw) -> dict:
        return kubectl_json(*args, kubeconfig=self.kubeconfig, **kw)

    def supervised(self, namespace: str | None = None, role: str | None = None, kind: str | None = None,
                   alive_only: bool = True) -> list[dict]:
        """Simulators/routers the supervisor runs now (sims.json entries: pod, ip, port, pid, log, ...)."""
        out = []
        for s in self.cluster.supervised():
            if namespace and s["namespace"] != namespace or role and s["role"] != role or kind and s["kind"] != kind:
                continue
            if alive_only and proc_start_ticks(s["pid"]) != s["start"]:
                continue
            out.append(s)
        return out

    def sim_for(self, pod: str, namespace: str = "default", timeout: float = 30) -> dict:
        """Wait until the supervisor runs a simulator/router for the pod; returns its sims.json entry."""
        return wait_for(lambda: next((s for s in self.supervised(namespace) if s["pod"] == pod), None), timeout,
                        f"a simulated process for pod {namespace}/{pod}")
