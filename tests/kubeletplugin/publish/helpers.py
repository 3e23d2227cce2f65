"""Shared pieces of the publisher tests: fast settings, a node, pool inspection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes.client

from api import names
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.table import node_devices
from kubeletplugin.publish.publisher import PublisherSettings, SlicePublisher
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.informer import Backoff
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "n1"
#: Short delays so that retries happen within a test; the logic is the production one.
FAST = PublisherSettings(
    min_interval=0.1, backoff=Backoff(0.05, 2.0, 0.5), invalid_retry=0.5, resync_period=60.0
)
#: Convergence deadline: generous, the machine is shared.
DEADLINE = 30.0


def create_node(server: KubeAPIServer, name: str = NODE) -> str:
    """Create a Node and return its uid."""
    node = server.store.create(
        "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    return str(node["metadata"]["uid"])


def make_publisher(
    client: kubernetes.client.ApiClient,
    mode: str = names.SHARING_MODE_CONSUMABLE,
    gpus: int = 8,
    settings: PublisherSettings = FAST,
    clock: Clock = SYSTEM_CLOCK,
) -> SlicePublisher:
    return SlicePublisher(
        KubeRest(client),
        DRIVER,
        NODE,
        node_devices(MockBackend(NODE, count=gpus).discover(), mode),
        settings,
        clock,
    )


@contextmanager
def running_publisher(
    server: KubeAPIServer,
    client: Any,
    mode: str = names.SHARING_MODE_CONSUMABLE,
    gpus: int = 8,
    settings: PublisherSettings = FAST,
) -> Iterator[SlicePublisher]:
    """Create the Node, start a publisher for it on ``server``, and stop it on exit."""
    create_node(server)
    publisher = make_publisher(client, mode, gpus, settings)
    publisher.start()
    try:
        yield publisher
    finally:
        publisher.stop()


def pool(server: KubeAPIServer, driver: str = DRIVER) -> list[dict[str, Any]]:
    """This node's slices of ``driver`` on the server, by name."""
    return sorted(
        (
            s
            for s in server.store.list("resourceslices")
            if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == NODE
        ),
        key=lambda s: s["metadata"]["name"],
    )


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def is_consistent(slices: list[dict[str, Any]], expected_count: int | None = None) -> bool:
    """One generation, resourceSliceCount equal to the number of slices (and to ``expected``)."""
    if not slices:
        return False
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    return (
        len(generations) == 1
        and counts == {len(slices)}
        and (expected_count is None or len(slices) == expected_count)
    )
