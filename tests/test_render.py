"""Golden files: `render` of every example (UPDATE_GOLDEN=1 rewrites them), schema-valid for Kubernetes
1.36 (kubernetes-validate) and, for the LeaderWorkerSet, against the pinned LWS CRD's own schema (copied into
the tool cache by `bash e2e/build-tools.sh lws`; absent: skipped locally, failed under CI)."""
import functools
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from prereq import require_tool, tool_cache, versions
from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.render import render
from v41flash.render.yamlout import to_yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden"
# one fixture per agent feature (spec.features, kvOffload, preset/point); golden files in golden/features/
FEATURE_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "features").glob("*.yaml"))
FEATURE_GOLDEN = GOLDEN / "features"
K8S_VERSION = "1.36.0"
LWS_VERSION = versions()["LWS_VERSION"]


def dump(objs):
    return to_yaml(objs)  # exactly what `v41flash render` prints


def example(path):
    doc = yaml.safe_load(path.read_text())
    doc["metadata"].setdefault("namespace", "default")
    return V41FlashDeployment.model_validate(doc)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(path):
    text = dump(render(example(path)))
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run UPDATE_GOLDEN=1 .venv/bin/pytest {__file__}"
    assert text == golden.read_text(), "rendered objects changed: review, then UPDATE_GOLDEN=1"


def test_every_example_has_a_golden_file_and_no_stale_ones():
    assert {p.stem for p in EXAMPLES} == {p.stem for p in GOLDEN.glob("*.yaml")}
    assert {p.stem for p in FEATURE_FIXTURES} == {p.stem for p in FEATURE_GOLDEN.glob("*.yaml")}


@pytest.mark.parametrize("path", FEATURE_FIXTURES, ids=lambda p: p.stem)
def test_feature_fixture_renders_its_golden_file_and_validates(path):
    from v41flash.cli.manifests import _problems
    assert _problems(yaml.safe_load(path.read_text())) == []
    text = dump(render(example(path)))
    golden = FEATURE_GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        FEATURE_GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run UPDATE_GOLDEN=1 .venv/bin/pytest {__file__}"
    assert text == golden.read_text(), "rendered objects changed: review, then UPDATE_GOLDEN=1"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_builtin_kinds_validate_against_kubernetes_schema(path):
    # LeaderWorkerSet, InferencePool, HTTPRoute and ComputeDomain are checked against their own CRDs (below;
    # test_render_gateway.py, test_compute_domain.py)
    builtin = [o for o in render(example(path))
               if not o["apiVersion"].startswith(("leaderworkerset.", "inference.networking.", "gateway.networking.",
                                                  "resource.nvidia.com/"))]
    assert builtin
    for obj in builtin:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # LeaderWorkerSet pod templates are core PodTemplateSpecs: hold them to the same 1.36 schema
    for obj in render(example(path)):
        if obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            for key in ("leaderTemplate", "workerTemplate"):
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                              "metadata": {"name": f"{obj['metadata']['name']}-{key}"},
                                              "template": lwt[key]}, K8S_VERSION, strict=True)


def _lws_schema():
    path = require_tool(tool_cache() / f"lws-{LWS_VERSION}" / "assets" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
                        "bash e2e/build-tools.sh lws")
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def _structural_to_jsonschema(node):
    """OpenAPI v3 structural schema → JSON Schema: drop the k8s extensions jsonschema does not know,
    and make int-or-string fields accept both."""
    if isinstance(node, list):
        return [_structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False  # unknown fields are pruned by the apiserver: catch typos
    return out


@functools.cache
def _lws_validator():
    import jsonschema

    schema = _structural_to_jsonschema(_lws_schema())
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)  # no meta-check of the 17k-line schema on every call


def test_leaderworkerset_validates_against_lws_crd():
    lws = [o for p in EXAMPLES for o in render(example(p)) if o["kind"] == "LeaderWorkerSet"]
    assert lws, "an example must render a LeaderWorkerSet (GB300 DEP16 decode)"
    for obj in lws:
        _lws_validator().validate(obj)


def test_lws_schema_check_catches_a_bad_field():
    import jsonschema

    obj = next(o for p in EXAMPLES for o in render(example(p)) if o["kind"] == "LeaderWorkerSet")
    obj["spec"]["leaderWorkerTemplate"]["sizee"] = 4
    with pytest.raises(jsonschema.ValidationError):
        _lws_validator().validate(obj)


def test_kubernetes_schema_check_catches_a_bad_field():
    obj = next(o for o in render(example(EXAMPLES[0])) if o["kind"] == "Deployment")
    obj["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_yaml_quotes_what_go_yaml_would_read_as_booleans():
    text = to_yaml([{"env": [{"name": "A", "value": "y"}, {"name": "B", "value": "off"}, {"name": "C", "value": "yak"}],
                     "doc": "a: 1\nb: 2\n"}])
    assert "value: 'y'" in text and "value: 'off'" in text and "value: yak" in text
    assert "doc: |\n" in text
    assert list(yaml.safe_load_all(text))[0]["env"][0]["value"] == "y"
