"""A real Prometheus server (built by `e2e/build-tools.sh prometheus`) for the tests of the Prometheus metrics
source: its configuration, start (by PID, through v41flash_bench.procs), readiness and stop.

Two ways it finds what to scrape:
- ``kubernetes_sd_config``: pod discovery against the local apiserver with the harness's kubeconfig, relabelled
  the way a PodMonitor does (namespace and pod labels from ``__meta_kubernetes_*``, never from the target), so
  the series carry exactly the labels a user's Prometheus must attach (README: metrics from Prometheus).
- ``static_config``: fixed loopback targets with those labels set by the configuration (the unit tests).
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from v41flash.render import labels as L
from v41flash.render.ports import ENGINE_PORT
from v41flash.render.ports import METRICS_PORT, ROUTER_PORT
from v41flash_bench.procs import LOOPBACK, Proc, free_port, spawn, stop_procs

SCRAPE_INTERVAL_S = 1  # seconds: the e2e windows are tens of seconds


def _pod_job(name: str, kubeconfig: Path, namespace: str, keep: str, port: int, path: str = "/metrics") -> dict:
    """Pods of `namespace` with the role label matching `keep`, scraped at <podIP>:<port><path>."""
    role = "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in L.ROLE_LABEL)
    return {
        "job_name": name,
        "metrics_path": path,
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig),
                                   "namespaces": {"names": [namespace]}}],
        "relabel_configs": [
            {"source_labels": [role], "regex": keep, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_ready"], "regex": "true", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_ip"], "regex": "(.+)", "target_label": "__address__",
             "replacement": f"${{1}}:{port}"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": [role], "target_label": "role"},
        ],
    }


def kubernetes_sd_config(kubeconfig: Path, namespace: str) -> dict:
    """What a cluster's Prometheus runs with PodMonitors for the engines, the router and the session proxy."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [
            _pod_job("vllm", kubeconfig, namespace, "prefill|decode", ENGINE_PORT),
            _pod_job("vllm-router", kubeconfig, namespace, L.ROUTER, METRICS_PORT),
            _pod_job("session-proxy", kubeconfig, namespace, L.ROUTER, ROUTER_PORT, "/proxy/metrics"),
        ],
    }


def static_config(targets: Mapping[str, Mapping[str, str]], interval_s: float = SCRAPE_INTERVAL_S) -> dict:
    """targets: host:port -> the labels Prometheus attaches to its series (namespace, pod, ...)."""
    return {
        "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [
            {"targets": [t], "labels": dict(labels)} for t, labels in targets.items()]}],
    }


def start(binary: Path, config: dict, state: Path, name: str = "prometheus", port: int | None = None) -> Proc:
    """Start Prometheus on loopback with `config` and its TSDB under `state`; returns once it is ready."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = port or free_port()
    argv = [binary, f"--config.file={state / 'prometheus.yml'}", f"--storage.tsdb.path={state / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1h"]
    proc = spawn(name, argv, state / "prometheus.log", port=port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"prometheus exited; see {state / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop_procs([proc])
    raise RuntimeError(f"prometheus not ready within 30 s; see {state / 'prometheus.log'}")


def url(proc: Proc) -> str:
    return f"http://{LOOPBACK}:{proc.port}"


def active_targets(proc: Proc) -> list[dict]:
    with urllib.request.urlopen(f"{url(proc)}/api/v1/targets?state=active", timeout=5) as r:
        return json.load(r)["data"]["activeTargets"]


def wait_scraped(proc: Proc, pods: Iterable[str], timeout: float = 30.0) -> None:
    """Until every pod in `pods` has a target whose last scrape succeeded."""
    want = set(pods)
    deadline = time.monotonic() + timeout
    while True:
        up = {t["labels"].get("pod") for t in active_targets(proc) if t.get("health") == "up"}
        if want <= up:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"prometheus scrapes {sorted(up)}, not all of {sorted(want)}")
        time.sleep(0.5)
