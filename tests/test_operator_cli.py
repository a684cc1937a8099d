"""`v41flash operator --kubeconfig PATH` with no KUBECONFIG in the environment: the kubernetes library reads
that variable once, at import, so the operator must pass the path itself, to its own client and to kopf's
login (the e2e suite runs the operator exactly so: tests in e2e/test_operator.py)."""
from __future__ import annotations

import logging
from dataclasses import fields

import kopf
import pytest
import yaml

from v41flash.cli.main import build_parser
from v41flash.cli.operator import flag, tunables
from v41flash.controller import handlers
from v41flash.controller.config import OperatorConfig
from v41flash.controller.kube import Kube, TimeoutApiClient, load_config
from v41flash.controller.runtime import Runtime

REQUEST_TIMEOUT = OperatorConfig().request_timeout_seconds


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
    memo = kopf.Memo(runtime=Runtime(kube=Kube(api_client)))  # as cli/operator.py hands it to kopf.run
    info = handlers.login(settings=kopf.OperatorSettings(), memo=memo, logger=logging.getLogger("t"))
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


def test_every_tunable_is_a_flag_with_its_default_and_help(capsys):
    assert tunables(build_parser().parse_args(["operator"])) == OperatorConfig()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--help"])
    shown = capsys.readouterr().out
    assert all(flag(f.name) in shown for f in fields(OperatorConfig))
    assert "(default: 15)" in shown and "(default: 2,4,8,16,32,64,128,300)" in shown
    args = build_parser().parse_args(["operator", "--timer-interval-seconds", "3", "--pass-workers", "8",
                                      "--backoff-seconds", "1,2.5", "--request-timeout-seconds=2,10"])
    assert tunables(args) == OperatorConfig(timer_interval_seconds=3.0, pass_workers=8, backoff_seconds=(1.0, 2.5),
                                            request_timeout_seconds=(2.0, 10.0))
    assert tunables(build_parser().parse_args(["operator", "--drift-every", "6"])).drift_recent_ticks == 3


@pytest.mark.parametrize("argv,named", [
    (["--urgent-workers", "16"], "reserved"),  # of 16 pass workers: none left for the rest
    (["--timer-interval-seconds", "0"], "timer_interval_seconds"),
    (["--request-timeout-seconds", "5"], "request_timeout_seconds"),
    (["--backoff-seconds", "2,-1"], "backoff_seconds"),
])
def test_a_tunable_out_of_range_is_refused_by_name(argv, named):
    with pytest.raises(ValueError, match=named):
        tunables(build_parser().parse_args(["operator", *argv]))


def test_the_client_takes_its_pool_and_deadline_from_the_tunables(kubeconfig, monkeypatch):
    api_client = load_config(str(kubeconfig), OperatorConfig(connection_pool=7, request_timeout_seconds=(1, 2)))
    assert api_client.configuration.connection_pool_maxsize == 7
    seen = []
    monkeypatch.setattr(api_client.rest_client, "request", lambda *a, **kw: seen.append(kw["_request_timeout"]))
    api_client.call_api("GET", "https://127.0.0.1:6443/api")
    kube = Kube(api_client, OperatorConfig(apply_workers=3, urgent_apply_workers=5, request_timeout_seconds=(1, 2)))
    assert seen == [(1, 2)] and kube.request_timeout == (1, 2)
    assert (kube._shared_pool._max_workers, kube._urgent_pool._max_workers) == (3, 5)


def test_the_operator_client_has_every_api_it_uses(kubeconfig):
    kube = Kube(load_config(str(kubeconfig)))
    assert kube.core.api_client is kube.api_client and kube.custom.api_client is kube.api_client
    assert callable(kube.apply) and callable(kube.patch_status)
