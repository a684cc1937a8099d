"""The e2e supervisor's pod termination, as kubelet runs it (e2e/supervisor.py): the pure plan (grace window,
what state leads to what step, the preStop command run here) exactly, then whole terminations driven against a
fake apiserver with real processes (a few seconds; no cluster)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from e2e import supervisor as sup
from e2e.pod_processes import Child
from e2e.pod_spec import configmap_files, configmap_mounts
from e2e.termination import (DEFAULT_GRACE_CAP_S, DONE, GRACE_CAP_ENV, PRESTOP, SIGKILL, SIGTERM, WAIT, Step,
                             container_step, grace_cap, ip_holder, pre_stop_argv, termination_window)
from v41flash.render import timing
from v41flash_bench.procs import Proc, proc_start_ticks, spawn, stop_procs


def _ts(epoch: float) -> str:
    """A deletionTimestamp to the microsecond (the apiserver's are to the second), so the waits are exact."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


# ------------------------------------------------------------------------------------------- the plan

def test_grace_cap_default_none_seconds_and_refusals():
    assert grace_cap(None) == grace_cap("") == DEFAULT_GRACE_CAP_S == 5.0
    assert grace_cap("none") is None and grace_cap(" None ") is None
    assert grace_cap("0") == 0.0 and grace_cap("2.5") == 2.5
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match=GRACE_CAP_ENV):
            grace_cap(bad)


def test_termination_window_counts_the_grace_period_from_the_deletion_and_caps_it():
    # the apiserver wrote deletionTimestamp = deletion + grace (3630 s: the engines' rendered grace period)
    pod = {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 3630},
           "spec": {"terminationGracePeriodSeconds": 3630}}
    end = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    assert termination_window(pod, None) == (end - 3630, end)
    assert termination_window(pod, 5.0) == (end - 3630, end - 3625)
    # a deletion with a shorter grace than the cap keeps its own
    pod["metadata"]["deletionGracePeriodSeconds"] = 2
    assert termination_window(pod, 5.0) == (end - 2, end)
    # grace 0 (forced): the deadline is the deletion itself
    pod["metadata"]["deletionGracePeriodSeconds"] = 0
    assert termination_window(pod, 5.0) == (end, end)
    # no deletionGracePeriodSeconds: the pod's own, else Kubernetes' default 30 s
    del pod["metadata"]["deletionGracePeriodSeconds"]
    assert termination_window(pod, None) == (end - 3630, end)
    assert termination_window({"metadata": pod["metadata"], "spec": {}}, None) == (end - 30, end)
    # the client's form of the timestamp (sanitize_for_serialization) reads the same
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00+00:00"
    assert termination_window(pod, 5.0) == (end - 3630, end - 3625)


@pytest.mark.parametrize("now, running, hook, sigterm_at, want", [
    # nothing runs (never started, exited, killed): nothing left to do for this container
    (0.0, False, "pending", None, Step(DONE)),
    (0.0, False, "running", None, Step(DONE)),
    (9.0, False, "over", 3.0, Step(DONE)),
    # a hook to run, before the deadline: run it
    (0.0, True, "pending", None, Step(PRESTOP)),
    # ... but not once the deadline has passed: SIGTERM straight away
    (5.0, True, "pending", None, Step(SIGTERM)),
    # the hook runs: wait for it until the deadline, then SIGTERM (which stops it)
    (1.0, True, "running", None, Step(WAIT, 5.0)),
    (5.0, True, "running", None, Step(SIGTERM)),
    # the hook is over, or there is none: SIGTERM
    (1.0, True, "over", None, Step(SIGTERM)),
    (0.0, True, "none", None, Step(SIGTERM)),
    # after SIGTERM: SIGKILL at the deadline, never sooner than 2 s after SIGTERM
    (2.0, True, "over", 1.0, Step(WAIT, 5.0)),
    (5.0, True, "over", 1.0, Step(SIGKILL)),
    (5.0, True, "none", 4.5, Step(WAIT, 6.5)),
    (6.5, True, "none", 4.5, Step(SIGKILL)),
])
def test_container_step(now, running, hook, sigterm_at, want):
    assert container_step(now, 5.0, running=running, hook=hook, sigterm_at=sigterm_at) == want


def _engine_pod() -> dict:
    """The decode pod the operator renders (its preStop hook, drain volume and grace period)."""
    from v41flash.api.v1alpha1 import V41FlashDeployment
    from v41flash.render import render
    obj = V41FlashDeployment.model_validate({"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
                                             "metadata": {"name": "t", "namespace": "ns"}, "spec": {}})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render(obj)}
    tmpl = objs[("Deployment", "t-decode")]["spec"]["template"]
    return {"metadata": {"name": "t-decode-x", "namespace": "ns", "uid": "u1", "labels": tmpl["metadata"]["labels"]},
            "spec": tmpl["spec"], "status": {"phase": "Running", "podIP": "127.1.1.5"}}, objs[("ConfigMap", "t-config")]


def test_the_rendered_pre_stop_hook_runs_here_on_a_copy_of_its_configmap_file(tmp_path):
    pod, cm = _engine_pod()
    c = pod["spec"]["containers"][0]
    [(path, volume, source)] = configmap_mounts(pod, c, " ".join(c["lifecycle"]["preStop"]["exec"]["command"]))
    assert (path, volume, source["name"]) == (timing.DRAIN_MOUNT_DIR, "drain", "t-config")
    files = configmap_files(cm["data"], source)
    assert files == {timing.DRAIN_CONFIG_KEY: cm["data"][timing.DRAIN_CONFIG_KEY]}  # only the item, not resolved.yaml
    argv = pre_stop_argv(pod, c, tmp_path / "volumes")
    script = pre_stop_script_with(tmp_path / "volumes" / "drain")
    assert argv == ["/bin/sh", "-x", "-c", script]
    # run it as the supervisor does, with a `sleep` that says what it was asked: the ConfigMap's deadline
    (tmp_path / "volumes" / "drain").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / "volumes" / "drain" / name).write_text(text)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "sleep").write_text("#!/bin/sh\necho \"slept $1\"\n")
    (stub / "sleep").chmod(0o755)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env={"PATH": f"{stub}:/usr/bin:/bin"})
    assert out.stdout.strip() == f"slept {cm['data'][timing.DRAIN_CONFIG_KEY]}"
    assert int(cm["data"][timing.DRAIN_CONFIG_KEY]) >= timing.DRAIN_MIN_SECONDS  # why the harness caps grace


def pre_stop_script_with(local_dir) -> str:
    return timing.pre_stop_script().replace(timing.DRAIN_MOUNT_DIR, str(local_dir))


def test_pre_stop_argv_other_hooks():
    pod = {"spec": {"volumes": []}}
    assert pre_stop_argv(pod, {"name": "c"}, Path("/v")) is None
    assert pre_stop_argv(pod, {"lifecycle": {"preStop": {"sleep": {"seconds": 7}}}}, Path("/v")) == ["sleep", "7"]
    assert pre_stop_argv(pod, {"lifecycle": {"preStop": {"exec": {"command": ["/drain", "--now"]}}}},
                         Path("/v")) == ["/drain", "--now"]
    assert pre_stop_argv(pod, {"lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": 80}}}},
                         Path("/v")) is None


def test_configmap_files_without_items_and_with_a_missing_key():
    assert configmap_files({"a": "1", "b": "2"}, {"name": "cm"}) == {"a": "1", "b": "2"}
    assert configmap_files({"a": "1"}, {"name": "cm", "items": [{"key": "a", "path": "x/y"},
                                                                {"key": "gone", "path": "z"}]}) == {"x/y": "1"}
    assert configmap_files(None, {"name": "cm"}) == {}


def _child(uid: str, ip: str, proc: Proc | None = None, kind: str = "sim") -> Child:
    return Child(uid, "ns", f"p-{uid}", "decode", kind, ip, 8000, ["x"], {}, "/dev/null", proc=proc,
                 container="vllm")


def test_ip_holder_is_another_pod_s_live_process_on_that_ip():
    me = Proc("self", os.getpid(), proc_start_ticks(os.getpid()), [], "")
    dead = Proc("gone", os.getpid(), -1, [], "")
    old = _child("old", "127.1.1.5", me)
    assert ip_holder("127.1.1.5", "new", [old]) is old
    assert ip_holder("127.1.1.5", "old", [old]) is None  # its own processes (the proxy beside the router)
    assert ip_holder("127.1.1.6", "new", [old]) is None
    assert ip_holder("127.1.1.5", "new", [_child("old", "127.1.1.5", dead)]) is None
    assert ip_holder("127.1.1.5", "new", [_child("old", "127.1.1.5")]) is None  # never started
    hooked = _child("old", "127.1.1.5", dead)
    hooked.hook = me  # only its preStop hook still runs: the pod still terminates
    assert ip_holder("127.1.1.5", "new", [hooked]) is hooked


# ------------------------------------------------------------- whole terminations against a fake apiserver

class FakeAPI:
    """CoreV1Api as the supervisor calls it during a termination; records the calls in order."""

    def __init__(self, configmaps: dict | None = None):
        self.calls: list[tuple] = []
        self.configmaps = configmaps or {}

    def patch_namespaced_pod_status(self, name, ns, body):
        ready = {c["type"]: c["status"] for c in body["status"]["conditions"]}
        self.calls.append(("status", name, ready.get("Ready"), time.time()))

    def delete_namespaced_pod(self, name, ns, body=None, _request_timeout=None):
        self.calls.append(("delete", name, body, time.time()))

    def read_namespaced_config_map(self, name, ns, _request_timeout=None):
        from types import SimpleNamespace
        if name not in self.configmaps:
            err = RuntimeError("not found")
            err.status = 404
            raise err
        return SimpleNamespace(data=self.configmaps[name])


@pytest.fixture
def supervisor(tmp_path, monkeypatch):
    monkeypatch.delenv(GRACE_CAP_ENV, raising=False)
    s = sup.Supervisor(tmp_path)
    s.logs.mkdir(parents=True)
    s.api = FakeAPI()
    yield s
    stop_procs([p for c in s.children.values() for p in (c.proc, c.hook) if p], timeout=1)


def _pod(uid: str, containers: list[dict], grace: int = 3630, volumes=()) -> dict:
    now = time.time()
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid, "labels": {"v41flash.io/role": "decode"},
                         "deletionTimestamp": _ts(now + grace), "deletionGracePeriodSeconds": grace},
            "spec": {"containers": containers, "volumes": list(volumes), "terminationGracePeriodSeconds": grace},
            "status": {"phase": "Running", "podIP": "127.1.1.5", "conditions": [
                {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
                "containerStatuses": [{"name": c["name"], "ready": True} for c in containers]}}


def _run(s: sup.Supervisor, argv: list[str], uid: str, container: str = "vllm") -> Child:
    ch = _child(uid, "127.1.1.5")
    ch.container = container
    ch.proc = spawn(f"sim-{uid}", argv, s.logs / f"sim-{uid}.log")
    s.children[f"{uid}/sim"] = ch
    return ch


def _terminate_until_deleted(s: sup.Supervisor, pod: dict, timeout: float) -> float:
    t0 = time.monotonic()
    s.pods[pod["metadata"]["uid"]] = pod
    while not any(c[0] == "delete" for c in s.api.calls):
        assert time.monotonic() - t0 < timeout, s.api.calls
        s.reconcile()
        time.sleep(0.05)
    return time.monotonic() - t0


# a process that reports SIGTERM and exits on it, as the simulator does after its own drain
ON_TERM = [sys.executable, "-c", "import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM', flush=True), sys.exit(0)))\n"
           "time.sleep(60)\n"]


def test_a_deleted_engine_pod_is_unready_drains_through_its_pre_stop_then_gets_sigterm_and_is_deleted(supervisor):
    """Ready False first; the hook reads the ConfigMap's drain (1 s, under the 5 s cap) and sleeps it; SIGTERM
    only after the hook; the pod object deleted with grace 0 (uid precondition) once the process has exited."""
    s = supervisor
    s.api.configmaps = {"t-config": {timing.DRAIN_CONFIG_KEY: "1", "resolved.yaml": "x"}}
    hook = {"preStop": {"exec": {"command": ["/bin/sh", "-c", timing.pre_stop_script()]}}}
    container = {"name": "vllm", "lifecycle": hook,
                 "volumeMounts": [{"name": "drain", "mountPath": timing.DRAIN_MOUNT_DIR, "readOnly": True}]}
    volume = {"name": "drain", "configMap": {"name": "t-config", "optional": True, "items": [
        {"key": timing.DRAIN_CONFIG_KEY, "path": timing.DRAIN_CONFIG_KEY}]}}
    ch = _run(s, ON_TERM, "u1")
    took = _terminate_until_deleted(s, _pod("u1", [container], volumes=[volume]), 10)
    kinds = [c[0] for c in s.api.calls]
    assert kinds == ["status", "delete"], s.api.calls
    assert s.api.calls[0][2] == "False"
    assert s.api.calls[1][2] == {"gracePeriodSeconds": 0, "preconditions": {"uid": "u1"}}
    assert 1.0 <= took < 4.0, took  # the 1 s drain, then SIGTERM and the exit
    assert not ch.proc.alive() and "u1/sim" not in s.children
    assert "SIGTERM" in (s.logs / "sim-u1.log").read_text()
    trace = (s.logs / "prestop-ns-p-u1-vllm.log").read_text()
    assert "sleep 1" in trace, trace  # sh -x: the script read the copied ConfigMap file
    assert (s.state / "volumes" / "u1" / "drain" / timing.DRAIN_CONFIG_KEY).read_text() == "1"


def test_a_hook_past_the_capped_grace_is_stopped_and_a_process_ignoring_sigterm_killed(supervisor, monkeypatch):
    """The rendered drain (30 s+, here 100 s) against a 1 s cap: the hook is stopped at the deadline, SIGTERM
    follows, and a process that ignores it is SIGKILLed 2 s later (kubelet's minimum), then the pod goes."""
    s = supervisor
    s.grace_cap = 1.0
    ch = _run(s, ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], "u2")
    container = {"name": "vllm", "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "exec sleep 100"]}}}}
    took = _terminate_until_deleted(s, _pod("u2", [container]), 10)
    assert 3.0 <= took < 5.0, took  # 1 s of hook, 2 s of ignored SIGTERM, SIGKILL
    assert not ch.proc.alive() and ch.hook is None and ch.hook_over


def test_a_pod_deleted_before_its_process_started_is_deleted_at_once(supervisor):
    s = supervisor
    ch = _child("u3", "127.1.1.5")  # a start delay: no process yet
    ch.next_start = time.monotonic() + 60
    s.children["u3/sim"] = ch
    took = _terminate_until_deleted(s, _pod("u3", [{"name": "vllm"}]), 5)
    assert took < 1.0 and [c[0] for c in s.api.calls] == ["delete"]  # no process: no Ready write, no hook


def test_a_restarted_supervisor_goes_on_with_a_termination_from_sims_json(supervisor, tmp_path):
    """Killed while a pod's hook runs: the next supervisor adopts the process and the hook (not restarting
    either), waits for the hook, sends SIGTERM and deletes the pod."""
    s = supervisor
    container = {"name": "vllm", "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "exec sleep 1"]}}}}
    pod = _pod("u4", [container])
    ch = _run(s, ON_TERM, "u4")
    s.pods["u4"] = pod
    s.reconcile()  # Ready False, hook started
    assert ch.hook is not None and ch.hook.alive() and ch.sigterm_at is None
    records = json.loads(s.sims_file.read_text())["processes"]
    assert records[0]["terminating"]["hook"]["pid"] == ch.hook.pid
    s.children.clear()  # the supervisor dies; its processes live on

    s2 = sup.Supervisor(tmp_path)
    s2.api = FakeAPI()
    pod["status"]["conditions"][0]["status"] = "False"  # as the apiserver has it now
    s2.pods = {"u4": pod}
    s2.recover(records)
    adopted = s2.children["u4/sim"]
    assert adopted.proc.pid == ch.proc.pid and adopted.hook.pid == ch.hook.pid
    try:
        took = _terminate_until_deleted(s2, pod, 10)
    finally:
        stop_procs([p for c in s2.children.values() for p in (c.proc, c.hook) if p], timeout=1)
    assert [c[0] for c in s2.api.calls] == ["delete"]  # Ready False was written before the restart
    assert took < 3.0 and not adopted.proc.alive()
    assert "SIGTERM" in (s.logs / "sim-u4.log").read_text()


def test_recover_stops_what_belongs_to_no_terminating_pod(supervisor, tmp_path):
    s = supervisor
    ch = _run(s, ["sleep", "60"], "u5")
    s.save()
    records = json.loads(s.sims_file.read_text())["processes"]
    s.children.clear()
    s2 = sup.Supervisor(tmp_path)
    s2.pods = {"u5": {**_pod("u5", [{"name": "vllm"}]), "metadata": {"name": "p-u5", "namespace": "ns", "uid": "u5"}}}
    s2.recover(records)
    assert not s2.children and not ch.proc.alive()  # a running pod: its process restarts fresh


def test_a_force_deleted_pod_s_processes_stop_at_once(supervisor):
    s = supervisor
    ch = _run(s, ["sleep", "60"], "u6")
    s.pods = {}  # removed from the apiserver (grace 0) while it ran
    s.reconcile()
    assert not ch.proc.alive() and not s.children and s.api.calls == []


def test_a_new_pod_on_a_terminating_pod_s_ip_waits_for_its_processes(supervisor):
    """A pod given the IP of one whose process still runs (kwok recycled it: a forced deletion, a kwok restart)
    starts nothing until that process is gone."""
    s = supervisor
    old = _run(s, ["sleep", "60"], "old")
    new = _child("new", "127.1.1.5")
    new.argv = ["sleep", "60"]
    s.children["new/sim"] = new
    s.pods = {"new": {"metadata": {"name": "p-new", "namespace": "ns", "uid": "new"},
                      "spec": {"containers": [{"name": "vllm"}]}, "status": {"phase": "Running", "podIP": "127.1.1.5"}},
              "old": {"metadata": {"name": "p-old", "namespace": "ns", "uid": "old"},
                      "spec": {"containers": [{"name": "vllm"}]}, "status": {"phase": "Running", "podIP": "127.1.1.5"}}}
    s.reconcile()
    assert new.proc is None and new.ip_wait == "old"
    os.killpg(old.proc.pid, signal.SIGKILL)
    stop_procs([old.proc], timeout=1)  # reaped
    s.reconcile()
    assert new.proc is not None and new.proc.alive() and new.ip_wait == ""


def test_the_pod_network_forwarder_stops_only_after_the_containers(supervisor):
    """A picker pod: the picker (a container, here a 1 s preStop sleep, then SIGTERM) and the forwarder from its pod
    IP (the harness's pod network). kubelet tears the network down after the containers, so the forwarder must
    still run while the container drains; it used to get SIGTERM with the container, and a Gateway still sending
    to the terminating picker got connection refused (150 of 310 requests failed while a picker rolled)."""
    s = supervisor
    ch = _run(s, ON_TERM, "u9", container="epp")
    fwd = _child("u9", "127.1.1.5")
    fwd.kind = "fwd"
    fwd.proc = spawn("fwd-u9", ON_TERM, s.logs / "fwd-u9.log")
    s.children["u9/fwd"] = fwd
    pod = _pod("u9", [{"name": "epp", "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}}], grace=130)
    s.pods["u9"] = pod
    fwd_alive_while_draining = []
    t0 = time.monotonic()
    while not any(c[0] == "delete" for c in s.api.calls):
        assert time.monotonic() - t0 < 10, s.api.calls
        s.reconcile()
        if ch.proc.alive():
            fwd_alive_while_draining.append(fwd.proc.alive())
        time.sleep(0.05)
    assert fwd_alive_while_draining and all(fwd_alive_while_draining)
    assert not fwd.proc.alive() and not ch.proc.alive()
    assert "SIGTERM" in (s.logs / "fwd-u9.log").read_text()  # stopped by SIGTERM, not left behind
