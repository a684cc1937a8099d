"""Home of the role names: the engine roles a V41FlashDeployment runs, prefill and decode.

The API's role fields, the renderer, the controller and the planner all take them from here. An
aggregated deployment runs decode alone (its replicas also prefill).
"""
from __future__ import annotations

from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
