"""Router pods: vllm-router with the container's rendered flags, the session proxy in front of it, and a rollout's
front (the session proxy alone, its Service upstreams and routing table resolved here, where there is no cluster DNS
nor kube-proxy). Pure functions."""
from __future__ import annotations

import json
import os
import re

from e2e.tools import VENV_BIN


def router_command(tokens: list[str], pod_ip: str, log_dir: str) -> list[str]:
    """vllm-router argv from the rendered container: same flags, bound to the pod IP, logs in the state dir."""
    start = None
    for i, t in enumerate(tokens):
        if os.path.basename(t) == "vllm-router" or t in ("vllm_router.launch_router", "vllm_router"):
            start = i + 1
    flags = tokens[start:] if start is not None else tokens
    out: list[str] = []
    skip = 0
    for i, t in enumerate(flags):
        if skip:
            skip -= 1
            continue
        name = t.split("=", 1)[0]
        if name in ("--host", "--prometheus-host", "--log-dir"):
            skip = 0 if "=" in t else 1
            continue
        out.append(t)
    return [str(VENV_BIN / "vllm-router"), *out, "--host", pod_ip, "--prometheus-host", pod_ip,
            "--log-dir", log_dir]


def is_session_proxy(container: dict) -> bool:
    return "session-proxy" in [str(t) for t in (container.get("command") or []) + (container.get("args") or [])]


def proxy_container(pod: dict) -> dict | None:
    return next((c for c in pod["spec"]["containers"] if is_session_proxy(c)), None)


def proxy_command(tokens: list[str], pod_ip: str) -> tuple[list[str], int]:
    """`v41flash session-proxy` argv from the rendered container, listening on the pod IP and forwarding to
    the router on the pod IP (the rendered 127.0.0.1 is shared by every pod on this machine); and its port."""
    i = tokens.index("session-proxy")
    flags = list(tokens[i + 1:])
    port = None
    for j, t in enumerate(flags):
        if t == "--listen" and j + 1 < len(flags):
            port = int(flags[j + 1].rpartition(":")[2])
            flags[j + 1] = f"{pod_ip}:{port}"
        elif t == "--upstream" and j + 1 < len(flags):
            flags[j + 1] = re.sub(r"^(https?://)(127\.0\.0\.1|localhost|\[::1\])(?=[:/]|$)", rf"\g<1>{pod_ip}",
                                  flags[j + 1])
    if port is None:
        raise ValueError("session-proxy container without --listen HOST:PORT")
    return [str(VENV_BIN / "v41flash"), "session-proxy", *flags], port


def has_router(pod: dict) -> bool:
    """A router pod with a vllm-router container (a rollout's front runs the session proxy alone)."""
    for c in pod["spec"]["containers"]:
        toks = (c.get("command") or []) + (c.get("args") or [])
        if any(os.path.basename(str(t)) == "vllm-router" for t in toks) or c["name"] in ("router", "vllm-router"):
            return True
    return False


_SVC_URL = re.compile(r"^(https?)://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)(/.*)?$")


def resolve_service_url(url: str, services: dict, pods: list) -> str | None:
    """http://NAME.NS.svc:PORT -> http://<pod IP>:<target port> of a Ready pod behind that Service (no cluster
    DNS or kube-proxy here); another URL as it is; None when the Service or a Ready pod is missing."""
    m = _SVC_URL.match(url)
    if not m:
        return url
    scheme, name, ns, port, path = m.groups()
    found = sorted(ready_backends(services.get((ns, name)), int(port), pods, ns),
                   key=lambda b: b[0]["metadata"]["name"])
    if not found:
        return None
    _, ip, target = found[0]
    return f"{scheme}://{ip}:{target}{path or ''}"


def ready_backends(svc: dict | None, port: int, pods: list, namespace: str) -> list[tuple[dict, str, int]]:
    """(pod, pod IP, target port) of each Ready, not terminating pod behind a Service port, as kube-proxy would
    pick from (there is none here); [] when the Service, its selector or its port is missing."""
    if not svc or not (svc.get("spec") or {}).get("selector"):
        return []
    sport = next((p for p in svc["spec"].get("ports") or [] if int(p.get("port", 0)) == int(port)), None)
    if sport is None:
        return []
    sel = svc["spec"]["selector"]
    out = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if pod["metadata"].get("namespace") != namespace or any(labels.get(k) != v for k, v in sel.items()):
            continue
        st = pod.get("status") or {}
        if not st.get("podIP") or pod["metadata"].get("deletionTimestamp") or not any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []):
            continue
        target = sport.get("targetPort", sport["port"])
        if isinstance(target, str) and not target.isdigit():
            target = next((cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                           if cp.get("name") == target), None)
            if target is None:
                continue
        out.append((pod, st["podIP"], int(target)))
    return out


UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a connection is refused, as by a Service with no Ready endpoint


def local_routes(table_text: str, services: dict, pods: list) -> str | None:
    """The routing table with each upstream resolved to a Ready pod's address. An upstream whose Service has
    no Ready pod yet (a candidate's router still starting) refuses connections, as a ClusterIP Service
    without endpoints does; the table is written all the same, so the serving revision's route works."""
    doc = json.loads(table_text)
    for r in doc.get("revisions") or []:
        r["upstream"] = resolve_service_url(r.get("upstream", ""), services, pods) or UNREACHABLE
    return json.dumps(doc, sort_keys=True)


def routes_volume(pod: dict, container: dict, path: str) -> tuple[str, str] | None:
    """(ConfigMap name, key) behind a file path the container reads from a configMap volume."""
    mounts = {m["name"]: m["mountPath"].rstrip("/") for m in container.get("volumeMounts") or []}
    for v in pod["spec"].get("volumes") or []:
        cm = v.get("configMap")
        if not cm or v["name"] not in mounts:
            continue
        for item in cm.get("items") or []:
            if f"{mounts[v['name']]}/{item['path']}" == path:
                return cm["name"], item["key"]
    return None


# --- the front: Envoy with the operator's configuration files ---------------------------------------------------

def is_front(container: dict) -> bool:
    """The front's Envoy container (render/router.py: `envoy -c <the ConfigMap's bootstrap>`)."""
    cmd = [str(t) for t in (container.get("command") or [])]
    return bool(cmd) and os.path.basename(cmd[0]) == "envoy"


def front_container(pod: dict) -> dict | None:
    return next((c for c in pod["spec"]["containers"] if is_front(c)), None)


def local_front_bootstrap(text: str, pod_ip: str, admin_port: int, counters_port: int, config_dir: str) -> str:
    """The rendered bootstrap as this machine runs it: the listener on the pod IP, the admin API and the counters on
    free loopback ports (every pod shares this loopback), the routes and clusters read from config_dir."""
    doc = json.loads(text)
    doc["admin"]["address"]["socket_address"]["port_value"] = admin_port
    for listener in doc["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["address"] = pod_ip
    for cluster in doc["static_resources"]["clusters"]:
        for ep in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]:
            ep["endpoint"]["address"]["socket_address"]["port_value"] = counters_port
    text = json.dumps(doc, sort_keys=True)
    rendered_dir = doc["dynamic_resources"]["cds_config"]["path_config_source"]["watched_directory"]["path"]
    return text.replace(json.dumps(rendered_dir)[:-1] + "/", json.dumps(config_dir)[:-1] + "/").replace(
        json.dumps(rendered_dir), json.dumps(config_dir))


def local_front_clusters(text: str, services: dict, pods: list) -> str:
    """The rendered clusters (each a Service name, DNS) with each Service's Ready pods as static addresses, as
    kube-proxy spreads a ClusterIP's connections; a Service with none refuses connections (UNREACHABLE)."""
    doc = json.loads(text)
    for c in doc["resources"]:
        sa = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        url = f"http://{sa['address']}:{sa['port_value']}"
        m = _SVC_URL.match(url)
        found = []
        if m:
            _, name, ns, port, _ = m.groups()
            found = sorted((ip, target) for _, ip, target in ready_backends(services.get((ns, name)), int(port),
                                                                             pods, ns))
        else:
            found = [(sa["address"], sa["port_value"])]
        if not found:
            found = [("127.0.0.1", 9)]  # UNREACHABLE
        c["type"] = "STATIC"
        c.pop("dns_lookup_family", None)
        c["load_assignment"]["endpoints"] = [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}} for ip, port in found]}]
    return json.dumps(doc, sort_keys=True)
