"""A pod's spec read as kubelet reads it: a container's env (downward API included), its command line ($(VAR)
expansion, `sh -c` unwrapped), flag values, ports, and the configMap volumes it mounts. Pure functions."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/env"}


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_vars(s: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion of command/args: unknown references stay as written, $$ escapes $."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, s)


_FIELDS = {"metadata.name": lambda p: p["metadata"]["name"],
           "metadata.namespace": lambda p: p["metadata"]["namespace"],
           "metadata.uid": lambda p: p["metadata"].get("uid", ""),
           "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
           "spec.serviceAccountName": lambda p: p["spec"].get("serviceAccountName", ""),
           "status.podIP": lambda p: p.get("status", {}).get("podIP", ""),
           "status.hostIP": lambda p: p.get("status", {}).get("hostIP", "")}


def container_env(pod: dict, container: dict) -> dict[str, str]:
    """A container's env with literal values and downward-API fieldRefs resolved (others are skipped)."""
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand_vars(str(e["value"]), env)
            continue
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", ref)
        if m:
            env[e["name"]] = pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
        elif ref in _FIELDS:
            env[e["name"]] = _FIELDS[ref](pod)
    return env


def command_tokens(container: dict, env: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expanded; a `sh -c "<script>"` wrapper is split into its words."""
    toks = [expand_vars(str(t), env) for t in (container.get("command") or []) + (container.get("args") or [])]
    if toks and toks[0] in SHELLS and "-c" in toks:
        i = toks.index("-c")
        if i + 1 < len(toks):
            script = toks[i + 1].split("&&")[-1]  # the last command of `a && b && exec vllm serve ...`
            toks = [t for t in shlex.split(script) if t != "exec"]
    return toks


def flag_values(tokens: list[str], name: str) -> list[str] | None:
    """Values after --name (or --name=v) up to the next option; None when the flag is absent."""
    for i, t in enumerate(tokens):
        if t == name:
            vals = []
            for v in tokens[i + 1:]:
                if v.startswith("-") and not _is_number(v):
                    break
                vals.append(v)
            return vals
        if t.startswith(name + "="):
            return [t[len(name) + 1:]]
    return None


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def int_flag(tokens, *names, default=None):
    for n in names:
        v = flag_values(tokens, n)
        if v:
            return int(v[0])
    return default


def go_flag(tokens: list[str], name: str) -> tuple[int, str | None, bool]:
    """(index, value, inline) of a Go flag given as -name/--name VALUE or -name=/--name=VALUE; (-1, None, False)."""
    bare = name.lstrip("-")
    for i, t in enumerate(tokens):
        key, eq, val = t.partition("=")
        if key in (f"-{bare}", f"--{bare}"):
            if eq:
                return i, val, True
            return i, (tokens[i + 1] if i + 1 < len(tokens) else None), False
    return -1, None, False


def strip_executable(tokens: list[str], *names: str) -> list[str]:
    """The flags after the executable when command+args start with it (else all tokens: the image entrypoint)."""
    return tokens[1:] if tokens and os.path.basename(tokens[0]) in names else list(tokens)


def http_port(container: dict) -> int | None:
    for p in container.get("ports") or []:
        if p.get("name") == "http":
            return int(p["containerPort"])
    return None


def configmap_mounts(pod: dict, container: dict, text: str) -> list[tuple[str, str, dict]]:
    """(mountPath, volume name, its configMap source) of each configMap volume the container mounts at a path
    that `text` names, longest path first (a hook's command reads files there)."""
    vols = {v["name"]: v["configMap"] for v in pod["spec"].get("volumes") or [] if v.get("configMap")}
    mounts = [(m["mountPath"].rstrip("/"), m["name"], vols[m["name"]]) for m in container.get("volumeMounts") or []
              if m["name"] in vols and m["mountPath"].rstrip("/") in text]
    return sorted(mounts, key=lambda m: -len(m[0]))


def configmap_files(data: dict | None, source: dict) -> dict[str, str]:
    """The files of a configMap volume: each item's key at its path, or every key at its own name."""
    data = data or {}
    items = source.get("items")
    if items is None:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}


def volume_paths(pod: dict, container: dict, tokens: list[str], volumes: Path) -> list[str]:
    """Tokens with each configMap mount path they name moved to its copy under `volumes/<volume name>`."""
    for path, volume, _ in configmap_mounts(pod, container, " ".join(tokens)):
        tokens = [t.replace(path, str(volumes / volume)) for t in tokens]
    return tokens


def wants_process(pod: dict) -> bool:
    st = pod.get("status") or {}
    return (st.get("phase") == "Running" and bool(st.get("podIP"))
            and not pod["metadata"].get("deletionTimestamp"))
