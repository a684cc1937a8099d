"""Leader election on a coordination.k8s.io/v1 Lease: exactly one operator replica acts.

Why our own loop and not kopf's peering: kopf's peering (KopfPeering objects) pauses the lower-priority
operators when it sees a higher-priority one, but it is not a lease: two operators that start together
both act until they have seen each other's heartbeat, and nothing stops a paused-too-late replica from
writing. This is the client-go algorithm, small enough to read in one sitting:

* A candidate takes the Lease when it is absent, released, or its holder has not renewed it for
  `lease_seconds` *as observed on the candidate's own clock* (no clock comparison across machines):
  the candidate remembers when it first saw the current record and waits `lease_seconds` from then.
* Writes of the Lease are optimistic (resourceVersion): two candidates cannot both win one term.
* The leader renews every `retry_seconds`. It counts itself leader only until `renew_deadline_seconds`
  after the start of its last successful renew; past that it stops (the process exits), which is
  `lease_seconds - renew_deadline_seconds` before any other replica can take over. So a deposed leader
  has stopped writing before a new one starts.

Failover after a leader dies without releasing: at most `lease_seconds + retry_seconds` (17 s by default);
a leader that stops cleanly releases the Lease and the standby takes over within `retry_seconds`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from v41flash.controller.kube import FIELD_MANAGER

log = logging.getLogger(__name__)

LEASE_NAME = "v41flash-operator"


def _now_micro() -> datetime:
    return datetime.now(timezone.utc)


class LeaderElector:
    def __init__(self, coordination: client.CoordinationV1Api, namespace: str, identity: str, *,
                 name: str = LEASE_NAME, lease_seconds: float = 15.0, renew_deadline_seconds: float = 10.0,
                 retry_seconds: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = _now_micro):
        if not retry_seconds < renew_deadline_seconds < lease_seconds:
            raise ValueError("need retry < renew deadline < lease duration")
        self.api, self.namespace, self.name, self.identity = coordination, namespace, name, identity
        self.lease_seconds, self.renew_deadline = lease_seconds, renew_deadline_seconds
        self.retry_seconds = retry_seconds
        self.clock, self.wall = clock, wall
        self._observed: tuple[str | None, Any] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # our clock when that record was first seen
        self._renewed_at: float | None = None  # our clock at the start of our last successful renew
        self._stop = threading.Event()

    # -- state
    def is_leading(self) -> bool:
        """True while our last successful renew is younger than the renew deadline: safe to write."""
        return self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline

    # -- one step
    def try_acquire_or_renew(self) -> bool:
        """One attempt; False on any failure (an apiserver away raises urllib3/OS errors, not ApiException:
        they must count as a failed renew, never end the loop)."""
        try:
            return self._try_acquire_or_renew()
        except Exception as exc:  # noqa: BLE001
            log.warning("leader election: Lease %s/%s unreachable: %s: %s", self.namespace, self.name,
                        type(exc).__name__, str(exc)[:200])
            return False

    def _try_acquire_or_renew(self) -> bool:
        started = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("leader election: cannot read Lease %s/%s: %s", self.namespace, self.name, exc.reason)
                return False
            return self._create(started)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or None
        record = (holder, spec.renew_time)
        if record != self._observed:
            self._observed, self._observed_at = record, started
        if holder and holder != self.identity:
            duration = spec.lease_duration_seconds or self.lease_seconds
            if started - self._observed_at < duration:
                return False  # held, and renewed within its duration as far as we have seen
        now = self.wall()
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(self.lease_seconds)
        lease.spec = spec
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, field_manager=FIELD_MANAGER)  # resourceVersion: optimistic
        except ApiException as exc:
            if exc.status not in (409, 422):
                log.warning("leader election: cannot renew Lease %s/%s: %s", self.namespace, self.name, exc.reason)
            return False
        if self._renewed_at is None or not self.is_leading():
            log.info("leader election: %s now holds Lease %s/%s", self.identity, self.namespace, self.name)
        self._renewed_at = started
        self._observed = (self.identity, now)
        return True

    def _create(self, started: float) -> bool:
        now = self.wall()
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                              spec=client.V1LeaseSpec(holder_identity=self.identity, acquire_time=now, renew_time=now,
                                                      lease_duration_seconds=int(self.lease_seconds),
                                                      lease_transitions=0))
        try:
            self.api.create_namespaced_lease(self.namespace, body, field_manager=FIELD_MANAGER)
        except ApiException as exc:
            if exc.status != 409:
                log.warning("leader election: cannot create Lease %s/%s: %s", self.namespace, self.name, exc.reason)
            return False
        log.info("leader election: %s created and holds Lease %s/%s", self.identity, self.namespace, self.name)
        self._renewed_at = started
        return True

    # -- loops
    def acquire(self) -> bool:
        """Block until we lead (True) or stop() was called (False)."""
        logged = False
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                return True
            if not logged:
                holder = self._observed[0] if self._observed else None
                log.info("leader election: standby; Lease %s/%s is held by %s", self.namespace, self.name, holder)
                logged = True
            self._stop.wait(self.retry_seconds)
        return False

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a thread; when the renew deadline passes without a successful renew, call on_lost once."""
        def loop() -> None:
            while not self._stop.is_set():
                self.try_acquire_or_renew()
                if self._stop.is_set():
                    return
                if not self.is_leading():
                    log.error("leader election: lost Lease %s/%s (no renew within %.0f s); stopping",
                              self.namespace, self.name, self.renew_deadline)
                    on_lost()
                    return
                self._stop.wait(self.retry_seconds)  # retry < renew deadline: a failed renew gets retries
        t = threading.Thread(target=loop, name="leader-election", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Hand the Lease back (clean shutdown) so a standby takes over at its next retry, not after expiry."""
        self._stop.set()
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, field_manager=FIELD_MANAGER)
                log.info("leader election: released Lease %s/%s", self.namespace, self.name)
        except ApiException as exc:
            log.warning("leader election: could not release Lease %s/%s: %s", self.namespace, self.name, exc.reason)
