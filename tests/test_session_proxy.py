"""The router pod's session-key proxy: which x-session-id it sets, and that it forwards faithfully
(bodies unchanged, SSE streamed as it arrives, hop-by-hop headers dropped, 502/413 as JSON)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from v41flash.cli.main import build_parser
from v41flash.proxy import session_proxy as sp
from v41flash_bench.procs import free_ports


CHAT = {"model": "m", "messages": [{"role": "system", "content": "shared system prompt"},
                                   {"role": "user", "content": "fix the flaky test in repo X"},
                                   {"role": "assistant", "content": "looking"},
                                   {"role": "user", "content": "tool output 2"}]}


# --- the key (pure) ------------------------------------------------------------------------------

def test_chat_key_is_the_first_non_system_message():
    k = sp.body_session_key("/v1/chat/completions", CHAT)
    assert k == sp.derived_session_key([("system", "shared system prompt"), ("user", "fix the flaky test in repo X")])
    later = {**CHAT, "messages": CHAT["messages"] + [{"role": "assistant", "content": "done"}]}
    assert sp.body_session_key("/v1/chat/completions", later) == k  # next turn: same key
    other = {**CHAT, "messages": [CHAT["messages"][0], {"role": "user", "content": "another task"}]}
    assert sp.body_session_key("/v1/chat/completions", other) != k  # same system prompt, other session
    parts = {**CHAT, "messages": [CHAT["messages"][0],
                                  {"role": "user", "content": [{"type": "text", "text": "fix the flaky test "},
                                                               {"type": "text", "text": "in repo X"}]}]}
    assert sp.body_session_key("/v1/chat/completions", parts) == k  # content parts: their text


def test_completion_key_covers_the_prompt_start_only():
    a = sp.body_session_key("/v1/completions", {"prompt": "x" * 10 + "A" * 50}, prompt_key_chars=10)
    assert a == sp.body_session_key("/v1/completions", {"prompt": "x" * 10 + "B"}, prompt_key_chars=10)
    assert a != sp.body_session_key("/v1/completions", {"prompt": "y" * 10}, prompt_key_chars=10)
    assert sp.body_session_key("/v1/completions", {"prompt": [1, 2, 3]}) == \
        sp.body_session_key("/v1/completions", {"prompt": [[1, 2, 3]]})  # token ids, batch of one
    assert sp.body_session_key("/v1/completions", {"prompt": ""}) is None
    assert sp.body_session_key("/v1/chat/completions", {"messages": []}) is None
    assert sp.body_session_key("/v1/chat/completions", ["not", "an", "object"]) is None


def test_key_source_order():
    cfg = sp.ProxyConfig(upstream="http://u", session_header="x-conversation")
    body = json.dumps(CHAT).encode()
    assert sp.session_key_for(cfg, "/v1/chat/completions", {"x-session-id": "c1", "x-conversation": "h"}, body) \
        == (None, "client")
    assert sp.session_key_for(cfg, "/v1/chat/completions", {"x-conversation": "h"}, body) == ("h", "header")
    assert sp.session_key_for(cfg, "/v1/chat/completions", {}, body)[1] == "derived"
    assert sp.session_key_for(cfg, "/v1/chat/completions", {}, b"{not json") == (None, "unparsable")
    no_header = sp.ProxyConfig(upstream="http://u")
    assert sp.session_key_for(no_header, "/v1/chat/completions", {"x-conversation": "h"}, body)[1] == "derived"


def test_hop_by_hop_headers_dropped():
    h = CIMultiDict([("Connection", "keep-alive, X-Private"), ("X-Private", "1"), ("Keep-Alive", "5"),
                             ("Transfer-Encoding", "chunked"), ("Host", "a"), ("Content-Length", "3"),
                             ("Authorization", "Bearer t"), ("Accept", "text/event-stream")])
    assert sp.forward_headers(h) == {"Authorization": "Bearer t", "Accept": "text/event-stream"}


def test_cli_is_wired_through_the_dispatcher():
    args = build_parser().parse_args(["session-proxy", "--listen", "10.0.0.1:30000",
                                      "--upstream", "http://127.0.0.1:30001", "--session-header", "X-Conv"])
    assert args.listen == ("10.0.0.1", 30000) and args.upstream == "http://127.0.0.1:30001"
    assert args.session_header == "X-Conv" and callable(args.func)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["session-proxy", "--listen", "nope", "--upstream", "http://u"])


# --- against a tiny local upstream ---------------------------------------------------------------

class Upstream:
    """Records what reaches it; /stream sends one SSE event, then waits until the test releases it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, str(request.rel_url), dict(request.headers), body))
        if request.query.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: first\n\n")
            await asyncio.wait_for(self.release.wait(), 5)
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response({"ok": True, "len": len(body)}, status=201 if request.query.get("created") else 200)


async def _with_proxy(test, session_header: str = "", max_body: int = 1 << 20, upstream_up: bool = True,
                      **cfg):
    up = Upstream()
    up_port, px_port = free_ports(2)
    runners = []
    if upstream_up:
        app = web.Application(client_max_size=1 << 22)
        app.router.add_route("*", "/{tail:.*}", up.handle)
        r = web.AppRunner(app)
        await r.setup()
        await web.TCPSite(r, "127.0.0.1", up_port).start()
        runners.append(r)
    proxy = sp.SessionProxy(sp.ProxyConfig(upstream=f"http://127.0.0.1:{up_port}", session_header=session_header,
                                           max_body_bytes=max_body, **cfg))
    r = await sp.setup_runner(proxy, proxy.cfg)
    await web.TCPSite(r, "127.0.0.1", px_port).start()
    runners.append(r)
    try:
        async with aiohttp.ClientSession() as client:
            await test(client, f"http://127.0.0.1:{px_port}", up, proxy)
    finally:
        for r in reversed(runners):
            await r.cleanup()


def _count(proxy: sp.SessionProxy, source: str) -> float:
    return proxy.registry.get_sample_value("v41flash_session_proxy_session_keys_total", {"source": source}) or 0.0


def test_derives_passes_through_and_copies_the_configured_header():
    async def t(client, base, up, proxy):
        raw = json.dumps(CHAT, indent=1).encode()  # odd formatting: must arrive byte for byte
        r = await client.post(f"{base}/v1/chat/completions?x=1", data=raw, headers={"Content-Type": "application/json"})
        assert r.status == 200 and (await r.json())["len"] == len(raw)
        method, url, headers, body = up.seen[-1]
        assert (method, url, body) == ("POST", "/v1/chat/completions?x=1", raw)
        assert headers["x-session-id"] == sp.body_session_key("/v1/chat/completions", CHAT)
        await client.post(f"{base}/v1/chat/completions", data=raw, headers={"x-session-id": "mine"})
        assert up.seen[-1][2]["x-session-id"] == "mine"
        await client.post(f"{base}/v1/chat/completions", data=raw, headers={"X-Conversation": "conv-7"})
        assert up.seen[-1][2]["x-session-id"] == "conv-7" and up.seen[-1][2]["X-Conversation"] == "conv-7"
        await client.post(f"{base}/v1/embeddings", data=raw)  # not an inference path we key
        assert "x-session-id" not in {k.lower() for k in up.seen[-1][2]}
        r = await client.get(f"{base}/v1/models?created=1")  # the upstream's status comes through
        assert r.status == 201
        assert (_count(proxy, "derived"), _count(proxy, "client"), _count(proxy, "header")) == (1, 1, 1)
        r = await client.get(f"{base}/healthz")
        assert r.status == 200 and len(up.seen) == 5  # answered by the proxy itself
        text = await (await client.get(f"{base}/proxy/metrics")).text()
        assert 'v41flash_session_proxy_session_keys_total{source="derived"} 1.0' in text
    asyncio.run(_with_proxy(t, session_header="x-conversation"))


def test_sse_streams_through_without_buffering():
    async def t(client, base, up, proxy):
        async with client.post(f"{base}/v1/completions?stream=1", json={"prompt": "p", "stream": True}) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            # the upstream holds the rest until we release it: a buffering proxy never shows this line
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 3)
            assert first == b"data: first\n\n"
            up.release.set()
            assert await asyncio.wait_for(r.content.read(), 3) == b"data: [DONE]\n\n"
    asyncio.run(_with_proxy(t))


def test_body_limit_and_upstream_down_are_json_errors():
    async def big(client, base, up, proxy):
        r = await client.post(f"{base}/v1/chat/completions", data=b"x" * 2048)
        assert r.status == 413 and (await r.json())["error"]["code"] == 413
        assert up.seen == []
        r = await client.post(f"{base}/v1/completions", data=json.dumps({"prompt": "x" * 900}).encode())
        assert r.status == 200
    asyncio.run(_with_proxy(big, max_body=1024))

    async def down(client, base, up, proxy):
        r = await client.post(f"{base}/v1/chat/completions", json=CHAT)
        assert r.status == 502
        err = (await r.json())["error"]
        assert err["type"] == "bad_gateway" and "unreachable" in err["message"]
    asyncio.run(_with_proxy(down, upstream_up=False))


def test_leading_signals_arrivals_new_sessions_and_estimated_prompt_tokens():
    async def t(client, base, up, proxy):
        raw = json.dumps(CHAT).encode()
        for _ in range(3):  # one session, three turns
            await client.post(f"{base}/v1/chat/completions", data=raw)
        await client.post(f"{base}/v1/chat/completions", data=raw, headers={"x-session-id": "other"})
        await client.post(f"{base}/v1/embeddings", data=raw)  # not an inference request: not counted
        value = lambda name: proxy.registry.get_sample_value(name) or 0.0  # noqa: E731
        assert value("v41flash_session_proxy_arrivals_total") == 4
        assert value("v41flash_session_proxy_new_sessions_total") == 2
        assert value("v41flash_session_proxy_prompt_tokens_estimated_total") == pytest.approx(
            4 * len(raw) / sp.BODY_BYTES_PER_TOKEN)
    asyncio.run(_with_proxy(t))


def test_a_session_idle_past_the_limit_counts_as_new_again():
    proxy = sp.SessionProxy(sp.ProxyConfig(upstream="http://u"))
    assert proxy.remember("a", 0.0) and not proxy.remember("a", 10.0)
    assert proxy.remember("a", 10.0 + sp.SESSION_IDLE_S + 1)
# --- what clients may reach (issue 12: the router's admin API hijacked traffic) ----------------------

ADMIN_PROBES = [("POST", "/add_worker?url=http://attacker:8000"), ("POST", "/remove_worker?url=http://x"),
                ("GET", "/list_workers"), ("GET", "/get_loads"), ("POST", "/flush_cache"), ("GET", "/workers"),
                ("GET", "/v1/../add_worker"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/models"),
                ("POST", "/ADD_WORKER"), ("GET", "/metrics"), ("POST", "//add_worker")]


def test_only_serving_and_health_paths_reach_the_router():
    async def t(client, base, up, proxy):
        for method, path in ADMIN_PROBES:
            r = await client.request(method, f"{base}{path}", data=b"{}")
            assert r.status == 404, (method, path, r.status)
            assert (await r.json())["error"]["type"] == "not_found"
        assert up.seen == []  # not one reached vllm-router
        for method, path in [("GET", "/health"), ("GET", "/readiness"), ("GET", "/liveness"), ("GET", "/v1/models")]:
            assert (await client.request(method, f"{base}{path}")).status == 200, path
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            assert (await client.post(f"{base}{path}", json={**CHAT, "prompt": "p"})).status == 200, path
        assert len(up.seen) == 7
    asyncio.run(_with_proxy(t))


def test_api_key_guards_serving_paths_not_health():
    async def t(client, base, up, proxy):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}):
            r = await client.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status == 401, headers
        assert (await client.get(f"{base}/v1/models")).status == 401
        assert up.seen == []
        assert (await client.get(f"{base}/readiness")).status == 200  # kubelet probes carry no key
        r = await client.post(f"{base}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        assert r.status == 200
        assert "authorization" not in {k.lower() for k in up.seen[-1][2]}  # the key stops at the proxy
        assert (await client.post(f"{base}/add_worker?url=http://a", headers={"Authorization": "Bearer s3cret"})
                ).status == 404  # a key does not open the admin API either
    asyncio.run(_with_proxy(t, api_key="s3cret"))


def test_api_key_env_missing_fails_closed(monkeypatch):
    args = build_parser().parse_args(["session-proxy", "--listen", "127.0.0.1:1", "--upstream", "http://u",
                                      "--api-key-env", "V41F_TEST_NO_SUCH_KEY"])
    monkeypatch.delenv("V41F_TEST_NO_SUCH_KEY", raising=False)
    assert sp.run_cli(args) == 2


def test_unparsable_or_deeply_nested_body_is_400_not_500():
    async def t(client, base, up, proxy):
        deep = b"[" * 200_000 + b"]" * 200_000
        for body in (b"{not json", deep, b"\xff\xfe", b""):
            r = await client.post(f"{base}/v1/chat/completions", data=body)
            assert r.status == 400, body[:10]
        assert up.seen == []
    asyncio.run(_with_proxy(t, max_body=1 << 20))


def test_slow_body_is_cut_and_in_flight_is_capped():
    async def slow(client, base, up, proxy):
        async def drip():
            yield b'{"prompt": '
            await asyncio.sleep(2)
            yield b'"p"}'
        r = await client.post(f"{base}/v1/completions", data=drip())
        assert r.status == 408
        assert up.seen == []
    asyncio.run(_with_proxy(slow, body_timeout_s=0.5))

    async def busy(client, base, up, proxy):
        proxy.in_flight = proxy.cfg.max_in_flight  # as if that many requests were being served
        r = await client.post(f"{base}/v1/completions", json={"prompt": "p"})
        assert r.status == 503 and up.seen == []
        proxy.in_flight = 0
        assert (await client.post(f"{base}/v1/completions", json={"prompt": "p"})).status == 200
    asyncio.run(_with_proxy(busy, max_in_flight=4))


async def _serve_proxy(cfg: sp.ProxyConfig):
    """The proxy as serve() runs it (runner, connection cap, header deadline) on a free port."""
    runner = await sp.setup_runner(sp.SessionProxy(cfg), cfg)
    (port,) = free_ports(1)
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _get(reader, writer, path: str = "/healthz") -> bytes:
    """One keep-alive GET on a raw socket; the response body."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await asyncio.wait_for(reader.readexactly(length), 3)


async def _closed_by_peer(reader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 3) == b""
    except ConnectionError:  # reset after our last write
        return True


def test_connection_cap_and_header_deadline():
    async def t():
        runner, port = await _serve_proxy(sp.ProxyConfig(upstream="http://127.0.0.1:1", max_connections=2,
                                                         header_timeout_s=0.5))
        try:
            # a slowloris: headers never finish -> closed at the deadline
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            await w1.drain()
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            # over the cap of 2: closed at once
            r3, w3 = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(r3.read(), 2) == b""
            assert await asyncio.wait_for(r1.read(), 3) == b""  # cut after 0.5 s of incomplete headers
            # a normal client still gets served once slots free up
            await asyncio.sleep(0.6)
            async with aiohttp.ClientSession() as client:
                assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status == 200
            for w in (w1, w2, w3):
                w.close()
        finally:
            await runner.cleanup()
    asyncio.run(t())


def test_header_deadline_holds_for_every_request_on_a_kept_alive_connection():
    async def t():
        runner, port = await _serve_proxy(sp.ProxyConfig(upstream="http://127.0.0.1:1", header_timeout_s=0.5))
        loop = asyncio.get_running_loop()

        async def fast() -> int:  # a request every 0.2-0.3 s, each sent whole: one connection all along
            r, w = await asyncio.open_connection("127.0.0.1", port)
            served = 0
            for pause in (0.0, 0.2, 0.3, 0.2, 0.3, 0.2, 0.3, 0.2):
                await asyncio.sleep(pause)
                served += await _get(r, w) == b"ok\n"
            w.close()
            return served

        async def slow() -> float:  # the second request's headers drip in, a line every 0.2 s, never ending
            r, w = await asyncio.open_connection("127.0.0.1", port)
            assert await _get(r, w) == b"ok\n"
            t0 = loop.time()
            try:
                w.write(b"GET /healthz HTTP/1.1\r\n")
                for _ in range(10):
                    await asyncio.sleep(0.2)
                    w.write(b"X-Drip: 1\r\n")
                    await w.drain()
            except ConnectionError:  # the proxy closed it
                pass
            assert await _closed_by_peer(r)
            w.close()
            return loop.time() - t0

        try:
            served, cut_after = await asyncio.gather(fast(), slow())
            assert served == 8  # the fast connection was never cut
            assert cut_after < 1.2  # the 0.5 s deadline, not the drip's 2 s
            # the cost: a kept-alive connection idle past the deadline is closed too (clients reconnect)
            r, w = await asyncio.open_connection("127.0.0.1", port)
            assert await _get(r, w) == b"ok\n"
            assert await asyncio.wait_for(r.read(), 3) == b""
            w.close()
        finally:
            await runner.cleanup()
    asyncio.run(t())


def test_a_response_longer_than_the_header_deadline_is_not_cut():
    async def t(client, base, up, proxy):
        async with client.post(f"{base}/v1/completions?stream=1", json={"prompt": "p", "stream": True}) as r:
            assert await asyncio.wait_for(r.content.readuntil(b"\n\n"), 3) == b"data: first\n\n"
            await asyncio.sleep(1.0)  # twice the header deadline while the response streams
            up.release.set()
            assert await asyncio.wait_for(r.content.read(), 3) == b"data: [DONE]\n\n"
        assert (await client.get(f"{base}/v1/models")).status == 200  # and the connection goes on
    asyncio.run(_with_proxy(t, header_timeout_s=0.5))


# --- sessionKey: client (issue 12: without the proxy the router's admin API was open) -----------------

def test_client_mode_keys_only_on_what_the_client_sent():
    cfg = sp.ProxyConfig(upstream="http://u", session_key="client")
    body = json.dumps(CHAT).encode()
    assert sp.session_key_for(cfg, "/v1/chat/completions", {"x-session-id": "c1"}, body) == (None, "client")
    assert sp.session_key_for(cfg, "/v1/chat/completions", {}, body) == (None, "none")  # nothing derived
    assert sp.session_key_for(cfg, "/v1/chat/completions", {}, b"{not json") == (None, "none")  # never parsed
    with pytest.raises(ValueError, match="session_key"):
        sp.ProxyConfig(upstream="http://u", session_key="cookie")
    with pytest.raises(ValueError, match="session_header"):  # client mode copies no header
        sp.ProxyConfig(upstream="http://u", session_key="client", session_header="x-conv")


def test_client_mode_forwards_unchanged_behind_the_same_allowlist_key_and_limits():
    async def t(client, base, up, proxy):
        raw = json.dumps(CHAT, indent=1).encode()
        await client.post(f"{base}/v1/chat/completions", data=raw, headers={"x-session-id": "mine", "X-Conv": "7"})
        method, url, headers, body = up.seen[-1]
        assert (method, url, body) == ("POST", "/v1/chat/completions", raw)
        assert headers["x-session-id"] == "mine" and headers["X-Conv"] == "7"  # the client's own, unchanged
        await client.post(f"{base}/v1/chat/completions", data=raw)
        assert "x-session-id" not in {k.lower() for k in up.seen[-1][2]}  # none set for it
        r = await client.post(f"{base}/v1/completions", data=b"{not json")  # the router judges the body
        assert r.status == 200 and up.seen[-1][3] == b"{not json"
        assert (_count(proxy, "client"), _count(proxy, "none"), _count(proxy, "derived")) == (1, 2, 0)
        n = len(up.seen)
        for method, path in ADMIN_PROBES:
            assert (await client.request(method, f"{base}{path}")).status == 404, path
        assert len(up.seen) == n  # the admin API stays closed
        assert (await client.post(f"{base}/v1/completions", data=b"x" * 2048)).status == 413
    asyncio.run(_with_proxy(t, session_key="client", max_body=1024))

    async def keyed(client, base, up, proxy):  # apiKeySecretRef works with sessionKey: client too
        assert (await client.post(f"{base}/v1/chat/completions", json=CHAT)).status == 401
        assert up.seen == []
        r = await client.post(f"{base}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        assert r.status == 200 and "authorization" not in {k.lower() for k in up.seen[-1][2]}
    asyncio.run(_with_proxy(keyed, session_key="client", api_key="s3cret"))


def test_cli_session_key_mode():
    base = ["session-proxy", "--listen", "127.0.0.1:1", "--upstream", "http://u"]
    assert build_parser().parse_args(base).session_key == "derive"
    assert build_parser().parse_args([*base, "--session-key", "client"]).session_key == "client"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--session-key", "cookie"])


# --- the routing table: sessions split between revisions ------------------------------------------

async def _upstream(port: int, name: str, seen: list):
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        seen.append((name, request.headers.get("x-session-id")))
        return web.json_response({"served_by": name})
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    r = web.AppRunner(app)
    await r.setup()
    await web.TCPSite(r, "127.0.0.1", port).start()
    return r


def _write_table(path, routes):
    import os
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"revisions": routes}))
    os.replace(tmp, path)  # kubelet swaps ConfigMap files atomically too


def test_routing_table_splits_sessions_keeps_them_sticky_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setattr(sp, "ROUTES_RELOAD_S", 0.0)
    a_port, b_port, px_port = free_ports(3)
    routes = tmp_path / "routes.json"
    a = {"revision": "aaaaaaaaaa", "upstream": f"http://127.0.0.1:{a_port}"}
    b = {"revision": "bbbbbbbbbb", "upstream": f"http://127.0.0.1:{b_port}"}
    _write_table(routes, [{**b, "share": 0, "acceptNew": False}, {**a, "share": 100}])

    async def t():
        seen: list = []
        runners = [await _upstream(a_port, "a", seen), await _upstream(b_port, "b", seen)]
        proxy = sp.SessionProxy(sp.ProxyConfig(upstream=f"http://127.0.0.1:{a_port}", routes_file=str(routes)))
        pr = web.AppRunner(proxy.app())
        await pr.setup()
        await web.TCPSite(pr, "127.0.0.1", px_port).start()
        runners.append(pr)
        base = f"http://127.0.0.1:{px_port}"

        async def chat(client, i):
            body = {"messages": [{"role": "user", "content": f"session {i}"}]}
            r = await client.post(f"{base}/v1/chat/completions", json=body)
            assert r.status == 200
            got = (await r.json())["served_by"]
            assert r.headers[sp.REVISION_HEADER] == {"a": "aaaaaaaaaa", "b": "bbbbbbbbbb"}[got]
            return got
        try:
            async with aiohttp.ClientSession() as client:
                first = {i: await chat(client, i) for i in range(60)}
                assert set(first.values()) == {"a"}
                _write_table(routes, [{**b, "share": 50}, {**a, "share": 50}])
                again = {i: await chat(client, i) for i in range(60)}
                assert again == first  # known sessions stay on their revision
                new = [await chat(client, 100 + i) for i in range(80)]
                assert 20 < new.count("b") < 60
                routes.write_text("{not json")  # a broken file keeps the table in use
                assert [await chat(client, 100 + i) for i in range(80)] == new
                assert proxy.registry.get_sample_value("v41flash_session_proxy_routes_errors_total") == 1.0
                # the candidate rolled back: its sessions are reassigned to the serving revision
                _write_table(routes, [{**a, "share": 100}])
                assert {await chat(client, 100 + i) for i in range(80)} == {"a"}
                assert proxy.registry.get_sample_value("v41flash_session_proxy_reassigned_total") == new.count("b")
                text = await (await client.get(f"{base}/proxy/metrics")).text()
                assert 'v41flash_session_proxy_sessions{revision="aaaaaaaaaa"} 140.0' in text
                r = await client.get(f"{base}/v1/models")
                assert (await r.json())["served_by"] == "a"
        finally:
            for r in reversed(runners):
                await r.cleanup()
    asyncio.run(t())


def test_unreadable_routing_table_at_start_falls_back_to_the_upstream(tmp_path):
    proxy = sp.SessionProxy(sp.ProxyConfig(upstream="http://u:1/", routes_file=str(tmp_path / "missing.json")))
    route = proxy.route_for("k", keyed=True)
    assert route.upstream == "http://u:1" and route.revision == ""


def test_cli_takes_the_routes_file():
    args = build_parser().parse_args(["session-proxy", "--listen", "0.0.0.0:30000", "--upstream", "http://u",
                                      "--routes-file", "/etc/v41flash/routes/routes.json",
                                      "--session-ttl-seconds", "120"])
    assert args.routes_file == "/etc/v41flash/routes/routes.json" and args.session_ttl_seconds == 120


def test_a_session_whose_revision_router_refuses_the_connection_moves_to_the_serving_revision(tmp_path, monkeypatch):
    """A drained slot's router deleted before the proxy re-read the table: nothing was sent, so the request is
    served by the serving revision (once), and the session stays there; a serving router that refuses is a 502."""
    monkeypatch.setattr(sp, "ROUTES_RELOAD_S", 0.0)
    a_port, gone_port, px_port = free_ports(3)
    routes = tmp_path / "routes.json"
    a = {"revision": "aaaaaaaaaa", "upstream": f"http://127.0.0.1:{a_port}"}
    b = {"revision": "bbbbbbbbbb", "upstream": f"http://127.0.0.1:{gone_port}"}  # nothing listens there

    async def t():
        seen: list = []
        runners = [await _upstream(a_port, "a", seen)]
        proxy = sp.SessionProxy(sp.ProxyConfig(upstream=f"http://127.0.0.1:{a_port}", routes_file=str(routes)))
        pr = web.AppRunner(proxy.app())
        await pr.setup()
        await web.TCPSite(pr, "127.0.0.1", px_port).start()
        runners.append(pr)
        base = f"http://127.0.0.1:{px_port}"
        try:
            async with aiohttp.ClientSession() as client:
                _write_table(routes, [{**b, "share": 100}, {**a, "share": 0, "acceptNew": False}])
                proxy.reload_routes()
                proxy.router.records["s1"] = ("bbbbbbbbbb", sp.time.monotonic())  # a live session on b
                _write_table(routes, [{**a, "share": 100}, {**b, "share": 0, "acceptNew": False}])  # b draining
                body = {"messages": [{"role": "user", "content": "x"}]}
                r = await client.post(f"{base}/v1/chat/completions", json=body, headers={"x-session-id": "s1"})
                assert r.status == 200 and r.headers[sp.REVISION_HEADER] == "aaaaaaaaaa"
                assert proxy.router.records["s1"][0] == "aaaaaaaaaa"
                assert proxy.registry.get_sample_value("v41flash_session_proxy_reassigned_total") == 1.0
                _write_table(routes, [{**b, "share": 100}])  # the serving revision itself unreachable
                r = await client.post(f"{base}/v1/chat/completions", json=body, headers={"x-session-id": "s2"})
                assert r.status == 502
        finally:
            for r in reversed(runners):
                await r.cleanup()
    asyncio.run(t())
