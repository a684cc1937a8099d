"""The session proxy's split of new sessions between revisions, and stickiness of known ones."""
from __future__ import annotations

import json

import pytest

from v41flash.proxy.revisions import Route, RoutingTable, SessionRouter, bucket, parse_table, pick_new, table_json

SERVING, CAND = "3f2a3f2a3f", "9c419c419c"


def table(share, cand_accept=True, serving_accept=True):
    routes = [Route(CAND, "http://r-b:8000", share if cand_accept else 0, cand_accept),
              Route(SERVING, "http://r-a:8000", (100 - share) if serving_accept else 0, serving_accept)]
    return parse_table(json.loads(table_json(routes)))


KEYS = [f"p-session-{i}" for i in range(4000)]


def test_bucket_is_uniform_and_stable():
    bs = [bucket(k) for k in KEYS]
    assert all(0 <= b < 100 for b in bs)
    assert bucket("x") == bucket("x")
    assert 0.2 < sum(b < 25 for b in bs) / len(bs) < 0.3


def test_new_sessions_split_by_share():
    r = SessionRouter(table(25))
    got = [r.route(k, 0.0).revision for k in KEYS]
    assert 0.22 < got.count(CAND) / len(got) < 0.28


def test_known_sessions_never_move_as_the_share_grows():
    r = SessionRouter(table(5))
    first = {k: r.route(k, 0.0).revision for k in KEYS}
    for share in (25, 50, 100):
        r.update(table(share))
        for k in KEYS:
            assert r.route(k, 1.0).revision == first[k]
    # new sessions at 100 % all go to the candidate
    assert {r.route(f"new-{i}", 1.0).revision for i in range(100)} == {CAND}
    assert r.reassigned == 0


def test_growing_share_only_adds_sessions_to_the_candidate_for_a_proxy_without_records():
    """A restarted proxy (no records) assigns by the deterministic rule: a session on the candidate at a
    smaller share is on it at every larger one."""
    on = {}
    for share in (5, 25, 50, 100):
        fresh = SessionRouter(table(share))
        now_on = {k for k in KEYS if fresh.route(k, 0.0).revision == CAND}
        assert set(on.get("prev", set())) <= now_on
        on["prev"] = now_on


def test_draining_revision_keeps_its_sessions_and_takes_no_new_ones():
    r = SessionRouter(table(50))
    before = {k: r.route(k, 0.0).revision for k in KEYS[:500]}
    promoted = parse_table({"revisions": [
        {"revision": CAND, "upstream": "http://r-b:8000", "share": 100, "acceptNew": True},
        {"revision": SERVING, "upstream": "http://r-a:8000", "share": 0, "acceptNew": False}]})
    r.update(promoted)
    for k, rev in before.items():
        assert r.route(k, 5.0).revision == rev
    assert {r.route(f"n-{i}", 5.0).revision for i in range(200)} == {CAND}
    assert r.sessions(5.0)[SERVING] > 0


def test_sessions_of_a_removed_revision_are_reassigned_and_counted():
    r = SessionRouter(table(50))
    on_cand = [k for k in KEYS[:400] if r.route(k, 0.0).revision == CAND]
    r.update(parse_table({"revisions": [{"revision": SERVING, "upstream": "http://r-a:8000", "share": 100}]}))
    assert {r.route(k, 1.0).revision for k in on_cand} == {SERVING}
    assert r.reassigned == len(on_cand)
    assert {r.route(k, 2.0).revision for k in on_cand} == {SERVING}  # and stay there
    assert r.reassigned == len(on_cand)


def test_idle_sessions_expire_and_the_lru_is_bounded():
    r = SessionRouter(table(0, cand_accept=False), ttl_s=10, max_sessions=100)
    for k in KEYS[:300]:
        r.route(k, 0.0)
    assert len(r.records) == 100
    r.update(table(100, serving_accept=False))
    # idle past the TTL: a new session, by share (all to the candidate now)
    assert r.route(KEYS[299], 20.0).revision == CAND
    assert r.reassigned == 0


def test_requests_without_a_key_spread_by_share():
    r = SessionRouter(table(25))
    got = [r.route(None, 0.0).revision for _ in range(1000)]
    assert 0.2 < got.count(CAND) / 1000 < 0.3


def test_pick_new_edges():
    t = table(5)
    assert pick_new(t, 0.0).revision == CAND and pick_new(t, 4.999).revision == CAND
    assert pick_new(t, 5.0).revision == SERVING and pick_new(t, 99.999).revision == SERVING


@pytest.mark.parametrize("doc, field", [
    ({}, "routes"),
    ({"revisions": []}, "routes"),
    ({"revisions": [{"upstream": "http://x", "share": 100}]}, "revisions[0].revision"),
    ({"revisions": [{"revision": "a", "upstream": "ftp://x", "share": 100}]}, "revisions[0].upstream"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": 101}]}, "revisions[0].share"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": "50"}]}, "revisions[0].share"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": 60}]}, "share"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": 100},
                    {"revision": "a", "upstream": "http://y", "share": 0, "acceptNew": False}]}, "revisions[1].revision"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": 100},
                    {"revision": "b", "upstream": "http://y", "share": 10, "acceptNew": False}]}, "revisions[1].share"),
    ({"revisions": [{"revision": "a", "upstream": "http://x", "share": 100, "acceptNew": "yes"}]},
     "revisions[0].acceptNew"),
])
def test_bad_tables_are_refused_naming_the_field(doc, field):
    with pytest.raises(ValueError) as e:
        parse_table(doc)
    assert field in str(e.value)
