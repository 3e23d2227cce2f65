"""An older API server that drops gated fields: the publisher says so once (one error line, one
Warning Event on the Node) and stops rewriting slices the server cannot store as sent."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import kubernetes.client
import pytest

from api import gates, names
from kubeletplugin.publish import gatecheck
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.kubeletplugin.publish.helpers import (
    DEADLINE,
    NODE,
    devices,
    is_consistent,
    pool,
    running_publisher,
)


@pytest.fixture
def old_server() -> Iterator[KubeAPIServer]:
    """An API server with the gates of Kubernetes 1.35's defaults that sharegpu needs off."""
    with KubeAPIServer(
        disabled_gates={gates.CONSUMABLE_CAPACITY, gates.PARTITIONABLE_DEVICES}
    ) as server:
        yield server


@pytest.fixture
def old_client(old_server: KubeAPIServer) -> Iterator[kubernetes.client.ApiClient]:
    client = old_server.client()
    try:
        yield client
    finally:
        client.close()


def node_events(server: KubeAPIServer) -> list[dict[str, object]]:
    return [
        e
        for e in server.store.list("events")
        if (e.get("involvedObject") or {}).get("kind") == "Node"  # type: ignore[union-attr]
    ]


def slice_writes(server: KubeAPIServer) -> int:
    return server.request_count("create", "resourceslices") + server.request_count(
        "update", "resourceslices"
    )


@pytest.mark.parametrize(
    ("mode", "gate", "what"),
    [
        (names.SHARING_MODE_CONSUMABLE, gates.CONSUMABLE_CAPACITY, "shared devices"),
        (names.SHARING_MODE_PARTITIONS, gates.PARTITIONABLE_DEVICES, "shared counters"),
    ],
)
def test_dropped_fields_are_reported_once_and_not_rewritten(
    old_server: KubeAPIServer,
    old_client: kubernetes.client.ApiClient,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    gate: str,
    what: str,
) -> None:
    caplog.set_level(logging.ERROR, logger="kubeletplugin.publish.publisher")
    with running_publisher(old_server, old_client, mode, 2) as publisher:
        assert old_server.wait_for(lambda: bool(node_events(old_server)), DEADLINE)
        assert publisher.wait_synced(DEADLINE)
        assert old_server.wait_for(lambda: is_consistent(pool(old_server)), DEADLINE)
        assert publisher.dropped_gates == (gate,)
        # settled: syncs asked for again write nothing (the slices are as the server keeps them)
        before = slice_writes(old_server)
        assert before >= 1
        syncs = old_server.request_count("list", "resourceslices")
        for _ in range(3):
            publisher.request_sync()
            assert old_server.wait_for(
                lambda n=syncs: old_server.request_count("list", "resourceslices") > n, DEADLINE
            )
            syncs = old_server.request_count("list", "resourceslices")
        assert publisher.wait_synced(DEADLINE)
        assert slice_writes(old_server) == before
        assert publisher.last_error is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert "\n" not in line
    assert f"feature gate {gate} is off" in line and what in line
    [event] = node_events(old_server)
    assert event["type"] == "Warning"
    assert event["reason"] == gatecheck.EVENT_REASON
    assert event["involvedObject"]["name"] == NODE  # type: ignore[index]
    assert event["involvedObject"]["uid"]  # type: ignore[index]
    assert event["message"] == line


def test_a_current_server_keeps_everything_and_nothing_is_reported(
    apiserver: KubeAPIServer, kube_client: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kubeletplugin.publish.publisher")
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_CONSUMABLE, 2) as publisher:
        assert publisher.wait_synced(DEADLINE)
        assert publisher.dropped_gates == ()
        assert all(d.get("allowMultipleAllocations") for d in devices(pool(apiserver)))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert node_events(apiserver) == []


def test_the_server_emulation_drops_what_the_gate_guards(old_server: KubeAPIServer) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.sharegpu.dev",
                            "capacity": {"requests": {"memory": "1Gi"}},
                        },
                    }
                ]
            }
        },
    }
    stored = old_server.store.create("resourceclaims", claim)
    assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"]


def test_message_names_each_gate_and_consequence() -> None:
    sent = {
        "kind": "ResourceSlice",
        "spec": {
            "sharedCounters": [{"name": "s"}],
            "devices": [{"name": "a", "allowMultipleAllocations": True, "taints": [{"key": "k"}]}],
        },
    }
    stored = gates.without(sent, {gates.CONSUMABLE_CAPACITY, gates.PARTITIONABLE_DEVICES})
    dropped = gatecheck.dropped_fields(sent, stored)
    assert gatecheck.dropped_gates(dropped) == [
        gates.CONSUMABLE_CAPACITY,
        gates.PARTITIONABLE_DEVICES,
    ]
    text = gatecheck.dropped_message("s-1", dropped)
    assert text.startswith("the API server dropped fields of ResourceSlice s-1: ")
    assert "(e.g. spec.devices[0].allowMultipleAllocations)" in text
    assert "every share becomes a whole GPU" in text
    assert "(e.g. spec.sharedCounters)" in text
    assert gatecheck.dropped_fields(sent, sent) == []


def test_a_long_message_is_cut_for_the_event() -> None:
    event = gatecheck.node_event("n", "u", "x" * 5000, datetime(2026, 1, 1, tzinfo=UTC))
    assert len(event["message"]) == gatecheck.MAX_EVENT_MESSAGE
    assert event["message"].endswith("...")
    assert event["firstTimestamp"] == "2026-01-01T00:00:00Z"
