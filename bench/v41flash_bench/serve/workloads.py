"""What `v41flash bench serve` sends: scripts of chat requests, from one of three workloads.

A *script* is what one client runs from start to end: a list of (pause, request) steps sent one after the
other, each after the previous answer and its pause. An agent session is one script (its sub-agent inline, the
parent waiting for it); a request of a log or a fixed-length request is a script of one step. The driver starts
scripts open-loop (at seeded Poisson times, or at a log's own times) or closed-loop (N clients, each starting
the next script when its last one ends).

* ``agentx``: AgentX-shaped agent sessions from the project's generator (v41flash_bench.agentx through
  routing/sessions.build_trace): every turn resends the whole context plus the previous answer and the newest
  tool result; ~44 % spawn a sub-agent sharing the parent's context; think times between turns. Token sizes are
  the routing benchmark's (AgentX ÷ 32), overridable field by field (``--agentx-set``).
* ``replay``: a JSONL request log, one request a line: ``{"time": seconds, "messages": [...], "max_tokens": N}``
  (optional ``"session"``: sent as x-session-id).
* ``fixed``: prompts of ``isl`` unique words (one token each for the simulators' dummy tokenizer; a real
  tokenizer counts more: the record carries the prompt tokens the endpoint reported) and ``osl`` output tokens.

Every script is seeded by (seed, tag): the same arguments give the same requests on every endpoint (A/B and
self-hosted vs managed compare the same requests), and a new tag (each measured point and repeat) gives new
sessions whose prompts share only the system prefix, so one repeat never hits the cache another one filled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

WORKLOADS = ("agentx", "replay", "fixed")


@dataclass(frozen=True)
class Request:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    session: str = ""  # x-session-id ("" sends none)


@dataclass(frozen=True)
class Script:
    """One client's steps: (seconds to wait first, request)."""
    id: str
    steps: tuple[tuple[float, Request], ...]
    at: float | None = None  # replay: seconds after the start (before any speed-up); None: the driver decides


def agentx_scenario(overrides: dict | None = None, seed: int = 41):
    """The routing benchmark's scaled AgentX shape (sessions.RoutingScenario) with FIELD=VALUE overrides."""
    from v41flash_bench.routing.sessions import RoutingScenario
    fields = {f.name: f for f in dataclasses.fields(RoutingScenario)}
    bad = [k for k in (overrides or {}) if k not in fields or k in ("name", "seed", "engines", "sessions")]
    if bad:
        raise ValueError(f"--agentx-set {', '.join(bad)}: not a session-shape field (one of "
                         f"{', '.join(sorted(k for k in fields if k not in ('name', 'seed', 'engines', 'sessions')))})")
    return RoutingScenario(seed=seed, **(overrides or {}))


def parse_sets(items: Sequence[str]) -> dict:
    """['turns_max=4', ...] -> {'turns_max': 4} (values read as YAML scalars)."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{item!r}: expected FIELD=VALUE")
        out[name.strip()] = yaml.safe_load(raw)
    return out


def agentx_scripts(seed: int, tag: str, overrides: dict | None = None, batch: int = 32) -> Iterator[Script]:
    """Endless agent sessions, drawn in batches of ``batch`` (seeds seed, seed+1, ...); session ids carry ``tag``."""
    from v41flash_bench.routing.sessions import build_trace
    for k in itertools.count():
        sc = dataclasses.replace(agentx_scenario(overrides, seed + k), sessions=batch)
        for s in build_trace(sc, prefix=f"{tag}b{k}").sessions:
            steps = tuple((turn.think_s, Request(turn.messages, turn.max_tokens, sess.id))
                          for sess, turn in s.requests())
            yield Script(s.id, steps)


def fixed_scripts(seed: int, tag: str, isl: int, osl: int) -> Iterator[Script]:
    """Endless single requests of ``isl`` unique words (no two share a prefix) asking for ``osl`` tokens."""
    rng = random.Random(f"{seed}/{tag}")
    for i in itertools.count():
        head = f"{tag}r{i}x{rng.randrange(1 << 30)}"
        text = " ".join(f"{head}w{j}" for j in range(isl))
        yield Script(f"{tag}r{i}", ((0.0, Request((("user", text),), osl)),))


def read_replay(path: Path) -> list[Script]:
    """A request log as scripts at their own times (seconds from the first line); bad lines name their number."""
    scripts: list[Script] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            msgs = tuple((str(m["role"]), str(m["content"])) for m in d["messages"])
            t, max_tokens = float(d["time"]), int(d["max_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: expected {{time, messages: [{{role, content}}], max_tokens}} ({exc})") \
                from None
        if not msgs or max_tokens < 1:
            raise ValueError(f"{path}:{n}: empty messages or max_tokens < 1")
        scripts.append(Script(f"l{n}", ((0.0, Request(msgs, max_tokens, str(d.get("session", "")))),), t))
    if not scripts:
        raise ValueError(f"{path}: no requests")
    t0 = min(s.at for s in scripts)
    return sorted((dataclasses.replace(s, at=s.at - t0) for s in scripts), key=lambda s: s.at)


def digest(scripts: Sequence[Script]) -> str:
    """sha256 of the requests (contents, caps, pauses, order): equal digests, the same requests."""
    h = hashlib.sha256()
    for s in scripts:
        h.update(json.dumps([s.at, [[p, r.messages, r.max_tokens, r.session] for p, r in s.steps]]).encode())
    return h.hexdigest()[:16]
