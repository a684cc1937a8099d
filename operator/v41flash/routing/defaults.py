"""Routing defaults per profile, chosen by measurement (`v41flash bench routing`; docs/2026-11-30-routing.md).

Data, not logic: the values a V41FlashDeployment gets when spec.routing leaves them out. The measured
rule behind them: with vllm-router 0.1.17 only a policy that ignores session headers keeps working when
clients send none (consistent_hash / sticky_least_loaded put every header-less request on ONE engine,
the `user` body field is not read), and cache_aware only balances when its load thresholds are low
enough to bind and its cache threshold sits between the shared-prefix share of a new session's first
request and the reuse share of a continuing turn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PROFILES = ("low-latency", "high-throughput")  # TP4, DEP2 (spec.profile)


@dataclass(frozen=True)
class RoutingDefaults:
    policy: str  # prefill policy (or the only one, aggregated)
    decode_policy: str  # P/D decode policy
    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float
    kv_events: bool
    session_affinity_ttl_seconds: int
    evidence: str  # the measurement that chose these values

    def spec_fields(self) -> dict[str, Any]:
        """As spec.routing fields (camelCase, the CRD's names)."""
        d = asdict(self)
        d.pop("evidence")
        return {_camel(k): v for k, v in d.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


# bench/routing/agentx-small.yaml + cache-aware-sweep.yaml (48 sessions, 4 engines, 636 requests, oracle
# hit 0.871): 0.8/4/1.25 gave 0.94-0.96x oracle at running max/mean 1.11-1.24 in six runs, with and
# without session headers (target met in 3 of 6, the rest at 0.942-0.949x); threshold 0.5 -> 0.97-1.00x
# at 1.37-1.39, 0.7 -> 0.97-0.98x at 1.25-1.49, 0.9 -> 0.87x at 1.21; defaults (0.3/64/1.5) -> one engine.
_CACHE_AWARE = dict(policy="cache_aware", cache_threshold=0.8, balance_abs_threshold=4, balance_rel_threshold=1.25,
                    kv_events=False, session_affinity_ttl_seconds=600)

AGGREGATED = RoutingDefaults(
    decode_policy="round_robin", **_CACHE_AWARE,
    evidence="cache_aware 0.8/4/1.25: 0.94-0.96x oracle hit at running max/mean 1.11-1.24, the same with and "
             "without x-session-id; consistent_hash/sticky_least_loaded: 0.97-0.99x with it, one engine "
             "(max/mean 4.00) without",
)

# bench/routing/pd.yaml and agentx-small.yaml (2 prefill + 2 decode engines): cache_aware prefill +
# round_robin decode gave prefill 0.97-0.98x oracle at max/mean 1.07-1.26 in both modes (four runs);
# cache_aware decode kept more decode-side hits (0.84 vs 0.78) but pushed the prefill spread to
# 1.16-1.28; sticky/sticky: 1.00x at 1.01 with a header, 0.89x without (like round_robin).
DISAGGREGATED = RoutingDefaults(
    decode_policy="round_robin", **_CACHE_AWARE,
    evidence="P/D cache_aware/round_robin 0.8/4/1.25: prefill 0.97-0.98x oracle hit at max/mean 1.07-1.26 with "
             "and without x-session-id (cache_aware decode: 1.16-1.28)",
)

# DEP2 engines are routed per DP rank (--intra-node-data-parallel-size), i.e. like twice the engines.
# At 8 engines (64 sessions) cache_aware 0.8/4/1.25 kept 0.94-0.95x oracle but spread 1.94-2.16, and
# lower balance thresholds lost hits without fixing it; the header-keyed policies put header-less
# traffic on one engine (8.00). No measured setting is better for DEP2, so it shares TP4's values.
ROUTING_DEFAULTS: dict[tuple[str, bool], RoutingDefaults] = {
    ("low-latency", False): AGGREGATED,
    ("high-throughput", False): AGGREGATED,
    ("low-latency", True): DISAGGREGATED,
    ("high-throughput", True): DISAGGREGATED,
}


def routing_defaults(profile: str, disaggregated: bool) -> RoutingDefaults:
    """The measured defaults for a profile (spec.profile) and topology (prefill role enabled = P/D)."""
    try:
        return ROUTING_DEFAULTS[(profile, disaggregated)]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})") from None


def with_defaults(routing: dict[str, Any], profile: str, disaggregated: bool) -> dict[str, Any]:
    """spec.routing as the user wrote it (camelCase) with every field they left out taken from the defaults."""
    return {**routing_defaults(profile, disaggregated).spec_fields(), **routing}
