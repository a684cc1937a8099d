"""Routing benchmark plumbing that needs no processes: config, argv, request shaping, table, report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from v41flash_bench.routing import runner as b
from v41flash.proxy.session_proxy import derived_session_key
from v41flash_bench.routing.sessions import RoutingScenario, build_trace, oracle

REPO = Path(__file__).resolve().parents[1]


def _result(**kw):
    base = dict(mode="header", variant="sticky", policy="sticky_least_loaded", ours=False, router_args=(),
                requests=100, errors=0, hit_rate=0.855, oracle_hit_rate=0.9, running_spread=1.2,
                uncached_spread=1.1, request_spread=1.0, p50_ms=120.0, p95_ms=300.4, router_cpu_s=0.123,
                wall_s=5.0)
    return b.RunResult(**{**base, **kw})


def test_shipped_scenario_loads_and_runs_every_policy_and_ours():
    cfg = b.load_config(b.DEFAULT_SCENARIO)
    policies = {v.policy for v in cfg.variants}
    assert policies == {"round_robin", "random", "power_of_two", "cache_aware", "consistent_hash",
                        "sticky_least_loaded", "kv_aware"}
    assert sum(v.ours for v in cfg.variants) == 2  # aggregated and P/D
    assert {v.pd for v in cfg.variants if v.ours} == {False, True}
    assert any(v.kv_events and not v.args for v in cfg.variants if v.policy == "kv_aware")
    assert any(v.kv_events and "--kv-aware-session-affinity-ttl-secs" in v.args for v in cfg.variants)
    assert any(not v.kv_events for v in cfg.variants if v.policy == "kv_aware")
    assert cfg.modes == ("header", "none")


def test_config_overrides_and_rejections(tmp_path):
    cfg = b.load_config(b.DEFAULT_SCENARIO, sessions=3, engines=2, modes=("user",))
    assert (cfg.scenario.sessions, cfg.scenario.engines, cfg.modes) == (3, 2, ("user",))
    with pytest.raises(ValueError, match="unknown scenario fields"):
        b.load_config(b.DEFAULT_SCENARIO, sesions=3)
    with pytest.raises(ValueError, match="unknown session-key modes"):
        b.load_config(b.DEFAULT_SCENARIO, modes=("cookie",))
    dup = tmp_path / "dup.yaml"
    dup.write_text("variants: [{name: a, policy: random}, {name: a, policy: round_robin}]\n")
    with pytest.raises(ValueError, match="duplicate"):
        b.load_config(dup)
    with pytest.raises(ValueError, match="session_key"):
        b.Variant("x", "random", session_key="cookie")


def test_proxy_variant_runs_the_real_session_proxy():
    cfg = b.load_config(b.DEFAULT_SCENARIO)
    ours = [v for v in cfg.variants if v.ours]
    assert ours and all(v.session_key == "proxy" for v in ours)  # the real process, not a client-set header
    assert any(v.name == "cache_aware-0.8" and not v.ours for v in cfg.variants)  # the old default, for comparison
    argv = b.proxy_argv(4000, 4001)
    assert argv[1:] == ["-m", "v41flash.cli.main", "session-proxy", "--listen", "127.0.0.1:4000",
                        "--upstream", "http://127.0.0.1:4001"]
    # the command parses with the CLI the router pod runs
    from v41flash.cli.main import build_parser
    args = build_parser().parse_args(argv[3:])
    assert args.listen == ("127.0.0.1", 4000) and args.upstream == "http://127.0.0.1:4001"


def test_router_argv_stays_on_loopback_and_wires_kv_events():
    v = b.Variant("kv", "kv_aware", ("--kv-aware-session-affinity-ttl-secs", "600"), kv_events=True)
    argv = b.router_argv(Path("/r"), v, 1000, 1001, ["http://127.0.0.1:1", "http://127.0.0.1:2"],
                         ["tcp://127.0.0.1:5", "tcp://127.0.0.1:6"], 16)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--policy") + 1] == "kv_aware"
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    sources = [argv[k + 1] for k, a in enumerate(argv) if a == "--kv-event-source"]
    assert sources == ["http://127.0.0.1:1=tcp://127.0.0.1:5", "http://127.0.0.1:2=tcp://127.0.0.1:6"]
    assert argv[argv.index("--kv-event-block-size") + 1] == "16"
    assert "--kv-aware-session-affinity-ttl-secs" in argv and "--disable-retries" in argv
    pd = b.router_argv(Path("/r"), b.Variant("pd", "cache_aware", pd=True, decode_policy="round_robin"), 1, 2,
                       ["http://a", "http://b", "http://c", "http://d"], [], 16)
    assert [pd[k + 1] for k, a in enumerate(pd) if a == "--prefill"] == ["http://a", "http://b"]
    assert [pd[k + 1] for k, a in enumerate(pd) if a == "--decode"] == ["http://c", "http://d"]
    assert pd[pd.index("--prefill-policy") + 1] == "cache_aware" and pd[pd.index("--decode-policy") + 1] == "round_robin"
    assert "--vllm-pd-disaggregation" in pd and "--worker-urls" not in pd and "--policy" not in pd
    with pytest.raises(ValueError):
        b.Variant("x", "kv_aware", pd=True, kv_events=True)
    with pytest.raises(ValueError):
        b.Variant("x", "random", decode_policy="random")
    plain = b.router_argv(Path("/r"), b.Variant("rr", "round_robin"), 1, 2, ["u"], ["e"], 16)
    assert "--kv-event-source" not in plain
    assert b.variant_flags(v, 16)[:4] == ("--policy", "kv_aware", "--kv-aware-session-affinity-ttl-secs", "600")


def test_router_argv_is_accepted_by_the_routers_own_parser():
    from vllm_router.launch_router import parse_router_args  # the launcher's argparse (no server started)
    v = b.Variant("t", "cache_aware", ("--cache-threshold", "0.9", "--balance-abs-threshold", "4"))
    args = parse_router_args(b.router_argv(Path("vllm-router"), v, 1, 2, ["http://127.0.0.1:3"], [], 16)[1:])
    assert args.policy == "cache_aware" and args.cache_threshold == 0.9 and args.balance_abs_threshold == 4


def test_sim_argv_sizes_the_cache_and_switches_events():
    sc = RoutingScenario()
    argv, env = b.sim_argv(Path("/sim"), 9, sc, b.EngineLatency(), None, 1)
    assert argv[argv.index("--kv-cache-size") + 1] == str(sc.kv_cache_blocks)
    assert argv[argv.index("--block-size") + 1] == str(sc.block_size)
    assert "--zmq-endpoint=" in argv and "--enable-kvcache" in argv
    events, _ = b.sim_argv(Path("/sim"), 9, sc, b.EngineLatency(), "tcp://127.0.0.1:7", 1)
    assert "--zmq-endpoint=tcp://127.0.0.1:7" in events and "--use-vllm-map-event-format" in events
    assert env == {"V41F_SIM_BIND_HOST": "127.0.0.1", "POD_IP": "127.0.0.1"}
    assert argv[argv.index("--prefill-time-per-token") + 1] == "100us" and argv[-2:] == ["-v", "0"]
    assert argv[argv.index("--max-model-len") + 1] == "8192"
    assert argv[argv.index("--max-waiting-queue-length") + 1] == str(max(64, 2 * sc.sessions))


def test_model_len_covers_the_longest_request_and_stays_small():
    trace = build_trace(RoutingScenario())
    longest = max(sum(len(c.split()) for _, c in t.messages) + t.max_tokens for _, t in trace.requests())
    n = b.model_len_for(trace)
    assert n >= 2 * longest and n & (n - 1) == 0 and n <= 4 * longest + 4096


def test_request_body_per_session_key_mode():
    trace = build_trace(RoutingScenario(sessions=2, turns_min=2, turns_max=2, subagent_fraction=0.0))
    s = trace.sessions[1]
    turn = s.turns[1]
    client, derived = b.Variant("c", "random"), b.Variant("d", "random", session_key="derived")
    body, h = b.request_body(turn, s, "header", derived)
    assert h[b.SESSION_HEADER] == s.id  # the client's own id wins over a derived one
    assert body["messages"][-1] == {"role": turn.messages[-1][0], "content": turn.messages[-1][1]}
    assert body["max_tokens"] == turn.max_tokens and "user" not in body
    body, h = b.request_body(turn, s, "none", client)
    assert b.SESSION_HEADER not in h and "user" not in body
    body, h = b.request_body(turn, s, "none", derived)
    assert h[b.SESSION_HEADER] == derived_session_key(turn.messages)
    body, h = b.request_body(turn, s, "user", client)
    assert body["user"] == s.id and b.SESSION_HEADER not in h


def test_percentile_nearest_rank():
    vals = [float(v) for v in range(1, 11)]
    assert b.percentile(vals, 0.5) == 5.0
    assert b.percentile(vals, 0.95) == 10.0
    assert b.percentile(vals, 0.0) == 1.0
    assert b.percentile([], 0.5) is None


def test_meets_target():
    assert _result(hit_rate=0.855, oracle_hit_rate=0.9, running_spread=1.25).meets_target()  # 0.95, 1.25
    assert not _result(hit_rate=0.85, oracle_hit_rate=0.9).meets_target()
    assert not _result(running_spread=1.26).meets_target()
    assert not _result(errors=1).meets_target()
    assert not _result(hit_rate=None).meets_target()
    assert _result(oracle_hit_rate=0.0).hit_vs_oracle is None


def test_table_formatting():
    text = b.format_table([_result(), _result(mode="none", variant="ours", ours=True, hit_rate=None,
                                               running_spread=None, router_cpu_s=None, errors=3, proxy_cpu_s=0.05)])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["mode", "variant", "policy"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["header", "sticky", "sticky_least_loaded", "0.855", "0.900", "0.95", "1.20",
                                "1.10", "-", "-", "120", "300", "0", "0.12", "-", "yes"]
    assert lines[3].split() == ["none", "*", "ours", "sticky_least_loaded", "-", "0.900", "-", "-", "1.10",
                                "-", "-", "120", "300", "3", "-", "0.05", "no"]
    assert len({len(line.rstrip()) for line in lines[:2]}) == 1


def test_markdown_table():
    md = b.format_markdown([_result()]).splitlines()
    assert md[0].startswith("| mode | variant | policy | hit |") and md[1].startswith("|---|---|---|---:|")
    assert md[2] == ("| header | sticky | sticky_least_loaded | 0.855 | 0.900 | 0.95 | 1.20 | 1.10 | - | - | 120 "
                     "| 300 | 0 | 0.12 | - | yes |")


def test_report_round_trips_through_json(tmp_path):
    cfg = b.load_config(b.DEFAULT_SCENARIO)
    rep = b.report_dict(cfg, [_result(engines=({"engine": 0, "prompt_tokens": 1.0},))], "cmd", 0.9,
                        {"requests": 100})
    text = json.dumps(rep)
    back = json.loads(text)
    assert back["results"][0]["hit_vs_oracle"] == pytest.approx(0.95)
    assert back["results"][0]["meets_target"] is True
    assert back["versions"] == {"vllm-router": "0.1.17", "llm-d-inference-sim": "v0.10.2"}
    assert b.results_from_report(back) == [_result(engines=({"engine": 0, "prompt_tokens": 1.0},))]


def test_cpu_seconds_of_a_live_and_a_missing_process():
    assert b.cpu_seconds(os.getpid()) >= 0.0
    assert b.cpu_seconds(2 ** 22 + 12345) is None


def test_processes_report_the_dead_and_stop_the_rest(tmp_path):
    procs = b.Processes(tmp_path)
    (tmp_path / "quick.log").write_text("from an earlier run\n")
    quick = procs.start("quick", ["/bin/sh", "-c", "echo bye; sleep 0.3; exit 3"])
    slow = procs.start("slow", ["/bin/sh", "-c", "sleep 300 & wait"])
    deadline = time.monotonic() + 5
    while quick.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.dead() == ["quick (exit 3)"]
    procs.stop()
    assert not slow.alive() and procs.procs == []
    assert (tmp_path / "quick.log").read_text() == "bye\n"  # a fresh log per run


def test_cli_refuses_unknown_variant(tmp_path):
    r = subprocess.run([sys.executable, "-m", "v41flash_bench.cli_routing", "--out", str(tmp_path),
                        "--variants", "nope"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "unknown variants ['nope']" in r.stderr


def _replay(handler, trace, mode="header", variant=None, timeout_s=10.0):
    import asyncio

    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await b._replay(client, "http://router", trace, mode, variant or b.Variant("v", "random"),
                                   timeout_s)
    return asyncio.run(go())[:3]


def test_replay_sends_every_turn_in_order_with_the_session_key():
    trace = build_trace(RoutingScenario(sessions=3, turns_min=2, turns_max=3, subagent_fraction=1.0,
                                 subagent_turns_min=1, subagent_turns_max=1, time_scale=0.0))
    seen: dict[str, list[int]] = {}

    def handler(request):
        body = json.loads(request.content)
        seen.setdefault(request.headers[b.SESSION_HEADER], []).append(len(body["messages"]))
        return __import__("httpx").Response(200, json={"choices": []})

    latencies, errors, total = _replay(handler, trace)
    assert (len(latencies), errors, total) == (len(trace.requests()), 0, len(trace.requests()))
    for s in trace.sessions:
        assert seen[s.id] == [len(t.messages) for t in s.turns]  # each session's turns, in order
        assert seen[s.subagent.id] == [len(t.messages) for t in s.subagent.turns]


def test_replay_counts_failures_and_requests_cut_off_by_the_timeout():
    import httpx
    trace = build_trace(RoutingScenario(sessions=2, turns_min=4, turns_max=4, subagent_fraction=0.0, time_scale=0.0))
    calls = []

    def failing(request):
        calls.append(1)
        return httpx.Response(500 if len(calls) % 2 else 200)

    latencies, errors, total = _replay(failing, trace)
    assert (len(latencies), errors, total) == (4, 4, 8)

    def broken(request):
        raise httpx.ConnectError("refused")

    assert _replay(broken, trace)[1:] == (8, 8)

    async def slow(request):
        import asyncio
        await asyncio.sleep(5)
        return httpx.Response(200)

    latencies, errors, total = _replay(slow, trace, timeout_s=0.2)
    assert (latencies, errors, total) == ([], 8, 8)


def test_sim_binary_override_and_absence(tmp_path, monkeypatch):
    exe = tmp_path / "sim"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("V41F_SIM_BIN", str(exe))
    assert b.find_sim_binary() == exe
    monkeypatch.setenv("V41F_SIM_BIN", str(tmp_path / "missing"))
    monkeypatch.setattr(b, "CACHE", tmp_path / "empty-cache")
    assert b.find_sim_binary() is None


def test_direct_variants_are_routerless_and_validated():
    cfg = b.load_config(REPO / "bench" / "routing" / "placement-bound.yaml")
    direct = [v for v in cfg.variants if v.direct]
    assert {v.direct for v in direct} == {"oracle", "balanced"}
    assert all(b.variant_flags(v, 16)[0] == "no router" for v in direct)
    with pytest.raises(ValueError, match="direct must be one of"):
        b.Variant("x", "placement", direct="psychic")
    for bad in ({"kv_events": True}, {"pd": True}, {"session_key": "proxy"}, {"args": ("--x",)}, {"gateway": True}):
        with pytest.raises(ValueError):
            b.Variant("x", "placement", direct="oracle", **bad)


def test_replay_sends_each_session_to_the_url_its_root_is_placed_on():
    import asyncio

    import httpx
    trace = build_trace(RoutingScenario(sessions=4, turns_min=2, turns_max=2, subagent_fraction=1.0,
                                        subagent_turns_min=1, subagent_turns_max=1, time_scale=0.0))
    placement = {s.id: i % 2 for i, s in enumerate(trace.sessions)}
    hosts: dict[str, set[str]] = {}

    def handler(request):
        hosts.setdefault(request.headers[b.SESSION_HEADER], set()).add(request.url.host)
        return httpx.Response(200, json={"choices": []})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await b._replay(client, lambda s: f"http://engine{placement[s.root]}", trace, "header",
                                   b.Variant("d", "placement", direct="oracle"), 10.0)
    latencies, errors, total, _ = asyncio.run(go())
    assert errors == 0 and len(latencies) == total
    for s in trace.sessions:  # a sub-agent goes where its root is
        assert hosts[s.id] == hosts[s.subagent.id] == {f"engine{placement[s.id]}"}


def test_session_work_charges_prefill_overhead_uncached_tokens_and_output():
    cfg = b.load_config(b.DEFAULT_SCENARIO, sessions=2, engines=2)
    trace = build_trace(cfg.scenario)
    reqs = trace.requests()
    tokens = [[len(t.messages)] * 32 for _, t in reqs]  # made-up ids: 2 blocks of 16 per request
    work = b.session_work(cfg, trace, tokens)
    assert set(work) == {s.id for s in trace.sessions}
    lat = cfg.latency
    s0 = [(s, t, tok) for (s, t), tok in zip(reqs, tokens) if s.root == "s0"]
    seen: set = set()
    expect = 0.0
    for _, t, tok in s0:  # a request whose token list was already stored under its root computes nothing
        key = tuple(tok)
        expect += lat.prefill_overhead_ms + (0 if key in seen else 32) * lat.prefill_us_per_token / 1000.0 \
            + t.max_tokens * lat.inter_token_ms
        seen.add(key)
    assert work["s0"] == pytest.approx(expect)


# --- open-loop arrivals -------------------------------------------------------------------------------------

def test_arrivals_are_a_seeded_poisson_process_over_the_duration():
    from v41flash_bench.routing.sessions import Arrivals
    a = Arrivals.from_doc({"kind": "poisson", "sessionsPerSecond": 4, "durationS": 50})
    t = a.times(41)
    assert t == a.times(41) != a.times(42)
    assert all(0 < x < 50 for x in t) and t == sorted(t)
    assert 150 <= len(t) <= 250  # 200 expected
    assert a.window == (15.0, 50.0)
    assert Arrivals.from_doc({"sessionsPerSecond": 1, "durationS": 10, "steadyAfterS": 2}).window == (2, 10)
    for bad in ({"kind": "burst", "sessionsPerSecond": 1, "durationS": 1}, {"sessionsPerSecond": 0, "durationS": 1},
                {"sessionsPerSecond": 1, "durationS": 10, "steadyAfterS": 10}, {"rate": 1}):
        with pytest.raises((ValueError, TypeError)):
            Arrivals.from_doc(bad)


def test_an_open_loop_scenario_starts_its_sessions_at_their_arrival_times(tmp_path):
    doc = yaml.safe_load(b.DEFAULT_SCENARIO.read_text())
    doc["scenario"]["arrivals"] = {"kind": "poisson", "sessionsPerSecond": 2, "durationS": 20}
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = b.load_config(path)
    trace = build_trace(cfg.scenario)
    starts = [s.start_s for s in trace.sessions]
    assert starts == cfg.scenario.arrivals.times(cfg.scenario.seed) and starts == sorted(starts)
    assert b.report_dict(cfg, [], "x", 0.5, {})["scenario"]["arrivals"]["sessions_per_second"] == 2


def test_replay_records_the_requests_sent_in_the_steady_window():
    import asyncio

    import httpx
    from v41flash_bench.routing.sessions import Arrivals
    sc = RoutingScenario(turns_min=1, turns_max=1, subagent_fraction=0.0, time_scale=0.0,
                         arrivals=Arrivals(sessions_per_second=40, duration_s=1.0, steady_after_s=0.5))
    trace = build_trace(sc)
    hosts = []

    def handler(request):
        hosts.append(request.url.host)
        return httpx.Response(200, json={"choices": []})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await b._replay(client, ["http://f0", "http://f1"], trace, "none", b.Variant("v", "random"),
                                   10.0, sc.arrivals.window)
    latencies, errors, total, sent = asyncio.run(go())
    assert errors == 0 and total == len(trace.sessions)
    want = [i for i, s in enumerate(trace.sessions) if 0.5 <= s.start_s < 1.0]
    assert abs(len(sent) - len(want)) <= 2 and set(sent) <= set(range(total))  # timer slack at the edges
    assert {"f0", "f1"} == set(hosts)  # requests spread over the front replicas


def test_the_window_oracle_counts_only_the_requests_it_is_given():
    orc = oracle([("a", list(range(32))), ("a", list(range(48))), ("b", list(range(32)))], 2, 16)
    assert orc.per_request == (0, 32, 0)
    assert orc.rate_of([1], [32, 48, 32]) == pytest.approx(32 / 48)
    assert orc.rate_of([0, 2], [32, 48, 32]) == 0.0
