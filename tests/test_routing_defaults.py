"""Routing defaults (the RoutingSpec field defaults, their one home) are the ones the benchmark measured as ours."""
from __future__ import annotations

from v41flash.api.v1alpha1 import RoutingSpec
from v41flash_bench.routing import runner as b


def test_header_keyed_policy_only_behind_the_session_proxy():
    # consistent_hash / sticky_least_loaded send every header-less request to one engine (4.00 max/mean):
    # a default that keys on x-session-id must come with the proxy that always sets it
    d = RoutingSpec()
    assert d.policy == "sticky_least_loaded" and d.session_key == "derive"
    assert d.decode_policy == "round_robin" and not d.kv_events


def _flag(args, name):
    return args[args.index(name) + 1]


def test_benchmark_measures_exactly_these_defaults():
    d = RoutingSpec()
    cfg = b.load_config(b.DEFAULT_SCENARIO)
    ours = [v for v in cfg.variants if v.ours]
    assert ours
    for v in ours:
        assert v.policy == d.policy and (v.decode_policy or v.policy) == (d.decode_policy if v.pd else v.policy)
        if d.policy == "cache_aware":
            assert float(_flag(v.args, "--cache-threshold")) == d.cache_threshold
            assert int(_flag(v.args, "--balance-abs-threshold")) == d.balance_abs_threshold
            assert float(_flag(v.args, "--balance-rel-threshold")) == d.balance_rel_threshold
        else:
            assert not v.args  # the policy at its router defaults, as rendered
        # derive = the real proxy process in front of the router, not a header set by the client
        assert v.kv_events == d.kv_events and v.session_key == {"derive": "proxy", "client": "client"}[d.session_key]
        # and the router's environment as rendered: sessions counted for sessionAffinityTtlSeconds
        assert b.router_env(v) == {"VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S": str(d.session_affinity_ttl_seconds)}
    assert all(b.router_env(v) == {} for v in cfg.variants if not v.ours)
