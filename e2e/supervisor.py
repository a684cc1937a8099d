#!/usr/bin/env python3
"""Plays kubelet for the simulated pods: watches pods labelled v41flash.io/role and, for each Running pod
with an IP (inside 127.0.0.0/8), runs

  * prefill/decode pods: one llm-d-inference-sim bound to <podIP>:<port> with the pod's vLLM settings
    (served model name, max-num-seqs, data-parallel size, max-model-len) and role-dependent latencies;
  * router pods: the real vllm-router with exactly the container's rendered arguments, except that it
    binds to the pod IP and discovers pods through the local apiserver (KUBECONFIG); and, when the pod
    has one, the session proxy (`v41flash session-proxy`) from its container's command, bound to the pod
    IP and forwarding to the router there (pods share 127.0.0.1 here, so "loopback" becomes the pod IP).
    The pod is Ready when every one of its processes is;
  * an engine pod whose container sets V41F_HOSTILE_METRICS=flood|drip: e2e/hostile_metrics.py instead of the
    simulator (healthy, but its /metrics floods or drips), for the scraper's e2e test.

A crashed process is restarted with backoff (like a container restart). A deleted pod terminates as kubelet
terminates it (kwok leaves these pods to the supervisor, harness.kwok_stages): Ready False at once, so the router's
pod discovery stops sending it requests; each container's preStop hook (the engines' drain script, run with `sh`
on a copy of the configMap files it reads); SIGTERM once the hook is over; SIGKILL at the grace deadline, counted
from the deletion (each pod's grace period capped at $V41F_GRACE_PERIOD_CAP_SECONDS, default 5 s); then the pod
object is deleted with grace 0, which frees its IP in kwok's pool. A pod that stops running otherwise has its
processes stopped at once, and one removed from the apiserver while they run (a forced deletion) too.
State: <state>/sims.json (a restarted supervisor goes on with the terminations recorded there); logs:
<state>/logs/{sim,router,hostile,prestop}-<ns>-<pod>*.log. Started (`python -m e2e.supervisor --state DIR`) and
stopped by e2e/harness.py; on SIGTERM it stops every process it started.

This module is the watch loop and the process table (start, restart with backoff, probe, record); the rest lives in
modules of one concern each: pod_processes (a pod -> its processes), engine_pods, router_pods, gateway_pods (one per
kind of pod), termination (kubelet's termination), probes, pod_spec (reading a pod's spec like kubelet).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from e2e.cluster_config import ROLE_LABEL, SUPERVISED_ROLES
from e2e.engine_pods import SIM_ROLE_LATENCY
from e2e.pod_processes import Child, PodProcesses
from e2e.pod_spec import wants_process
from e2e.probes import ProbeRun, ProbeTiming, missing_modules, probe_ok, probe_timing, probe_url, ready_status
from e2e.termination import GRACE_CAP_ENV, Termination, grace_cap, ip_holder
from e2e.tools import Tools, log
from v41flash_bench.local_cluster import write_json
from v41flash_bench.procs import Proc, spawn, stop_procs

SELECTOR = f"{ROLE_LABEL} in ({','.join(SUPERVISED_ROLES)})"
OVERRIDES_FILE = "sim-overrides.json"  # per-pod simulator flags the harness adds (`python -m e2e.harness sim-args`)


class Supervisor(PodProcesses, Termination):
    def __init__(self, state: Path):
        self.state = state
        self.logs = state / "logs"
        self.kubeconfig = state / "kubeconfig"
        self.sims_file = state / "sims.json"
        self.tools = Tools.load()
        self.children: dict[str, Child] = {}  # "<pod uid>/<kind>" -> process
        self.pod_ready: dict[str, bool] = {}  # pod uid -> the Ready we last wrote
        self.pods: dict[str, dict] = {}
        self.api = None  # CoreV1Api, set in run()
        self.routes_synced: dict[str, float] = {}  # front pod uid -> when its routing table was last copied
        # pod uid -> its termination: started, deadline (epoch s), unready (Ready False written), deleted
        self.terminations: dict[str, dict] = {}
        self.grace_cap = grace_cap(os.environ.get(GRACE_CAP_ENV))
        self.extra = {r: shlex.split(os.environ.get(f"V41F_SIM_ARGS_{r.upper()}", "")) for r in SIM_ROLE_LATENCY}
        self.overrides_file = state / OVERRIDES_FILE
        self.overrides: dict[str, list[str]] = {}  # "<ns>/<pod>" -> simulator flags (load_overrides)
        self.overrides_mtime: int | None = None
        self.carried_restarts: dict[str, int] = {}  # pod uid -> restarts, across a restart with new flags

    def reconcile(self) -> None:
        """One pass: processes of pods gone from the apiserver stop; terminating pods go through kubelet's
        termination; pods that run get their processes started (restarted with backoff) and probed."""
        self.load_overrides()
        changed = self.drop_vanished()
        for uid, pod in list(self.pods.items()):
            if pod["metadata"].get("deletionTimestamp"):
                changed |= self.terminate(pod)
        want: dict[str, dict] = {uid: p for uid, p in self.pods.items() if wants_process(p)}
        for key in [k for k, c in self.children.items() if c.uid not in want and c.uid not in self.terminations]:
            ch = self.children.pop(key)  # its pod stopped running without a deletion (a phase change)
            self.pod_ready.pop(ch.uid, None)
            changed = True
            if ch.proc:
                log(f"stopping {ch.kind} for {ch.namespace}/{ch.pod} (pid {ch.proc.pid}): the pod no longer runs")
                stop_procs([ch.proc], timeout=5)
        have = {c.uid for c in self.children.values()}
        for uid, pod in want.items():
            if uid in have:
                continue
            try:
                new = self.desired(pod)
                if not new:  # a headless worker runs no API server: Ready as a kubelet without probe would
                    new = [Child(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], "worker", "none", "",
                                 0, [], {}, "", problem="headless", next_start=float("inf"), ready=True)]
            except (ValueError, KeyError, IndexError) as e:
                log(f"cannot simulate {pod['metadata']['namespace']}/{pod['metadata']['name']}: {e}")
                new = [Child(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], "?", "none", "", 0, [],
                             {}, "", problem=str(e), next_start=float("inf"))]
            for ch in new:
                self.attach_probes(pod, ch)
                ch.restarts = self.carried_restarts.pop(uid, 0) if ch.kind == "sim" else ch.restarts
                self.children[f"{uid}/{ch.kind}"] = ch
            if new[0].problem == "headless":
                self.set_ready(new[0], pod, True)
            changed = True
        for ch in [c for c in self.children.values() if c.uid in want]:
            pod = want[ch.uid]
            if ch.kind == "none":
                continue
            if ch.extra.get("routes"):
                self.sync_routes(ch)
            if ch.extra.get("front"):  # the front's Envoy files, Services resolved to the pods Ready now
                self.sync_front(ch)
            if ch.proc is not None and ch.proc.alive():
                if time.monotonic() >= ch.next_probe:
                    self.probe(ch, pod)
                self.check_liveness(ch, pod)
                continue
            if ch.proc is not None:  # it died: restart with backoff like a container restart
                ch.restarts += 1
                # kubelet's crash-loop backoff (here 0.5 s doubling to 10 s, not 10 s to 5 min), reset once the
                # container ran 10 minutes
                ch.backoff = 1 if time.monotonic() - ch.started_at > 600 else ch.backoff + 1
                ch.next_start = time.monotonic() + min(10.0, 0.5 * 2 ** min(ch.backoff, 5))
                ch.pending.clear()
                for run in (ch.readiness, ch.liveness):
                    if run is not None:
                        run.failures = run.successes = 0
                log(f"{ch.kind} for {ch.namespace}/{ch.pod} exited; restart #{ch.restarts} after backoff "
                    f"(log {ch.log})")
                ch.proc = None
                self.set_ready(ch, pod, False)
                changed = True
            if time.monotonic() >= ch.next_start:
                holder = ip_holder(ch.ip, ch.uid, self.children.values())
                if holder is not None:  # never two pods' processes on one IP
                    if ch.ip_wait != holder.uid:
                        ch.ip_wait = holder.uid
                        log(f"not starting {ch.kind} for {ch.namespace}/{ch.pod} yet: its IP {ch.ip} is still held "
                            f"by {holder.namespace}/{holder.pod} ({holder.kind} pid {holder.proc and holder.proc.pid})")
                    continue
                ch.ip_wait = ""
                self.materialize(pod, ch)
                with open(ch.log, "a") as f:
                    f.write(f"[supervisor] starting: {shlex.join(ch.argv)}\n")
                # No SIGTERM between starting a process and recording it: it would be orphaned.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
                try:
                    ch.proc = spawn(f"{ch.kind}-{ch.namespace}-{ch.pod}", ch.argv, Path(ch.log), env=ch.env,
                                    port=ch.port)
                    ch.started = False  # a (re)started container runs its startupProbe again
                    ch.started_at, ch.next_live = time.monotonic(), 0.0
                    self.save()
                except (RuntimeError, OSError) as e:  # exited at once: back off like a crash loop
                    ch.restarts += 1
                    ch.backoff += 1
                    ch.next_start = time.monotonic() + min(10.0, 0.5 * 2 ** min(ch.backoff, 5))
                    log(f"{ch.kind} for {ch.namespace}/{ch.pod} failed to start: {e}")
                    continue
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
                log(f"started {ch.kind} for {ch.namespace}/{ch.pod} ({ch.role}) on {ch.ip}:{ch.port} "
                    f"pid {ch.proc.pid}")
                ch.next_probe = 0.0
                changed = True
            if ch.proc is not None and time.monotonic() >= ch.next_probe:
                self.probe(ch, pod)
        if changed or not self.sims_file.exists():
            self.save()

    def probe(self, ch: Child, pod: dict) -> None:
        """The probes, as kubelet runs them: the startupProbe until it first succeeds, then Ready follows the
        readinessProbe (or the process being up when there is none): it turns False after failureThreshold failed
        probes in a row, one periodSeconds apart, and True after successThreshold passed ones. Until the first
        Ready it is probed every half second (a kubelet would wait periodSeconds: the harness starts faster).
        Probes run on a thread pool with the probe's timeoutSeconds, so a frozen process delays no other pod."""
        if ch.startup_url and not ch.started:
            ch.started = probe_ok(ch.startup_url)
        started = ch.started or not ch.startup_url
        run = ch.readiness or ProbeRun(ProbeTiming())
        if not started or not ch.probe_url:
            ok = started
        else:
            result = self.probe_result(ch, "readiness", ch.probe_url, run.timing.timeout_s)
            if result is None:  # still in flight: look again shortly
                ch.next_probe = time.monotonic() + 0.2
                return
            run.record(result)
            ok = not run.failed if ch.ready else run.succeeded
        self.set_ready(ch, pod, ok)
        ch.next_probe = time.monotonic() + (run.timing.period_s if ok else 0.5)

    prober: ThreadPoolExecutor | None = None

    def probe_result(self, ch: Child, which: str, url: str, timeout: float) -> bool | None:
        """The result of one probe run of ``ch`` (started now if none is in flight); None while it runs."""
        if Supervisor.prober is None:
            Supervisor.prober = ThreadPoolExecutor(8, thread_name_prefix="probe")
        fut = ch.pending.get(which)
        if fut is None:
            ch.pending[which] = Supervisor.prober.submit(probe_ok, url, timeout)
            return None
        if not fut.done():
            return None
        del ch.pending[which]
        return fut.result()

    def check_liveness(self, ch: Child, pod: dict) -> None:
        """The livenessProbe, as kubelet runs it: once the startupProbe passed and initialDelaySeconds after the
        container started, every periodSeconds; failureThreshold failures in a row kill the process (SIGTERM, then
        SIGKILL: a frozen process only answers that) and it restarts with the crash-loop backoff."""
        if not ch.liveness_url or ch.liveness is None or not ch.running():
            return
        now = time.monotonic()
        t = ch.liveness.timing
        if (ch.startup_url and not ch.started) or now < ch.started_at + t.initial_delay_s or now < ch.next_live:
            return
        result = self.probe_result(ch, "liveness", ch.liveness_url, t.timeout_s)
        if result is None:
            ch.next_live = now + 0.2
            return
        ch.liveness.record(result)
        ch.next_live = now + t.period_s
        if not ch.liveness.failed:
            return
        log(f"liveness probe of {ch.kind} for {ch.namespace}/{ch.pod} failed {ch.liveness.failures} times in a row "
            f"({ch.liveness_url}); killing it (pid {ch.proc.pid}) to restart it, as kubelet does")
        self.set_ready(ch, pod, False)
        stop_procs([ch.proc], timeout=2)

    def attach_probes(self, pod: dict, ch: Child) -> None:
        """The timing of the readiness probe and the liveness probe of the container ``ch`` runs."""
        c = next((c for c in pod["spec"].get("containers") or [] if c.get("name") == ch.container), None)
        if c is None:
            return
        ch.readiness = ProbeRun(probe_timing(c, "readinessProbe"))
        ch.liveness_url = probe_url(pod, c, "livenessProbe") if ch.kind != "fwd" else None
        ch.liveness = ProbeRun(probe_timing(c, "livenessProbe")) if ch.liveness_url else None

    def load_overrides(self) -> None:
        """The harness's per-pod simulator flags (<state>/sim-overrides.json, `python -m e2e.harness sim-args`): a
        pod whose flags changed has its simulator restarted with them, as a container restart would."""
        try:
            mtime = self.overrides_file.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self.overrides_mtime:
            return
        self.overrides_mtime = mtime
        try:
            new = json.loads(self.overrides_file.read_text()) if mtime is not None else {}
        except (OSError, json.JSONDecodeError) as e:
            log(f"ignoring {self.overrides_file}: {e}")
            return
        changed = {k for k in set(new) | set(self.overrides) if new.get(k) != self.overrides.get(k)}
        self.overrides = new
        for key, ch in list(self.children.items()):
            if f"{ch.namespace}/{ch.pod}" not in changed or ch.kind != "sim" or ch.uid in self.terminations:
                continue
            log(f"restarting the simulator of {ch.namespace}/{ch.pod} with the harness's flags {new.get(f'{ch.namespace}/{ch.pod}', [])}")
            pod = self.pods.get(ch.uid)
            if pod is not None:
                self.set_ready(ch, pod, False)
            if ch.proc is not None:
                stop_procs([ch.proc], timeout=2)
            self.carried_restarts[ch.uid] = ch.restarts + 1
            for k in [k for k, c in self.children.items() if c.uid == ch.uid]:
                self.children.pop(k)

    def set_ready(self, ch: Child, pod: dict, ready: bool) -> None:
        """Record one process's probe result; the pod is Ready when all of its processes are."""
        ch.ready = ready
        pod_ready = all(c.ready for c in self.children.values() if c.uid == ch.uid)
        if self.pod_ready.get(ch.uid) == pod_ready:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            restarts = {c.container: c.restarts for c in self.children.values() if c.uid == ch.uid and c.container}
            self.api.patch_namespaced_pod_status(ch.pod, ch.namespace, ready_status(pod, pod_ready, now, restarts))
        except Exception as e:  # noqa: BLE001 - pod gone meanwhile, apiserver restarting: retried next probe
            log(f"cannot set Ready={pod_ready} on {ch.namespace}/{ch.pod}: {str(e)[:200]}")
            return
        self.pod_ready[ch.uid] = pod_ready
        log(f"{ch.namespace}/{ch.pod} Ready={pod_ready}")

    def save(self) -> None:
        procs = []
        for c in self.children.values():
            if c.proc is None:
                continue
            d = {"uid": c.uid, "namespace": c.namespace, "pod": c.pod, "role": c.role, "kind": c.kind, "ip": c.ip,
                 "port": c.port, "pid": c.proc.pid, "start": c.proc.start, "name": c.proc.name, "argv": c.argv,
                 "log": c.log, "restarts": c.restarts, "container": c.container, **c.extra}
            if c.uid in self.terminations:  # what a restarted supervisor needs to go on with it
                d["terminating"] = {"sigterm_at": c.sigterm_at, "hook_over": c.hook_over, "hook": None if c.hook is None
                                    else {k: getattr(c.hook, k) for k in ("name", "pid", "start", "argv", "log")}}
            procs.append(d)
        write_json(self.sims_file, {"updated": time.time(), "processes": procs})

    def tick(self) -> int:
        """Watch timeout: one second, as kubelet's PLEG relists containers every second: a process that exits turns
        its pod unready (and restarts) within a second, a probe falls due on time, a termination steps on time."""
        return 1

    def stop_all(self) -> None:
        stop_procs([p for c in self.children.values() for p in (c.proc, c.hook) if p], timeout=5)
        self.children.clear()
        self.save()

    def recover(self, records: list[dict]) -> None:
        """Processes recorded by an earlier supervisor (killed, or restarted): those of a pod that is
        terminating are adopted and their termination goes on where it was (preStop hook, SIGTERM time); the
        others are stopped (the pods that still run get theirs started again)."""
        stop = []
        for d in records:
            proc = Proc(d["name"], d["pid"], d["start"], d["argv"], d["log"], d.get("port"))
            term = d.get("terminating") or {}
            hook = Proc(**term["hook"]) if term.get("hook") else None
            pod = self.pods.get(d["uid"])
            if pod is None or not pod["metadata"].get("deletionTimestamp") or not proc.alive():
                stop += [p for p in (proc, hook) if p is not None]
                continue
            ch = Child(d["uid"], d["namespace"], d["pod"], d["role"], d["kind"], d["ip"], d["port"], d["argv"], {},
                       d["log"], proc=proc, restarts=d.get("restarts", 0), container=d.get("container", ""),
                       hook=hook, hook_over=bool(term.get("hook_over")), sigterm_at=term.get("sigterm_at"))
            self.children[f"{ch.uid}/{ch.kind}"] = ch
            log(f"adopted {ch.kind} of terminating {ch.namespace}/{ch.pod} (pid {proc.pid}"
                + (f", preStop pid {hook.pid}" if hook else "") + ")")
        stop_procs(stop, timeout=5)

    def run(self) -> None:
        from kubernetes import client, config, watch
        try:  # what an earlier supervisor left running: adopted or stopped once the pods are listed
            records = json.loads(self.sims_file.read_text())["processes"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            records = []
        api = self.api = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        log(f"supervisor watching pods with {SELECTOR}; grace periods capped at "
            f"{'(none)' if self.grace_cap is None else f'{self.grace_cap:g} s'} ({GRACE_CAP_ENV})")
        while True:
            try:
                lst = api.list_pod_for_all_namespaces(label_selector=SELECTOR, _request_timeout=30)
                self.pods = {p.metadata.uid: api.api_client.sanitize_for_serialization(p) for p in lst.items}
                if records is not None:
                    self.recover(records)
                    records = None
                    self.save()
                self.reconcile()
                rv = lst.metadata.resource_version
                while True:
                    w = watch.Watch()
                    for ev in w.stream(api.list_pod_for_all_namespaces, label_selector=SELECTOR,
                                       resource_version=rv, timeout_seconds=self.tick(),
                                       allow_watch_bookmarks=True):
                        obj = ev["raw_object"]
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if ev["type"] == "BOOKMARK":
                            continue
                        if ev["type"] == "DELETED":
                            self.pods.pop(obj["metadata"]["uid"], None)
                        elif ev["type"] in ("ADDED", "MODIFIED"):
                            self.pods[obj["metadata"]["uid"]] = obj
                        self.reconcile()
                    self.reconcile()  # also restarts crashed processes and steps terminations between events
            except Exception as e:  # apiserver restarts, 410 Gone, ...: relist (Shutdown is not an Exception)
                log(f"watch interrupted ({e.__class__.__name__}: {str(e)[:200]}); relisting")
                time.sleep(1)


class Shutdown(BaseException):
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True)
    a = ap.parse_args()
    missing = missing_modules()
    if missing:
        log(f"supervisor: {', '.join(missing)} not installed in {sys.executable}: pip install -e '.[dev]'")
        return 2
    sup = Supervisor(a.state.resolve())

    def on_signal(signum, _frame):
        raise Shutdown(signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sup.run()
    except Shutdown:
        log("supervisor: stopping simulators and routers")
    finally:
        sup.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
