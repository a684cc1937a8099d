"""A running local cluster (`make up`, e2e/harness.py) as seen through its state directory: its kubeconfig, logs and
certificates, the processes recorded in pids.json (an extra process registered there is stopped by `harness down`),
the supervisor's sims.json, and whether it is up. The e2e harness's Cluster adds the lifecycle (up, down, restart);
a benchmark that runs on the cluster uses this alone, so bench never imports e2e (tests/test_layering.py).
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

from v41flash_bench.procs import Proc

REPO = Path(__file__).resolve().parents[2]
# The processes of a cluster that is up (the harness starts them; LWS and the Gateway's are extras).
CORE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "supervisor")


def state_dir() -> Path:
    return Path(os.environ.get("V41F_STATE") or REPO / "e2e" / ".state").resolve()


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=lambda o: asdict(o)))
    tmp.replace(path)


class ClusterRecords:
    """The local control plane's records under one state directory."""

    def __init__(self, state: Path | None = None):
        self.state = (state or state_dir()).resolve()
        self.pki = self.state / "pki"
        self.logs = self.state / "logs"
        self.kubeconfig = self.state / "kubeconfig"
        self.pids_file = self.state / "pids.json"
        self.sims_file = self.state / "sims.json"

    # -- records
    def procs(self) -> list[Proc]:
        if not self.pids_file.exists():
            return []
        return [Proc(**d) for d in json.loads(self.pids_file.read_text())["procs"]]

    def info(self) -> dict:
        return json.loads(self.pids_file.read_text()) if self.pids_file.exists() else {}

    def _save(self, procs: list[Proc], **info) -> None:
        with self._locked():
            data = self.info()
            data.update(info)
            data["procs"] = [asdict(p) for p in procs]
            write_json(self.pids_file, data)

    def _locked(self):
        """Serializes read-modify-write of pids.json between processes (tests, demo, harness)."""
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def lock():
            self.state.mkdir(parents=True, exist_ok=True)
            with open(self.state / ".pids.lock", "w") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                yield
        return lock()

    def register(self, proc: Proc) -> None:
        """Record an extra process (e.g. the operator started by a test) so that `down` stops it too."""
        with self._locked():
            procs = [p for p in self.procs() if p.name != proc.name] + [proc]
            data = self.info()
            data["procs"] = [asdict(p) for p in procs]
            write_json(self.pids_file, data)

    def unregister(self, name: str) -> None:
        with self._locked():
            data = self.info()
            data["procs"] = [d for d in data.get("procs", []) if d["name"] != name]
            write_json(self.pids_file, data)

    def supervised(self) -> list[dict]:
        """Simulators and routers the supervisor runs (its sims.json)."""
        try:
            return json.loads(self.sims_file.read_text())["processes"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return []

    # -- health
    def apiserver_url(self) -> str | None:
        return self.info().get("apiserver")

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.apiserver_url() + path, context=self._ssl(), timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def is_up(self) -> bool:
        procs = {p.name: p for p in self.procs()}
        if not all(n in procs and procs[n].alive() for n in CORE):
            return False
        try:
            return self.api_get("/readyz", timeout=3)[0] == 200
        except OSError:
            return False
