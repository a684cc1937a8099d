"""kwok's fake nodes (GPU products, an NVLink rack, CPU nodes) and the pod network each cluster claims: pod IPs inside
127.0.0.0/8, so a simulated pod's processes can bind its IP on this machine."""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from e2e.tools import cache_dir
from v41flash_bench.procs import proc_start_ticks

NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"  # kwok's chaos stage: the node reports Ready False
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# Each cluster's pods live in 127.<N>.0.0/16 (all of 127.0.0.0/8 is on the loopback interface, so pod IPs
# are bindable). N is claimed per cluster (claim_pod_network), so several clusters on one machine never
# share pod IPs; node i gets 127.<N>.<i>.0/24 and 127.<N>.0.0/24 is kwok's fallback pool.


@dataclass(frozen=True)
class NodePool:
    prefix: str
    count: int
    gpus: int
    product: str | None
    cpu: str
    memory: str
    extra_labels: tuple = ()


# 4 H200 HGX, 2 B200 HGX, one GB300 NVL72 rack (18 compute trays x 4 GPUs, one NVLink domain), 2 CPU nodes.
NODE_POOLS = (
    NodePool("h200", 4, 8, "NVIDIA-H200", "224", "2Ti"),
    NodePool("b200", 2, 8, "NVIDIA-B200", "224", "2Ti"),
    NodePool("gb300-rack0-tray", 18, 4, "NVIDIA-GB300", "144", "900Gi",
             (("nvidia.com/gpu.clique", "gb300-rack-0"),)),
    NodePool("cpu", 2, 0, None, "32", "128Gi"),
)


def fake_nodes(pools: Iterable[NodePool] = NODE_POOLS, net: int = 1) -> list[dict]:
    """Node manifests (with status) for kwok to manage; the i-th node (from 1) gets pod CIDR 127.<net>.<i>.0/24."""
    nodes = []
    i = 0
    for pool in pools:
        width = 2 if pool.count > 9 else 1
        for n in range(pool.count):
            i += 1
            name = f"{pool.prefix}-{n:0{width}d}"
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                      "type": "kwok"}
            capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110", "ephemeral-storage": "7Ti"}
            taints = []
            if pool.gpus:
                labels.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": pool.product,
                               "nvidia.com/gpu.count": str(pool.gpus)})
                capacity[GPU_RESOURCE] = str(pool.gpus)
                taints.append(dict(GPU_TAINT))
            labels.update(dict(pool.extra_labels))
            nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": {NODE_ANNOTATION: "fake"}},
                "spec": {"podCIDR": f"127.{net}.{i}.0/24", "podCIDRs": [f"127.{net}.{i}.0/24"],
                         "taints": taints},
                "status": {"capacity": capacity, "allocatable": dict(capacity)},
            })
    if i > 255:
        raise ValueError(f"more nodes than /24 pod CIDRs in 127.{net}.0.0/16")
    return nodes


def claim_pod_network(state: Path, registry: Path | None = None) -> int:
    """Claim a free N for this cluster's pod network 127.N.0.0/16 (1..254) in a machine-wide registry.
    A claim is free again when its cluster's processes are all gone (or it was never started)."""
    import fcntl
    registry = registry or cache_dir() / "podnets"
    registry.mkdir(parents=True, exist_ok=True)
    with open(registry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy = loopback_listener_nets()
        for n in range(1, 255):
            if n in busy:  # e.g. a cluster started by an older harness, or anything else bound there
                continue
            f = registry / f"{n}.json"
            if f.exists():
                try:
                    claim = json.loads(f.read_text())
                except json.JSONDecodeError:
                    claim = {}
                if claim.get("state") == str(state) or not _claim_live(claim):
                    f.unlink()
                else:
                    continue
            f.write_text(json.dumps({"state": str(state), "time": time.time()}))
            return n
    raise RuntimeError(f"no free pod network 127.N.0.0/16 left (registry {registry})")


def loopback_listener_nets(tcp_tables: Iterable[str] = ("/proc/net/tcp",)) -> set[int]:
    """Second octets N of 127.N.x.y addresses that have a listening TCP socket on this machine."""
    nets = set()
    for table in tcp_tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                ip = socket.inet_ntoa(int(fields[1].split(":")[0], 16).to_bytes(4, "little"))
                if ip.startswith("127."):
                    nets.add(int(ip.split(".")[1]))
    return nets


def _claim_live(claim: dict) -> bool:
    st = Path(claim.get("state", "/nonexistent"))
    if time.time() - claim.get("time", 0) < 300 and st.exists():
        return True  # being started
    try:
        procs = json.loads((st / "pids.json").read_text())["procs"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return False
    return any(proc_start_ticks(p["pid"]) == p["start"] for p in procs)


def release_pod_network(state: Path, registry: Path | None = None) -> None:
    registry = registry or cache_dir() / "podnets"
    for f in registry.glob("*.json") if registry.exists() else []:
        try:
            if json.loads(f.read_text()).get("state") == str(state):
                f.unlink()
        except (json.JSONDecodeError, FileNotFoundError):
            pass
