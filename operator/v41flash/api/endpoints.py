"""Where the operator may send the planner's Prometheus queries (spec.autoscaling.metrics.prometheus.url): what
an administrator allows, and what no spec may reach (issue 39).

The operator runs with the cluster's network position (the cloud's metadata service, its own loopback, the
kubelet's link-local neighbours) and a spec's author chooses the URL, so:

- a URL with userinfo (``user:password@``) is refused at admission (CRD rule) and redacted everywhere else;
- the URL must match the operator's allowlist (``EndpointAllowlist``; chart values
  ``controller.prometheusEndpoints``: URL prefixes, and ``controller.prometheusNamespaces``: Services
  ``<svc>.<ns>[.svc[.cluster.local]]`` of those namespaces): none by default;
- the host's every address (the name resolved when the operator queries; an IP literal as written) must not be
  loopback, link-local, unspecified or a cloud metadata address (``blocked``), unless the matching allowlist entry
  names that very address; metadata host names and numeric hosts in odd spellings (``2130706433``, ``0x7f.1``)
  are refused outright.

Pure: the operator's check (render/checks.py, a Stalled naming the field) uses ``static_problem``; the query path
(metrics/promapi.py) resolves the name and calls ``address_problem`` on each address.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

FIELD = "spec.autoscaling.metrics.prometheus.url"
# Host names of cloud metadata services (GCE, Azure/AWS aliases); their addresses are blocked below as well.
METADATA_HOSTS = ("metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal", "metadata.azure.internal")
METADATA_ADDRESSES = tuple(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "169.254.169.253", "fd00:ec2::254", "fd00:ec2::23", "100.100.100.200",
    "192.0.0.192"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NUMERIC_HOST = re.compile(r"^((0x[0-9a-f]*|[0-9]+)\.){0,3}(0x[0-9a-f]*|[0-9]+)\.?$", re.I)
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str  # lower case, no trailing dot, IPv6 without brackets
    port: int
    path: str  # '' or '/...'

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def redact(url: str) -> str:
    """The URL as status, Events and logs may show it: no userinfo, query or fragment, at most 200 characters."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return "<not-a-URL>"
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]
    path = re.split(r"[?#]", path, maxsplit=1)[0]
    shown = f"{scheme}://{authority}{slash}{path}"
    shown = "".join(c if c.isprintable() and c.isascii() and not c.isspace() else "?" for c in shown)
    return shown[:200]


def parse(url: str) -> Endpoint:
    """ValueError (whose message never repeats userinfo) unless ``url`` is http(s)://host[:port][/path]."""
    if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
        raise ValueError("not a URL of printable ASCII without blanks")
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError as exc:  # a bad port, bad IPv6 brackets
        raise ValueError(f"not a URL the operator can read ({str(exc)[:80]})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("not http:// or https://")
    if "@" in parts.netloc:
        raise ValueError("carries userinfo (user:password@): the operator sends no credentials in a URL")
    if not host:
        raise ValueError("has no host")
    if parts.query or parts.fragment:
        raise ValueError("has a query or fragment (the operator appends /api/v1/query itself)")
    if port == 0:
        raise ValueError("port 0")
    host = host.lower().rstrip(".")
    return Endpoint(parts.scheme, host, port or (443 if parts.scheme == "https" else 80), parts.path.rstrip("/"))


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def blocked(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What kind of address no spec may query without the administrator naming it, or None."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64
                                        else None)
        if inner is not None:
            return blocked(inner)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_multicast:
        return "a multicast address"
    return None


@dataclass(frozen=True)
class EndpointAllowlist:
    """What the operator's configuration lets a spec query. urls: prefixes ``scheme://host[:port][/path]`` (no
    port: the scheme's); namespaces: Services of these namespaces, by their cluster DNS names, on any port."""
    urls: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for u in self.urls:
            try:
                parse(u)
            except ValueError as exc:
                raise ValueError(f"Prometheus endpoint {redact(u)!r} {exc}") from None
        for ns in self.namespaces:
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", ns):
                raise ValueError(f"Prometheus namespace {ns!r} is not a namespace name")

    def match(self, ep: Endpoint) -> Endpoint | str | None:
        """The URL entry that allows ``ep`` (an Endpoint), the namespace that does (a str), or None."""
        for u in self.urls:
            allowed = parse(u)
            if (allowed.scheme, allowed.host, allowed.port) == (ep.scheme, ep.host, ep.port) and \
                    (ep.path == allowed.path or ep.path.startswith(allowed.path + "/")):
                return allowed
        labels = ep.host.split(".")
        if len(labels) >= 2 and (len(labels) == 2 or labels[2:] == ["svc"] or
                                 labels[2:] == ["svc", *CLUSTER_DOMAIN.split(".")]):
            if labels[1] in self.namespaces and _literal(ep.host) is None:
                return labels[1]
        return None


def static_problem(url: str, allow: EndpointAllowlist) -> str | None:
    """Why the operator refuses this URL before any query (no name resolution), or None. Never repeats
    userinfo."""
    try:
        ep = parse(url)
    except ValueError as exc:
        return f"{redact(url)} {exc}"
    if ep.host in METADATA_HOSTS or ep.host.endswith(".metadata.google.internal"):
        return f"{ep} names a cloud metadata service"
    literal = _literal(ep.host)
    if literal is None and _NUMERIC_HOST.match(ep.host):
        return f"{ep}: a numeric host in a non-standard spelling (write the address as a.b.c.d)"
    entry = allow.match(ep)
    if entry is None:
        if not allow.urls and not allow.namespaces:
            return (f"{ep}: this operator queries no Prometheus until an administrator allows it (chart values "
                    "controller.prometheusEndpoints / controller.prometheusNamespaces)")
        return (f"{ep} is not an endpoint the operator allows (URL prefixes: {', '.join(allow.urls) or 'none'}; "
                f"Services in namespaces: {', '.join(allow.namespaces) or 'none'})")
    if literal is not None:
        return address_problem(ep, literal, entry)
    return None


def address_problem(ep: Endpoint, address: ipaddress.IPv4Address | ipaddress.IPv6Address,
                    entry: Endpoint | str | None) -> str | None:
    """Why the operator will not connect to ``address`` for ``ep`` allowed by ``entry`` (``match``), or None."""
    kind = blocked(address)
    if kind is None:
        return None
    if isinstance(entry, Endpoint) and _literal(entry.host) == address:
        return None  # the administrator named this very address
    return (f"{ep} resolves to {address}, {kind}: refused unless the operator's allowlist names that address "
            "(controller.prometheusEndpoints)")
