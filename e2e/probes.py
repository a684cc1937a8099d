"""kubelet's probes against a simulated pod's processes: the probe URLs of a container, one probe run, and the
pod status a kubelet writes from the result."""
from __future__ import annotations

import importlib.util
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeTiming:
    """A probe's timing as kubelet reads it from the container (its defaults where the spec is silent)."""
    period_s: float = 10.0
    timeout_s: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    initial_delay_s: float = 0.0


def probe_timing(container: dict, kind: str) -> ProbeTiming:
    p = container.get(kind) or {}
    return ProbeTiming(period_s=float(p.get("periodSeconds") or 10), timeout_s=float(p.get("timeoutSeconds") or 1),
                       failure_threshold=int(p.get("failureThreshold") or 3),
                       success_threshold=int(p.get("successThreshold") or 1),
                       initial_delay_s=float(p.get("initialDelaySeconds") or 0))


@dataclass
class ProbeRun:
    """Consecutive results of one probe, as kubelet counts them: a readiness probe flips Ready after
    failure_threshold failures in a row (success_threshold successes back); a liveness probe's failure_threshold
    failures in a row restart the container."""
    timing: ProbeTiming
    failures: int = 0
    successes: int = 0

    def record(self, ok: bool) -> None:
        self.failures, self.successes = (0, self.successes + 1) if ok else (self.failures + 1, 0)

    @property
    def failed(self) -> bool:
        return self.failures >= self.timing.failure_threshold

    @property
    def succeeded(self) -> bool:
        return self.successes >= self.timing.success_threshold


def grpc_health_ok(target: str, service: str, timeout: float = 1.0) -> bool:
    """A gRPC health check (grpc.health.v1.Health/Check) as kubelet's grpc probe runs it: plaintext, SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        with grpc.insecure_channel(target) as channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)
    except grpc.RpcError:
        return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def probe_url(pod: dict, container: dict, kind: str = "readinessProbe") -> str | None:
    """URL of one of the container's probes on the pod IP: http(s)://IP:PORT/PATH for httpGet,
    grpc://IP:PORT/SERVICE for grpc, tcp://IP:PORT for tcpSocket (None: no such probe)."""
    probe = container.get(kind) or {}
    ip = pod["status"]["podIP"]
    if "grpc" in probe:
        return f"grpc://{ip}:{int(probe['grpc']['port'])}/{probe['grpc'].get('service', '')}"
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if not action:
        return None
    port = action.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return None
    if "tcpSocket" in probe:
        return f"tcp://{ip}:{int(port)}"
    path = action.get("path") or "/"
    return f"{action.get('scheme', 'HTTP').lower()}://{ip}:{int(port)}{path}"


def readiness_url(pod: dict, container: dict) -> str | None:
    return probe_url(pod, container, "readinessProbe")


def probe_ok(url: str, timeout: float = 1.0) -> bool:
    """One probe as kubelet runs it: a gRPC health check, a TCP connect, or an HTTP GET answered 2xx/3xx within
    ``timeout`` seconds (the probe's timeoutSeconds; a frozen process accepts the connection and never answers)."""
    if url.startswith("grpc://"):
        target, _, service = url[len("grpc://"):].partition("/")
        return grpc_health_ok(target, service, timeout)
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://"):].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 400
    except (OSError, urllib.error.URLError):
        return False


def ready_status(pod: dict, ready: bool, now: str, restarts: dict[str, int] | None = None) -> dict:
    """Pod status with Ready/ContainersReady and every container's ready flag (and, given ``restarts`` by container
    name, its restartCount) set as a kubelet would; whole lists, so a merge patch and a strategic merge patch give
    the same result."""
    st = pod.get("status") or {}
    want = "True" if ready else "False"
    conds = []
    for c in st.get("conditions") or []:
        if c["type"] in ("Ready", "ContainersReady") and c.get("status") != want:
            c = {**c, "status": want, "lastTransitionTime": now}
        conds.append(c)
    statuses = [{**cs, "ready": ready, "started": True,
                 **({"restartCount": restarts[cs.get("name")]} if restarts and cs.get("name") in restarts else {})}
                for cs in st.get("containerStatuses") or []]
    return {"status": {"conditions": conds, "containerStatuses": statuses}}


PROBE_MODULES = ("grpc", "grpc_health.v1")  # the picker's gRPC readiness probe (grpc_health_ok)


def missing_modules(names: Sequence[str] = PROBE_MODULES) -> list[str]:
    """The modules the supervisor imports only when a pod needs them, absent from this Python. Checked at start:
    imported inside the watch loop, an ImportError is retried forever like an apiserver hiccup and no picker pod
    ever turns Ready."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            out.append(name)
    return out
