"""Engine health (issue 42): the hang watchdog and the straggler finder (health/, pure), what the operator replaces
(controller/engine_health.decide), and one check against the in-memory apiserver: the pod deleted, an Event, the
status fields and conditions, carried over by the one status function."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from v41flash.api import v1alpha1 as api
from v41flash.controller import engine_health as EH
from v41flash.health import stragglers as S
from v41flash.health import watchdog as W
from v41flash.metrics.parse import EngineMetrics, Histogram
from v41flash.metrics.window import PodSnapshot
from v41flash.vllm.metric_names import GEN_TOKENS, ITERATION_TOKENS, ITL, PROMPT_TOKENS, RUNNING, SUCCESS, TTFT


def snap(pod: str, t: float, *, tokens: float = 0, running: float = 0, itl: tuple[float, float] = (0, 0),
         ttft: tuple[float, float] = (0, 0), role: str = "decode", error: str | None = None, steps: float | None = None,
         prompt: float = 0, done: float = 0) -> PodSnapshot:
    """A scrape of one engine: counters, running requests, ITL/TTFT histograms as (count, sum)."""
    if error:
        return PodSnapshot(pod, role, t, error=error)
    hist = {ITL: Histogram(((math.inf, itl[0]),), itl[0], itl[1]), TTFT: Histogram(((math.inf, ttft[0]),), *ttft)}
    if steps is not None:
        hist[ITERATION_TOKENS] = Histogram(((math.inf, steps),), steps, steps * 100)
    return PodSnapshot(pod, role, t, {"0": EngineMetrics({GEN_TOKENS: tokens, PROMPT_TOKENS: prompt, SUCCESS: done},
                                                         {RUNNING: running}, hist)})


def run(series: list[PodSnapshot], hang_s: float = 30) -> list[list[W.Hung]]:
    state: dict = {}
    out = []
    for s in series:
        state, hung = W.watch(state, [s], hang_s)
        out.append(hung)
    return out


# ------------------------------------------------------------------------------------------ the watchdog

def test_requests_running_and_no_progress_for_n_seconds_is_a_hang():
    series = [snap("d", t, tokens=100 if t > 0 else 50, running=4) for t in range(0, 40, 3)]
    found = run(series)
    first = next(i for i, h in enumerate(found) if h)
    assert series[first].time - 3 >= 30 - 3 and series[first].time == 33  # 30 s after the last progress (t=3)
    assert found[first][0].pod == "d" and found[first][0].answered and found[first][0].running == 4
    assert "made no progress for 30 s with 4 requests running" in found[first][0].message()


def test_an_idle_engine_is_never_hung_and_progress_resets_the_clock():
    assert not any(run([snap("d", t, tokens=7, running=0) for t in range(0, 120, 3)]))
    moving = [snap("d", t, tokens=t // 20, running=2) for t in range(0, 120, 3)]  # a token every 20 s
    assert not any(run(moving))


@pytest.mark.parametrize("signal", ["prompt", "done", "steps"])
def test_any_work_counter_is_progress(signal):
    series = [snap("p", t, running=1, role="prefill", **{signal: float(t)}) for t in range(0, 90, 3)]
    assert not any(run(series))


def test_the_longest_legitimate_pause_does_not_trip_the_default():
    """One prefill of a 262,144-token prompt on a prefill engine: running 1, no counter moves until it ends (the
    engine without a step counter): about 9 s on B200, 25 s here, under the default 30 s."""
    default = api.EngineHealthSpec().hang.seconds
    series = [snap("p", t, role="prefill", running=1 if t < 25 else 0, prompt=0 if t < 25 else 262144,
                   tokens=0 if t < 25 else 1) for t in range(0, 60)]
    assert not any(run(series, default))


def test_a_frozen_engine_whose_metrics_time_out_is_hung_and_a_refused_one_is_not():
    frozen = [snap("d", 0, tokens=5, running=3), *(snap("d", t, error=f"timeout scraping http://x/metrics")
                                                   for t in range(3, 40, 3))]
    found = run(frozen)
    assert found[-1] and not found[-1][0].answered and "does not answer" in found[-1][0].message()
    gone = [snap("d", 0, tokens=5, running=3), *(snap("d", t, error="ConnectError scraping http://x/metrics")
                                                 for t in range(3, 40, 3))]
    assert not any(run(gone))  # the process is gone: the kubelet restarts it


def test_a_timeout_before_any_answer_is_not_judged():
    assert not any(run([snap("d", t, error="timeout scraping x") for t in range(0, 90, 3)]))


# ------------------------------------------------------------------------------------------ stragglers

def window(pod: str, itl_ms: float, running: float, *, tokens_per_s: float = 50, ttft_ms: float = 100,
           role: str = "decode", start: float = 0, length: float = 60, firsts_per_s: float = 1) -> list[PodSnapshot]:
    out = []
    for t in (start, start + length / 2, start + length):
        n, f = tokens_per_s * t, firsts_per_s * t
        out.append(snap(pod, t, tokens=n, running=running, itl=(n, n * itl_ms / 1000), ttft=(f, f * ttft_ms / 1000),
                        role=role))
    return out


def figures(*engines: tuple, now: float = 60, window_s: float = 60) -> list[S.EngineLatency]:
    out = []
    for pod, itl_ms, running, *more in engines:
        kw = dict(more[0]) if more else {}
        unit = kw.pop("unit", "")
        out.append(S.latency_over(window(pod, itl_ms, running, **kw), now, window_s, unit))
    return out


def test_an_engine_at_least_ratio_times_its_peers_median_itl_is_a_straggler():
    found = S.find_stragglers(figures(("a", 10, 8), ("b", 11, 8), ("c", 20, 9)), 1.5)
    assert [(s.unit, s.metric) for s in found] == [("c", "ITL")]
    assert found[0].ratio == pytest.approx(20 / 10.5) and "1.9x its peers' median 10 ms" in found[0].message(60)
    assert S.find_stragglers(figures(("a", 10, 8), ("b", 14, 8)), 1.5) == []  # 1.4x: not yet


def test_ttft_counts_too_and_each_role_is_judged_among_its_own():
    f = figures(("a", 10, 4, {"ttft_ms": 100}), ("b", 10, 4, {"ttft_ms": 400}),
                ("p1", 20, 4, {"role": "prefill"}), ("p2", 20, 4, {"role": "prefill"}))
    assert [(s.unit, s.metric) for s in S.find_stragglers(f, 1.5)] == [("b", "TTFT")]


def test_no_comparable_peer_or_no_whole_window_no_verdict():
    # a peer at a tenth of the load is no comparison (latency grows with the batch)
    assert S.find_stragglers(figures(("a", 10, 1), ("b", 30, 10)), 1.5) == []
    # idle: too few tokens for a figure
    assert S.find_stragglers(figures(("a", 10, 4), ("b", 30, 4, {"tokens_per_s": 0.5})), 1.5) == []
    # scrapes that do not reach back a whole window
    assert S.latency_over(window("a", 10, 4, start=20, length=40), 60, 60) is None
    # nor since the engine restarted (its counters went down): the fast minutes before do not count
    before = window("a", 10, 4, start=0, length=60)
    after = [snap("a", t, tokens=50 * (t - 70), running=4, itl=(50 * (t - 70), 50 * (t - 70) * 0.02))
             for t in (70, 90, 110)]
    assert S.latency_over(before + after, 110, 60) is None
    assert S.latency_over(before + after, 130, 40).itl_s == pytest.approx(0.02)


def test_a_dep_group_is_judged_by_its_slowest_rank_and_reported_as_one():
    f = figures(("g1-0", 10, 4, {"unit": "g1"}), ("g1-0-1", 25, 4, {"unit": "g1"}),
                ("g2", 10, 8), ("g3", 11, 8))
    [s] = S.find_stragglers(f, 1.5)
    assert s.unit == "g1" and s.pods == ("g1-0", "g1-0-1") and "DEP group g1" in s.message(60)
    assert S.group_of({S.LWS_NAME_LABEL: "x-decode", S.LWS_GROUP_INDEX_LABEL: "2"}, "x-decode-2-1") == "x-decode-2"
    assert S.group_of({}, "x-decode-abc") == "x-decode-abc"


# ------------------------------------------------------------------------------------------ deciding, acting

def eng(name, role="decode", ready=True, deleting=False, unit=None):
    return EH.Engine(name, f"uid-{name}", role, unit or name, "127.0.0.1", ready, deleting)


def test_one_unit_per_role_at_a_time_never_the_last_ready_one():
    hung = [W.Hung("a", "decode", 31, 2, True), W.Hung("b", "decode", 31, 2, True)]
    assert [d[1] for d in EH.decide([eng("a"), eng("b"), eng("c")], hung, [])] == ["a"]
    assert EH.decide([eng("a"), eng("b", ready=False)], hung[:1], []) == []  # b is not Ready: a is the last
    assert EH.decide([eng("a"), eng("b"), eng("x", deleting=True)], hung[:1], []) == []  # one is going already
    slow = [S.Straggler("p", "prefill", ("p",), "ITL", 0.02, 0.01, 2.0)]
    assert [(d[0], d[1]) for d in EH.decide([eng("a"), eng("b"), eng("p", "prefill"), eng("q", "prefill")],
                                            hung[:1], slow)] == [("EngineHung", "a"), ("Straggler", "p")]


def _pod(name, role, ip, uid=None):
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, namespace="ns", uid=uid or f"uid-{name}", deletion_timestamp=None,
                                 creation_timestamp=None, annotations={},
                                 labels={"v41flash.io/deployment": "t", "v41flash.io/role": role,
                                         "v41flash.io/serving": "true"},
                                 owner_references=[SimpleNamespace(kind="ReplicaSet", name=f"t-{role}-abc",
                                                                   controller=True)]),
        spec=SimpleNamespace(node_name="n1"),
        status=SimpleNamespace(pod_ip=ip, conditions=[SimpleNamespace(type="Ready", status="True",
                                                                      last_transition_time=None)]))


class Kube:
    def __init__(self, pods):
        self.pods, self.deleted, self.events, self.statuses = pods, [], [], []

    def list_pods(self, namespace, selector):
        return list(self.pods)

    def delete_pod(self, namespace, name, uid, grace_seconds=None):
        self.deleted.append((name, uid, grace_seconds))

    def post_event_soon(self, obj, type_, reason, message):
        self.events.append((type_, reason, message))

    def patch_status(self, namespace, name, status, resource_version):
        self.statuses.append(status)
        return {}


def test_a_hung_engine_is_deleted_without_drain_reported_and_the_status_pass_keeps_it(monkeypatch):
    kube = Kube([_pod("t-decode-a", "decode", "127.0.0.1"), _pod("t-decode-b", "decode", "127.0.0.2")])
    health = EH.EngineHealth(kube)
    body = {"metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 3, "resourceVersion": "7"},
            "spec": {"engineHealth": {"hang": {"seconds": 10}}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    clock = {"t": 1000.0}

    async def fake_scrape(targets, **kw):
        t = clock["t"]
        return [snap("t-decode-a", t, tokens=5, running=2),  # stuck
                snap("t-decode-b", t, tokens=t, running=2)]  # generating
    monkeypatch.setattr(EH, "scrape", fake_scrape)
    for _ in range(5):
        health.check(body, now=clock["t"])
        clock["t"] += 3
    assert kube.deleted == [("t-decode-a", "uid-t-decode-a", EH.HUNG_GRACE_SECONDS)]
    [(kind, reason, message)] = kube.events
    assert (kind, reason) == ("Warning", "EngineHung") and message.startswith(
        "decode pod t-decode-a made no progress for 12 s with 2 requests running")
    status = kube.statuses[-1]
    [entry] = status["engineHealth"]
    assert (entry["pod"], entry["role"], entry["state"]) == ("t-decode-a", "decode", "Hung")
    cond = next(c for c in status["conditions"] if c["type"] == "EngineHung")
    assert cond["status"] == "True" and "t-decode-a" in cond["message"] and cond["observedGeneration"] == 3
    assert [c["type"] for c in status["conditions"]] == ["Ready", "EngineHung"]
    # the status pass (controller/status.py) carries both over; after HOLD_SECONDS they go
    later = EH.health_status(status, [], clock["t"] + EH.HOLD_SECONDS + 1, 3)
    assert later == {"engineHealth": [], "conditions": [{"type": "Ready", "status": "True"}]}
    again = EH.health_status(status, [], clock["t"] + 5, 3)
    assert again["conditions"] == status["conditions"]  # unchanged: no write


def test_deployment_status_carries_engine_healths_fields(monkeypatch):
    from v41flash.controller import status as ST
    prev = {"engineHealth": [{"pod": "p", "role": "decode", "state": "Hung", "since": "2026-12-07T00:00:00Z",
                              "message": "m"}],
            "conditions": [{"type": "EngineHung", "status": "True", "reason": "HungReplaced", "message": "m"}]}
    body = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
            "metadata": {"name": "t", "namespace": "ns", "generation": 1}, "spec": {}, "status": prev}
    model = api.V41FlashDeployment.model_validate(body)
    st = ST.deployment_status(body=body, model=model, live={}, stall=None, now="2026-12-07T00:01:00Z", planner=None,
                              desired=[], rolled=None, pod_revisions=lambda: {})
    assert st["engineHealth"] == prev["engineHealth"]
    assert [c for c in st["conditions"] if c["type"] == "EngineHung"] == prev["conditions"]


def test_off_means_no_scrape():
    kube = Kube([_pod("t-decode-a", "decode", "127.0.0.1")])
    kube.list_pods = lambda *a: pytest.fail("listed pods with engine health off")
    body = {"metadata": {"name": "t", "namespace": "ns", "uid": "u"},
            "spec": {"engineHealth": {"hang": {"enabled": False}, "straggler": {"enabled": False}}}}
    EH.EngineHealth(kube).check(body)
    assert EH.interval_for(api.EngineHealthSpec()) == 3.0
    assert EH.interval_for(api.EngineHealthSpec.model_validate({"hang": {"seconds": 10}})) == 1.0


def test_a_straggler_is_replaced_with_its_own_grace_once_its_whole_window_is_slow(monkeypatch):
    kube = Kube([_pod(f"t-decode-{x}", "decode", f"127.0.0.{i + 1}") for i, x in enumerate("abc")])
    health = EH.EngineHealth(kube)
    body = {"metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 1, "resourceVersion": "7"},
            "spec": {"engineHealth": {"straggler": {"windowSeconds": 30}}}, "status": {}}
    clock = {"t": 0.0}
    itl_ms = {"t-decode-a": 10, "t-decode-b": 11, "t-decode-c": 21}

    async def fake_scrape(targets, **kw):
        t = clock["t"]
        return [snap(p, t, tokens=50 * t, running=6, itl=(50 * t, 50 * t * ms / 1000), ttft=(t, t * 0.1))
                for p, ms in itl_ms.items()]
    monkeypatch.setattr(EH, "scrape", fake_scrape)
    while clock["t"] < 27:
        health.check(body, now=clock["t"])
        clock["t"] += 3
    assert kube.deleted == []  # not a whole window yet
    while clock["t"] <= 36:
        health.check(body, now=clock["t"])
        clock["t"] += 3
    assert kube.deleted == [("t-decode-c", "uid-t-decode-c", None)]  # its own grace: its preStop drain runs
    [(kind, reason, message)] = kube.events
    assert reason == "Straggler" and message.startswith("decode pod t-decode-c: mean ITL 21 ms over 30 s is 2.0x")
    assert kube.statuses[-1]["engineHealth"][0]["state"] == "Straggler"
