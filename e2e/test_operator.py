"""The operator on the real control plane: examples become Ready, admission refuses bad specs naming the
field, spec changes converge, re-applying changes nothing, deletion garbage-collects, a request crosses
router → prefill → decode simulators (a plain and an agent's tools request), and an operator killed
mid-reconcile converges without duplicates."""
from __future__ import annotations

import copy
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.corpus import invalid_cases
from e2e.kit import CHILD_RESOURCES, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")
CHILD_KINDS = CHILD_RESOURCES  # the product's list (mode Gateway's kinds included: the harness installs their CRDs)
READY_TIMEOUT = 240


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def apply(cluster, doc: dict, ns: str, check: bool = True) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def get_cr(cluster, ns: str, name: str) -> dict:
    return cluster.kubectl_json("get", "v41f", name, "-n", ns)


def condition(cr: dict, type_: str) -> dict | None:
    return next((c for c in (cr.get("status") or {}).get("conditions", []) if c["type"] == type_), None)


class NotReady(Exception):
    """What the CR said while it was not Ready at its generation (wait_for reports the last one on timeout)."""


def wait_ready(cluster, ns: str, name: str, timeout: float = READY_TIMEOUT) -> dict:
    def ready():
        cr = get_cr(cluster, ns, name)
        c = condition(cr, "Ready") or {}
        st = cr.get("status") or {}
        if c.get("status") == "True" and st.get("observedGeneration") == cr["metadata"]["generation"]:
            return cr
        r = st.get("rollout") or {}
        raise NotReady(f"generation {cr['metadata']['generation']} observed {st.get('observedGeneration')}; "
                       f"Ready={c.get('status')} {c.get('reason')}: {c.get('message')}; "
                       f"rollout {r.get('phase')} {r.get('step', 0)}/{r.get('steps', 0)}: {r.get('message')}")
    return wait_for(ready, timeout, f"V41FlashDeployment {ns}/{name} Ready at its generation")


def children(cluster, ns: str, name: str) -> list[dict]:
    items = cluster.kubectl_json("get", CHILD_KINDS, "-n", ns, "-l", f"app.kubernetes.io/instance={name}")["items"]
    return [i for i in items if not i["metadata"].get("deletionTimestamp")]


def rendered(doc: dict, ns: str) -> list[dict]:
    out = subprocess.run([str(REPO / ".venv/bin/v41flash"), "render", "-f", "-", "-n", ns],
                         input=yaml.safe_dump(doc), capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def assert_kstatus_ready(cr: dict) -> None:
    st = cr["status"]
    assert st["observedGeneration"] == cr["metadata"]["generation"]
    ready = condition(cr, "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == cr["metadata"]["generation"]
    for abnormal in ("Reconciling", "Stalled"):  # abnormal-true conditions are absent (or False) when Ready
        c = condition(cr, abnormal)
        assert c is None or c["status"] == "False", c


def pod_template(obj: dict) -> dict:
    if obj["kind"] == "LeaderWorkerSet":
        return obj["spec"]["leaderWorkerTemplate"].get("leaderTemplate") or obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    return obj["spec"]["template"]


def container_args(obj: dict) -> list[list[str]]:
    return [c.get("command", []) + c.get("args", []) for c in pod_template(obj)["spec"]["containers"]]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_becomes_ready_and_children_match_render(cluster, operator_process, ns, example):
    doc = load(example)
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    cr = wait_ready(cluster, ns, name)
    assert_kstatus_ready(cr)

    want = {(o["kind"], o["metadata"]["name"]): o for o in rendered(doc, ns)}
    live = {(o["kind"], o["metadata"]["name"]): o for o in children(cluster, ns, name)}
    assert set(live) == set(want), "live children differ from `v41flash render`"
    for key, obj in want.items():
        owners = live[key]["metadata"].get("ownerReferences") or []
        assert [o["uid"] for o in owners] == [cr["metadata"]["uid"]], key
        if key[0] in WORKLOAD_KINDS:
            assert container_args(live[key]) == container_args(obj), key
    for role in ("prefill", "decode"):
        if doc["spec"].get(role, {}).get("enabled", True):
            st = cr["status"][role]
            assert st["readyReplicas"] == st["desiredReplicas"] >= 1
            assert st["ready"] == f"{st['readyReplicas']}/{st['desiredReplicas']}"
    table = cluster.kubectl("get", "v41f", name, "-n", ns).stdout
    assert "True" in table and cr["spec"]["profile"] in table


@pytest.mark.parametrize("case", [c for c in invalid_cases() if c.admission == "refused"], ids=lambda c: c.name)
def test_invalid_spec_refused_at_admission_naming_the_field(cluster, case):
    r = cluster.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(case.path), check=False)
    assert r.returncode != 0, f"{case.name} was admitted"
    assert case.field in r.stderr, r.stderr


@pytest.mark.parametrize("case", [c for c in invalid_cases() if c.admission == "stalled"], ids=lambda c: c.name)
def test_what_admission_cannot_catch_ends_stalled(cluster, operator_process, ns, case):
    doc = case.doc()
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)

    def stalled():
        cr = get_cr(cluster, ns, name)
        c = condition(cr, "Stalled")
        return cr if c and c["status"] == "True" and cr["status"].get("observedGeneration") == 1 else None
    cr = wait_for(stalled, 60, f"{name} Stalled")
    assert case.field in condition(cr, "Stalled")["message"]
    assert condition(cr, "Ready")["status"] == "False"
    assert children(cluster, ns, name) == [], "a spec that cannot be realized must not be half-applied"
    operator_process.assert_alive()


def serving_workload(cluster, ns: str, name: str, role: str) -> dict:
    """The role's engine Deployment of the serving revision (after a rollout it lives in a slot: <cr>-<role>-a)."""
    revision = get_cr(cluster, ns, name)["status"]["servingRevision"]
    items = cluster.kubectl_json("get", "deployments", "-n", ns, "-l",
                                 f"v41flash.io/deployment={name},v41flash.io/role={role}")["items"]
    return next(d for d in items if d["metadata"]["labels"].get("v41flash.io/serving-revision") == revision)


# Engine changes are rollouts (docs/decisions/2026-12-01-rollouts.md): short steps keep this test short.
SHORT_ROLLOUT = {"steps": [100], "stepSeconds": 3, "minRequestsPerStep": 1, "drainDeadlineSeconds": 5}


def test_spec_changes_converge_and_a_bad_change_leaves_the_running_stack_alone(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/tp4-h200-low-latency.yaml")
    doc["spec"]["rollout"] = dict(SHORT_ROLLOUT)
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)

    # max-num-seqs: the decode workload's args change and roll out (a canary of the new revision, promoted).
    doc["spec"]["decode"]["maxNumSeqs"] = 48
    apply(cluster, doc, ns)
    served = wait_ready(cluster, ns, name)["status"]
    dep = serving_workload(cluster, ns, name, "decode")
    args = container_args(dep)[0]
    assert args[args.index("--max-num-seqs") + 1] == "48"

    # A change admission cannot refuse (an unknown vLLM flag): Stalled, and the running workloads untouched.
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in children(cluster, ns, name)
              if o["kind"] == "Deployment"}
    bad = copy.deepcopy(doc)
    bad["spec"]["decode"]["extraArgs"] = ["--num-seqs-max", "8"]  # vLLM knows no such flag
    apply(cluster, bad, ns)
    wait_for(lambda: (condition(get_cr(cluster, ns, name), "Stalled") or {}).get("status") == "True", 60,
             "Stalled after an unrealizable change")
    msg = condition(get_cr(cluster, ns, name), "Stalled")["message"]
    assert "spec.decode.extraArgs" in msg and "--num-seqs-max" in msg
    after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in children(cluster, ns, name)
             if o["kind"] == "Deployment"}
    assert after == before, "a Stalled spec must not touch the running workloads"
    # and status still says which slot serves, counting its replicas: the next spec canaries beside that slot
    st = get_cr(cluster, ns, name)["status"]
    assert (st.get("rollout") or {}).get("servingSlot") == served["rollout"]["servingSlot"], st
    assert st["decode"]["readyReplicas"] >= 1 and st["prefill"]["readyReplicas"] >= 1, st

    # Prefill turned off (aggregated): its objects are pruned, decode serves alone.
    doc["spec"]["prefill"] = {"enabled": False}
    apply(cluster, doc, ns)
    cr = wait_ready(cluster, ns, name)
    assert condition(cr, "Stalled") is None
    names = {(o["kind"], o["metadata"]["name"]) for o in children(cluster, ns, name)}
    assert not any("-prefill" in n for _, n in names), names
    assert cr["status"]["prefill"]["ready"] == "off"

    # Profile switch: the decode engines now run data parallel with expert parallelism.
    doc["spec"]["profile"] = "high-throughput"
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)
    args = container_args(serving_workload(cluster, ns, name, "decode"))[0]
    assert "--data-parallel-size" in args and "--enable-expert-parallel" in args


def engine_pods(cluster, ns: str, name: str) -> dict[str, dict]:
    items = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name},v41flash.io/role in "
                                 "(prefill,decode)")["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def test_slo_and_router_changes_restart_no_engine(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/tp4-h200-low-latency.yaml")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    cr = wait_ready(cluster, ns, name)
    revision = cr["status"]["servingRevision"]
    before = {n: p["metadata"]["uid"] for n, p in engine_pods(cluster, ns, name).items()}
    assert len(before) == 2 and all(p["metadata"]["labels"]["v41flash.io/serving-revision"] == revision
                                    for p in engine_pods(cluster, ns, name).values())

    doc["spec"]["slo"]["e2eP95Seconds"] = 120
    doc["spec"]["routing"] = {"policy": "round_robin", "decodePolicy": "power_of_two"}
    apply(cluster, doc, ns)
    cr = wait_ready(cluster, ns, name)
    router = cluster.kubectl_json("get", "deployment", f"{name}-router-0", "-n", ns)  # slot ""'s vllm-router
    assert "round_robin" in sum(container_args(router), [])  # the change did land
    drain = cluster.kubectl_json("get", "configmap", f"{name}-config", "-n", ns)["data"]["engine-drain-seconds"]
    assert drain == "190"  # 120 s x 1.5 + 10 s: the new deadline, in the file the pods mount
    operator_process.wait_timer_passes(1)  # a pass later: nothing was replaced behind the Ready status
    assert {n: p["metadata"]["uid"] for n, p in engine_pods(cluster, ns, name).items()} == before
    assert get_cr(cluster, ns, name)["status"]["servingRevision"] == revision


def _versions(cluster, ns: str, name: str) -> dict[str, str]:
    out = {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in children(cluster, ns, name)}
    out["cr"] = get_cr(cluster, ns, name)["metadata"]["resourceVersion"]
    return out


def _cr_diff(a: dict, b: dict) -> list[str]:
    """Which leaves of the CR differ (metadata bookkeeping aside): what a failing no-write test must name."""
    def leaves(o, path=""):
        if isinstance(o, dict):
            for k, v in o.items():
                yield from leaves(v, f"{path}.{k}")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                yield from leaves(v, f"{path}[{i}]")
        else:
            yield path, o
    skip = (".metadata.resourceVersion", ".metadata.managedFields")
    la, lb = dict(leaves(a)), dict(leaves(b))
    return [f"{k}: {la.get(k)!r} -> {lb.get(k)!r}" for k in sorted(set(la) | set(lb))
            if la.get(k) != lb.get(k) and not k.startswith(skip)]


def test_reapplying_the_same_spec_writes_nothing(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/tp4-h200-low-latency.yaml")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    ready_at = condition(wait_ready(cluster, ns, name), "Ready")["lastTransitionTime"]
    # The planner's decisions until its scrapes cover a whole window after the pods were Ready are legitimate
    # status writes (the reason moves from waiting for pods to "partial metrics" to holding; the arrival figures
    # appear): measure from the first decision on complete data, not from inside that interval.
    def settled() -> bool:
        st = get_cr(cluster, ns, name).get("status") or {}
        last = st.get("lastDecision") or {}
        return (last.get("time", "") >= ready_at and "partial metrics" not in last.get("reason", "")
                and (st.get("slo") or {}).get("arrivalRate") is not None)
    wait_for(settled, 180, "a planner decision on complete metrics after the pods were Ready")
    operator_process.wait_timer_passes(1)  # let the last status write land
    before, cr_before = _versions(cluster, ns, name), get_cr(cluster, ns, name)
    apply(cluster, doc, ns)
    operator_process.wait_timer_passes(2)  # 2 timer passes: each recomputes status (and may re-apply children)
    after = _versions(cluster, ns, name)
    assert after == before, ("a no-op re-apply or timer pass wrote something", _cr_diff(cr_before, get_cr(cluster, ns, name)))
    # every write of ours names the operator as its field manager (not the client library's default)
    shown = cluster.kubectl_json("get", CHILD_KINDS, "-n", ns, "-l", f"app.kubernetes.io/instance={name}",
                                 "--show-managed-fields")["items"]
    shown.append(cluster.kubectl_json("get", "v41f", name, "-n", ns, "--show-managed-fields"))
    managers = {(m["manager"], m.get("subresource", "")) for o in shown for m in o["metadata"].get("managedFields") or []}
    assert ("v41flash-operator", "status") in managers, managers
    assert not [m for m in managers if m[0] == "OpenAPI-Generator"], managers


def test_delete_garbage_collects_every_child(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/dep2-b200-high-throughput.yaml")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)
    assert children(cluster, ns, name)
    cluster.kubectl("delete", "v41f", name, "-n", ns)
    wait_for(lambda: children(cluster, ns, name) == [] and not cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}")["items"], 120,
        "every child and pod of the deleted deployment gone")


def _counter(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name in (name, name + "_total"))


def test_chat_completion_through_router_hits_prefill_and_decode(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/tp4-h200-low-latency.yaml")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    wait_ready(cluster, ns, name)
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}")["items"]
    by_role = {p["metadata"]["labels"]["v41flash.io/role"]: p for p in pods
               if p["metadata"]["labels"].get("v41flash.io/front", "true") == "true"}  # the router role: the front
    router = cluster.sim_for(by_role["router"]["metadata"]["name"], ns)
    sims = {role: cluster.sim_for(by_role[role]["metadata"]["name"], ns) for role in ("prefill", "decode")}

    def served(role: str) -> float:
        s = sims[role]
        return _counter(httpx.get(f"http://{s['ip']}:{s['port']}/metrics", timeout=5).text, "vllm:request_success")

    base = {role: served(role) for role in sims}
    model = doc["spec"]["model"].get("servedModelName") or doc["spec"]["model"]["checkpoint"]
    def completion():
        resp = httpx.post(f"http://{router['ip']}:{router['port']}/v1/chat/completions", timeout=30,
                          headers={"x-session-id": "e2e-1"},
                          json={"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16})
        return resp if resp.status_code == 200 else None
    r = wait_for(completion, 60, "a 200 from the router")
    assert r.json()["choices"][0]["message"]["content"]
    wait_for(lambda: all(served(role) > base[role] for role in sims), 20,
             "both the prefill and the decode simulator counting the request")
    # The front door is Envoy (sessionKey: derive, the default) with its counters, slot ""'s vllm-router behind it
    # in pods of its own: a request without x-session-id gets a derived one on its way through.
    kinds = {s["kind"]: s for s in cluster.supervised(ns) if s["pod"] == by_role["router"]["metadata"]["name"]}
    assert set(kinds) == {"front", "counters"} and router["kind"] == "front" and router["port"] == 30000
    bare = httpx.post(f"http://{router['ip']}:{router['port']}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "Hi again"}], "max_tokens": 8})
    assert bare.status_code == 200, bare.text
    counters = httpx.get(f"http://{router['ip']}:{router['port']}/proxy/metrics", timeout=5).text
    assert _counter_with(counters, "v41flash_session_proxy_session_keys", source="client") >= 1
    assert _counter_with(counters, "v41flash_session_proxy_session_keys", source="derived") >= 1

    # An agent's request: tools + chat_template_kwargs (thinking). The engines were started with the tool and
    # reasoning parsers and DSpark (spec.features defaults, both roles); the simulator does not call tools, so
    # what is asserted is that the request is accepted end to end, by prefill and by decode.
    for role in ("prefill", "decode"):
        args = by_role[role]["spec"]["containers"][0]["args"]
        for flag, value in (("--tool-call-parser", "deepseek_v41"), ("--reasoning-parser", "deepseek_v41")):
            assert args[args.index(flag) + 1] == value, (role, args)
        assert "--enable-auto-tool-choice" in args and '"method":"dspark"' in args[args.index("--speculative-config") + 1]
    before = {role: served(role) for role in sims}
    tools = [{"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the repository",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]
    agent = httpx.post(f"http://{router['ip']}:{router['port']}/v1/chat/completions", timeout=30,
                       headers={"x-session-id": "e2e-agent"},
                       json={"model": model, "max_tokens": 16, "tools": tools, "tool_choice": "auto",
                             "messages": [{"role": "user", "content": "List the files in the repository"}],
                             "chat_template_kwargs": {"thinking": True, "reasoning_effort": 25}})
    assert agent.status_code == 200, agent.text
    message = agent.json()["choices"][0]["message"]
    assert message.get("content") or message.get("tool_calls"), message
    wait_for(lambda: all(served(role) > before[role] for role in sims), 20,
             "both simulators counting the tools request")


def _counter_with(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items()))


def test_operator_killed_mid_reconcile_converges_without_duplicates(cluster, operator_process, ns):
    doc = load(REPO / "manifests/examples/dep2-b200-high-throughput.yaml")
    name = doc["metadata"]["name"]
    apply(cluster, doc, ns)
    # Kill it as soon as the first child exists: the reconcile that created it is mid-flight.
    wait_for(lambda: children(cluster, ns, name), 60, "the first child object")
    operator_process.restart(sig=signal.SIGKILL)
    cr = wait_ready(cluster, ns, name)
    workloads = [o for o in children(cluster, ns, name) if o["kind"] in WORKLOAD_KINDS]
    assert sorted(o["metadata"]["name"] for o in workloads) == sorted(
        {f"{name}-prefill", f"{name}-decode", f"{name}-router", f"{name}-router-0"})
    pods = [p for p in cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"v41flash.io/deployment={name}")["items"]
            if not p["metadata"].get("deletionTimestamp")]
    fronts = cluster.kubectl_json("get", "deployment", f"{name}-router", "-n", ns)["spec"]["replicas"]  # its HPA's
    assert len(pods) == cr["status"]["prefill"]["desiredReplicas"] + cr["status"]["decode"]["desiredReplicas"] + \
        fronts + 1  # the front's replicas and slot ""'s vllm-router
