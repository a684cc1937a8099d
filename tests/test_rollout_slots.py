"""Two revisions side by side (rollout/slots.py): per-slot engine workloads and routers, the front proxy and
its routing table; the serving slot's engines are exactly what was running."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.proxy.revisions import parse_table
from v41flash.render import labels as L
from v41flash.render.revision import revision_of
from v41flash.render.router import ROUTER_INTERNAL_PORT
from v41flash.rollout.machine import SlotPlan
from v41flash.render import SlotSpec, render
from v41flash.render.router import ROUTES_CONFIG_KEY
from v41flash.render.slots import slot_router_name
from v41flash.rollout.slots import controller_revision, slot_observation, slot_specs, spec_of

ROOT = Path(__file__).resolve().parents[1]
OWNER = {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment", "name": "x", "uid": "u-1"}


def example(name="tp4-h200-low-latency"):
    return V41FlashDeployment.model_validate(yaml.safe_load((ROOT / f"manifests/examples/{name}.yaml").read_text()))


def changed(obj, **model):
    doc = obj.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["model"].update(model)
    return V41FlashDeployment.model_validate(doc)


def engines(objs):
    return [o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")
            and o["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")]


def by_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.fixture(params=["tp4-h200-low-latency", "gb300-pd-dep4-dep16", "aggregated-h200"])
def pair(request):
    old = example(request.param)
    new = changed(old, revision="0123abc")
    slots = [SlotSpec("", old.spec, share=75), SlotSpec("a", new.spec, replicas={"prefill": 1, "decode": 1}, share=25)]
    return old, new, render(new, slots, owner=OWNER)


def test_the_serving_slot_runs_exactly_what_render_rendered(pair):
    old, new, objs = pair
    before = {(o["kind"], o["metadata"]["name"]): o for o in engines(render(old, owner=OWNER))}
    got = by_name(objs)
    for key, w in before.items():
        assert got[key] == w  # byte-identical: starting a rollout restarts no serving engine


def test_candidate_workloads_are_slotted_and_carry_their_own_revision(pair):
    old, new, objs = pair
    rev_new = revision_of(render(new))
    cand = [w for w in engines(objs) if w["metadata"]["labels"].get(L.SLOT_LABEL) == "a"]
    assert cand and all(w["metadata"]["name"].endswith("-a") for w in cand)
    for w in cand:
        assert w["metadata"]["labels"][L.REVISION_LABEL] == rev_new
        if w["kind"] == "Deployment":
            assert w["spec"]["selector"]["matchLabels"][L.SLOT_LABEL] == "a"
            templates = [w["spec"]["template"]]
        else:
            lwt = w["spec"]["leaderWorkerTemplate"]
            templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
        for t in templates:
            assert t["metadata"]["labels"][L.SLOT_LABEL] == "a"
            assert t["metadata"]["labels"][L.REVISION_LABEL] == rev_new
        assert w["spec"]["replicas"] == 1


def test_each_slot_router_discovers_only_its_revision(pair):
    old, new, objs = pair
    got = by_name(objs)
    for slot, spec_obj in (("0", old), ("a", new)):
        rev = revision_of(render(spec_obj))
        d = got[("Deployment", slot_router_name(old.metadata["name"], "" if slot == "0" else slot))]
        c = d["spec"]["template"]["spec"]["containers"]
        assert [x["name"] for x in c] == ["router"]  # vllm-router alone
        args = c[0]["args"]
        for flag in ("--prefill-selector", "--decode-selector", "--selector"):
            if flag in args:
                i = args.index(flag) + 1
                sel = []
                while i < len(args) and not args[i].startswith("--"):
                    sel.append(args[i])
                    i += 1
                assert f"{L.REVISION_LABEL}={rev}" in sel
        assert args[args.index("--port") + 1] == str(ROUTER_INTERNAL_PORT)
        assert d["spec"]["template"]["metadata"]["labels"][L.REVISION_LABEL] == rev
        svc = got[("Service", d["metadata"]["name"])]
        assert svc["spec"]["selector"][L.SLOT_LABEL] == slot
        assert svc["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert L.FRONT_LABEL not in d["spec"]["template"]["metadata"]["labels"]


def test_front_is_envoy_with_the_routing_table(pair):
    old, new, objs = pair
    name = old.metadata["name"]
    got = by_name(objs)
    front = got[("Deployment", f"{name}-router")]
    pod = front["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["front", "counters"]
    cm = got[("ConfigMap", f"{name}-config")]["data"]
    clusters = {c["name"]: c for c in json.loads(cm["front-clusters.json"])["resources"]}
    address = clusters["serving"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": f"{name}-router-serving.default.svc", "port_value": 8000}
    assert got[("Service", f"{name}-router-serving")]["spec"]["selector"][L.SLOT_LABEL] == "0"
    assert pod["metadata"]["labels"][L.FRONT_LABEL] == "true"
    # the Service selects the front's pods and a router pod from before every deployment had a front (the upgrade
    # path: it serves until a front pod is Ready), never a slot's vllm-router
    selector = got[("Service", f"{name}-router")]["spec"]["selector"].items()
    assert selector <= pod["metadata"]["labels"].items()
    assert selector <= L.common_labels(name, L.ROUTER).items()  # the pod labels of the one-pod router of old
    for slot in ("0", "a"):
        slot_pod = got[("Deployment", f"{name}-router-{slot}")]["spec"]["template"]["metadata"]["labels"]
        assert not selector <= slot_pod.items()
    table = parse_table(json.loads(got[("ConfigMap", f"{name}-config")]["data"][ROUTES_CONFIG_KEY]))
    rev_old, rev_new = revision_of(render(old)), revision_of(render(new))
    assert [(r.revision, r.share, r.accept_new) for r in table.routes] == [(rev_new, 25, True), (rev_old, 75, True)]
    assert table.routes[0].upstream == f"http://{name}-router-a.default.svc:8000"


def test_names_are_unique_and_every_object_is_owned(pair):
    _, _, objs = pair
    keys = Counter((o["kind"], o["metadata"]["name"]) for o in objs)
    assert max(keys.values()) == 1
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u-1" for o in objs)


def test_slot_routers_internal_port_is_open_to_router_pods_only(pair):
    old, _, objs = pair
    pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("router-ingress"))
    rule = [r for r in pol["spec"]["ingress"] if {"protocol": "TCP", "port": ROUTER_INTERNAL_PORT} in r.get("ports", [])]
    assert len(rule) == 1
    assert rule[0]["from"] == [{"podSelector": {"matchLabels": L.selector_labels(old.metadata["name"], L.ROUTER)}}]


def test_promoted_and_draining_table():
    old = example()
    new = changed(old, revision="0123abc")
    objs = render(new, [SlotSpec("a", new.spec, share=100), SlotSpec("", old.spec, share=0, accept_new=False)])
    name = old.metadata["name"]
    table = parse_table(json.loads(by_name(objs)[("ConfigMap", f"{name}-config")]["data"][ROUTES_CONFIG_KEY]))
    assert [(r.share, r.accept_new) for r in table.routes] == [(100, True), (0, False)]
    assert by_name(objs)[("Service", f"{name}-router-serving")]["spec"]["selector"][L.SLOT_LABEL] == "a"
    # a promotion changes the table and the serving Service, never the front's pods (their session records)
    during = render(new, [SlotSpec("", old.spec, share=50), SlotSpec("a", new.spec, share=50)])
    assert by_name(objs)[("Deployment", f"{name}-router")] == by_name(during)[("Deployment", f"{name}-router")]


def test_a_serving_slot_after_a_rollout_keeps_its_template_when_the_spec_moves_on():
    """Slot a serves revision R1 (its recorded spec); the current spec renders R2 into slot b: a's workloads
    are those of R1, whatever the current spec says."""
    r1 = changed(example(), revision="r1")
    r2 = changed(example(), revision="r2")
    alone = render(r1, [SlotSpec("a", r1.spec)])
    both = render(r2, [SlotSpec("a", r1.spec, share=95), SlotSpec("b", r2.spec, share=5)])
    a_alone = {k: v for k, v in by_name(alone).items() if k[1].endswith("-a") and k[0] == "Deployment"
               and v["metadata"]["labels"].get(L.ROLE_LABEL) in ("prefill", "decode")}
    assert a_alone and all(by_name(both)[k] == v for k, v in a_alone.items())


def test_router_settings_come_from_the_current_spec_for_both_slots():
    old = example()
    doc = changed(old, revision="z").model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["routing"]["policy"] = "cache_aware"
    new = V41FlashDeployment.model_validate(doc)
    objs = render(new, [SlotSpec("", old.spec, share=50), SlotSpec("a", new.spec, share=50)])
    for slot in ("", "a"):
        d = by_name(objs)[("Deployment", slot_router_name(old.metadata["name"], slot))]
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--prefill-policy") + 1] == "cache_aware"


@pytest.mark.parametrize("slots, match", [
    ([], "one or two"),
    ([SlotSpec("a", None, share=50), SlotSpec("b", None, share=50), SlotSpec("", None, share=0)], "one or two"),
    ([SlotSpec("a", None, share=50), SlotSpec("a", None, share=50)], "distinct"),
    ([SlotSpec("a", None, share=60), SlotSpec("b", None, share=30)], "add up to 100"),
    ([SlotSpec("a", None, share=100, accept_new=False)], "add up to 100"),
])
def test_bad_slot_sets_are_refused(slots, match):
    with pytest.raises(ValueError, match=match):
        render(example(), slots)


# --- read back: ControllerRevision and slot observation ----------------------------------------------

def test_controller_revision_round_trips_the_spec():
    old = example()
    cr = controller_revision("x", "ns", "0123456789", old.spec, 3, OWNER)
    assert cr["kind"] == "ControllerRevision" and cr["metadata"]["name"] == "x-0123456789" and cr["revision"] == 3
    assert cr["metadata"]["labels"][L.REVISION_LABEL] == "0123456789"
    assert spec_of(cr) == old.spec
    assert revision_of(render(V41FlashDeployment(apiVersion="v41flash.io/v1alpha1", kind="V41FlashDeployment",
                                                 metadata=old.metadata, spec=spec_of(cr)))) == revision_of(render(old))
    with pytest.raises(ValueError, match="x-bad"):
        spec_of({"metadata": {"name": "x-bad"}, "data": {"spec": {"profile": "nope"}}})
    with pytest.raises(ValueError, match="data.spec missing"):
        spec_of({"metadata": {"name": "x-bad"}})


def _pod(name, role, slot, rev, ready=True, waiting="", unsched="", deleting=False):
    labels = {L.ROLE_LABEL: role, L.SERVING_LABEL: "true", L.REVISION_LABEL: rev}
    if slot:
        labels[L.SLOT_LABEL] = slot
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unsched:
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unsched})
    meta = {"name": name, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    cs = [{"state": {"waiting": {"reason": waiting}}}] if waiting else []
    return {"metadata": meta, "status": {"conditions": conds, "containerStatuses": cs}}


def _workload(name, rev, replicas):
    return {"metadata": {"name": name, "labels": {L.REVISION_LABEL: rev}}, "spec": {"replicas": replicas}}


def test_slot_observation_counts_only_the_slot_and_revision():
    workloads = [_workload("x-prefill-a", "R2", 1), _workload("x-decode-a", "R2", 2), _workload("x-prefill", "R1", 3)]
    pods = [_pod("p-a-1", "prefill", "a", "R2"),
            _pod("p-a-old", "prefill", "a", "R1"),  # an earlier candidate's pod in the same slot
            _pod("p-legacy", "prefill", "", "R2"),  # same revision, other slot
            _pod("d-a-1", "decode", "a", "R2", ready=False, waiting="CrashLoopBackOff"),
            _pod("d-a-2", "decode", "a", "R2", ready=False, unsched="0/6 nodes: Insufficient nvidia.com/gpu"),
            _pod("d-a-3", "decode", "a", "R2", deleting=True)]
    routers = [{"metadata": {"name": "x-router-a", "labels": {L.REVISION_LABEL: "R2"}}, "status": {"readyReplicas": 1}}]
    o = slot_observation("x", "a", "R2", workloads, pods, routers, ["prefill", "decode"])
    assert (o.roles["prefill"].replicas, o.roles["prefill"].ready) == (1, 1)
    assert (o.roles["decode"].replicas, o.roles["decode"].ready) == (2, 0)
    assert o.roles["decode"].problems == ("d-a-1: CrashLoopBackOff",)
    assert "Insufficient nvidia.com/gpu" in o.roles["decode"].unschedulable
    assert o.router_ready and not o.ready()
    # the workload now runs another revision: none of R2's replicas are wanted there
    o2 = slot_observation("x", "a", "R3", workloads, pods, routers, ["prefill"])
    assert o2.roles["prefill"].replicas == 0 and not o2.router_ready
    legacy = slot_observation("x", "", "R1", workloads, pods, [], ["prefill"])
    assert legacy.roles["prefill"].replicas == 3 and legacy.roles["prefill"].ready == 0


def test_slot_specs_from_the_machine_plans():
    old, new = example(), changed(example(), revision="n")
    plans = (SlotPlan("", "R1", "serving", 95, True, None, 1), SlotPlan("a", "R2", "candidate", 5, True, {"prefill": 2,
                                                                                                       "decode": 2}))
    got = slot_specs(plans, {"R1": old.spec, "R2": new.spec}, {"prefill": 3, "decode": 1})
    assert got[0] == SlotSpec("", old.spec, {"prefill": 2, "decode": 1}, 95, True)  # InPlace: never below one
    assert got[1] == SlotSpec("a", new.spec, {"prefill": 2, "decode": 2}, 5, True)
    with pytest.raises(ValueError, match="R3.*ControllerRevision"):
        slot_specs((SlotPlan("b", "R3", "draining", 0, False),), {}, None)
