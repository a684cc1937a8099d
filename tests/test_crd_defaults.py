"""Every default in the generated CRD passes its own node's rules, as the apiserver checks when the CRD is
installed (a default that fails a CEL rule or pattern makes the whole CRD invalid: e2e found the keyless
default Toleration of a list item that way)."""
import re

import cel

from v41flash.api.crd import crd


def _problems(node, value, path):
    out = []
    if isinstance(value, str):
        if "pattern" in node and not re.search(node["pattern"], value):
            out.append(f"{path}: default {value!r} does not match {node['pattern']}")
        if len(value) > node.get("maxLength", 1 << 30):
            out.append(f"{path}: default longer than maxLength")
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:  # a transition rule: checked on updates, never against a default
            continue
        if cel.evaluate(rule["rule"], {"self": value}) is not True:
            out.append(f"{path}: default fails {rule['rule']}")
    if isinstance(value, dict):
        for name, sub in node.get("properties", {}).items():
            if name in value:
                out += _problems(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += _problems(node["items"], item, f"{path}[{i}]")
    return out


def _walk(node, path="", seen=None):
    seen = [] if seen is None else seen
    if "default" in node:
        seen.append((path, node, node["default"]))
    for name, sub in node.get("properties", {}).items():
        _walk(sub, f"{path}.{name}", seen)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", seen)
    return seen


def test_every_default_passes_its_own_rules():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    defaults = _walk(schema)
    assert len(defaults) > 20
    problems = [p for path, node, value in defaults for p in _problems(node, value, path)]
    assert problems == []


def test_the_check_catches_a_bad_default():
    node = {"type": "object", "properties": {"key": {"type": "string"}},
            "x-kubernetes-validations": [{"rule": "self.key != ''"}], "default": {"key": ""}}
    assert _problems(node, node["default"], ".t") == [".t: default fails self.key != ''"]
