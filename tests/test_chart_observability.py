"""Observability assets of the chart: the Grafana dashboard, the PrometheusRule, the Service/PodMonitors.

* The dashboard JSON loads and has Grafana's structure (panels with datasource, targets, grid positions;
  every variable it uses is defined) and the ConfigMap ships it unchanged.
* Every metric a rule or panel reads exists: v41flash_* names are checked against what the operator's code
  registers in prometheus_client, vllm:* names against vLLM 0.33.0's (the names the scraper parses).
* The rule file and every dashboard expression pass `promtool check rules` (promtool, pinned in
  e2e/versions.env, built by `bash e2e/build-tools.sh promtool`; absent: skipped locally, failed under CI), and
  `promtool test rules` proves the alerts fire on the series they are meant for and stay quiet otherwise.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from prereq import require_tool, tool_cache, versions
from test_chart import CHART, REPO, by_kind, helm, template  # noqa: F401  (helm is a fixture)
from v41flash.controller import handlers  # noqa: F401  (its import registers the reconcile metrics)
from v41flash.metrics import parse as vllm_names
from v41flash.controller.metrics import planner_metrics
from v41flash.render import render
from v41flash.api import v1alpha1 as api

DASHBOARD = CHART / "files" / "dashboard.json"
PROMTOOL_VERSION = versions()["PROMTOOL_VERSION"]
ON = ["--set", "prometheusRule.enabled=true", "--set", "dashboard.enabled=true", "--set", "serviceMonitor.enabled=true",
      "--set", "podMonitor.enabled=true"]


def promtool() -> Path:
    return require_tool(tool_cache() / f"promtool-{PROMTOOL_VERSION}" / "promtool", "bash e2e/build-tools.sh promtool")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def exprs(d: dict) -> list[str]:
    return [t["expr"] for p in panels(d) for t in p.get("targets", [])]


def rule_groups(helm_path) -> list[dict]:
    (rule,) = by_kind(template(helm_path, *ON), "PrometheusRule")
    return rule["spec"]["groups"]


# --- Dashboard ---------------------------------------------------------------------------------------------

def test_dashboard_is_grafana_json_with_datasource_and_targets_on_every_panel():
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "namespace", "deployment"} <= variables
    for p in panels(d):
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip()
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in variables or var.startswith("__"), f"{p['title']}: undefined ${var}"
    repeated = [p for p in d["panels"] if p.get("repeat")]
    assert [p["repeat"] for p in repeated] == ["deployment"]  # one row of panels per deployment


def test_dashboard_covers_what_a_deployment_owner_asks():
    titles = " | ".join(p["title"] for p in panels(dashboard())).lower()
    for topic in ("ttft vs target", "p95 end-to-end latency vs target", "replicas per role", "planner decisions",
                  "prefix-cache hit rate", "tokens per second"):
        assert topic in titles


def test_dashboard_configmap_ships_the_file_unchanged(helm):
    cms = [o for o in by_kind(template(helm, *ON), "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    (cm,) = cms
    assert json.loads(cm["data"]["v41flash.json"]) == dashboard()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


# --- Metric names ------------------------------------------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads: identifiers outside label matchers, grouping clauses and strings that
    are not function or aggregation calls."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # a number's exponent or a duration unit
        names.add(m.group(0))
    return names


def test_metric_name_extraction():
    assert metric_names('sum by (role, le) (rate(vllm:ttft_bucket{a="b", c=~"d|e"}[5m])) > 1e-9') == {"vllm:ttft_bucket"}
    assert metric_names("max by (namespace) (a) > on (namespace) group_left b unless c == 0") == {"a", "b", "c"}
    assert metric_names('absent(up{job="x"} == 1)') == {"up"}


def operator_metric_names() -> set[str]:
    from prometheus_client import REGISTRY
    planner_metrics()  # the planner registers its metrics on first use; handlers' register at import
    return {n for n in REGISTRY._names_to_collectors if n.startswith("v41flash_")}


def vllm_metric_names() -> set[str]:
    """vLLM 0.33.0's series as exposed: histograms as _bucket/_sum/_count, counters with _total."""
    hist = {vllm_names.TTFT, vllm_names.ITL, vllm_names.QUEUE, vllm_names.PROMPT_LEN, vllm_names.GEN_LEN,
            "vllm:e2e_request_latency_seconds", "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds"}
    counters = {vllm_names.PROMPT_TOKENS, vllm_names.GEN_TOKENS, vllm_names.PREFIX_HITS, vllm_names.PREFIX_QUERIES,
                vllm_names.SUCCESS, vllm_names.PREEMPTIONS, "vllm:prompt_tokens_cached"}
    gauges = {vllm_names.RUNNING, vllm_names.WAITING, vllm_names.KV_USAGE}
    return ({f"{h}{s}" for h in hist for s in ("_bucket", "_sum", "_count")} | {f"{c}_total" for c in counters}
            | gauges)


def _metrics_read(helm_path) -> set[str]:
    groups = rule_groups(helm_path)
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    read = set()
    for e in [r["expr"] for g in groups for r in g["rules"]] + exprs(dashboard()):
        read |= metric_names(e)
    return read - recorded


def test_every_metric_read_by_rules_and_dashboard_exists(helm):
    missing = _metrics_read(helm) - (operator_metric_names() | vllm_metric_names() | {"up"})
    assert missing == set(), "rules/dashboard read metrics nobody exposes"


def test_podmonitor_selects_the_pods_the_renderer_makes_on_the_ports_they_have(helm):
    """Each pod the renderer makes is scraped, and only where it serves the path: the engines' /metrics, each slot
    router's vllm-router on `metrics`, the front's session proxy on /proxy/metrics (a PodMonitor endpoint targets
    only pods with a container port of its name; the role and component relabelings pick the rest)."""
    (pm,) = by_kind(template(helm, *ON), "PodMonitor")
    selector = pm["spec"]["selector"]["matchLabels"]
    endpoints = [(ep["port"], ep["path"], ep["relabelings"][0]["regex"], ep["relabelings"][1]["regex"])
                 for ep in pm["spec"]["podMetricsEndpoints"]]
    # the planner's leading signals come from the session proxy: with source Prometheus it must be scraped too
    assert ("http", "/proxy/metrics", "router", "router") in endpoints
    example = next((REPO / "manifests" / "examples").glob("*.yaml"))
    obj = api.V41FlashDeployment.model_validate(yaml.safe_load(example.read_text()))
    scraped_by = {}
    for o in render(obj, owner={"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "x", "uid": "u"}):
        if o["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        tmpl = o["spec"]["template"] if o["kind"] == "Deployment" else o["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        labels = tmpl["metadata"]["labels"]
        assert selector.items() <= labels.items(), o["metadata"]["name"]
        role, component = labels["v41flash.io/role"], labels["app.kubernetes.io/component"]
        ports = {p["name"] for c in tmpl["spec"]["containers"] for p in c.get("ports", [])}
        scraped_by[o["metadata"]["name"]] = [(port, path) for port, path, roles, components in endpoints
                                             if re.fullmatch(roles, role) and re.fullmatch(components, component)
                                             and port in ports]
    name = obj.metadata["name"]
    assert scraped_by.pop(f"{name}-router") == [("http", "/proxy/metrics")]  # the front: the session proxy
    assert scraped_by.pop(f"{name}-router-0") == [("metrics", "/metrics")]  # slot "": vllm-router
    assert scraped_by and all(v == [("http", "/metrics")] for v in scraped_by.values()), scraped_by  # engines


# --- Rules -------------------------------------------------------------------------------------------------

def test_rules_are_well_formed(helm):
    for g in rule_groups(helm):
        for r in g["rules"]:
            assert ("record" in r) != ("alert" in r)
            if "alert" in r:
                assert r["labels"]["severity"] in ("warning", "critical")
                assert r["annotations"]["summary"] and r["annotations"]["description"]
                assert re.fullmatch(r"\d+[smh]", r["for"])


def _run_promtool(*args: str, cwd: Path) -> None:
    r = subprocess.run([str(promtool()), *args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_checks_the_rules_and_every_dashboard_expression(helm, tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(helm)}))
    # Dashboard queries as recording rules, with Grafana's variables replaced by what Grafana would send.
    subst = {"$__rate_interval": "5m", "$namespace": "team-a", "$deployment": "chat"}
    queries = []
    for i, e in enumerate(exprs(dashboard())):
        for k, v in subst.items():
            e = e.replace(k, v)
        queries.append({"record": f"dashboard:query_{i}", "expr": e})
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}))
    _run_promtool("check", "rules", "rules.yaml", "dashboard.yaml", cwd=tmp_path)


def _alert_tests() -> list[dict]:
    """promtool unit tests: each alert fires on the series it is for, after its `for`, and not otherwise."""
    dep = {"namespace": "team-a", "deployment": "chat"}
    sel = lambda labels: "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"  # noqa: E731
    return [
        {"interval": "1m", "input_series": [
            {"series": f'v41flash_deployment_stalled{sel({"namespace": "team-a", "name": "chat"})}', "values": "1x40"},
            {"series": f'v41flash_deployment_stalled{sel({"namespace": "team-a", "name": "fine"})}', "values": "0x40"},
            {"series": f'v41flash_deployment_ready{sel({"namespace": "team-a", "name": "chat"})}', "values": "0x40"},
            {"series": f'v41flash_deployment_ready{sel({"namespace": "team-a", "name": "fine"})}', "values": "0x40"}],
         "alert_rule_test": [
            {"eval_time": "3m", "alertname": "V41FlashDeploymentStalled", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "V41FlashDeploymentStalled", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": "team-a", "name": "chat"}}]},
            # Not Ready for 30m: only the one that is not Stalled (Stalled has its own alert).
            {"eval_time": "35m", "alertname": "V41FlashDeploymentNotReady", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": "team-a", "name": "fine"}}]}]},
        {"interval": "1m", "input_series": [
            {"series": f'v41flash_planner_slo_breached{sel({**dep, "role": "prefill"})}', "values": "1x30"},
            {"series": f'v41flash_planner_slo_breached{sel({**dep, "role": "decode"})}', "values": "0x30"},
            {"series": f'v41flash_planner_clamped_decisions_total{sel({**dep, "role": "prefill"})}', "values": "0+1x30"}],
         "alert_rule_test": [
            {"eval_time": "5m", "alertname": "V41FlashSLOBreach", "exp_alerts": []},
            {"eval_time": "15m", "alertname": "V41FlashSLOBreach", "exp_alerts": [
                {"exp_labels": {"severity": "warning", **dep, "role": "prefill"}}]},
            {"eval_time": "15m", "alertname": "V41FlashSLOBreachCapped", "exp_alerts": [
                {"exp_labels": {"severity": "critical", **dep, "role": "prefill"}}]}]},
        {"interval": "1m", "input_series": [
            {"series": 'v41flash_reconciles_total{trigger="timer", result="ok"}', "values": "0+10x40"},
            {"series": 'v41flash_reconciles_total{trigger="timer", result="error"}', "values": "0+5x40"},
            {"series": 'up{job="v41flash-operator-metrics", namespace="v41flash-system"}', "values": "1x10 0x30"}],
         "alert_rule_test": [
            {"eval_time": "30m", "alertname": "V41FlashReconcileErrors", "exp_alerts": [
                {"exp_labels": {"severity": "warning"}}]},
            {"eval_time": "12m", "alertname": "V41FlashOperatorDown", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "V41FlashOperatorDown", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "job": "v41flash-operator-metrics",
                                "namespace": "v41flash-system"}}]}]},
        {"interval": "1m", "input_series": [
            {"series": 'v41flash_reconciles_total{trigger="timer", result="ok"}', "values": "0+100x40"},
            {"series": 'v41flash_reconciles_total{trigger="timer", result="error"}', "values": "0+1x40"},
            {"series": 'up{job="v41flash-operator-metrics", namespace="v41flash-system"}', "values": "1x40"}],
         "alert_rule_test": [
            {"eval_time": "30m", "alertname": "V41FlashReconcileErrors", "exp_alerts": []},
            {"eval_time": "30m", "alertname": "V41FlashOperatorDown", "exp_alerts": []}]},
        # Never scraped at all (no ServiceMonitor match, pod never started) is down too.
        {"interval": "1m", "input_series": [{"series": 'up{job="something-else", namespace="x"}', "values": "1x20"}],
         "alert_rule_test": [
            {"eval_time": "10m", "alertname": "V41FlashOperatorDown", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "job": "v41flash-operator-metrics",
                                "namespace": "v41flash-system"}}]}]},
    ]


def test_promtool_alerts_fire_when_they_should(helm, tmp_path):
    groups = rule_groups(helm)
    for g in groups:  # annotations are templates checked above; the unit tests compare labels only
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": _alert_tests()}))
    _run_promtool("test", "rules", "tests.yaml", cwd=tmp_path)
