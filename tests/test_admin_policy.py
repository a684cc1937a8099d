"""What an administrator allows a V41FlashDeployment to reach (issue 39): weight cache host paths
(api/host_paths.py) and Prometheus endpoints (api/endpoints.py, metrics/promapi.py). Each rule: refused naming the
field where it should be, allowed where the administrator said so, and nothing of a foreign answer copied."""
from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from v41flash.api import endpoints as E
from v41flash.api import host_paths as H
from v41flash.api.admin import AdminPolicy
from v41flash.api.validation import validate
from v41flash.controller.config import OperatorConfig
from v41flash.metrics import promapi
from v41flash.metrics.promapi import PromSource, checked_target, prometheus_windows
from v41flash.render.checks import operator_checks

NS = "team-a"


def doc(spec: dict) -> dict:
    return {"apiVersion": "v41flash.io/v1alpha1", "kind": "V41FlashDeployment",
            "metadata": {"name": "x", "namespace": NS}, "spec": spec}


def cache(path: str, **kw) -> dict:
    return {"startup": {"weightCache": {"hostPath": path, **kw}}}


# --- host paths: what admission refuses, in every spelling ---------------------------------------------------

REFUSED_AT_ADMISSION = [
    "/", "//", "/.", "/./", "/..", "/../", "///", "/mnt/..", "/mnt/../etc", "/mnt/./x", "/mnt//x", "/mnt/x/",
    "relative/path", "mnt", "/mnt/x\x00y", "/mnt/x\ny", "/mnt/x\x1b", "/mnt/x y", "/mnt/\u2010x", "/mnt/$(HOME)",
    "/mnt/" + "a" * 256, "/" + "/".join(["a" * 200] * 21),
    "/etc", "/ETC", "/etc/kubernetes", "/proc/1/root", "/sys", "/dev", "/run/containerd", "/var/run",
    "/var/run/docker.sock", "/var/lib/kubelet", "/var/lib/kubelet/pods", "/var/lib/containerd", "/var/lib/docker",
    "/boot", "/root", "/usr", "/usr/local", "/bin", "/sbin", "/lib", "/lib64", "/libx32", "/var", "/var/lib", "/opt",
    "/tmp", "/home/u", "/library/x",  # /lib* is refused whole
]


@pytest.mark.parametrize("path", REFUSED_AT_ADMISSION, ids=repr)
def test_a_host_path_no_cluster_should_mount_is_refused_naming_the_field(path):
    problems = validate(doc(cache(path)))
    assert problems, path
    assert all(p.path == H.FIELD for p in problems), [str(p) for p in problems]
    assert H.normal_problem(path), path


@pytest.mark.parametrize("path", ["/mnt/nvme/v41flash", "/data/weights", "/var/lib/v41flash", "/mnt/a.b_c-d",
                                  "/opt/v41flash", "/srv/lib"])
def test_a_plain_host_directory_passes_admission(path):
    assert validate(doc(cache(path))) == [] and H.normal_problem(path) is None


ADMIN = AdminPolicy(H.HostPathAllowlist(private=("/mnt/nvme/v41flash",), shared=("/mnt/shared",)),
                    E.EndpointAllowlist(urls=("http://prometheus-operated.monitoring:9090",
                                              "https://thanos.example.com/prom"),
                                        namespaces=("monitoring",)))


def operator_problems(spec: dict, admin: AdminPolicy = ADMIN) -> list[str]:
    return [str(p) for p in validate(doc(spec), operator_checks(admin))]


def test_the_default_operator_allows_no_host_path():
    (problem,) = operator_problems(cache("/mnt/nvme/v41flash"), AdminPolicy())
    assert problem.startswith(H.FIELD + ": this operator allows no weight cache host path")
    assert operator_problems(cache("/mnt/nvme/v41flash")) == []  # allowed by name: offline validate knows no admin
    assert [str(p) for p in validate(doc(cache("/mnt/nvme/v41flash")), operator_checks())] == []


@pytest.mark.parametrize("spec,says", [
    (cache("/mnt/nvme"), "is not a weight cache directory the operator allows"),
    (cache("/mnt/nvme/v41flash/other-team"), "is not a weight cache directory the operator allows"),  # no nesting
    (cache("/mnt/nvme/v41flash", sharedAcrossNamespaces=True), "not under a directory the operator shares"),
    (cache("/mnt/shared/x"), "is not a weight cache directory"),  # shared only when the spec says so
    (cache("/data/anything"), "is not a weight cache directory"),
])
def test_a_host_path_the_administrator_did_not_allow_stalls_naming_the_field(spec, says):
    (problem,) = operator_problems(spec)
    assert problem.startswith(H.FIELD + ": ") and says in problem


def test_allowed_host_paths_render_per_namespace_read_only_and_shared_only_where_allowed():
    from v41flash.api import v1alpha1 as api
    from v41flash.render import render
    assert operator_problems(cache("/mnt/shared/deepseek", sharedAcrossNamespaces=True)) == []
    for spec, node_dir in ((cache("/mnt/nvme/v41flash"), f"/mnt/nvme/v41flash/{NS}"),
                           (cache("/mnt/shared/deepseek", sharedAcrossNamespaces=True), "/mnt/shared/deepseek")):
        objs = render(api.V41FlashDeployment.model_validate(doc(spec)))
        paths = {v["hostPath"]["path"] for o in objs if o["kind"] in ("Deployment", "DaemonSet")
                 for v in o["spec"]["template"]["spec"].get("volumes", []) if "hostPath" in v}
        assert paths == {node_dir}
        for o in objs:
            if o["kind"] not in ("Deployment", "DaemonSet"):
                continue
            pod = o["spec"]["template"]["spec"]
            for c in pod["containers"] + pod.get("initContainers", []):
                for m in c.get("volumeMounts", []):
                    if m["name"] == "weight-cache":  # only the prefetcher's download writes
                        assert m.get("readOnly", False) is (o["kind"] != "DaemonSet"), (o["metadata"]["name"], m)


def test_two_namespaces_never_share_a_private_directory():
    a = H.node_path("/mnt/nvme/v41flash", "team-a", False)
    b = H.node_path("/mnt/nvme/v41flash", "team-b", False)
    assert a != b and not a.startswith(b + "/") and not b.startswith(a + "/")


@pytest.mark.parametrize("private,shared,says", [
    (("/mnt/a", "/mnt/a/b"), (), "nest"),
    (("/mnt/a",), ("/mnt",), "nest"),
    (("/etc/weights",), (), "system, runtime or kubelet"),
    (("/mnt/../etc",), (), "'.' or '..'"),
    (("mnt",), (), "absolute"),
])
def test_an_administrator_cannot_configure_a_dangerous_or_nested_directory(private, shared, says):
    with pytest.raises(ValueError, match=says):
        OperatorConfig(weight_cache_host_paths=private, weight_cache_shared_host_paths=shared)


# --- Prometheus endpoints ---------------------------------------------------------------------------------

def prom(url: str) -> dict:
    return {"autoscaling": {"metrics": {"source": "Prometheus", "prometheus": {
        "url": url, "scrapedBy": {"podLabels": {"app": "prometheus"}}}}}}


@pytest.mark.parametrize("url", ["http://user:hunter2@prometheus.monitoring:9090", "http://hunter2@p:9090",
                                 "https://a:b@thanos.example.com/prom"])
def test_userinfo_is_refused_at_admission_and_never_repeated(url):
    problems = validate(doc(prom(url)))
    assert [p.path for p in problems] == [E.FIELD] and "userinfo" in problems[0].message
    assert "hunter2" not in str(problems)
    assert "hunter2" not in E.redact(url) and "user" not in E.redact(url)


@pytest.mark.parametrize("key", ["podLabel", "namespaceLabel"])
@pytest.mark.parametrize("value", ["exported_pod", "exported_namespace", "__name__"])
def test_queries_never_select_on_labels_a_target_can_set(key, value):
    spec = prom("http://prometheus-operated.monitoring:9090")
    spec["autoscaling"]["metrics"]["prometheus"][key] = value
    problems = validate(doc(spec))
    assert [p.path for p in problems] == [f"spec.autoscaling.metrics.prometheus.{key}"]


def test_the_default_selector_uses_the_labels_prometheus_attaches():
    sel = promapi.selector(PromSource("http://p:9090", "ai"), ["a-0"])
    assert sel.startswith('namespace="ai",pod=~"a\\\\-0"') and "exported_" not in sel


@pytest.mark.parametrize("url,says", [
    ("http://169.254.169.254", "not an endpoint the operator allows"),
    ("http://metadata.google.internal", "names a cloud metadata service"),
    ("http://metadata", "names a cloud metadata service"),
    ("http://2130706433:9090", "numeric host in a non-standard spelling"),
    ("http://0x7f.1:9090", "numeric host in a non-standard spelling"),
    ("http://127.1:9090", "numeric host in a non-standard spelling"),
    ("https://thanos.example.com:8443/prom", "not an endpoint"),  # another port
    ("http://thanos.example.com/prom", "not an endpoint"),  # another scheme
    ("https://thanos.example.com/prometheus", "not an endpoint"),  # /prom is a path prefix at a segment boundary
    ("http://x.monitoring.svc.evil.example", "not an endpoint"),
    ("http://x.other.svc:9090", "not an endpoint"),
    ("http://[::1]:9090", "not an endpoint"),
    ("http://[fd00:ec2::254]", "not an endpoint"),
])
def test_an_endpoint_the_administrator_did_not_allow_stalls_naming_the_field(url, says):
    problems = operator_problems(prom(url))
    assert len(problems) == 1 and problems[0].startswith(E.FIELD + ": ") and says in problems[0], problems


@pytest.mark.parametrize("url", ["http://prometheus-operated.monitoring:9090", "https://thanos.example.com/prom",
                                 "https://thanos.example.com/prom/v1", "http://prom.monitoring.svc:9090",
                                 "http://prom.monitoring.svc.cluster.local:9090", "http://prom.monitoring",
                                 "https://prometheus-operated.monitoring:9091"])  # a Service of monitoring: any port
def test_allowed_endpoints_pass(url):
    assert operator_problems(prom(url)) == []


def test_the_default_operator_queries_no_prometheus():
    (problem,) = operator_problems(prom("http://prometheus-operated.monitoring:9090"), AdminPolicy())
    assert "queries no Prometheus until an administrator allows it" in problem


@pytest.mark.parametrize("address,kind", [
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "metadata"), ("64:ff9b::a9fe:a9fe", "metadata"), ("169.254.10.10", "link-local"),
    ("fe80::1", "link-local"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
])
def test_blocked_addresses(address, kind):
    assert kind in E.blocked(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["10.0.0.5", "192.168.1.1", "8.8.8.8", "fd12::1"])
def test_cluster_addresses_are_not_blocked(address):
    assert E.blocked(ipaddress.ip_address(address)) is None


def _resolver(*addresses: str):
    async def resolve(host: str, port: int) -> list[str]:
        return list(addresses)
    return resolve


def _src(url: str, *urls: str, namespaces: tuple[str, ...] = ()) -> PromSource:
    return PromSource(url, "ai", allow=E.EndpointAllowlist(urls=urls or (url,), namespaces=namespaces))


def test_an_allowed_name_that_resolves_to_a_metadata_or_loopback_address_is_refused():
    src = _src("http://prom.monitoring.svc:9090", namespaces=("monitoring",))
    for addresses in (("169.254.169.254",), ("10.0.0.5", "127.0.0.1"), ("::ffff:169.254.169.254",)):
        with pytest.raises(promapi.PrometheusError, match="refused: resolves to .*(metadata|loopback)") as exc:
            asyncio.run(checked_target(src, _resolver(*addresses)))
        assert str(exc.value).startswith(E.FIELD + ": Prometheus at http://prom.monitoring.svc:9090 refused")
    ep, address = asyncio.run(checked_target(src, _resolver("10.0.0.5", "10.0.0.6")))
    assert address == "10.0.0.5" and ep.host == "prom.monitoring.svc"


def test_an_address_the_administrator_names_is_allowed_even_on_loopback():
    ep, address = asyncio.run(checked_target(_src("http://127.0.0.1:9090"), _resolver()))
    assert address == "127.0.0.1"
    # a name for it is not the address: the administrator named a host name, not loopback
    with pytest.raises(promapi.PrometheusError, match="loopback"):
        asyncio.run(checked_target(_src("http://localhost:9090"), _resolver("127.0.0.1")))


def test_a_name_that_does_not_resolve_is_a_window_error_naming_the_field():
    async def fails(host, port):
        raise OSError("Name or service not known: secret-ish text")
    with pytest.raises(promapi.PrometheusError) as exc:
        asyncio.run(checked_target(_src("http://nowhere.example:9090"), fails))
    assert str(exc.value) == f"{E.FIELD}: Prometheus at http://nowhere.example:9090 cannot be resolved (OSError)"
    assert promapi.error_kind(str(exc.value)) == "Unreachable"


SECRET = "AKIA-SECRET-TOKEN-0123"


class _Hostile(BaseHTTPRequestHandler):
    """A metadata-like server: answers every query with credentials, in every shape."""
    mode = "text"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answers = {
            "text": (200, b"role=admin\nAccessKeyId=" + SECRET.encode()),
            "json-error": (500, json.dumps({"status": "error", "errorType": SECRET, "error": SECRET}).encode()),
            "json-weird": (200, json.dumps({"status": "success", "data": {"resultType": SECRET,
                                                                          "result": SECRET}}).encode()),
            "bad-vector": (200, json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                          "result": [SECRET]}}).encode()),
            "bad-values": (200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {promapi.FIGURE_LABEL: "pod_samples", "pod": "p-b"}, "value": [1, SECRET]}]}}).encode()),
            "redirect": (302, SECRET.encode()),
        }
        status, body = answers[self.mode]
        self.send_response(status)
        if status == 302:
            self.send_header("Location", f"http://169.254.169.254/{SECRET}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("mode", ["text", "json-error", "json-weird", "bad-vector", "bad-values", "redirect"])
def test_nothing_of_a_foreign_answer_reaches_a_window_error(mode):
    handler = type("H", (_Hostile,), {"mode": mode})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        windows, rt = asyncio.run(prometheus_windows(_src(url), 1e9, 30, {"decode": ["p-b"]}, ["r-0"]))
    finally:
        srv.shutdown()
        srv.server_close()
    error = windows["decode"].error
    assert error and error.startswith(f"{E.FIELD}: Prometheus at {url} ") and SECRET not in error, error
    assert SECRET not in repr((windows, rt))


@pytest.mark.parametrize("url", ["http://[::1", "http://p:99999", "http://p:0", "ftp://p", "http://", "http://a b",
                                 "http://user:hunter2@p:9090", "http://p/\x00", "http://\u0440rom:9090", 17])
def test_a_malformed_url_is_a_window_error_never_an_exception(url):
    windows, rt = asyncio.run(prometheus_windows(PromSource(url, "ai", allow=E.EndpointAllowlist()), 1e9, 30,
                                                 {"decode": ["p-b"]}))
    error = windows["decode"].error
    assert error.startswith(E.FIELD + ": Prometheus at ") and "refused" in error and "hunter2" not in error
    assert promapi.error_kind(error) == "Refused"
