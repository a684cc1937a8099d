"""The session proxy's split of sessions between live serving revisions during a rollout (pure).

The operator writes a routing table (a ConfigMap file the proxy pods mount; kubelet updates it in place):

    {"revisions": [{"revision": "9c41...", "upstream": "http://<cr>-router-b:8000", "share": 25, "acceptNew": true},
                   {"revision": "3f2a...", "upstream": "http://<cr>-router-a:8000", "share": 75, "acceptNew": true}]}

Each upstream is one revision's own vllm-router, which discovers only that revision's engines, so a request's
prefill and decode are always of one revision. Here:

- a NEW session (no record) goes by ``bucket(key)``, a number in [0, 100) from the session key, against the
  cumulative shares in the table's order: the candidate is listed first, so it gets the sessions with
  bucket < its share, and a growing share only ever adds sessions to it;
- a KNOWN session stays on its recorded revision while that revision is in the table (taking new sessions
  or draining: ``acceptNew: false``, share 0), so its prefix cache stays where it was built;
- a session whose revision left the table (rolled back, or drained and deleted) is assigned again as if new
  (it re-prefills once), and counted as reassigned.

Records are an LRU of at most ``max_sessions`` keys, forgotten after ``ttl_s`` idle.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

ROUTES_FILE_NAME = "routes.json"


@dataclass(frozen=True)
class Route:
    revision: str
    upstream: str
    share: int  # percent of new sessions
    accept_new: bool = True


@dataclass(frozen=True)
class RoutingTable:
    routes: tuple[Route, ...]

    def get(self, revision: str) -> Route | None:
        return next((r for r in self.routes if r.revision == revision), None)


def parse_table(doc: Any) -> RoutingTable:
    """A RoutingTable from the file's JSON; ValueError naming the field otherwise. The shares of the routes
    that take new sessions add up to 100, and a draining route (acceptNew false) has share 0."""
    if not isinstance(doc, dict) or not isinstance(doc.get("revisions"), list) or not doc["revisions"]:
        raise ValueError("routes: want {\"revisions\": [ ... ]} with at least one entry")
    routes, seen = [], set()
    for i, r in enumerate(doc["revisions"]):
        where = f"revisions[{i}]"
        if not isinstance(r, dict):
            raise ValueError(f"{where}: want an object")
        rev, up, share, accept = r.get("revision"), r.get("upstream"), r.get("share", 0), r.get("acceptNew", True)
        if not isinstance(rev, str) or not rev:
            raise ValueError(f"{where}.revision: want a non-empty string")
        if rev in seen:
            raise ValueError(f"{where}.revision: {rev} is listed twice")
        seen.add(rev)
        if not isinstance(up, str) or not up.startswith(("http://", "https://")):
            raise ValueError(f"{where}.upstream: want an http(s) URL, got {str(up)[:80]!r}")
        if not isinstance(share, int) or isinstance(share, bool) or not 0 <= share <= 100:
            raise ValueError(f"{where}.share: want an integer percent 0-100, got {share!r}")
        if not isinstance(accept, bool):
            raise ValueError(f"{where}.acceptNew: want true or false")
        if not accept and share:
            raise ValueError(f"{where}.share: a route that takes no new sessions has share 0, got {share}")
        routes.append(Route(rev, up.rstrip("/"), share, accept))
    total = sum(r.share for r in routes if r.accept_new)
    if total != 100:
        raise ValueError(f"revisions[*].share: the routes that take new sessions add up to {total}, want 100")
    return RoutingTable(tuple(routes))


def bucket(key: str) -> float:
    """A session key's place in [0, 100): uniform over keys, the same on every proxy replica."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 * 100


def pick_new(table: RoutingTable, b: float) -> Route:
    """The route of a new session with bucket b: cumulative shares in table order."""
    cum = 0.0
    taking = [r for r in table.routes if r.accept_new and r.share > 0]
    for r in taking:
        cum += r.share
        if b < cum:
            return r
    return taking[-1]


class SessionRouter:
    """Session -> revision records over a routing table that the operator changes as a rollout goes."""

    def __init__(self, table: RoutingTable, ttl_s: float = 600.0, max_sessions: int = 100_000) -> None:
        self.table = table
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.records: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.reassigned = 0
        self._unkeyed = 0  # requests without a session key, spread by share (nothing to keep sticky)

    def update(self, table: RoutingTable) -> None:
        self.table = table

    def route(self, key: str | None, now: float) -> Route:
        if key is None:
            self._unkeyed += 1
            return pick_new(self.table, (self._unkeyed * 61.803398875) % 100)
        rec = self.records.pop(key, None)
        if rec is not None and now - rec[1] <= self.ttl_s:
            known = self.table.get(rec[0])
            if known is not None:
                self.records[key] = (known.revision, now)
                return known
            self.reassigned += 1  # its revision is gone: assigned again, re-prefills once
        r = pick_new(self.table, bucket(key))
        self.records[key] = (r.revision, now)
        while len(self.records) > self.max_sessions:
            self.records.popitem(last=False)
        return r

    def sessions(self, now: float) -> dict[str, int]:
        """Live (not idle past the TTL) recorded sessions per revision."""
        out: dict[str, int] = {r.revision: 0 for r in self.table.routes}
        for rev, seen in self.records.values():
            if now - seen <= self.ttl_s and rev in out:
                out[rev] += 1
        return out


def table_json(routes: list[Route]) -> str:
    """The file the operator writes (render): the inverse of parse_table."""
    return json.dumps({"revisions": [{"revision": r.revision, "upstream": r.upstream, "share": r.share,
                                      "acceptNew": r.accept_new} for r in routes]}, indent=1, sort_keys=True)
