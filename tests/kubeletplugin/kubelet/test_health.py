"""The DRAResourceHealth stream (v1 and v1alpha1), fed by a fake source and by HealthBroadcaster."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

import grpc
import pytest

from kubeletplugin.kubelet.healthservice import (
    DeviceHealthStatus,
    Health,
    HealthBroadcaster,
    HealthSubscription,
)
from sharegpuctl.local.kubelet import KubeletSim, SimDeviceHealth
from tests.helpers import eventually
from tests.kubeletplugin.kubelet.helpers import DRIVER, Dirs, running_server

GPU0_OK = DeviceHealthStatus("node-1", "gpu-0", Health.HEALTHY, 1700000000)
GPU1_OK = DeviceHealthStatus("node-1", "gpu-1", Health.HEALTHY, 1700000000, timeout_seconds=60)
GPU1_BAD = DeviceHealthStatus(
    "node-1", "gpu-1", Health.UNHEALTHY, 1700000042, message="XID 79: GPU has fallen off the bus"
)


def _sim(d: DeviceHealthStatus) -> SimDeviceHealth:
    return SimDeviceHealth(
        pool_name=d.pool_name,
        device_name=d.device_name,
        health=d.health.name,
        last_updated_time=d.last_updated,
        health_check_timeout_seconds=d.timeout_seconds,
        message=d.message,
    )


class FakeSubscription:
    """Yields what the test pushes; records when the servicer closes it."""

    def __init__(self) -> None:
        self.items: queue.Queue[Sequence[DeviceHealthStatus] | None] = queue.Queue()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[Sequence[DeviceHealthStatus]]:
        return self

    def __next__(self) -> Sequence[DeviceHealthStatus]:
        item = self.items.get()
        if item is None:
            raise StopIteration
        return item

    def close(self) -> None:
        self.closed.set()
        self.items.put(None)


class FakeHealthSource:
    def __init__(self) -> None:
        self.subscriptions: queue.Queue[FakeSubscription] = queue.Queue()

    def subscribe(self) -> HealthSubscription:
        sub = FakeSubscription()
        self.subscriptions.put(sub)
        return sub


def test_stream_delivers_complete_lists_and_closes_on_disconnect(dirs: Dirs) -> None:
    source = FakeHealthSource()
    with running_server(dirs, health_source=source), KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        watch = plugin.watch_health()
        sub = source.subscriptions.get(timeout=10)
        sub.items.put([GPU0_OK, GPU1_OK])
        assert watch.next() == [_sim(GPU0_OK), _sim(GPU1_OK)]
        sub.items.put([GPU0_OK, GPU1_BAD])
        assert watch.next() == [_sim(GPU0_OK), _sim(GPU1_BAD)]
        watch.close()
        assert sub.closed.wait(timeout=10)


def test_source_ending_ends_the_stream(dirs: Dirs) -> None:
    source = FakeHealthSource()
    with running_server(dirs, health_source=source), KubeletSim(dirs.registry) as kubelet:
        watch = kubelet.register(DRIVER).watch_health()
        source.subscriptions.get(timeout=10).items.put(None)
        with pytest.raises(EOFError):
            watch.next()


def test_broadcaster_stream_survives_disconnect_and_reconnect(dirs: Dirs) -> None:
    broadcaster = HealthBroadcaster()
    broadcaster.publish([GPU0_OK, GPU1_OK])
    with running_server(dirs, health_source=broadcaster), KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        first = plugin.watch_health()
        assert first.next() == [_sim(GPU0_OK), _sim(GPU1_OK)]
        broadcaster.publish([GPU0_OK, GPU1_BAD])
        assert first.next() == [_sim(GPU0_OK), _sim(GPU1_BAD)]
        first.close()
        # Kubelet reconnects (e.g. after its restart): the new stream starts with the current list.
        second = plugin.watch_health()
        assert second.next() == [_sim(GPU0_OK), _sim(GPU1_BAD)]
        broadcaster.publish([GPU0_OK, GPU1_OK])
        assert second.next() == [_sim(GPU0_OK), _sim(GPU1_OK)]
        # Prepares still work while a stream is open.
        assert plugin.prepare([]) == {}
        second.close()


def test_server_stop_ends_open_streams(dirs: Dirs) -> None:
    broadcaster = HealthBroadcaster()
    broadcaster.publish([GPU0_OK])
    with KubeletSim(dirs.registry) as kubelet:
        with running_server(dirs, health_source=broadcaster):
            watch = kubelet.register(DRIVER).watch_health()
            assert watch.next() == [_sim(GPU0_OK)]
        with pytest.raises((grpc.RpcError, EOFError)):
            watch.next(timeout=30)


def test_broadcaster_resends_latest_list_after_interval() -> None:
    broadcaster = HealthBroadcaster(resend_interval_s=0.05)
    sub = broadcaster.subscribe()
    broadcaster.publish([GPU0_OK])
    assert next(sub) == (GPU0_OK,)
    assert next(sub) == (GPU0_OK,)  # unchanged: resent once the interval passes
    broadcaster.publish([GPU1_BAD])
    assert next(sub) == (GPU1_BAD,)
    sub.close()
    with pytest.raises(StopIteration):
        next(sub)


def test_broadcaster_close_wakes_blocked_subscribers() -> None:
    broadcaster = HealthBroadcaster()
    sub = broadcaster.subscribe()
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(sub))
    reader.start()
    broadcaster.publish([GPU0_OK])
    broadcaster.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert got in ([], [(GPU0_OK,)])
    with pytest.raises(StopIteration):
        next(broadcaster.subscribe())


def test_broadcaster_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="resend_interval_s must be > 0"):
        HealthBroadcaster(resend_interval_s=0)


def test_open_health_streams_never_starve_prepares(dirs: Dirs) -> None:
    """40 streams beyond the limit (a client that keeps opening them) are refused at once with
    RESOURCE_EXHAUSTED; the allowed ones keep streaming and a prepare is still answered."""
    from kubeletplugin.kubelet.healthservice import MAX_HEALTH_STREAMS

    broadcaster = HealthBroadcaster()
    broadcaster.publish([GPU0_OK])
    with (
        running_server(dirs, health_source=broadcaster, max_workers=2),
        KubeletSim(dirs.registry) as kubelet,
    ):
        plugin = kubelet.register(DRIVER)
        allowed = [plugin.watch_health() for _ in range(MAX_HEALTH_STREAMS)]
        for watch in allowed:
            assert watch.next() == [_sim(GPU0_OK)]
        refused = [plugin.watch_health() for _ in range(40)]
        for watch in refused:
            with pytest.raises(grpc.RpcError) as info:
                watch.next(timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"at most {MAX_HEALTH_STREAMS}" in str(info.value.details())
        # Both prepare workers are free although every stream slot is taken.
        assert plugin.prepare([]) == {}
        assert plugin.prepare([]) == {}
        broadcaster.publish([GPU1_BAD])
        for watch in allowed:
            assert watch.next() == [_sim(GPU1_BAD)]
        # A closed stream frees its slot for the next one.
        allowed[0].close()

        def reused() -> bool:
            again = plugin.watch_health()
            try:
                first = again.next(timeout=30)
            except grpc.RpcError:  # the slot is not free yet
                return False
            assert first == [_sim(GPU1_BAD)]
            return True

        eventually(reused, "a freed stream slot reused", timeout_s=60)


V1 = "v1.DRAResourceHealth"
V1ALPHA1 = "v1alpha1.DRAResourceHealth"


def test_v1_and_v1alpha1_clients_receive_the_same_updates(dirs: Dirs) -> None:
    broadcaster = HealthBroadcaster()
    broadcaster.publish([GPU0_OK, GPU1_OK])
    with running_server(dirs, health_source=broadcaster), KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        watches = [plugin.watch_health(V1), plugin.watch_health(V1ALPHA1)]
        assert [w.version for w in watches] == [V1, V1ALPHA1]
        for watch in watches:
            assert watch.next() == [_sim(GPU0_OK), _sim(GPU1_OK)]
        broadcaster.publish([GPU0_OK, GPU1_BAD])
        for watch in watches:
            assert watch.next() == [_sim(GPU0_OK), _sim(GPU1_BAD)]


@pytest.mark.parametrize(
    ("kubernetes_version", "chosen"),
    [("1.37", V1), ("1.36", V1ALPHA1), ("1.35", V1ALPHA1), ("1.34", V1ALPHA1)],
)
def test_kubelet_uses_the_health_version_of_its_release(
    dirs: Dirs, kubernetes_version: str, chosen: str
) -> None:
    source = FakeHealthSource()
    with (
        running_server(dirs, health_source=source),
        KubeletSim(dirs.registry, kubernetes_version=kubernetes_version) as kubelet,
    ):
        plugin = kubelet.register(DRIVER)
        assert plugin.health_version == chosen
        watch = plugin.watch_health()
        assert watch.version == chosen
        source.subscriptions.get(timeout=10).items.put([GPU1_BAD])
        assert watch.next() == [_sim(GPU1_BAD)]


def test_kubelet_without_a_common_health_version_does_not_watch(dirs: Dirs) -> None:
    with running_server(dirs), KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        assert plugin.health_version is None
        with pytest.raises(RuntimeError, match="advertises no health service"):
            plugin.watch_health()


@pytest.mark.parametrize("bad", ["1.33", "1.38", "2.0", "1.x", "37", ""])
def test_kubelet_sim_rejects_unknown_kubernetes_versions(dirs: Dirs, bad: str) -> None:
    with pytest.raises(ValueError, match=r"kubernetes_version: .* is not one of 1\.34, .*1\.37"):
        KubeletSim(dirs.registry, kubernetes_version=bad)


def test_stream_limit_counts_both_versions(dirs: Dirs) -> None:
    from kubeletplugin.kubelet.healthservice import MAX_HEALTH_STREAMS

    broadcaster = HealthBroadcaster()
    broadcaster.publish([GPU0_OK])
    with running_server(dirs, health_source=broadcaster), KubeletSim(dirs.registry) as kubelet:
        plugin = kubelet.register(DRIVER)
        versions = [V1 if i % 2 else V1ALPHA1 for i in range(MAX_HEALTH_STREAMS)]
        allowed = [plugin.watch_health(v) for v in versions]
        for watch in allowed:
            assert watch.next() == [_sim(GPU0_OK)]
        for version in (V1, V1ALPHA1):
            with pytest.raises(grpc.RpcError) as info:
                plugin.watch_health(version).next(timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
