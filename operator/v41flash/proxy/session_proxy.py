"""Session-key front step for vllm-router: a small streaming reverse proxy on the router pod.

vllm-router 0.1.17's `sticky_least_loaded` / `consistent_hash` key only on the `x-session-id` header
(a fixed list of headers, no flag); without one every request lands on ONE engine. This proxy listens on
the router Service's port and forwards everything to vllm-router on loopback, unchanged, except that a
POST /v1/chat/completions or /v1/completions without `x-session-id` gets one:

  1. the value of the deployment's configured client header (spec.routing.sessionHeader), if present;
  2. otherwise a key derived from the request: a hash of the conversation's first non-system message
     (chat; the same in every turn of a session and in sub-agents that resend the parent's context),
     or of the prompt's first ``prompt_key_chars`` characters (completions).

Measured with the real router (docs/decisions/2026-11-30-routing.md): this keeps each session on one engine while
new sessions go to the least-loaded one. Bodies are forwarded byte for byte; responses (SSE included)
stream through as they arrive; hop-by-hop headers are dropped; an unreachable upstream gives 502 with a
JSON error. `v41flash session-proxy --listen HOST:PORT --upstream URL [--session-header NAME]`.
With `--session-key client` (spec.routing.sessionKey: client) it sets nothing and does not parse bodies:
the client's own x-session-id and headers reach vllm-router unchanged, behind the same allowlist and limits.

Only the OpenAI-compatible serving paths and health reach vllm-router (`FORWARDED`): its admin API
(/add_worker, /remove_worker, /list_workers, ...) has no authentication, and a client that could call it
would redirect every later prompt to a URL of its choice (docs/decisions/2026-12-01-security.md). Anything else is
404. With `--api-key-env NAME` the serving paths need `Authorization: Bearer <key>` (constant-time
compare); health paths stay open for the kubelet's probes.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import logging
import signal
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# 64 MiB bounds memory (a 1M-token prompt as JSON is a few MiB); the same defaults as the CLI
from v41flash.facts import SESSION_KEY_MODES
from v41flash.proxy import DEFAULT_MAX_BODY_BYTES, DEFAULT_PROMPT_KEY_CHARS
from v41flash.proxy.revisions import Route, RoutingTable, SessionRouter, parse_table

SESSION_HEADER = "x-session-id"
REVISION_HEADER = "x-v41flash-revision"  # on every response routed by a routing table: the revision that served
ROUTES_RELOAD_S = 1.0  # how often the routing table file is checked for a change
# Leading signals: the proxy sees a request before any engine queues it. Prompt tokens are estimated from
# the request body's bytes (no parse, no tokenizer): BPE tokenizers average ~4 bytes of UTF-8 text per
# token on English and code, and the JSON around an agent's prompt is a few percent of it.
BODY_BYTES_PER_TOKEN = 4.0
SESSIONS_REMEMBERED = 100_000  # keys held to tell a new session from a returning one (LRU)
SESSION_IDLE_S = 3600.0  # a key unseen this long counts as a new session when it comes back
KEYED_PATHS = ("/v1/chat/completions", "/v1/completions")
# What clients may reach through the proxy: path -> methods. Everything else answers 404 here.
SERVING_PATHS: dict[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset({"POST"}),
    "/v1/completions": frozenset({"POST"}),
    "/v1/embeddings": frozenset({"POST"}),
    "/v1/models": frozenset({"GET"}),
}
HEALTH_PATHS: dict[str, frozenset[str]] = {  # no API key: the kubelet probes these
    "/health": frozenset({"GET"}),
    "/readiness": frozenset({"GET"}),
    "/liveness": frozenset({"GET"}),
}
FORWARDED = {**SERVING_PATHS, **HEALTH_PATHS}
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "proxy-connection"})
log = logging.getLogger("v41flash.session_proxy")


# --- the session key (pure) ----------------------------------------------------------------------

def _key(text: str) -> str:
    return "p-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def derived_session_key(messages: Sequence[tuple[str, str]]) -> str:
    """The session key for a conversation given as (role, content) pairs: a hash of the first non-system
    message. It is the same in every turn of a session and in its sub-agents (which resend the parent's
    context), and differs across sessions whose first user message differs."""
    for role, content in messages:
        if role != "system":
            return _key(content)
    return _key(messages[0][1]) if messages else "p-empty"


def _content_text(content: Any) -> str:
    """OpenAI message content as one string: a string as is; a list of parts -> their text parts joined
    (other parts, e.g. images, by their JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) and p.get("type") == "text"
                       else json.dumps(p, sort_keys=True, separators=(",", ":")) for p in content)
    return "" if content is None else json.dumps(content, sort_keys=True, separators=(",", ":"))


def body_session_key(path: str, body: Any, prompt_key_chars: int = DEFAULT_PROMPT_KEY_CHARS) -> str | None:
    """The derived key for a parsed request body, or None when the body has nothing to key on."""
    if not isinstance(body, dict):
        return None
    if path == "/v1/chat/completions":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return None
        pairs = [(str(m.get("role", "")), _content_text(m.get("content"))) for m in msgs if isinstance(m, dict)]
        return derived_session_key(pairs) if pairs else None
    prompt = body.get("prompt")
    if isinstance(prompt, list):  # a batch of prompts or token ids: key on the first
        prompt = prompt[0] if prompt else None
        if isinstance(prompt, int):
            prompt = body["prompt"]
    if isinstance(prompt, list):  # token ids
        return _key(json.dumps(prompt[:prompt_key_chars]))
    if isinstance(prompt, str) and prompt:
        return _key(prompt[:prompt_key_chars])
    return None


@dataclass(frozen=True)
class ProxyConfig:
    upstream: str  # vllm-router, e.g. http://127.0.0.1:30001
    session_header: str = ""  # client header whose value becomes x-session-id ('' = none)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    prompt_key_chars: int = DEFAULT_PROMPT_KEY_CHARS
    connect_timeout_s: float = 10.0
    api_key: str = ""  # '' = no client authentication; else serving paths need "Authorization: Bearer <key>"
    body_timeout_s: float = 60.0  # a whole request body must arrive within this (slow-body clients)
    max_in_flight: int = 1024  # requests handled at once; more get 503 at once
    upstream_connections: int = 512  # bounded pool to vllm-router
    max_connections: int = 4096  # client connections open at once; more are closed on accept
    header_timeout_s: float = 15.0  # each request's headers must be complete this long after the connection
    # opened or the previous response ended (slowloris, on new and kept-alive connections alike)
    session_key: str = "derive"  # derive: set x-session-id when a client sent none; client: forward as sent
    routes_file: str = ""  # a routing table (proxy/revisions.py) splitting sessions between revisions; '' = none
    session_ttl_s: float = 600.0  # a session's revision record is forgotten after this long idle

    def __post_init__(self) -> None:
        if self.session_key not in SESSION_KEY_MODES:
            raise ValueError(f"session_key must be one of {', '.join(SESSION_KEY_MODES)}, not {self.session_key!r}")
        if self.session_key == "client" and self.session_header:
            raise ValueError("session_header is copied only with session_key derive")


def session_key_for(cfg: ProxyConfig, path: str, headers: Any, body: bytes) -> tuple[str | None, str]:
    """(x-session-id to set or None, how: client|header|derived|none|unparsable) for one request."""
    if headers.get(SESSION_HEADER):
        return None, "client"
    if cfg.session_key == "client":  # forwarded as the client sent it: nothing derived, the body not parsed
        return None, "none"
    if cfg.session_header and headers.get(cfg.session_header):
        return headers[cfg.session_header], "header"
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting deeper than the stack
        return None, "unparsable"
    key = body_session_key(path, parsed, cfg.prompt_key_chars)
    return (key, "derived") if key else (None, "none")


# --- the proxy -----------------------------------------------------------------------------------

class SessionProxy:
    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        self.upstream = cfg.upstream.rstrip("/")
        self.registry = CollectorRegistry()
        self.requests = Counter("v41flash_session_proxy_requests", "Requests forwarded, by outcome",
                                ["code_class"], registry=self.registry)
        self.keys = Counter("v41flash_session_proxy_session_keys",
                            "Inference requests by where x-session-id came from (client: sent by the client; "
                            "header: copied from the configured header; derived: computed; none/unparsable: "
                            "not set)", ["source"], registry=self.registry)
        self.arrivals = Counter("v41flash_session_proxy_arrivals",
                                "Inference requests arriving (counted on arrival, before forwarding)",
                                registry=self.registry)
        self.new_sessions = Counter("v41flash_session_proxy_new_sessions",
                                    "Inference requests whose session key was not seen in the last "
                                    f"{SESSION_IDLE_S:.0f}s (a new session's first turn)", registry=self.registry)
        self.prompt_tokens = Counter("v41flash_session_proxy_prompt_tokens_estimated",
                                     f"Prompt tokens arriving, estimated as request body bytes / "
                                     f"{BODY_BYTES_PER_TOKEN:g}", registry=self.registry)
        self.seen: OrderedDict[str, float] = OrderedDict()
        self.upstream_errors = Counter("v41flash_session_proxy_upstream_errors",
                                       "Requests the upstream router could not be reached for (502)",
                                       registry=self.registry)
        self.refused = Counter("v41flash_session_proxy_refused",
                               "Requests answered by the proxy itself, by why (not_found: a path that is not "
                               "an OpenAI serving or health path; unauthorized; busy; slow_body; bad_body)",
                               ["why"], registry=self.registry)
        self.session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self.revision_sessions = Gauge("v41flash_session_proxy_sessions",
                                       "Live sessions recorded on each revision of the routing table",
                                       ["revision"], registry=self.registry)
        self.reassigned = Counter("v41flash_session_proxy_reassigned",
                                  "Sessions assigned again because their revision left the routing table "
                                  "(rolled back or drained: they re-prefill once)", registry=self.registry)
        self.table_errors = Counter("v41flash_session_proxy_routes_errors",
                                    "Routing table files that could not be read (the previous table stays)",
                                    registry=self.registry)
        self.router: SessionRouter | None = None
        self._routes_stamp: tuple[float, int] | None = None
        self._routes_checked = 0.0
        if cfg.routes_file:
            fallback = RoutingTable((Route("", cfg.upstream.rstrip("/"), 100),))
            self.router = SessionRouter(fallback, ttl_s=cfg.session_ttl_s)
            self.reload_routes(force=True)

    def reload_routes(self, force: bool = False) -> None:
        """Read the routing table file again when it changed (kubelet swaps ConfigMap files atomically); a
        file that cannot be read keeps the table in use and is counted."""
        assert self.router is not None
        now = time.monotonic()
        if not force and now - self._routes_checked < ROUTES_RELOAD_S:
            return
        self._routes_checked = now
        try:
            st = os.stat(self.cfg.routes_file)
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._routes_stamp:
                return
            with open(self.cfg.routes_file, encoding="utf-8") as f:
                table = parse_table(json.load(f))
        except (OSError, ValueError) as exc:
            if self._routes_stamp != (-1.0, -1):
                log.warning("routing table %s not used: %s", self.cfg.routes_file, exc)
                self.table_errors.inc()
            self._routes_stamp = (-1.0, -1)
            return
        self._routes_stamp = stamp
        self.router.update(table)
        log.info("routing table: %s", ", ".join(f"{r.revision} {r.share}%{'' if r.accept_new else ' (draining)'}"
                                                  for r in table.routes))

    def route_for(self, session: str | None, keyed: bool) -> Route | None:
        """The revision's route of a request (None without a routing table: the one upstream). Health and
        model listing go to the revision with the largest share (the serving one)."""
        if self.router is None:
            return None
        self.reload_routes()
        if not keyed:
            return max((r for r in self.router.table.routes if r.accept_new), key=lambda r: r.share)
        before = self.router.reassigned
        route = self.router.route(session, time.monotonic())
        if self.router.reassigned > before:
            self.reassigned.inc(self.router.reassigned - before)
        return route

    def fallback_route(self, route: Route | None, session: str | None) -> Route | None:
        """The serving revision's route for a request whose own revision's router refused the connection
        (None: no table, or it was the serving route already)."""
        if route is None or self.router is None:
            return None
        serving = max((r for r in self.router.table.routes if r.accept_new), key=lambda r: r.share, default=None)
        if serving is None or serving.revision == route.revision:
            return None
        if session:
            self.router.records[session] = (serving.revision, time.monotonic())
        self.router.reassigned += 1
        self.reassigned.inc()
        log.info("revision %s unreachable: request moved to the serving revision %s", route.revision, serving.revision)
        return serving

    def remember(self, session: str, now: float) -> bool:
        """Record a session key; True when it is new (never seen, or idle over SESSION_IDLE_S)."""
        last = self.seen.pop(session, None)
        self.seen[session] = now
        while len(self.seen) > SESSIONS_REMEMBERED:
            self.seen.popitem(last=False)
        return last is None or now - last > SESSION_IDLE_S

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/proxy/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        # auto_decompress off: bodies go through byte for byte with their Content-Encoding
        self.session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout_s),
            connector=aiohttp.TCPConnector(limit=max(1, self.cfg.upstream_connections)))

    async def _close(self, _app: web.Application) -> None:
        if self.session:
            await self.session.close()

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.router is not None:
            self.revision_sessions.clear()
            for rev, n in self.router.sessions(time.monotonic()).items():
                self.revision_sessions.labels(rev).set(n)
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _refuse(self, why: str, status: int, message: str) -> web.Response:
        self.refused.labels(why).inc()
        self.requests.labels(f"{status // 100}xx").inc()
        return _error(status, message)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        methods = FORWARDED.get(request.path)
        if methods is None or request.method not in methods:
            # the router's admin API (/add_worker, ...) must never be reachable from clients
            return self._refuse("not_found", 404, f"{request.method} {request.path} is not served here")
        if self.cfg.api_key and request.path in SERVING_PATHS and not authorized(request.headers, self.cfg.api_key):
            return self._refuse("unauthorized", 401, "missing or wrong API key (Authorization: Bearer <key>)")
        if self.in_flight >= self.cfg.max_in_flight:
            return self._refuse("busy", 503, f"over {self.cfg.max_in_flight} requests in flight; retry later")
        self.in_flight += 1
        try:
            return await self._forward(request)
        finally:
            self.in_flight -= 1

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await asyncio.wait_for(request.read(), self.cfg.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            self.requests.labels("4xx").inc()
            return _error(413, f"request body over {self.cfg.max_body_bytes} bytes")
        except asyncio.TimeoutError:
            return self._refuse("slow_body", 408, f"request body not received within {self.cfg.body_timeout_s:g} s")
        headers = forward_headers(request.headers)
        if self.cfg.api_key:  # the proxy's own credential: the router and engines never see it
            headers.pop("Authorization", None)
            headers.pop("authorization", None)
        headers["X-Forwarded-For"] = ", ".join(filter(None, [request.headers.get("X-Forwarded-For"), request.remote]))
        session = None
        keyed = request.method == "POST" and request.path in KEYED_PATHS
        if keyed:
            key, source = session_key_for(self.cfg, request.path, request.headers, body)
            self.keys.labels(source).inc()
            if source == "unparsable":
                return self._refuse("bad_body", 400, "request body is not JSON (or nested too deeply to read)")
            if key is not None:
                headers[SESSION_HEADER] = key
            self.arrivals.inc()
            self.prompt_tokens.inc(len(body) / BODY_BYTES_PER_TOKEN)
            session = key or request.headers.get(SESSION_HEADER)
            if session and self.remember(session, time.monotonic()):
                self.new_sessions.inc()
        assert self.session is not None
        route = self.route_for(session, keyed)
        base = route.upstream if route is not None else self.upstream
        url = base + str(request.rel_url)  # path and query as the client sent them
        try:
            try:
                upstream = await self.session.request(request.method, url, headers=headers, data=body or None,
                                                      allow_redirects=False)
            except aiohttp.ClientConnectorError:
                # Nothing was sent: a revision's router that went away before this proxy re-read the table
                # (a drained or rolled-back slot deleted; kubelet refreshes the mounted table within about
                # a minute). The session moves to the serving revision, as it would once the table says so.
                fallback = self.fallback_route(route, session)
                if fallback is None:
                    raise
                route, base = fallback, fallback.upstream
                url = base + str(request.rel_url)
                upstream = await self.session.request(request.method, url, headers=headers, data=body or None,
                                                      allow_redirects=False)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.upstream_errors.inc()
            self.requests.labels("5xx").inc()
            return _error(502, f"upstream router {base} unreachable: {exc.__class__.__name__}: {exc}")
        async with upstream:
            out_headers = forward_headers(upstream.headers)
            if route is not None and route.revision:
                out_headers[REVISION_HEADER] = route.revision
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=out_headers)
            if upstream.headers.get("Content-Length") and "Content-Encoding" not in upstream.headers:
                resp.content_length = int(upstream.headers["Content-Length"])
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():  # as it arrives: SSE events are not held back
                    await resp.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                # headers are already sent: all we can do is cut the response so the client sees it end early
                log.warning("upstream broke off %s %s: %s", request.method, request.path, exc)
                self.upstream_errors.inc()
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
        self.requests.labels(f"{upstream.status // 100}xx").inc()
        return resp


def authorized(headers: Any, api_key: str) -> bool:
    """Authorization: Bearer <key>, compared in constant time."""
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def forward_headers(headers: Any) -> dict[str, str]:
    """Headers minus hop-by-hop ones (and those the Connection header names), Host and Content-Length
    (set again for the forwarded body)."""
    named = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    drop = HOP_BY_HOP | named | {"host", "content-length"}
    out: dict[str, str] = {}
    for k, v in headers.items():
        if k.lower() not in drop:
            out[k] = f"{out[k]}, {v}" if k in out and k.lower() != "set-cookie" else v
    return out


def _error(status: int, message: str) -> web.Response:
    kind = {400: "invalid_request", 401: "unauthorized", 404: "not_found", 408: "request_timeout",
            413: "request_too_large", 502: "bad_gateway", 503: "overloaded"}.get(status, "error")
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


# --- command line --------------------------------------------------------------------------------

def run_cli(args: argparse.Namespace) -> int:
    """`v41flash session-proxy` (parser in v41flash.cli.proxy)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = args.listen
    api_key = ""
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:  # fail closed: a missing Secret must not silently open the door
            log.error("--api-key-env %s is set but the variable is empty or missing", args.api_key_env)
            return 2
    cfg = ProxyConfig(upstream=args.upstream, session_header=args.session_header.lower(),
                      max_body_bytes=args.max_body_bytes, prompt_key_chars=args.prompt_key_chars,
                      api_key=api_key, max_in_flight=args.max_in_flight, session_key=args.session_key,
                      routes_file=args.routes_file, session_ttl_s=args.session_ttl_seconds)
    asyncio.run(serve(cfg, host, port))
    return 0


async def setup_runner(proxy: SessionProxy, cfg: ProxyConfig) -> web.AppRunner:
    """The proxy's aiohttp runner with a header deadline for EVERY request on a connection, not only the
    first: aiohttp's keep-alive timer runs from a connection's start and from the end of each response, and
    closes the connection if the next request's headers are not complete by then (bytes arriving do not
    reset it), so a slowloris on a kept-alive connection is cut like one on a new connection. A request
    being handled (a long streamed answer included) is never cut by it. The cost: a kept-alive connection
    idle longer than header_timeout_s is closed (clients open a new one)."""
    runner = web.AppRunner(proxy.app(), access_log=None, keepalive_timeout=cfg.header_timeout_s)
    await runner.setup()
    assert runner.server is not None
    guard_connections(runner.server, cfg.max_connections)
    return runner


def guard_connections(server: web.Server, max_connections: int) -> None:
    """A connection cap on an aiohttp server (aiohttp has none): a connection over the cap is closed at once."""
    made = server.connection_made

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        if len(server.connections) >= max_connections:
            transport.close()
            return
        made(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]


async def serve(cfg: ProxyConfig, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT; requests in flight get the pod's grace period (the runner's shutdown)."""
    runner = await setup_runner(SessionProxy(cfg), cfg)
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    log.info("session proxy on %s:%d -> %s (session header %r)", host, port, cfg.upstream, cfg.session_header)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
