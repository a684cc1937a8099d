"""Leader election on a Lease, against an in-memory coordination API with optimistic concurrency and a
controlled clock: one holder at a time, takeover only after the holder's lease ran out on the candidate's
own clock, a deposed leader stops counting itself leader before anyone else may start, a clean release
hands over at once."""
from __future__ import annotations

import copy

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from v41flash.controller.leader import LeaderElector


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class FakeCoordination:
    def __init__(self):
        self.lease: client.V1Lease | None = None
        self.rv = 0
        self.down = False
        self.writes: list[str] = []

    def _check(self):
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")

    def read_namespaced_lease(self, name, namespace):
        self._check()
        if self.lease is None:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.lease)

    def create_namespaced_lease(self, namespace, body, field_manager=None):
        self._check()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.rv += 1
        body.metadata.resource_version = str(self.rv)
        self.lease = copy.deepcopy(body)
        self.writes.append(body.spec.holder_identity)

    def replace_namespaced_lease(self, name, namespace, body, field_manager=None):
        self._check()
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.rv += 1
        body.metadata.resource_version = str(self.rv)
        self.lease = copy.deepcopy(body)
        self.writes.append(body.spec.holder_identity)


@pytest.fixture
def world():
    api, clock = FakeCoordination(), Clock()
    make = lambda ident: LeaderElector(api, "ns", ident, clock=clock)  # noqa: E731
    return api, clock, make


def test_one_holder_and_the_standby_waits_while_it_renews(world):
    api, clock, make = world
    a, b = make("a"), make("b")
    assert a.try_acquire_or_renew() and a.is_leading()
    for _ in range(20):  # 40 s of renewals every 2 s: b never gets in
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew() and not b.is_leading()
    assert set(api.writes) == {"a"}


def test_a_dead_leader_is_replaced_after_the_lease_and_not_before(world):
    api, clock, make = world
    a, b = make("a"), make("b")
    assert a.try_acquire_or_renew()
    last_renew = clock.t
    assert not b.try_acquire_or_renew()  # b first sees a's record now
    clock.t += 14.9
    assert not b.try_acquire_or_renew()
    clock.t += 0.2
    assert b.try_acquire_or_renew() and b.is_leading()
    assert api.lease.spec.holder_identity == "b" and api.lease.spec.lease_transitions == 1
    # a's own view: its term ended at last_renew + renew deadline, before b could take over
    assert not a.is_leading()
    assert last_renew + a.renew_deadline < clock.t


def test_a_leader_cut_off_from_the_apiserver_stops_before_a_standby_can_start(world):
    api, clock, make = world
    a, b = make("a"), make("b")
    assert a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b watches
    api.down = True  # a cannot renew (b cannot read either)
    stopped_at = None
    for _ in range(100):
        clock.t += 0.5
        a.try_acquire_or_renew()
        if stopped_at is None and not a.is_leading():
            stopped_at = clock.t
        if clock.t > 1012:
            api.down = False  # the apiserver is back for b (a is partitioned in our story: it stopped trying)
            break
    assert stopped_at is not None
    started_at = None
    while started_at is None:
        clock.t += 0.5
        if b.try_acquire_or_renew():
            started_at = clock.t
    assert stopped_at < started_at  # never two writers


def test_a_clean_release_hands_over_at_the_next_retry(world):
    api, clock, make = world
    a, b = make("a"), make("b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leading()
    clock.t += 2
    assert b.try_acquire_or_renew()


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win(world):
    api, clock, make = world
    a, b, c = make("a"), make("b"), make("c")
    assert a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    c.try_acquire_or_renew()
    clock.t += 16
    read = api.read_namespaced_lease
    seen = read("v41flash-operator", "ns")
    api.read_namespaced_lease = lambda *a_: copy.deepcopy(seen)  # both read the same version
    won = [b.try_acquire_or_renew(), c.try_acquire_or_renew()]
    assert won.count(True) == 1


def test_the_same_identity_after_a_restart_takes_its_lease_back_at_once(world):
    api, clock, make = world
    assert make("pod-0").try_acquire_or_renew()
    clock.t += 1
    assert make("pod-0").try_acquire_or_renew()  # a restarted container of the same pod


def test_parameters_must_leave_a_gap():
    with pytest.raises(ValueError):
        LeaderElector(FakeCoordination(), "ns", "a", lease_seconds=10, renew_deadline_seconds=10)


def test_an_unreachable_apiserver_is_a_failed_renew_and_the_term_ends(world):
    """Connection errors (urllib3 raises them, not ApiException) must not kill the renew loop: the leader
    notices its deadline pass and steps down (the process re-executes) instead of lingering fenced."""
    import urllib3

    api, clock, make = world
    a = make("a")
    assert a.try_acquire_or_renew()

    def refused(*_a, **_k):
        raise urllib3.exceptions.MaxRetryError(None, "/lease", "connection refused")
    api.read_namespaced_lease = refused
    clock.t += 11
    assert a.try_acquire_or_renew() is False and not a.is_leading()
    lost = []
    a.retry_seconds = 0.01
    thread = a.keep(on_lost=lambda: lost.append(True))
    thread.join(5)
    assert lost == [True]
