"""The one process-supervision library (v41flash_bench.procs) used by the e2e harness, its supervisor and
the routing benchmark: process groups, PID records that survive PID reuse, exit codes, free ports."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from v41flash_bench.procs import Proc, free_port, free_ports, proc_start_ticks, spawn, stop_procs, sweep_writers


def _live_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(rest[2]) == pgid and rest[0] != "Z":
                out.append(int(d.name))
    return out


def _wait_for_line(log: Path, text: str) -> None:
    deadline = time.monotonic() + 5
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} never written to {log}"
        time.sleep(0.02)


def test_stop_procs_stops_the_whole_group_and_keeps_the_exit_code(tmp_path):
    # a shell whose child would outlive a plain kill of the shell
    p = spawn("sh", ["/bin/sh", "-c", "sleep 300 & echo started; wait"], tmp_path / "sh.log")
    assert p.alive() and p.exit_code() is None and p.start == proc_start_ticks(p.pid)
    assert os.getpgid(p.pid) == p.pid  # its own session
    _wait_for_line(tmp_path / "sh.log", "started")  # the sleep runs
    assert len(_live_members(p.pid)) == 2
    stop_procs([p], timeout=5)
    assert not p.alive()
    assert p.exit_code() == -15  # SIGTERM
    deadline = time.monotonic() + 5.0  # the orphaned sleep is reaped by init, not by us: give it a moment
    while _live_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_members(p.pid) == []


def test_stop_procs_kills_what_ignores_sigterm(tmp_path):
    p = spawn("stubborn", ["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"],
              tmp_path / "s.log")
    _wait_for_line(tmp_path / "s.log", "ready")
    t0 = time.monotonic()
    stop_procs([p], timeout=0.5)
    assert not p.alive() and p.exit_code() == -9 and time.monotonic() - t0 < 5


def test_a_record_never_matches_a_recycled_pid(tmp_path):
    p = spawn("sleep", ["sleep", "30"], tmp_path / "x.log")
    try:
        assert not Proc("other", p.pid, p.start + 1, [], "").alive()  # same PID, another start time
    finally:
        stop_procs([p])
    assert proc_start_ticks(p.pid) is None


def test_spawn_refuses_what_exits_before_it_is_recorded(tmp_path, monkeypatch):
    import v41flash_bench.procs as procs
    monkeypatch.setattr(procs, "proc_start_ticks", lambda pid: None)
    with pytest.raises(RuntimeError, match="exited at once"):
        spawn("gone", ["true"], tmp_path / "g.log")


def test_sweep_writers_kills_only_processes_writing_into_the_log_dir(tmp_path):
    logs, other = tmp_path / "logs", tmp_path / "elsewhere"
    logs.mkdir()
    other.mkdir()
    ours = subprocess.Popen(["sleep", "60"], stdout=open(logs / "x.log", "wb"), start_new_session=True)
    theirs = subprocess.Popen(["sleep", "60"], stdout=open(other / "y.log", "wb"), start_new_session=True)
    try:
        assert sweep_writers(logs) == [ours.pid]
        ours.wait(timeout=5)
        assert proc_start_ticks(theirs.pid) is not None
    finally:
        theirs.kill()
        theirs.wait()


def test_free_ports_are_distinct_loopback_ports():
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(1024 < p < 65536 for p in ports)
    assert 1024 < free_port() < 65536
