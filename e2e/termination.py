"""A deleted pod's termination, as kubelet runs it: the pure steps (grace deadline, each container's next step, its
preStop hook as a local command) and the Supervisor's part that carries them out (Termination)."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from e2e.pod_processes import Child
from e2e.pod_spec import configmap_files, configmap_mounts, container_env
from e2e.probes import ready_status
from e2e.tools import log
from v41flash_bench.procs import Proc, spawn, stop_procs


# The pure steps.
#
# On deletion the apiserver sets deletionTimestamp = now + grace and deletionGracePeriodSeconds = grace; kubelet
# then marks the pod not Ready, runs each running container's preStop hook, sends SIGTERM once the hook is over
# (or at the grace deadline, which stops a hook still running), SIGKILLs what is left at the deadline (no sooner
# than 2 s after SIGTERM: kubelet's minimum), and finally deletes the pod object with grace 0.

GRACE_CAP_ENV = "V41F_GRACE_PERIOD_CAP_SECONDS"
# Every pod's grace period is capped at this here, as if each deletion said --grace-period=5: the engines'
# rendered preStop sleeps for the drain deadline in their ConfigMap (30 s at least, the SLO's p95 e2e x 1.5
# + 10 s; 460 s without the file) and their grace period is 3630 s. The cap ends the hook at the deadline as
# kubelet does when a grace period runs out; "none" keeps the pods' own (real-time drains).
DEFAULT_GRACE_CAP_S = 5.0
MIN_SIGTERM_GRACE_S = 2.0  # kubelet's minimumGracePeriodInSeconds: a SIGTERM always gets this long

PRESTOP, WAIT, SIGTERM, SIGKILL, DONE = "prestop", "wait", "sigterm", "sigkill", "done"
NETWORK_KINDS = ("fwd",)  # children that are the pod's network, not a container: stopped after the containers


def grace_cap(value: str | None) -> float | None:
    """The grace-period cap from V41F_GRACE_PERIOD_CAP_SECONDS: seconds (>= 0), "none" for no cap, unset for
    the default; ValueError naming the variable otherwise."""
    if value is None or value.strip() == "":
        return DEFAULT_GRACE_CAP_S
    if value.strip().lower() == "none":
        return None
    try:
        cap = float(value)
    except ValueError:
        cap = -1.0
    if not cap >= 0:
        raise ValueError(f"{GRACE_CAP_ENV}={value!r}: seconds (>= 0) or none")
    return cap


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def termination_window(pod: dict, cap: float | None) -> tuple[float, float]:
    """(when the deletion was asked for, the grace deadline) in epoch seconds: deletionTimestamp is the
    deletion's time plus its grace period (deletionGracePeriodSeconds; else the pod's own, default 30 s), and
    the deadline is that grace, capped, after the deletion."""
    meta = pod["metadata"]
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
    started = _epoch(meta["deletionTimestamp"]) - grace
    return started, started + (grace if cap is None else min(grace, cap))


@dataclass(frozen=True)
class Step:
    """What to do next for one container of a terminating pod; WAIT: nothing before `until` (epoch s)."""
    action: str
    until: float = 0.0


def container_step(now: float, deadline: float, *, running: bool, hook: str, sigterm_at: float | None) -> Step:
    """kubelet's killContainer for one container, as a state machine. `hook`: "none" (no preStop), "pending",
    "running" or "over"; `sigterm_at`: when SIGTERM was sent (None: not yet). A container whose process is not
    running is DONE (a hook still running is stopped by the caller); SIGTERM ends a running hook first."""
    if not running:
        return Step(DONE)
    if sigterm_at is None:
        if hook == "pending" and now < deadline:
            return Step(PRESTOP)
        if hook == "running" and now < deadline:
            return Step(WAIT, deadline)
        return Step(SIGTERM)
    kill_at = max(deadline, sigterm_at + MIN_SIGTERM_GRACE_S)
    return Step(SIGKILL) if now >= kill_at else Step(WAIT, kill_at)


def pre_stop_argv(pod: dict, container: dict, volumes: Path) -> list[str] | None:
    """The container's preStop hook as a local command (None without one): an exec hook's command, traced
    (`sh -x`) when it is a shell script, with each configMap mount path it names moved to its copy under
    `volumes/<volume name>`; a sleep hook as `sleep N`. Other hooks (httpGet) are not run here."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return ["sleep", str(int(hook["sleep"]["seconds"]))]
    cmd = [str(t) for t in (hook.get("exec") or {}).get("command") or []]
    if not cmd:
        return None
    for path, volume, _ in configmap_mounts(pod, container, " ".join(cmd)):
        cmd = [t.replace(path, str(volumes / volume)) for t in cmd]
    if os.path.basename(cmd[0]) in ("sh", "bash") and cmd[1:2] == ["-c"]:
        cmd.insert(1, "-x")
    return cmd


def ip_holder(ip: str, uid: str, others) -> "Child | None":
    """Another pod's child that still holds this IP with a live process or preStop hook: a terminating pod
    keeps its IP until its processes are gone, so a new pod given that IP (a pod force-deleted, kwok restarted)
    waits for them."""
    return next((c for c in others if c.uid != uid and c.ip == ip and c.live()), None)


def _signal(proc: Proc, sig: int) -> None:
    """Signal a process group if it still runs (its PID not recycled), reaping it when it is ours."""
    if proc.alive():
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    proc.exit_code()


class Termination:
    """The Supervisor's termination of deleted pods (kubelet's killPod; see container_step). Mixed into Supervisor:
    uses its api, state, logs, pods, children, pod_ready, terminations, grace_cap and save()."""

    def drop_vanished(self) -> bool:
        """Pods gone from the apiserver: removed by this supervisor once their processes had ended, or
        force-deleted (grace 0) with processes still running, which stop now (their IP is free in kwok's pool)."""
        gone = [k for k, c in self.children.items() if c.uid not in self.pods]
        for key in gone:
            ch = self.children.pop(key)
            self.pod_ready.pop(ch.uid, None)
            live = [p for p in (ch.proc, ch.hook) if p is not None and p.alive()]
            if live:
                log(f"{ch.namespace}/{ch.pod} was removed from the apiserver with its {ch.kind} still running "
                    f"(a forced deletion): stopping pid {', '.join(str(p.pid) for p in live)} now")
                stop_procs(live, timeout=MIN_SIGTERM_GRACE_S)
        for uid in [u for u in self.terminations if u not in self.pods]:
            del self.terminations[uid]
            shutil.rmtree(self.state / "volumes" / uid, ignore_errors=True)
        return bool(gone)

    def terminate(self, pod: dict) -> bool:
        """One step of a deleted pod's termination: Ready False at once, then per container its preStop hook,
        SIGTERM, SIGKILL at the grace deadline (container_step); once nothing of the pod runs, the pod object is
        deleted with grace 0. Returns whether anything changed."""
        meta = pod["metadata"]
        uid, what = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        started, deadline = termination_window(pod, self.grace_cap)
        t = self.terminations.get(uid)
        if t is None:
            t = self.terminations[uid] = {"started": started, "deadline": deadline, "unready": False, "deleted": False}
            log(f"{what} deleted with grace period {meta.get('deletionGracePeriodSeconds')} s: terminating within "
                f"{deadline - started:g} s ({GRACE_CAP_ENV}: {self.grace_cap})")
        elif deadline < t["deadline"]:  # deleted again with a shorter grace period: kubelet honours it
            t["deadline"] = deadline
            log(f"{what}: grace period shortened, deadline in {deadline - time.time():.1f} s")
        if t["deleted"]:
            return False
        children = [c for c in self.children.values() if c.uid == uid]
        changed = False
        if not t["unready"] and any(c.running() for c in children):
            t["unready"] = self.mark_unready(pod)
            changed = True
        now = time.time()
        busy = False
        # the pod's network (a forwarder from the pod IP) goes last, once every container has ended: kubelet tears
        # the sandbox down after its containers, so a container draining in its grace period stays reachable
        containers = [c for c in children if c.kind not in NETWORK_KINDS]
        network = [c for c in children if c.kind in NETWORK_KINDS]
        if not any(c.live() for c in containers):
            containers += network
        else:
            busy = bool(network)
        for ch in containers:
            step = container_step(now, t["deadline"], running=ch.running(), hook=self.hook_phase(ch, pod),
                                  sigterm_at=ch.sigterm_at)
            if step.action == PRESTOP:
                self.run_pre_stop(ch, pod)
            elif step.action == SIGTERM:
                self.stop_hook(ch, "at the grace deadline")
                ch.sigterm_at = now
                log(f"{what}: SIGTERM to {ch.kind} (pid {ch.proc.pid}) {now - t['started']:.1f} s after the deletion")
                _signal(ch.proc, signal.SIGTERM)
            elif step.action == SIGKILL:
                log(f"{what}: {ch.kind} (pid {ch.proc.pid}) still runs at the grace deadline: SIGKILL")
                _signal(ch.proc, signal.SIGKILL)
            elif step.action == DONE:
                self.stop_hook(ch, "its container's process has ended")
                if ch.proc is not None:
                    ch.proc.exit_code()  # reaps it
            busy |= step.action != DONE
            changed |= step.action not in (WAIT, DONE)
        if not busy:
            t["deleted"] = self.delete_pod(pod, now - t["started"])
            changed = True
        return changed

    def hook_phase(self, ch: Child, pod: dict) -> str:
        """container_step's `hook` for a child: none, pending, running or over."""
        if ch.hook is not None:
            return "running" if ch.hook.alive() else "over"
        if ch.hook_over:
            return "over"
        return "none" if ch.kind == "none" or self.pre_stop(ch, pod) is None else "pending"

    def pre_stop(self, ch: Child, pod: dict) -> list[str] | None:
        c = next((c for c in pod["spec"]["containers"] if c["name"] == ch.container), None)
        return None if c is None else pre_stop_argv(pod, c, self.state / "volumes" / ch.uid)

    def run_pre_stop(self, ch: Child, pod: dict) -> None:
        """Start the container's preStop hook with its env, the configMap files it reads copied here."""
        self.materialize(pod, ch)
        c = next(c for c in pod["spec"]["containers"] if c["name"] == ch.container)
        argv = self.pre_stop(ch, pod)
        tag = f"{ch.namespace}-{ch.pod}-{ch.container}"
        log_path = self.logs / f"prestop-{tag}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"[supervisor] preStop of {ch.namespace}/{ch.pod} container {ch.container}: {shlex.join(argv)}\n")
        env = {"PATH": os.environ.get("PATH", ""), **container_env(pod, c)}
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            ch.hook = spawn(f"prestop-{tag}", argv, log_path, env=env)
            self.save()
        except (RuntimeError, OSError) as e:  # exited at once (a hook that fails fast): the hook is over
            ch.hook_over = True
            log(f"preStop of {ch.namespace}/{ch.pod} ({ch.container}) ended at once: {e}")
            return
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} started (pid {ch.hook.pid}; log {log_path})")

    def stop_hook(self, ch: Child, why: str) -> None:
        """The hook is over: noted (and its exit logged), or stopped when it still runs."""
        if ch.hook is None:
            return
        if ch.hook.alive():
            log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} stopped {why}")
            stop_procs([ch.hook], timeout=MIN_SIGTERM_GRACE_S)
        else:
            log(f"{ch.namespace}/{ch.pod}: preStop of container {ch.container} ended (exit {ch.hook.exit_code()})")
        ch.hook, ch.hook_over = None, True

    def mark_unready(self, pod: dict) -> bool:
        """Ready False on a terminating pod (what kube-proxy and the router's pod discovery read). A separate
        update after the deletion's: vllm-router drops a worker on the event that first shows its pod
        deleted, matching it by its Ready state as it was tracked."""
        meta = pod["metadata"]
        if not any(c["type"] == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get(
                "conditions") or []):
            return True  # not Ready already (never was, or written before a supervisor restart)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.api.patch_namespaced_pod_status(meta["name"], meta["namespace"], ready_status(pod, False, now))
        except Exception as e:  # noqa: BLE001 - apiserver hiccup: retried next pass
            log(f"cannot set Ready=False on terminating {meta['namespace']}/{meta['name']}: {str(e)[:200]}")
            return False
        self.pod_ready[meta["uid"]] = False
        log(f"{meta['namespace']}/{meta['name']} Ready=False (terminating)")
        return True

    def delete_pod(self, pod: dict, took: float) -> bool:
        """kubelet's last word on a pod: delete it with grace 0, only this very pod (uid precondition: a
        StatefulSet or LeaderWorkerSet pod comes back under the same name)."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.delete_namespaced_pod(meta["name"], meta["namespace"], body=body, _request_timeout=10)
        except Exception as e:  # noqa: BLE001 - 404/409: already gone (or replaced); else retried next pass
            if getattr(e, "status", None) not in (404, 409):
                log(f"cannot delete terminated {meta['namespace']}/{meta['name']}: {str(e)[:200]}")
                return False
        log(f"{meta['namespace']}/{meta['name']} terminated {took:.1f} s after its deletion: removed (grace 0)")
        for key in [k for k, c in self.children.items() if c.uid == meta["uid"]]:
            del self.children[key]
        return True

    def materialize(self, pod: dict, ch: Child) -> None:
        """Copy the configMap volumes the container's preStop hook (or its own command line: the endpoint picker's
        --config-file) reads into <state>/volumes/<uid>/<volume>/, as
        kubelet mounts them: at start (an optional ConfigMap that is missing: an empty directory) and again when
        the hook runs, where a ConfigMap gone meanwhile (deleted with its owner) leaves the copy as it was."""
        c = next((c for c in pod["spec"]["containers"] if c["name"] == ch.container), None)
        hook = ((c or {}).get("lifecycle") or {}).get("preStop") or {}
        text = " ".join([*(str(t) for t in (hook.get("exec") or {}).get("command") or []), ch.reads]).strip()
        for _, volume, source in configmap_mounts(pod, c, text) if text else []:
            d = self.state / "volumes" / ch.uid / volume
            d.mkdir(parents=True, exist_ok=True)
            try:
                cm = self.api.read_namespaced_config_map(source["name"], ch.namespace, _request_timeout=10)
            except Exception as e:  # noqa: BLE001 - 404 (optional, or deleted with its owner), apiserver hiccup
                log(f"configMap {ch.namespace}/{source['name']} (volume {volume} of {ch.pod}) not read: "
                    f"{str(e)[:120]}; {sorted(f.name for f in d.iterdir()) or 'no files'} as before")
                continue
            files = configmap_files(cm.data, source)
            for f in d.iterdir():
                if f.is_file() and f.name not in files:
                    f.unlink()
            for name, content in files.items():
                path = d / name
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(content)
                os.replace(tmp, path)
