"""Home of the pinned vLLM's `vllm serve` option set: the parser snapshot (vllm/vllm_0_33_0_serve_flags.json, made
by tools/vllm_flags/dump.py) and every spelling of an option. A leaf: it imports nothing of the package, so the API
(whose CRD refuses owned flags in extraArgs in each spelling) can read it; vllm/flags.py checks argvs against it.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

SNAPSHOT_FILE = "vllm_0_33_0_serve_flags.json"


@functools.cache
def snapshot() -> dict[str, Any]:
    """The parsed snapshot of the pinned vLLM's `vllm serve` parser."""
    return json.loads(resources.files("v41flash").joinpath("vllm", SNAPSHOT_FILE).read_text())


def options() -> dict[str, dict[str, Any]]:
    return snapshot()["options"]


# ------------------------------------------------------------------ every spelling of a flag
# What vLLM 0.33.0's parser does with one argv token before argparse matches it to an option
# (FlexibleArgumentParser.parse_args): in a `--` token, '_' becomes '-' up to the first '.'; a token with a '.'
# before any '=' is a dotted key (`--kv-events-config.topic x`, `-sc.method=...`) merged into one JSON value of
# the option named before the dot. argparse (allow_abbrev is left True) then takes the exact option, or
# `option=value`, or a prefix that starts only one option ("--load-f dummy"), or a one-letter option glued to its
# value (`-n2`). spelling_pattern() turns a set of option dests into one regular expression (RE2 and Python
# alike, for the CRD's CEL rules) that matches every token setting one of them; tests/test_escape_hatch.py checks
# it against argparse's own matcher over every option of the snapshot.

def dests_of(flags_: tuple[str, ...] | list[str]) -> set[str]:
    """The option dests (settings) the given option strings set."""
    return {options()[f]["dest"] for f in flags_}


def spellings(dest: str) -> list[str]:
    """Every option string of the snapshot that sets dest (aliases, --no-/--disable- forms, short options)."""
    return sorted(o for o, spec in options().items() if spec["dest"] == dest)


def _lit(text: str) -> str:
    out = ""
    for ch in text:
        if ch in "-_":
            out += "[-_]"  # FlexibleArgumentParser makes '_' a '-' in a long option's name
        elif ch.isascii() and ch.isalnum():
            out += ch
        else:
            raise ValueError(f"unexpected character {ch!r} in a vLLM option name")
    return out


def _owned_prefix(option: str, same_kind: list[str], owned: set[str]) -> int:
    """Length of the shortest prefix of option that only options setting an owned dest start with: argparse
    resolves any token starting with it to one of those, or to none (an error). len(option) if there is none."""
    start = 2 if option.startswith("--") else 1
    for n in range(start + 1, len(option)):
        prefix = option[:n]
        if all(options()[c]["dest"] in owned for c in same_kind if c.startswith(prefix)):
            return n
    return len(option)


def spelling_pattern(dests: set[str]) -> str:
    """A regular expression matching every argv token with which vLLM 0.33.0's parser sets one of dests: the
    option or an abbreviation of it, then the end, `=value` or `.key`. An abbreviation is written as the shortest
    prefix only owned options start with, then any name characters: a compact expression (the CRD's CEL cost
    budget counts regex length x 4,096 characters x 64 items) that also takes a misspelling starting that way
    (`--max-num-sequences` for --max-num-seqs), which vLLM would refuse anyway."""
    unknown = dests - {spec["dest"] for spec in options().values()}
    if unknown:
        raise ValueError(f"not a vLLM {snapshot()['header']['vllm_version']} option dest: {sorted(unknown)}")
    longs = sorted(o for o in options() if o.startswith("--"))
    shorts = sorted(o for o in options() if not o.startswith("--"))
    long_alts: set[str] = set()
    short_alts: set[str] = set()
    glued: set[str] = set()
    for option in sorted(o for d in dests for o in spellings(d)):
        if option.startswith("--"):
            n = _owned_prefix(option, longs, dests)
            long_alts.add(_lit(option[2:n]) + ("[-_a-z0-9]*" if n < len(option) else ""))
        elif len(option) == 2:  # -n: argparse reads `-n2` as -n 2, so every token starting -n sets it
            others = [s for s in shorts if s != option and s.startswith(option)]
            if others:
                raise ValueError(f"{option} is also the start of {others}: no regular expression for it")
            glued.add(option[1])
        else:
            n = _owned_prefix(option, shorts, dests)
            short_alts.add(_lit(option[1:n]) + ("[a-z0-9]*" if n < len(option) else ""))
    parts = []
    if long_alts:
        parts.append(f"--(?:{'|'.join(sorted(long_alts))})(?:[=.]|$)")
    if short_alts:
        parts.append(f"-(?:{'|'.join(sorted(short_alts))})(?:[=.]|$)")
    if glued:
        parts.append(f"-[{''.join(sorted(glued))}]")
    return "^(?:" + "|".join(parts) + ")"
