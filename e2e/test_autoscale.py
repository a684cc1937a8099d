"""SLO autoscaling on the real control plane: closed-loop load through the router against the simulated
engines breaches the TTFT target, the planner adds replicas, the new pods become Ready and the observed
TTFT recovers; when the load stops every scaled role walks back to min (prefill one replica per step:
3 → 2 → 1), and no request fails on the way.

The capacity profile comes from e2e/autoscale/sim-profile.yaml (fitted by `v41flash profile build` from
e2e/autoscale/calibrate.py's measurement of the simulators) through spec.autoscaling.capacityProfile.
A timeline (every few seconds: load, status.slo, replicas ready/desired per role, the last decision) is
printed and written to <artifacts>/autoscale-timeline-<time>.{txt,json}.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.autoscale.calibrate import DECODE_MAX_NUM_SEQS, DECODE_SIM_ARGS, PREFILL_MAX_NUM_SEQS, PREFILL_SIM_ARGS
from e2e.engine_pods import SIM_KV_TRANSFER_MS, SIM_ROLE_LATENCY
from e2e.kit import wait_for
from e2e.tools import VENV_BIN
from v41flash_bench.serve import records as R
from v41flash_bench.serve.simcheck import configured

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "e2e" / "autoscale" / "sim-profile.yaml"
NAME = "slo-autoscale"
MODEL = "deepseek-v4.1-flash"

# SLO and planner cadence: short enough for a ~6-minute test, long enough for complete windows.
TTFT_TARGET_S = 0.5  # a TTFT bucket boundary of the simulator's histogram: p90 above it is a clear breach
E2E_P95_S = 6.0
WINDOW_S = 30
INTERVAL_S = 10
SCALE_DOWN_STABILIZATION_S = 60
MIN_REPLICAS = 1
MAX_REPLICAS = 3

# Load: CLIENTS closed-loop tasks for LOAD_S seconds, each sending one request after another. A prefill
# alone takes ~0.28 s (0.37/0.47/0.56 s with 2/3/4 running, the simulator's max-num-seqs): TTFT p90 is
# over 0.5 s when more than a tenth of the prefills run 4 at a time. With a third of each client's time in
# prefill that is common on one prefill replica and rare on three.
CLIENTS = 8
LOAD_S = 135
PROMPT_WORDS = 1000
OUTPUT_TOKENS = 64
IDLE_TIMEOUT_S = 270  # after the load: time allowed for the walk back to min (~190 s in the recorded runs)
SAMPLE_S = 3.0
PASS_SLACK_S = 25  # a planner pass (INTERVAL_S, on the operator's periodic tick) plus a slow scrape on a busy machine
WORDS = [f"w{i}" for i in range(5000)]


def _sim_env(args: str) -> list[dict]:
    return [{"name": "V41F_SIM_ARGS", "value": args}] if args else []


def deployment() -> dict:
    return {
        "apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": NAME},
        "spec": {
            "profile": "low-latency",
            "model": {"servedModelName": MODEL},
            "gpu": {"product": "H200"},
            # the simulators' flags as calibrate.py measured them (V41F_SIM_ARGS is read by the e2e supervisor)
            "prefill": {"minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS, "maxNumSeqs": PREFILL_MAX_NUM_SEQS,
                        "extraEnv": _sim_env(PREFILL_SIM_ARGS)},
            "decode": {"minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS, "maxNumSeqs": DECODE_MAX_NUM_SEQS,
                       "extraEnv": _sim_env(DECODE_SIM_ARGS)},
            # even spread: every client is its own session, so hashing 12 sessions onto 3 engines is lumpy
            "routing": {"policy": "round_robin", "decodePolicy": "round_robin"},
            "slo": {"ttft": {"targetSeconds": TTFT_TARGET_S, "percentile": 90}, "e2eP95Seconds": E2E_P95_S,
                    "windowSeconds": WINDOW_S},
            # outage memory off: the load's end is a collapse, and this test times the walk back to min (the memory's
            # hold is tests/test_planner_unseen.py's)
            "autoscaling": {"intervalSeconds": INTERVAL_S, "scaleDownStabilizationSeconds": SCALE_DOWN_STABILIZATION_S,
                            "capacityProfile": "sim-capacity-profile", "outageMemorySeconds": 0},
        },
    }


def ready_cr(cluster, ns: str, name: str) -> dict | None:
    """The CR when its Ready condition is True, else None (for wait_for)."""
    cr = cluster.kubectl_json("get", "v41f", name, "-n", ns)
    c = next((c for c in (cr.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)
    return cr if c and c["status"] == "True" else None


def _parse_iso(s: str | None) -> float | None:
    try:
        return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


@dataclass
class Load:
    """Closed-loop clients through the router; counts every answer and every failure."""
    url: str
    clients: int = 0  # tasks running now
    ok: int = 0
    failed: list = field(default_factory=list)  # (time, status or exception text)
    latencies: list = field(default_factory=list)  # (finish time, seconds)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rate(self, since: float) -> float:
        with self.lock:
            return sum(1 for t, _ in self.latencies if t >= since) / max(1e-9, time.time() - since)

    def p95(self, since: float) -> float | None:
        """Client-side p95 request latency of the requests that finished since then (None: none did)."""
        with self.lock:
            lat = sorted(x for t, x in self.latencies if t >= since)
        return lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None

    async def client(self, i: int, until: float, http: httpx.AsyncClient) -> None:
        rng = random.Random(i)
        with self.lock:
            self.clients += 1
        try:
            while time.time() < until:
                # unique words per request: the simulator's prefix cache must not shorten prefill
                body = {"model": MODEL, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                        "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=PROMPT_WORDS))}]}
                t0 = time.time()
                try:
                    r = await http.post(f"{self.url}/v1/chat/completions", json=body,
                                        headers={"x-session-id": f"client-{i}"})
                    status = r.status_code
                except httpx.HTTPError as e:  # a timeout or a reset connection is a failed request too
                    status = f"{e.__class__.__name__}: {e}"
                with self.lock:
                    if status == 200:
                        self.ok += 1
                        self.latencies.append((time.time(), time.time() - t0))
                    else:
                        self.failed.append((time.time(), str(status)))
        finally:
            with self.lock:
                self.clients -= 1

    def run(self, clients: int, seconds: float) -> None:
        async def main():
            until = time.time() + seconds
            async with httpx.AsyncClient(timeout=httpx.Timeout(60.0),
                                         limits=httpx.Limits(max_connections=clients + 4)) as http:
                await asyncio.gather(*[self.client(i, until, http) for i in range(clients)])
        asyncio.run(main())


class Timeline:
    """Samples the CR every SAMPLE_S seconds in a thread; rows are plain dicts."""

    def __init__(self, cluster, ns: str, load: Load, t0: float):
        self.cluster, self.ns, self.load, self.t0 = cluster, ns, load, t0
        self.rows: list[dict] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - an apiserver hiccup costs one row, not the test
                print(f"[timeline] sample failed: {e}", flush=True)
            self.stop.wait(SAMPLE_S)

    def sample(self) -> dict:
        cr = self.cluster.custom.get_namespaced_custom_object("v41flash.io", "v1alpha1", self.ns,
                                                              "v41flashdeployments", NAME)
        st = cr.get("status") or {}
        slo, last = st.get("slo") or {}, st.get("lastDecision") or {}
        now = time.time()
        row = {"t": round(now - self.t0, 1), "time": now, "clients": self.load.clients,
               "rps": round(self.load.rate(now - 10), 2), "client_p95": self.load.p95(now - 10),
               "ttft": slo.get("ttftSeconds"), "e2e_p95": slo.get("e2eP95Seconds"),
               "action": last.get("action"), "decision_time": _parse_iso(last.get("time")),
               "reason": last.get("reason", ""), "decided_by": last.get("decidedBy") or {},
               "forecast_by": last.get("forecastBy") or {}}
        for role in ("prefill", "decode"):
            rs = st.get(role) or {}
            row[f"{role}_ready"] = rs.get("readyReplicas")
            row[f"{role}_desired"] = rs.get("desiredReplicas")
        self.rows.append(row)
        print(self.format(row), flush=True)
        return row

    @staticmethod
    def header() -> str:
        return (f"{'t(s)':>6} {'clients':>7} {'req/s':>6} {'client p95':>10} {'TTFTp90':>8} {'e2e p95':>8} "
                f"{'prefill r/d':>11} {'decode r/d':>10}  last decision")

    @staticmethod
    def format(r: dict) -> str:
        def s(x):
            return f"{x:.3f}" if isinstance(x, (int, float)) else "-"
        return (f"{r['t']:>6.0f} {r['clients']:>7} {r['rps']:>6.2f} {s(r['client_p95']):>10} {s(r['ttft']):>8} "
                f"{s(r['e2e_p95']):>8} "
                f"{r['prefill_ready']}/{r['prefill_desired']:<9} {r['decode_ready']}/{r['decode_desired']:<8}  "
                f"{r['action'] or '-'}")

    def table(self) -> str:
        return "\n".join([self.header(), *(self.format(r) for r in self.rows)])


def _serving(cluster, ns: str, doc: dict) -> Load:
    """Apply the deployment (with the simulators' capacity profile), wait until it is Ready and its router answers;
    a Load on its front."""
    cluster.kubectl("create", "configmap", "sim-capacity-profile", "-n", ns, f"--from-file=profile.yaml={PROFILE}")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

    wait_for(lambda: ready_cr(cluster, ns, NAME), 240, f"{ns}/{NAME} Ready")
    router_pod = wait_for(lambda: cluster.kubectl_json("get", "pods", "-n", ns, "-l",
                                                       f"v41flash.io/deployment={NAME},v41flash.io/role=router,v41flash.io/front=true")["items"],
                          60, "the router pod")[0]["metadata"]["name"]
    router = cluster.sim_for(router_pod, ns)
    load = Load(f"http://{router['ip']}:{router['port']}")
    # one request end to end before the clock starts (the router discovers engines asynchronously)
    wait_for(lambda: httpx.post(f"{load.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}).status_code == 200,
        90, "a 200 from the router")
    return load


def test_ttft_breach_scales_up_recovers_and_idle_returns_to_min(cluster, operator_process, ns):
    doc = deployment()
    load = _serving(cluster, ns, doc)

    t0 = time.time()
    timeline = Timeline(cluster, ns, load, t0)
    print("\n" + timeline.header(), flush=True)
    timeline.thread.start()
    try:
        load_thread = threading.Thread(target=load.run, args=(CLIENTS, LOAD_S))
        load_thread.start()
        load_thread.join(LOAD_S + 90)
        assert not load_thread.is_alive(), "load clients did not finish"
        load_end = time.time()

        def back_to_min():
            r = timeline.rows[-1] if timeline.rows else None
            return r and all(r[f"{role}_desired"] == MIN_REPLICAS == r[f"{role}_ready"] for role in ("prefill", "decode"))
        reached_min = True
        try:
            wait_for(back_to_min, IDLE_TIMEOUT_S, "every role back at min replicas", interval=SAMPLE_S)
        except AssertionError as e:  # judged below, after the timeline is written
            reached_min = False
            print(f"[e2e] {e}", flush=True)
    finally:
        timeline.stop.set()
        timeline.thread.join(15)
        events = sorted(cluster.kubectl_json("get", "events", "-n", ns, "--field-selector", "reason=Scaled")["items"],
                        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        report = (timeline.table() + "\n\nScaled events:\n" + "\n".join(
            f"  {e.get('lastTimestamp') or e.get('eventTime')}: {e['message']}" for e in events)
            + f"\n\nrequests: {load.ok} answered 200, {len(load.failed)} failed")
        out = cluster.cluster.artifacts
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        (out / f"autoscale-timeline-{stamp}.txt").write_text(report + "\n")
        (out / f"autoscale-timeline-{stamp}.json").write_text(json.dumps(
            {"t0": t0, "spec": doc["spec"], "clients": CLIENTS, "load_s": LOAD_S, "rows": timeline.rows,
             "events": [e["message"] for e in events], "ok": load.ok, "failed": load.failed}, indent=1))
        print(f"\n{report}\n[e2e] timeline written to {out}/autoscale-timeline-{stamp}.txt", flush=True)

    rows = timeline.rows
    assert load.ok > 0 and not load.failed, f"failed requests: {load.failed[:5]} ({len(load.failed)} in all)"

    # 1. the load breached the TTFT target (checked below: before any replica was added)
    breach = next((r for r in rows if r["ttft"] is not None and r["ttft"] > TTFT_TARGET_S
                   and r["time"] <= load_end), None)
    assert breach, "the load never pushed the observed TTFT p90 over the target"
    # 2. the planner scaled up: some role's desired replicas rose above min, with a scale_up decision
    up = next((r for r in rows if (r["prefill_desired"] or 0) > 1 or (r["decode_desired"] or 0) > 1), None)
    assert up and any(r["action"] == "scale_up" for r in rows), "no scale-up was observed"
    # ... and status said which rule decided it and what the demand sized for came from
    ups = [r for r in rows if r["action"] == "scale_up"]
    assert any("scale_up" in r["decided_by"].values() and r["forecast_by"] for r in ups), \
        [(r["decided_by"], r["forecast_by"]) for r in ups]
    assert breach["time"] <= up["time"], "the scale-up came before any observed breach"
    scaled = [role for role in ("prefill", "decode") if max(r[f"{role}_desired"] or 0 for r in rows) > 1]
    peak = {role: max(r[f"{role}_desired"] for r in rows) for role in scaled}
    # 3. the new pods became Ready while the load ran
    all_ready = next((r for r in rows if r["time"] >= up["time"] and r["time"] <= load_end and all(
        r[f"{role}_ready"] == r[f"{role}_desired"] > 1 for role in scaled)), None)
    assert all_ready, f"the added {scaled} replicas never all became Ready under load"
    # 4. the observed TTFT recovered below target on a window that began after they were Ready (status.slo
    # is rewritten every planner pass, so a sample WINDOW_S + PASS_SLACK_S later comes from such a window)
    recovered = next((r for r in rows if all_ready["time"] + WINDOW_S + PASS_SLACK_S <= r["time"] <= load_end
                      and r["ttft"] is not None and r["ttft"] <= TTFT_TARGET_S), None)
    assert recovered, "TTFT p90 never recovered below the target after the scale-up"
    # 5. after the load: every role back at min within IDLE_TIMEOUT_S, none ever below it, and prefill (which
    # sheds one replica per step, its prefix caches being costly to lose) walked down peak → … → min: 3 → 2 → 1
    assert reached_min, f"not every role back at {MIN_REPLICAS} replica(s) {IDLE_TIMEOUT_S}s after the load: {rows[-1]}"
    assert all((r[f"{role}_desired"] or MIN_REPLICAS) >= MIN_REPLICAS for r in rows for role in ("prefill", "decode"))
    after = [r for r in rows if r["time"] > load_end]
    for role in scaled:
        walk = [d for k, d in enumerate(r[f"{role}_desired"] for r in after)
                if k == 0 or d != after[k - 1][f"{role}_desired"]]
        assert walk[-1] == MIN_REPLICAS and walk == sorted(walk, reverse=True), f"{role} desired after the load: {walk}"
        if role == "prefill":
            assert walk == list(range(peak[role], MIN_REPLICAS - 1, -1)), f"prefill desired after the load: {walk}"
    # 6. both directions were explained as Events: "<role> 1->3: <reason>" ... "<role> 3->2: <reason>"; prefill's
    # scale-downs one replica each
    for role in scaled:
        moves = [(int(a), int(b)) for e in events for a, b in re.findall(rf"\b{role} (\d+)->(\d+):", e["message"])]
        assert any(b > a for a, b in moves) and any(b < a for a, b in moves), f"{role} Scaled events: {moves}"
        if role == "prefill":
            assert all(a - b == 1 for a, b in moves if b < a), f"prefill Scaled events: {moves}"


def test_a_restart_keeps_the_forecaster_s_history(cluster, operator_process, ns):
    """The learned season lives in status.plannerState.season: a restarted operator reads it back and keeps
    extending it, so a crash or a failover loses nothing. The history is seeded as a previous process left it
    (closed buckets, and the bucket it was filling when it died): the restarted operator's first sample of a
    later bucket closes that one and writes the history back, the seeded buckets in front."""
    cluster.kubectl("create", "configmap", "sim-capacity-profile", "-n", ns, f"--from-file=profile.yaml={PROFILE}")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(deployment()))

    def planner_state():
        st = cluster.kubectl_json("get", "v41f", NAME, "-n", ns).get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
        return st.get("plannerState") if ready else None
    wait_for(planner_state, 240, f"{ns}/{NAME} Ready with a planner decision in status")

    operator_process.stop(signal.SIGKILL)  # a crash: nothing is flushed on the way out
    bucket_s = 900.0
    now_bucket = int(time.time() // bucket_s)
    seeded = [1.5, None, 2.25, 3.0]
    season = {"bucketSeconds": bucket_s, "last": now_bucket - 3, "values": seeded,
              "open": [now_bucket - 1, 10.0, 4]}  # 2.5 req/s on average in the bucket it was filling
    cluster.custom.patch_namespaced_custom_object_status(
        "v41flash.io", "v1alpha1", ns, "v41flashdeployments", NAME, {"status": {"plannerState": {"season": season}}})
    operator_process.start()

    def extended():
        s = ((cluster.kubectl_json("get", "v41f", NAME, "-n", ns).get("status") or {}).get("plannerState") or {}) \
            .get("season") or {}
        return s if s.get("last") is not None and s["last"] >= now_bucket - 1 else None
    after = wait_for(extended, 120, "the restarted operator's planner to close the seeded open bucket")
    # the seeded buckets, an empty one for the bucket with no sample, then the closed one (2.5 req/s)
    assert after["values"][:6] == [*seeded, None, 2.5], after
    assert after["bucketSeconds"] == bucket_s

    operator_process.restart(signal.SIGKILL)  # and once more: what it wrote is what the next process reads
    t_restart = time.time()
    wait_for(lambda: time.time() - t_restart > 3 * INTERVAL_S, 3 * INTERVAL_S + 10, "three planner intervals")
    again = extended()
    assert again is not None and again["values"][:6] == after["values"][:6], again
    operator_process.assert_alive()


FIT_NAME = "bench-fit"
FIT_STEADY_CLIENTS = 2  # well inside one replica of each role: the SLO holds and the planner has nothing to add
# the planner learns from windows of WINDOW_S with enough finished requests, one per decision (INTERVAL_S), from
# the first whole window after it was enabled: 50 s of load passed in one CI run and failed in another (fewer than
# two learned per role within 60 s: decisions late on a loaded machine, the windows thinning once the load ends);
# 80 s holds about five decisions on whole windows
FIT_STEADY_S = 80


def _v41flash(cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run([str(VENV_BIN / "v41flash"), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "MPLBACKEND": "Agg"})
    print(f"$ v41flash {' '.join(args)}\n{r.stdout}{r.stderr[-3000:]}", flush=True)
    assert r.returncode == 0, f"v41flash {args[0]} {args[1]} exited {r.returncode}"
    return r


def test_a_profile_fitted_from_bench_serve_holds_the_slo_with_corrections_near_1(cluster, operator_process, ns,
                                                                                  tmp_path):
    """The README's path: deploy, measure (`bench serve` through the front), fit (`profile build` from the
    records), apply (`profile apply`: ConfigMap + spec.autoscaling.capacityProfile); then under steady load the
    planner, on the fitted profile, holds the SLO and learns corrections near 1 (the profile says what the engines
    do). The planner is off while the deployment is measured (fixed replicas: one variable at a time)."""
    doc = deployment()
    doc["metadata"]["name"] = FIT_NAME
    doc["spec"]["autoscaling"].pop("capacityProfile")
    doc["spec"]["autoscaling"]["enabled"] = False  # measured at fixed replicas, learning nothing of another profile
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))

    wait_for(lambda: ready_cr(cluster, ns, FIT_NAME), 240, f"{ns}/{FIT_NAME} Ready")
    run = tmp_path / "run"
    common = ["--deployment", FIT_NAME, "-n", ns, "--workload", "fixed", "--isl", "1000", "--osl", "64",
              "--repeats", "1", "--no-plots"]
    # measure: concurrency 1 (unqueued prefill), 4 and 12 (prefill saturated: its serial-equivalent slots)
    _v41flash(cluster, "bench", "serve", *common, "--concurrency", "1,4,12", "--warmup", "3", "--duration", "8",
              "--whole-sweep", "--out", str(run))
    recs = R.read(run)
    assert [r["workload"]["load"]["value"] for r in recs] == [1, 4, 12]
    assert all(r["figures"]["requests"]["success_rate"] == 1.0 for r in recs), [r["figures"]["requests"] for r in recs]
    one = recs[0]
    assert one["system"]["gpu_model"] == "H200" and one["target"]["serving_revision"]
    # the simulators' flags: prefill's TTFT (+ the KV hand-over), decode's inter-token latency; a loose bound here,
    # the 10 % comparison is the benchmark's (docs/benchmarking.md)
    flags = shlex.split(PREFILL_SIM_ARGS)  # the deployment's extra simulator flags override the role's
    per_token_us = float(flags[flags.index("--prefill-time-per-token") + 1].removesuffix("us"))
    prefill_lat = replace(SIM_ROLE_LATENCY["prefill"], prefill_us_per_token=per_token_us)
    want_ttft = configured(prefill_lat, one["figures"]["tokens"]["input"]["mean"],
                           kv_transfer_ms=SIM_KV_TRANSFER_MS)["ttft_s"]
    want_itl = SIM_ROLE_LATENCY["decode"].inter_token_ms / 1000
    got_ttft, got_itl = one["figures"]["latency"]["ttft_s"]["p50"], one["figures"]["latency"]["itl_s"]["p50"]
    print(f"[e2e] concurrency 1 through the front: TTFT p50 {got_ttft * 1000:.0f} ms (flags: {want_ttft * 1000:.0f} "
          f"ms), ITL p50 {got_itl * 1000:.1f} ms (flags: {want_itl * 1000:.1f} ms)", flush=True)
    # a sanity bound (measured 2026-12-07: TTFT 0.25 s against 0.33 s from the flags on a loaded machine, ITL +8 %):
    # the simulator's TTFT formula and ours differ in what they count; the comparison is the benchmark's
    assert 0.5 * want_ttft < got_ttft < 4.0 * want_ttft and 0.5 * want_itl < got_itl < 4.0 * want_itl

    profile = tmp_path / "profile.yaml"
    _v41flash(cluster, "profile", "build", "--from", str(run / "records.jsonl"), "--out", str(profile))
    _v41flash(cluster, "profile", "apply", "--from", str(profile), "--deployment", FIT_NAME, "-n", ns,
              "--enable-planner")
    cm = cluster.kubectl_json("get", "configmap", f"{FIT_NAME}-capacity-profile", "-n", ns)
    assert yaml.safe_load(cm["data"]["profile.yaml"])["kind"] == "CapacityProfile"
    t_applied = time.time()

    steady = tmp_path / "steady"
    _v41flash(cluster, "bench", "serve", *common, "--concurrency", str(FIT_STEADY_CLIENTS), "--warmup", "0",
              "--duration", str(FIT_STEADY_S), "--out", str(steady), timeout=FIT_STEADY_S + 120)
    (held,) = R.read(steady)
    assert held["figures"]["requests"]["success_rate"] == 1.0

    def learned():
        st = cluster.kubectl_json("get", "v41f", FIT_NAME, "-n", ns).get("status") or {}
        ps, last = st.get("plannerState") or {}, st.get("lastDecision") or {}
        t = _parse_iso(last.get("time"))
        ok = t and t > t_applied and all((ps.get(r) or {}).get("corrections_learned", 0) >= 2 for r in ("prefill", "decode"))
        return st if ok else None
    st = wait_for(learned, 60, "two learned corrections per role on the fitted profile")
    ps = st["plannerState"]
    corr = {r: ps[r]["correction"] for r in ("prefill", "decode")}
    print(f"[e2e] fitted profile: corrections {corr}; status.slo {st.get('slo')}; last decision "
          f"{st['lastDecision']}; client TTFT p90 {held['figures']['latency']['ttft_s']['p90']:.3f} s", flush=True)
    assert all(0.67 <= k <= 1.5 for k in corr.values()), corr
    assert st["slo"]["ttftSeconds"] <= TTFT_TARGET_S and held["slo"]["met"], (st["slo"], held["slo"])
    # the replicas are the planner's call (measured 2026-12-07: prefill 1 -> 3 at ~2 req/s, where one replica
    # held TTFT p90 0.40 s in the sweep: its queueing model is more cautious than the simulator's parallel prefill)


DRA_EXAMPLE = REPO / "manifests" / "examples" / "tp4-h200-dra.yaml"
DRA_BUDGET = 12  # the example's: decode's 4 GPUs and two prefill replicas of 4; the breach above wants a third


def _gpus_claimed(cluster, ns: str, pod) -> set[str]:
    """The H200 devices a pod's GPU claim was allocated (spec.gpu.allocation DRA), checked to be on its node."""
    from kubernetes import client
    (status,) = [s for s in pod.status.resource_claim_statuses or [] if s.name == "gpus"]
    claim = client.ResourceV1Api(cluster.api).read_namespaced_resource_claim(status.resource_claim_name, ns)
    results = claim.status.allocation.devices.results
    assert {(r.driver, r.pool) for r in results} == {("gpu.nvidia.com", pod.spec.node_name)}, results
    return {f"{r.pool}/{r.device}" for r in results}


def test_dra_claims_hold_the_h200_gpus_and_the_planner_keeps_to_the_gpu_budget(cluster, operator_process, ns):
    """The H200 example with spec.gpu.allocation: DRA (docs/decisions/2026-12-07-compute-domains.md): every engine pod
    is scheduled by its claim, no nvidia.com/gpu requested, 4 H200 devices each; under the TTFT breach of the test
    above the planner wants a third prefill replica, which gpuBudget 12 does not allow: it clamps to 2 and says so."""
    example = yaml.safe_load(DRA_EXAMPLE.read_text())["spec"]
    assert example["gpu"]["allocation"] == "DRA" and example["autoscaling"]["gpuBudget"] == DRA_BUDGET
    doc = deployment()  # the simulators' calibrated flags and profile, on the example's GPUs and budget
    doc["spec"]["gpu"] = example["gpu"]
    doc["spec"]["decode"].update(minReplicas=1, maxReplicas=1)
    doc["spec"]["autoscaling"]["gpuBudget"] = example["autoscaling"]["gpuBudget"]
    t0 = time.monotonic()
    load = _serving(cluster, ns, doc)

    def engine_pods():
        pods = cluster.core.list_namespaced_pod(ns, label_selector=f"v41flash.io/deployment={NAME},"
                                                                   "v41flash.io/role in (prefill,decode)").items
        return [p for p in pods if not p.metadata.deletion_timestamp]
    for p in engine_pods():
        limits = p.spec.containers[0].resources.limits or {}
        assert "nvidia.com/gpu" not in limits and [c.name for c in p.spec.containers[0].resources.claims] == ["gpus"]
        assert len(_gpus_claimed(cluster, ns, p)) == 4
    seen: list[tuple[int, str]] = []  # (prefill desired, last decision's reason)

    def clamped():
        st = cluster.kubectl_json("get", "v41f", NAME, "-n", ns).get("status") or {}
        seen.append(((st.get("prefill") or {}).get("desiredReplicas") or 0, (st.get("lastDecision") or {}).get("reason", "")))
        return seen[-1][0] == 2 and any(f"GPU budget {DRA_BUDGET}" in why for _, why in seen)

    def prefill_ready():
        pods = [p for p in engine_pods() if p.metadata.labels["v41flash.io/role"] == "prefill"]
        return pods if len(pods) == 2 and all(any(c.type == "Ready" and c.status == "True"
                                                  for c in p.status.conditions or []) for p in pods) else None
    # more clients than the test above: the planner must want a third prefill replica, not just a second
    load_thread = threading.Thread(target=load.run, args=(CLIENTS + 4, 60))
    load_thread.start()
    try:
        wait_for(clamped, 120, "a decision clamped to the GPU budget at 2 prefill replicas", interval=2)
        ready = wait_for(prefill_ready, 90, "2 prefill pods Ready")
    finally:
        load_thread.join(120)
    held = [_gpus_claimed(cluster, ns, p) for p in engine_pods()]
    assert len(held) == 3 and len(set().union(*held)) == 12, held  # 12 distinct GPUs: the budget, all claimed
    assert max(d for d, _ in seen) <= 2, seen
    assert not load.failed, load.failed[:5]
    print(f"\n[dra] H200 by claims: {len(ready)} prefill + 1 decode pods on {len(set().union(*held))} claimed GPUs; "
          f"clamped: {next(why for _, why in seen if f'GPU budget {DRA_BUDGET}' in why)!r}; {load.ok} requests, "
          f"{time.monotonic() - t0:.0f} s")
