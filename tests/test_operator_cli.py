"""`v41flash operator --kubeconfig PATH` with no KUBECONFIG in the environment: the kubernetes library reads
that variable once, at import, so the operator must pass the path itself, to its own client and to kopf's
login (the e2e suite runs the operator exactly so: tests in e2e/test_operator.py)."""
from __future__ import annotations

import logging

import kopf
import pytest
import yaml

from v41flash.cli.main import build_parser
from v41flash.controller import handlers
from v41flash.controller.kube import REQUEST_TIMEOUT, Kube, TimeoutApiClient, load_config


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config to fall back on
    path = tmp_path / "cluster.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_the_flag_alone_configures_the_client_and_kopf(kubeconfig, monkeypatch):
    api_client = load_config(str(kubeconfig))
    assert isinstance(api_client, TimeoutApiClient)
    assert api_client.configuration.host == "https://127.0.0.1:6443"
    monkeypatch.setattr(handlers, "_kube", Kube(api_client))
    info = handlers.login(settings=kopf.OperatorSettings(), logger=logging.getLogger("t"))
    assert info.server == "https://127.0.0.1:6443" and info.token == "t0ken" and info.insecure


def test_every_request_carries_a_timeout(kubeconfig, monkeypatch):
    api_client = load_config(str(kubeconfig))
    seen = []
    monkeypatch.setattr(api_client.rest_client, "request", lambda *a, **kw: seen.append(kw["_request_timeout"]))
    api_client.call_api("GET", "https://127.0.0.1:6443/api")
    api_client.call_api("GET", "https://127.0.0.1:6443/api", _request_timeout=3)
    assert seen == [REQUEST_TIMEOUT, 3]


def test_leader_election_is_on_by_default():
    args = build_parser().parse_args(["operator", "--kubeconfig", "x"])
    assert args.leader_elect and args.kubeconfig == "x"
    assert not build_parser().parse_args(["operator", "--no-leader-elect"]).leader_elect


def test_the_operator_client_has_every_api_it_uses(kubeconfig):
    kube = Kube(load_config(str(kubeconfig)))
    assert kube.core.api_client is kube.api_client and kube.custom.api_client is kube.api_client
    assert callable(kube.apply) and callable(kube.patch_status)
