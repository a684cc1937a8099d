"""What the operator's administrator allows a V41FlashDeployment to reach (issue 39): host directories for the
weight cache (api/host_paths.py) and Prometheus endpoints (api/endpoints.py). Built once from the operator's flags
(controller/config.py, chart values under ``controller``); the default allows neither, so both features are off
until an administrator opts in. Pure data: no pydantic, so the CLI's other processes do not load the API models."""
from __future__ import annotations

from dataclasses import dataclass, field

from .endpoints import EndpointAllowlist
from .host_paths import HostPathAllowlist


@dataclass(frozen=True)
class AdminPolicy:
    host_paths: HostPathAllowlist = field(default_factory=HostPathAllowlist)
    endpoints: EndpointAllowlist = field(default_factory=EndpointAllowlist)
