"""YAML text of rendered objects, safe for Go YAML readers (kubectl, Argo CD, Flux).

PyYAML writes YAML 1.2-ish plain scalars; Go's YAML 1.1 readers turn a plain `y`/`n` into booleans
(e.g. UCX_CUDA_IPC_ENABLE_MNNVL: y → "expected string, got true" on apply), so such strings are quoted.
Multi-line strings (the resolved ConfigMap) are written as blocks.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

# YAML 1.1 booleans and null spellings PyYAML leaves plain but Go's yaml.v2 resolves
_AMBIGUOUS = re.compile(r"^(y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
                        r"|~|null|Null|NULL)$")


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    if _AMBIGUOUS.match(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def to_yaml(objs: list[dict[str, Any]]) -> str:
    """Multi-document YAML of rendered objects, in order."""
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, width=120)


def to_yaml_doc(obj: Any) -> str:
    """One YAML document (the resolved ConfigMap's content), with the same quoting."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120)
