"""Host paths of the weight cache (spec.startup.weightCache.hostPath): what any cluster accepts, and what an
administrator allows (issue 39).

A hostPath volume is node access: the engines run as root and the prefetch DaemonSet writes on every GPU node.
So the operator mounts a host directory only

1. in a normal spelling (checked at admission by the CRD, offline by `v41flash validate`): absolute; components
   of ``[A-Za-z0-9._-]``, none ``.`` or ``..``, none empty (no ``//``, no trailing ``/``), at most 255
   characters each, 4,096 in all (no blanks, control characters, NUL or look-alike letters); not the host root in
   any spelling; not in or above a directory that holds the node's system, runtime or kubelet state
   (``DANGEROUS``), compared case-insensitively. A symlink planted below an allowed directory is the
   administrator's to avoid (a namespace user cannot write there: engines mount it read-only);
2. under a directory the operator's own configuration allows (``HostPathAllowlist``; the chart value
   ``controller.weightCacheHostPaths``): none by default, so the feature is off until an administrator opts in.
   Checked by the operator, which Stalls naming the field and applies nothing;
3. per namespace: ``<hostPath>/<namespace>`` on the node, unless the administrator lists the directory as shared
   (``controller.weightCacheSharedHostPaths``) and the spec says ``sharedAcrossNamespaces: true``.

Pure: the CRD's rules, the operator's check and the renderer's path all come from here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

FIELD = "spec.startup.weightCache.hostPath"
MAX_PATH = 4096  # PATH_MAX
MAX_COMPONENT = 255  # NAME_MAX
# Every component of plain ASCII (no blanks, control characters, ':' or '$', no Unicode look-alikes).
PATTERN = rf"^(/[A-Za-z0-9._-]{{1,{MAX_COMPONENT}}})+$"
# Directories (and everything below them) that hold the node's system, its secrets, the container runtime or
# the kubelet (every pod's volumes and ServiceAccount tokens). Their parents are refused too (ANCESTORS):
# mounting /var mounts /var/lib/kubelet.
DANGEROUS = ("proc", "sys", "dev", "etc", "run", "var/run", "var/lib/kubelet", "var/lib/containerd",
             "var/lib/docker", "var/lib/containers", "var/lib/crio", "var/lib/cni", "var/lib/etcd", "var/log",
             "boot", "root", "home", "usr", "bin", "sbin", "lib[^/]*", "opt/cni", "snap", "tmp", "var/tmp")
ANCESTORS = ("var", "var/lib", "opt")
_DANGEROUS_RE = "(?i)^/((" + "|".join(DANGEROUS) + ")(/|$)|(" + "|".join(ANCESTORS) + ")$)"
_DOTS_RE = r"/\.\.?(/|$)"

# The CRD's rules on WeightCacheSpec (fieldPath .hostPath), evaluated offline by api/validation.py too.
CEL_RULES: tuple[tuple[str, str], ...] = (
    (f"!self.hostPath.matches('{_DOTS_RE}')".replace("\\", "\\\\"),
     "hostPath may not have '.' or '..' components: write the directory itself (the apiserver refuses '..' in a "
     "hostPath volume, and '.' hides what is mounted)"),
    (f"!self.hostPath.matches('{_DANGEROUS_RE}')",
     "hostPath may not be in or above the node's system, runtime or kubelet directories (/proc, /sys, /dev, /etc, "
     "/run, /var/run, /var/lib/kubelet, /var/lib/containerd, /var/lib/docker, /boot, /root, /usr, /bin, /sbin, "
     "/lib*, /tmp, ...): use a directory of its own on a local disk that your administrator allows, e.g. "
     "/mnt/nvme/v41flash"),
)


def normal_problem(path: str) -> str | None:
    """Why ``path`` is not a normal, safe host directory (what admission refuses), or None."""
    if len(path) > MAX_PATH:
        return f"longer than {MAX_PATH} characters"
    if not re.fullmatch(PATTERN, path):
        return (f"not an absolute path of components of letters, digits, '.', '_' or '-' (at most {MAX_COMPONENT} "
                f"each, no empty component, no trailing '/')")
    if re.search(_DOTS_RE, path):
        return "has a '.' or '..' component"
    if re.search(_DANGEROUS_RE, path):
        return "is in or above the node's system, runtime or kubelet directories"
    return None


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


@dataclass(frozen=True)
class HostPathAllowlist:
    """The host directories an administrator lets weight caches use (the operator's configuration).

    private: each namespace gets ``<dir>/<namespace>``; the spec's hostPath must be one of these exactly, so the
    namespaces' directories are siblings and none is inside another's. shared: the spec's hostPath is this
    directory or one below it, mounted as written, and every namespace that names it shares it (and can overwrite
    each other's weights): only with ``sharedAcrossNamespaces: true``.
    """
    private: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        every = [*self.private, *self.shared]
        for d in every:
            why = normal_problem(d)
            if why:
                raise ValueError(f"weight cache host path {d!r} {why}")
        for a in every:
            for b in every:
                if a is not b and _under(a, b):
                    raise ValueError(f"weight cache host paths {a!r} and {b!r} nest: one namespace's directory "
                                     "could be inside another's; list directories side by side")

    def problem(self, path: str, shared: bool) -> str | None:
        """Why the operator refuses a spec's hostPath (and sharedAcrossNamespaces), or None."""
        why = normal_problem(path)
        if why:
            return f"{path[:200]!r} {why}"
        if not self.private and not self.shared:
            return ("this operator allows no weight cache host path (an administrator opts in with the chart value "
                    "controller.weightCacheHostPaths, flag --weight-cache-host-paths): remove startup.weightCache")
        if shared:
            if any(_under(path, d) for d in self.shared):
                return None
            return (f"{path!r} is not under a directory the operator shares across namespaces "
                    f"({', '.join(self.shared) or 'none'}); remove sharedAcrossNamespaces to get a directory of this "
                    f"namespace's own")
        if path in self.private:
            return None
        return (f"{path!r} is not a weight cache directory the operator allows (allowed: "
                f"{', '.join(self.private) or 'none'}; each namespace gets <directory>/<namespace>)")


def node_path(path: str, namespace: str, shared: bool) -> str:
    """The directory mounted on the node: the namespace's own below ``path``, or ``path`` itself when shared."""
    return path if shared else f"{path}/{namespace}"
