"""Per-replica prefix cache: LRU over prefix segments with a token capacity, plus a global index.

A prompt is a path of segments from the root (see ``workload``). Segment ids are chained like
vLLM's block hashes: an id stands for its content *and* everything before it, so it appears at one
depth of one path only. A lookup matches the longest
cached leading run of the path; the whole path is then touched leaf-first, so a segment is always
at least as recent as any of its descendants and LRU evicts leaves of cold paths before the shared
prefixes they hang off (what vLLM's block-level LRU does, at segment granularity).
"""
from __future__ import annotations

from collections import OrderedDict, deque


class PrefixIndex:
    """Which replicas hold a segment: the router's view for cache-aware routing (llm-d style)."""

    def __init__(self) -> None:
        self.holders: dict[int, set[int]] = {}

    def add(self, seg: int, replica: int) -> None:
        s = self.holders.get(seg)
        if s is None:
            self.holders[seg] = {replica}
        else:
            s.add(replica)

    def discard(self, seg: int, replica: int) -> None:
        s = self.holders.get(seg)
        if s is not None:
            s.discard(replica)
            if not s:
                del self.holders[seg]


class PrefixCache:
    """LRU of segment id → tokens, bounded by ``capacity_tokens``; keeps a ``PrefixIndex`` in sync."""

    __slots__ = ("capacity", "used", "lru", "index", "replica", "hits", "queries", "evictions")

    def __init__(self, capacity_tokens: int, index: PrefixIndex | None = None, replica: int = 0) -> None:
        self.capacity = int(capacity_tokens)
        self.used = 0
        self.lru: OrderedDict[int, int] = OrderedDict()
        self.index = index
        self.replica = replica
        self.hits = 0  # cached prompt tokens served
        self.queries = 0  # prompt tokens looked up
        self.evictions = 0  # segments evicted

    def match(self, ids: list[int], toks: list[int]) -> int:
        """Tokens of the longest cached leading run of the path (no side effects).

        Searched from the leaf: a cached segment's ancestors are always cached too (they are at
        least as recent, see the module docstring), and the previous turn's leaf is usually there.
        """
        lru = self.lru
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] in lru:
                return sum(toks[: i + 1])
        return 0

    def access(self, ids: list[int], toks: list[int]) -> int:
        """Match, then insert/touch the whole path (the prefill will have computed it); evict to fit."""
        lru, index, rid = self.lru, self.index, self.replica
        i = len(ids) - 1
        while i >= 0 and ids[i] not in lru:
            i -= 1
        matched = sum(toks[: i + 1])
        # new segments leaf-first, then the cached ancestors leaf-first: the root ends most recent
        for j in range(len(ids) - 1, i, -1):
            lru[ids[j]] = toks[j]
            self.used += toks[j]
            if index is not None:
                index.add(ids[j], rid)
        try:
            deque(map(lru.move_to_end, reversed(ids[: i + 1])), maxlen=0)  # a C loop: this is the hot path
        except KeyError:  # unreachable while the ancestor invariant holds; stay correct anyway
            for j in range(i, -1, -1):
                if ids[j] in lru:
                    lru.move_to_end(ids[j])
                else:
                    lru[ids[j]] = toks[j]
                    self.used += toks[j]
                    if index is not None:
                        index.add(ids[j], rid)
        self.queries += sum(toks)
        self.hits += matched
        while self.used > self.capacity and lru:
            seg, t = lru.popitem(last=False)
            self.used -= t
            self.evictions += 1
            if index is not None:
                index.discard(seg, rid)
        return matched

    def clear(self) -> None:
        """Forget everything (the replica is gone)."""
        if self.index is not None:
            for seg in self.lru:
                self.index.discard(seg, self.replica)
        self.lru.clear()
        self.used = 0
