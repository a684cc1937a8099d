"""Helpers for e2e tests: kubectl against the local cluster, polling with progress, simulator lookups.

Tests import them (`from e2e.kit import kubectl, wait_for`); conftest.py provides the fixtures.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, TypeVar

from e2e.harness import Cluster
from e2e.tools import VENV_BIN, operator_argv
from v41flash.controller.kube import CHILD_KINDS
from v41flash_bench.procs import Proc, free_port, proc_start_ticks, spawn, stop_procs

T = TypeVar("T")


def kubectl_resource(api_version: str, kind: str) -> str:
    """kubectl's fully qualified name of a kind: ("apps/v1", "Deployment") -> deployments.apps, ("v1", "Service")
    -> services."""
    group = api_version.rpartition("/")[0]
    plural = kind.lower()[:-1] + "ies" if kind.endswith("y") else kind.lower() + "s"
    return f"{plural}.{group}" if group else plural


# Every kind the operator can create for a deployment, for `kubectl get`: from the product's one list (what its
# pruning lists), never a copy here.
CHILD_RESOURCES = ",".join(kubectl_resource(v, k) for v, k in CHILD_KINDS)

# The periodic tick of every operator the suite starts (OperatorProcess): the default 15 s would make each wait
# for "a timer pass later" 15 s or more. Waits on the timer derive from this.
TIMER_INTERVAL_S = 3.0


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


class LoadThreads:
    """Threads that send requests until stopped, each response appended to ``records`` (a dict with ``status``):
    ``_worker(w)`` is the subclass's; ``_extra_threads()`` any others (a sampler). A context manager."""

    def __init__(self, workers: int):
        self.workers = workers
        self.records: list[dict] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _worker(self, w: int) -> None:
        raise NotImplementedError

    def _extra_threads(self) -> list[threading.Thread]:
        return []

    def record(self, rec: dict) -> None:
        with self.lock:
            self.records.append(rec)

    def wait_requests(self, n: int, timeout: float = 60) -> None:
        start = len(self.records)
        wait_for(lambda: len(self.records) >= start + n, timeout, f"{n} more requests answered")

    def failures(self) -> list[dict]:
        return [r for r in self.records if r["status"] != 200]

    def __enter__(self):
        self.threads = [*self._extra_threads(),
                        *(threading.Thread(target=self._worker, args=(w,), daemon=True) for w in range(self.workers))]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


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


class OperatorProcess:
    """The operator under test, run as `v41flash operator --kubeconfig PATH` against the e2e cluster, exactly
    as the README runs it: no KUBECONFIG in its environment (issue 13's bug hid behind it). Leader election is
    on, as in the chart, with a stable identity so a restart takes its Lease back at once; its periodic tick is
    TIMER_INTERVAL_S."""

    name = "operator"

    def __init__(self, handle: ClusterHandle, extra_args: list[str] | None = None, name: str | None = None,
                 identity: str | None = None):
        import uuid
        self.handle = handle
        self.name = name or self.name
        self.identity = identity or f"e2e-{self.name}-{uuid.uuid4().hex[:6]}"
        self.extra_args = list(extra_args or [])
        self.log_path = handle.cluster.logs / f"{self.name}.log"
        self.proc: Proc | None = None
        self.starts = 0
        # its own loopback ports: other operators (and clusters) may run on the same machine
        self.metrics_port = free_port()
        self.health_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def argv(self) -> list[str]:
        return operator_argv(self.handle.kubeconfig, self.metrics_port, self.health_port,
                             "--leader-election-id", self.identity,
                             "--timer-interval-seconds", f"{TIMER_INTERVAL_S:g}", *self.extra_args)

    def start(self) -> "OperatorProcess":
        assert not self.alive, "operator already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== [e2e] start #{self.starts + 1}: {' '.join(self.argv)}\n".encode())
        self.proc = spawn(self.name, self.argv, self.log_path,
                          env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
        self.handle.cluster.register(self.proc)  # so `python -m e2e.harness down` stops it even if pytest dies
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        """Stop it (SIGTERM, SIGKILL after timeout; sig=SIGKILL simulates a crash); returns the exit code."""
        if self.proc is None:
            return None
        if sig != signal.SIGTERM and self.alive:
            os.killpg(self.proc.pid, sig)
        stop_procs([self.proc], timeout=timeout)
        code = self.proc.exit_code()
        self.handle.cluster.unregister(self.name)
        self.proc = None
        return code

    def restart(self, sig: int = signal.SIGTERM) -> "OperatorProcess":
        self.stop(sig)
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def timer_cycles(self) -> int:
        """Periodic ticks whose passes have all finished (v41flash_periodic_cycle_seconds_count on its /metrics)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            text = r.read().decode()
        return int(next((s.value for f in text_string_to_metric_families(text) for s in f.samples
                         if s.name == "v41flash_periodic_cycle_seconds_count"), 0))

    def wait_timer_passes(self, n: int = 1, timeout: float = 120) -> None:
        """Until n whole timer passes of every deployment have run after now (a tick already under way when this
        is called does not count): "a pass later" as an event, not a sleep sized for an idle machine."""
        start = self.timer_cycles()
        wait_for(lambda: self.timer_cycles() >= start + n + 1, timeout, f"{n} timer pass(es) of the operator")

    def wait_serving(self, timeout: float = 60) -> None:
        """Until it answers /healthz (standing by or leading); raises with its log as soon as it exits."""
        import urllib.request

        def serving() -> bool:
            self.assert_alive()
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return r.status == 200
        t0 = time.monotonic()
        while True:
            try:
                if serving():
                    return
            except AssertionError:
                raise
            except OSError:
                if time.monotonic() - t0 > timeout:
                    raise AssertionError(f"the operator's /healthz did not answer in {timeout:.0f} s; last log lines:\n"
                                         f"{self.log_text()[-3000:]}") from None
            time.sleep(0.1)

    def assert_alive(self) -> None:
        if not self.alive:
            raise AssertionError(f"operator is not running; last log lines:\n{self.log_text()[-3000:]}")
