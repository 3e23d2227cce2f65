"""Allocation against the slices the kubelet plugin really builds (mock GPUs)."""

from __future__ import annotations

from typing import Any

import pytest

from api import names
from api.quantity import format_quantity, quantity_int
from api.sharepolicy import memory_policy_max
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many, seeded_share_ids
from tests.allocator.helpers import DRIVER, claim, device_class, exactly, share

CLASSES = [device_class()]


def published(mode: str, gpus: int = 8) -> tuple[list[dict[str, Any]], int]:
    discovered = MockBackend("n1", gpus).discover()
    objects = resource_slice_objects(
        desired_slices(node_devices(discovered, mode)), DRIVER, "n1", None, 1
    )
    for i, obj in enumerate(objects):
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + f"{i:05d}"
    return objects, discovered[0].memory_usable


def test_consumable_mode_shares_and_defaults() -> None:
    slices, usable = published(names.SHARING_MODE_CONSUMABLE)
    claims = [
        share("a", cores="30", memory="10Gi"),
        share("b", cores="50", memory="20Gi"),
        claim("whole", [exactly()]),
    ]
    outs = allocate_many(claims, slices, CLASSES, node="n1", share_ids=seeded_share_ids(2))
    results = [o.allocation["devices"]["results"][0] for o in outs if o.allocation]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-0", "gpu-1"]
    assert results[0]["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
    assert results[2]["consumedCapacity"] == {
        "cores": "100",
        "memory": format_quantity(memory_policy_max(usable)),
    }


def test_consumable_mode_rejects_more_memory_than_a_gpu_has() -> None:
    slices, usable = published(names.SHARING_MODE_CONSUMABLE, 2)
    out = allocate_many([share("big", memory="200Gi")], slices, CLASSES, node="n1")[0]
    assert not out.ok
    for rej in out.reports[0].rejections:
        assert rej.kind == "capacity-short"
        assert quantity_int(rej.details["available"]) == usable


def test_partitions_mode_halves_fill_a_gpu() -> None:
    slices, _ = published(names.SHARING_MODE_PARTITIONS, 2)
    half = [f"device.attributes['{DRIVER}'].partition == 'half'"]
    quarter = [f"device.attributes['{DRIVER}'].partition == 'quarter'"]
    claims = [claim(f"h{i}", [exactly(selectors=half)]) for i in range(5)]
    claims.append(claim("q", [exactly(selectors=quarter)]))
    outs = allocate_many(claims, slices, CLASSES, node="n1")
    got = [o.allocation["devices"]["results"][0]["device"] if o.ok else None for o in outs]
    assert got == ["gpu-0-half-0", "gpu-0-half-1", "gpu-1-half-0", "gpu-1-half-1", None, None]
    assert {r.kind for r in outs[4].reports[0].rejections} == {
        "already-allocated",
        "selector-false",
    }
    quarter_kinds = {r.kind for r in outs[5].reports[0].rejections if "quarter" in r.device.device}
    assert quarter_kinds == {"counter-short"}


@pytest.mark.parametrize("mode", [names.SHARING_MODE_EXCLUSIVE])
def test_exclusive_mode_whole_gpus(mode: str) -> None:
    slices, _ = published(mode, 2)
    outs = allocate_many(
        [claim(f"x{i}", [exactly()]) for i in range(3)], slices, CLASSES, node="n1"
    )
    assert [o.ok for o in outs] == [True, True, False]
    assert [r.kind for r in outs[2].reports[0].rejections] == ["already-allocated"] * 2


def test_selectors_on_published_attributes() -> None:
    slices, _ = published(names.SHARING_MODE_CONSUMABLE, 2)
    selectors = [
        f"device.attributes['{DRIVER}'].productName.contains('H100')",
        f"device.attributes['{DRIVER}'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))",
        f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0",
        "'pcieRoot' in device.attributes['resource.kubernetes.io'] || true",
    ]
    outs = allocate_many([claim("sel", [exactly(selectors=selectors)])], slices, CLASSES, node="n1")
    assert outs[0].ok, outs[0].to_dict()


@pytest.mark.parametrize(("default_cores", "fit"), [(100, 1), (10, 10), (25, 4)])
def test_memory_only_requests_are_charged_the_nodes_default_share_cores(
    default_cores: int, fit: int
) -> None:
    """``--default-share-cores`` (chart: kubeletPlugin.defaultShareCores) is what a request
    naming only memory is charged in cores, so that many such shares fit on one GPU."""
    discovered = MockBackend("n1", 1).discover()
    objects = resource_slice_objects(
        desired_slices(node_devices(discovered, names.SHARING_MODE_CONSUMABLE, default_cores)),
        DRIVER,
        "n1",
        None,
        1,
    )
    for i, obj in enumerate(objects):
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + f"{i:05d}"
    claims = [share(f"m{i}", memory="1Gi") for i in range(fit + 1)]
    outs = allocate_many(claims, objects, CLASSES, node="n1", share_ids=seeded_share_ids(3))
    assert [o.ok for o in outs] == [True] * fit + [False]
    consumed = outs[0].allocation["devices"]["results"][0]["consumedCapacity"]
    assert consumed == {"cores": str(default_cores), "memory": "1Gi"}


@pytest.mark.parametrize("bad", [0, 101, -5])
def test_default_share_cores_outside_1_to_100_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="default share cores must be 1 to 100"):
        node_devices(MockBackend("n1", 1).discover(), names.SHARING_MODE_CONSUMABLE, bad)


def _bounded(mode: str, max_shares: int, gpus: int = 1) -> list[dict[str, Any]]:
    discovered = MockBackend("n1", gpus).discover()
    table = node_devices(discovered, mode, max_shares=max_shares)
    objects = resource_slice_objects(desired_slices(table), DRIVER, "n1", None, 1)
    for i, obj in enumerate(objects):
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + f"{i:05d}"
    return objects


@pytest.mark.parametrize(("max_shares", "fits"), [(0, 33), (10, 10), (7, 6), (48, 33)])
def test_consumable_gpu_never_holds_more_shares_than_its_limit(max_shares: int, fits: int) -> None:
    """Tiny shares (1 core, 256Mi) are charged the smallest share the node publishes, so the
    scheduler stops at the GPU's share limit: 0 is MPS's 48 clients of an H100 (CUDA before
    13.1), bounded to ceil(100/48) = 3 cores a share, 33 shares; 7 gives 15 cores, 6 shares."""
    slices = _bounded(names.SHARING_MODE_CONSUMABLE, max_shares)
    claims = [share(f"s{i}", cores="1", memory="256Mi") for i in range(70)]
    outs = allocate_many(claims, slices, CLASSES, node="n1", share_ids=seeded_share_ids(3))
    assert sum(o.ok for o in outs) == fits


def test_partitions_mode_leaves_out_profiles_above_the_share_limit() -> None:
    slices = _bounded(names.SHARING_MODE_PARTITIONS, 4)
    eighth = [f"device.attributes['{DRIVER}'].partition == 'eighth'"]
    quarter = [f"device.attributes['{DRIVER}'].partition == 'quarter'"]
    claims = [claim(f"e{i}", [exactly(selectors=eighth)]) for i in range(2)]
    claims += [claim(f"q{i}", [exactly(selectors=quarter)]) for i in range(5)]
    outs = allocate_many(claims, slices, CLASSES, node="n1")
    assert [o.ok for o in outs] == [False, False, True, True, True, True, False]
