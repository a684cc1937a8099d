"""Where the harness finds things: the checkout and its venv, the state directory, the tool cache and the pinned
binaries in it (e2e/versions.env); the harness's log line and its atomic JSON records."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from v41flash_bench.inference_sim import binary_path

E2E = Path(__file__).resolve().parent
REPO = E2E.parent
VENV_BIN = REPO / ".venv" / "bin"
# build-tools.sh's SIDECAR_PATCH: the pd-sidecar build with the bind-host patch (a unit test ties the two)
SIDECAR_PATCH = "v41f1"


def log(msg: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("V41F_CACHE") or Path.home() / ".cache" / "v41flash")


def read_versions(path: Path = E2E / "versions.env") -> dict[str, str]:
    """KEY=VALUE lines of versions.env (comments and blanks ignored)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class Tools:
    """Paths of the cached binaries and assets for the pinned versions."""
    bin: Path
    versions: dict

    @classmethod
    def load(cls) -> "Tools":
        return cls(cache_dir() / "bin", read_versions())

    def _dir(self, name: str, key: str) -> Path:
        return self.bin / f"{name}-{self.versions[key]}"

    @property
    def etcd(self): return self._dir("etcd", "ETCD_VERSION") / "etcd"
    @property
    def kube(self): return self._dir("kubernetes", "KUBERNETES_VERSION")
    @property
    def kwok(self): return self._dir("kwok", "KWOK_VERSION") / "kwok"
    @property
    def kwok_assets(self): return self._dir("kwok", "KWOK_VERSION") / "assets"
    @property
    def lws(self): return self._dir("lws", "LWS_VERSION") / "lws"
    @property
    def lws_assets(self): return self._dir("lws", "LWS_VERSION") / "assets"
    @property
    def helm(self): return self._dir("helm", "HELM_VERSION") / "helm"
    @property
    def prometheus(self): return self._dir("prometheus", "PROMTOOL_VERSION") / "prometheus"
    @property
    def sim(self):
        return binary_path(self.bin, self.versions["INFERENCE_SIM_VERSION"])
    # mode Gateway: llm-d's endpoint picker and P/D sidecar (the sidecar with build-tools.sh's bind-host patch),
    # the InferencePool/InferenceObjective CRDs (GIE) and the HTTPRoute CRD (Gateway API)
    @property
    def epp(self): return self._dir("epp", "LLM_D_INFERENCE_SCHEDULER_VERSION") / "epp"
    @property
    def pd_sidecar(self):
        return self.bin / f"pd-sidecar-{self.versions['LLM_D_INFERENCE_SCHEDULER_VERSION']}-{SIDECAR_PATCH}" / "pd-sidecar"
    @property
    def gie_crds(self) -> list[Path]:
        d = self._dir("gie", "GATEWAY_API_INFERENCE_EXTENSION_VERSION") / "assets"
        return [d / "inference.networking.k8s.io_inferencepools.yaml",
                d / "inference.networking.x-k8s.io_inferenceobjectives.yaml"]
    @property
    def gateway_api_crds(self) -> list[Path]:
        return [self._dir("gateway-api", "GATEWAY_API_VERSION") / "assets" / "gateway.networking.k8s.io_httproutes.yaml"]

    def missing(self) -> list[str]:
        """Components of build-tools.sh whose outputs are absent (helm is not needed to run)."""
        need = {
            "etcd": [self.etcd], "kwok": [self.kwok, self.kwok_assets / "pod-ready.yaml",
                                                    self.kwok_assets / "node-not-ready.yaml"],
            "inference-sim": [self.sim], "lws": [self.lws, self.lws_assets / "manifests.yaml"],
            "kubernetes": [self.kube / b for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")],
            "gie": self.gie_crds, "gateway-api": self.gateway_api_crds,  # mode Gateway's CRDs, installed by `up`
        }
        return [c for c, paths in need.items() if not all(p.exists() for p in paths)]


def operator_argv(kubeconfig: Path, metrics_port: int, health_port: int, *extra: str) -> list[str]:
    """`v41flash operator` against a local cluster, on its own loopback ports (the demo and the e2e fixture)."""
    return [str(VENV_BIN / "v41flash"), "operator", "--kubeconfig", str(kubeconfig), "--bind-address", "127.0.0.1",
            "--metrics-port", str(metrics_port), "--health-port", str(health_port), *extra]


def project_crds() -> list[Path]:
    crd_dir = Path(os.environ.get("V41F_CRD_DIR") or REPO / "crds")  # override: try other CRD versions
    return sorted(crd_dir.glob("*.yaml"))
