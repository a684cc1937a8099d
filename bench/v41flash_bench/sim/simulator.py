"""Discrete-event simulator of a disaggregated (prefill/decode) vLLM deployment.

Model, per request: router → prefill replica (FIFO per DP rank; chunked prefill whose per-step
overhead is amortised over the token budget; tokens found in the replica's prefix cache are not
computed) → KV transfer → decode replica (continuous batching up to max-num-seqs and the KV cache;
the rest wait) → done. The first token reaches the user after the first decode step.

Decode is simulated as a fluid batch rather than step by step: between two events every running
sequence gains tokens at ``tokens_per_step / step_seconds(batch, context)``, where the step time
comes from the truth profile at the rank's current batch and total context. A sequence finishes
when the rank's virtual token clock has advanced by its output length. This is exact for a
continuous-batching engine whose step time is constant between joins/leaves, and it costs O(log n)
per request instead of one event per step, which is what makes an hour at 100 req/s take seconds.

Replicas are requested by a policy, become Ready after the role's cold start, and, when scaled
down, drain: they take no new requests and leave when empty. GPU time counts from the request.
"""
from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import math
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from v41flash.api.v1alpha1 import RoutingSpec
from v41flash.planner.profile import CapacityProfile
from v41flash.roles import ROLES
from v41flash_bench.sim.cache import PrefixCache, PrefixIndex
from v41flash_bench.sim.telemetry import role_gauges
from v41flash_bench.sim.workload import SessionPlan, Workload

# event kinds (ints: cheaper to compare than enums in the heap)
_SESSION, _ARRIVE, _PREFILL_DONE, _DECODE_ARRIVE, _DECODE_CHECK, _READY, _TICK, _SAMPLE = range(8)


ROUTERS = ("cache_aware", "session_hash", "round_robin", "sticky_least_loaded", "vllm_cache_aware")
_ROUTING_DEFAULTS = {k: RoutingSpec.model_fields[k].default for k in (
    "cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "session_affinity_ttl_seconds")}


@dataclass(frozen=True)
class SimulatorConfig:
    # cache_aware: cost-based (queue wait + uncached prefill; llm-d / Dynamo KV router style).
    # sticky_least_loaded, vllm_cache_aware: vllm-router 0.1.17's policies as the operator renders them
    # (spec.routing.policy's default, and cache_aware with spec.routing's thresholds).
    router: str = "cache_aware"
    prefix_cache_tokens: int | None = None  # per prefill replica; None: the profile's decode KV size
    sample_every_s: float = 10.0  # time-series resolution for plots and policies' gauges
    drain_timeout_s: float = 900.0  # after the end, stop waiting for stragglers
    vnodes: int = 64  # consistent-hash ring points per replica
    cache_threshold: float = _ROUTING_DEFAULTS["cache_threshold"]  # vllm_cache_aware
    balance_abs_threshold: int = _ROUTING_DEFAULTS["balance_abs_threshold"]
    balance_rel_threshold: float = _ROUTING_DEFAULTS["balance_rel_threshold"]
    # sticky_least_loaded: a session idle this long stops counting (as rendered; vllm-router's own default 7200)
    sticky_session_ttl_s: float = float(_ROUTING_DEFAULTS["session_affinity_ttl_seconds"])

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r}: choose from {', '.join(ROUTERS)}")


class Request:
    __slots__ = (
        "rid", "session", "turn", "arrive", "prompt", "ids", "toks", "out", "cached",
        "prefill_replica", "prefill_start", "prefill_done", "decode_replica", "decode_rank", "admit", "first_token",
        "done", "finish_v",
    )

    def __init__(self, rid, session, turn, arrive, prompt, ids, toks, out):
        self.rid = rid
        self.session = session
        self.turn = turn
        self.arrive = arrive
        self.prompt = prompt
        self.ids = ids
        self.toks = toks
        self.out = out
        self.cached = 0
        self.prefill_replica = None
        self.prefill_start = math.nan
        self.prefill_done = math.nan
        self.decode_replica = None
        self.decode_rank = None
        self.admit = math.nan
        self.first_token = math.nan
        self.done = math.nan
        self.finish_v = 0.0


class Replica:
    __slots__ = ("rid", "role", "state", "requested", "ready", "gone", "gpus", "ranks", "cache", "inflight",
                 "inflight_new_tokens", "served", "free_at")

    def __init__(self, rid, role, requested, gpus):
        self.rid = rid
        self.role = role
        self.state = "starting"  # starting → ready → draining → gone (or starting → gone if cancelled)
        self.requested = requested
        self.ready = math.inf
        self.gone = math.inf
        self.gpus = gpus
        self.ranks = []
        self.cache = None
        self.inflight = 0  # requests routed here and not finished on this replica
        self.inflight_new_tokens = 0  # prefill: uncached tokens still to compute
        self.served = 0
        self.free_at = 0.0  # prefill: when its least-busy rank is free (queue estimate for routing)


class PrefillRank:
    __slots__ = ("busy_until", "starts")

    def __init__(self):
        self.busy_until = 0.0
        self.starts = deque()  # (start, done) of requests not finished yet, FIFO


class DecodeRank:
    """A continuous-batching engine as a fluid batch (see the module docstring)."""

    __slots__ = ("replica", "t", "v", "n", "ctx_base", "heap", "waiting", "version", "rate", "step")

    def __init__(self, replica):
        self.replica = replica
        self.t = 0.0
        self.v = 0.0  # tokens every running sequence has gained since the rank started
        self.n = 0
        self.ctx_base = 0  # Σ(prompt_i − v_join_i); total context = ctx_base + n·v
        self.heap = []  # (finish_v, rid, request)
        self.waiting = deque()
        self.version = 0
        self.rate = 0.0  # tokens/s per sequence at the current batch
        self.step = 0.0  # current step seconds

    def context(self) -> float:
        return self.ctx_base + self.n * self.v


class Policy(Protocol):
    name: str
    interval_s: float

    def decide(self, now: float, view: "ClusterView") -> dict[str, int]: ...


@dataclass
class Telemetry:
    """Append-only records the report and the policies' observation windows are computed from."""

    # per finished request (appended at completion; times nondecreasing)
    done_t: list = field(default_factory=list)
    arrive_t: list = field(default_factory=list)
    sid: list = field(default_factory=list)  # session id
    ttft: list = field(default_factory=list)
    e2e: list = field(default_factory=list)
    prompt: list = field(default_factory=list)
    cached: list = field(default_factory=list)
    out: list = field(default_factory=list)
    itl: list = field(default_factory=list)
    queue_s: list = field(default_factory=list)  # decode admission wait
    decode_e2e: list = field(default_factory=list)  # prefill done → last token (the decode pod's e2e)
    # per first token (appended at decode admission; times nondecreasing)
    ft_t: list = field(default_factory=list)
    ft_ttft: list = field(default_factory=list)  # user-visible TTFT
    ft_decode_ttft: list = field(default_factory=list)  # prefill done → first token (decode pod's TTFT)
    # per prefill completion (times nondecreasing)
    pf_t: list = field(default_factory=list)
    pf_latency: list = field(default_factory=list)  # arrival → prefill done (the prefill pod's TTFT)
    pf_prompt: list = field(default_factory=list)
    pf_cached: list = field(default_factory=list)
    pf_service: list = field(default_factory=list)  # prefill start → done (vLLM's request_prefill_time)
    # arrivals
    arr_t: list = field(default_factory=list)
    new_t: list = field(default_factory=list)  # arrivals of a session's first turn (the proxy's new sessions)
    # time series sampled every sample_every_s
    series: dict = field(default_factory=lambda: {k: [] for k in (
        "t", "prefill_ready", "prefill_starting", "prefill_draining", "decode_ready", "decode_starting",
        "decode_draining", "prefill_waiting", "prefill_running", "decode_running", "decode_waiting",
        "kv_usage", "gpus")})
    actions: list = field(default_factory=list)  # (t, role, from, to, policy note)


class ClusterView:
    """What a policy may look at: replica counts, per-replica gauges, windows of telemetry."""

    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim

    @property
    def now(self) -> float:
        return self.sim.now

    def replicas(self, role: str, states: tuple[str, ...] = ("starting", "ready")) -> list[Replica]:
        return [r for r in self.sim.replicas[role] if r.state in states]

    def count(self, role: str) -> int:
        return len(self.replicas(role))

    def profile(self) -> CapacityProfile:
        return self.sim.truth


class Simulator:
    """One run of one policy over one workload. ``run()`` returns the telemetry."""

    def __init__(
        self,
        workload: Workload,
        truth: CapacityProfile,
        policy: Policy | None,
        duration: float,
        initial: dict[str, int],
        config: SimulatorConfig = SimulatorConfig(),
        bounds: dict[str, tuple[int, int]] | None = None,
        starting: dict[str, list[float]] | None = None,
    ) -> None:
        """``starting``: per role, the Ready times (> 0) of replicas requested before t = 0 and still starting then
        (a policy's orders before the run began: ``prestart``); each was requested one cold start before it."""
        self.workload = workload
        self.truth = truth
        self.policy = policy
        self.duration = float(duration)
        self.config = config
        self.bounds = bounds or {}
        self.now = 0.0
        self.events: list = []
        self.seq = itertools.count()
        self.rids = itertools.count()
        self.replicas: dict[str, list[Replica]] = {"prefill": [], "decode": []}
        self.index = PrefixIndex()
        self.telemetry = Telemetry()
        self.view = ClusterView(self)
        self.requests_started = 0
        self.inflight_requests: dict[int, Request] = {}
        self.requests_finished = 0
        self.tokens_out = 0  # output tokens generated (checks conservation in tests)
        self.waiting_for_prefill: deque = deque()  # no Ready prefill replica yet
        self.waiting_for_decode: deque = deque()
        self._ring: list[tuple[int, Replica]] | None = None
        self._live: dict[str, list[Replica] | None] = {"prefill": None, "decode": None}
        self._live_byid: dict[int, Replica] | None = None
        self._parent: dict[int, SessionPlan] = {}  # id(sub-agent plan) → parent plan
        self._pending: dict[int, list] = {}  # id(parent plan) → [sub-agents left, turn to resume]
        self._rr = 0
        # sticky_least_loaded: session → [prefill replica id, last request]; replica id → sessions counted
        self._pins: dict[int, list] = {}
        self._pinned: dict[int, int] = {}
        self._pins_swept = 0.0
        pf, dc = truth.prefill, truth.decode
        self._pf = (pf.curve.overhead, pf.curve.per_token, pf.curve.per_token_context, pf.max_num_batched_tokens)
        self._dc = (dc.curve.overhead, dc.curve.per_sequence, dc.curve.per_sequence_context, dc.tokens_per_step)
        self._kvx = (truth.kv_transfer.overhead_seconds, truth.kv_transfer.seconds_per_token)
        self.cache_tokens = config.prefix_cache_tokens or dc.kv_cache_tokens * pf.data_parallel_size
        for role in ROLES:
            for _ in range(initial.get(role, 1)):
                r = self._new_replica(role, 0.0)
                self._make_ready(r)
        for role, ready_at in (starting or {}).items():
            cold = getattr(truth, role).cold_start_seconds
            for t in sorted(ready_at):
                if t <= 0:
                    raise ValueError(f"{role}: a replica starting before t = 0 is Ready at t > 0 (got {t})")
                r = self._new_replica(role, t - cold)
                self._push(t, _READY, r)
        self._warm_caches()

    def _warm_caches(self) -> None:
        """Sessions live at t=0 had earlier turns served before the run: their context is cached
        where the router would have sent them (they would otherwise all miss at once)."""
        live = self._live_list("prefill")
        if not live:
            return
        for s in self.workload.sessions:
            if s.first_turn > 0:
                ids, toks = s.path(s.first_turn - 1)
                if self.config.router == "session_hash":
                    r = self._ring_lookup(s.sid)
                else:
                    r = live[s.sid % len(live)]
                    self._pin(s.sid, r.rid)
                r.cache.access(ids, toks)
                r.cache.hits = r.cache.queries = 0

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, a=None, b=None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, a, b))

    def run(self) -> Telemetry:
        for s in self.workload.sessions:
            if s.start < self.duration:
                self._push(max(0.0, s.start), _SESSION, s, None)
        if self.policy is not None:
            self._push(0.0, _TICK)
        self._push(0.0, _SAMPLE)
        end = self.duration + self.config.drain_timeout_s
        events = self.events
        pop = heapq.heappop
        while events:
            t, _, kind, a, b = pop(events)
            if t > end:
                break
            self.now = t
            if kind == _DECODE_CHECK:
                if a.version == b:
                    self._decode_check(a)
            elif kind == _ARRIVE:
                self._arrive(a)
            elif kind == _PREFILL_DONE:
                self._prefill_done(a)
            elif kind == _DECODE_ARRIVE:
                self._decode_arrive(a)
            elif kind == _SESSION:
                self._issue(a, a.first_turn if b is None else b)
            elif kind == _READY:
                if a.state == "starting":
                    self._make_ready(a)
            elif kind == _TICK:
                if t < self.duration:
                    self._tick()
                    self._push(t + self.policy.interval_s, _TICK)
            elif kind == _SAMPLE:
                if t <= self.duration:
                    self._sample()
                    self._push(t + self.config.sample_every_s, _SAMPLE)
        self.now = min(self.now, end)
        return self.telemetry

    # ------------------------------------------------------------------ sessions
    def _issue(self, s: SessionPlan, j: int) -> None:
        """Send turn ``j`` of session ``s`` now (closed loop: no new turns after the end)."""
        if j >= s.turns or self.now >= self.duration:
            parent = self._parent.pop(id(s), None)
            if parent is not None:
                self._child_done(parent)
            return
        ids, toks = s.path(j)
        req = Request(next(self.rids), s, j, self.now, s.prompt_tokens(j), ids, toks, s.output_tokens[j])
        self.requests_started += 1
        self.inflight_requests[req.rid] = req
        self.telemetry.arr_t.append(self.now)
        if j == 0:
            self.telemetry.new_t.append(self.now)
        self._arrive(req)

    def _turn_finished(self, req: Request) -> None:
        s, j = req.session, req.turn
        kids = s.children.get(j)
        if kids:
            # a sub-agent call: the parent resumes (after its think time) once all of them are done
            self._pending[id(s)] = [len(kids), j + 1]
            for c in kids:
                self._parent[id(c)] = s
                self._issue(c, 0)
            return
        if j + 1 >= s.turns:
            self._issue(s, j + 1)  # the session (or sub-agent) ends now
        else:
            self._push(self.now + s.think_s[j], _SESSION, s, j + 1)

    def _child_done(self, parent: SessionPlan) -> None:
        p = self._pending[id(parent)]
        p[0] -= 1
        if p[0] == 0:
            del self._pending[id(parent)]
            j = p[1]
            if j >= parent.turns:
                self._issue(parent, j)
            else:
                self._push(self.now + parent.think_s[j - 1], _SESSION, parent, j)

    # ------------------------------------------------------------------ prefill
    def _arrive(self, req: Request) -> None:
        r = self._route_prefill(req)
        if r is None:
            self.waiting_for_prefill.append(req)
            return
        self._enqueue_prefill(r, req)

    def _enqueue_prefill(self, r: Replica, req: Request) -> None:
        cached = min(r.cache.access(req.ids, req.toks), req.prompt - 1)
        req.cached = max(0, cached)
        new = req.prompt - req.cached
        ov, pt, ptc, budget = self._pf
        rank = min(r.ranks, key=lambda k: k.busy_until)
        start = max(self.now, rank.busy_until)
        # Chunked prefill pays the step overhead per chunk; a busy engine fills each step's budget
        # with several requests' chunks, so a request pays its share of the overhead.
        steps = new / budget if start > self.now else max(1.0, new / budget)
        done = start + ov * steps + pt * new + ptc * new * (new + 2.0 * req.cached)
        rank.busy_until = done
        r.free_at = min(k.busy_until for k in r.ranks) if len(r.ranks) > 1 else done
        rank.starts.append((start, done))
        req.prefill_start = start
        r.inflight += 1
        r.inflight_new_tokens += new
        req.prefill_replica = r
        self._push(done, _PREFILL_DONE, req)

    def _prefill_done(self, req: Request) -> None:
        r = req.prefill_replica
        r.inflight -= 1
        r.inflight_new_tokens -= req.prompt - req.cached
        r.served += 1
        req.prefill_done = self.now
        tel = self.telemetry
        tel.pf_t.append(self.now)
        tel.pf_latency.append(self.now - req.arrive)
        tel.pf_prompt.append(req.prompt)
        tel.pf_cached.append(req.cached)
        tel.pf_service.append(self.now - req.prefill_start)
        if r.state == "draining" and r.inflight == 0:
            self._remove(r)
        ov, per = self._kvx
        self._push(self.now + ov + per * req.prompt, _DECODE_ARRIVE, req)

    def _route_prefill(self, req: Request) -> Replica | None:
        live = self._live_list("prefill")
        if not live:
            return None
        mode = self.config.router
        if mode == "round_robin":
            self._rr += 1
            return live[self._rr % len(live)]
        if mode == "session_hash":
            return self._ring_lookup(req.session.sid)
        if mode == "sticky_least_loaded":
            return self._sticky_least_loaded(req, live)
        if mode == "vllm_cache_aware":
            return self._vllm_cache_aware(req, live)
        return self._cache_aware(req, live)

    def _sticky_least_loaded(self, req: Request, live: list[Replica]) -> Replica:
        """vllm-router 0.1.17's sticky_least_loaded: a session stays on the engine it was first sent to while
        that engine is in the pool; a new session (or one whose engine left) goes to the engine with the
        fewest sessions counted (ties: rendezvous hash of session and engine). A session counts until it has
        been idle ``sticky_session_ttl_s`` (the router sweeps once a minute); it is never told one ended."""
        sid, now = req.session.sid, self.now
        if now - self._pins_swept >= 60.0:
            self._pins_swept = now
            ttl = self.config.sticky_session_ttl_s
            for k in [k for k, (_, last) in self._pins.items() if now - last >= ttl]:
                self._unpin(k)
        pin = self._pins.get(sid)
        byid = self._byid()
        if pin is not None:
            r = byid.get(pin[0])
            if r is not None:
                pin[1] = now
                return r
            self._unpin(sid)
        counts = self._pinned
        low = min(counts.get(r.rid, 0) for r in live)
        r = max((r for r in live if counts.get(r.rid, 0) == low), key=lambda r: _hash64(f"{sid}:{r.rid}"))
        self._pin(sid, r.rid)
        return r

    def _pin(self, sid: int, rid: int) -> None:
        self._pins[sid] = [rid, self.now]
        self._pinned[rid] = self._pinned.get(rid, 0) + 1

    def _unpin(self, sid: int) -> None:
        rid = self._pins.pop(sid)[0]
        self._pinned[rid] -= 1

    def _vllm_cache_aware(self, req: Request, live: list[Replica]) -> Replica:
        """vllm-router's cache_aware: while the pool is imbalanced (max − min requests in flight over the
        absolute threshold and max over the relative threshold × min) the engine with the fewest in flight;
        otherwise the engine holding the longest prefix when it covers more than cache_threshold of the
        prompt, else the engine with the smallest cache."""
        cfg = self.config
        lo = min(live, key=_INFLIGHT)
        hi = max(r.inflight for r in live)
        if hi - lo.inflight > cfg.balance_abs_threshold and hi > cfg.balance_rel_threshold * lo.inflight:
            return lo
        best, best_m = None, 0
        for r in self._holders(req):
            m = r.cache.match(req.ids, req.toks)
            if m > best_m:
                best, best_m = r, m
        if best is not None and best_m > cfg.cache_threshold * req.prompt:
            return best
        return min(live, key=_CACHE_USED)

    def _holders(self, req: Request) -> list[Replica]:
        """The live replicas holding the longest cached prefix of the request (the router's index)."""
        holders = self.index.holders
        byid = self._byid()
        ids = req.ids
        for i in range(len(ids) - 1, -1, -1):
            h = holders.get(ids[i])
            if h:
                cands = [byid[x] for x in h if x in byid]
                if cands:
                    return cands
        return []

    def _live_list(self, role: str) -> list[Replica]:
        live = self._live[role]
        if live is None:
            live = self._live[role] = [r for r in self.replicas[role] if r.state == "ready"]
        return live

    def _byid(self) -> dict[int, Replica]:
        if self._live_byid is None:
            self._live_byid = {r.rid: r for r in self._live_list("prefill")}
        return self._live_byid

    def _changed(self, role: str) -> None:
        self._live[role] = None
        self._live_byid = None
        if role == "prefill":
            self._ring = None

    def _queue_seconds(self, r: Replica) -> float:
        return max(0.0, r.free_at - self.now)

    def _cache_aware(self, req: Request, live: list[Replica]) -> Replica:
        """llm-d/Dynamo-style: cost = queue wait + prefill time of the uncached part; best of
        the replicas holding the longest cached prefix and the least-loaded replica."""
        ov, pt, ptc, budget = self._pf
        cands = self._holders(req)
        if len(cands) > 8:  # a prefix everyone holds (the system prompt): the least busy holders
            cands = heapq.nsmallest(8, cands, key=_FREE_AT)
        least = min(live, key=_FREE_AT)
        if least not in cands:
            cands.append(least)
        best, best_cost = None, math.inf
        for r in cands:
            m = min(r.cache.match(req.ids, req.toks), req.prompt - 1)
            new = req.prompt - m
            cost = self._queue_seconds(r) + ov + pt * new + ptc * new * (new + 2.0 * m)
            if cost < best_cost:
                best, best_cost = r, cost
        return best

    def _ring_lookup(self, key: int) -> Replica:
        if self._ring is None:
            pts = []
            for r in self.replicas["prefill"]:
                if r.state == "ready":
                    for v in range(self.config.vnodes):
                        pts.append((_hash64(f"{r.rid}-{v}"), r))
            pts.sort(key=lambda p: p[0])
            self._ring = pts
        h = _hash64(f"s{key}")
        i = bisect.bisect_left(self._ring, h, key=lambda p: p[0]) % len(self._ring)
        return self._ring[i][1]

    # ------------------------------------------------------------------ decode
    def _decode_arrive(self, req: Request) -> None:
        live = self._live_list("decode")
        if not live:
            self.waiting_for_decode.append(req)
            return
        best, best_load = None, math.inf
        for r in live:
            for k in r.ranks:
                load = k.n + len(k.waiting)
                if load < best_load:
                    best, best_load = k, load
        best.replica.inflight += 1
        req.decode_replica = best.replica
        req.decode_rank = best
        self._advance(best)
        best.waiting.append(req)
        self._admit(best)
        self._reschedule(best)

    def _advance(self, k: DecodeRank) -> None:
        now = self.now
        if k.n:
            k.v += (now - k.t) * k.rate
        k.t = now

    def _set_rate(self, k: DecodeRank) -> None:
        ov, ps, psc, tps = self._dc
        if k.n:
            k.step = ov + ps * k.n + psc * (k.ctx_base + k.n * k.v)
            k.rate = tps / k.step
        else:
            k.step, k.rate = 0.0, 0.0

    def _admit(self, k: DecodeRank) -> None:
        dc = self.truth.decode
        cap_seqs, cap_kv = dc.max_num_seqs, dc.kv_cache_tokens
        tel = self.telemetry
        while k.waiting and k.n < cap_seqs:
            req = k.waiting[0]
            if k.n and k.context() + req.prompt > cap_kv:
                break
            k.waiting.popleft()
            k.n += 1
            k.ctx_base += req.prompt - k.v
            req.finish_v = k.v + req.out
            req.admit = self.now
            heapq.heappush(k.heap, (req.finish_v, req.rid, req))
            self._set_rate(k)
            # the first token comes out of the first step the sequence takes part in
            req.first_token = self.now + k.step
            tel.ft_t.append(self.now)
            tel.ft_ttft.append(req.first_token - req.arrive)
            tel.ft_decode_ttft.append(req.first_token - req.prefill_done)
        self._set_rate(k)

    def _reschedule(self, k: DecodeRank) -> None:
        k.version += 1
        if k.n:
            dt = max(0.0, (k.heap[0][0] - k.v) / k.rate)
            self._push(self.now + dt, _DECODE_CHECK, k, k.version)

    def _decode_check(self, k: DecodeRank) -> None:
        self._advance(k)
        heap = k.heap
        eps = 1e-9
        finished = []
        while heap and heap[0][0] <= k.v + eps:
            _, _, req = heapq.heappop(heap)
            k.n -= 1
            k.ctx_base -= req.prompt - (req.finish_v - req.out)
            finished.append(req)
        if not k.n:
            k.ctx_base = 0  # exact reset (float drift)
        self._set_rate(k)
        self._admit(k)
        self._reschedule(k)
        for req in finished:
            self._complete(req)

    def _complete(self, req: Request) -> None:
        now = self.now
        req.done = now
        r = req.decode_replica
        r.inflight -= 1
        r.served += 1
        self.requests_finished += 1
        del self.inflight_requests[req.rid]
        self.tokens_out += req.out
        tel = self.telemetry
        tel.done_t.append(now)
        tel.arrive_t.append(req.arrive)
        tel.sid.append(req.session.sid)
        tel.ttft.append(req.first_token - req.arrive)
        tel.e2e.append(now - req.arrive)
        tel.prompt.append(req.prompt)
        tel.cached.append(req.cached)
        tel.out.append(req.out)
        tel.itl.append((now - req.first_token) / max(1, req.out - 1))
        tel.queue_s.append(req.admit - req.prefill_done)
        tel.decode_e2e.append(now - req.prefill_done)
        if r.state == "draining" and r.inflight == 0:
            self._remove(r)
        self._turn_finished(req)

    # ------------------------------------------------------------------ replicas
    def _new_replica(self, role: str, t: float) -> Replica:
        rp = getattr(self.truth, role)
        r = Replica(len(self.replicas[role]) + (0 if role == "prefill" else 1_000_000), role, t,
                    rp.gpus_per_replica)
        if role == "prefill":
            r.ranks = [PrefillRank() for _ in range(rp.data_parallel_size)]
            r.cache = PrefixCache(self.cache_tokens, self.index, r.rid)
        else:
            r.ranks = [DecodeRank(r) for _ in range(rp.data_parallel_size)]
        self.replicas[role].append(r)
        return r

    def _make_ready(self, r: Replica) -> None:
        r.state = "ready"
        r.ready = self.now
        for k in r.ranks:
            if isinstance(k, DecodeRank):
                k.t = self.now
            else:
                k.busy_until = self.now
        r.free_at = self.now
        self._changed(r.role)
        if r.role == "prefill":
            while self.waiting_for_prefill:
                self._arrive(self.waiting_for_prefill.popleft())
        else:
            while self.waiting_for_decode:
                self._decode_arrive(self.waiting_for_decode.popleft())

    def _remove(self, r: Replica) -> None:
        r.state = "gone"
        r.gone = self.now
        if r.cache is not None:
            r.cache.clear()
        self._changed(r.role)

    def scale(self, role: str, desired: int, note: str = "") -> None:
        """Make the non-draining replica count ``desired``: start new ones, or cancel starting ones
        (newest first) and then drain the least-loaded Ready ones."""
        lo, hi = self.bounds.get(role, (1, 10**9))
        desired = max(lo, min(hi, int(desired)))
        active = [r for r in self.replicas[role] if r.state in ("starting", "ready")]
        cur = len(active)
        if desired == cur:
            return
        self.telemetry.actions.append((self.now, role, cur, desired, note))
        if desired > cur:
            cold = getattr(self.truth, role).cold_start_seconds
            for _ in range(desired - cur):
                r = self._new_replica(role, self.now)
                self._push(self.now + cold, _READY, r)
            return
        drop = cur - desired
        for r in sorted((r for r in active if r.state == "starting"), key=lambda r: -r.requested):
            if drop == 0:
                break
            r.state = "gone"
            r.gone = self.now
            drop -= 1
        ready = sorted((r for r in active if r.state == "ready"), key=lambda r: (r.inflight, -r.rid))
        for r in ready[:drop]:
            r.state = "draining"
            self._changed(role)
            if r.inflight == 0:
                self._remove(r)
        if role == "decode":
            # a draining engine's waiting (not yet admitted) requests go back to the router
            for r in ready[:drop]:
                for k in r.ranks:
                    while k.waiting:
                        req = k.waiting.popleft()
                        r.inflight -= 1
                        self._decode_arrive(req)
                if r.state == "draining" and r.inflight == 0:
                    self._remove(r)

    def _tick(self) -> None:
        desired = self.policy.decide(self.now, self.view)
        for role in ROLES:
            if role in desired and desired[role] is not None:
                self.scale(role, desired[role], getattr(self.policy, "last_note", ""))

    def _sample(self) -> None:
        s = self.telemetry.series
        now = self.now
        s["t"].append(now)
        gpus = 0
        for role in ROLES:
            counts = {"starting": 0, "ready": 0, "draining": 0}
            for r in self.replicas[role]:
                if r.state in counts:
                    counts[r.state] += 1
                    gpus += r.gpus
            for k, v in counts.items():
                s[f"{role}_{k}"].append(v)
        # the same gauges the simulated scraper reports (observe.role_gauges): one computation for both
        pg, dg = role_gauges(self, "prefill"), role_gauges(self, "decode")
        s["prefill_waiting"].append(int(pg["waiting"]))
        s["prefill_running"].append(int(pg["running"]))
        s["decode_running"].append(int(dg["running"]))
        s["decode_waiting"].append(int(dg["waiting"]))
        s["kv_usage"].append(dg["kv_usage"] if dg["kv_usage"] is not None else 0.0)
        s["gpus"].append(gpus)

    # ------------------------------------------------------------------ accounting
    def gpu_seconds(self, t0: float, t1: float) -> dict[str, float]:
        """GPU-seconds per role within [t0, t1], counting replicas from request to removal."""
        out = {}
        for role in ROLES:
            tot = 0.0
            for r in self.replicas[role]:
                a, b = max(t0, r.requested), min(t1, r.gone)
                if b > a:
                    tot += (b - a) * r.gpus
            out[role] = tot
        return out


_FREE_AT = operator.attrgetter("free_at")
_INFLIGHT = operator.attrgetter("inflight")
_CACHE_USED = operator.attrgetter("cache.used")


def _hash64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")
