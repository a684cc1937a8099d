"""spec.autoscaling.schedules / forecast and spec.startup: refused at the door with the field named, rendered as
vLLM 0.33.0 accepts, and nothing rendered that the defaults did not render before."""
from __future__ import annotations

import pytest

from v41flash.api import v1alpha1 as api
from v41flash.api.validation import validate
from v41flash.render import render
from v41flash.render.checks import operator_checks
from v41flash import facts
from v41flash.vllm.flags import check_serve_args


def doc(spec: dict) -> dict:
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
            "metadata": {"name": "x", "namespace": "n"}, "spec": spec}


def problems(spec: dict) -> list[str]:
    return [str(p) for p in validate(doc(spec), extra_checks=operator_checks())]


def window(**kw):
    return {"name": "bh", "cron": "0 9 * * 1-5", "durationSeconds": 9 * 3600, "timeZone": "Europe/Berlin",
            "minReplicas": {"prefill": 2, "decode": 3}, **kw}


def test_a_valid_schedule_and_forecast_pass():
    assert problems({"prefill": {"maxReplicas": 8}, "decode": {"maxReplicas": 8},
                     "autoscaling": {"schedules": [window(), window(name="batch", cron="0 2 * * *",
                                                                     durationSeconds=7200, minReplicas=None,
                                                                     requestsPerSecond=40)],
                                     "forecast": {"quantile": 0.95}}}) == []


@pytest.mark.parametrize(("schedules", "expected"), [
    ([window(minReplicas={"prefill": 9})], "spec.autoscaling.schedules: a schedule's minReplicas.prefill is above"),
    ([window(), window()], "spec.autoscaling.schedules: two schedules share a name"),
    ([window(requestsPerSecond=3)], "schedules[0].minReplicas: set exactly one of minReplicas"),
    ([window(minReplicas={})], "minReplicas names no role"),
    ([window(cron="0 9 * * 1-5 2026")], "is not a 5-field cron expression"),
    ([window(cron="0 0 30 2 *")], "Bad day-of-month"),
    ([window(timeZone="Europe/Atlantis")], "unknown time zone Europe/Atlantis"),
    ([window(cron="0 9 * * *", durationSeconds=86400)], "would never end"),
    ([window(durationSeconds=30)], "durationSeconds"),
])
def test_schedules_that_cannot_be_kept_are_refused_naming_the_field(schedules, expected):
    found = problems({"autoscaling": {"schedules": schedules}})
    assert any(expected in p for p in found), found


def test_overlapping_floors_above_the_gpu_budget_are_refused_together():
    # each window alone fits 48 GPUs (TP4 H200: 4 GPUs a replica); at 10:00-12:00 both run: max per role
    a = window(name="morning", cron="0 8 * * *", durationSeconds=4 * 3600, timeZone="UTC",
               minReplicas={"prefill": 8, "decode": 2})
    b = window(name="noon", cron="0 10 * * *", durationSeconds=4 * 3600, timeZone="UTC",
               minReplicas={"prefill": 2, "decode": 6})
    spec = {"prefill": {"maxReplicas": 10}, "decode": {"maxReplicas": 10}, "autoscaling": {"gpuBudget": 48}}
    assert problems({**spec, "autoscaling": {"gpuBudget": 48, "schedules": [a]}}) == []
    found = problems({**spec, "autoscaling": {"gpuBudget": 48, "schedules": [a, b]}})
    assert found == ["spec.autoscaling.schedules: the windows morning, noon hold together 56 GPUs (prefill 8 x 4 + "
                     "decode 6 x 4) > gpuBudget 48: lower their minReplicas, or raise gpuBudget"]


def test_defaults_render_no_startup_option():
    objs = render(api.V41FlashDeployment.model_validate(doc({})))
    assert not [o for o in objs if o["kind"] == "DaemonSet"]
    for o in objs:
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["v41flash.io/role"] != "router":
            c = o["spec"]["template"]["spec"]["containers"][0]
            assert "--load-format" not in c["args"] and not any(v["name"] == "weight-cache" for v in c["volumeMounts"])


@pytest.mark.parametrize("fmt", facts.STARTUP_LOAD_FORMATS)
def test_every_offered_load_format_is_rendered_as_vllm_accepts_it(fmt):
    objs = render(api.V41FlashDeployment.model_validate(doc({"startup": {"loadFormat": fmt}})))
    engines = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"]["v41flash.io/role"] != "router"]
    assert len(engines) == 2
    for o in engines:
        args = o["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--load-format") + 1] == fmt
        assert check_serve_args(args) == []


def test_the_offered_load_formats_are_loaders_of_vllm():
    assert set(facts.STARTUP_LOAD_FORMATS) <= set(facts.LOAD_FORMATS)


def test_an_unknown_load_format_fails_the_parser_check():
    (problem,) = check_serve_args(["m", "--load-format", "streamer"])
    assert "is not a model loader of vLLM 0.33.0" in problem


def test_a_weight_cache_is_mounted_as_hf_home_and_prefetched_by_a_daemonset():
    spec = {"startup": {"weightCache": {"hostPath": "/mnt/nvme/v41flash"}},
            "model": {"source": {"hub": {"tokenSecretRef": {"name": "hf"}}}}}
    objs = render(api.V41FlashDeployment.model_validate(doc(spec)))
    engine = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "x-decode")
    engine = engine["spec"]["template"]["spec"]
    # the namespace's own directory, read-only in the engines (issue 39)
    assert {"name": "weight-cache", "hostPath": {"path": "/mnt/nvme/v41flash/n", "type": "DirectoryOrCreate"}} in \
        engine["volumes"]
    assert {"name": "weight-cache", "mountPath": "/weight-cache", "readOnly": True} in \
        engine["containers"][0]["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/weight-cache/huggingface"} in engine["containers"][0]["env"]
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["name"] == "x-weight-prefetch"
    init = pod["initContainers"][0]
    assert {"name": "CHECKPOINT", "value": api.ModelSpec().checkpoint} in init["env"]
    assert any(e["name"] == "HF_TOKEN" for e in init["env"])
    assert all("nvidia.com/gpu" not in c["resources"]["limits"] for c in pod["containers"] + pod["initContainers"])
    assert pod["volumes"] == [engine["volumes"][-1]]
    # the prefetcher is the one writer
    assert init["volumeMounts"] == [{"name": "weight-cache", "mountPath": "/weight-cache"}]
    assert all("volumeMounts" not in c for c in pod["containers"])
    off = render(api.V41FlashDeployment.model_validate(doc({"startup": {"weightCache": {
        "hostPath": "/mnt/nvme/v41flash", "prefetch": False}}})))
    assert not [o for o in off if o["kind"] == "DaemonSet"]


def test_a_weight_cache_with_a_pvc_source_is_refused():
    found = problems({"model": {"source": {"pvc": {"claimName": "w"}}},
                      "startup": {"weightCache": {"hostPath": "/mnt/x"}}})
    assert found == ["spec.startup.weightCache: startup.weightCache keeps hub downloads on the nodes: with "
                     "model.source.pvc the weights already come from the volume you chose; remove one of them"]
