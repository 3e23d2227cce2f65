"""Leader election with a ``coordination.k8s.io/v1`` Lease.

The algorithm is the usual one: the holder renews ``spec.renewTime`` every ``retry_period_s``;
another candidate takes the lease over only after it has seen the same lease record unchanged
for ``lease_duration_s`` of its *own* monotonic clock (so clock skew between replicas does not
matter). Every change is an update with the lease's resourceVersion, so two candidates can
never both win the same round. A leader that cannot renew for ``renew_deadline_s`` stops
leading before anyone else may take over (``renew_deadline_s < lease_duration_s``). On a clean
shutdown the leader releases the lease so a standby takes over at once.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """Campaigns for one Lease; ``is_leader`` says whether this process may write."""

    def __init__(
        self,
        kube: KubeRest,
        namespace: str,
        name: str,
        identity: str | None = None,
        *,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_change = on_change
        #: Measures the lease, the renew deadline and the retry period.
        self._clock = clock
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str, str] = ("", "")
        self._observed_at = 0.0
        self._last_renew = 0.0

    @property
    def is_leader(self) -> bool:
        """Whether this process holds the lease right now.

        Bounded by time as well: false once ``renew_deadline_s`` has passed since the start of
        the last successful renewal, even while a renewal request is still hanging (a stalled
        API connection must not keep a replica writing after another may have taken over).
        """
        return (
            self._leader.is_set()
            and self._clock.monotonic() - self._last_renew < self.renew_deadline_s
        )

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this process leads (or ``timeout``)."""
        return self._leader.wait(timeout)

    def start(self) -> None:
        """Campaign in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning and release the lease if held.

        Leadership ends before the release: once the lease is free a standby may take it at
        once, and this process must not count as leader by then.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._leader.is_set():
            self._set_leader(False)
            self._release()

    def run(self) -> None:
        """Try to acquire or renew every ``retry_period_s`` until stopped."""
        while not self._stop.is_set():
            # The lease counts from before the request: the server may have stored the renewal
            # at any moment of it, and a standby measures the lease from when it sees it.
            attempt = self._clock.monotonic()
            try:
                ok = self._try_acquire_or_renew()
            except KubeApiError as exc:
                log.warning("leader election: %s", exc)
                ok = False
            now = self._clock.monotonic()
            if ok:
                self._last_renew = attempt
                self._set_leader(True)
            elif self._leader.is_set() and now - self._last_renew >= self.renew_deadline_s:
                log.warning("leader election: could not renew for %.0fs", self.renew_deadline_s)
                self._set_leader(False)
            self._clock.wait(self._stop, self.retry_period_s)

    def _set_leader(self, leading: bool) -> None:
        if leading == self._leader.is_set():
            return
        if leading:
            self._leader.set()
            log.info("leader election: %s is now the leader", self.identity)
        else:
            self._leader.clear()
            log.info("leader election: %s stopped leading", self.identity)
        if self.on_change is not None:
            self.on_change(leading)

    def _path(self, name: str | None = None) -> str:
        return resource_path("coordination.k8s.io", "v1", "leases", self.namespace, name)

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        now = _now_micro()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration_s)),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _try_acquire_or_renew(self) -> bool:
        try:
            lease = self.kube.get(self._path(self.name), expected=(404,))
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0),
            }
            try:
                self.kube.request("POST", self._path(), body=body)
            except KubeApiError as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime", "")))
        now = self._clock.monotonic()
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            new_spec = self._spec(transitions, spec.get("acquireTime"))
        else:
            new_spec = self._spec(transitions + 1)
        lease["spec"] = new_spec
        try:
            updated = self.kube.request("PUT", self._path(self.name), body=lease)
        except KubeApiError as exc:
            if exc.status == 409:
                return False
            raise
        new = updated.get("spec") or new_spec
        self._observed = (self.identity, str(new.get("renewTime", "")))
        self._observed_at = now
        return True

    def _release(self) -> None:
        try:
            lease = self.kube.get(self._path(self.name))
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = _now_micro()
            lease["spec"] = spec
            self.kube.request("PUT", self._path(self.name), body=lease)
        except KubeApiError as exc:
            log.warning("leader election: releasing the lease failed: %s", exc)
