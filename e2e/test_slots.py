"""Two serving revisions side by side on the real control plane, applied straight from render() with two slots (no
operator): the front (Envoy) splits sessions between the slots' routers by the routing table,
every session stays on one revision, and each request's prefill and decode ran on engines of that revision
(the simulators' own request counters per revision match the front's per-revision counts exactly: a
cross-revision pair would count a request on one revision's prefill and the other's decode). The simulator
knobs reach only the pods of the revision that carries them."""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.kit import wait_for
from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.render.revision import revision_of
from v41flash.render import SlotSpec, render

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
REVISION = "v41flash.io/serving-revision"


def _cr(ns: str, **model) -> V41FlashDeployment:
    doc = yaml.safe_load((REPO / "manifests/examples/tp4-h200-low-latency.yaml").read_text())
    doc["metadata"] = {"name": "slots", "namespace": ns}
    doc["spec"]["model"].update(model)
    return V41FlashDeployment.model_validate(doc)


def _apply(cluster, objs: list[dict], ns: str) -> None:
    cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs))


def _pods(cluster, ns: str, selector: str) -> list[dict]:
    return [p for p in cluster.kubectl_json("get", "pods", "-n", ns, "-l", selector)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def _ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])


def _served(cluster, pod: dict, ns: str) -> float:
    s = cluster.sim_for(pod["metadata"]["name"], ns)
    text = httpx.get(f"http://{s['ip']}:{s['port']}/metrics", timeout=5).text
    from prometheus_client.parser import text_string_to_metric_families
    return sum(x.value for fam in text_string_to_metric_families(text) for x in fam.samples
               if x.name in ("vllm:request_success", "vllm:request_success_total"))


def test_two_revisions_split_by_session_with_revision_consistent_pairs(cluster, ns):
    r1, r2 = _cr(ns, revision="r1"), _cr(ns, revision="r2")
    rev1, rev2 = revision_of(render(r1)), revision_of(render(r2))
    _apply(cluster, render(r2, [SlotSpec("", r1.spec, share=50), SlotSpec("a", r2.spec, share=50)]), ns)

    def all_ready():
        engines = _pods(cluster, ns, "v41flash.io/deployment=slots,v41flash.io/serving=true")
        routers = _pods(cluster, ns, "v41flash.io/deployment=slots,v41flash.io/role=router")
        ok = len(engines) == 4 and len(routers) == 4 and all(_ready(p) for p in engines + routers)
        return (engines, routers) if ok else None
    # two front replicas (the autoscaler's minimum) and one vllm-router per slot
    engines, routers = wait_for(all_ready, 180, "4 engine pods and 4 router pods Ready")
    assert {p["metadata"]["labels"][REVISION] for p in engines} == {rev1, rev2}
    front = next(p for p in routers if p["metadata"]["labels"].get("v41flash.io/front") == "true")
    proxy = cluster.sim_for(front["metadata"]["name"], ns)
    assert proxy["kind"] == "front"
    boot = Path(proxy["argv"][proxy["argv"].index("-c") + 1])
    clusters = boot.parent / "front-clusters.json"

    def resolved():
        docs = json.loads(clusters.read_text())["resources"] if clusters.exists() else []
        eps = [e["endpoint"]["address"]["socket_address"]["port_value"] for c in docs
               for e in c["load_assignment"]["endpoints"][0]["lb_endpoints"]]
        return len(docs) == 3 and 9 not in eps
    # both revisions' routers resolved (the harness's copy of the front's clusters), then Envoy has them
    wait_for(resolved, 30, "the front's clusters, both revisions' routers resolved")
    model = r1.spec.model.served_model_name or r1.spec.model.checkpoint
    wait_for(lambda: all(httpx.post(f"http://{proxy['ip']}:{proxy['port']}/v1/chat/completions", timeout=30, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": f"probe {i}"}]}).status_code == 200
        for i in range(8)), 30, "both revisions answering through the front")
    before = {p["metadata"]["name"]: _served(cluster, p, ns) for p in engines}
    by_rev: dict[str, int] = {}
    sessions: dict[str, set[str]] = {}
    with httpx.Client(timeout=30) as client:
        for turn in range(3):
            for s in range(24):
                r = client.post(f"http://{proxy['ip']}:{proxy['port']}/v1/chat/completions",
                                json={"model": model, "max_tokens": 4,
                                      "messages": [{"role": "user", "content": f"session {s} of the split test"},
                                                   *([{"role": "user", "content": f"turn {turn}"}] if turn else [])]})
                assert r.status_code == 200, r.text
                rev = r.headers["x-v41flash-revision"]
                by_rev[rev] = by_rev.get(rev, 0) + 1
                sessions.setdefault(f"s{s}", set()).add(rev)
    assert set(by_rev) == {rev1, rev2}, by_rev  # both revisions took sessions at 50 %
    assert all(len(v) == 1 for v in sessions.values()), sessions  # every session stayed on one revision

    def counted():
        after = {p["metadata"]["name"]: _served(cluster, p, ns) for p in engines}
        per = {(p["metadata"]["labels"][REVISION], p["metadata"]["labels"]["v41flash.io/role"]):
               after[p["metadata"]["name"]] - before[p["metadata"]["name"]] for p in engines}
        want = {(rev, role): float(by_rev[rev]) for rev in by_rev for role in ("prefill", "decode")}
        return per if per == want else None
    wait_for(counted, 20, "each revision's prefill and decode simulators counting exactly its own requests")


def test_sim_knobs_reach_only_the_revision_that_carries_them(cluster, ns):
    r1 = _cr(ns, revision="r1")
    doc = r1.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["model"]["revision"] = "broken"
    for role in ("prefill", "decode"):
        doc["spec"][role]["extraEnv"] = [{"name": "V41F_SIM_ARGS", "value": "--v41f-fail-start"}]
    broken = V41FlashDeployment.model_validate(doc)
    _apply(cluster, render(broken, [SlotSpec("", r1.spec, share=100),
                                          SlotSpec("a", broken.spec, share=0, accept_new=False)]), ns)
    rev1, rev_b = revision_of(render(r1)), revision_of(render(broken))

    def settled():
        pods = _pods(cluster, ns, "v41flash.io/deployment=slots,v41flash.io/serving=true")
        good = [p for p in pods if p["metadata"]["labels"][REVISION] == rev1]
        bad = [p for p in pods if p["metadata"]["labels"][REVISION] == rev_b]
        running = all((p.get("status") or {}).get("phase") == "Running" for p in bad)
        return (good, bad) if len(good) == 2 and all(map(_ready, good)) and len(bad) == 2 and running else None
    good, bad = wait_for(settled, 180, "the serving revision Ready, the broken one's pods Running")
    time.sleep(5)  # a few supervisor ticks: the broken pods must still not be Ready
    bad = [p for p in _pods(cluster, ns, "v41flash.io/deployment=slots,v41flash.io/serving=true")
           if p["metadata"]["labels"][REVISION] == rev_b]
    assert bad and not any(map(_ready, bad))
    assert not any(s["pod"] in {p["metadata"]["name"] for p in bad} for s in cluster.supervised(ns))
