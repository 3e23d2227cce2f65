"""Devices hidden from the slices (dynamic MIG placements blocked by foreign MIG instances):
the publisher leaves them out, republishes when the set changes, and keeps the counters."""

from __future__ import annotations

import dataclasses

from api import names
from kubeletplugin.devices import migtables
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.table import node_devices
from kubeletplugin.publish.publisher import SlicePublisher
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import eventually
from tests.kubeletplugin.publish.helpers import (
    DEADLINE,
    DRIVER,
    FAST,
    NODE,
    create_node,
    devices,
    is_consistent,
    make_publisher,
    pool,
)


def _names(contents: list[dict[str, object]]) -> set[str]:
    return {
        str(d["name"])
        for c in contents
        for d in c.get("devices", [])  # type: ignore[attr-defined]
    }


def test_hidden_devices_leave_the_slices_and_come_back(
    apiserver: KubeAPIServer, kube_client: object
) -> None:
    create_node(apiserver)
    publisher = make_publisher(kube_client, names.SHARING_MODE_PARTITIONS, 2)  # type: ignore[arg-type]
    publisher.start()
    hidden = {"gpu-0-half-0", "gpu-0-quarter-1"}
    try:
        eventually(lambda: is_consistent(pool(apiserver)), timeout_s=DEADLINE)
        assert hidden <= {d["name"] for d in devices(pool(apiserver))}
        publisher.set_hidden_devices(hidden)
        assert publisher.hidden_devices == frozenset(hidden)
        eventually(
            lambda: not hidden & {d["name"] for d in devices(pool(apiserver))}, timeout_s=DEADLINE
        )
        published = {d["name"] for d in devices(pool(apiserver))}
        assert "gpu-0-half-1" in published and "gpu-1-half-0" in published
        # the counter sets stay: hiding takes no capacity away from the other devices
        sets = [c["name"] for s in pool(apiserver) for c in s["spec"].get("sharedCounters", [])]
        assert sets == ["gpu-0-counters", "gpu-1-counters"]
        publisher.set_hidden_devices([])
        eventually(
            lambda: hidden <= {d["name"] for d in devices(pool(apiserver))}, timeout_s=DEADLINE
        )
    finally:
        publisher.stop()


def test_same_hidden_set_does_not_republish(kube_client: object) -> None:
    publisher = make_publisher(kube_client, names.SHARING_MODE_PARTITIONS, 1)  # type: ignore[arg-type]
    publisher.set_hidden_devices(["gpu-0-half-0"])
    version = publisher._desired_version
    publisher.set_hidden_devices(iter(["gpu-0-half-0"]))
    assert publisher._desired_version == version
    publisher.set_hidden_devices(["gpu-0-half-1"])
    assert publisher._desired_version == version + 1


def test_hidden_dynamic_mig_placements_and_taints(kube_client: object) -> None:
    """Hidden placements are not rendered; taints still reach the others; the counter set of
    the GPU is the dynamic-MIG one."""
    gpu = dataclasses.replace(
        MockBackend(NODE, count=1).discover()[0],
        mig_mode="Enabled",
        mig_profiles=migtables.H100_80GB,
    )
    table = node_devices(
        [gpu], names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )
    publisher = SlicePublisher(KubeRest(kube_client), DRIVER, NODE, table, FAST)  # type: ignore[arg-type]
    every = _names(publisher.desired_contents())
    assert len(every) == 25
    blocked = {"gpu-0-mig-7g-80gb-0", "gpu-0-mig-4g-40gb-0", "gpu-0-mig-1g-10gb-0"}
    publisher.set_hidden_devices(blocked)
    taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    publisher.set_taints({"gpu-0": [taint]})
    contents = publisher.desired_contents()
    assert _names(contents) == every - blocked
    rendered = [d for c in contents for d in c.get("devices", [])]
    assert all(d["taints"] == [taint] for d in rendered)
    (counter_set,) = [s for c in contents for s in c.get("sharedCounters", [])]
    assert names.COUNTER_COMPUTE_SLICES in counter_set["counters"]
