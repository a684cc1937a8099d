"""`v41flash session-proxy`: the router pod's front step (v41flash.proxy.session_proxy).

The parser lives here so that other commands do not import aiohttp; the proxy module is loaded only
when this command runs.
"""
from __future__ import annotations

import argparse

from v41flash.facts import SESSION_KEY_MODES
from v41flash.proxy import DEFAULT_MAX_BODY_BYTES, DEFAULT_PROMPT_KEY_CHARS


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"want HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _run(args: argparse.Namespace) -> int:
    from v41flash.proxy.session_proxy import run_cli
    return run_cli(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "session-proxy", help="front step for vllm-router: set x-session-id when the client sent none",
        description="Streaming reverse proxy in front of vllm-router. POST /v1/chat/completions and "
                    "/v1/completions without x-session-id get one: the --session-header value if the client "
                    "sent it, else a hash of the first non-system message (chat) or of the prompt's start "
                    "(completions). Only the OpenAI serving paths (/v1/chat/completions, /v1/completions, /v1/embeddings, "
                    "/v1/models) and health (/health, /readiness, /liveness) are forwarded; anything else, the "
                    "router's admin API included, is 404. GET /healthz: the proxy itself; "
                    "GET /proxy/metrics: its Prometheus counters.")
    p.add_argument("--listen", type=_listen, required=True, metavar="HOST:PORT")
    p.add_argument("--upstream", required=True, help="vllm-router base URL, e.g. http://127.0.0.1:30001")
    p.add_argument("--session-key", choices=SESSION_KEY_MODES, default="derive",
                   help="derive: set x-session-id when the client sent none (default); client: forward what "
                        "clients send unchanged (no key derived, bodies not parsed)")
    p.add_argument("--session-header", default="", metavar="NAME",
                   help="client header whose value becomes x-session-id ('' = none)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies get 413 (default 64 MiB)")
    p.add_argument("--prompt-key-chars", type=int, default=DEFAULT_PROMPT_KEY_CHARS,
                   help="/v1/completions: how many leading prompt characters the derived key covers")
    p.add_argument("--api-key-env", default="", metavar="NAME",
                   help="environment variable holding the API key clients must send as 'Authorization: Bearer "
                        "<key>' on the serving paths ('' = no client authentication)")
    p.add_argument("--max-in-flight", type=int, default=1024,
                   help="requests handled at once; more get 503 at once (default 1024)")
    p.add_argument("--routes-file", default="", metavar="PATH",
                   help="routing table (JSON) splitting new sessions between serving revisions during a rollout, "
                        "each revision its own router; re-read when it changes ('' = everything to --upstream, "
                        "which is also the fallback while the file cannot be read)")
    p.add_argument("--session-ttl-seconds", type=float, default=600.0,
                   help="with --routes-file: a session stays on its revision until idle this long (default 600)")
    p.set_defaults(func=_run)
