"""`v41flash operator`: run the controller (kopf) against the cluster in KUBECONFIG or in-cluster."""
from __future__ import annotations

import argparse
import logging
import os


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login and the kubernetes client both read it
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON if args.log_format == "json"
                   else kopf.LogFormat.FULL)
    from ..controller import handlers  # importing registers the kopf handlers
    from ..controller.kube import Kube, load_config

    handlers._kube = Kube(load_config(args.kubeconfig))
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
        logging.getLogger("v41flash").info("metrics on %s:%d/metrics", args.bind_address, args.metrics_port)
    namespaces = args.namespace or []
    kopf.run(
        standalone=True,  # one active replica (the chart runs one with a Recreate strategy)
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{args.bind_address}:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="run the operator (reconciles V41FlashDeployments)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    p.add_argument("-n", "--namespace", action="append",
                   help="namespace to watch (repeatable); default: all namespaces")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0 = off)")
    p.add_argument("--health-port", type=int, default=8081, help="liveness endpoint port (0 = off)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address for metrics and health endpoints")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="log format")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_operator)
