"""Fixtures for the e2e suite (run with `.venv/bin/pytest e2e`).

* `cluster` (session): brings the local control plane up unless it already runs (then reuses it), yields a
  kit.ClusterHandle (kubeconfig, kubernetes clients, kubectl, supervised simulators); copies component logs
  to e2e/.state/artifacts/ when a test failed; tears the cluster down only if it started it (set
  V41F_E2E_KEEP=1 to leave it running).
* `operator_process` (session): `.venv/bin/v41flash operator --kubeconfig <path>` as a process, logging to
  <state>/logs/operator.log, stopped by PID at the end; `.restart()` / `.stop()` for restart tests.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Cluster, Proc, free_port, operator_argv, proc_start_ticks, stop_procs  # noqa: E402
from kit import ClusterHandle, kubectl, wait_for  # noqa: E402,F401  (re-exported for tests)


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # so fixture teardown (and `down`) still runs


@pytest.fixture(scope="session")
def cluster(request):
    c = Cluster()
    started = c.up()
    if started:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # e.g. a CI timeout
        if not os.environ.get("V41F_E2E_KEEP"):
            atexit.register(lambda: c.procs() and c.down())  # last resort if teardown never ran
    handle = ClusterHandle(c, started)
    yield handle
    failed = request.session.testsfailed or getattr(request.session, "shouldfail", False)
    if failed:
        dest = c.save_artifacts("e2e-failure")
        print(f"\n[e2e] tests failed: component, simulator and operator logs copied to {dest}")
    if started and not os.environ.get("V41F_E2E_KEEP"):
        c.down()


class OperatorProcess:
    """The operator under test, run as `v41flash operator` against the e2e cluster."""

    name = "operator"

    def __init__(self, handle: ClusterHandle, extra_args: list[str] | None = None):
        self.handle = handle
        self.extra_args = list(extra_args or [])
        self.log_path = handle.cluster.logs / f"{self.name}.log"
        self.proc: Proc | None = None
        self.popen: subprocess.Popen | None = None
        self.starts = 0
        # its own loopback ports: other operators (and clusters) may run on the same machine
        self.metrics_port = free_port()
        self.health_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def argv(self) -> list[str]:
        return operator_argv(self.handle.kubeconfig, self.metrics_port, self.health_port, *self.extra_args)

    def start(self) -> "OperatorProcess":
        assert not self.alive, "operator already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== [e2e] start #{self.starts + 1}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True,
                                          env=dict(os.environ, KUBECONFIG=str(self.handle.kubeconfig)))
        start = proc_start_ticks(self.popen.pid)
        if start is None:
            self.popen.wait()
            raise AssertionError(f"operator exited at once ({self.popen.returncode}); see {self.log_path}")
        self.proc = Proc(self.name, self.popen.pid, start, self.argv, str(self.log_path))
        self.handle.cluster.register(self.proc)  # so `harness.py down` stops it even if pytest dies
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
        code = self.popen.wait(timeout=5) if self.popen else None
        self.handle.cluster.unregister(self.name)
        self.proc = None
        return code

    def restart(self, sig: int = signal.SIGTERM) -> "OperatorProcess":
        self.stop(sig)
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def assert_alive(self) -> None:
        if not self.alive:
            raise AssertionError(f"operator is not running; last log lines:\n{self.log_text()[-3000:]}")


@pytest.fixture(scope="session")
def operator_process(cluster):
    op = OperatorProcess(cluster, os.environ.get("V41F_OPERATOR_ARGS", "").split()).start()
    time.sleep(1.0)
    op.assert_alive()
    yield op
    op.stop()


@pytest.fixture
def ns(request, cluster):
    """A fresh namespace per test (named after the test module), deleted afterwards without waiting."""
    name = f"{request.module.__name__.removeprefix('test_')[:8]}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")
