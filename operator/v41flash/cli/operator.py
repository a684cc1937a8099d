"""`v41flash operator`: run the controller (kopf) against the cluster of --kubeconfig, else in-cluster, else
~/.kube/config.

With leader election (the default) the process first becomes leader on a coordination.k8s.io Lease and
only then starts kopf; a standby answers /healthz and serves /metrics but reads and writes nothing else.
A leader that cannot renew within the renew deadline re-executes itself (same PID, a fresh process
image: every thread and connection of the old term is gone) and stands by again.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..controller.config import OperatorConfig, install, strings

log = logging.getLogger("v41flash.operator")


def default_identity() -> str:
    """The pod name in a cluster (a restarted container re-takes its own Lease at once), else host + random."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class _Health(BaseHTTPRequestHandler):
    healthy = staticmethod(lambda: True)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        ok = self.path.split("?")[0] in ("/healthz", "/readyz") and self.healthy()
        body = b"ok\n" if ok else b"not ok\n"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:  # probes are not news
        pass


def _standby_health(bind: str, port: int, healthy) -> ThreadingHTTPServer | None:
    """/healthz while standing by; handed to kopf's liveness endpoint once leading."""
    if not port:
        return None
    handler = type("Health", (_Health,), {"healthy": staticmethod(healthy)})
    server = ThreadingHTTPServer((bind, port), handler)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server


def _reexec() -> None:
    """Leadership lost: stop every thread of this term at once and start over as a candidate."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "v41flash.cli.main", *sys.argv[1:]])


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_format == "json"
                   else kopf.LogFormat.FULL)
    if not args.verbose:  # "Handler 'track' succeeded." for every watch event is no news at 500 deployments
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from ..controller import handlers  # noqa: F401  (importing registers the kopf handlers)
    from ..controller.kube import Kube, load_config
    from ..controller.runtime import Runtime

    try:
        config = tunables(args)
    except ValueError as exc:
        log.error("invalid tunable: %s", exc)
        return 2
    install(config)  # the passes read its AdminPolicy (what the administrator allows specs to reach)
    policy = config.admin_policy()
    log.info("weight cache host paths allowed: %s (shared: %s); Prometheus endpoints allowed: %s, namespaces: %s",
             ", ".join(policy.host_paths.private) or "none", ", ".join(policy.host_paths.shared) or "none",
             ", ".join(policy.endpoints.urls) or "none", ", ".join(policy.endpoints.namespaces) or "none")
    api_client = load_config(args.kubeconfig, config)  # the path is passed, never left to $KUBECONFIG
    runtime = Runtime(kube=Kube(api_client, config), config=config)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
        log.info("metrics on %s:%d/metrics", args.bind_address, args.metrics_port)
    liveness = f"http://{args.bind_address}:{args.health_port}/healthz" if args.health_port else None

    elector = None
    if args.leader_elect:
        from kubernetes import client

        from ..controller.leader import LeaderElector
        elector = LeaderElector(client.CoordinationV1Api(api_client), args.leader_election_namespace,
                                args.leader_election_id or default_identity())
        health = _standby_health(args.bind_address, args.health_port, lambda: True)
        log.info("leader election: %s is a candidate for Lease %s/%s", elector.identity, elector.namespace,
                 elector.name)
        if not elector.acquire():
            return 0
        if health is not None:
            health.shutdown()
            health.server_close()
        runtime.kube.fence = elector.is_leading  # our writes stop the moment the term may have ended
        elector.keep(on_lost=_reexec)
    namespaces = args.namespace or []
    try:
        kopf.run(
            standalone=True,  # no kopf peering: the Lease above decides who acts
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            memo=kopf.Memo(runtime=runtime),  # every handler's way to the runtime
        )
    finally:
        if elector is not None:
            elector.release()  # a clean stop hands over at once instead of after the lease expires
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="run the operator (reconciles V41FlashDeployments)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    p.add_argument("-n", "--namespace", action="append",
                   help="namespace to watch (repeatable); default: all namespaces")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0 = off)")
    p.add_argument("--health-port", type=int, default=8081, help="liveness endpoint port (0 = off)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address for metrics and health endpoints")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="act only while holding the Lease (run several replicas; default: on)")
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE") or "default",
                   help="namespace of the Lease (default: $POD_NAMESPACE, else default)")
    p.add_argument("--leader-election-id", default=None,
                   help="this replica's identity in the Lease (default: $POD_NAME, else host name + random)")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="log format")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_tunables(p)
    p.set_defaults(func=cmd_operator)


def flag(field_name: str) -> str:
    """The flag of an OperatorConfig field: timer_interval_seconds -> --timer-interval-seconds."""
    return "--" + field_name.replace("_", "-")


def add_tunables(p: argparse.ArgumentParser) -> None:
    """One flag per OperatorConfig field, its help and default from the field (unset: the default)."""
    group = p.add_argument_group("controller tunables (lists: comma-separated)")
    for f in dataclasses.fields(OperatorConfig):
        default = f.default
        parse = f.metadata["parse"]
        shown = ",".join(str(x) if isinstance(x, str) else f"{x:g}" for x in default) or "none" \
            if isinstance(default, tuple) else f"{default:g}" if isinstance(default, float) else default
        group.add_argument(flag(f.name), dest=f.name, type=parse, default=None,
                           metavar="N" if parse is int else "LIST" if parse is strings else "SECONDS",
                           help=f.metadata["help"] + ("" if default is None else f" (default: {shown})"))


def tunables(args: argparse.Namespace) -> OperatorConfig:
    """The OperatorConfig of the flags given; ValueError names a value out of range."""
    return OperatorConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(OperatorConfig)
                             if getattr(args, f.name, None) is not None})
