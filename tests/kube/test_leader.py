"""Two controller replicas with Lease leader election: one writes, the other takes over."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.tracker import Tracker
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock, FakeClock
from sharegpu.kube.leader import LeaderElector
from sharegpu.kube.rest import KubeRest, resource_path
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.controller import helpers as h
from tests.helpers import eventually

DEADLINE_S = 30.0
LEASE_S = 3.0


RETRY_S = 0.2


def elector(kube: KubeRest, name: str, identity: str, clock: Clock = SYSTEM_CLOCK) -> LeaderElector:
    """An elector with short timings: 3 s lease, 2 s renew deadline, 0.2 s retry."""
    return LeaderElector(
        kube,
        "sharegpu",
        name,
        identity,
        lease_duration_s=LEASE_S,
        renew_deadline_s=2.0,
        retry_period_s=RETRY_S,
        clock=clock,
    )


def run_for(clock: FakeClock, electors: int, seconds: float) -> None:
    """Drive ``electors`` running electors through ``seconds`` of the fake clock, one retry
    period at a time: each step starts once every elector waits again after its round."""
    for _ in range(round(seconds / RETRY_S)):
        assert clock.wait_for_waiters(electors)
        assert clock.advance(RETRY_S)
    assert clock.wait_for_waiters(electors)


class Replica:
    def __init__(self, kube: KubeRest, identity: str) -> None:
        self.elector = elector(kube, "sharegpu-controller", identity)
        self.tracker = Tracker(kube, h.DRIVER, is_leader=lambda: self.elector.is_leader)
        self.tracker.start()
        self.elector.start()

    def stop(self) -> None:
        self.elector.stop()
        self.tracker.stop()


def test_one_leader_writes_and_the_standby_takes_over(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    cluster = h.Cluster(kube)
    for node in ("n1", "n2"):
        cluster.add_slice(h.node_slice(node, 4))
    replicas = [Replica(kube, "replica-1"), Replica(kube, "replica-2")]
    try:
        eventually(lambda: any(r.elector.is_leader for r in replicas), timeout_s=DEADLINE_S)
        leader = next(r for r in replicas if r.elector.is_leader)
        standby = next(r for r in replicas if r is not leader)
        assert not standby.elector.is_leader
        eventually(cluster.converged, timeout_s=DEADLINE_S)
        cluster.add_claim("a", [h.result("n1", "gpu-0", cores=40, memory="8Gi")])
        eventually(cluster.converged, timeout_s=DEADLINE_S)
        assert leader.tracker.writes > 0 and standby.tracker.writes == 0
        # the standby has the same view (it serves the JSON API too)
        eventually(lambda: standby.tracker.gpus() == leader.tracker.gpus())

        lease = kube.get(
            resource_path("coordination.k8s.io", "v1", "leases", "sharegpu", "sharegpu-controller")
        )
        assert lease["spec"]["holderIdentity"] == leader.elector.identity

        leader.stop()  # releases the lease
        replicas.remove(leader)
        assert standby.elector.wait_for_leadership(DEADLINE_S)
        cluster.add_claim("b", [h.result("n2", "gpu-3", cores=25, memory="2Gi")])
        eventually(cluster.converged, timeout_s=DEADLINE_S)
        assert standby.tracker.writes > 0
    finally:
        for r in replicas:
            r.stop()


def test_renewed_lease_is_never_taken_over(apiserver: KubeAPIServer, kube: KubeRest) -> None:
    clock = FakeClock()
    first = elector(kube, "lease", "first", clock)
    second = elector(kube, "lease", "second", clock)
    first.start()
    try:
        assert clock.wait_for_waiters(1)
        assert first.is_leader
        second.start()
        # 1.5 lease durations of renewals every retry period, each seen by the standby
        run_for(clock, 2, LEASE_S * 1.5)
        assert not second.is_leader
        assert first.is_leader
    finally:
        second.stop()
        first.stop()


def test_abandoned_lease_is_taken_over_after_it_expires(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    """A crashed holder never releases; the lease is taken only after its duration passed."""
    path = resource_path("coordination.k8s.io", "v1", "leases", "sharegpu")
    kube.request(
        "POST",
        path,
        body={
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "lease", "namespace": "sharegpu"},
            "spec": {
                "holderIdentity": "crashed",
                "leaseDurationSeconds": 3,
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseTransitions": 4,
            },
        },
    )
    clock = FakeClock()
    successor = elector(kube, "lease", "successor", clock)
    successor.start()
    try:
        # it must watch the record unchanged for 3 s of its own clock first
        run_for(clock, 1, LEASE_S / 2)
        assert not successor.is_leader
        run_for(clock, 1, LEASE_S / 2 + 2 * RETRY_S)
        assert successor.is_leader
        spec = kube.get(f"{path}/lease")["spec"]
        assert spec["holderIdentity"] == "successor" and spec["leaseTransitions"] == 5
    finally:
        successor.stop()
    assert kube.get(f"{path}/lease")["spec"].get("holderIdentity", "") == ""


def test_invalid_timings_rejected(kube: KubeRest) -> None:
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s"):
        LeaderElector(kube, "ns", "x", lease_duration_s=1, renew_deadline_s=2, retry_period_s=0.1)


class StallingKube(KubeRest):
    """A client whose requests hang (as over a stalled connection) once ``stall`` is set."""

    def __init__(self, inner: KubeRest) -> None:
        super().__init__(inner.api_client)
        self.stall = threading.Event()
        self.release = threading.Event()
        self.stalled = threading.Event()

    def _wait(self) -> None:
        if self.stall.is_set():
            self.stalled.set()
            self.release.wait(DEADLINE_S)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return super().get(*args, **kwargs)

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return super().request(*args, **kwargs)


def test_leadership_ends_at_the_renew_deadline_even_while_a_renewal_hangs(
    kube: KubeRest,
) -> None:
    """A replica whose renewal request hangs must stop counting as leader after the renew
    deadline (2 s), before a standby may take over (3 s), not when the request returns."""
    stalling = StallingKube(kube)
    leader = elector(stalling, "lease", "stalled")
    leader.start()
    try:
        assert leader.wait_for_leadership(DEADLINE_S)
        stalling.stall.set()
        assert stalling.stalled.wait(DEADLINE_S)
        # polled while the renewal request is still blocked in ``_wait``
        eventually(lambda: not leader.is_leader, "leadership given up", timeout_s=DEADLINE_S)
    finally:
        stalling.stall.clear()
        stalling.release.set()
        leader.stop()


class ReleaseWatchingKube(KubeRest):
    """Records, at the moment the lease is released, whether the elector still leads."""

    def __init__(self, inner: KubeRest) -> None:
        super().__init__(inner.api_client)
        self.elector: LeaderElector | None = None
        self.leading_at_release: list[bool] = []

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("body")
        releasing = (
            method == "PUT"
            and isinstance(body, dict)
            and (body.get("spec") or {}).get("holderIdentity") == ""
        )
        if releasing and self.elector is not None:
            self.leading_at_release.append(self.elector.is_leader)
        return super().request(method, path, *args, **kwargs)


def test_leadership_ends_before_the_lease_is_released(kube: KubeRest) -> None:
    """Once released, a standby may take the lease at once; this replica must not lead then."""
    watching = ReleaseWatchingKube(kube)
    leader = watching.elector = elector(watching, "lease", "leaving")
    leader.start()
    try:
        assert leader.wait_for_leadership(DEADLINE_S)
    finally:
        leader.stop()
    assert watching.leading_at_release == [False]
