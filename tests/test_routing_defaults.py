"""Routing defaults per profile: valid RoutingSpec values, and the ones the benchmark measured as ours."""
from __future__ import annotations

import pytest

from v41flash.api.v1alpha1 import RoutingSpec
from v41flash.routing import bench as b
from v41flash.routing.defaults import ROUTING_DEFAULTS, routing_defaults, with_defaults


@pytest.mark.parametrize("key", sorted(ROUTING_DEFAULTS))
def test_defaults_are_valid_routing_spec_values(key):
    fields = ROUTING_DEFAULTS[key].spec_fields()
    dumped = RoutingSpec.model_validate(fields).model_dump(by_alias=True)
    assert {k: dumped[k] for k in fields} == fields  # every key is a real spec.routing field


def test_header_keyed_policy_only_behind_the_session_proxy():
    # consistent_hash / sticky_least_loaded send every header-less request to one engine (4.00 max/mean):
    # a default that keys on x-session-id must come with the proxy that always sets it
    for d in ROUTING_DEFAULTS.values():
        assert d.policy == "sticky_least_loaded" and d.session_key == "derive"
        assert d.decode_policy == "round_robin" and not d.kv_events
        assert d.evidence and "PENDING" not in d.evidence


def _flag(args, name):
    return args[args.index(name) + 1]


def test_benchmark_measures_exactly_these_defaults():
    cfg = b.load_config(b.DEFAULT_SCENARIO)
    for v in (v for v in cfg.variants if v.ours):
        d = routing_defaults("low-latency", v.pd)
        assert v.policy == d.policy and (v.decode_policy or v.policy) == (d.decode_policy if v.pd else v.policy)
        if d.policy == "cache_aware":
            assert float(_flag(v.args, "--cache-threshold")) == d.cache_threshold
            assert int(_flag(v.args, "--balance-abs-threshold")) == d.balance_abs_threshold
            assert float(_flag(v.args, "--balance-rel-threshold")) == d.balance_rel_threshold
        else:
            assert not v.args  # the policy at its router defaults, as rendered
        # derive = the real proxy process in front of the router, not a header set by the client
        assert v.kv_events == d.kv_events and v.session_key == {"derive": "proxy", "client": "client"}[d.session_key]


def test_profiles_and_user_values_win():
    assert routing_defaults("high-throughput", False) == routing_defaults("low-latency", False)
    with pytest.raises(ValueError, match="unknown profile"):
        routing_defaults("cheap", False)
    merged = with_defaults({"policy": "cache_aware", "cacheThreshold": 0.6}, "low-latency", True)
    assert merged["policy"] == "cache_aware" and merged["cacheThreshold"] == 0.6
    assert merged["sessionKey"] == "derive"
    assert merged["decodePolicy"] == "round_robin" and merged["balanceAbsThreshold"] == 4
