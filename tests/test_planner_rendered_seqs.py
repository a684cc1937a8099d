"""Decode capacity per replica is the concurrency the engines are rendered with: P/D renders --max-num-seqs 32
per rank (the GB300 AgentX P/D preset 40, a user's spec.decode.maxNumSeqs what it says), while the shipped
capacity profiles were measured at 128/256. Sized on the profile's 128, a decode rank would be asked to hold
four times the sequences it may batch, and the rest would queue for a slot."""
from __future__ import annotations

import math

import pytest

from v41flash.api import v1alpha1 as api
from v41flash.planner import capacity
from v41flash.planner.profile import find_profile, for_rendered_args, for_rendered_engines
from v41flash.render.engine import engine_config
from v41flash.render.resolve import resolve
from v41flash.vllm import args as vargs
from v41flash.vllm.features import max_num_seqs
from v41flash_bench.sim.scenario import AutoscaleScenario, profiles


def decode_args(spec: dict) -> tuple[str, ...]:
    s = api.V41FlashDeploymentSpec.model_validate(spec)
    return tuple(vargs.build_replica(engine_config(s, resolve(s), "decode")).leader.args)


@pytest.mark.parametrize("gpu", ["H200", "B200", "B300", "GB300"])
@pytest.mark.parametrize("serving", ["low-latency", "high-throughput"])
def test_the_profile_follows_the_rendered_max_num_seqs(gpu, serving):
    args = decode_args({"profile": serving, "gpu": {"product": gpu}})
    rendered = max_num_seqs(args)
    assert rendered in (32, 40)  # P/D rows (GB300 high-throughput: the AgentX P/D preset's decode point)
    shipped = find_profile(serving, gpu)
    assert shipped.decode.max_num_seqs >= 128  # what the profiles were measured at
    p = for_rendered_args(shipped, args)
    assert p.decode.max_num_seqs == rendered and p.prefill == shipped.prefill
    assert p.decode.max_batch_per_rank(100_000) == rendered


def test_a_users_max_num_seqs_is_what_the_planner_sizes_with():
    args = decode_args({"decode": {"maxNumSeqs": 64}})
    assert for_rendered_args(find_profile("low-latency", "H200"), args).decode.max_num_seqs == 64


def test_nothing_rendered_keeps_the_profiles_figure():
    shipped = find_profile("low-latency", "H200")
    assert for_rendered_engines(shipped, 5, 0, None) is shipped
    assert for_rendered_args(shipped, ("vllm", "serve", "m")).decode.max_num_seqs == shipped.decode.max_num_seqs
    assert max_num_seqs(("--max-num-seqs", "x")) is None  # garbage is not a number of sequences


def test_decode_sized_on_the_rendered_32_keeps_every_rank_within_its_batch_and_the_profiles_128_does_not():
    shipped = find_profile("low-latency", "H200")
    rendered = for_rendered_args(shipped, decode_args({}))
    rate, osl, context, itl_budget = 20.0, 1000.0, 100_000.0, 0.03
    wrong = math.ceil(capacity.decode_replicas_needed(shipped.decode, rate, osl, context, itl_budget).replicas)
    right = math.ceil(capacity.decode_replicas_needed(rendered.decode, rate, osl, context, itl_budget).replicas)
    assert right >= 2 * wrong
    # Little's law at those replicas: the shipped figure leaves each rank more sequences than it may batch
    assert capacity.decode_batch(rendered.decode, rate / wrong, osl, context) > 32
    assert capacity.decode_batch(rendered.decode, rate / right, osl, context) <= 32
    assert math.isinf(capacity.decode_itl(rendered.decode, rate, wrong, osl, context))
    assert capacity.decode_itl(rendered.decode, rate, right, osl, context) <= itl_budget


def test_the_benchmark_simulates_and_plans_the_rendered_engines():
    sc = AutoscaleScenario.model_validate({"name": "x", "deployment": {"gpuProduct": "B200",
                                                                       "servingProfile": "high-throughput"}})
    truth, planner = profiles(sc)
    assert truth.decode.max_num_seqs == planner.decode.max_num_seqs == 32
    own = AutoscaleScenario.model_validate({"name": "x", "deployment": {"decodeMaxNumSeqs": 96}})
    assert all(p.decode.max_num_seqs == 96 for p in profiles(own))
