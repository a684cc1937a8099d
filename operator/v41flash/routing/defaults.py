"""Routing defaults per profile, chosen by measurement (`v41flash bench routing`; docs/2026-11-30-routing.md).

Data, not logic: the values a V41FlashDeployment gets when spec.routing leaves them out. The measured
rule behind them: vllm-router 0.1.17's sticky_least_loaded keeps a session on one engine and sends new
sessions to the least-loaded one, but keys only on the x-session-id header (without it every request
lands on ONE engine); the session proxy in the router pod (sessionKey: derive) gives every request that
header. cache_aware needs no header but sits at the edge of the target on 4 engines and loses balance
on 8; its thresholds stay here for users who run without the proxy (sessionKey: client).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PROFILES = ("low-latency", "high-throughput")  # TP4, DEP2 (spec.profile)


@dataclass(frozen=True)
class RoutingDefaults:
    policy: str  # prefill policy (or the only one, aggregated)
    session_key: str  # derive: the session proxy sets x-session-id; client: only what clients send
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


# bench/routing/agentx-small.yaml (48 sessions, 4 engines, 636 requests, oracle hit 0.871), real session proxy
# (`v41flash session-proxy`) in front of vllm-router 0.1.17: see EVIDENCE_* below and docs/2026-11-30-routing.md.
# The cache_aware thresholds stay the measured best for cache_aware (the choice when sessionKey: client):
# 0.8/4/1.25 gave 0.94-0.96x oracle at running max/mean 1.11-1.24 in six runs with and without session
# headers; threshold 0.5 -> 0.97-1.00x at 1.37-1.39, 0.7 -> 0.97-0.98x at 1.25-1.49, 0.9 -> 0.87x at 1.21;
# upstream defaults (0.3/64/1.5) -> one engine.
_STICKY_BEHIND_PROXY = dict(policy="sticky_least_loaded", session_key="derive", cache_threshold=0.8,
                            balance_abs_threshold=4, balance_rel_threshold=1.25, kv_events=False,
                            session_affinity_ttl_seconds=600)

EVIDENCE_AGGREGATED = (
    "sticky_least_loaded behind the real session proxy, 2026-11-30, two runs each with and without client "
    "x-session-id: 0.98-1.00x oracle hit at running max/mean 1.04-1.12 on 4 engines (4 of 4 within target), "
    "0.98-1.00x at 1.10-1.29 on 8 (3 of 4); cache_aware 0.8/4/1.25 in the same runs 0.93-0.95x at 1.13-1.22 (4 "
    "engines) and 1.38-1.72 (8); without a key sticky_least_loaded puts every request on one engine (4.00/8.00)")
EVIDENCE_DISAGGREGATED = (
    "P/D sticky_least_loaded/round_robin behind the real session proxy, 2026-11-30, two runs each with and "
    "without client x-session-id: prefill 0.99-1.00x oracle hit at max/mean 1.00-1.06; cache_aware/round_robin "
    "0.97x at 1.14-1.19")

AGGREGATED = RoutingDefaults(decode_policy="round_robin", **_STICKY_BEHIND_PROXY, evidence=EVIDENCE_AGGREGATED)

# P/D (2 prefill + 2 decode engines): the proxy keys prefill placement; decode stays round_robin (cache_aware
# decode kept more decode-side hits, 0.84 vs 0.78, but unbalanced prefill in earlier runs).
DISAGGREGATED = RoutingDefaults(decode_policy="round_robin", **_STICKY_BEHIND_PROXY, evidence=EVIDENCE_DISAGGREGATED)

# DEP2 engines are routed per DP rank (--intra-node-data-parallel-size), i.e. like twice the engines: the
# 8-engine run (64 sessions) is the DEP2 evidence; sticky_least_loaded with a session key holds there while
# cache_aware's spread grows to ~2. Same values as TP4.
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
