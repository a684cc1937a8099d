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
# value (`-n2`). spelling_terms() turns a set of option dests into exact tokens and prefixes (the CRD's CEL rules
# test them) that match every token setting one of them; tests/test_escape_hatch.py checks them against argparse's
# own matcher over every option of the snapshot.

def dests_of(flags_: tuple[str, ...] | list[str]) -> set[str]:
    """The option dests (settings) the given option strings set."""
    return {options()[f]["dest"] for f in flags_}


def spellings(dest: str) -> list[str]:
    """Every option string of the snapshot that sets dest (aliases, --no-/--disable- forms, short options)."""
    return sorted(o for o, spec in options().items() if spec["dest"] == dest)


def _variants(name: str) -> list[str]:
    """A `--` option name in every '-'/'_' spelling FlexibleArgumentParser turns into it."""
    out = [""]
    for ch in name:
        out = [o + c for o in out for c in ("-_" if ch == "-" else ch)]
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


def spelling_terms(dests: set[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(exact tokens, token prefixes): an argv token sets one of dests with vLLM 0.33.0's parser if it is one of the
    exact tokens or starts with one of the prefixes. An option that is itself the start of another option is exact,
    `=value` or `.key`; otherwise the shortest prefix that only owned options start with stands for the option and
    its abbreviations (and for misspellings starting that way, `--max-num-sequences`, which vLLM refuses anyway).
    Prefix and equality tests, not a regular expression: the apiserver's CEL cost of `matches` is the pattern's length
    times the 4,096-character item, and the CRD's budget would not hold one per owned setting."""
    unknown = dests - {spec["dest"] for spec in options().values()}
    if unknown:
        raise ValueError(f"not a vLLM {snapshot()['header']['vllm_version']} option dest: {sorted(unknown)}")
    longs = sorted(o for o in options() if o.startswith("--"))
    shorts = sorted(o for o in options() if not o.startswith("--"))
    exact: set[str] = set()
    prefixes: set[str] = set()
    for option in sorted(o for d in dests for o in spellings(d)):
        if option.startswith("--"):
            n = _owned_prefix(option, longs, dests)
            if n < len(option):
                prefixes.update("--" + v for v in _variants(option[2:n]))
            else:
                for v in _variants(option[2:]):
                    exact.add("--" + v)
                    prefixes.update({f"--{v}=", f"--{v}."})
        elif len(option) == 2:  # -n: argparse reads `-n2` as -n 2, so every token starting -n sets it
            others = [s for s in shorts if s != option and s.startswith(option)]
            if others:
                raise ValueError(f"{option} is also the start of {others}: no prefix stands for it")
            prefixes.add(option)
        else:
            n = _owned_prefix(option, shorts, dests)
            if n < len(option):
                prefixes.add(option[:n])
            else:
                exact.add(option)
                prefixes.update({f"{option}=", f"{option}."})
    prefixes = {p for p in prefixes if not any(q != p and p.startswith(q) for q in prefixes)}
    exact = {e for e in exact if not any(e.startswith(q) for q in prefixes)}
    return tuple(sorted(exact)), tuple(sorted(prefixes))


def sets_one_of(token: str, terms: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether vLLM 0.33.0's parser sets one of the settings spelling_terms() was made for from token."""
    exact, prefixes = terms
    return token in exact or token.startswith(prefixes)
