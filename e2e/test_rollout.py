"""Revision-safe rollouts by the operator on the real control plane, under continuous multi-turn client load
through the deployment's router Service (docs/decisions/2026-12-01-rollouts.md; issue 10's Shows):

1. a model.revision change with surge room: canary step by step, promoted; 0 failed requests; every
   session on one revision until its revision is gone; the new revision's prefill and decode simulators
   each count exactly the requests the front sent to it (a cross-revision pair would count a request on
   one of them only); the old revision's pods gone; status walked through the phases;
5. a router-only and an SLO-only change: no rollout, no engine pod replaced;
2. a candidate that never becomes Ready: rolled back within the progress deadline, the serving revision
   never below one Ready replica per role, 0 failed requests;
3. a candidate that is Ready but too slow: rolled back at the gate, the figure and the target in the reason.

The client resolves the router Service to its newest Ready pod, as kube-proxy would to a Ready endpoint. A deleted
pod terminates as kubelet terminates it (e2e/supervisor.py): Ready False at once (the router's pod discovery drops
it), the engines' preStop drain, SIGTERM, then the pod goes; so every request must succeed, none is excused.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.kit import LoadThreads, wait_for
from e2e.test_operator import apply, condition, get_cr, wait_ready
from v41flash.api.v1alpha1 import DEFAULT_IMAGE, V41FlashDeployment
from v41flash.controller.kube import FIELD_MANAGER
from v41flash.render import render

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
REVISION = "v41flash.io/serving-revision"
# Short, so each Show takes about a minute or two: two steps of 8 s, 5 requests each, a 30 s drain.
ROLLOUT = {"steps": [50, 100], "stepSeconds": 8, "minRequestsPerStep": 5, "progressDeadlineSeconds": 45,
           "drainDeadlineSeconds": 20}


def _doc(name: str, example: str = "tp4-h200-low-latency", **rollout) -> dict:
    doc = yaml.safe_load((REPO / f"manifests/examples/{example}.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["rollout"] = {**ROLLOUT, **rollout}
    return doc


def _ready(p) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


def _engine_pods(cluster, ns: str, name: str) -> list:
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/serving=true")
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def _served(cluster, ns: str, pod: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    s = cluster.sim_for(pod, ns)
    text = httpx.get(f"http://{s['ip']}:{s['port']}/metrics", timeout=5).text
    return sum(x.value for fam in text_string_to_metric_families(text) for x in fam.samples
               if x.name in ("vllm:request_success", "vllm:request_success_total"))


class Load(LoadThreads):
    """Multi-turn sessions (3 turns each, a new session after the last) from `workers` threads through the
    router Service, each response's revision read from x-v41flash-revision ("" before the front exists);
    a sampler records, every second, the Ready engine replicas per revision and role."""

    def __init__(self, cluster, ns: str, name: str, model: str, workers: int = 4):
        super().__init__(workers)
        self.cluster, self.ns, self.name, self.model = cluster, ns, name, model
        self.ready_samples: list[dict] = []  # {(revision, role): ready pods}
        self.endpoint: tuple[str, str] | None = None  # (pod, base URL)

    def _resolve(self) -> None:
        svc = self.cluster.core.read_namespaced_service(f"{self.name}-router", self.ns)
        sel = ",".join(f"{k}={v}" for k, v in sorted(svc.spec.selector.items()))
        pods = [p for p in self.cluster.core.list_namespaced_pod(self.ns, label_selector=sel).items
                if _ready(p) and not p.metadata.deletion_timestamp and p.status.pod_ip]
        if pods:
            p = max(pods, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
            if self.endpoint is None or self.endpoint[0] != p.metadata.name:
                s = self.cluster.sim_for(p.metadata.name, self.ns)
                self.endpoint = (p.metadata.name, f"http://{s['ip']}:{s['port']}")
        sample: dict = {}
        for e in _engine_pods(self.cluster, self.ns, self.name):
            key = (e.metadata.labels.get(REVISION), e.metadata.labels.get("v41flash.io/role"))
            sample[key] = sample.get(key, 0) + int(_ready(e))
        with self.lock:
            self.ready_samples.append(sample)

    def _sampler(self) -> None:
        while not self.stop.is_set():
            try:
                self._resolve()
            except Exception:  # noqa: BLE001 - the apiserver busy for a moment: the next tick reads again
                pass
            self.stop.wait(0.5)

    def _worker(self, w: int) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                self._session(client, w)

    def _session(self, client: httpx.Client, w: int) -> None:
        session = f"w{w}-{uuid.uuid4().hex[:8]}"
        messages = [{"role": "user", "content": f"session {session}: plan the change"}]
        for turn in range(3):
            if self.stop.is_set():
                return
            endpoint = self.endpoint
            if endpoint is None:  # EndpointLoad: the Service has no Ready endpoint
                self.record({"session": session, "turn": turn, "pod": "", "t0": time.time(),
                             "t1": time.time(), "status": 0, "revision": "", "body": "no ready endpoint"})
                self.stop.wait(0.2)
                continue
            pod, base = endpoint
            t0 = time.time()
            rec = {"session": session, "turn": turn, "pod": pod, "t0": t0}
            try:
                r = client.post(f"{base}/v1/chat/completions", headers={"x-session-id": session},
                                json={"model": self.model, "max_tokens": 4, "messages": messages})
                rec.update(status=r.status_code, revision=r.headers.get("x-v41flash-revision", ""),
                           body=r.text[:200] if r.status_code != 200 else "")
                messages = [*messages, {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": f"turn {turn + 1}"}]
            except httpx.HTTPError as exc:
                rec.update(status=0, revision="", body=f"{type(exc).__name__}: {exc}")
            rec["t1"] = time.time()
            self.record(rec)

    def __enter__(self) -> "Load":
        wait_for(lambda: (self._resolve(), self.endpoint)[1], 60, "the router Service's Ready pod")
        return super().__enter__()

    def _extra_threads(self) -> list[threading.Thread]:
        return [threading.Thread(target=self._sampler, daemon=True)]

    def by_revision(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if r["status"] == 200:
                out[r["revision"]] = out.get(r["revision"], 0) + 1
        return out

    def session_revisions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in sorted(self.records, key=lambda r: r["t0"]):
            if r["status"] == 200 and r["revision"]:
                out.setdefault(r["session"], []).append(r["revision"])
        return out


class Phases(list):
    """The status.rollout phases seen, in order; .trail: every (phase, step, message) change, what an assertion
    on the phases prints (the message: status.rollout's, else the Reconciling condition's, where a live rollout
    says how it progresses)."""

    def __init__(self):
        super().__init__()
        self.trail: list[tuple[str, int, str]] = []


def _phases(cluster, ns: str, name: str, until, timeout: float, what: str, give_up: tuple[str, ...] = ()
            ) -> tuple[dict, Phases]:
    """Poll the CR until `until(cr)`, recording each status.rollout phase seen (in order); a phase in
    `give_up` fails at once (a rollback while waiting for completion)."""
    seen = Phases()
    deadline = time.monotonic() + timeout
    while True:
        cr = get_cr(cluster, ns, name)
        r = (cr.get("status") or {}).get("rollout") or {}
        phase = r.get("phase", "")
        if not seen or seen[-1] != phase:
            seen.append(phase)
        row = (phase, r.get("step", 0), r.get("message") or (condition(cr, "Reconciling") or {}).get("message", ""))
        if not seen.trail or seen.trail[-1] != row:
            seen.trail.append(row)
        if until(cr):
            return cr, seen
        if phase in give_up or time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}; phases seen {seen}; status "
                                 f"{yaml.safe_dump(r)}; trail {seen.trail}")
        time.sleep(0.5)


def _model(doc: dict) -> str:
    return doc["spec"]["model"].get("servedModelName") or doc["spec"]["model"]["checkpoint"]


def _until_complete(cluster, ns: str, name: str, old: str, timeout: float, what: str, pods_timeout: float
                    ) -> tuple[str, Phases]:
    """Wait for the rollout away from `old` to complete (a rollback fails at once) and for only the new
    revision's engine pods to be left (the old one's GPUs released); (the new revision, phases seen)."""
    cr, phases = _phases(cluster, ns, name, lambda cr: ((cr.get("status") or {}).get("rollout") or {}).get(
        "phase") == "Complete" and cr["status"]["servingRevision"] != old, timeout, what, ("RolledBack",))
    new = cr["status"]["servingRevision"]
    wait_for(lambda: {p.metadata.labels[REVISION] for p in _engine_pods(cluster, ns, name)} == {new}, pods_timeout,
             "only the new revision's engine pods left")
    return new, phases


def _promoted_and_drained(cluster, ns: str, name: str, phases: list[str]) -> str:
    """The rollout canaried, was promoted, drained the old revision and completed; the RolloutComplete message
    (how the drain ended). Draining is read from the Promoted event too: when the old revision's sessions have
    all ended by promotion (the last step sent every new session to the candidate), the next pass completes it,
    sooner than a poll of the CR may see."""
    assert "Canary" in phases and phases[-1] == "Complete", phases
    if "Draining" in phases:
        assert phases.index("Draining") > phases.index("Canary"), phases
    events = cluster.kubectl_json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    by_reason = {e["reason"]: e.get("message", "") for e in events["items"]}
    assert {"RolloutStarted", "StepPassed", "Promoted", "RolloutComplete"} <= set(by_reason), sorted(by_reason)
    assert "draining" in by_reason["Promoted"], by_reason["Promoted"]
    return by_reason["RolloutComplete"]


def _new_checkpoint_revision(spec: dict) -> None:
    spec["model"]["revision"] = "e2e-1017"


def _new_image(spec: dict) -> None:
    spec["image"] = "registry.example.com/vllm/vllm-openai:v0.33.0-patch1"  # same vLLM, a rebuilt image


@pytest.mark.parametrize("change", [_new_checkpoint_revision, _new_image], ids=["model.revision", "image"])
def test_show1_a_checkpoint_or_image_change_canaries_promotes_and_drains_with_no_failed_request(cluster, operator_process,
                                                                                                ns, change):
    name = "canary"
    doc = _doc(name)
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(8)
        change(doc["spec"])
        apply(cluster, doc, ns)
        # the old revision's pods gone (its GPUs released), the new one serving alone
        new, phases = _until_complete(cluster, ns, name, old, 240, "the rollout to complete", 60)
        load.wait_requests(8)
    drained = _promoted_and_drained(cluster, ns, name, phases)
    cr = wait_ready(cluster, ns, name)
    assert cr["status"]["rollout"]["servingSlot"] == "a" and cr["status"]["servingRevision"] == new
    assert load.failures() == [], load.failures()
    image = doc["spec"].get("image", DEFAULT_IMAGE)  # the examples leave the default
    assert all(image in {c.image for c in p.spec.containers} for p in _engine_pods(cluster, ns, name))
    print(f"\n[show1 {change.__name__}] {len(load.records)} requests, by revision {load.by_revision()}, "
          f"phases {phases} ({drained})")
    # every session stays on one revision while it serves: the only move is old -> new, once the old is gone
    for session, revs in load.session_revisions().items():
        changes = [(a, b) for a, b in zip(revs, revs[1:]) if a != b]
        assert all((a, b) == (old, new) for a, b in changes) and len(changes) <= 1, (session, revs)
    # no cross-revision pair: the new revision's prefill and decode each counted exactly its requests
    served = {}
    for p in _engine_pods(cluster, ns, name):
        role = p.metadata.labels["v41flash.io/role"]
        served[role] = served.get(role, 0) + _served(cluster, ns, p.metadata.name)
    sent = load.by_revision().get(new, 0)
    assert sent > 0 and served == {"prefill": sent, "decode": sent}, (served, sent)
    # the records: the serving revision and the previous one
    crs = cluster.kubectl_json("get", "controllerrevisions", "-n", ns, "-l", f"app.kubernetes.io/instance={name}")
    assert {c["metadata"]["labels"][REVISION] for c in crs["items"]} == {old, new}


def test_show5_router_and_slo_changes_restart_no_engine(cluster, operator_process, ns):
    name = "steady"
    doc = _doc(name)
    apply(cluster, doc, ns)
    revision = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    before = {p.metadata.name: p.metadata.uid for p in _engine_pods(cluster, ns, name)}
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["routing"] = {"policy": "round_robin", "decodePolicy": "power_of_two"}
        apply(cluster, doc, ns)
        wait_ready(cluster, ns, name)
        doc["spec"]["slo"]["e2eP95Seconds"] = 120
        apply(cluster, doc, ns)
        cr = wait_ready(cluster, ns, name)
        load.wait_requests(6)
        operator_process.wait_timer_passes(1)  # a rollout pass later: nothing replaced behind the Ready status
    assert {p.metadata.name: p.metadata.uid for p in _engine_pods(cluster, ns, name)} == before
    cr = get_cr(cluster, ns, name)
    assert cr["status"]["servingRevision"] == revision and "rollout" not in cr["status"]
    assert load.failures() == [], load.failures()
    print(f"\n[show5] {len(load.records)} requests through the router's own roll, none failed")


def _rolled_back(cr: dict) -> bool:
    return ((cr.get("status") or {}).get("rollout") or {}).get("phase") == "RolledBack"


def _serving_kept_a_replica(load: Load, revision: str) -> None:
    for sample in load.ready_samples:
        for role in ("prefill", "decode"):
            assert sample.get((revision, role), 0) >= 1, (role, sample)


def test_show2_a_candidate_never_ready_is_rolled_back_within_the_deadline(cluster, operator_process, ns):
    name = "never"
    doc = _doc(name, progressDeadlineSeconds=20)
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-broken"
        for role in ("prefill", "decode"):
            doc["spec"][role]["extraEnv"] = [{"name": "V41F_SIM_ARGS", "value": "--v41f-fail-start"}]
        apply(cluster, doc, ns)
        t0 = time.monotonic()
        cr, phases = _phases(cluster, ns, name, _rolled_back, 120, "the rollback")
        took = time.monotonic() - t0
        wait_for(lambda: {p.metadata.labels[REVISION] for p in _engine_pods(cluster, ns, name)} == {old}, 60,
                 "the candidate's pods gone")
        load.wait_requests(6)
    stalled = condition(cr, "Stalled") or {}
    assert stalled.get("status") == "True" and stalled["reason"] == "CandidateNotReady", stalled
    assert (condition(cr, "Ready") or {}).get("status") == "False"
    assert cr["status"]["servingRevision"] == old
    # the deadline (20 s) from the candidate's start, plus a pass or two
    assert took < 20 + 45, (took, phases)
    _serving_kept_a_replica(load, old)
    assert load.failures() == [], load.failures()
    assert set(load.by_revision()) <= {"", old}
    print(f"\n[show2] rolled back after {took:.0f} s ({stalled['message']}); {len(load.records)} requests")


def test_show3_a_candidate_too_slow_is_rolled_back_at_the_gate_naming_figure_and_target(cluster, operator_process, ns):
    name = "slow"
    doc = _doc(name)
    doc["spec"]["slo"]["ttft"] = {"targetSeconds": 1.0, "percentile": 90}
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    with Load(cluster, ns, name, _model(doc), workers=6) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-slow"
        doc["spec"]["prefill"]["extraEnv"] = [{"name": "V41F_SIM_ARGS", "value": "--v41f-latency-factor=150"}]
        apply(cluster, doc, ns)
        cr, phases = _phases(cluster, ns, name, _rolled_back, 180, "the gate's rollback")
        wait_for(lambda: {p.metadata.labels[REVISION] for p in _engine_pods(cluster, ns, name)} == {old}, 60,
                 "the candidate's pods gone")
    stalled = condition(cr, "Stalled") or {}
    assert stalled.get("status") == "True" and stalled["reason"] == "GateFailed", stalled
    assert "TTFT p90" in stalled["message"] and "> 1.00s target" in stalled["message"], stalled
    assert "Canary" in phases, phases
    assert cr["status"]["servingRevision"] == old
    _serving_kept_a_replica(load, old)
    assert load.failures() == [], load.failures()
    print(f"\n[show3] {stalled['message']}; {len(load.records)} requests, by revision {load.by_revision()}")


def _only_slot_a_and_two_records(cluster, ns: str, name: str, old: str, new: str) -> None:
    """No duplicate revision, no third slot, no orphan: exactly slot a's Deployments and the front, two records."""
    names = {i["metadata"]["name"] for i in cluster.kubectl_json(
        "get", "deployments", "-n", ns, "-l", f"app.kubernetes.io/instance={name}")["items"]
        if not i["metadata"].get("deletionTimestamp")}
    assert names == {f"{name}-prefill-a", f"{name}-decode-a", f"{name}-router-a", f"{name}-router"}, names
    crs = cluster.kubectl_json("get", "controllerrevisions", "-n", ns, "-l", f"app.kubernetes.io/instance={name}")
    assert sorted(c["metadata"]["labels"][REVISION] for c in crs["items"]) == sorted({old, new})


def test_show7_the_operator_sigkilled_mid_rollout_resumes_from_status_without_duplicates(cluster, operator_process, ns):
    import signal
    name = "resume"
    doc = _doc(name, steps=[30, 60, 100])
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-resume"
        apply(cluster, doc, ns)
        cr, _ = _phases(cluster, ns, name, lambda cr: ((cr.get("status") or {}).get("rollout") or {}).get("step", 0) >= 2,
                        180, "canary step 2")
        at_kill = dict(cr["status"]["rollout"])
        operator_process.restart(sig=signal.SIGKILL)
        new, phases = _until_complete(cluster, ns, name, old, 240, "the rollout to complete", 60)
    assert at_kill["candidateSlot"] == "a" and at_kill["candidateRevision"] == new, at_kill
    # resumed, not restarted: it goes on from the step it was killed at. A Starting after the kill is the candidate
    # growing for the next share (the planner may have scaled the serving slot meanwhile), never step 0 again.
    trail = phases.trail
    assert phases[0] in ("Canary", "Paused"), trail
    assert all(step >= at_kill["step"] for phase, step, _ in trail if phase in ("Starting", "Canary", "Paused")), trail
    assert all("(growing;" in msg for phase, _, msg in trail if phase == "Starting"), trail
    # no duplicate revision, no third slot, no orphan: exactly slot a's objects and two records
    _only_slot_a_and_two_records(cluster, ns, name, old, new)
    assert load.failures() == [], load.failures()
    print(f"\n[show7] SIGKILL at step {at_kill['step']}/{at_kill['steps']}; resumed through "
          f"{[f'{p} {s}' for p, s in dict.fromkeys((p, s) for p, s, _ in trail)]}; "
          f"{len(load.records)} requests")


def test_the_operator_sigkilled_at_random_points_of_a_rollout_converges_to_one_slot_and_two_records(
        cluster, operator_process, ns):
    """Issue 13's SIGKILLs at random points, during a canary (Show 7 kills once, at step 2): killed at a seeded
    random moment after each of Starting, canary steps 1-3 and Draining is reached, the operator resumes from
    status each time; the rollout completes once, in slot a, with no third slot, no orphan,
    two records and no failed request."""
    import random
    import signal
    rng = random.Random(int(os.environ.get("V41F_FAULT_SEED", "13")))
    name = "killed"
    doc = _doc(name, steps=[30, 60, 100])
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    rank = {"Starting": 0, "Canary": 1, "Paused": 1, "Draining": 2, "Complete": 3}

    def progress(cr: dict) -> tuple[int, int]:
        r = (cr.get("status") or {}).get("rollout") or {}
        return (r.get("step", 0), rank.get(r.get("phase", ""), -1))

    # one kill at a random moment (0-3 s) after each of these is reached: Starting, canary steps 1-3, Draining
    targets = [(0, 0), (1, 1), (2, 1), (3, 1), (3, 2)]
    at_kill: list[str] = []
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-killed"
        apply(cluster, doc, ns)
        for target in targets:
            cr, _ = _phases(cluster, ns, name, lambda cr: progress(cr) >= target, 180, f"rollout at {target}",
                            ("RolledBack",))
            if progress(cr)[1] == rank["Complete"]:
                break
            time.sleep(rng.uniform(0.0, 3.0))
            r = (get_cr(cluster, ns, name).get("status") or {}).get("rollout") or {}
            at_kill.append(f"{r.get('phase')} {r.get('step', 0)}/{r.get('steps', 0)}")
            print(f"\n[rollout-kills] target {target} reached at {progress(cr)}; killing at {at_kill[-1]}", flush=True)
            operator_process.restart(sig=signal.SIGKILL)
        new, phases = _until_complete(cluster, ns, name, old, 300, "the rollout to complete", 60)
    assert len(set(at_kill)) >= 3, at_kill  # the kills landed at three or more points of the rollout
    _only_slot_a_and_two_records(cluster, ns, name, old, new)
    cr = wait_ready(cluster, ns, name)
    assert cr["status"]["rollout"]["servingSlot"] == "a" and cr["status"]["servingRevision"] == new
    assert load.failures() == [], load.failures()
    operator_process.assert_alive()
    print(f"\n[rollout-kills] {len(at_kill)} SIGKILLs at {at_kill}; then {phases}; {len(load.records)} requests, "
          f"by revision {load.by_revision()}")


def test_show4_no_surge_room_waits_saying_why_and_in_place_completes_never_at_zero(cluster, operator_process, ns):
    name = "tight"
    doc = _doc(name, maxSurgeGPUs=4)
    for role in ("prefill", "decode"):
        doc["spec"][role].update(minReplicas=2, maxReplicas=2)
    doc["spec"]["autoscaling"] = {**doc["spec"].get("autoscaling", {}), "gpuBudget": 16}  # all of it in use
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    before = {p.metadata.uid for p in _engine_pods(cluster, ns, name)}
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-tight"
        apply(cluster, doc, ns)
        cr, _ = _phases(cluster, ns, name, lambda cr: ((cr.get("status") or {}).get("rollout") or {}).get(
            "phase") == "WaitingForSurgeRoom", 60, "the rollout waiting for surge room")
        rec = condition(cr, "Reconciling") or {}
        assert rec.get("status") == "True" and rec["reason"] == "WaitingForSurgeRoom", rec
        assert "needs 8 GPUs" in rec["message"] and "gpuBudget 16" in rec["message"], rec
        operator_process.wait_timer_passes(1)  # a pass later: still waiting, nothing of the serving revision touched
        assert {p.metadata.uid for p in _engine_pods(cluster, ns, name)} == before
        # opt in to in-place replacement: capacity handed over in P/D pairs
        doc["spec"]["rollout"]["whenNoSurgeRoom"] = "InPlace"
        apply(cluster, doc, ns)
        new, phases = _until_complete(cluster, ns, name, old, 300, "the in-place rollout to complete", 60)
    # never a role at zero Ready replicas (of either revision: one of them serves it)
    for sample in load.ready_samples:
        for role in ("prefill", "decode"):
            assert sum(n for (rev, r), n in sample.items() if r == role) >= 1, sample
    assert load.failures() == [], load.failures()
    print(f"\n[show4] waited with: {rec['message']}; in place through {phases}; {len(load.records)} requests")


class DomainWatch:
    """Samples, every 0.2 s in a thread, whether a ComputeDomain exists, whether its workload does, and which pods
    (terminating ones too) still claim its channel: (domain, workload, claiming pods) rows."""

    def __init__(self, cluster, ns: str, workload: str):
        self.cluster, self.ns, self.workload = cluster, ns, workload
        self.rows: list[tuple[bool, bool, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        try:
            pods = _channel_claimants(self.cluster, self.ns, f"{self.workload}-imex-channel")
            domain = f"{self.workload}-imex" in _domains(self.cluster, self.ns)
            lws = self.cluster.kubectl_json("get", "leaderworkersets", "-n", self.ns, "-o", "json")["items"]
            self.rows.append((domain, any(w["metadata"]["name"] == self.workload for w in lws), len(pods)))
        except Exception as e:  # noqa: BLE001 - an apiserver hiccup costs one row
            print(f"[domains] sample failed: {e}", flush=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self._sample()
            self.stop.wait(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        self._sample()  # the last row is taken after what the test waited for, never one begun before it


def _domains(cluster, ns: str) -> set[str]:
    return {d["metadata"]["name"] for d in cluster.custom.list_namespaced_custom_object(
        "resource.nvidia.com", "v1beta1", ns, "computedomains")["items"]}


def _channel_claimants(cluster, ns: str, template: str) -> list:
    return [p for p in cluster.core.list_namespaced_pod(ns).items
            if any(c.resource_claim_template_name == template for c in p.spec.resource_claims or [])]


def _group_holds_its_channels(cluster, ns: str, workload: str) -> set[str]:
    """Every pod of the workload's group holds an allocated IMEX channel of the workload's domain, on its own node,
    all nodes in one NVLink clique; the nodes."""
    from kubernetes import client
    pods = [p for p in _channel_claimants(cluster, ns, f"{workload}-imex-channel") if not p.metadata.deletion_timestamp]
    assert len(pods) == 4, [p.metadata.name for p in pods]  # DEP16 over 4 trays: a leader and 3 workers
    claims = client.ResourceV1Api(cluster.api)
    nodes = set()
    for p in pods:
        (status,) = [s for s in p.status.resource_claim_statuses or [] if s.name == "imex-channel"]
        claim = claims.read_namespaced_resource_claim(status.resource_claim_name, ns)
        (result,) = claim.status.allocation.devices.results
        assert (result.driver, result.device, result.pool) == ("compute-domain.nvidia.com", "channel-0",
                                                               p.spec.node_name), (p.metadata.name, result)
        assert any(r.name == p.metadata.name for r in claim.status.reserved_for or []), claim.status.reserved_for
        nodes.add(p.spec.node_name)
    assert len(nodes) == 4, nodes
    cliques = {cluster.core.read_node(n).metadata.labels.get("nvidia.com/gpu.clique") for n in nodes}
    assert len(cliques) == 1 and None not in cliques, cliques
    return nodes


def test_show6_the_gb300_example_with_a_leaderworkerset_decode_rolls_out_the_same_way(cluster, operator_process, ns):
    """... with an IMEX ComputeDomain per decode slot (docs/decisions/2026-12-07-compute-domains.md): every pod of
    the group holds a channel of its slot's domain, in one clique; the old slot's domain outlives its workload
    until its last pod is gone; deleting the deployment deletes the domain."""
    name = "rack"
    doc = _doc(name, "gb300-pd-dep4-dep16")
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    assert _domains(cluster, ns) == {f"{name}-decode-imex"}
    _group_holds_its_channels(cluster, ns, f"{name}-decode")
    with Load(cluster, ns, name, _model(doc)) as load, DomainWatch(cluster, ns, f"{name}-decode") as watch:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-rack"
        apply(cluster, doc, ns)
        new, phases = _until_complete(cluster, ns, name, old, 300, "the rollout to complete", 90)
        wait_for(lambda: _domains(cluster, ns) == {f"{name}-decode-a-imex"}, 60, "the old slot's domain deleted")
    lws = {i["metadata"]["name"] for i in cluster.kubectl_json("get", "leaderworkersets", "-n", ns)["items"]}
    assert lws == {f"{name}-decode-a"}, lws  # the candidate's decode LWS serves, the old one is gone
    _group_holds_its_channels(cluster, ns, f"{name}-decode-a")
    # the old domain was never gone while a pod claimed its channel, and outlived its workload while one did
    assert not [r for r in watch.rows if not r[0] and r[2]], watch.rows
    kept = [r for r in watch.rows if r[0] and not r[1] and r[2]]
    assert kept and watch.rows[-1] == (False, False, 0), watch.rows
    _promoted_and_drained(cluster, ns, name, phases)
    assert load.failures() == [], load.failures()
    served = {}
    for p in _engine_pods(cluster, ns, name):
        role = p.metadata.labels["v41flash.io/role"]
        served[role] = served.get(role, 0) + _served(cluster, ns, p.metadata.name)
    sent = load.by_revision().get(new, 0)
    assert sent > 0 and served == {"prefill": sent, "decode": sent}, (served, sent)
    cluster.kubectl("delete", "v41f", name, "-n", ns, "--wait=true")
    wait_for(lambda: not _domains(cluster, ns), 60, "the deployment's domain deleted with it")
    print(f"\n[show6] GB300 through {phases}; {len(load.records)} requests, by revision {load.by_revision()}; "
          f"the old domain outlived its workload for {len(kept) * 0.2:.1f} s of claiming pods")


def test_recreate_keeps_the_old_group_s_domain_until_its_pods_are_gone(cluster, operator_process, ns):
    """Strategy Recreate deletes the serving slot's workloads and starts the candidate's at once: the old decode
    group's ComputeDomain outlives its LeaderWorkerSet while its pods terminate, and goes once they are gone; the
    candidate's group holds channels of its own domain. The change comes once the first revision serves (before
    that, a spec change is applied in place: nothing to roll from); the candidate is waited on by its pods."""
    name = "rackre"
    doc = _doc(name, "gb300-pd-dep4-dep16", strategy="Recreate")
    apply(cluster, doc, ns)
    wait_for(lambda: len([p for p in _channel_claimants(cluster, ns, f"{name}-decode-imex-channel") if _ready(p)])
             == 4, 180, "the decode group's 4 pods Ready")
    wait_ready(cluster, ns, name)
    _group_holds_its_channels(cluster, ns, f"{name}-decode")
    with DomainWatch(cluster, ns, f"{name}-decode") as watch:
        doc["spec"]["model"]["revision"] = "e2e-rackre"
        apply(cluster, doc, ns)
        wait_for(lambda: len([p for p in _channel_claimants(cluster, ns, f"{name}-decode-a-imex-channel")
                              if _ready(p)]) == 4, 180, "the candidate's decode group Ready")
        wait_for(lambda: _domains(cluster, ns) == {f"{name}-decode-a-imex"}, 60, "the old group's domain deleted")
    _group_holds_its_channels(cluster, ns, f"{name}-decode-a")
    assert not [r for r in watch.rows if not r[0] and r[2]], watch.rows  # never gone while a pod claimed it
    kept = [r for r in watch.rows if r[0] and not r[1] and r[2]]
    assert kept and watch.rows[-1] == (False, False, 0), watch.rows
    cluster.kubectl("delete", "v41f", name, "-n", ns, "--wait=true")
    wait_for(lambda: not _domains(cluster, ns), 60, "the deployment's domain deleted with it")
    print(f"\n[recreate] the old domain outlived its workload for {len(kept) * 0.2:.1f} s of claiming pods")


def test_a_candidate_with_two_prefill_replicas_to_match_grows_before_the_full_share(cluster, operator_process, ns):
    """The candidate is sized by its share (docs/decisions/2026-12-01-rollouts.md §8.6): with 2 serving prefill
    replicas it starts at 1 (50 % of 2), grows to 2 while still at 50 %, and takes 100 % of new sessions only once both are
    Ready; promotion then resizes nothing."""
    name = "grow"
    doc = _doc(name)  # 2 prefill + 1 decode of 4 GPUs serve; the default surge: the candidate's full size (12)
    doc["spec"]["prefill"].update(minReplicas=2, maxReplicas=2)
    doc["spec"]["decode"].update(minReplicas=1, maxReplicas=1)
    apply(cluster, doc, ns)
    old = wait_ready(cluster, ns, name)["status"]["servingRevision"]
    seen: list[tuple] = []  # (phase, share, candidate prefill replicas, new-revision Ready prefill pods)
    with Load(cluster, ns, name, _model(doc)) as load:
        load.wait_requests(6)
        doc["spec"]["model"]["revision"] = "e2e-grow"
        apply(cluster, doc, ns)
        deadline, surge = time.monotonic() + 240, None
        while True:
            st = get_cr(cluster, ns, name).get("status") or {}
            r = st.get("rollout") or {}
            cand = r.get("candidateRevision", "")
            ready_new = sum(1 for p in _engine_pods(cluster, ns, name) if _ready(p) and cand
                            and p.metadata.labels.get(REVISION) == cand
                            and p.metadata.labels.get("v41flash.io/role") == "prefill")
            row = (r.get("phase", ""), r.get("share", 0), (r.get("candidateReplicas") or {}).get("prefill", 0),
                   ready_new)
            if cand:
                surge = r.get("surgeGPUs")
            if not seen or seen[-1] != row:
                seen.append(row)
            if r.get("phase") == "Complete" and st.get("servingRevision") != old:
                break
            assert r.get("phase") != "RolledBack" and time.monotonic() < deadline, (seen, r)
            time.sleep(0.5)
        load.wait_requests(6)
    phases = [s[0] for s in seen]
    assert surge == 12, surge
    assert ("Starting", 50, 2) in [s[:3] for s in seen], seen  # grown while at the previous share
    full = [s for s in seen if s[0] == "Canary" and s[1] == 100]
    assert full and full[0][2] == 2 and full[0][3] == 2, seen  # 100 % only with both prefill replicas Ready
    _promoted_and_drained(cluster, ns, name, phases)
    assert load.failures() == [], load.failures()
    print(f"\n[grow] (phase, share, candidate prefill replicas, its Ready prefill pods) {seen}; {len(load.records)} "
          f"requests, by revision {load.by_revision()}")


# --- the upgrade path: a deployment from before every deployment had a front ------------------------------------

class EndpointLoad(Load):
    """Load as kube-proxy sends it: each request to a Ready endpoint of the router Service, read afresh every half
    second — the Ready, not terminating pods its selector selects now (what its EndpointSlices would hold; the harness's
    loopback pod IPs are ones an EndpointSlice may not carry); while it has none, a request fails (status 0, "no
    ready endpoint")."""

    def _resolve(self) -> None:
        svc = self.cluster.core.read_namespaced_service(f"{self.name}-router", self.ns)
        sel = ",".join(f"{k}={v}" for k, v in sorted(svc.spec.selector.items()))
        ready = sorted(p.metadata.name for p in self.cluster.core.list_namespaced_pod(self.ns, label_selector=sel).items
                       if _ready(p) and not p.metadata.deletion_timestamp and p.status.pod_ip)
        if not ready:
            self.endpoint = None
        elif self.endpoint is None or self.endpoint[0] not in ready:
            # the process on the Service's port: the front's Envoy, or the one-pod router's session proxy
            s = next(x for x in self.cluster.supervised(self.ns) if x["pod"] == ready[-1] and x["port"] == 30000)
            self.endpoint = (ready[-1], f"http://{s['ip']}:{s['port']}")


ONE_POD_ROUTER = REPO / "e2e/fixtures/one-pod-router-tp4-h200-low-latency.yaml"


def _legacy_layout(cluster, ns: str, doc: dict) -> list[dict]:
    """What an operator from before 2026-12-07 applied for `doc` (tp4-h200-low-latency): the same engines, ConfigMap,
    Services, PDBs and NetworkPolicies as now, and one router Deployment whose pods ran the session proxy and
    vllm-router together (the fixture, from that operator's golden file)."""
    cr = get_cr(cluster, ns, doc["metadata"]["name"])
    obj = V41FlashDeployment.model_validate({**doc, "metadata": {"name": cr["metadata"]["name"], "namespace": ns}})
    owner = {"apiVersion": cr["apiVersion"], "kind": cr["kind"], "name": cr["metadata"]["name"],
             "uid": cr["metadata"]["uid"]}
    name = obj.metadata["name"]
    router = list(yaml.safe_load_all(ONE_POD_ROUTER.read_text().replace(
        "--service-discovery-namespace\n        - default", f"--service-discovery-namespace\n        - {ns}")))
    assert {o["metadata"]["name"] for o in router} == {f"{name}-router"}
    for o in router:
        o["metadata"].update(namespace=ns, ownerReferences=[{**owner, "controller": True, "blockOwnerDeletion": True}])
        for subject in o.get("subjects") or []:  # the RoleBinding: the router's ServiceAccount in this namespace
            subject["namespace"] = ns
    kinds = {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "HorizontalPodAutoscaler"}
    kept = [o for o in render(obj, owner=owner) if o["kind"] not in kinds or o["metadata"]["labels"].get(
        "v41flash.io/role") not in ("router",)]
    return kept + router


def test_a_deployment_from_before_the_front_moves_to_it_with_no_engine_restarted_and_no_request_failed(
        cluster, operator_process, ns):
    """The upgrade path: an operator of this version finds a deployment an older one made (one router pod with the
    session proxy and vllm-router together) and, on its next pass, moves it to the front plus slot "" with no engine
    pod replaced and no request failed, as a client through the Service's Ready endpoints sees it."""
    name = "tp4-h200-low-latency"  # the fixture's
    doc = _doc(name)
    operator_process.stop()
    try:
        apply(cluster, doc, ns)
        legacy = _legacy_layout(cluster, ns, doc)
        cluster.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-n", ns, "-f", "-",
                        input=yaml.safe_dump_all(legacy))
        wait_for(lambda: len([p for p in _engine_pods(cluster, ns, name) if _ready(p)]) == 2, 120,
                 "the old operator's engine pods Ready")
        engines = {p.metadata.name: p.metadata.uid for p in _engine_pods(cluster, ns, name)}
        with EndpointLoad(cluster, ns, name, _model(doc), workers=2) as load:
            load.wait_requests(8)
            operator_process.start()
            cr = wait_ready(cluster, ns, name)

            def moved():
                pods = [p for p in cluster.core.list_namespaced_pod(
                    ns, label_selector=f"v41flash.io/deployment={name},v41flash.io/role=router").items
                    if not p.metadata.deletion_timestamp]
                kinds = {(p.metadata.labels.get("v41flash.io/front"), p.metadata.labels.get("v41flash.io/slot"))
                         for p in pods if _ready(p)}
                return len(pods) == 3 and kinds == {("true", None), (None, "0")}  # two front replicas
            wait_for(moved, 120, "the front's two replicas and slot \"\"'s router Ready, the one-pod router gone")
            load.wait_requests(8)
    finally:
        operator_process.assert_alive() if operator_process.alive else operator_process.start()
    assert load.failures() == [], load.failures()[:5]
    assert {p.metadata.name: p.metadata.uid for p in _engine_pods(cluster, ns, name)} == engines
    assert "rollout" not in cr["status"] and cr["status"]["servingRevision"]
    print(f"\n[upgrade] {len(load.records)} requests through the Service's Ready endpoints, none failed; "
          f"engine pods unchanged: {sorted(engines)}")
