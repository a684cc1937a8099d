"""Fixtures for the e2e suite (run with `.venv/bin/pytest e2e`).

* `cluster` (session): brings the local control plane up unless it already runs (then reuses it), yields an
  e2e.kit.ClusterHandle (kubeconfig, kubernetes clients, kubectl, supervised simulators); copies component
  logs to e2e/.state/artifacts/ when a test failed; tears the cluster down only if it started it (set
  V41F_E2E_KEEP=1 to leave it running).
* `operator_process` (session): an e2e.kit.OperatorProcess, `.venv/bin/v41flash operator --kubeconfig <path>`
  as a process logging to <state>/logs/operator.log, stopped by PID at the end; `.restart()` / `.stop()`.
"""
from __future__ import annotations

import atexit
import os
import signal
import uuid

import pytest

from e2e.harness import Cluster
from e2e.kit import ClusterHandle, OperatorProcess


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


@pytest.fixture(scope="session")
def operator_process(cluster):
    op = OperatorProcess(cluster, os.environ.get("V41F_OPERATOR_ARGS", "").split()).start()
    op.wait_serving()
    yield op
    op.stop()


@pytest.fixture
def ns(request, cluster):
    """A fresh namespace per test (named after the test module), deleted afterwards without waiting."""
    module = request.module.__name__.rpartition(".")[2]  # e2e.test_cluster -> test_cluster
    prefix = module.removeprefix("test_")[:8].replace("_", "-").strip("-")  # a DNS label: test_hostile_x -> hostile
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
