"""extraArgs may not set what a field owns, in any spelling vLLM 0.33.0's parser accepts (issue 39).

The refused spellings come from the parser snapshot (serve_flags.spelling_terms); here they are checked against
Python's own argparse matcher, built from the same snapshot the way FlexibleArgumentParser feeds it: every token
argparse resolves to an owned setting matches the group's pattern, and no token it resolves to another setting
does."""
from __future__ import annotations

import argparse
import json
import random

import pytest

from v41flash.api import escape_hatch as eh
from v41flash.api import v1alpha1 as api
from v41flash.api.validation import validate
from v41flash.render.checks import operator_checks
from v41flash import serve_flags as flags
from v41flash.vllm.catalog import feature_configs, preset_configs, reference_configs
from dataclasses import replace

from v41flash.vllm.args import _build_unchecked


class _Ambiguous(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # ambiguous abbreviations: argparse refuses them
        raise _Ambiguous(message)


@pytest.fixture(scope="module")
def parser() -> _Parser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=True)  # FlexibleArgumentParser leaves it True
    by_dest: dict[str, list[str]] = {}
    for option, spec in flags.options().items():
        by_dest.setdefault(spec["dest"], []).append(option)
    for dest, strings in by_dest.items():
        for option in strings:  # one action per option string, as vLLM's --x / --no-x / --disable-x are
            p.add_argument(option, dest=dest, nargs="?")
    return p


def flexible(token: str) -> str:
    """What FlexibleArgumentParser.parse_args hands argparse for one token (the option part)."""
    if token.startswith("--"):
        key, eq, value = token.partition("=")
        head, dot, tail = key[2:].partition(".")
        token = "--" + head.replace("_", "-") + dot + tail + eq + value
    if token.startswith("-") and "." in token.partition("=")[0]:
        return token.partition("=")[0].split(".")[0]  # a dotted key: merged into the option named before the dot
    return token


def dest_of(parser: _Parser, token: str) -> str | None:
    """The setting argparse assigns token to; None: none (a positional, unknown or ambiguous)."""
    try:
        found = parser._parse_optional(flexible(token))
    except _Ambiguous:
        return None
    if not found:
        return None
    action = found[0][0] if isinstance(found, list) else found[0]  # Python 3.12 returns a list of tuples
    return action.dest if action is not None else None


def tokens() -> list[str]:
    rng = random.Random(39)
    out: set[str] = set()
    for option in flags.options():
        for spelled in {option, option.replace("-", "_").replace("__", "--", 1) if option.startswith("--") else option}:
            for n in range(2, len(spelled) + 1):
                stem = spelled[:n]
                out.update({stem, stem + "=1", stem + ".k", stem + ".k.j=1", stem + "=a.b", stem + "4", stem + "x"})
        out.add(option + rng.choice("abcxyz_-"))
    alphabet = "-_.=abcdefghijklmnopqrstuvwxyz0123456789"
    for _ in range(3000):
        out.add("-" * rng.choice((1, 2)) + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12))))
    return sorted(out)


@pytest.fixture(scope="module")
def resolved(parser) -> dict[str, str | None]:
    return {token: dest_of(parser, token) for token in tokens()}


@pytest.mark.parametrize("group", list(eh.REFUSED_ARGS), ids=lambda g: g[0])
def test_every_spelling_argparse_accepts_is_refused_and_no_other_setting(resolved, group):
    owned = flags.dests_of(group)
    terms = flags.spelling_terms(owned)
    missed, overreach = [], []
    for token, dest in resolved.items():
        hit = flags.sets_one_of(token, terms)
        if dest in owned and not hit:
            missed.append(token)
        elif dest is not None and dest not in owned and hit:
            overreach.append((token, dest))
    assert not missed, missed[:20]
    assert not overreach, overreach[:20]


@pytest.mark.parametrize("token, owner", [
    ("--kv_events_config", "--kv-events-config"), ("--kv-events-config.enable_kv_cache_events=true",
                                                   "--kv-events-config"),
    ("--kv-events-config.topic", "--kv-events-config"), ("--load-format=dummy", "--load-format"),
    ("--load_format", "--load-format"), ("--load-f", "--load-format"), ("--download-dir", "--download-dir"),
    ("--speculative-config", "--speculative-config"), ("-sc", "--speculative-config"),
    ("-sc.method=ngram", "--speculative-config"), ("--spec-method", "--speculative-config"),
    ("-tp", "--tensor-parallel-size"), ("-tp=8", "--tensor-parallel-size"), ("-t", "--tensor-parallel-size"),
    ("-n2", "--nnodes"), ("-r1", "--nnodes"), ("--device-memory-utilization", "--gpu-memory-utilization"),
    ("--no-enable-expert-parallel", "--enable-expert-parallel"), ("-ep", "--enable-expert-parallel"),
    ("--tokenizer=x/y", "--model"), ("--model.x=1", "--model"), ("--hf-token=hf_x", "--hf-token"),
    ("--hos", "--host"), ("--max-num-sequences", "--max-num-seqs"),  # starts like only --max-num-seqs
])
def test_known_bypasses_are_refused(token, owner):
    group = next(g for g in eh.REFUSED_ARGS if owner in g)
    assert flags.sets_one_of(token, flags.spelling_terms(flags.dests_of(group))), token


@pytest.mark.parametrize("token", ["--enable-log-requests", "--kv-cache-dtype", "--max-logprobs=5", "--seed", "8",
                                   "--model-impl", "--enable-prefix-caching", "-O3", "fp8", "--disable-log-stats",
                                   "--num-seqs-max"])  # unknown to vLLM: the parser check names it
def test_the_escape_hatch_stays_open_for_what_no_field_owns(token):
    assert not any(flags.sets_one_of(token, flags.spelling_terms(flags.dests_of(g))) for g in eh.REFUSED_ARGS), token


def _rendered_dests() -> set[str]:
    dests: set[str] = set()
    configs = [*reference_configs().values(), *feature_configs().values(), *preset_configs().values()]
    knobs = dict(revision="r", served_model_name="s", max_num_seqs=8, max_num_batched_tokens=8, max_model_len=8,
                 gpu_memory_utilization=0.9, load_format="fastsafetensors")  # what the API's fields add
    for cfg in [*configs, *(replace(c, **knobs) for c in configs[:8])]:
        replica = _build_unchecked(cfg)
        for cmd in (c for c in (replica.leader, replica.worker) if c is not None):
            for token in cmd.args:
                if token.startswith("-") and flexible(token).split("=")[0] in flags.options():
                    dests.add(flags.options()[flexible(token).split("=")[0]]["dest"])
    return dests


def test_every_flag_the_builder_renders_is_owned_or_a_recipe_row():
    owned = {d for g in eh.REFUSED_ARGS for d in flags.dests_of(g)}
    recipe = flags.dests_of(eh.RECIPE_FLAGS)
    rendered = _rendered_dests()
    assert rendered - owned - recipe == set()
    assert recipe <= rendered  # a recipe flag the builder no longer renders goes from the list
    assert not owned & recipe


def test_every_speculative_flag_is_the_features_field():
    spec = {d for d in {s["dest"] for s in flags.options().values()} if d.startswith(("spec_", "speculative"))}
    group = next(g for g in eh.REFUSED_ARGS if "--speculative-config" in g)
    assert spec == flags.dests_of(group)


@pytest.mark.parametrize("group", list(eh.REFUSED_ARGS)[::3], ids=lambda g: g[0])
def test_the_crd_rule_is_the_same_test(group):
    """The CEL rule (evaluated as the apiserver would, by the cel package) refuses exactly what sets_one_of finds."""
    import cel
    program = cel.compile(eh.arg_rule(group))
    terms = flags.spelling_terms(flags.dests_of(group))
    sample = random.Random(7).sample(tokens(), 400) + [*terms[0], *(p + "x" for p in terms[1])]
    for token in sample:
        assert program.execute({"self": {"extraArgs": [token]}}) is (not flags.sets_one_of(token, terms)), token


def _doc(**role):
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"decode": role}}


@pytest.mark.parametrize("args, field", [
    (["--kv_events_config", "{}"], "spec.routing.kvEvents"),
    (["--kv-events-config.enable_kv_cache_events=true"], "spec.routing.kvEvents"),
    (["--load-format", "dummy"], "spec.startup.loadFormat"),
    (["--download-dir=/tmp/x"], "spec.model.cache"),
    (["--speculative-config", '{"method": "ngram"}'], "spec.features.speculativeDecoding"),
    (["-tp", "2"], "tensorParallelSize"),
])
def test_validate_refuses_naming_the_owner(args, field):
    problems = validate(_doc(extraArgs=args), operator_checks())
    assert any(p.path == "spec.decode.extraArgs" and field in p.message for p in problems), [str(p) for p in problems]


def test_with_the_feature_off_its_flag_is_still_refused():
    doc = _doc(extraArgs=["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3})])
    doc["spec"]["features"] = {"speculativeDecoding": {"enabled": False}}
    assert any(p.path == "spec.decode.extraArgs" for p in validate(doc, operator_checks()))
