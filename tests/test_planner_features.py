"""The planner follows the features actually rendered: DSpark on/off changes the decode tokens per step, a
decode host KV tier adds KV capacity; the shipped profiles are left alone when the defaults are rendered."""
import pytest

from v41flash.api import v1alpha1 as api
from v41flash.controller.autoscale import profile_for
from v41flash.planner.capacity import decode_replicas_needed
from v41flash.planner.profile import find_profile
from v41flash.render.resolve import resolve
from v41flash.vllm.features import KV_BYTES_PER_TOKEN


def planned_profile(spec: dict):
    s = api.V41FlashDeploymentSpec.model_validate(spec)
    return profile_for(s, resolve(s), None, "default")


def test_default_features_keep_the_shipped_profile_but_its_sequences_follow_the_rendered_max_num_seqs():
    shipped = find_profile("low-latency", "H200", "TP4", "TP4")
    planned = planned_profile({})
    assert planned.decode.max_num_seqs == 32 != shipped.decode.max_num_seqs  # P/D renders 32 per rank
    assert planned.prefill == shipped.prefill and planned.decode.tokens_per_step == shipped.decode.tokens_per_step
    assert shipped.decode.tokens_per_step == 3.45  # DSpark, as the shipped profiles assume


def test_dspark_off_sizes_decode_at_one_token_per_step_and_needs_more_replicas():
    on = planned_profile({})
    off = planned_profile({"features": {"speculativeDecoding": {"enabled": False}}})
    assert off.decode.tokens_per_step == 1.0 and off.prefill == on.prefill
    need = [decode_replicas_needed(p.decode, rate=4.0, output_tokens=444, context=140_000, itl_budget_s=0.03).replicas
            for p in (on, off)]
    assert need[1] > 2 * need[0]


def test_fewer_draft_tokens_cap_tokens_per_step():
    assert planned_profile({"features": {"speculativeDecoding": {"numSpeculativeTokens": 1}}}
                           ).decode.tokens_per_step == 2.0
    assert planned_profile({"features": {"speculativeDecoding": {"numSpeculativeTokens": 4}}}
                           ).decode.tokens_per_step == 3.45


def test_decode_host_kv_adds_kv_capacity_and_prefill_host_kv_does_not():
    shipped = planned_profile({})
    with_kv = planned_profile({"decode": {"kvOffload": {"sizeGiB": 32}}})
    assert with_kv.decode.kv_cache_tokens - shipped.decode.kv_cache_tokens == (32 << 30) // KV_BYTES_PER_TOKEN
    assert planned_profile({"prefill": {"kvOffload": {"sizeGiB": 32}}}) == planned_profile({})


def test_a_preset_host_kv_point_counts_too():
    p = planned_profile({"profile": "high-throughput", "gpu": {"product": "B200"}, "preset": "b200_agentx_dep",
                         "decode": {"point": "dep2_kv_c64"}})
    shipped = find_profile("high-throughput", "B200", "DEP2", "DEP2")
    assert p.decode.kv_cache_tokens == shipped.decode.kv_cache_tokens + (32 << 30) // KV_BYTES_PER_TOKEN


def test_an_unrenderable_spec_plans_on_the_shipped_profile():
    p = planned_profile({"decode": {"extraArgs": ["--no-such-flag"]}, "features": {"speculativeDecoding": {"enabled": False}}})
    assert p is find_profile("low-latency", "H200", "TP4", "TP4")


@pytest.mark.parametrize("gpu", ["H200", "B200", "B300", "GB300"])
def test_every_shipped_pair_follows_dspark(gpu):
    for profile in ("low-latency", "high-throughput"):
        off = planned_profile({"profile": profile, "gpu": {"product": gpu},
                               "features": {"speculativeDecoding": {"enabled": False}}})
        assert off is not None and off.decode.tokens_per_step == 1.0
