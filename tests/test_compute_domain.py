"""IMEX ComputeDomains (render/compute_domain.py): one per engine workload whose replicas span NVL72 trays, its
channel claimed by every pod of every group, named per slot, schema-valid, a Stalled deployment without its CRD,
and kept after its workload until no pod claims its channel (docs/decisions/2026-12-07-compute-domains.md)."""
from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes import client

from e2e import dra as harness_dra
from fake_kube import FakeKube
import process_memory
from process_memory import reconcile
from test_render import _structural_to_jsonschema
from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.controller.config import OperatorConfig
from v41flash.controller.kube import CHILD_KINDS
from v41flash.controller.periodic import periodic_work
from v41flash.render import SlotSpec, render
from v41flash.render import compute_domain as cd
from v41flash.render import labels as L

ROOT = Path(__file__).resolve().parents[1]
GB300 = "gb300-pd-dep4-dep16"


def doc(name: str = GB300) -> dict:
    d = yaml.safe_load((ROOT / "manifests/examples" / f"{name}.yaml").read_text())
    d["metadata"]["namespace"] = "ns"
    return d


def model(d: dict) -> V41FlashDeployment:
    return V41FlashDeployment.model_validate(d)


def pod_specs(lws: dict) -> list[dict]:
    lwt = lws["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]


def vllm(pod_spec: dict) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == "vllm")


def test_the_gb300_decode_over_four_trays_gets_a_domain_whose_channel_every_pod_claims():
    objs = render(model(doc()))
    domains = [o for o in objs if o["kind"] == cd.KIND]
    (lws,) = [o for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert [d["metadata"]["name"] for d in domains] == [f"{GB300}-decode-imex"]
    domain = domains[0]
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{GB300}-decode-imex-channel"},
                                                         "allocationMode": "Single"}}
    assert domain["metadata"]["labels"][L.ROLE_LABEL] == "decode"
    # before its pods: the apply's first wave, and first in the list
    assert objs.index(domain) < objs.index(lws)
    for spec in pod_specs(lws):  # leader and workers: every pod of every group
        assert spec["resourceClaims"] == [{"name": cd.CHANNEL_CLAIM,
                                           "resourceClaimTemplateName": f"{GB300}-decode-imex-channel"}]
        assert vllm(spec)["resources"]["claims"] == [{"name": cd.CHANNEL_CLAIM}]
        assert vllm(spec)["resources"]["limits"]["nvidia.com/gpu"] == "4"  # GPUs still by the device plugin
    # the group's pods stay in one NVLink clique (the domain spans groups; each group is one clique)
    aff = pod_specs(lws)[1]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert aff["topologyKey"] == "nvidia.com/gpu.clique"
    # the one-tray prefill (a Deployment) needs no domain
    prefill = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{GB300}-prefill")
    assert "resourceClaims" not in prefill["spec"]["template"]["spec"]


@pytest.mark.parametrize("product,nodes", [("H200", 2), ("B200", 2), ("GB300", 1)])
def test_no_domain_without_multi_node_nvlink(product, nodes):
    d = doc()
    d["spec"]["gpu"]["product"] = product
    d["spec"]["decode"].update(dataParallelSize=8 * nodes if product != "GB300" else 4, nodesPerReplica=nodes)
    d["spec"]["decode"].pop("eplb")
    objs = render(model(d))
    assert not [o for o in objs if o["kind"] == cd.KIND]
    assert not any("resourceClaims" in str(o) for o in objs if o["kind"] in ("LeaderWorkerSet", "Deployment"))


def test_a_rollout_slot_has_its_own_domain_and_the_same_revision():
    m = model(doc())
    new = m.spec.model_copy(update={"decode": m.spec.decode.model_copy(update={"max_num_seqs": 32})})
    objs = render(m, [SlotSpec("", m.spec, share=50), SlotSpec("a", new, share=50)])
    domains = {o["metadata"]["name"]: o for o in objs if o["kind"] == cd.KIND}
    assert set(domains) == {f"{GB300}-decode-imex", f"{GB300}-decode-a-imex"}
    lws = {o["metadata"]["name"]: o for o in objs if o["kind"] == "LeaderWorkerSet"}
    for name, domain in ((f"{GB300}-decode", domains[f"{GB300}-decode-imex"]),
                         (f"{GB300}-decode-a", domains[f"{GB300}-decode-a-imex"])):
        rct = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
        assert {c["resourceClaimTemplateName"] for s in pod_specs(lws[name]) for c in s["resourceClaims"]} == {rct}
        assert domain["metadata"]["labels"][L.REVISION_LABEL] == lws[name]["metadata"]["labels"][L.REVISION_LABEL]
    assert domains[f"{GB300}-decode-a-imex"]["metadata"]["labels"][L.SLOT_LABEL] == "a"
    # slot "a" alone renders the revision slot "" would have: the claim's slot name is not part of it
    alone = render(model({**doc(), "spec": new.model_dump(by_alias=True, mode="json")}))
    rev_alone = next(o for o in alone if o["kind"] == "LeaderWorkerSet")["metadata"]["labels"][L.REVISION_LABEL]
    assert lws[f"{GB300}-decode-a"]["metadata"]["labels"][L.REVISION_LABEL] == rev_alone


# ------------------------------------------------------------------ the schema
@functools.cache
def _validator():
    crd = harness_dra.compute_domain_crd()
    schema = _structural_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def test_the_domain_validates_against_the_computedomain_schema():
    for domain in [o for o in render(model(doc())) if o["kind"] == cd.KIND]:
        _validator().validate(domain)
    crd = harness_dra.compute_domain_crd()
    assert crd["spec"]["group"] + "/" + crd["spec"]["versions"][0]["name"] == cd.API_VERSION
    assert crd["spec"]["names"]["kind"] == cd.KIND


@pytest.mark.parametrize("breaks", [
    lambda s: s.pop("channel"),
    lambda s: s["channel"].update(allocationMode="Some"),
    lambda s: s["channel"]["resourceClaimTemplate"].pop("name"),
    lambda s: s.update(numNodez=0),
])
def test_the_schema_check_catches_a_bad_domain(breaks):
    domain = copy.deepcopy(next(o for o in render(model(doc())) if o["kind"] == cd.KIND))
    breaks(domain["spec"])
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(domain)


# ------------------------------------------------------------------ the controller
def run(kube: FakeKube, name: str = GB300):
    events = []
    out = reconcile(kube, kube.cr(name), lambda *e: events.append(e))
    return out, events


def test_without_the_computedomain_crd_the_deployment_is_stalled_naming_the_kind_and_nothing_is_applied():
    kube = FakeKube(kinds=[k for k in CHILD_KINDS if k != (cd.API_VERSION, cd.KIND)])
    kube.add_cr(doc())
    out, events = run(kube)
    assert out.stall.reason == "KindNotInstalled"
    assert out.stall.message == ("the cluster does not serve ComputeDomain.resource.nvidia.com/v1beta1: install "
                                 f"{cd.INSTALL_HINTS[cd.KIND]}")
    assert kube.objects == {} and [e[:2] for e in events] == [("Warning", "KindNotInstalled")]
    kube.kinds.add((cd.API_VERSION, cd.KIND))
    out, _ = run(kube)
    assert out.stall is None and kube.get(cd.KIND, f"{GB300}-decode-imex") is not None


def _pod_claiming(template: str | None, name: str = "old-decode-0") -> client.V1Pod:
    claims = [client.V1PodResourceClaim(name=cd.CHANNEL_CLAIM, resource_claim_template_name=template)] if template else []
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace="ns", labels={L.DEPLOYMENT_LABEL: GB300}),
                        spec=client.V1PodSpec(containers=[], resource_claims=claims))


def test_an_undesired_domain_stays_until_no_pod_claims_its_channel_then_goes():
    kube = FakeKube()
    cr = kube.add_cr(doc())
    run(kube)
    kube.settle()
    # the domain of a slot the rollout retired: owned and labelled like every child, no longer rendered
    old = copy.deepcopy(kube.get(cd.KIND, f"{GB300}-decode-imex"))
    old["metadata"]["name"] = f"{GB300}-decode-b-imex"
    old["spec"]["channel"]["resourceClaimTemplate"]["name"] = f"{GB300}-decode-b-imex-channel"
    kube.put(old)
    assert old["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
    kube.pods.append(_pod_claiming(f"{GB300}-decode-b-imex-channel"))  # a drained pod, still terminating
    kube.pods.append(_pod_claiming(None, "someone-else"))
    out, _ = run(kube)
    assert f"{cd.KIND}/{GB300}-decode-b-imex" not in out.pruned
    assert kube.get(cd.KIND, f"{GB300}-decode-b-imex") is not None
    mem = process_memory.MEMORY.of(cr["metadata"]["uid"])
    assert mem.domains_draining
    # while it drains, every tick is a pass that prunes (not only the drift slot's)
    work = periodic_work(cr["metadata"]["uid"], 1, float("inf"), OperatorConfig(), draining=mem.domains_draining)
    assert work.full and work.prune
    kube.pods = [p for p in kube.pods if p.metadata.name != "old-decode-0"]  # its pod is gone
    out, _ = run(kube)
    assert f"{cd.KIND}/{GB300}-decode-b-imex" in out.pruned and kube.get(cd.KIND, f"{GB300}-decode-b-imex") is None
    assert not mem.domains_draining
    # the serving slot's own domain was never touched
    assert kube.get(cd.KIND, f"{GB300}-decode-imex") is not None


def test_without_a_draining_domain_a_tick_off_the_drift_slot_only_observes():
    cfg = OperatorConfig()
    uid = next(f"u{i}" for i in range(100) if not periodic_work(f"u{i}", 1, float("-inf"), cfg).full)
    assert not periodic_work(uid, 1, float("-inf"), cfg).prune
    assert periodic_work(uid, 1, float("-inf"), cfg, draining=True).prune
