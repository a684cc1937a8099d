"""The routing benchmark's Gateway variant, the parts that need no cluster: the deployment it applies and the
simulator flags that make its engine pods the loopback rows' engines."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from v41flash.api.v1alpha1 import V41FlashDeployment
from v41flash.render import render
from v41flash_bench.inference_sim import split_knobs
from v41flash_bench.routing import gateway_mode as g
from v41flash_bench.routing import runner as b

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "bench" / "routing" / "gateway.yaml"


def _flags(argv):
    """flag -> value (None for a bare flag) of an argv of --flag [value] tokens."""
    out, i = {}, 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and "=" not in tok and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[tok], i = argv[i + 1], i + 2
        else:
            out[tok], i = None, i + 1
    return out


def test_pod_sim_args_are_the_loopback_engines_flags_without_what_the_pod_owns():
    cfg = b.load_config(SCENARIO, engines=8, sessions=64)
    sc, lat = cfg.scenario, cfg.latency
    args = g.pod_sim_args(sc, lat, 8192, 41)
    loop, _ = b.sim_argv(Path("sim"), 1234, sc, lat, None, 41, 8192)
    assert "--port" not in args and "--model" not in args and "--served-model-name" not in args
    assert not any(a.startswith("--zmq-endpoint") for a in args)
    f = _flags(args)
    assert f["--kv-cache-size"] == str(sc.kv_cache_blocks) == "10000"
    assert f["--block-size"] == str(sc.block_size)
    assert f["--max-num-seqs"] == str(lat.max_num_seqs)
    assert f["--inter-token-latency"] == "10ms" and f["--prefill-time-per-token"] == "100us"
    assert f["--max-model-len"] == "8192" and "--enable-kvcache" in f
    # every other flag of the loopback engine is there, with its value
    lf = _flags(loop[1:])
    assert {k: v for k, v in lf.items() if k in f} == f
    assert set(lf) - set(f) == {"--port", "--model", "--served-model-name", "--zmq-endpoint="}
    # no launcher knob the supervisor would take out
    assert split_knobs(args)[1] == args


def test_deployment_doc_is_a_valid_aggregated_gateway_deployment_of_n_pinned_engines():
    args = ["--kv-cache-size", "10000", "--inter-token-latency", "10ms"]
    doc = g.deployment_doc("rb", 16, args)
    cr = V41FlashDeployment.model_validate({**doc, "metadata": {"name": "rb", "namespace": "x"}})
    assert cr.spec.routing.mode == "Gateway"
    assert cr.spec.prefill.enabled is False
    assert cr.spec.decode.min_replicas == cr.spec.decode.max_replicas == 16
    env = {e["name"]: e["value"] for e in doc["spec"]["decode"]["extraEnv"]}
    assert shlex.split(env[g.POD_SIM_ARGS_ENV]) == args
    assert doc["spec"]["routing"]["gateway"]["httpRoute"]["name"] == g.GATEWAY_NAME
    objs = render(cr)
    kinds = {o["kind"] for o in objs}
    assert {"InferencePool", "HTTPRoute"} <= kinds
    # 16 TP4 replicas fit the harness's GB300 rack (18 trays x 4 GPUs)
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["spec"].get("replicas") == 16)
    gpus = int(dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert 16 * gpus <= 18 * 4


def test_gateway_scenario_loads_and_a_gateway_variant_refuses_router_options():
    cfg = b.load_config(SCENARIO)
    gw = [v for v in cfg.variants if v.gateway]
    assert [v.name for v in gw][0] == "gateway-epp" and not gw[0].gateway_spec and cfg.modes == ("none",)
    for bad in ({"pd": True}, {"kv_events": True}, {"args": ("--x",)}, {"session_key": "proxy"}):
        with pytest.raises(ValueError, match="gateway variant"):
            b.Variant(name="g", policy="epp", gateway=True, **bad)


def test_gateway_spec_fields_reach_the_deployment_and_the_report_flags():
    v = b.Variant(name="g", policy="epp", gateway=True, gateway_spec=(("prefixCacheWeight", 1), ("queueWeight", 4)))
    doc = g.deployment_doc("rb", 8, [], gateway_spec=v.gateway_spec)
    gw = doc["spec"]["routing"]["gateway"]
    assert gw["prefixCacheWeight"] == 1 and gw["queueWeight"] == 4 and gw["httpRoute"]["name"] == g.GATEWAY_NAME
    cr = V41FlashDeployment.model_validate({**doc, "metadata": {"name": "rb", "namespace": "x"}})
    assert cr.spec.routing.gateway.prefix_cache_weight == 1
    assert "gateway.queueWeight=4" in g.gateway_variant_flags(doc)
    with pytest.raises(ValueError, match="needs gateway: true"):
        b.Variant(name="x", policy="round_robin", gateway_spec=(("queueWeight", 1),))


def test_the_local_cluster_is_read_from_its_state_directory(tmp_path):
    """The Gateway variant reaches the harness cluster through its state directory (no e2e import): the processes it
    starts are registered in pids.json (so `harness down` stops them), the simulators come from sims.json (live ones),
    the Gateway's address from gateway.json."""
    import json
    import os

    from v41flash_bench.procs import Proc, proc_start_ticks
    c = g.LocalCluster(tmp_path)
    me = Proc("operator-rbench-1", os.getpid(), proc_start_ticks(os.getpid()), ["x"], str(tmp_path / "log"))
    c.register(me)
    assert [p.name for p in c.procs()] == ["operator-rbench-1"]
    c.unregister("operator-rbench-1")
    assert c.procs() == []
    live = {"namespace": "ns", "kind": "sim", "pod": "p0", "ip": "127.1.1.2", "port": 8000, "pid": os.getpid(),
            "start": proc_start_ticks(os.getpid())}
    gone = {**live, "pod": "p1", "start": -1}
    (tmp_path / "sims.json").write_text(json.dumps({"processes": [live, gone, {**live, "kind": "epp"}]}))
    assert g._sim_urls(c, "ns") == {"p0": "http://127.1.1.2:8000"}
    assert c.gateway_address("ns") is None and not c.is_up()
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "gateway.json").write_text(json.dumps({"gateways": {"ns/e2e-gateway": "127.0.0.1:4000"}}))
    assert c.gateway_address("ns") == "http://127.0.0.1:4000"
