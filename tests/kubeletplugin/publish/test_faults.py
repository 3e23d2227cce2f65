"""SlicePublisher under API faults: 5xx, 409, 429, hang-ups, dropped watches, 422."""

from __future__ import annotations

import logging
import threading

import pytest

from api import names
from kubeletplugin.devices.table import node_devices
from sharegpu.kube.informer import Backoff
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import eventually
from tests.kubeletplugin.publish.helpers import (
    DEADLINE,
    create_node,
    is_consistent,
    make_publisher,
    pool,
    running_publisher,
)


@pytest.mark.parametrize(
    ("verb", "code", "action"),
    [
        ("create", 500, "status"),
        ("create", 503, "status"),
        ("create", 429, "status"),
        ("create", 409, "status"),
        ("list", 500, "status"),
        ("get", 500, "status"),
        ("create", 0, "hangup"),
        ("list", 0, "hangup"),
    ],
)
def test_retries_until_published(
    apiserver: KubeAPIServer, kube_client: object, verb: str, code: int, action: str
) -> None:
    create_node(apiserver)
    fault = apiserver.inject_fault(verb, None, code=code or 500, times=3, action=action)
    publisher = make_publisher(kube_client, names.SHARING_MODE_PARTITIONS, 8)  # type: ignore[arg-type]
    publisher.start()
    try:
        eventually(lambda: is_consistent(pool(apiserver), 3), timeout_s=DEADLINE)
        assert fault.hits == 3
        assert publisher.wait_synced(DEADLINE)
        assert publisher.last_error is None
    finally:
        publisher.stop()


def test_update_conflict_is_retried(apiserver: KubeAPIServer, kube_client: object) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_CONSUMABLE, 8) as publisher:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        fault = apiserver.inject_fault("update", "resourceslices", code=409, times=2)
        taint = {"key": "gpu.sharegpu.dev/unhealthy", "value": "x", "effect": "NoSchedule"}
        publisher.set_taints({"gpu-1": [taint]})
        eventually(lambda: "taints" in pool(apiserver)[0]["spec"]["devices"][1], timeout_s=DEADLINE)
        assert fault.hits == 2


def test_delete_precondition_conflict_is_retried(
    apiserver: KubeAPIServer, kube_client: object
) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_PARTITIONS, 16) as publisher:
        eventually(lambda: is_consistent(pool(apiserver), 6), timeout_s=DEADLINE)
        fault = apiserver.inject_fault("delete", "resourceslices", code=409, times=2)
        publisher.update_devices(node_devices([], names.SHARING_MODE_PARTITIONS))
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        assert pool(apiserver)[0]["spec"]["devices"] == []
        assert fault.hits == 2


def test_dropped_watch_then_wipe(apiserver: KubeAPIServer, kube_client: object) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_CONSUMABLE, 8):
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        eventually(lambda: apiserver.open_watches() == 1, timeout_s=DEADLINE)
        watch_fault = apiserver.inject_fault("watch", "resourceslices", code=500, times=2)
        assert apiserver.drop_watches() == 1
        eventually(lambda: watch_fault.hits == 2, timeout_s=DEADLINE)
        eventually(lambda: apiserver.open_watches() == 1, timeout_s=DEADLINE)
        for s in pool(apiserver):
            apiserver.store.delete_now("resourceslices", s["metadata"]["name"])
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)


def test_expired_watch_relists(apiserver: KubeAPIServer, kube_client: object) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_CONSUMABLE, 1):
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        eventually(lambda: apiserver.open_watches() == 1, timeout_s=DEADLINE)
        lists = apiserver.request_count("list", "resourceslices")
        apiserver.store.compact()
        apiserver.drop_watches()
        eventually(
            lambda: apiserver.request_count("list", "resourceslices") > lists, timeout_s=DEADLINE
        )
        for s in pool(apiserver):
            apiserver.store.delete_now("resourceslices", s["metadata"]["name"])
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)


def test_rejected_slice_is_logged_and_retried(
    apiserver: KubeAPIServer, kube_client: object, caplog: pytest.LogCaptureFixture
) -> None:
    create_node(apiserver)
    fault = apiserver.inject_fault(
        "create", "resourceslices", code=422, times=2, message="spec.devices: Too many"
    )
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 8)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="kubeletplugin.publish.publisher"):
        publisher.start()
        try:
            eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
            assert fault.hits == 2
            assert all(t.is_alive() for t in threading.enumerate() if t.name == "slice-sync")
        finally:
            publisher.stop()
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert rejected and "spec.devices: Too many" in rejected[0]


def test_invalid_desired_slices_are_not_sent(
    apiserver: KubeAPIServer, kube_client: object, caplog: pytest.LogCaptureFixture
) -> None:
    create_node(apiserver)
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 2)  # type: ignore[arg-type]
    bad = {"key": "not a key!", "value": "x", "effect": "Sometimes"}
    publisher.set_taints({"gpu-0": [bad]})
    with caplog.at_level(logging.ERROR, logger="kubeletplugin.publish.publisher"):
        publisher.start()
        try:
            eventually(lambda: publisher.last_error is not None, timeout_s=DEADLINE)
            assert "taints[0].effect" in (publisher.last_error or "")
            assert apiserver.request_count("create", "resourceslices") == 0
            publisher.set_taints({})
            eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        finally:
            publisher.stop()


def test_backoff_is_capped() -> None:
    backoff = Backoff(initial=0.5, factor=2.0, cap=30.0)
    assert [backoff.delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff.delay(50) == 30.0
