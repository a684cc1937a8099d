"""`make test` (and `make e2e`): every test, with the phases that do not need each other run side by side.

    tools the unit suite needs ──► tools the cluster needs ──► e2e shard 1 (its own cluster) ─┐
                              └──► unit suite (niced) ──────────────────────────────────────────┼─► phase times, exit
                                                          └──► e2e shard 2 (its own cluster) ─┘

* The unit suite needs no cluster: it starts as soon as its tools are built and runs at nice 10 while the rest of
  the tools build and the e2e suite runs (the e2e suite mostly waits on timers and pods; the niced suite takes the
  idle CPU, never the cluster's).
* The e2e suite runs as SHARDS pytest processes, each on its own local cluster (V41F_STATE per shard; the first
  shard's is the default e2e/.state, so `make down` stops it): the modules are dealt to the shards by their
  measured durations (MODULE_SECONDS; a module not listed counts as NEW_MODULE_SECONDS), every e2e/test_*.py
  module in exactly one shard. Within a shard the cluster is shared by its modules (session fixtures in
  e2e/conftest.py), each test in its own namespace.
* Output: every line of each suite, prefixed with its suite ([unit], [e2e 1], ...), as it comes; each suite's whole
  output also in build/test-logs/. At the end, the phase times (tools, unit, e2e, total: wall clock, from the
  start) and each suite's result.
* Exit status: 0 only when every phase passed. A tool that fails to build, any pytest exit status but 0 (failures,
  errors, an interruption, 5 = no tests collected) fails it. CI=true (from .ci/run) is passed on: a test whose tool
  is missing fails instead of skipping.

    .venv/bin/python -m e2e.make_test [--only unit|e2e] [--shards N] [--unit-tools "helm promtool ..."]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
PYTEST = REPO / ".venv" / "bin" / "pytest"
LOGS = REPO / "build" / "test-logs"
SHARDS = 2
UNIT_NICE = 10
# Each e2e module's wall time (s): what deals the modules to the shards (only the ratios matter). Measured at b9e8995
# (2026-12-07, `--durations=0` summed per module) in a 2-shard run on the 2-core machine while other sessions loaded it
# (load average 7-25): about 2.5x a quiet machine's. test_gateway's is an estimate (its tools were still building).
# Remeasure when a module grows; a module not listed counts as NEW_MODULE_SECONDS.
MODULE_SECONDS = {
    "test_rollout.py": 1111, "test_operator.py": 859, "test_faults.py": 713, "test_gateway.py": 700,
    "test_idle_writes.py": 632, "test_autoscale.py": 629, "test_install.py": 263, "test_security.py": 201,
    "test_prometheus.py": 169, "test_capacity_pending.py": 145, "test_cluster.py": 102, "test_hostile_metrics.py": 58,
    "test_routing_bench_smoke.py": 44, "test_slots.py": 36,
}
NEW_MODULE_SECONDS = 300


def shard_modules(modules: list[str], shards: int, seconds: dict[str, float] = MODULE_SECONDS,
                  default: float = NEW_MODULE_SECONDS) -> list[list[str]]:
    """Deal modules to `shards` lists, longest first, each to the least loaded shard (ties: the lower shard); every
    module in exactly one list, each list in file-name order."""
    load = [0.0] * shards
    out: list[list[str]] = [[] for _ in range(shards)]
    for m in sorted(modules, key=lambda m: (-seconds.get(Path(m).name, default), m)):
        i = min(range(shards), key=lambda i: (load[i], i))
        out[i].append(m)
        load[i] += seconds.get(Path(m).name, default)
    return [sorted(s) for s in out if s]


def shard_state(i: int) -> Path:
    """The state directory of shard i (from 1): the default for the first (`make down` stops it)."""
    default = Path(os.environ.get("V41F_STATE") or E2E / ".state")
    return default if i == 1 else default.with_name(f"{default.name}-shard{i}")


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


_print_lock = threading.Lock()


def say(msg: str) -> None:
    with _print_lock:
        print(f"[make test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Phase:
    name: str
    start: float | None = None
    end: float | None = None
    rc: int | None = None
    notes: list[str] = field(default_factory=list)

    def took(self) -> float:
        return (self.end or time.monotonic()) - (self.start or time.monotonic())


class Suite:
    """One pytest process: its output streamed line by line with a prefix and written to its log."""

    def __init__(self, label: str, argv: list[str], log: Path, env: dict | None = None, nice: int = 0):
        self.label, self.argv, self.log, self.env, self.nice = label, argv, log, env, nice
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.start = self.end = 0.0

    def run(self) -> "Suite":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                                     preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()
        say(f"{self.label}: started (pid {self.proc.pid}; log {self.log}): {' '.join(self.argv[1:])}")
        return self

    def _pump(self) -> None:
        with open(self.log, "w") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                with _print_lock:
                    sys.stdout.write(f"[{self.label}] {line}")
                    sys.stdout.flush()

    def wait(self) -> int:
        rc = self.proc.wait()
        self.thread.join()
        self.end = time.monotonic()
        say(f"{self.label}: {'passed' if rc == 0 else f'FAILED (pytest exit {rc})'} in {clock(self.end - self.start)}")
        return rc

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # pytest's e2e fixtures tear their cluster down on it
            except ProcessLookupError:
                pass


def wait_cluster_up(state: Path, suite: Suite, timeout: float = 180) -> None:
    """Until the cluster under `state` is up (or its suite ended, or `timeout`)."""
    from v41flash_bench.local_cluster import ClusterRecords
    cluster, deadline = ClusterRecords(state), time.monotonic() + timeout
    while suite.proc.poll() is None and time.monotonic() < deadline and not cluster.is_up():
        time.sleep(1)


def build_tools(components: list[str]) -> int:
    say(f"tools: e2e/build-tools.sh {' '.join(components) or '(all)'}")
    return subprocess.run(["bash", str(E2E / "build-tools.sh"), *components], cwd=REPO).returncode


def e2e_suites(shards: int, extra: list[str]) -> list[Suite]:
    modules = sorted(str(p.relative_to(REPO)) for p in E2E.glob("test_*.py"))
    out = []
    for i, mods in enumerate(shard_modules(modules, shards), 1):
        env = {**os.environ, "V41F_STATE": str(shard_state(i))}
        if i > 1:
            env.pop("V41F_E2E_KEEP", None)  # only the default cluster may be kept running
        out.append(Suite(f"e2e {i}", [str(PYTEST), "-v", "-p", "no:cacheprovider", "-m", "e2e", "--durations=30",
                                      *extra, *mods], LOGS / f"e2e-{i}.log", env))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("unit", "e2e"), help="one suite (with the tools it needs)")
    ap.add_argument("--shards", type=int, default=int(os.environ.get("E2E_SHARDS", SHARDS)),
                    help=f"e2e pytest processes, each on its own cluster (default {SHARDS}; env E2E_SHARDS)")
    ap.add_argument("--unit-tools", default="", help="the components the unit suite needs (the Makefile's UNIT_TOOLS)")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments for the e2e shards (after --)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    phases = {n: Phase(n) for n in ("tools", "unit", "e2e")}
    suites: list[Suite] = []

    def on_signal(signum, _frame):
        say(f"signal {signum}: stopping the suites (their clusters are torn down)")
        for s in suites:
            s.terminate()
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)

    unit_tools = a.unit_tools.split()
    tools = phases["tools"]
    tools.start = time.monotonic()
    unit = None
    try:
        if a.only != "e2e":
            tools.rc = build_tools(unit_tools)
            if tools.rc == 0:
                unit = Suite("unit", [str(PYTEST), "-q", "-rs", "-p", "no:cacheprovider", "tests"],
                             LOGS / "unit.log", nice=UNIT_NICE).run()
                suites.append(unit)
                phases["unit"].start = unit.start
        if tools.rc in (None, 0) and a.only != "unit":
            tools.rc = build_tools([])  # everything else (the cached ones are checked in well under a second)
        tools.end = time.monotonic()
        say(f"tools: {'ready' if tools.rc == 0 else f'FAILED (exit {tools.rc})'} in {clock(tools.took())}")
        if tools.rc == 0 and a.only != "unit":
            shards = e2e_suites(max(1, a.shards), a.pytest_args)
            phases["e2e"].start = time.monotonic()
            for i, s in enumerate(shards):
                if i:  # the clusters start one after another: two at once could pick the same free port
                    wait_cluster_up(shard_state(i), shards[i - 1])
                suites.append(s.run())
            rcs = [s.wait() for s in shards]
            phases["e2e"].end = time.monotonic()
            phases["e2e"].rc = next((rc for rc in rcs if rc), 0)
            phases["e2e"].notes = [f"shard {i} {clock(s.end - s.start)}" + ("" if rc == 0 else f" exit {rc}")
                                   for i, (s, rc) in enumerate(zip(shards, rcs), 1)]
        if unit is not None:
            if unit.proc.poll() is None:
                say("unit: still running; waiting for it")
            phases["unit"].rc = unit.wait()
            phases["unit"].end = unit.end
    except KeyboardInterrupt:
        for s in suites:
            s.terminate()
        for s in suites:
            if s.proc is not None:
                s.proc.wait()
        say("interrupted")
        return 130
    total = time.monotonic() - t0
    ran = [p for p in phases.values() if p.rc is not None]
    failed = [p.name for p in ran if p.rc != 0]
    say("phase times (wall clock; unit and e2e overlap): " + ", ".join(
        f"{p.name} {clock(p.took())}" + (f" (from {clock(p.start - t0)}" + (f"; {', '.join(p.notes)}" if p.notes else "")
                                         + ")" if p.name != "tools" else "") for p in ran) + f", total {clock(total)}")
    say("FAILED: " + ", ".join(failed) if failed else "passed")
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
