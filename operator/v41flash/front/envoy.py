"""The front's Envoy configuration (pure): plain settings and the routing table in, Envoy's v3 config out.

The front is a kept data plane, Envoy (the `envoyproxy/envoy` image of the release pinned in e2e/versions.env),
configured by the operator (docs/decisions/2026-12-07-front.md). Nothing per token runs outside Envoy:

- **bootstrap** (``bootstrap``; changes only with spec.routing, so the pod template carries its hash): the
  listener on the front's port with, in order, the body limit (buffer filter: 413), the per-request Lua step
  (``front.lua``: API key, session key, revision bucket, the request's class), the router; header and body
  deadlines (408), the connection cap (overload manager), X-Forwarded-For; the admin API on loopback only; the
  routes (RDS) and the clusters (CDS) read from the two files below, which Envoy watches and re-reads in place
  when kubelet updates the mounted ConfigMap (a rollout step touches no connection).
- **routes** (``routes``): the OpenAI serving and health paths, each method, to a revision's cluster by the
  request's bucket (the revision split of proxy/revisions.py: cumulative shares over buckets 0..9999 in table
  order, the candidate first, so a growing share only adds sessions to it); /proxy/metrics to the front's
  counters; anything else 404 (vllm-router's admin API is never reachable). Every routed answer carries
  x-v41flash-revision. A failure before the answer's first byte (connection refused or reset, 5xx) is retried on
  the same revision (``retry_policy``).
- **clusters** (``clusters``): one per revision, its slot router's Service (DNS), with the in-flight cap as
  circuit breakers (503 beyond it) and the retry budget.

The session placement itself is not the front's: it sets the session key and the slot's vllm-router places the
session (sticky_least_loaded), so every front replica agrees by construction and a front replica lost or
added moves no session.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from ..proxy.revisions import Route

LUA_FILE = "front.lua"
FRONT_PORT = 30000  # the pod's "http" port (the Service's target), as the session proxy's was
ADMIN_PORT = 30009  # Envoy's admin API: loopback only (it can drain and stop the process)
COUNTERS_PORT = 30002  # `v41flash front-counters` on loopback: /proxy/metrics from Envoy's stats
STAT_PREFIX = "front"
VHOST = "front"
BUCKETS = 10_000  # x-v41flash-bucket is in [0, BUCKETS)
BUCKET_HEADER = "x-v41flash-bucket"
CLASS_HEADER = "x-v41flash-class"
REVISION_HEADER = "x-v41flash-revision"  # on every routed answer: the revision that served it
# Where x-session-id came from (x-v41flash-class, "-first" added on a conversation's first turn)
KEY_SOURCES = ("client", "header", "derived", "none")
KEYED_PATHS = ("/v1/chat/completions", "/v1/completions")
SERVING_PATHS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/embeddings": ("POST",),
    "/v1/models": ("GET",),
}
HEALTH_PATHS: dict[str, tuple[str, ...]] = {"/health": ("GET",), "/readiness": ("GET",), "/liveness": ("GET",)}
COUNTERS_PATH = "/proxy/metrics"
HASHED_BYTES = 65_536  # a derived key hashes at most this much of the first message (JSON text as sent)
CONFIG_DIR = "/etc/v41flash/front"  # where the pod mounts the three files
BOOTSTRAP_FILE, ROUTES_FILE, CLUSTERS_FILE = "front-envoy.json", "front-routes.json", "front-clusters.json"
FRONT_FILES = (BOOTSTRAP_FILE, ROUTES_FILE, CLUSTERS_FILE)  # ConfigMap keys = file names in CONFIG_DIR
SERVING_CLUSTER = "serving"  # the serving slot's router Service: the health paths
# Before its first byte reaches the client, a failed answer is sent again to the same revision's router (which
# places it anew): a router or engine that died or was being replaced (connection refused or reset, 5xx). Once
# the answer's headers went out Envoy retries nothing (a stream cut later is the client's to retry, issue 42).
# Backoff with full jitter, base and cap: the attempts span about what a crashed engine's restart or a router's
# endpoint update takes (1-2 s); the budget keeps retries to a fifth of the requests in flight (a retry storm
# when everything fails), never fewer than RETRY_MIN_CONCURRENCY at once.
RETRY_ON = "connect-failure,refused-stream,reset,5xx"
RETRIES = 3
RETRY_BACKOFF_S = (0.25, 1.0)
RETRY_BUDGET_PERCENT = 20.0
RETRY_MIN_CONCURRENCY = 8

_T = "type.googleapis.com/envoy."


@dataclass(frozen=True)
class FrontSettings:
    """What spec.routing decides about the front (render/router.py builds it)."""

    session_key: str = "derive"  # derive | client
    session_header: str = ""
    api_key_env: str = ""  # '' = no API key; else the variable that holds it
    max_body_bytes: int = 64 << 20
    prompt_key_bytes: int = 2048
    max_in_flight: int = 1024  # per revision, per front replica: more get 503 at once
    max_connections: int = 4096  # client connections open at once per front replica
    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    request_timeout_s: int = 14400
    drain_s: int = 5  # a stopping front replica stops taking connections, then finishes its streams
    config_dir: str = CONFIG_DIR


def lua_source(s: FrontSettings) -> str:
    """front.lua with its settings in front."""
    body = resources.files(__package__).joinpath(LUA_FILE).read_text(encoding="utf-8")
    head = "\n".join([
        f"SESSION_KEY_MODE = {json.dumps(s.session_key)}",
        f"SESSION_HEADER = {json.dumps(s.session_header.lower())}",
        f"API_KEY_ENV = {json.dumps(s.api_key_env)}",
        f"PROMPT_KEY_BYTES = {int(s.prompt_key_bytes)}",
        f"HASHED_BYTES = {HASHED_BYTES}",
        "KEYED_PATHS = {" + ", ".join(f'[{json.dumps(p)}] = true' for p in KEYED_PATHS) + "}",
        "SERVING_PATHS = {" + ", ".join(f'[{json.dumps(p)}] = true' for p in SERVING_PATHS) + "}",
    ])
    return head + "\n" + body


def _seconds(v: float) -> str:
    return f"{v:g}s"


def _path_source(s: FrontSettings, name: str) -> dict[str, Any]:
    return {"resource_api_version": "V3", "path_config_source": {
        "path": f"{s.config_dir}/{name}", "watched_directory": {"path": s.config_dir}}}


def bootstrap(s: FrontSettings) -> dict[str, Any]:
    hcm = {
        "@type": _T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": STAT_PREFIX,
        "codec_type": "AUTO",
        "use_remote_address": True,  # X-Forwarded-For gets the client's address appended
        "request_headers_timeout": _seconds(s.header_timeout_s),  # slowloris: headers complete within this
        "request_timeout": _seconds(s.body_timeout_s),  # the whole request (body included) within this: 408
        "stream_idle_timeout": _seconds(s.request_timeout_s),  # a long prefill sends nothing for a while
        "common_http_protocol_options": {"idle_timeout": "3600s", "headers_with_underscores_action": "REJECT_REQUEST"},
        "drain_timeout": _seconds(s.drain_s),
        "rds": {"route_config_name": VHOST, "config_source": _path_source(s, ROUTES_FILE)},
        "http_filters": [
            {"name": "envoy.filters.http.buffer", "typed_config": {
                "@type": _T + "extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": s.max_body_bytes}},
            {"name": "envoy.filters.http.lua", "typed_config": {
                "@type": _T + "extensions.filters.http.lua.v3.Lua",
                "default_source_code": {"inline_string": lua_source(s)}}},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": _T + "extensions.filters.http.router.v3.Router", "suppress_envoy_headers": True}},
        ],
    }
    return {
        "node": {"id": "front", "cluster": "front"},
        "admin": {"address": _address("127.0.0.1", ADMIN_PORT)},
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {"@type": _T + "extensions.resource_monitors.downstream_connections.v3."
                                             "DownstreamConnectionsConfig",
                             "max_active_downstream_connections": s.max_connections}}]},
        "dynamic_resources": {"cds_config": _path_source(s, CLUSTERS_FILE)},
        "static_resources": {
            "listeners": [{
                "name": "front",
                "address": _address("0.0.0.0", FRONT_PORT),
                "per_connection_buffer_limit_bytes": 1 << 20,
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}],
            }],
            "clusters": [_static_cluster("front-counters", "127.0.0.1", COUNTERS_PORT, 5.0)],
        },
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _static_cluster(name: str, host: str, port: int, connect_s: float) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": _seconds(connect_s),
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(host, port)}}]}]}}


def cluster_name(revision: str) -> str:
    return f"revision-{revision}"


def clusters(table: list[Route], s: FrontSettings, serving: str) -> dict[str, Any]:
    """The CDS file: one cluster per routed revision, its slot router's address (a Service name: DNS), and the
    serving slot's router Service (``serving``, a URL) for the health paths."""
    out = []
    for name, url in [(cluster_name(r.revision), r.upstream) for r in table] + [(SERVING_CLUSTER, serving)]:
        u = urlsplit(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        out.append({
            "@type": _T + "config.cluster.v3.Cluster",
            "name": name,
            "type": "STRICT_DNS",
            "dns_lookup_family": "V4_PREFERRED",
            "connect_timeout": "10s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(u.hostname or "", port)}}]}]},
            # the in-flight cap: over it, 503 at once (HTTP/1.1 upstream: a request waits for its connection as pending)
            "circuit_breakers": {"thresholds": [{
                "max_connections": s.max_in_flight, "max_pending_requests": s.max_in_flight,
                "max_requests": s.max_in_flight,
                "retry_budget": {"budget_percent": {"value": RETRY_BUDGET_PERCENT},
                                 "min_retry_concurrency": RETRY_MIN_CONCURRENCY}}]},
        })
    return {"resources": out}


def bucket_ranges(table: list[Route]) -> list[tuple[Route, int, int]]:
    """(route, first bucket, end bucket) of each revision taking new sessions, in table order (pure)."""
    out, cum = [], 0
    taking = [r for r in table if r.accept_new and r.share > 0]
    for i, r in enumerate(taking):
        end = BUCKETS if i == len(taking) - 1 else cum + r.share * BUCKETS // 100
        out.append((r, cum, end))
        cum = end
    return out


def routes(table: list[Route], s: FrontSettings) -> dict[str, Any]:
    """The RDS file. A request without a bucket (no session key) goes to the serving revision (the largest share)."""
    ranges = bucket_ranges(table)
    serving = max((r for r, _, _ in ranges), key=lambda r: r.share)

    def action(r: Route | None) -> dict[str, Any]:
        return {"cluster": cluster_name(r.revision) if r else SERVING_CLUSTER, "timeout": f"{s.request_timeout_s}s",
                "idle_timeout": f"{s.request_timeout_s}s", "retry_policy": retry_policy()}

    def add_revision(r: Route) -> list[dict[str, Any]]:
        return [{"header": {"key": REVISION_HEADER, "value": r.revision}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]

    rs: list[dict[str, Any]] = [{"match": {"path": COUNTERS_PATH, "headers": [_method("GET")]},
                                 "route": {"cluster": "front-counters", "timeout": "10s"}}]
    for path, methods in HEALTH_PATHS.items():  # the serving slot's router answers for the chain
        rs += [{"match": {"path": path, "headers": [_method(m)]}, "route": action(None)} for m in methods]
    for path, methods in SERVING_PATHS.items():
        for m in methods:
            if path in KEYED_PATHS and len(ranges) > 1:
                for r, lo, hi in ranges:
                    if r is serving:
                        continue
                    rs.append({"match": {"path": path, "headers": [_method(m), {
                        "name": BUCKET_HEADER, "range_match": {"start": lo, "end": hi}}]},
                        "route": action(r), "response_headers_to_add": add_revision(r)})
            rs.append({"match": {"path": path, "headers": [_method(m)]}, "route": action(serving),
                       "response_headers_to_add": add_revision(serving)})
    rs.append({"match": {"prefix": "/"}, "direct_response": {"status": 404, "body": {"inline_string": json.dumps(
        {"error": {"message": "not served here", "type": "not_found", "code": 404}})}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]})
    vclusters = [{"name": f"keys_{src}{first}", "headers": [
        {"name": CLASS_HEADER, "string_match": {"exact": f"{src}{first.replace('_', '-')}"}}]}
        for src in KEY_SOURCES for first in ("", "_first")]
    return {"resources": [{"@type": _T + "config.route.v3.RouteConfiguration", "name": VHOST,
                                                      "virtual_hosts": [{"name": VHOST, "domains": ["*"], "routes": rs,
                                              "virtual_clusters": vclusters,
                                              # a retry resends the whole body: kept up to the body limit
                                              "per_request_buffer_limit_bytes": s.max_body_bytes}]}]}


def retry_policy() -> dict[str, Any]:
    """A serving route's retries: the same cluster (the request's revision), another host of it first."""
    base, cap = RETRY_BACKOFF_S
    return {"retry_on": RETRY_ON, "num_retries": RETRIES,
            "retry_back_off": {"base_interval": _seconds(base), "max_interval": _seconds(cap)},
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                "@type": _T + "extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
            "host_selection_retry_max_attempts": 3}


def _method(m: str) -> dict[str, Any]:
    return {"name": ":method", "string_match": {"exact": m}}


def config_files(table: list[Route], s: FrontSettings, serving: str) -> dict[str, str]:
    """The three files the front pod mounts (ConfigMap keys = file names), as JSON text. ``serving``: the URL of
    the serving slot's router Service."""
    return {BOOTSTRAP_FILE: json.dumps(bootstrap(s), indent=1, sort_keys=True),
            ROUTES_FILE: json.dumps(routes(table, s), indent=1, sort_keys=True),
            CLUSTERS_FILE: json.dumps(clusters(table, s, serving), indent=1, sort_keys=True)}


def bootstrap_hash(s: FrontSettings) -> str:
    """The pod template's annotation: Envoy reads the bootstrap only at start, so a change rolls the front."""
    return hashlib.sha256(json.dumps(bootstrap(s), sort_keys=True).encode()).hexdigest()[:16]
