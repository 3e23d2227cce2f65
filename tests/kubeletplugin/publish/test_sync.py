"""SlicePublisher against the in-process API server: modes, splitting, changes, wipes."""

from __future__ import annotations

import dataclasses

import pytest

from api import names
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, slice_generate_name
from kubeletplugin.devices.table import node_devices
from kubeletplugin.publish.publisher import SlicePublisher
from sharegpu.kube.clock import FakeClock
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
    running_publisher,
)

#: (mode, GPUs) -> slices expected: counter slices of 8 sets, device slices of 4 GPUs x 15.
EXPECTED_SLICES = {
    (names.SHARING_MODE_CONSUMABLE, 1): 1,
    (names.SHARING_MODE_CONSUMABLE, 8): 1,
    (names.SHARING_MODE_CONSUMABLE, 64): 1,
    (names.SHARING_MODE_EXCLUSIVE, 1): 1,
    (names.SHARING_MODE_EXCLUSIVE, 8): 1,
    (names.SHARING_MODE_EXCLUSIVE, 64): 1,
    (names.SHARING_MODE_PARTITIONS, 1): 2,
    (names.SHARING_MODE_PARTITIONS, 8): 3,
    (names.SHARING_MODE_PARTITIONS, 64): 24,
}


@pytest.mark.parametrize(("mode", "count"), sorted(EXPECTED_SLICES))
def test_publishes_pool(
    apiserver: KubeAPIServer, kube_client: object, mode: str, count: int
) -> None:
    uid = create_node(apiserver)
    publisher = make_publisher(kube_client, mode, count)  # type: ignore[arg-type]
    publisher.start()
    try:
        expected = EXPECTED_SLICES[(mode, count)]
        eventually(lambda: is_consistent(pool(apiserver), expected), timeout_s=DEADLINE)
        assert publisher.wait_synced(DEADLINE)
        slices = pool(apiserver)
        want = desired_slices(node_devices(MockBackend(NODE, count=count).discover(), mode))
        assert [d["name"] for d in devices(slices)] == [
            d["name"] for c in want for d in c.get("devices", [])
        ]
        for index, s in enumerate(slices):
            assert s["metadata"]["name"].startswith(slice_generate_name(index, DRIVER, NODE))
            assert s["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": True}
            ]
            assert s["spec"]["nodeName"] == NODE
            assert s["spec"]["pool"] == {
                "name": NODE,
                "generation": 1,
                "resourceSliceCount": expected,
            }
        assert publisher.last_error is None
    finally:
        publisher.stop()


def test_republishes_after_wipe(apiserver: KubeAPIServer, kube_client: object) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_PARTITIONS, 8):
        eventually(lambda: is_consistent(pool(apiserver), 3), timeout_s=DEADLINE)
        for _ in range(2):  # kubelet wipes on start and after a disconnect
            for s in pool(apiserver):
                apiserver.store.delete_now("resourceslices", s["metadata"]["name"])
            eventually(lambda: is_consistent(pool(apiserver), 3), timeout_s=DEADLINE)


def test_partial_wipe_and_foreign_edit(apiserver: KubeAPIServer, kube_client: object) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_PARTITIONS, 8):
        eventually(lambda: is_consistent(pool(apiserver), 3), timeout_s=DEADLINE)
        first, second, _ = pool(apiserver)
        apiserver.store.delete_now("resourceslices", second["metadata"]["name"])
        edited = dict(first)
        edited["spec"] = {**first["spec"], "sharedCounters": first["spec"]["sharedCounters"][:1]}
        apiserver.store.put("resourceslices", edited)

        def restored() -> bool:
            slices = pool(apiserver)
            return is_consistent(slices, 3) and len(slices[0]["spec"]["sharedCounters"]) == 8

        eventually(restored, timeout_s=DEADLINE)
        # a missing slice and a changed one: the generation was bumped
        assert pool(apiserver)[0]["spec"]["pool"]["generation"] == 2


def test_device_change_deletes_obsolete_and_bumps_generation(
    apiserver: KubeAPIServer, kube_client: object
) -> None:
    with running_publisher(apiserver, kube_client, names.SHARING_MODE_PARTITIONS, 16) as publisher:
        # 2 counter slices + 4 device slices
        eventually(lambda: is_consistent(pool(apiserver), 6), timeout_s=DEADLINE)
        publisher.update_devices(
            node_devices(MockBackend(NODE, count=2).discover(), names.SHARING_MODE_PARTITIONS)
        )
        eventually(lambda: is_consistent(pool(apiserver), 2), timeout_s=DEADLINE)
        slices = pool(apiserver)
        assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
        assert len(devices(slices)) == 30
        # shrinking deleted the obsolete slices first, never created new ones
        assert apiserver.request_count("create", "resourceslices") == 6


def test_taints_update_in_place_and_resplit(apiserver: KubeAPIServer, kube_client: object) -> None:
    create_node(apiserver)
    publisher = make_publisher(kube_client, names.SHARING_MODE_EXCLUSIVE, 128)  # type: ignore[arg-type]
    publisher.start()
    taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    try:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        # a tainted device limits a slice to 64 devices: 128 GPUs need 2 slices now
        publisher.set_taints({"gpu-100": [taint]})
        eventually(lambda: is_consistent(pool(apiserver), 2), timeout_s=DEADLINE)
        by_name = {d["name"]: d for d in devices(pool(apiserver))}
        assert by_name["gpu-100"]["taints"][0]["value"] == "XID-79"
        assert "taints" not in by_name["gpu-99"]
        assert pool(apiserver)[0]["spec"]["pool"]["generation"] == 2
        # recovery: back to one slice without taints
        publisher.set_taints({})
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        assert not any("taints" in d for d in devices(pool(apiserver)))
    finally:
        publisher.stop()


def test_one_changed_slice_keeps_generation(apiserver: KubeAPIServer, kube_client: object) -> None:
    create_node(apiserver)
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 8)  # type: ignore[arg-type]
    publisher.start()
    taint = {"key": f"{DRIVER}/unhealthy", "value": "lost", "effect": "NoExecute"}
    try:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        name = pool(apiserver)[0]["metadata"]["name"]
        publisher.set_taints({"gpu-0": [taint]})
        eventually(lambda: "taints" in devices(pool(apiserver))[0], timeout_s=DEADLINE)
        (updated,) = pool(apiserver)
        assert updated["metadata"]["name"] == name
        assert updated["spec"]["pool"]["generation"] == 1
    finally:
        publisher.stop()


def test_obsolete_foreign_and_stale_slices(apiserver: KubeAPIServer, kube_client: object) -> None:
    create_node(apiserver)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    for name in (
        "legacy-random-name",
        "0000-gpu.sharegpu.dev-n1-dup01",
        "0007-gpu.sharegpu.dev-n1-x",
    ):
        apiserver.store.create("resourceslices", {**template, "metadata": {"name": name}})
    other = {**template, "metadata": {"name": "other-driver-slice"}}
    other["spec"] = {**template["spec"], "driver": "other.example.com"}
    apiserver.store.create("resourceslices", other)

    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 8)  # type: ignore[arg-type]
    publisher.start()
    try:

        def done() -> bool:
            slices = pool(apiserver)
            return is_consistent(slices, 1) and len(devices(slices)) == 8

        eventually(done, timeout_s=DEADLINE)
        (kept,) = pool(apiserver)
        # the slice with the right index prefix was updated in place, the others deleted; one
        # changed slice and none missing keeps the generation
        assert kept["metadata"]["name"] == "0000-gpu.sharegpu.dev-n1-dup01"
        assert kept["spec"]["pool"]["generation"] == 1
        assert len(pool(apiserver, "other.example.com")) == 1
    finally:
        publisher.stop()


def test_waits_for_the_node(apiserver: KubeAPIServer, kube_client: object) -> None:
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 1)  # type: ignore[arg-type]
    publisher.start()
    try:
        eventually(lambda: publisher.last_error is not None, timeout_s=DEADLINE)
        assert "nodes/n1" in (publisher.last_error or "")
        create_node(apiserver)
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
    finally:
        publisher.stop()


def test_a_recreated_node_owns_the_republished_slices(
    apiserver: KubeAPIServer, kube_client: object
) -> None:
    # A Node deleted and registered again (same name, new UID): the garbage collector deletes
    # the slices owned by the old UID, and slices published again with that UID would be
    # deleted again, forever. They must name the new Node.
    old_uid = create_node(apiserver)
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 1)  # type: ignore[arg-type]
    publisher.start()
    try:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        apiserver.store.delete_now("nodes", NODE)
        new_uid = create_node(apiserver)
        assert new_uid != old_uid
        for s in pool(apiserver):  # what the garbage collector does
            apiserver.store.delete_now("resourceslices", s["metadata"]["name"])

        def owned_by_new_node() -> bool:
            slices = pool(apiserver)
            return is_consistent(slices, 1) and all(
                [r["uid"] for r in s["metadata"]["ownerReferences"]] == [new_uid] for s in slices
            )

        eventually(owned_by_new_node, timeout_s=DEADLINE)
    finally:
        publisher.stop()


def _settle(publisher: SlicePublisher, clock: FakeClock) -> None:
    """Let the publisher's own writes, seen on its watch, end in a no-op sync: step its clock
    one debounce interval at a time until it has published everything (bounded)."""
    for _ in range(20):
        if publisher.wait_synced(0.2):
            return
        assert clock.advance(1.0)
    raise AssertionError("the publisher never settled")


def test_bursts_of_changes_are_debounced(apiserver: KubeAPIServer, kube_client: object) -> None:
    """With the production debounce interval (1 s of the publisher's clock), a burst of changes
    within it is one write, made once the interval has passed."""
    create_node(apiserver)
    clock = FakeClock()
    settings = dataclasses.replace(FAST, min_interval=1.0)
    publisher = make_publisher(kube_client, names.SHARING_MODE_CONSUMABLE, 8, settings, clock)  # type: ignore[arg-type]
    publisher.start()
    try:
        eventually(lambda: is_consistent(pool(apiserver), 1), timeout_s=DEADLINE)
        _settle(publisher, clock)
        updates = apiserver.request_count("update", "resourceslices")
        for n in range(20):  # a flapping device
            taint = {"key": f"{DRIVER}/unhealthy", "value": f"flap-{n}", "effect": "NoSchedule"}
            publisher.set_taints({"gpu-0": [taint]} if n % 2 == 0 else {})
        final = {"key": f"{DRIVER}/unhealthy", "value": "final", "effect": "NoSchedule"}
        publisher.set_taints({"gpu-0": [final]})
        assert not publisher.wait_synced(0.2), "published before the debounce interval passed"
        assert apiserver.request_count("update", "resourceslices") == updates
        assert clock.advance(1.0)
        eventually(
            lambda: devices(pool(apiserver))[0].get("taints", [{}])[0].get("value") == "final",
            timeout_s=DEADLINE,
        )
        _settle(publisher, clock)
        assert apiserver.request_count("update", "resourceslices") - updates == 1
    finally:
        publisher.stop()
