"""Mode Gateway's pods: llm-d's endpoint picker (its ports moved to free loopback ports, a forwarder from the pod IP)
and the P/D routing sidecar in decode pods. Pure functions."""
from __future__ import annotations

import sys

from e2e.pod_spec import go_flag, strip_executable


EPP_PORT_FLAGS = {"--grpc-port": 9002, "--grpc-health-port": 9003, "--metrics-port": 9090}  # epp's own defaults


def is_routing_sidecar(container: dict) -> bool:
    """llm-d's P/D routing sidecar (pd-sidecar): by its image or its container name."""
    image = str(container.get("image", ""))
    return container.get("name") == "routing-sidecar" or any(x in image for x in ("routing-sidecar", "pd-sidecar"))


def sidecar_container(pod: dict) -> dict | None:
    return next((c for c in pod["spec"]["containers"] if is_routing_sidecar(c)), None)


def epp_command(binary: str, tokens: list[str], local_ports: dict[str, int]) -> tuple[list[str], dict[int, int]]:
    """The endpoint picker's argv from its rendered flags, each of its ports (grpc, grpc-health, metrics) moved to
    the given free loopback port; and {pod port: local port} for the forwarder. It listens on ":<port>" (every
    address), so two pickers on this machine would collide on the pod ports: the forwarder puts them back on the
    pod IP."""
    flags = strip_executable(tokens, "epp")
    forwards: dict[int, int] = {}
    for flag, default in EPP_PORT_FLAGS.items():
        i, val, inline = go_flag(flags, flag)
        pod_port = int(val) if val is not None else default
        local = local_ports[flag]
        forwards[pod_port] = local
        if i < 0:
            flags += [flag, str(local)]
        elif inline:
            flags[i] = f"{flag}={local}"
        else:
            flags[i + 1] = str(local)
    return [binary, *flags], forwards


def forward_command(pod_ip: str, forwards: dict[int, int]) -> list[str]:
    """e2e/tcp_forward.py: <podIP>:<pod port> -> 127.0.0.1:<local port>, for each port."""
    return [sys.executable, "-m", "e2e.tcp_forward",
            *(f"{pod_ip}:{pp}=127.0.0.1:{lp}" for pp, lp in sorted(forwards.items()))]


def sidecar_command(binary: str, tokens: list[str]) -> tuple[list[str], int]:
    """pd-sidecar argv from the rendered container (its flags as they are) and the port it serves."""
    flags = strip_executable(tokens, "pd-sidecar")
    _, port, _ = go_flag(flags, "--port")
    return [binary, *flags], int(port or 8000)
