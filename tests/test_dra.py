"""GPUs by Dynamic Resource Allocation (spec.gpu.allocation: DRA, render/dra.py): a ResourceClaimTemplate per engine
workload against the NVIDIA driver's DeviceClass, product and memory selected in CEL, pods claiming from it instead of
requesting nvidia.com/gpu; valid against Kubernetes 1.36's resource.k8s.io/v1 schema; refused where it cannot apply;
the planner's GPUs and an unschedulable claim read as the device plugin's."""
from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from v41flash import gpus
from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.api.validation import validate
from v41flash.controller.observation import _why_unschedulable
from v41flash.render import render, resolve
from v41flash.render import dra
from v41flash.render import labels as L
from v41flash.render.revision import revision_of

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.36.0"  # kubernetes-validate's schemas, as tests/test_render.py


def doc(example: str = "tp4-h200-low-latency", **gpu) -> dict:
    d = yaml.safe_load((ROOT / "manifests/examples" / f"{example}.yaml").read_text())
    d["metadata"]["namespace"] = "ns"
    d["spec"]["gpu"] = {**d["spec"].get("gpu", {}), "allocation": "DRA", **gpu}
    return d


def objs(d: dict) -> list[dict]:
    return render(V41FlashDeployment.model_validate(d))


def engines(out: list[dict]) -> list[dict]:
    return [o for o in out if o["kind"] in ("Deployment", "LeaderWorkerSet")
            and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")]


def pod_specs(w: dict) -> list[dict]:
    if w["kind"] == "Deployment":
        return [w["spec"]["template"]["spec"]]
    lwt = w["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]


def test_h200_with_dra_claims_its_gpus_from_a_template_per_workload():
    out = objs(doc())
    templates = {o["metadata"]["name"]: o for o in out if o["kind"] == "ResourceClaimTemplate"}
    assert len(templates) == 2  # prefill and decode
    for w in engines(out):
        (spec,) = pod_specs(w)
        vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
        assert "nvidia.com/gpu" not in vllm["resources"]["limits"] and "nvidia.com/gpu" not in vllm["resources"]["requests"]
        assert vllm["resources"]["claims"] == [{"name": dra.GPU_CLAIM}]
        (claim,) = spec["resourceClaims"]
        name = claim["resourceClaimTemplateName"]
        assert name.startswith(w["metadata"]["name"] + "-gpus-")
        t = templates[name]
        assert out.index(t) < out.index(w)  # created before its pods
        (request,) = t["spec"]["spec"]["devices"]["requests"]
        assert request == {"name": dra.GPU_CLAIM, "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4,
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200' && "
                                                 "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('133G')) >= 0"}}]}}
        assert t["metadata"]["labels"][L.ROLE_LABEL] == w["metadata"]["labels"][L.ROLE_LABEL]


def test_every_rendered_object_validates_against_kubernetes_1_36():
    for d in (doc(), doc("gb300-pd-dep4-dep16"), doc(deviceClassName="gpu.example.org")):
        out = objs(d)
        assert any(o["kind"] == "ResourceClaimTemplate" for o in out)
        for o in out:
            if o["apiVersion"].startswith(("v1", "apps/", "policy/", "networking.k8s.io/", "rbac.", "resource.k8s.io/")):
                kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        for w in engines(out):
            for spec in pod_specs(w):
                kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                              "template": {"metadata": {}, "spec": spec}}, K8S_VERSION, strict=True)


def test_the_schema_check_catches_a_bad_template():
    t = next(o for o in objs(doc()) if o["kind"] == "ResourceClaimTemplate")
    t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["countt"] = 4
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(t, K8S_VERSION, strict=True)


def test_gb300_dra_pods_claim_gpus_and_the_imex_channel():
    out = objs(doc("gb300-pd-dep4-dep16"))
    lws = next(o for o in out if o["kind"] == "LeaderWorkerSet")
    for spec in pod_specs(lws):
        assert [c["name"] for c in spec["resourceClaims"]] == [dra.GPU_CLAIM, "imex-channel"]
        vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
        assert vllm["resources"]["claims"] == [{"name": dra.GPU_CLAIM}, {"name": "imex-channel"}]
    t = next(o for o in out if o["kind"] == "ResourceClaimTemplate" and o["metadata"]["name"].startswith(
        lws["metadata"]["name"] + "-gpus-"))
    assert t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4  # one tray's GPUs per pod


def test_another_count_is_another_template_and_another_revision():
    a, b = doc(), doc()
    b["spec"]["decode"]["tensorParallelSize"] = 8
    out_a, out_b = objs(a), objs(b)
    names = lambda out: {o["metadata"]["name"] for o in out if o["kind"] == "ResourceClaimTemplate"}  # noqa: E731
    assert names(out_a) != names(out_b) and revision_of(out_a) != revision_of(out_b)
    # the device plugin's default renders no template and keeps its limit
    plain = yaml.safe_load((ROOT / "manifests/examples/tp4-h200-low-latency.yaml").read_text())
    plain["metadata"]["namespace"] = "ns"
    assert not [o for o in objs(plain) if o["kind"] == "ResourceClaimTemplate"]


def test_a_rollout_slot_claims_from_its_own_template():
    from v41flash.render import SlotSpec
    m = V41FlashDeployment.model_validate(doc())
    new = m.spec.model_copy(update={"decode": m.spec.decode.model_copy(update={"max_num_seqs": 32})})
    out = render(m, [SlotSpec("", m.spec, share=50), SlotSpec("a", new, share=50)])
    templates = {o["metadata"]["name"] for o in out if o["kind"] == "ResourceClaimTemplate"}
    claimed = {c["resourceClaimTemplateName"] for w in engines(out) for s in pod_specs(w) for c in s["resourceClaims"]}
    assert claimed == templates and len(templates) == 4
    assert any(n.startswith("tp4-h200-low-latency-decode-a-gpus-") for n in templates)


@pytest.mark.parametrize("gpu,field", [
    ({"allocation": "DevicePlugin", "deviceClassName": "gpu.example.org"}, "spec.gpu.deviceClassName"),
    ({"product": "MI355X"}, "spec.gpu.allocation"),
])
def test_refused_at_admission_naming_the_field(gpu, field):
    d = doc(**gpu)
    found = validate(d)
    assert any(p.path == field for p in found), found


def test_the_planner_counts_the_same_gpus_either_way():
    plain = yaml.safe_load((ROOT / "manifests/examples/tp4-h200-low-latency.yaml").read_text())
    with_dra = V41FlashDeployment.model_validate(doc()).spec
    by_plugin = V41FlashDeployment.model_validate(plain).spec
    a, b = resolve(with_dra), resolve(by_plugin)
    assert a.gpu.dra and not b.gpu.dra
    assert a.min_gpus() == b.min_gpus() == 8
    assert {r.role: r.gpus_per_replica for r in a.enabled_roles} == {r.role: r.gpus_per_replica for r in b.enabled_roles}


def test_an_unschedulable_claim_is_capacity_pending_like_a_missing_gpu():
    msg = ("0/28 nodes are available: 4 cannot allocate all claims, 24 node(s) didn't match Pod's node "
           "affinity/selector. preemption: 0/28 nodes are available: 28 Preemption is not helpful for scheduling.")
    assert _why_unschedulable([msg]) == "cannot allocate all claims"
    assert _why_unschedulable(["0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]) == "Insufficient nvidia.com/gpu"


def test_product_names_are_nvml_names():
    assert dra.product_name(gpus.gpu("H100")) == "NVIDIA H100 80GB HBM3"
    assert dra.product_name(gpus.gpu("GB300")) == "NVIDIA GB300"


def test_what_the_harness_plays_of_the_nvidia_driver_is_valid_kubernetes_1_36():
    """e2e/dra.py: the DeviceClasses, one node's ResourceSlices and a domain's channel template."""
    from e2e import dra as harness
    from e2e.nodes import NODE_POOLS, fake_nodes
    domain = next(o for o in objs(doc("gb300-pd-dep4-dep16")) if o["kind"] == "ComputeDomain")
    domain["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    tray = [n for n in fake_nodes() if n["metadata"]["name"] == "gb300-rack0-tray-00"]
    slices = harness.resource_slices(tray, NODE_POOLS)
    assert [s["spec"]["driver"] for s in slices] == ["gpu.nvidia.com", "compute-domain.nvidia.com"]
    assert len(slices[0]["spec"]["devices"]) == 4
    rct = harness.channel_template(domain)
    assert rct["metadata"]["name"] == domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for o in [*harness.device_classes(), *slices, rct]:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_a_cluster_without_resource_k8s_io_v1_stalls_naming_it():
    import process_memory
    from fake_kube import FakeKube
    from v41flash.controller.kube import CHILD_KINDS
    kube = FakeKube(kinds=[k for k in CHILD_KINDS if k != (dra.RESOURCE_API_VERSION, "ResourceClaimTemplate")])
    name = kube.add_cr(doc())["metadata"]["name"]
    out = process_memory.reconcile(kube, kube.cr(name), lambda *e: None)
    assert out.stall.reason == "KindNotInstalled" and kube.objects == {}
    assert out.stall.message == ("the cluster does not serve ResourceClaimTemplate.resource.k8s.io/v1: install "
                                 f"{dra.INSTALL_HINTS['ResourceClaimTemplate']}")
