"""Capacity-profile format, shipped profiles, curve fitting and the `v41flash profile` commands."""
from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from planner_sim import PROFILE
from v41flash import gpus
from v41flash.cli.main import main
from v41flash.planner import capacity
from v41flash_bench.profiles.fit import build_profile, fit_decode, fit_prefill
from v41flash.planner.profile import find_profile, load_profile, profile_from_dict, shipped_profiles

PRESETS = {
    ("low-latency", g) for g in ("H200", "B200", "B300", "GB300")
} | {("high-throughput", g) for g in ("H200", "B200", "B300", "GB300")}


def test_curves_follow_their_formulas():
    p = PROFILE.prefill
    assert p.request_seconds(1000) == pytest.approx(0.02 + 1.53e-5 * 1000 + 1.2e-10 * 1000 * 1000)
    # cached tokens cost only attention: new * 2 * cached
    assert p.request_seconds(1000, 5000) == pytest.approx(p.request_seconds(1000) + 1.2e-10 * 1000 * 10000)
    assert p.step_seconds([(500, 0), (500, 500)]) == pytest.approx(0.02 + 1.53e-5 * 1000 + 1.2e-10 * (500 * 500 + 500 * 1500))
    d = PROFILE.decode
    assert d.itl_seconds(10, 1000) == pytest.approx((0.007 + 0.00017 * 10 + 6e-11 * 10 * 1000) / 2.5)
    b = d.batch_at_itl(0.01, 1000)
    assert d.itl_seconds(b, 1000) == pytest.approx(0.01)
    assert d.batch_at_itl(0.001, 1000) == 0.0  # below the unloaded step: nothing fits
    assert d.max_batch_per_rank(1_000_000) == 80.0  # KV-bound before max-num-seqs


def test_format_refuses_typos_and_bad_layouts():
    doc = PROFILE.to_dict()
    doc["prefill"]["perTokn"] = 1
    with pytest.raises(ValidationError):
        profile_from_dict(doc)
    doc = PROFILE.to_dict()
    doc["decode"]["dataParallelSize"] = 3  # 3 ranks on 4 GPUs
    with pytest.raises(ValidationError, match="dataParallelSize 3 must divide"):
        profile_from_dict(doc)
    assert profile_from_dict(yaml.safe_load(PROFILE.to_yaml())) == PROFILE


def test_shipped_profiles_cover_the_presets_and_are_sane():
    shipped = shipped_profiles()
    assert {(p.serving_profile, p.gpu_product) for p in shipped} >= PRESETS
    for p in shipped:
        # a 4k prompt prefills in 20 ms .. 2 s; an unloaded decode step is 1 .. 100 ms
        assert 0.02 < p.prefill.request_seconds(4096) < 2.0, p.metadata.name
        assert 0.001 < p.decode.step_seconds(1, 8192) < 0.1, p.metadata.name
        assert p.metadata.source
    pd = find_profile("high-throughput", "GB300", "DEP4", "DEP16")
    assert pd.metadata.name == "gb300-pd-dep4-dep16" and pd.decode.gpus_per_replica == 16
    assert find_profile("high-throughput", "GB300").metadata.name == "gb300-high-throughput"
    assert find_profile("low-latency", "B200", "TP8", "TP8").metadata.name == "b200-low-latency"  # layout fallback
    assert find_profile("low-latency", "MI355X") is None


def test_agentx_ttft_anchor_is_met_by_the_gb300_pd_profile():
    # published: P90 TTFT 0.32 s at 94k tok/s/chip (cached+input+output) on GB300, ISL ~142k, >96 % cached
    p = find_profile("high-throughput", "GB300", "DEP4", "DEP16")
    isl, hit = 142_000, 0.96
    rate_per_gpu = 94_000 / (isl + 444)
    ttft = capacity.prefill_ttft(p.prefill, rate_per_gpu * p.prefill.gpus_per_replica, 1, isl * (1 - hit), isl * hit, 0.9)
    assert ttft == pytest.approx(0.32, rel=0.35)


def test_fits_recover_known_coefficients_exactly():
    a, b, c = 0.03, 2e-5, 5e-11
    pts = [(n, k, a + b * n + c * n * (n + 2 * k)) for n in (512, 4096, 16384, 65536) for k in (0, 32768)]
    curve, fit = fit_prefill(pts)
    assert (curve.overhead, curve.per_token, curve.per_token_context) == pytest.approx((a, b, c), rel=1e-6)
    assert fit.max_relative_error < 1e-9
    pts = [(bs, ctx, 0.01 + 1e-4 * bs + 3e-10 * bs * ctx) for bs in (1, 16, 128) for ctx in (4096, 131072)]
    curve, _ = fit_decode(pts)
    assert (curve.overhead, curve.per_sequence, curve.per_sequence_context) == pytest.approx((0.01, 1e-4, 3e-10), rel=1e-6)
    # a negative unconstrained solution is clipped to the best non-negative one
    curve, _ = fit_decode([(1, 1000, 0.010), (100, 1000, 0.009), (200, 1000, 0.008)])
    assert curve.per_sequence == 0.0 and curve.per_sequence_context == 0.0


def _run_doc():
    return {
        "name": "lab-h200-tp4",
        "run": "lab-2026-11-29",
        "servingProfile": "low-latency",
        "gpuProduct": "H200",
        "prefill": {"points": [
            {"isl": n, "cachedTokens": 0, "ttftSeconds": 0.05 + 3e-5 * n + 1e-10 * n * n, "concurrency": 1}
            for n in (1024, 8192, 32768, 65536)
        ] + [{"isl": 8192, "ttftSeconds": 9.0, "concurrency": 64}]},  # queued: must be ignored
        "decode": {"tokensPerStep": 2.0, "points": [
            {"batch": bs, "context": 8192, "itlSeconds": (0.012 + 2e-4 * bs + 1e-10 * bs * 8192) / 2.0} for bs in (1, 8, 64)
        ] + [{"batch": 16, "context": 65536, "itlSeconds": (0.012 + 2e-4 * 16 + 1e-10 * 16 * 65536) / 2.0}]},
    }


def test_build_profile_from_a_run_fills_unmeasured_fields_from_the_shipped_profile():
    profile, fits = build_profile(_run_doc())
    base = find_profile("low-latency", "H200")
    assert profile.metadata.name == "lab-h200-tp4"
    assert profile.prefill.curve.per_token == pytest.approx(3e-5, rel=1e-6)
    assert profile.decode.curve.overhead == pytest.approx(0.012, rel=1e-6)
    assert profile.decode.tokens_per_step == 2.0
    assert profile.decode.max_num_seqs == base.decode.max_num_seqs
    assert profile.prefill.cold_start_seconds == base.prefill.cold_start_seconds
    assert fits["prefill"].points == 4 and fits["prefill"].max_relative_error < 1e-9


def test_cli_build_and_show(tmp_path, capsys):
    src = tmp_path / "run.json"
    src.write_text(json.dumps(_run_doc()))
    out = tmp_path / "lab.yaml"
    assert main(["profile", "build", "--from", str(src), "--out", str(out)]) == 0
    assert "prefill: 4 points" in capsys.readouterr().err
    built = load_profile(out)
    assert built.metadata.name == "lab-h200-tp4"
    assert main(["profile", "show", str(out), "h200-low-latency", "--isl", "8192", "--hit-rate", "0"]) == 0
    table = capsys.readouterr().out
    assert "| lab-h200-tp4 | TP4/TP4 |" in table and "| h200-low-latency | TP4/TP4 |" in table
    assert main(["profile", "show", "no-such-profile"]) == 1
    assert "no shipped profile or file named 'no-such-profile'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"servingProfile": "low-latency", "gpuProduct": "H200", "base": None}))
    assert main(["profile", "build", "--from", str(bad)]) == 1
    assert "no points measured and no base profile" in capsys.readouterr().err


def test_show_lists_every_shipped_profile(capsys):
    assert main(["profile", "show"]) == 0
    out = capsys.readouterr().out
    for p in shipped_profiles():
        assert f"| {p.metadata.name} |" in out


def test_shipped_default_layouts_are_the_gpu_tables_defaults():
    for p in shipped_profiles():
        if p.metadata.name.count("-") > 2:  # layout-specific profiles (gb300-pd-dep4-dep16) are not defaults
            continue
        product = gpus.gpu(p.gpu_product)
        if p.serving_profile == "high-throughput":
            dp = gpus.default_data_parallel_size(product, high_throughput=True)
            assert (p.prefill.parallelism, p.prefill.gpus_per_replica, p.prefill.data_parallel_size) == (f"DEP{dp}", dp, dp)
        else:
            tp = gpus.default_tensor_parallel_size(product, high_throughput=False)
            assert (p.prefill.parallelism, p.prefill.gpus_per_replica) == (f"TP{tp}", tp)
        assert p.decode.parallelism == p.prefill.parallelism
