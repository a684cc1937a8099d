"""The simulator launcher's per-pod knobs (start delay, forced start failure, latency factor), read from the
same per-pod simulator arguments (V41F_SIM_ARGS) the supervisor already passes, and what the supervisor does
with them."""
from __future__ import annotations

import pytest

from e2e.engine_pods import VllmArgs, pod_sim_command, start_plan
from e2e.pod_spec import flag_values
from v41flash_bench.inference_sim import SimKnobs, SimLatency, split_knobs


def test_no_knobs_leaves_the_arguments_alone():
    knobs, rest = split_knobs(["--seed", "1", "--max-waiting-queue-length=3"])
    assert knobs == SimKnobs()
    assert rest == ["--seed", "1", "--max-waiting-queue-length=3"]


@pytest.mark.parametrize("args, want", [
    (["--v41f-start-delay=7.5"], SimKnobs(start_delay_s=7.5)),
    (["--v41f-start-delay", "3"], SimKnobs(start_delay_s=3.0)),
    (["--v41f-fail-start"], SimKnobs(fail_start=True)),
    (["--v41f-latency-factor=4"], SimKnobs(latency_factor=4.0)),
    (["--v41f-latency-factor", "0.5", "--v41f-start-delay=1", "--v41f-fail-start"],
     SimKnobs(start_delay_s=1.0, fail_start=True, latency_factor=0.5)),
])
def test_knobs_are_parsed_and_taken_out(args, want):
    knobs, rest = split_knobs(["--seed", "2", *args, "--mode", "echo"])
    assert knobs == want
    assert rest == ["--seed", "2", "--mode", "echo"]


@pytest.mark.parametrize("args, field", [
    (["--v41f-start-delay=-1"], "--v41f-start-delay"),
    (["--v41f-start-delay=soon"], "--v41f-start-delay"),
    (["--v41f-start-delay"], "--v41f-start-delay"),
    (["--v41f-latency-factor=0"], "--v41f-latency-factor"),
    (["--v41f-latency-factor=nan"], "--v41f-latency-factor"),
    (["--v41f-latency-factor=inf"], "--v41f-latency-factor"),
    (["--v41f-fail-start=yes"], "--v41f-fail-start"),
    (["--v41f-start-dealy=3"], "--v41f-start-dealy"),
])
def test_bad_knobs_are_refused_naming_the_flag(args, field):
    with pytest.raises(ValueError, match=field):
        split_knobs(args)


def test_latency_factor_scales_prefill_only():
    lat = SimLatency(prefill_overhead_ms=15, prefill_us_per_token=20, inter_token_ms=20, time_factor_under_load=2.0)
    assert lat.scaled(1.0) == lat
    assert lat.scaled(3.0) == SimLatency(45, 60, 20, 2.0)


def test_pod_sim_command_applies_the_factor_and_passes_no_knob_to_the_simulator():
    v = VllmArgs(("m",), 8000, None, None, 1, False)
    base, _ = pod_sim_command("/bin/sim", "prefill", "127.1.2.3", v)
    argv, _ = pod_sim_command("/bin/sim", "prefill", "127.1.2.3", v,
                              ["--v41f-latency-factor=3", "--v41f-start-delay=2", "--seed", "1"])
    assert flag_values(base, "--prefill-overhead") == ["15ms"]
    assert flag_values(argv, "--prefill-overhead") == ["45ms"]
    assert flag_values(argv, "--prefill-time-per-token") == ["60us"]
    assert flag_values(argv, "--inter-token-latency") == flag_values(base, "--inter-token-latency")
    assert not [a for a in argv if a.startswith("--v41f-")]
    assert argv[-2:] == ["--seed", "1"]


def test_start_plan():
    now = 100.0
    assert start_plan(SimKnobs(), now) == (now, "")
    assert start_plan(SimKnobs(start_delay_s=5), now) == (105.0, "")
    at, problem = start_plan(SimKnobs(fail_start=True), now)
    assert at == float("inf") and "--v41f-fail-start" in problem


def test_itl_factor_slows_the_inter_token_latency_only():
    """--v41f-itl-factor makes a straggler on purpose: ITL x X, prefill (TTFT) as before."""
    assert split_knobs(["--v41f-itl-factor", "2", "--seed", "1"]) == (SimKnobs(itl_factor=2.0), ["--seed", "1"])
    v = VllmArgs(("m",), 8000, None, None, 1, False)
    base, _ = pod_sim_command("/bin/sim", "decode", "127.1.2.3", v)
    argv, _ = pod_sim_command("/bin/sim", "decode", "127.1.2.3", v, ["--v41f-itl-factor=2"])
    assert flag_values(base, "--inter-token-latency") == ["10ms"]
    assert flag_values(argv, "--inter-token-latency") == ["20ms"]
    assert flag_values(argv, "--prefill-overhead") == flag_values(base, "--prefill-overhead")
    with pytest.raises(ValueError, match="--v41f-itl-factor"):
        split_knobs(["--v41f-itl-factor=0"])
