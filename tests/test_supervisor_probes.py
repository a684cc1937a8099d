"""The e2e supervisor's probes as kubelet runs them (e2e/supervisor.py, e2e/probes.py): readiness flips after
failureThreshold failures in a row, a liveness probe that keeps failing kills a frozen process and it restarts with
backoff (restartCount written), and the harness's per-pod simulator flags restart one pod's simulator. Real
processes against a fake apiserver; a few seconds, no cluster."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from e2e import harness
from e2e import supervisor as sup
from e2e.probes import ProbeRun, ProbeTiming, probe_timing, ready_status
from v41flash_bench.procs import free_port, stop_procs



class FakeAPI:
    """The apiserver calls the supervisor makes here: pod status patches, recorded."""

    def __init__(self):
        self.calls: list[dict] = []

    def patch_namespaced_pod_status(self, name, ns, body):
        self.calls.append(body)


def test_probe_timing_reads_the_container_with_kubelets_defaults():
    assert probe_timing({}, "livenessProbe") == ProbeTiming(10.0, 1.0, 3, 1, 0.0)
    c = {"livenessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 30, "timeoutSeconds": 10,
                           "failureThreshold": 10, "initialDelaySeconds": 5}}
    assert probe_timing(c, "livenessProbe") == ProbeTiming(30.0, 10.0, 10, 1, 5.0)


def test_a_probe_run_counts_consecutive_results():
    run = ProbeRun(ProbeTiming(failure_threshold=3, success_threshold=2))
    for ok in (False, False, True, False, False):
        run.record(ok)
    assert not run.failed  # a success in between starts the count again
    run.record(False)
    assert run.failed and not run.succeeded
    run.record(True)
    assert not run.succeeded
    run.record(True)
    assert run.succeeded and not run.failed


def test_ready_status_writes_restart_counts_by_container():
    pod = {"status": {"conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0}, {"name": "x"}]}}
    st = ready_status(pod, False, "t", {"vllm": 2})["status"]["containerStatuses"]
    assert st[0]["restartCount"] == 2 and st[0]["ready"] is False and "restartCount" not in st[1]


def _server_pod(uid: str, port: int, liveness: dict, readiness: dict) -> dict:
    probe = {"httpGet": {"path": "/", "port": port}}
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "labels": {"v41flash.io/role": "decode"}},
            "spec": {"containers": [{"name": "vllm", "livenessProbe": {**probe, **liveness},
                                     "readinessProbe": {**probe, **readiness}}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [
                {"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
                "containerStatuses": [{"name": "vllm", "ready": False, "restartCount": 0}]}}


@pytest.fixture
def supervisor(tmp_path):
    s = sup.Supervisor(tmp_path)
    s.logs.mkdir(parents=True)
    s.api = FakeAPI()
    yield s
    for c in s.children.values():
        if c.proc and c.proc.alive():
            os.kill(c.proc.pid, signal.SIGCONT)
    stop_procs([p for c in s.children.values() for p in (c.proc, c.hook) if p], timeout=1)


def _adopt(s: sup.Supervisor, pod: dict, port: int) -> sup.Child:
    """A pod whose container is a plain HTTP server on ``port`` (it answers both probes while it runs)."""
    ch = sup.Child(pod["metadata"]["uid"], "ns", pod["metadata"]["name"], "decode", "sim", "127.0.0.1", port,
                   [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], {}, str(s.logs / "sim.log"),
                   probe_url=f"http://127.0.0.1:{port}/", container="vllm")
    s.attach_probes(pod, ch)
    s.pods[ch.uid] = pod
    s.children[f"{ch.uid}/sim"] = ch
    return ch


def _until(s: sup.Supervisor, pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.reconcile()
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; supervisor calls {s.api.calls[-5:]}")


def test_readiness_holds_through_fewer_failures_than_the_threshold_and_liveness_restarts_a_frozen_process(supervisor):
    """SIGSTOP: the process lives, its port accepts, nothing answers. Ready turns False only after the readiness
    probe's failureThreshold failures; the liveness probe's failureThreshold failures kill it and it is restarted
    (after the crash-loop backoff), restartCount 1 in the pod's status, Ready again."""
    s = supervisor
    port = free_port("127.0.0.1")
    pod = _server_pod("u1", port, {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 3},
                      {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2})
    ch = _adopt(s, pod, port)
    _until(s, lambda: ch.ready is True, 20, "Ready")
    first = ch.proc.pid
    os.kill(first, signal.SIGSTOP)
    stopped = time.monotonic()
    _until(s, lambda: ch.ready is False, 10, "Ready False from the readiness probe")
    assert time.monotonic() - stopped >= 1.0  # two failures one period apart, not the first one
    assert ch.proc.pid == first  # still the same (frozen) process: readiness never restarts
    _until(s, lambda: ch.restarts == 1 and ch.proc is not None and ch.proc.pid != first, 20,
           "the liveness probe's restart")
    assert time.monotonic() - stopped >= 2.0  # three failures one period apart
    _until(s, lambda: ch.ready is True, 20, "Ready again after the restart")
    assert s.api.calls[-1]["status"]["containerStatuses"][0]["restartCount"] == 1


def test_a_killed_process_restarts_with_growing_backoff(supervisor):
    s = supervisor
    port = free_port("127.0.0.1")
    ch = _adopt(s, _server_pod("u2", port, {"periodSeconds": 10}, {"periodSeconds": 10}), port)
    _until(s, lambda: ch.ready is True, 20, "Ready")
    waits = []
    for n in (1, 2):
        os.kill(ch.proc.pid, signal.SIGKILL)
        _until(s, lambda: ch.restarts == n, 10, f"restart #{n} noticed")
        waits.append(ch.next_start - time.monotonic())
        assert ch.ready is False
        _until(s, lambda: ch.ready is True, 20, "Ready after the restart")
    assert 0.5 < waits[0] <= 1.0 and 1.5 < waits[1] <= 2.0  # 0.5 s x 2^step


def test_sim_args_restart_one_pods_simulator_with_the_new_flags(supervisor, tmp_path):
    """`python -m e2e.harness sim-args ns/p-u3 --v41f-itl-factor=2` restarts that pod's simulator (its children are
    made again from the pod, with the flags) and counts a restart; an unknown knob is refused at the command."""
    s = supervisor
    port = free_port("127.0.0.1")
    pod = _server_pod("u3", port, {"periodSeconds": 10}, {"periodSeconds": 10})
    ch = _adopt(s, pod, port)
    _until(s, lambda: ch.ready is True, 20, "Ready")
    made = []
    s.desired = lambda p: made.append(dict(s.overrides)) or [sup.Child(
        "u3", "ns", "p-u3", "decode", "sim", "127.0.0.1", port,
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], {}, str(s.logs / "sim.log"),
        probe_url=f"http://127.0.0.1:{port}/", container="vllm")]
    with pytest.raises(ValueError, match="--v41f-itl-factr"):
        harness.set_sim_args(tmp_path, "ns/p-u3", ["--v41f-itl-factr=2"])
    harness.set_sim_args(tmp_path, "ns/p-u3", ["--v41f-itl-factor=2"])
    assert json.loads((tmp_path / sup.OVERRIDES_FILE).read_text()) == {"ns/p-u3": ["--v41f-itl-factor=2"]}
    old = ch.proc
    _until(s, lambda: made and s.children["u3/sim"].ready is True, 20, "the simulator restarted and Ready")
    assert made == [{"ns/p-u3": ["--v41f-itl-factor=2"]}] and not old.alive()
    assert s.children["u3/sim"].restarts == 1
    harness.set_sim_args(tmp_path, "ns/p-u3", [])
    assert json.loads((tmp_path / sup.OVERRIDES_FILE).read_text()) == {}
