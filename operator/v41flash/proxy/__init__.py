"""The session proxy: the router pod's front step (`v41flash session-proxy`).

Home of the session proxy's defaults (no aiohttp import here), so that the CLI parser and the proxy
runtime share them; its session-key modes are the API's too (facts.SESSION_KEY_MODES).
"""
DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_PROMPT_KEY_CHARS = 2048
