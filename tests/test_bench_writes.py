"""Telling a field manager's writes from the rest between two snapshots (the idle-writes figure)."""
from __future__ import annotations

import copy
import time

import pytest

from v41flash_bench.writes import changed_paths, snapshot, summary, writes_by

OP = "v41flash-operator"


def obj(kind="V41FlashDeployment", name="a", rv="1", entries=(), **rest):
    return {"kind": kind, "metadata": {"name": name, "resourceVersion": rv, "managedFields": list(entries)}, **rest}


def entry(manager, time, sub="", fields=None):
    return {"manager": manager, "operation": "Update", "subresource": sub, "time": time,
            "fieldsV1": fields or {"f:status": {}}}


def test_a_status_write_of_ours_is_a_write_and_says_what_moved():
    before = obj(rv="1", entries=[entry(OP, "t1", "status")],
                 status={"conditions": [{"type": "Ready", "message": "a"}, {"type": "Stalled", "message": "x"}]})
    after = copy.deepcopy(before)
    after["metadata"].update(resourceVersion="2", managedFields=[entry(OP, "t2", "status")])
    after["status"]["conditions"][0]["message"] = "b"
    (w,) = writes_by(OP, snapshot([before]), snapshot([after]))
    assert w.key == "V41FlashDeployment/a" and w.paths == (".status.conditions.Ready.message",)
    assert summary([w]) == {"V41FlashDeployment .status.conditions.Ready.message": 1}


def test_another_manager_s_write_a_no_op_and_a_deletion_are_not_ours():
    mine = entry(OP, "t1", fields={"f:spec": {}})
    before = {"Deployment/d": obj("Deployment", "d", "1", [mine, entry("kube-controller-manager", "t1", "status")]),
              "Service/s": obj("Service", "s", "5", [mine]), "ConfigMap/c": obj("ConfigMap", "c", "7", [mine])}
    after = copy.deepcopy(before)
    after["Deployment/d"]["metadata"].update(resourceVersion="2",
                                             managedFields=[mine, entry("kube-controller-manager", "t2", "status")])
    del after["ConfigMap/c"]
    assert writes_by(OP, before, after) == []


def test_a_new_object_counts_only_when_the_manager_made_it():
    after = snapshot([obj("Event", "e1", "3", [entry(OP, "t1", fields={"f:message": {}})], reason="Applied"),
                      obj("Event", "e2", "4", [entry("kopf", "t1")]), obj("ConfigMap", "c", "5", [entry(OP, "t1")])])
    assert [(w.key, w.paths) for w in writes_by(OP, {}, after)] == [("ConfigMap/c", (".",)),
                                                                      ("Event/e1", ("reason=Applied",))]


def test_changed_paths_ignore_bookkeeping_and_name_list_entries():
    a = {"metadata": {"resourceVersion": "1", "labels": {"x": "1"}}, "spec": {"ports": [{"name": "http", "port": 1}]}}
    b = {"metadata": {"resourceVersion": "2", "labels": {"x": "2"}}, "spec": {"ports": [{"name": "http", "port": 2}]}}
    assert changed_paths(a, b) == [".metadata.labels.x", ".spec.ports.http.port"]
    assert changed_paths(a, a) == []


def test_settle_waits_out_other_writers_but_not_the_manager_itself():
    from v41flash_bench.writes import settle
    takes = []

    def take():
        i = len(takes)
        takes.append(i)
        rv = str(min(i, 3))  # the controller-manager writes the Deployment until the 4th snapshot
        deploy = obj("Deployment", "d", rv, [entry("kube-controller-manager", rv, "status")])
        cr = obj("V41FlashDeployment", "a", str(100 + i), [entry(OP, str(i), "status")])  # ours moves every time
        return snapshot([deploy, cr])
    settle(take, OP, quiet_s=0.05, sample_s=0.01, timeout=5)
    assert len(takes) >= 4  # not before the other writer stopped
    with pytest.raises(RuntimeError, match="without other writers"):
        settle(lambda: snapshot([obj("Deployment", "d", str(time.monotonic()),
                                     [entry("kube-controller-manager", str(time.monotonic()))])]),
               OP, quiet_s=0.05, sample_s=0.01, timeout=0.2)
