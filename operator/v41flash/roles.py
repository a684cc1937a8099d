"""Home of the role names: the engine roles a V41FlashDeployment runs, prefill and decode; and of the slot names.

The API's role fields, the renderer, the controller and the planner all take them from here. An
aggregated deployment runs decode alone (its replicas also prefill). A revision runs in a slot (render/slots.py):
a deployment's first in slot "", the later ones alternately in "a" and "b" (rollout/machine.py).
"""
from __future__ import annotations

from typing import Literal

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")
FIRST_SLOT = ""  # where a deployment's first revision runs: workloads <cr>-<role>, router "0"
ROLLOUT_SLOTS = ("a", "b")
