"""`validate` and `render` end every input in problems or objects, never an exception; the CLI (`v41flash validate
-f`, `render -f`) in a clear error and exit 1, never a traceback (issue 39: a time zone naming a tz directory and a
manifest nested a few thousand levels deep printed tracebacks). A seeded generator (no hypothesis in the dev
dependencies) feeds random YAML/JSON structures built from the CRD's own field names, random strings, mutations
of every example manifest, and nesting thousands of levels deep."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from v41flash.api import v1alpha1 as api
from v41flash.api.crd import crd
from v41flash.api.validation import Problem, validate
from v41flash.cli.main import main
from v41flash.render import render
from v41flash.render.checks import operator_checks

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [d for p in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict) and d.get("kind") == api.KIND]
SEEDS = range(6)


def _field_names() -> list[str]:
    names, stack = set(), [crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]]
    while stack:
        node = stack.pop()
        for name, sub in node.get("properties", {}).items():
            names.add(name)
            stack.append(sub)
        if isinstance(node.get("items"), dict):
            stack.append(node["items"])
    return sorted(names)


FIELDS = _field_names()
NASTY = ["", " ", "\x00", "\n", "$(HF_TOKEN)", "America", "localtime", "/etc/localtime", "../../x", "Europe/Berlin",
         "vllm/vllm\u2010openai:v0.33.0", "--kv_events_config", "-tp", "1e-320", "NaN", "inf", "-1", "0", "\u202e",
         "\ud7ff", "a" * 5000, "Gateway", "hub", "true", "null", "{", "[", "\\", "'", "\"", "\t\t", "😀"]


def random_string(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice(NASTY)
    alphabet = "abcXYZ019-_./:=$() \u00e9\u2010\u0430\n\x7f"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))


def random_scalar(rng: random.Random):
    return rng.choice([
        lambda: random_string(rng), lambda: rng.randint(-2**70, 2**70), lambda: rng.choice([0, 1, -1, 2**31, 2**63]),
        lambda: rng.choice([0.5, 5e-324, 1e308, -0.0, 1.5, 3.0]), lambda: rng.choice([True, False, None]),
    ])()


def random_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 5 or roll < 0.45:
        return random_scalar(rng)
    if roll < 0.75:
        return {(rng.choice(FIELDS) if rng.random() < 0.8 else random_string(rng)): random_value(rng, depth + 1)
                for _ in range(rng.randrange(0, 5))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


def mutate(rng: random.Random, doc):
    """Replace, drop or wrap one random node of doc (in place); returns doc."""
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if not path:
        return random_value(rng)
    parent, key = path[-1]
    action = rng.random()
    if action < 0.2 and isinstance(parent, dict):
        del parent[key]
    elif action < 0.3:
        parent[key] = [parent[key]]
    else:
        parent[key] = random_value(rng)
    return doc


def deep(depth: int, kind: str = "dict"):
    """Nesting depth levels, built without recursion."""
    value = 1
    for _ in range(depth):
        value = {"a": value} if kind == "dict" else [value]
    return value


def deep_json(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def envelope(spec=None, **top):
    doc = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "fuzz", "namespace": "ns"}}
    if spec is not None:
        doc["spec"] = spec
    doc.update(top)
    return doc


def check(doc) -> list[Problem]:
    problems = validate(doc, operator_checks())  # a raise fails the test
    assert isinstance(problems, list) and all(isinstance(p.path, str) and p.message for p in problems), problems
    if not problems:
        objs = render(api.V41FlashDeployment.model_validate(doc))
        assert objs and all(isinstance(o, dict) for o in objs)
    return problems


@pytest.mark.parametrize("seed", SEEDS)
def test_random_structures(seed):
    rng = random.Random(seed)
    for _ in range(60):
        check(envelope(random_value(rng)))
        check(random_value(rng))
        check(envelope({rng.choice(FIELDS): random_value(rng) for _ in range(3)}))


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_examples(seed):
    rng = random.Random(1000 + seed)
    for _ in range(60):
        doc = json.loads(json.dumps(rng.choice(EXAMPLES)))
        for _ in range(rng.randrange(1, 4)):
            doc = mutate(rng, doc)
        check(doc)


@pytest.mark.parametrize("where", ["spec", "metadata", "status", "decode", "extraConfig", "extraArgs", "schedules"])
@pytest.mark.parametrize("depth", [50, 3000])
def test_deep_nesting_is_a_problem_not_an_exception(where, depth):
    value = deep(depth, "list" if depth % 2 else "dict")
    docs = {
        "spec": envelope(value),
        "metadata": envelope({}, metadata={"name": "fuzz", "annotations": value}),
        "status": envelope({}, status=value),
        "decode": envelope({"decode": value}),
        "extraConfig": envelope({"kvTransfer": {"extraConfig": value}}),
        "extraArgs": envelope({"decode": {"extraArgs": [value]}}),
        "schedules": envelope({"autoscaling": {"schedules": [{"name": "a", "cron": "0 9 * * *", "durationSeconds": 60,
                                                              "timeZone": value, "minReplicas": {"decode": 1}}]}}),
    }
    check(docs[where])


@pytest.mark.parametrize("zone", ["America", "America/Argentina", "localtime", "/etc/localtime", "Etc", "posixrules",
                                  "../zoneinfo/UTC", "Europe/Berlin/", "Europe//Berlin", "EUROPE/BERLIN", "right/UTC"])
def test_a_time_zone_outside_the_pinned_database_is_a_problem(zone):
    doc = envelope({"autoscaling": {"schedules": [{"name": "a", "cron": "0 9 * * *", "durationSeconds": 60,
                                                   "timeZone": zone, "minReplicas": {"decode": 1}}]}})
    assert [p.path for p in check(doc)] == ["spec.autoscaling.schedules[0].timeZone"]


def _cli(tmp_path, capsys, text: str, command: str) -> tuple[int, str]:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    rc = main([command, "-f", str(path)])
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("command", ["validate", "render"])
def test_the_cli_never_prints_a_traceback(tmp_path, capsys, command):
    rng = random.Random(39)
    texts = [deep_json(3000), "[" * 20000 + "]" * 20000, "{" * 50000, "a: [\n" * 3000, "\x00\x01", "- 1\n- 2",
             "kind: V41FlashDeployment\nmetadata: [1]\n", "kind: V41FlashDeployment\nmetadata:\n  name: [x]\n",
             json.dumps(envelope({"autoscaling": {"schedules": [{"name": "a", "cron": "0 9 * * *",
                                  "durationSeconds": 60, "timeZone": "America", "minReplicas": {"decode": 1}}]}})),
             json.dumps(envelope({"kvTransfer": {"extraConfig": None}})).replace("null", deep_json(3000))]
    texts += [yaml.safe_dump(mutate(rng, json.loads(json.dumps(rng.choice(EXAMPLES))))) for _ in range(15)]
    texts += [json.dumps(envelope(random_value(rng))) for _ in range(15)]
    for text in texts:
        rc, err = _cli(tmp_path, capsys, text, command)
        assert rc in (0, 1), (rc, text[:100])
        assert "Traceback" not in err and "Error:" not in err.split(":", 1)[0], err[:500]
        if rc == 1:
            assert err.strip(), text[:100]  # a clear error, on stderr


def test_the_cli_names_the_field_of_a_deep_manifest(tmp_path, capsys):
    text = json.dumps(envelope({"kvTransfer": {"extraConfig": None}})).replace("null", deep_json(3000))
    rc, err = _cli(tmp_path, capsys, text, "validate")
    assert rc == 1 and "spec.kvTransfer.extraConfig" in err, err
    rc, err = _cli(tmp_path, capsys, "[" * 20000 + "]" * 20000, "validate")
    assert rc == 1 and "nested deeper than" in err, err
