"""`v41flash bench operator`: the operator's own work at N deployments, on a running local cluster.

Per N (e.g. 10, 100, 500), in a fresh namespace and with a fresh operator process (this command starts it,
watching only that namespace, so its CPU and memory are the operator's alone):

1. burst: N copies of an example CR created at once (16 client threads) → per CR apply→children (its
   workload Deployments exist: the renderer's last wave, so everything else was applied first) and
   apply→observed (status.observedGeneration reached the CR's generation), and the time until all converged;
2. one more: 20 CRs applied one after another among the N, as soon as the burst converged (the operator is
   still working off the burst's aftermath) → the same two latencies each;
   one more at rest: 20 more, each once the operator is at rest (AtRest: no pass queued and none running for
   REST_QUIET_S straight, from its own /metrics) and then after a random delay within one periodic tick, so
   the applies fall at every phase of the steady state's ticks → the same, and how long rest took to come;
3. spec change: every CR's spec changed at once → apply→observed;
4. idle: once the operator is at rest, a quiet window → the objects the operator wrote (its managedFields
   entries moved: v41flash_bench.writes), per minute and by the field that moved; the write requests the
   apiserver counted on the operator's resources (apiserver_request_total, all writers, no-op applies
   included) and the operator's own write requests;
5. delete: every CR deleted → until the CRs and their workloads are gone.

Nodes are cordoned for the run (and restored after): pods stay Pending, so no simulator or router process
competes for the CPU and the figure is the operator's. Unless --pods, the controller-manager's Deployment,
ReplicaSet and StatefulSet controllers are off for the run too (`python -m e2e.harness pod-controllers
off|on`): no ReplicaSet or Pending pod is made, so the apiserver's work is the operator's alone. Figures: reconcile pass durations by trigger and
the periodic cycle (tick → every deployment's pass done) from the operator's /metrics, operator CPU
seconds and peak RSS (from /proc), API requests per deployment (the operator's client; kopf's watches and
its annotation patches are not in that count, but are in the apiserver's write count).
Writes report.json and latency_vs_n.png in --out.
"""
from __future__ import annotations

import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from v41flash.controller.kube import FIELD_MANAGER
from v41flash_bench.writes import namespace_snapshot, settle, writes_by
from v41flash_bench.writes import summary as writes_summary

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "v41flash.io", "v1alpha1", "v41flashdeployments"
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE", "DELETECOLLECTION"}
OPERATOR_RESOURCES = {"v41flashdeployments", "deployments", "services", "serviceaccounts", "configmaps",
                      "roles", "rolebindings", "poddisruptionbudgets", "leaderworkersets", "events"}
PROBES = 20
PHASES = ("burst", "one_more", "one_more_at_rest", "idle", "spec_change", "delete")  # in this order; burst always
# The operator is at rest when its own gauges (v41flash_pass_queue_depth, v41flash_passes_running) read 0 for this
# long straight, sampled every REST_SAMPLE_S. At 500 deployments a periodic tick (every 15 s) queues 500 observe
# passes that drain in ~4 s at rest, so a few quiet seconds come every tick; while a burst's aftermath (or a
# periodic cycle of 40 s) is being worked off they do not.
REST_QUIET_S = 5.0
REST_SAMPLE_S = 0.25
REST_GAUGES = ("v41flash_pass_queue_depth", "v41flash_passes_running")
# Before the idle window the namespace settles: no other writer (the controller-manager counting pods, status
# subresources) changed an object for this long, sampled every SETTLE_SAMPLE_S.
SETTLE_QUIET_S = 30.0
SETTLE_SAMPLE_S = 5.0


def parse_phases(text: str) -> tuple[str, ...]:
    """--phases: a comma-separated subset of PHASES (run in their fixed order; burst is always run)."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PHASES]
    if unknown:
        raise ValueError(f"--phases: unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    return tuple(p for p in PHASES if p in asked or p == "burst")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": _pct(values, 0.5), "p90": _pct(values, 0.9), "p99": _pct(values, 0.99),
            "max": max(values) if values else None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """CPU seconds and peak RSS of one process, sampled from /proc."""

    def __init__(self, pid: int):
        self.pid, self.peak_rss_mb, self._stop = pid, 0.0, threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.peak_rss_mb = max(self.peak_rss_mb, self.rss_mb())
            except OSError:
                return

    def reset_peak(self) -> None:
        self.peak_rss_mb = self.rss_mb()

    def stop(self) -> None:
        self._stop.set()


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def histogram(m: dict, name: str, **match: str) -> dict[str, Any]:
    """count, mean and bucket-bound quantiles of a histogram (label subset `match`) from a metrics delta."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for (metric, labels), v in m.items():
        lab = dict(labels)
        if any(lab.get(k) != val for k, val in match.items()):
            continue
        if metric == f"{name}_bucket":
            le = float(lab["le"])
            buckets[le] = buckets.get(le, 0.0) + v
        elif metric == f"{name}_sum":
            total += v
        elif metric == f"{name}_count":
            count += v
    if not count:
        return {"count": 0}
    bounds = sorted(buckets)

    def q(p: float) -> float:
        for le in bounds:
            if buckets[le] >= p * count:
                return le
        return float("inf")
    return {"count": int(count), "mean": total / count, "p50_le": q(0.5), "p99_le": q(0.99), "max_le": q(1.0)}


class AtRest:
    """Fed (time, the operator's metrics) samples: whether no pass has been queued or running for `quiet_s`."""

    def __init__(self, quiet_s: float = REST_QUIET_S):
        self.quiet_s = quiet_s
        self.since: float | None = None  # first sample of the current quiet stretch

    def sample(self, t: float, metrics: dict) -> bool:
        busy = [metrics.get((g, ()), None) for g in REST_GAUGES]
        if any(v is None for v in busy):
            raise RuntimeError(f"the operator's /metrics has no {' / '.join(REST_GAUGES)}: cannot tell it is at rest")
        if any(busy):
            self.since = None
            return False
        if self.since is None:
            self.since = t
        return t - self.since >= self.quiet_s


class Watcher:
    """Times from the watch streams: a CR's workloads existing, its status reaching a generation."""

    def __init__(self, api_client, namespace: str, workloads_per_cr: int):
        from kubernetes import client
        self.custom, self.apps = client.CustomObjectsApi(api_client), client.AppsV1Api(api_client)
        self.ns, self.per_cr = namespace, workloads_per_cr
        self.observed: dict[str, list[tuple[int, float]]] = {}  # name -> [(observedGeneration, time)]
        self.generation: dict[str, int] = {}
        self.workloads: dict[str, set[str]] = {}
        self.children_at: dict[str, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        for target in (self._watch_crs, self._watch_deployments):
            threading.Thread(target=target, daemon=True).start()

    def _loop(self, list_fn, handle) -> None:
        """Watch from where the last stream ended (its resourceVersion). A new watch without one replays every
        object in the namespace as ADDED: at 500 CRs and 1,000 Deployments that replay, every 60 s, held this
        process's view seconds behind the cluster (a probe's latency of 12 s when the operator took 4.5)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        rv = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                kwargs = {"timeout_seconds": 60, "deserialize": False}
                if rv:
                    kwargs["resource_version"] = rv
                for ev in w.stream(list_fn, self.ns, **kwargs):
                    obj = ev["raw_object"] if "raw_object" in ev else ev["object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    handle(ev["type"], obj)
                    if self._stop.is_set():
                        return
            except ApiException as exc:
                if exc.status == 410:
                    rv = None  # too old: start over from a fresh listing
                print(f"  (watch restarted: {exc.status} {exc.reason})", file=sys.stderr)
                time.sleep(0.5)
            except Exception as exc:  # a broken stream: resume
                print(f"  (watch restarted: {exc.__class__.__name__})", file=sys.stderr)
                time.sleep(0.5)

    def _watch_crs(self) -> None:
        def handle(kind, obj):
            now = time.time()
            name = obj["metadata"]["name"]
            with self.lock:
                self.generation[name] = obj["metadata"].get("generation", 1)
                og = (obj.get("status") or {}).get("observedGeneration")
                if og is not None:
                    seen = self.observed.setdefault(name, [])
                    if not seen or seen[-1][0] != og:
                        seen.append((og, now))
        self._loop(lambda ns, **kw: self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw),
                   handle)

    def _watch_deployments(self) -> None:
        def handle(kind, obj):
            now = time.time()
            owner = (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/instance")
            if owner is None or kind == "DELETED":
                return
            with self.lock:
                names = self.workloads.setdefault(owner, set())
                names.add(obj["metadata"]["name"])
                if len(names) >= self.per_cr and owner not in self.children_at:
                    self.children_at[owner] = now
        self._loop(self.apps.list_namespaced_deployment, handle)

    def observed_at(self, name: str, generation: int) -> float | None:
        with self.lock:
            return next((t for og, t in self.observed.get(name, []) if og >= generation), None)

    def stop(self) -> None:
        self._stop.set()


def example_cr(path: Path, name: str) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name}
    return doc


def workloads_of(doc: dict) -> int:
    from v41flash.api import v1alpha1 as api
    from v41flash.render import render
    obj = api.V41FlashDeployment.model_validate({**doc, "metadata": {**doc["metadata"], "namespace": "x", "uid": "u"}})
    return sum(1 for o in render(obj) if o["kind"] in ("Deployment", "LeaderWorkerSet"))


class Bench:
    def __init__(self, args):
        from kubernetes import client, config
        self.args = args
        self.kubeconfig = str(args.kubeconfig)
        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        self.api_client = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.example = Path(args.example)
        self.phases = parse_phases(getattr(args, "phases", ",".join(PHASES)))
        self.t0 = time.perf_counter()

    def say(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    # -- cluster-wide helpers
    def kubectl(self, *a: str, input: str | None = None) -> str:
        kubectl = REPO / ".venv" / "bin" / "kubectl"
        return subprocess.run([str(kubectl if kubectl.exists() else "kubectl"), f"--kubeconfig={self.kubeconfig}",
                               *a], input=input, capture_output=True, text=True, check=True).stdout

    def apiserver_writes(self) -> dict[str, float]:
        text = self.kubectl("get", "--raw", "/metrics")
        out: dict[str, float] = {}
        for (name, labels), v in parse_metrics(text).items():
            lab = dict(labels)
            if name == "apiserver_request_total" and lab.get("verb") in WRITE_VERBS and \
                    lab.get("resource") in OPERATOR_RESOURCES:
                key = f"{lab['verb']} {lab['resource']}{'/' + lab['subresource'] if lab.get('subresource') else ''}"
                out[key] = out.get(key, 0.0) + v
        return out

    def cordon(self, on: bool, nodes: list[str]) -> None:
        for n in nodes:
            self.core.patch_node(n, {"spec": {"unschedulable": on}})

    # -- the operator under test
    def start_operator(self, ns: str, log_path: Path) -> tuple[subprocess.Popen, int]:
        port, health = _free_port(), _free_port()
        argv = [str(REPO / ".venv" / "bin" / "v41flash"), "operator", "--kubeconfig", self.kubeconfig,
                "--bind-address", "127.0.0.1", "--metrics-port", str(port), "--health-port", str(health),
                "-n", ns, "--leader-election-namespace", ns, "--log-format", "json"]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with open(log_path, "ab") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"the operator exited ({p.returncode}); see {log_path}")
            try:
                self.operator_metrics(port)
                if "holds Lease" in log_path.read_text(errors="replace"):
                    return p, port
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the operator did not become leader in 60 s; see {log_path}")

    @staticmethod
    def operator_metrics(port: int) -> dict:
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return parse_metrics(r.read().decode())

    def wait_at_rest(self, port: int, timeout: float) -> float:
        """Seconds until the operator was at rest (AtRest); raises after `timeout`."""
        rest, t0 = AtRest(), time.monotonic()
        while not rest.sample(time.monotonic(), self.operator_metrics(port)):
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the operator was not at rest within {timeout:.0f} s (no {REST_QUIET_S:g} s with "
                                   f"no pass queued or running)")
            time.sleep(REST_SAMPLE_S)
        return time.monotonic() - t0

    def wait_settled(self, ns: str, port: int, timeout: float) -> float:
        """Seconds until the namespace settled (no writer but the operator — the controller-manager making and
        counting pods, the scheduler's verdicts — changed an object for SETTLE_QUIET_S) and the operator was at
        rest by its own gauges."""
        t0 = time.monotonic()
        settle(lambda: namespace_snapshot(self.api_client, ns, GROUP, VERSION, PLURAL), FIELD_MANAGER,
               SETTLE_QUIET_S, SETTLE_SAMPLE_S, timeout)
        self.wait_at_rest(port, timeout)
        return time.monotonic() - t0

    # -- phases
    def create_all(self, ns: str, names: list[str]) -> dict[str, float]:
        sent: dict[str, float] = {}

        def one(name: str) -> None:
            body = example_cr(self.example, name)
            sent[name] = time.time()
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, names))
        return sent

    def wait_converged(self, w: Watcher, sent: dict[str, float], generation: dict[str, int], timeout: float,
                       children: bool = True) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last_report = time.monotonic()
        while True:
            obs = {n: w.observed_at(n, generation[n]) for n in sent}
            kids = {n: w.children_at.get(n) for n in sent} if children else {}
            done = sum(1 for t in obs.values() if t) + (sum(1 for t in kids.values() if t) if children else len(sent))
            if done == 2 * len(sent) or time.monotonic() > deadline:
                break
            if time.monotonic() - last_report > 10:
                self.say(f"  {sum(1 for t in obs.values() if t)}/{len(sent)} observed")
                last_report = time.monotonic()
            time.sleep(0.2)
        lat_obs = [obs[n] - sent[n] for n in sent if obs[n]]
        lat_kids = [kids[n] - sent[n] for n in sent if children and kids.get(n)]
        ends = [t for t in obs.values() if t]
        return {"apply_to_observed_s": summary(lat_obs),
                "apply_to_children_s": summary(lat_kids) if children else None,
                "all_converged_s": (max(ends) - min(sent.values())) if len(ends) == len(sent) else None,
                "not_converged": len(sent) - len(ends)}

    def run_one(self, n: int, out: Path) -> dict[str, Any]:
        ns = f"bench-op-{n}-{int(time.time()) % 100000}"
        self.core.create_namespace({"metadata": {"name": ns}})
        log_path = out / f"operator-{n}.log"
        per_cr = workloads_of(example_cr(self.example, "x"))
        op, port = self.start_operator(ns, log_path)
        proc = Proc(op.pid)
        w = Watcher(self.api_client, ns, per_cr)
        result: dict[str, Any] = {"deployments": n, "namespace": ns, "workloads_per_cr": per_cr}
        try:
            time.sleep(1.0)
            base_rss = proc.rss_mb()

            def phase(name: str, fn):
                cpu0, m0 = proc.cpu_s(), self.operator_metrics(port)
                proc.reset_peak()
                t = time.perf_counter()
                res = fn()
                res["wall_s"] = time.perf_counter() - t
                m = delta(self.operator_metrics(port), m0)
                res["operator_cpu_s"] = proc.cpu_s() - cpu0
                res["operator_peak_rss_mb"] = proc.peak_rss_mb
                res["api_requests"] = {dict(k[1])["verb"]: v for k, v in m.items()
                                       if k[0] == "v41flash_api_requests_total" and v}
                res["reconcile_s"] = {t_: histogram(m, "v41flash_reconcile_duration_seconds", trigger=t_)
                                      for t_ in ("create", "update", "resume", "periodic", "observe", "child",
                                                 "retry", "planner")
                                      if histogram(m, "v41flash_reconcile_duration_seconds", trigger=t_)["count"]}
                res["periodic_cycle_s"] = histogram(m, "v41flash_periodic_cycle_seconds")
                res["pass_wait_s"] = {p_: histogram(m, "v41flash_pass_wait_seconds", priority=p_)
                                      for p_ in ("urgent", "background")}
                res["pass_deadline_exceeded"] = sum(v for k, v in m.items()
                                                    if k[0] == "v41flash_pass_deadline_exceeded_total")
                result[name] = res
                obs = res.get("apply_to_observed_s") or {}
                self.say(f"N={n} {name}: {json.dumps({k: obs.get(k) for k in ('p50', 'p99', 'max')})} "
                         f"all={res.get('all_converged_s')} cpu={res['operator_cpu_s']:.1f}s "
                         f"rss={res['operator_peak_rss_mb']:.0f}MB")
                return res

            names = [f"load-{i:04d}" for i in range(n)]

            def burst():
                sent = self.create_all(ns, names)
                res = self.wait_converged(w, sent, {k: 1 for k in sent}, self.args.timeout)
                res["api_requests_per_deployment"] = None
                return res
            b = phase("burst", burst)
            b["api_requests_per_deployment"] = sum(b["api_requests"].values()) / n

            from v41flash.controller.config import OperatorConfig
            tick_s = OperatorConfig().timer_interval_seconds  # the operator above runs with the default

            def probes(prefix: str, at_rest: bool):
                lat_obs, lat_kids, rest_waits, delays = [], [], [], []
                rng = random.Random(n)  # the same delays for the same N, run after run
                for i in range(PROBES):
                    if at_rest:
                        rest_waits.append(self.wait_at_rest(port, self.args.timeout))
                        # at rest the operator still ticks (500 observe passes every timer interval):
                        # an apply right after the quiet stretch would always miss the next tick's cycle
                        delays.append(rng.uniform(0.0, tick_s))
                        time.sleep(delays[-1])
                    name = f"{prefix}-{i:02d}"
                    sent = self.create_all(ns, [name])
                    r = self.wait_converged(w, sent, {name: 1}, 60)
                    lat_obs += [r["apply_to_observed_s"]["max"]] if r["apply_to_observed_s"]["n"] else []
                    lat_kids += [r["apply_to_children_s"]["max"]] if r["apply_to_children_s"]["n"] else []
                out = {"apply_to_observed_s": summary(lat_obs), "apply_to_children_s": summary(lat_kids)}
                if at_rest:
                    out["at_rest"] = {"quiet_s": REST_QUIET_S, "gauges": list(REST_GAUGES),
                                      "first_rest_after_s": rest_waits[0], "rest_wait_s": summary(rest_waits),
                                      "then_random_delay_s": summary(delays), "tick_s": tick_s}
                return out
            probe_prefix = {"one_more": "probe", "one_more_at_rest": "rest"}
            if "one_more" in self.phases:
                phase("one_more", lambda: probes("probe", at_rest=False))
            if "one_more_at_rest" in self.phases:
                phase("one_more_at_rest", lambda: probes("rest", at_rest=True))

            def idle():
                # the window opens once the burst (and any probes) settled: the operator at rest by its own
                # gauges, so what follows is what it writes with nothing new to say
                settle_s = self.wait_settled(ns, port, self.args.timeout)
                before, snap = self.apiserver_writes(), namespace_snapshot(self.api_client, ns, GROUP, VERSION, PLURAL)
                time.sleep(self.args.idle_seconds)
                after, snap_after = self.apiserver_writes(), namespace_snapshot(self.api_client, ns, GROUP, VERSION,
                                                                                PLURAL)
                requests = {k: v for k, v in delta(after, before).items() if v}
                changed = sorted(k for k, o in snap_after.items()
                                 if (snap.get(k) or {}).get("metadata", {}).get("resourceVersion")
                                 != o["metadata"].get("resourceVersion"))
                ours = writes_by(FIELD_MANAGER, snap, snap_after)
                return {"idle_seconds": self.args.idle_seconds, "settled_after_s": settle_s,
                        "objects_written": len(changed), "objects_written_sample": changed[:20],
                        "operator_writes": len(ours),
                        "operator_writes_per_min": len(ours) * 60.0 / self.args.idle_seconds,
                        "operator_writes_by_field": writes_summary(ours),
                        "operator_writes_sample": [{"object": w.key, "moved": list(w.paths)} for w in ours[:20]],
                        "apiserver_write_requests": requests,  # includes no-op server-side applies
                        "apiserver_write_requests_total": sum(requests.values())}
            if "idle" in self.phases:
                idle_res = phase("idle", idle)
                idle_res["operator_write_requests"] = sum(v for k, v in idle_res["api_requests"].items()
                                                          if k != "GET")

            everyone = names + [f"{prefix}-{i:02d}" for p, prefix in probe_prefix.items() if p in self.phases
                                for i in range(PROBES)]

            def change():
                sent: dict[str, float] = {}
                gen: dict[str, int] = {}

                def one(name: str) -> None:
                    sent[name] = time.time()
                    obj = self.custom.patch_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, name, {"spec": {"decode": {"maxReplicas": 3}}})
                    gen[name] = obj["metadata"]["generation"]
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(one, everyone))
                return self.wait_converged(w, sent, gen, self.args.timeout, children=False)
            if "spec_change" in self.phases:
                phase("spec_change", change)

            def delete():
                self.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
                deadline = time.monotonic() + self.args.timeout
                while time.monotonic() < deadline:
                    left = len(self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"])
                    kids = len(self.apps.list_namespaced_deployment(ns).items)
                    if not left and not kids:
                        break
                    time.sleep(1)
                return {"crs_left": left, "workloads_left": kids}
            if "delete" in self.phases:
                phase("delete", delete)
            result["operator_rss_mb"] = {"start": base_rss, "peak": max(
                result[p]["operator_peak_rss_mb"] for p in self.phases)}
        finally:
            w.stop()
            proc.stop()
            op.send_signal(signal.SIGTERM)
            try:
                op.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(op.pid, signal.SIGKILL)
            self.core.delete_namespace(ns)
        return result


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = [r["deployments"] for r in runs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for phase, style in (("burst", "-"), ("one_more", "--"), ("one_more_at_rest", ":")):
        if not all(phase in r for r in runs):
            continue
        for q, marker in (("p50", "o"), ("p99", "s")):
            ys = [r[phase]["apply_to_observed_s"][q] for r in runs]
            ax.plot(ns, ys, style, marker=marker, label=f"{phase.replace('_', ' ')} apply→observed {q}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("deployments (N)")
    ax.set_ylabel("seconds")
    ax.set_title("v41flash operator: apply → observed status vs N (nodes cordoned)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # so the operator is stopped and the nodes uncordoned


def run(args) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = [int(x) for x in str(args.deployments).split(",") if x.strip()]
    try:
        parse_phases(args.phases)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    b = Bench(args)
    nodes = [n.metadata.name for n in b.core.list_node().items]
    was = {n.metadata.name: bool(n.spec.unschedulable) for n in b.core.list_node().items}
    b.say(f"cordoning {len(nodes)} nodes (pods stay Pending: no simulators in the figure)")
    b.cordon(True, nodes)
    if not args.pods:
        b.say("pod controllers off (no ReplicaSets or pods: the apiserver's work is the operator's)")
        subprocess.run([sys.executable, "-m", "e2e.harness", "pod-controllers", "off"], cwd=REPO, check=True)
    runs = []
    try:
        for n in counts:
            b.say(f"N={n}: {', '.join(b.phases)} (one more ×{PROBES}, idle {args.idle_seconds:g}s)")
            runs.append(b.run_one(n, out))
            (out / "report.json").write_text(json.dumps({"runs": runs, "example": str(args.example), "pods": bool(args.pods),
                                                         "cpus": os.cpu_count()}, indent=2))
    finally:
        for n in nodes:
            if not was[n]:
                b.core.patch_node(n, {"spec": {"unschedulable": False}})
        if not args.pods:
            subprocess.run([sys.executable, "-m", "e2e.harness", "pod-controllers", "on"], cwd=REPO, check=True)
    plot(runs, out / "latency_vs_n.png")
    print(table(runs))
    print(f"report: {out / 'report.json'}; plot: {out / 'latency_vs_n.png'}")
    return 0


def _per_min(idle: dict) -> str:
    """The operator's own writes per minute in the idle window (what its managedFields say it wrote)."""
    v = idle.get("operator_writes_per_min")
    return "-" if v is None else f"{v:.1f}"


def table(runs: list[dict]) -> str:
    """The printed summary: one line per N (one more: right after the burst / at rest)."""
    lines = [f"{'N':>5} {'burst obs p50/p99':>18} {'all conv':>9} {'one-more obs p50/p99':>21} "
             f"{'children p50/p99':>17} {'at rest obs p50/p99':>20} {'rest after':>10} "
             f"{'change p99':>10} {'cycle max':>9} {'RSS MB':>7} {'req/dep':>7} {'idle W/min':>10}"]
    for r in runs:
        f = lambda d, q: "-" if d is None or d.get(q) is None else f"{d[q]:.2f}"  # noqa: E731
        one, rest, change, idle = (r.get(p) or {} for p in ("one_more", "one_more_at_rest", "spec_change", "idle"))
        rest_after = (rest.get("at_rest") or {}).get("first_rest_after_s")
        lines.append(
            f"{r['deployments']:>5} {f(r['burst']['apply_to_observed_s'], 'p50'):>8}/"
            f"{f(r['burst']['apply_to_observed_s'], 'p99'):<9} {str(round(r['burst']['all_converged_s'] or -1, 1)):>9} "
            f"{f(one.get('apply_to_observed_s'), 'p50'):>10}/{f(one.get('apply_to_observed_s'), 'p99'):<10} "
            f"{f(one.get('apply_to_children_s'), 'p50'):>8}/{f(one.get('apply_to_children_s'), 'p99'):<8} "
            f"{f(rest.get('apply_to_observed_s'), 'p50'):>9}/{f(rest.get('apply_to_observed_s'), 'p99'):<10} "
            f"{'-' if rest_after is None else f'{rest_after:.0f}s':>10} "
            f"{f(change.get('apply_to_observed_s'), 'p99'):>10} "
            f"{(idle.get('periodic_cycle_s') or {}).get('max_le', '-')!s:>9} {r['operator_rss_mb']['peak']:>7.0f} "
            f"{r['burst']['api_requests_per_deployment']:>7.1f} {_per_min(idle):>10}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("operator", help="Load the operator with N deployments on the local cluster (nodes cordoned).",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", default="10,100,500", help="N, or a comma-separated list of N (default: %(default)s)")
    p.add_argument("--kubeconfig", default=str(REPO / "e2e" / ".state" / "kubeconfig"),
                   help="the local cluster (`make up`; default: %(default)s)")
    p.add_argument("--example", default=str(REPO / "manifests" / "examples" / "aggregated-h200.yaml"),
                   help="the CR copied N times (default: %(default)s)")
    p.add_argument("--idle-seconds", type=float, default=90.0, help="quiet window for the write count")
    p.add_argument("--timeout", type=float, default=600.0, help="per phase")
    p.add_argument("--pods", action="store_true",
                   help="leave the controller-manager's pod-making controllers on (1,000s of Pending pods in the figure)")
    p.add_argument("--phases", default=",".join(PHASES),
                   help="which phases to run, comma-separated, in their fixed order (burst always; default: %(default)s)")
    p.add_argument("--out", default="bench-operator", help="output directory (report.json, latency_vs_n.png)")
    p.set_defaults(func=run)
