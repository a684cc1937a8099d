"""Event-engine invariants of the P/D simulator on small deterministic workloads."""
from __future__ import annotations

import pytest

from v41flash.planner.profile import find_profile
from v41flash_bench.sim.simulator import ROUTERS, Simulator, SimulatorConfig
from v41flash_bench.sim.scenario import with_cold_start
from v41flash_bench.sim.workload import (
    AgentSessionSpec,
    ArrivalSpec,
    LogNormalSpec,
    SessionPlan,
    Workload,
    build_agentx_workload,
)

PROFILE = find_profile("low-latency", "H200")


def _one_request(prompt: int, out: int, start: float = 0.0, sid: int = 0, seg: int = 100) -> SessionPlan:
    return SessionPlan(sid=sid, start=start, prefix_ids=[], prefix_tokens=[], turn_seg_base=seg,
                       turn_seg_tokens=[prompt], output_tokens=[out], think_s=[0.0])


def _small_workload(seed: int = 1, rps: float = 4.0, duration: float = 240.0) -> Workload:
    spec = AgentSessionSpec(turns=LogNormalSpec(median=5, sigma=0.5, min=2, max=12),
                            new_tokens=LogNormalSpec(median=3000, sigma=0.6, min=64, max=20000),
                            output_tokens=LogNormalSpec(median=300, sigma=0.7, min=16, max=3000),
                            global_prefix_tokens=8000, group_prefix_tokens=2000, session_prefix_tokens=500,
                            groups=4)
    return build_agentx_workload(spec, ArrivalSpec(pattern="steady", peak_rps=rps, level=1.0), duration, seed)


def test_single_request_latency_follows_the_profile_exactly():
    p = PROFILE
    wl = Workload(sessions=[_one_request(prompt=10_000, out=101)])
    sim = Simulator(wl, p, None, duration=100.0, initial={"prefill": 1, "decode": 1})
    tel = sim.run()
    pf = p.prefill
    c = pf.curve
    prefill = c.overhead * max(1.0, 10_000 / pf.max_num_batched_tokens) + c.per_token * 10_000 \
        + c.per_token_context * 10_000 * 10_000
    handover = p.kv_transfer.seconds(10_000)
    assert tel.pf_latency == [pytest.approx(prefill)]
    # a lone sequence: every step at batch 1, context grows from 10,000 tokens by tokensPerStep per step
    d = p.decode
    first_step = d.step_seconds(1, 10_000)
    assert tel.ttft == [pytest.approx(prefill + handover + first_step)]
    # fluid decode: 101 tokens at tokensPerStep per step; the step time is taken at the join context
    assert tel.e2e[0] == pytest.approx(prefill + handover + 101 / d.tokens_per_step * first_step, rel=1e-6)
    assert sim.tokens_out == 101


def test_every_request_finishes_exactly_once_and_tokens_are_conserved():
    wl = _small_workload()
    sim = Simulator(wl, PROFILE, None, duration=240.0, initial={"prefill": 2, "decode": 1},
                    config=SimulatorConfig(drain_timeout_s=3600.0))
    tel = sim.run()
    assert sim.requests_started == sim.requests_finished > 100
    assert not sim.inflight_requests
    assert sim.tokens_out == sum(tel.out)
    assert len(tel.done_t) == len(tel.ttft) == len(tel.e2e) == len(tel.ft_t) == len(tel.pf_t) == sim.requests_finished
    assert all(0 <= c < p for c, p in zip(tel.cached, tel.prompt))
    assert all(t <= e for t, e in zip(tel.ttft, tel.e2e))
    assert tel.done_t == sorted(tel.done_t)
    # closed loop: a session's turns never overlap and come in order
    last_done: dict[int, float] = {}
    rows = sorted(zip(tel.arrive_t, tel.done_t, tel.sid))
    for a, d, s in rows:
        assert a >= last_done.get(s, -1.0) - 1e-9
        last_done[s] = d
    # prefix caching works: later turns mostly hit
    assert sum(tel.cached) / sum(tel.prompt) > 0.6


def test_same_seed_same_telemetry():
    a = Simulator(_small_workload(seed=9), PROFILE, None, 200.0, {"prefill": 2, "decode": 1}).run()
    b = Simulator(_small_workload(seed=9), PROFILE, None, 200.0, {"prefill": 2, "decode": 1}).run()
    assert a.e2e == b.e2e and a.cached == b.cached and a.series == b.series


def test_decode_respects_max_num_seqs_and_queues_the_rest():
    p = PROFILE.model_copy(update={"decode": PROFILE.decode.model_copy(update={"max_num_seqs": 2})})
    wl = Workload(sessions=[_one_request(1000, 200, start=0.0, sid=i, seg=100 + i) for i in range(5)])
    sim = Simulator(wl, p, None, duration=60.0, initial={"prefill": 1, "decode": 1})
    peak = []
    orig = sim._admit

    def spy(k):
        orig(k)
        peak.append(k.n)

    sim._admit = spy
    tel = sim.run()
    assert max(peak) == 2
    assert sim.requests_finished == 5
    assert max(tel.queue_s) > 0  # some waited for a slot


def test_cold_start_scale_up_and_draining_scale_down_lose_nothing():
    p = with_cold_start(PROFILE, 120.0)

    class Script:
        name, interval_s, last_note = "script", 30.0, ""

        def decide(self, now, view):
            if now < 60:
                return {"prefill": 3, "decode": 2}
            return {"prefill": 1, "decode": 1}

    wl = _small_workload(seed=2, duration=300.0)
    sim = Simulator(wl, p, Script(), duration=300.0, initial={"prefill": 1, "decode": 1},
                    config=SimulatorConfig(drain_timeout_s=3600.0))
    tel = sim.run()
    assert sim.requests_started == sim.requests_finished
    pre = sim.replicas["prefill"]
    assert len(pre) == 3
    started = [r for r in pre if r.requested > 0]
    # scaled up at t=0, cancelled at t=60 while still starting: never Ready, GPU time 0 → 60 s
    assert all(r.ready == float("inf") and r.gone == pytest.approx(60.0) for r in started)
    gs = sim.gpu_seconds(0.0, 300.0)
    assert gs["prefill"] == pytest.approx(300.0 * 4 + 2 * 60.0 * 4)
    assert [a[1:4] for a in tel.actions] == [("prefill", 1, 3), ("decode", 1, 2), ("prefill", 3, 1), ("decode", 2, 1)]


def test_drained_replica_finishes_its_requests_before_it_goes():
    wl = Workload(sessions=[_one_request(20_000, 3000, start=0.0, sid=i, seg=100 + i) for i in range(4)])

    class Down:
        name, interval_s, last_note = "down", 5.0, ""

        def decide(self, now, view):
            return {"prefill": 1, "decode": 1 if now >= 5.0 else 2}

    sim = Simulator(wl, PROFILE, Down(), duration=200.0, initial={"prefill": 1, "decode": 2})
    sim.run()
    gone = [r for r in sim.replicas["decode"] if r.state == "gone"]
    assert len(gone) == 1
    assert gone[0].gone > 5.0  # it drained its sequences first
    assert gone[0].served > 0
    assert sim.requests_finished == 4


@pytest.mark.parametrize("router", ROUTERS)
def test_routers_serve_everything(router):
    sim = Simulator(_small_workload(seed=4, duration=120.0), PROFILE, None, 120.0, {"prefill": 3, "decode": 1},
                    config=SimulatorConfig(router=router, drain_timeout_s=3600.0))
    tel = sim.run()
    assert sim.requests_started == sim.requests_finished
    hit = sum(tel.cached) / sum(tel.prompt)
    assert 0.0 < hit < 1.0


def test_trace_replays_run_through_the_engine():
    from pathlib import Path

    from v41flash_bench.sim.workload import AgentxTraceSpec, MooncakeTraceSpec, load_agentx_trace, load_mooncake_trace

    fix = Path(__file__).parent / "fixtures" / "sim"
    wl = load_agentx_trace(AgentxTraceSpec(path=str(fix / "agentx_sessions.json"), think_cap_s=10.0))
    sim = Simulator(wl, PROFILE, None, duration=600.0, initial={"prefill": 1, "decode": 1})
    tel = sim.run()
    assert sim.requests_finished == 5
    s1 = sorted((a, d) for a, d, s in zip(tel.arrive_t, tel.done_t, tel.sid) if s == wl.sessions[0].sid)
    # closed loop: each next turn is sent the (capped) think time after the previous answer
    assert s1[1][0] == pytest.approx(s1[0][1] + 2.0)
    assert s1[2][0] == pytest.approx(s1[1][1] + 10.0)
    # later turns find their earlier blocks cached
    assert max(tel.cached) > 0

    mc = load_mooncake_trace(MooncakeTraceSpec(path=str(fix / "mooncake.jsonl")))
    sim = Simulator(mc, PROFILE, None, duration=600.0, initial={"prefill": 1, "decode": 1})
    tel = sim.run()
    assert sorted(tel.arr_t) == [0.0, 0.5, 1.5]  # open loop: trace timestamps
    assert sorted(tel.out) == [4, 8, 16]


def test_simulated_window_figures_match_the_telemetry():
    import numpy as np

    from v41flash_bench.sim.telemetry import observation

    sim = Simulator(_small_workload(seed=3), PROFILE, None, 200.0, {"prefill": 2, "decode": 1})
    tel = sim.run()
    sim.now = 150.0
    obs = observation(sim, 60.0, 0.9)
    pw, dw, rt = obs.prefill.window, obs.decode.window, obs.router
    pm = [(t, lat, p, c) for t, lat, p, c in zip(tel.pf_t, tel.pf_latency, tel.pf_prompt, tel.pf_cached)
          if 90.0 < t <= 150.0]
    assert pw.requests == len(pm) > 0 and pw.request_rate == pytest.approx(len(pm) / 60.0)
    assert pw.ttft_s == pytest.approx(float(np.percentile([x[1] for x in pm], 90)))
    assert pw.prefix_cache_hit_rate == pytest.approx(sum(x[3] for x in pm) / sum(x[2] for x in pm))
    dm = [(o, e) for t, o, e in zip(tel.done_t, tel.out, tel.decode_e2e) if 90.0 < t <= 150.0]
    assert dw.requests == len(dm) and dw.mean_output_tokens == pytest.approx(np.mean([x[0] for x in dm]))
    assert dw.e2e_p95_s == pytest.approx(float(np.percentile([x[1] for x in dm], 95)))
    ue = [e for t, e in zip(tel.done_t, tel.e2e) if 90.0 < t <= 150.0]
    assert rt.requests == len(ue) and rt.e2e_p95_s == pytest.approx(float(np.percentile(ue, 95)))
    assert obs.prefill.replicas.ready == 2 and obs.decode.replicas.desired == 1
    # the session proxy's view: every arrival, and the first turns among them as new sessions
    assert rt.arrival_rate == pytest.approx(sum(1 for t in tel.arr_t if 90.0 < t <= 150.0) / 60.0)
    assert 0 < len(tel.new_t) < len(tel.arr_t) and set(tel.new_t) <= set(tel.arr_t)
    assert rt.new_session_rate == pytest.approx(sum(1 for t in tel.new_t if 90.0 < t <= 150.0) / 60.0)


# ------------------------------------------------------------------ the routers vllm-router runs
class _Req:
    """The fields the routers read."""

    def __init__(self, sid: int, prompt: int = 1000):
        self.session = type("S", (), {"sid": sid})()
        self.ids, self.toks, self.prompt = [], [], prompt


def _router_sim(router: str, prefill: int, **cfg) -> Simulator:
    return Simulator(Workload(sessions=[]), PROFILE, None, 100.0, {"prefill": prefill, "decode": 1},
                     config=SimulatorConfig(router=router, **cfg))


def _add_prefill(sim: Simulator):
    r = sim._new_replica("prefill", sim.now)
    sim._make_ready(r)
    return r


def test_sticky_least_loaded_keeps_a_session_and_gives_new_ones_to_the_engine_with_fewest():
    sim = _router_sim("sticky_least_loaded", 3)
    first = {sid: sim._route_prefill(_Req(sid)).rid for sid in range(6)}
    assert sorted(list(first.values()).count(r.rid) for r in sim.replicas["prefill"]) == [2, 2, 2]
    sim.now = 30.0
    assert {sid: sim._route_prefill(_Req(sid)).rid for sid in range(6)} == first  # sessions stay
    # the engine of sessions 0 leaves: they go to the engines with fewest sessions, the others stay
    gone = next(r for r in sim.replicas["prefill"] if r.rid == first[0])
    gone.state = "gone"
    sim._changed("prefill")
    moved = sim._route_prefill(_Req(0)).rid
    assert moved != first[0] and sim._pinned[moved] == 3 and sim._route_prefill(_Req(1)).rid == first[1]


@pytest.mark.parametrize("ttl, spread", [(7200.0, [0, 0, 0, 8]), (600.0, [2, 2, 2, 2])])
def test_sticky_least_loaded_counts_sessions_for_its_ttl_an_engine_added_later(ttl, spread):
    """vllm-router counts a session on its engine until idle for the TTL: with its 2 h default, sessions
    long ended still count and an engine added later takes every new session."""
    sim = _router_sim("sticky_least_loaded", 3, sticky_session_ttl_s=ttl)
    for sid in range(30):
        sim._route_prefill(_Req(sid))
    sim.now = 1000.0  # those 30 sessions are idle since t=0
    new = _add_prefill(sim)
    engines = [r.rid for r in sim.replicas["prefill"]]
    got = [sim._route_prefill(_Req(100 + i)).rid for i in range(8)]
    assert sorted(got.count(rid) for rid in engines) == spread
    assert (got.count(new.rid) == 8) == (ttl == 7200.0)


def test_vllm_cache_aware_balances_by_requests_in_flight_when_imbalanced_else_follows_the_cache():
    sim = _router_sim("vllm_cache_aware", 3)
    a, b, c = sim.replicas["prefill"]
    req = _Req(1, prompt=1000)
    ids, toks = [7, 8], [500, 500]
    req.ids, req.toks = ids, toks
    b.cache.access(ids, toks)  # b holds the whole prompt
    c.cache.access([9], [50])  # c's cache is larger than a's (empty)
    assert sim._route_prefill(req) is b  # balanced (no requests in flight): the longest prefix
    a.inflight, b.inflight, c.inflight = 0, 5, 1  # 5 - 0 > 4 and 5 > 1.25 x 0: imbalanced
    assert sim._route_prefill(req) is a
    b.inflight = 4  # within the absolute threshold: the cache again
    assert sim._route_prefill(req) is b
    req.ids, req.toks, req.prompt = [7, 10], [500, 700], 1200  # 500 of 1200 cached: under the 0.8 threshold
    assert sim._route_prefill(req) is a  # the engine with the smallest cache


def test_replicas_ordered_before_the_run_are_ready_when_due_and_cost_from_their_order():
    p = with_cold_start(PROFILE, 120.0)
    wl = _small_workload(seed=3, duration=300.0)
    sim = Simulator(wl, p, None, duration=300.0, initial={"prefill": 1, "decode": 1},
                    config=SimulatorConfig(drain_timeout_s=3600.0), starting={"prefill": [30.0, 90.0]})
    sim.run()
    assert sim.requests_started == sim.requests_finished
    pre = sim.replicas["prefill"]
    assert [(r.requested, r.ready) for r in pre] == [(0.0, 0.0), (-90.0, 30.0), (-30.0, 90.0)]
    # in [0, 300): the initial one all along, the others from t = 0 (their order before it is not the run's)
    assert sim.gpu_seconds(0.0, 300.0)["prefill"] == pytest.approx(3 * 300.0 * p.prefill.gpus_per_replica)
    with pytest.raises(ValueError, match="Ready at t > 0"):
        Simulator(wl, p, None, duration=300.0, initial={"prefill": 1, "decode": 1}, starting={"decode": [0.0]})
