"""The session proxy: the router pod's front step (`v41flash session-proxy`).

Home of the session proxy's defaults (no aiohttp import here), so that the CLI parser and the proxy
runtime share them.
"""
DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_PROMPT_KEY_CHARS = 2048
# spec.routing.sessionKey, the proxy's --session-key: derive sets x-session-id when a client sent none; client
# forwards only what clients send. The proxy runs in both (it is the router admin API's only guard).
SESSION_KEY_MODES = ("derive", "client")
