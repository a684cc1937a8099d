#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback for the e2e suite and the demo.

Runs etcd, kube-apiserver (RBAC, real admission), kube-controller-manager, kube-scheduler, kwok (fake GPU
nodes whose pods get IPs inside 127.0.0.0/8), the LeaderWorkerSet controller, and a supervisor that
starts one llm-d-inference-sim per Running vLLM pod and the real vllm-router per router pod.

    .venv/bin/python -m e2e.harness up|down|status|logs [component]

State (certificates, etcd data, logs, PIDs, kubeconfig) lives in e2e/.state or $V41F_STATE; binaries
come from e2e/build-tools.sh's cache (${V41F_CACHE:-~/.cache/v41flash}/bin).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import yaml

from e2e.cluster_config import kwok_stages, lws_webhooks
from e2e.dra import compute_domain_crd, device_classes, resource_slices
from e2e.nodes import NODE_ANNOTATION, NODE_POOLS, claim_pod_network, fake_nodes, release_pod_network
from e2e.pki import kubeconfig_yaml, make_pki
from e2e.tools import E2E, REPO, VENV_BIN, Tools, log, project_crds
from v41flash_bench.local_cluster import ClusterRecords, write_json
from v41flash_bench.procs import Proc, free_port, proc_start_ticks, spawn, stop_procs, sweep_writers

SERVICE_CIDR = "10.0.0.0/16"  # 65k Service IPs: 500+ deployments (3 Services each) and room to spare
LWS_NAMESPACE = "lws-system"


def supervised_procs(records: list[dict]) -> list[Proc]:
    """The processes in the supervisor's sims.json entries: each simulator/router and, while its pod
    terminates, its container's preStop hook."""
    keys = ("name", "pid", "start", "argv", "log")
    out = []
    for d in records:
        out.append(Proc(**{k: d[k] for k in keys}))
        hook = (d.get("terminating") or {}).get("hook")
        if hook:
            out.append(Proc(**{k: hook[k] for k in keys}))
    return out


# ---------------------------------------------------------------------------------------------------

class Cluster(ClusterRecords):
    """The local control plane under one state directory: its records (ClusterRecords) and its lifecycle."""

    def __init__(self, state: Path | None = None):
        super().__init__(state)
        self.artifacts = Path(os.environ.get("V41F_ARTIFACTS") or self.state / "artifacts")

    def restart(self, name: str, down_seconds: float = 0.0, sig: int = signal.SIGKILL,
                argv: list[str] | None = None) -> Proc:
        """Kill one component (SIGKILL: a crash) and start it again with the same command line (or `argv`) and
        log, after `down_seconds`; returns the new process. Fault tests use it on kube-apiserver and etcd."""
        with self._locked():
            procs = self.procs()
        (old,) = [p for p in procs if p.name == name]
        if old.alive():
            try:
                os.killpg(old.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while old.alive() and time.monotonic() < deadline:
            old.exit_code()  # reaps it when this process started it
            time.sleep(0.05)
        if old.alive():
            raise RuntimeError(f"{name} (pid {old.pid}) did not die")
        time.sleep(down_seconds)
        new = spawn(name, argv or old.argv, Path(old.log), port=old.port, extra=old.extra)
        self.register(new)
        return new

    def pod_controllers(self, on: bool) -> None:
        """Turn the controller-manager's Deployment, ReplicaSet and StatefulSet controllers off or back on (a
        restart of kube-controller-manager). Off, workloads make no pods: `v41flash bench operator` measures
        the operator's work alone, without 1,000 Pending pods loading the same two cores."""
        with self._locked():
            (kcm,) = [p for p in self.procs() if p.name == "kube-controller-manager"]
        argv = [a for a in kcm.argv if not a.startswith("--controllers=")]
        if not on:
            argv.append("--controllers=*,-deployment-controller,-replicaset-controller,-statefulset-controller")
        new = self.restart("kube-controller-manager", sig=signal.SIGTERM, argv=argv)
        wait_until(lambda: _http_ok(f"https://127.0.0.1:{new.port}/healthz", insecure=True), 60,
                   "kube-controller-manager /healthz", new)

    # -- lifecycle
    def up(self) -> bool:
        """Start everything; False when it was already up."""
        if self.is_up():
            # a running cluster may carry an older CRD: serve this checkout's (and mode Gateway's, which an older
            # harness did not install)
            tools = Tools.load()
            self.kubectl("apply", "--server-side", "--force-conflicts",
                         *[f"-f={c}" for c in [*project_crds(), *tools.gie_crds, *tools.gateway_api_crds,
                                               self._compute_domain_crd()] if c.exists()])
            log(f"already up (kubeconfig {self.kubeconfig}); CRDs re-applied; `down` first to restart")
            return False
        if self.procs():
            log("stale state from an earlier run: cleaning it up first")
            self.down()
        t0 = time.monotonic()
        tools = Tools.load()
        missing = tools.missing()
        if missing:
            log(f"building missing tools: {' '.join(missing)} (e2e/build-tools.sh)")
            subprocess.run(["bash", str(E2E / "build-tools.sh"), *missing], check=True)
            missing = tools.missing()
            if missing:
                raise RuntimeError(f"build-tools.sh did not produce {missing}")
        for d in (self.logs, self.pki):
            d.mkdir(parents=True, exist_ok=True)
        procs: list[Proc] = []
        try:
            self._up(tools, procs, t0)
        except BaseException as e:
            log(f"up failed: {e!r}")
            for p in procs:
                tail = _tail(Path(p.log), 15)
                if tail and (not p.alive() or p is procs[-1]):
                    log(f"--- last lines of {p.log} ---\n{tail}")
            dest = self.save_artifacts("up-failure")
            log(f"component logs copied to {dest}")
            self.down()
            raise
        return True

    def _up(self, tools: Tools, procs: list[Proc], t0: float) -> None:
        def step(msg: str) -> None:
            log(f"{msg} (+{time.monotonic() - t0:.1f}s)")

        make_pki(self.pki)
        net = claim_pod_network(self.state)
        ports = {k: free_port() for k in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler",
                                          "lws-webhook", "lws-health")}
        api = f"https://127.0.0.1:{ports['apiserver']}"
        self.kubeconfig.write_text(kubeconfig_yaml(api, self.pki))
        self.kubeconfig.chmod(0o600)
        self._save(procs, apiserver=api, ports=ports, kubeconfig=str(self.kubeconfig), started=time.time(),
                   pod_network=f"127.{net}.0.0/16")
        step(f"certificates and kubeconfig written; pod network 127.{net}.0.0/16")
        pki, kc = self.pki, str(self.kubeconfig)

        def start(name, argv, port=None, env=None, cwd=None):
            p = spawn(name, argv, self.logs / f"{name}.log", env=env, port=port, cwd=cwd)
            procs.append(p)
            self._save(procs)
            return p

        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        etcd = start("etcd", [tools.etcd, "--name=v41f", f"--data-dir={self.state / 'etcd'}",
                              f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                              f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                              f"--initial-cluster=v41f={peer}", "--unsafe-no-fsync", "--log-level=warn"],
                     port=ports["etcd"])
        wait_until(lambda: _http_ok(etcd_url + "/health"), 30, "etcd /health", etcd)
        step("etcd ready")

        apiserver = start("kube-apiserver", [
            tools.kube / "kube-apiserver", f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}", f"--cert-dir={pki / 'apiserver'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC", f"--service-account-issuer={api}",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--allow-privileged=true", "--profiling=false", "--event-ttl=1h",
        ], port=ports["apiserver"])

        def readyz():
            try:
                code, body = self.api_get("/readyz?verbose", timeout=3)
            except OSError as e:
                return False, f"not listening ({e.__class__.__name__})"
            failing = [ln.split()[1] for ln in body.splitlines() if ln.startswith("[-]")]
            return code == 200, ("failing: " + ", ".join(failing)) if failing else f"HTTP {code}"
        wait_until(readyz, 120, "kube-apiserver /readyz", apiserver)
        step("kube-apiserver ready")

        common = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                  "--bind-address=127.0.0.1", "--leader-elect=false",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]
        kcm = start("kube-controller-manager", [
            tools.kube / "kube-controller-manager", *common, f"--secure-port={ports['kcm']}",
            f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ], port=ports["kcm"])
        sched = start("kube-scheduler", [tools.kube / "kube-scheduler", *common,
                                         f"--secure-port={ports['scheduler']}"], port=ports["scheduler"])
        (self.state / "kwok-stages.yaml").write_text(kwok_stages(tools.kwok_assets))
        kwok = start("kwok", [tools.kwok, f"--kubeconfig={kc}", f"--config={self.state / 'kwok-stages.yaml'}",
                              "--manage-all-nodes=false",
                              f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
                              f"--cidr=127.{net}.0.0/24", "--node-ip=127.0.0.1",
                              "--node-lease-duration-seconds=40"])
        env = dict(os.environ, V41F_STATE=str(self.state), KUBECONFIG=kc)
        sup = start("supervisor", [sys.executable, "-m", "e2e.supervisor", "--state", self.state], env=env, cwd=REPO)
        # NVIDIA's ComputeDomain controller, played by the harness (e2e/dra.py): each domain's channel template
        start("imex-controller", [sys.executable, "-m", "e2e.dra", "--state", self.state], env=env, cwd=REPO)
        step("controller-manager, scheduler, kwok, supervisor, ComputeDomain stand-in started")

        # mode Gateway's CRDs (InferencePool, InferenceObjective, HTTPRoute) are part of the default cluster; the
        # test of a missing InferencePool CRD removes and restores them (e2e/gateway.py: remove_gie_crds)
        crds = project_crds() + [
            tools.lws_assets / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", *tools.gie_crds,
            *tools.gateway_api_crds, self._compute_domain_crd()]
        self.kubectl("apply", "--server-side", "--force-conflicts", *[f"-f={c}" for c in crds])

        def established():  # (kubectl wait fails at once while a CRD has no conditions yet)
            items = json.loads(self.kubectl("get", "crd", "-o", "json", capture=True))["items"]
            ok = [c["metadata"]["name"] for c in items if any(
                x["type"] == "Established" and x["status"] == "True" for x in (c.get("status") or {}).get("conditions") or [])]
            return len(ok) == len(items) >= len(crds), f"{len(ok)}/{len(crds)} established"
        wait_until(established, 60, "CRDs Established")
        step(f"CRDs established: {', '.join(c.name for c in crds)}")

        self.kubectl("create", "namespace", LWS_NAMESPACE)
        nodes = fake_nodes(net=net)
        self.kubectl("create", "-f", "-", input="\n---\n".join(yaml.safe_dump(n) for n in nodes), capture=True)
        # DRA: the NVIDIA driver's DeviceClasses and the ResourceSlices its kubelet plugins would publish (e2e/dra.py)
        self.kubectl("create", "-f", "-", capture=True, input="\n---\n".join(
            yaml.safe_dump(o) for o in [*device_classes(), *resource_slices(nodes, NODE_POOLS)]))
        for name, p in (("kube-controller-manager", kcm), ("kube-scheduler", sched)):
            port = ports["kcm" if p is kcm else "scheduler"]
            wait_until(lambda port=port: _http_ok(f"https://127.0.0.1:{port}/healthz", insecure=True), 60,
                       f"{name} /healthz", p)
        n_nodes = len(nodes)

        def nodes_ready():
            out = self.kubectl("get", "nodes", "-o", "jsonpath={range .items[*]}{.status.conditions[?(@.type=="
                               "\"Ready\")].status}{\"\\n\"}{end}", capture=True)
            ready = out.split().count("True")
            return ready == n_nodes, f"{ready}/{n_nodes} Ready"
        wait_until(nodes_ready, 60, "kwok nodes Ready", kwok)
        wait_until(lambda: self.kubectl("get", "serviceaccount", "default", check=False, capture=True) != "",
                   60, "default ServiceAccount", kcm)
        step(f"{n_nodes} fake nodes Ready, scheduler and controller-manager healthy")

        lws_cfg = self.state / "lws-config.yaml"
        lws_cfg.write_text(yaml.safe_dump({
            "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": ports["lws-webhook"], "certDir": str(pki / "lws")},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['lws-health']}"},
        }))
        lws = start("lws", [tools.lws, f"--config={lws_cfg}", "--zap-log-level=info"], port=ports["lws-webhook"],
                    env=dict(os.environ, KUBECONFIG=kc))
        wait_until(lambda: _http_ok(f"http://127.0.0.1:{ports['lws-health']}/readyz"), 60, "lws /readyz", lws)
        hooks = lws_webhooks((tools.lws_assets / "manifests.yaml").read_text(),
                             f"https://127.0.0.1:{ports['lws-webhook']}", (pki / "ca.crt").read_bytes())
        self.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(yaml.safe_dump(h) for h in hooks))
        # A server-side dry run goes through LWS's defaulting and validating webhooks: proves they answer.
        probe = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                 "metadata": {"name": "webhook-probe", "namespace": "default"},
                 "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
                     {"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}}
        wait_until(lambda: self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe),
                                        check=False, capture=True) != "", 60, "LWS webhooks answering", lws)
        step("LeaderWorkerSet controller and webhooks ready")
        if not sup.alive():
            raise RuntimeError("supervisor exited; see " + sup.log)
        log(f"cluster up in {time.monotonic() - t0:.1f}s; kubeconfig: {self.kubeconfig}")
        log(f"  export KUBECONFIG={self.kubeconfig}   # then: .venv/bin/kubectl get nodes")

    def _compute_domain_crd(self) -> Path:
        """The ComputeDomain CRD of e2e/dra.py, as a file kubectl applies beside the others."""
        path = self.state / "computedomains.resource.nvidia.com.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(compute_domain_crd()))
        return path

    def down(self) -> None:
        """Stop every recorded process (supervised sims/routers too) and remove the state (keeps artifacts)."""
        procs = self.procs()
        # The supervisor first (it stops its simulators and routers), then whatever it left behind, the
        # operator and other clients, then the apiserver, then etcd (clients before servers: no hung shutdown).
        stop_procs([p for p in procs if p.name == "supervisor"], timeout=15)
        leftovers = supervised_procs(self.supervised())
        servers = ("kube-apiserver", "etcd")
        stop_procs(leftovers + [p for p in procs if p.name not in servers], timeout=10)
        for name in servers:
            stop_procs([p for p in procs if p.name == name], timeout=20)
        still = [p.name for p in procs + leftovers if p.alive()]
        if still:
            raise RuntimeError(f"still running after SIGKILL: {still}")
        strays = sweep_writers(self.logs)
        if strays:
            log(f"stopped {len(strays)} unrecorded process(es) still writing to {self.logs}: {strays}")
        release_pod_network(self.state)
        if self.state.exists():
            for child in self.state.iterdir():
                if child.resolve() == self.artifacts.resolve():
                    continue
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        if procs or leftovers:
            log(f"stopped {len(procs) + len(leftovers)} processes; state removed ({self.state})")
        else:
            log("nothing was running")

    def save_artifacts(self, label: str) -> Path:
        """Copy component, simulator and operator logs to the artifacts folder; returns the folder."""
        dest = self.artifacts / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
        dest.mkdir(parents=True, exist_ok=True)
        if self.logs.exists():
            shutil.copytree(self.logs, dest / "logs", dirs_exist_ok=True)
        for f in ("pids.json", "sims.json"):
            if (self.state / f).exists():
                shutil.copy(self.state / f, dest / f)
        return dest

    def status(self) -> str:
        procs = self.procs()
        if not procs:
            return "not running (no state in %s)" % self.state
        info = self.info()
        lines = [f"apiserver {info.get('apiserver')}  kubeconfig {self.kubeconfig}"]
        for p in procs:
            lines.append(f"  {p.name:24s} pid {p.pid:<7d} {'running' if p.alive() else 'DEAD'}"
                         + (f"  port {p.port}" if p.port else "") + f"  log {p.log}")
        sims = self.supervised()
        lines.append(f"supervised simulators/routers: {len(sims)}")
        for s in sims:
            alive = proc_start_ticks(s["pid"]) == s["start"]
            lines.append(f"  {s['kind']:6s} {s['namespace']}/{s['pod']:40s} {s['role']:8s} {s['ip']}:{s['port']}"
                         f"  pid {s['pid']} {'running' if alive else 'DEAD'}")
        return "\n".join(lines)

    # -- kubectl
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, capture: bool = False,
                timeout: float = 120) -> str:
        """Run .venv/bin/kubectl against this cluster; returns stdout ('' on failure when check=False)."""
        r = subprocess.run([str(VENV_BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            if check:
                raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
            return ""
        if not capture and r.stdout.strip():
            for line in r.stdout.strip().splitlines():
                log(f"  {line}")
        return r.stdout


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def _http_ok(url: str, insecure: bool = False) -> bool:
    ctx = None
    if insecure:  # components' self-signed serving certs on loopback; only a health probe
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_until(pred: Callable[[], object], timeout: float, what: str, proc: Proc | None = None,
               interval: float = 0.3) -> object:
    """Poll pred until truthy (a (bool, detail) tuple reports detail); progress every 5s; fail fast if proc dies."""
    t0 = time.monotonic()
    last_report = t0
    detail = ""
    while True:
        v = pred()
        ok, detail = v if isinstance(v, tuple) else (v, detail)
        if ok:
            return v
        now = time.monotonic()
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}; see {proc.log}")
        if now - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" ({detail})" if detail else ""))
        if now - last_report >= 5:
            log(f"  waiting for {what} ({now - t0:.0f}s{', ' + detail if detail else ''})")
            last_report = now
        time.sleep(interval)


def set_sim_args(state: Path, pod: str, flags: list[str]) -> None:
    """Record extra simulator flags for one pod (NAMESPACE/POD); the supervisor restarts its simulator with them.
    Launcher knobs (--v41f-*) are checked here, so a typo fails the command instead of the pod."""
    from e2e.supervisor import OVERRIDES_FILE
    from v41flash_bench.inference_sim import split_knobs
    split_knobs(flags)
    path = state / OVERRIDES_FILE
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        table = {}
    if flags:
        table[pod] = flags
    else:
        table.pop(pod, None)
    write_json(path, table)


def signal_pod(state: Path, pod: str, sig: str, kind: str = "") -> int:
    """Send a signal to one simulated pod's process (its first, or the one of ``kind``); its pid."""
    ns, _, name = pod.partition("/")
    procs = json.loads((state / "sims.json").read_text())["processes"]
    proc = next((p for p in procs if p["namespace"] == ns and p["pod"] == name and p["kind"] == (kind or p["kind"])),
                None)
    if proc is None:
        raise SystemExit(f"no {kind or 'process'} of pod {pod} in {state / 'sims.json'}")
    os.kill(proc["pid"], getattr(signal, "SIG" + sig.upper().removeprefix("SIG")))
    return proc["pid"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start the local cluster (idempotent)")
    sub.add_parser("down", help="stop every process it started and remove the state")
    sub.add_parser("status", help="what runs, with PIDs and ports")
    pc = sub.add_parser("pod-controllers", help="turn the Deployment/ReplicaSet/StatefulSet controllers off or on")
    pc.add_argument("state", choices=["on", "off"])
    gc = sub.add_parser("gie-crds", help="remove or install the Gateway API Inference Extension CRDs (InferencePool)")
    gc.add_argument("state", choices=["on", "off"])
    sa = sub.add_parser("sim-args", help="restart one engine pod's simulator with extra flags (a straggler on purpose: "
                                         "--v41f-itl-factor=2); no flags: back to its own")
    sa.add_argument("pod", help="NAMESPACE/POD")
    sa.add_argument("flags", nargs=argparse.REMAINDER)
    sg = sub.add_parser("signal", help="send a signal to one pod's process (STOP: a hang, CONT, KILL: a crash)")
    sg.add_argument("pod", help="NAMESPACE/POD")
    sg.add_argument("signal", help="STOP, CONT, KILL, TERM, ...")
    sg.add_argument("--kind", default="", help="sim, proxy, router, sidecar, epp (default: the pod's first process)")
    lg = sub.add_parser("logs", help="tail component logs")
    lg.add_argument("component", nargs="?", help="e.g. kube-apiserver, supervisor, sim-default-mypod")
    lg.add_argument("-n", type=int, default=40)
    a = ap.parse_args(argv)
    c = Cluster()
    if a.cmd == "up":
        c.up()
    elif a.cmd == "down":
        c.down()
    elif a.cmd == "status":
        print(c.status())
        return 0 if c.is_up() else 3
    elif a.cmd == "pod-controllers":
        c.pod_controllers(a.state == "on")
    elif a.cmd == "gie-crds":
        from e2e.gateway import install_gie_crds, remove_gie_crds
        (install_gie_crds if a.state == "on" else remove_gie_crds)(c)
    elif a.cmd == "sim-args":
        set_sim_args(c.state, a.pod, [f for f in a.flags if f != "--"])
    elif a.cmd == "signal":
        pid = signal_pod(c.state, a.pod, a.signal, a.kind)
        print(f"SIG{a.signal.upper().removeprefix('SIG')} sent to pid {pid}")
    elif a.cmd == "logs":
        files = sorted(c.logs.glob("*.log")) if c.logs.exists() else []
        if a.component:
            files = [f for f in files if f.stem == a.component] or [f for f in files if a.component in f.stem]
        if not files:
            print("no matching logs in", c.logs, file=sys.stderr)
            return 1
        for f in files:
            print(f"==> {f} <==\n{_tail(f, a.n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
