"""Local process supervision for the benchmarks and the e2e harness: start, record, stop by PID.

Every process is started in its own session (pgid == pid) and recorded with its kernel start time, so
a recycled PID is never signalled by mistake, and stopping it signals its whole process group (a shell's
children included). Records (``Proc``) are plain data: the e2e harness writes them to pids.json and a
later `down` stops what an earlier process started.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after "pid (comm)": state, ppid, ... (field 3 of proc(5) first); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def proc_start_ticks(pid: int) -> int | None:
    """Kernel start time of a live (non-zombie) process, None when gone."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Proc:
    name: str
    pid: int
    start: int
    argv: list
    log: str
    port: int | None = None
    extra: dict = field(default_factory=dict)

    def alive(self) -> bool:
        return proc_start_ticks(self.pid) == self.start

    def exit_code(self) -> int | None:
        """Exit status of a process this Python started and that has ended; None while it runs, or when
        it was started elsewhere (a record read back from a file)."""
        p = _children.get(self.pid)
        if p is not None:
            return p.poll()
        return _exit_codes.get((self.pid, self.start))


_children: dict[int, subprocess.Popen] = {}  # Popen objects of this process's own children, for reaping
_exit_codes: dict[tuple[int, int], int] = {}  # (pid, start) -> exit status of reaped children
_starts: dict[int, int] = {}  # pid -> start ticks of our children (to key _exit_codes)


def spawn(name: str, argv: Sequence, log_path: Path, env: dict | None = None, port: int | None = None,
          cwd: Path | None = None, extra: dict | None = None) -> Proc:
    """Start argv in its own session, stdout and stderr appended to log_path; RuntimeError when it
    exited before it could be recorded."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env, cwd=cwd)
    _children[p.pid] = p
    start = proc_start_ticks(p.pid)
    if start is None:
        p.wait()
        _children.pop(p.pid, None)
        raise RuntimeError(f"{name} exited at once (exit {p.returncode}); see {log_path}")
    _starts[p.pid] = start
    return Proc(name, p.pid, start, [str(a) for a in argv], str(log_path), port, extra or {})


def _reap(pid: int) -> None:
    p = _children.pop(pid, None)
    if p is not None:
        try:
            p.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            _children[pid] = p
            return
        start = _starts.pop(pid, None)
        if start is not None:
            _exit_codes[(pid, start)] = p.returncode


def _say(msg: str) -> None:
    print(f"[procs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stop_procs(procs: Iterable[Proc], timeout: float = 10.0) -> None:
    """SIGTERM each live process group, SIGKILL what is left after timeout; returns when all are gone."""
    procs = list(procs)
    live = [p for p in procs if p.alive()]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.alive() for p in live):
        for p in live:
            if p.pid in _children and _children[p.pid].poll() is not None:
                _reap(p.pid)
        time.sleep(0.1)
    for p in live:
        if p.alive():
            _say(f"{p.name} (pid {p.pid}) ignored SIGTERM for {timeout:.0f}s: SIGKILL")
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.alive() for p in live):
        time.sleep(0.05)
    for p in procs:  # also those that had exited before: their exit status is kept, the zombie reaped
        _reap(p.pid)


def sweep_writers(log_dir: Path) -> list[int]:
    """SIGKILL processes whose stdout is a file in log_dir: ours by construction, even when no record of them
    survived (e.g. a supervisor killed between starting a router and saving its PID)."""
    root, killed = str(log_dir.resolve()) + "/", []
    for fd in Path("/proc").glob("[0-9]*/fd/1"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        pid = int(fd.parts[2])
        if target.startswith(root) and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, None when gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # proc(5) fields 14, 15


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """n distinct ports free on host now (all bound at once, so none repeats)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]
