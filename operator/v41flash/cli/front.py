"""`v41flash front-counters`: the front pod's counters from Envoy's stats (v41flash.front.counters).

The parser lives here so that other commands do not import aiohttp; the module is loaded only when it runs.
"""
from __future__ import annotations

import argparse

from v41flash.front.envoy import ADMIN_PORT, COUNTERS_PORT


def _run(args: argparse.Namespace) -> int:
    from v41flash.front.counters import run_cli
    return run_cli(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("front-counters", help="the front's counters (/proxy/metrics) from Envoy's stats",
                       description="Serves GET /proxy/metrics: the front's request counters, read from the Envoy "
                                   "admin API on loopback at each scrape.")
    p.add_argument("--listen", default=f"127.0.0.1:{COUNTERS_PORT}", metavar="HOST:PORT")
    p.add_argument("--admin", default=f"127.0.0.1:{ADMIN_PORT}", metavar="HOST:PORT",
                   help="Envoy's admin address")
    p.set_defaults(func=_run)


