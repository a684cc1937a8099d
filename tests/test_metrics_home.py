"""Every Prometheus series the operator process exports has one home, v41flash.controller.metrics (issue 38): no
other module of the package constructs a prometheus_client metric (Counter, Gauge, Histogram, Summary, Info, Enum)
or a metric family (what a custom collector yields: CounterMetricFamily, ...), whatever name it imports it under.

The package holds the code of three processes that export series (the CLI's subcommands, cli/main.py):

* the operator (`v41flash operator`): the controller and everything it imports (metrics/, planner/, render/,
  health/, ...). Its series are the home's, on prometheus_client's default registry (the planner's through
  PlannerMetrics, which takes a registry so that a test can give it a fresh one);
* the session proxy (`v41flash session-proxy`): proxy/session_proxy.py, its own CollectorRegistry, served on its own
  /proxy/metrics;
* the front's counters (`v41flash front-counters`): front/counters.py, a collector over Envoy's stats on its own
  registry.

The last two are other processes with their own pages and series, so exactly those two modules are exempt, not
their packages: the operator imports proxy/revisions.py and front/envoy.py (the renderer), and those construct
nothing. The exemption holds only while the operator's command never imports the two modules, which
test_the_exempt_modules_are_not_the_operators checks (cli/proxy.py and cli/front.py import them inside the command
that runs them).
"""
from __future__ import annotations

import ast

import prometheus_client
import prometheus_client.core
import prometheus_client.metrics
import prometheus_client.metrics_core

from test_layering import import_chain, modules

HOME = "v41flash.controller.metrics"
OTHER_PROCESSES = ("v41flash.proxy.session_proxy", "v41flash.front.counters")
OPERATOR_COMMAND = "v41flash.cli.operator"

METRIC_CLASSES = frozenset(
    name for mod in (prometheus_client, prometheus_client.core, prometheus_client.metrics,
                     prometheus_client.metrics_core)
    for name, obj in vars(mod).items()
    if isinstance(obj, type) and issubclass(obj, (prometheus_client.metrics.MetricWrapperBase,
                                                  prometheus_client.metrics_core.Metric)))


def metric_constructions(source: str) -> list[str]:
    """`line: call` for each call of a prometheus_client metric class: a name imported from prometheus_client (or a
    module of it), or an attribute of such a module."""
    tree = ast.parse(source)
    classes: dict[str, str] = {}  # local name -> metric class
    modules_: set[str] = set()  # local names of prometheus_client and its modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules_ |= {(a.asname or a.name).split(".")[0] for a in node.names
                         if a.name.split(".")[0] == "prometheus_client"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "prometheus_client":
            for a in node.names:
                if a.name in METRIC_CLASSES:
                    classes[a.asname or a.name] = a.name
                else:
                    modules_.add(a.asname or a.name)  # a module of it, or something that is no metric class
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in classes:
            found.append(f"{node.lineno}: {f.id}(...)")
        elif isinstance(f, ast.Attribute) and f.attr in METRIC_CLASSES:
            root = f.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules_:
                found.append(f"{node.lineno}: {ast.unparse(f)}(...)")
    return sorted(found, key=lambda s: int(s.split(":")[0]))


def test_only_the_home_constructs_the_operators_metrics():
    assert HOME in modules() and all(m in modules() for m in OTHER_PROCESSES)
    stray = {m: found for m, path in modules().items() if m != HOME and m not in OTHER_PROCESSES
             if (found := metric_constructions(path.read_text()))}
    assert stray == {}, f"Prometheus metrics constructed outside {HOME} (define them there and import them)"


def test_the_exempt_modules_are_not_the_operators():
    chain = import_chain(OPERATOR_COMMAND, OTHER_PROCESSES)
    assert chain is None, "the operator imports another process's metrics module: " + " -> ".join(map(str, chain))


def test_the_check_catches_a_construction_under_any_name():
    source = ("import prometheus_client as pc\n"
              "import prometheus_client.core\n"
              "from collections import Counter\n"
              "from prometheus_client import Gauge as G, REGISTRY, metrics_core\n"
              "from prometheus_client.core import GaugeMetricFamily\n"
              "X = G('a', 'b', registry=REGISTRY)\n"
              "n = Counter('abc')\n"
              "def f():\n"
              "    pc.Histogram('h', 'd')\n"
              "    prometheus_client.core.Summary('s', 'd')\n"
              "    metrics_core.CounterMetricFamily('c', 'd')\n"
              "    return GaugeMetricFamily('g', 'd')\n")
    assert metric_constructions(source) == [
        "6: G(...)", "9: pc.Histogram(...)", "10: prometheus_client.core.Summary(...)",
        "11: metrics_core.CounterMetricFamily(...)", "12: GaugeMetricFamily(...)"]
    assert metric_constructions("from prometheus_client import start_http_server\nstart_http_server(1)\n") == []
