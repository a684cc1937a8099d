"""`v41flash bench serve` without an endpoint (pure): the workloads, the figures of a point, the record's A/B rule,
the profile fit from records, the Job and `profile apply --dry-run`."""
from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys

import pytest
import yaml

from v41flash_bench.profiles.fit import build_profile
from v41flash_bench.profiles.from_records import check_held_out, run_from_records
from v41flash_bench.serve import figures as F
from v41flash_bench.serve import records as R
from v41flash_bench.serve import workloads as W
from v41flash_bench.serve.client import Outcome
from v41flash_bench.serve.compare import compare
from v41flash_bench.serve.driver import Load, PointRun
from v41flash_bench.serve.job import job_args, job_manifest
from v41flash_bench.serve.run import Method, WorkloadSpec, make_record
from v41flash_bench.serve.target import Target, system_from_cr

SMALL = {"turns_min": 3, "turns_max": 4, "system_tokens": 20, "first_turn_tokens": 5, "new_tokens_median": 4,
         "new_tokens_mean": 5, "new_tokens_max": 20, "output_tokens_median": 3, "output_tokens_mean": 4,
         "output_tokens_max": 8, "subagent_fraction": 1.0, "subagent_turns_min": 2, "subagent_turns_max": 2}


# --- workloads ------------------------------------------------------------------------------------------------

def test_agent_sessions_resend_the_whole_context_and_are_seeded_by_seed_and_tag():
    a = list(itertools.islice(W.agentx_scripts(7, "p0r0", SMALL), 5))
    assert a == list(itertools.islice(W.agentx_scripts(7, "p0r0", SMALL), 5))  # same requests on every endpoint
    for s in a:
        reqs = [r for _, r in s.steps]
        parent = [r for r in reqs if not r.session.endswith(".sub")]
        for prev, nxt in zip(parent, parent[1:]):
            # the next turn resends everything, then the answer and the newest tool result
            assert nxt.messages[:len(prev.messages)] == prev.messages
            assert [m[0] for m in nxt.messages[len(prev.messages):]] == ["assistant", "user"]
        subs = [r for r in reqs if r.session.endswith(".sub")]
        assert subs, "subagent_fraction 1: every session spawns a sub-agent"
        assert s.steps[0][0] == 0.0 and any(p > 0 for p, _ in s.steps[1:])  # think times between turns
    other = next(W.agentx_scripts(7, "p0r1", SMALL))
    shared = [m for m in other.steps[0][1].messages if m in a[0].steps[0][1].messages]
    assert [m[0] for m in shared] == ["system"]  # a new tag shares only the system prompt: no cross-repeat hits
    assert W.digest(a[:2]) == W.digest(list(itertools.islice(W.agentx_scripts(7, "p0r0", SMALL), 2)))
    assert W.digest(a[:2]) != W.digest([other, a[1]])


def test_agentx_set_refuses_a_field_that_is_not_the_session_shape():
    with pytest.raises(ValueError, match="nope"):
        W.agentx_scenario({"nope": 1})
    with pytest.raises(ValueError, match="sessions"):
        W.agentx_scenario({"sessions": 3})  # the driver decides how many sessions start


def test_replay_log_is_read_at_its_own_times_and_bad_lines_are_named(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"time": 105.5, "messages": [{"role": "user", "content": "b"}], "max_tokens": 3}\n\n'
                   '{"time": 100, "messages": [{"role": "user", "content": "a"}], "max_tokens": 2, "session": "s"}\n')
    scripts = W.read_replay(log)
    assert [(s.at, s.steps[0][1].max_tokens, s.steps[0][1].session) for s in scripts] == [(0.0, 2, "s"), (5.5, 3, "")]
    log.write_text('{"time": 1, "messages": [], "max_tokens": 3}\n')
    with pytest.raises(ValueError, match=":1: empty messages"):
        W.read_replay(log)
    log.write_text('{"time": 1, "max_tokens": 3}\n')
    with pytest.raises(ValueError, match=":1: expected"):
        W.read_replay(log)


def test_fixed_requests_have_the_asked_length_and_share_no_prefix():
    a, b = itertools.islice(W.fixed_scripts(1, "t", 50, 7), 2)
    (_, ra), (_, rb) = a.steps[0], b.steps[0]
    assert len(ra.messages[0][1].split()) == 50 and ra.max_tokens == 7
    assert ra.messages[0][1].split()[0] != rb.messages[0][1].split()[0]


# --- figures of a point -----------------------------------------------------------------------------------------

def _ok(start, ttft, e2e, out=11, prompt=100, cached=0, script="s"):
    return Outcome(script, start, ok=True, ttft=ttft, e2e=e2e, decode_s=e2e - ttft, prompt_tokens=prompt,
                   cached_tokens=cached, output_tokens=out, usage=True)


def _run():
    outs = [_ok(0.5, 9.0, 9.5),  # warm-up: not measured
            _ok(1.0, 0.1, 1.1), _ok(2.0, 0.3, 1.3, cached=80), _ok(3.0, 0.2, 1.2, cached=60),
            Outcome("s", 4.0, error="HTTP 503: busy"), Outcome("s", 5.0, error="cancelled"),
            _ok(11.5, 5.0, 6.0)]  # after the window: not measured
    return PointRun(outs, [], {"a": 5.0, "b": 12.0}, warmup_s=1.0, duration_s=10.0, wall_s=20.0)


def test_a_point_counts_only_the_window_and_only_successful_tokens():
    fig = F.summarize(_run(), gpus=4, decode_ranks=2)
    assert fig["requests"] == {"sent": 5, "succeeded": 3, "failed": 1, "cancelled": 1, "success_rate": 0.6,
                               "errors": {"HTTP 503": 1, "cancelled": 1}}
    assert fig["throughput"]["output_tokens_per_s"] == pytest.approx(33 / 10)
    assert fig["throughput"]["cached_tokens_per_s"] == pytest.approx(140 / 10)
    assert fig["throughput"]["input_tokens_per_s"] == pytest.approx(160 / 10)  # uncached prompt tokens
    assert fig["per_gpu"]["total"] == pytest.approx((300 + 33) / 10 / 4)
    assert fig["tokens"]["hit_rate"] == pytest.approx(140 / 300)
    assert fig["cache"]["hit"]["requests"] == 2 and fig["cache"]["miss"]["requests"] == 1
    assert fig["cache"]["miss"]["ttft_s"]["p50"] == pytest.approx(0.1)
    assert fig["latency"]["itl_s"]["p50"] == pytest.approx(0.1)  # 1.0 s for 10 tokens after the first
    assert fig["sessions_completed"] == 1  # "a" ended in the window, "b" after it
    assert fig["fit"]["running_decode"] == pytest.approx(3.0 / 10)
    assert fig["fit"]["decode_batch_per_rank"] == pytest.approx(3.0 / 10 / 2)
    cold = F.summarize(_run(), window=(0.0, 1.0))
    assert cold["requests"]["sent"] == 1 and cold["latency"]["ttft_s"]["p50"] == 9.0


def test_slo_and_cost():
    fig = F.summarize(_run(), gpus=4)
    assert F.slo_met(fig, {"ttft_s": 1.0, "ttft_percentile": 90, "e2e_p95_s": 5}) is False  # errors break it
    assert F.slo_met(fig, None) is None
    managed = F.cost(fig, gpus=None, usd_per_gpu_hour=None, prices={"input": 0.30, "output": 1.20, "cached": 0.03})
    assert managed["usd_window"] == pytest.approx((160 * 0.30 + 33 * 1.20 + 140 * 0.03) / 1e6)
    assert managed["usd_per_completed_session"] == pytest.approx(managed["usd_window"])  # one session completed
    hosted = F.cost(fig, gpus=4, usd_per_gpu_hour=2.26, prices=None)
    assert hosted["usd_window"] == pytest.approx(4 * 2.26 * 10 / 3600)
    assert hosted["tokens_per_usd"] == pytest.approx(333 / hosted["usd_window"])
    assert "unknown" in F.cost(fig, gpus=None, usd_per_gpu_hour=None, prices=None)["basis"]


# --- records and A/B --------------------------------------------------------------------------------------------

CR = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "metadata": {"name": "d"},
      "spec": {"profile": "low-latency", "model": {"servedModelName": "m"}, "gpu": {"product": "H200"},
               "prefill": {"minReplicas": 1, "maxReplicas": 2}, "decode": {"minReplicas": 1, "maxReplicas": 2,
                                                                             "maxNumSeqs": 16}},
      "status": {"servingRevision": "abc", "prefill": {"readyReplicas": 1}, "decode": {"readyReplicas": 2}}}


def _record(cr=CR, load=1, point_run=None):
    system, identity, unknown, gpus, ranks, slo = system_from_cr(cr)
    t = Target("deployment", "http://x", "m", identity, system, unknown, gpus=gpus, decode_ranks=ranks, slo=slo)
    fig = F.summarize(point_run or _run(), gpus=gpus, decode_ranks=ranks)
    return make_record(t, WorkloadSpec("fixed", isl=100, osl=11), Method(), Load("concurrency", load), "warm", 0,
                       "r1", [fig, fig], ["d1", "d2"], 1.0)


def test_the_record_reads_the_system_from_the_cr():
    r = _record()
    s = r["system"]
    assert s["checkpoint"] == "deepseek-ai/DeepSeek-V4.1-Flash-1017" and s["gpu_model"] == "H200"
    assert s["runtime"] == "vLLM 0.33.0" and s["interconnect"] == "nvlink"
    assert s["roles"]["decode"]["tp"] == 4 and s["roles"]["decode"]["args"]["--max-num-seqs"] == "16"
    assert s["roles"]["decode"]["precision"]["kv_cache_dtype"]
    assert s["gpu_count"] == 12  # 1 prefill + 2 decode replicas Ready, 4 GPUs each
    assert r["slo"]["ttft_s"] == 2.0 and r["method"]["repeats"] == 2
    assert json.loads(json.dumps(r))  # one JSON line


def _with(cr, **role_edits):
    cr = copy.deepcopy(cr)
    for role, edit in role_edits.items():
        cr["spec"][role].update(edit)
    return cr


def test_ab_compares_one_engine_flag_and_refuses_two():
    a = _record()
    one = _record(_with(CR, decode={"maxNumSeqs": 8}))
    ok, mine, other = R.comparable(a, one, "--max-num-seqs")
    assert ok and mine == ["system.roles.decode.args.--max-num-seqs"] and not other
    two = _record(_with(CR, decode={"maxNumSeqs": 8, "extraArgs": ["--block-size", "32"]}))
    ok, mine, other = R.comparable(a, two, "--max-num-seqs")
    assert not ok and "system.roles.decode.args.--block-size" in other
    result = compare([a], [two], "--max-num-seqs")
    assert not result["comparable"] and "--block-size" in result["refused"][0]
    assert not R.comparable(a, _record(), "--max-num-seqs")[0]  # nothing differs: no A/B
    other_requests = copy.deepcopy(one)
    other_requests["workload"]["requests_sha256"] = ["zz", "d2"]
    assert not R.comparable(a, other_requests, "--max-num-seqs")[0]  # not the same requests
    assert compare([a], [one], "--max-num-seqs")["comparable"]
    assert R.comparable(a, two, "system")[0]  # self-hosted vs managed: the whole system is the variable


def test_records_file_round_trip_refuses_other_json(tmp_path):
    R.write(tmp_path / R.RECORDS, [_record()])
    assert R.read(tmp_path)[0]["schema"] == R.SCHEMA
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match="not a bench serve record"):
        R.read(tmp_path / "x.jsonl")


# --- the profile fit from records -----------------------------------------------------------------------------

def _decode_point(batch_total, itl, isl=1000, load=None):
    """A record whose decode phase held ``batch_total`` requests on average at ``itl`` s per token."""
    n, out = 100, 51
    decode_s = itl * (out - 1)
    # 100 requests over 10 s whose decode phases sum to batch_total x 10 s
    outs = [_ok(1.0 + i * 0.1, 0.05, 0.05 + decode_s, out=out, prompt=isl) for i in range(n)]
    scale = batch_total * 10.0 / (n * decode_s)
    run = PointRun(outs, [], {}, warmup_s=1.0, duration_s=10.0, wall_s=12.0)
    r = _record(load=load or batch_total, point_run=run)
    r["figures"]["fit"]["decode_batch_per_rank"] *= scale  # as if that many were running
    return r


def test_profile_build_fits_records_and_predicts_a_held_out_load():
    # the simulator's decode: ITL = 10 ms x (1 + (B - 1) / 15) with B requests running on a rank
    itl = lambda b: 0.010 * (1 + (b - 1) / 15)  # noqa: E731
    recs = [_decode_point(b, itl(b)) for b in (1, 2, 4, 8, 12)]
    run = run_from_records(recs, held_out="concurrency=8")
    assert run["gpuProduct"] == "H200" and run["decode"]["maxNumSeqs"] == 16 and run["decode"]["parallelism"] == "TP4"
    assert len(run["decode"]["points"]) == 4
    profile, fits = build_profile(run)
    assert fits["decode"].max_relative_error < 0.01
    rows = check_held_out(profile, recs, "concurrency=8")
    assert rows and all(abs(r["error"]) < 0.02 for r in rows)
    with pytest.raises(ValueError, match="no record at that load"):
        run_from_records(recs, held_out="concurrency=3")


# --- the Job and profile apply ------------------------------------------------------------------------------------

def test_the_job_runs_the_same_command_in_the_namespace():
    argv = ["--deployment", "d", "-n", "ns", "--job", "--job-image", "img:1", "--out", "here", "--kubeconfig=k",
            "--rate", "1,2"]
    assert job_args(argv) == ["--deployment", "d", "-n", "ns", "--rate", "1,2", "--out", "/results"]
    docs = list(yaml.safe_load_all(job_manifest(argv, "d", "ns", "img:1")))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "Job"]
    job = docs[-1]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "img:1" and "--rate 1,2 --out /results" in container["command"][2]
    assert job["metadata"]["namespace"] == "ns"
    import kubernetes_validate
    for doc in docs:  # the schemas of the pinned Kubernetes minor, unknown fields refused
        kubernetes_validate.validate(doc, "1.36.0", strict=True)
    with pytest.raises(ValueError, match="--job-image"):
        job_manifest(argv, "d", "ns", "")


def test_profile_apply_dry_run_prints_the_configmap_and_the_patch(tmp_path):
    from prereq import REPO
    out = subprocess.run([sys.executable, "-m", "v41flash.cli.main", "profile", "apply", "--from",
                          str(REPO / "e2e/autoscale/sim-profile.yaml"), "--deployment", "d", "-n", "ns", "--dry-run"],
                         capture_output=True, text=True, check=True).stdout
    cm, cr = yaml.safe_load_all(out)
    assert cm["metadata"] == {"name": "d-capacity-profile", "namespace": "ns",
                              "labels": {"app.kubernetes.io/component": "capacity-profile"}}
    assert yaml.safe_load(cm["data"]["profile.yaml"])["kind"] == "CapacityProfile"
    assert cr["spec"] == {"autoscaling": {"capacityProfile": "d-capacity-profile"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: CapacityProfile\nnope: 1\n")
    r = subprocess.run([sys.executable, "-m", "v41flash.cli.main", "profile", "apply", "--from", str(bad),
                        "--deployment", "d", "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 1 and "bad.yaml" in r.stderr


@pytest.mark.parametrize("argv, message", [
    ([], "--deployment NAME"),
    (["--url", "http://x", "--price-input", "0.3"], "three"),
    (["--deployment", "d", "--price-input", "1", "--price-output", "1", "--price-cached", "1"], "managed API's"),
    (["--deployment", "d", "--gpus", "8"], "declare a --url target"),
    (["--url", "http://x", "--concurrency", "1", "--rate", "1"], "not both"),
    (["--url", "http://x", "--workload", "replay"], "--replay FILE"),
    (["--url", "http://x", "--workload", "fixed", "--agentx-set", "turns_max=3"], "belongs to --workload agentx"),
    (["--url", "http://x", "--agentx-set", "nope=3"], "nope"),
    (["--url", "http://x", "--cold", "--warmup", "0"], "--warmup > 0"),
    (["--url", "http://x", "--rate", "0"], "numbers > 0"),
])
def test_bench_serve_refuses_flags_that_would_be_ignored_or_contradict(argv, message):
    import argparse
    from v41flash_bench.serve.cli import add_parsers, build
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    args = parser.parse_args(["serve", "--out", "x", *argv])
    with pytest.raises(ValueError, match=message):
        build(args)
