"""The slices a node publishes: attributes, capacities, modes, splitting, schema validity."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest

from api import names
from api.quantity import parse_quantity
from api.sharepolicy import memory_policy_max
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import (
    desired_slices,
    resource_slice_objects,
    slice_generate_name,
    slice_index,
)
from kubeletplugin.devices.table import node_devices
from sharegpu.kube.slicerules import device_limit, validate_pool, validate_resource_slice

DRIVER = names.DEFAULT_DRIVER_NAME
MI = 2**20
#: Kubernetes versions whose ResourceSlice v1 schema is checked. The 1.34 schema already has
#: every field used here (allowMultipleAllocations, requestPolicy, sharedCounters,
#: consumesCounters, taints); in 1.34 their feature gates are alpha (off by default), so a 1.34
#: API server with default gates drops them: consumable and partitions modes need 1.36.
VERSIONS = ("1.34", "1.36")


def objects(gpu_count: int, mode: str, taints: Mapping[str, Any] | None = None) -> list[Any]:
    gpus = MockBackend("node-a", count=gpu_count).discover()
    return resource_slice_objects(
        desired_slices(node_devices(gpus, mode), taints), DRIVER, "node-a", "uid-1", 3
    )


def devices_of(slices: list[Any]) -> list[Any]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def assert_valid(slices: list[Any]) -> None:
    for obj in slices:
        assert validate_resource_slice(obj) == []
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert validate_pool(slices) == []


def test_consumable_device_is_exact() -> None:
    slices = objects(8, names.SHARING_MODE_CONSUMABLE)
    assert len(slices) == 1
    gpu = MockBackend("node-a").discover()[2]
    device = slices[0]["spec"]["devices"][2]
    usable = gpu.memory_usable
    top = memory_policy_max(usable)
    assert top % (256 * MI) == 0 and usable - 256 * MI < top <= usable
    assert device == {
        "name": "gpu-2",
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "index": {"int": 2},
            "minor": {"int": 2},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "numaNode": {"int": 0},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "nvlinkDomain": {"string": "nvswitch"},
        },
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": {"min": "3", "max": "100", "step": "1"},
                },
            },
            "memory": {
                "value": device["capacity"]["memory"]["value"],
                "requestPolicy": {
                    "default": device["capacity"]["memory"]["requestPolicy"]["default"],
                    "validRange": {
                        "min": "256Mi",
                        "max": device["capacity"]["memory"]["requestPolicy"]["default"],
                        "step": "256Mi",
                    },
                },
            },
        },
    }
    memory = device["capacity"]["memory"]
    assert parse_quantity(memory["value"]) == usable
    assert parse_quantity(memory["requestPolicy"]["default"]) == top
    spec = slices[0]["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    meta = slices[0]["metadata"]
    assert meta["generateName"] == f"0000-{DRIVER}-node-a-"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]


def test_memory_policy_max() -> None:
    assert memory_policy_max(256 * MI) == 256 * MI
    assert memory_policy_max(256 * MI + 1) == 256 * MI
    assert memory_policy_max(81032 * MI) == 80896 * MI


def test_exclusive_devices_are_whole_gpus_only() -> None:
    slices = objects(8, names.SHARING_MODE_EXCLUSIVE)
    devices = devices_of(slices)
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    for d in devices:
        assert "allowMultipleAllocations" not in d
        assert all("requestPolicy" not in c for c in d["capacity"].values())
        assert d["capacity"]["cores"] == {"value": "100"}
    assert_valid(slices)


def test_partitions() -> None:
    gpus = MockBackend("node-a", count=2).discover()
    slices = objects(2, names.SHARING_MODE_PARTITIONS)
    assert [sorted(s["spec"]) for s in slices] == [
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["devices", "driver", "nodeName", "pool"],
    ]
    sets = slices[0]["spec"]["sharedCounters"]
    assert [s["name"] for s in sets] == ["gpu-0-counters", "gpu-1-counters"]
    assert sets[1]["counters"]["cores"] == {"value": "100"}
    assert parse_quantity(sets[1]["counters"]["memory"]["value"]) == gpus[1].memory_usable
    devices = slices[1]["spec"]["devices"]
    assert [d["name"] for d in devices[:15]] == [
        "gpu-0",
        "gpu-0-half-0",
        "gpu-0-half-1",
        *[f"gpu-0-quarter-{j}" for j in range(4)],
        *[f"gpu-0-eighth-{j}" for j in range(8)],
    ]
    assert len(devices) == 30
    by_name = {d["name"]: d for d in devices}
    quarter = by_name["gpu-1-quarter-3"]
    assert quarter["attributes"]["partition"] == {"string": "quarter"}
    assert quarter["attributes"]["parentUUID"] == {"string": gpus[1].uuid}
    assert quarter["attributes"]["uuid"] == {"string": gpus[1].uuid}
    assert quarter["attributes"]["index"] == {"int": 1}
    assert quarter["capacity"]["cores"] == {"value": "25"}
    assert parse_quantity(quarter["capacity"]["memory"]["value"]) == gpus[1].memory_usable // 4
    assert quarter["consumesCounters"] == [
        {"counterSet": "gpu-1-counters", "counters": quarter["consumesCounters"][0]["counters"]}
    ]
    assert by_name["gpu-0"]["attributes"]["partition"] == {"string": "whole"}
    assert by_name["gpu-0-eighth-0"]["capacity"]["cores"] == {"value": "12"}
    for device in devices:
        assert "allowMultipleAllocations" not in device
        # every profile's partitions together fit the counters
    for profile, parts in names.PARTITION_PROFILES.items():
        used = sum(
            parse_quantity(d["consumesCounters"][0]["counters"]["memory"]["value"])
            for d in devices
            if d["attributes"]["partition"]["string"] == profile
            and d["attributes"]["index"]["int"] == 0
        )
        assert len([d for d in devices if d["attributes"]["partition"]["string"] == profile]) == (
            2 * parts
        )
        assert used <= gpus[0].memory_usable
    assert_valid(slices)


@pytest.mark.parametrize("mode", names.SHARING_MODES)
@pytest.mark.parametrize("count", [1, 8, 64, 128])
def test_every_slice_is_valid_and_within_limits(mode: str, count: int) -> None:
    slices = objects(count, mode)
    assert_valid(slices)
    per_gpu = 15 if mode == names.SHARING_MODE_PARTITIONS else 1
    devices = devices_of(slices)
    assert len(devices) == count * per_gpu
    assert len({d["name"] for d in devices}) == len(devices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    for s in slices:
        assert not ("devices" in s["spec"] and "sharedCounters" in s["spec"])
    # the devices of one GPU stay in one slice
    for s in slices:
        indexes = {d["attributes"]["index"]["int"] for d in s["spec"].get("devices", [])}
        for other in slices:
            if other is not s:
                assert not indexes & {
                    d["attributes"]["index"]["int"] for d in other["spec"].get("devices", [])
                }


def test_split_counts() -> None:
    assert len(objects(128, names.SHARING_MODE_CONSUMABLE)) == 1
    # 64 GPUs x 15 partitions: 4 GPUs (60 devices) per slice, plus 8 counter slices of 8 sets
    slices = objects(64, names.SHARING_MODE_PARTITIONS)
    assert len(slices) == 8 + 16
    assert all(len(s["spec"]["sharedCounters"]) == 8 for s in slices[:8])
    assert all(len(s["spec"]["devices"]) == 60 for s in slices[8:])


def test_taints_lower_the_device_limit_and_cover_partitions() -> None:
    taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    slices = objects(128, names.SHARING_MODE_EXCLUSIVE, {"gpu-5": [taint]})
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64]
    assert devices_of(slices)[5]["taints"] == [taint]
    assert sum(1 for d in devices_of(slices) if "taints" in d) == 1
    assert_valid(slices)

    own = {"key": f"{DRIVER}/unhealthy", "value": "half", "effect": "NoExecute"}
    slices = objects(2, names.SHARING_MODE_PARTITIONS, {"gpu-1": [taint], "gpu-0-half-1": [own]})
    tainted = {d["name"]: d["taints"] for d in devices_of(slices) if "taints" in d}
    assert len(tainted) == 16
    assert all(t == [taint] for n, t in tainted.items() if n.startswith("gpu-1"))
    assert tainted["gpu-0-half-1"] == [own]
    assert_valid(slices)


def test_junk_versions_are_left_out() -> None:
    gpu = dataclasses.replace(MockBackend("n").discover()[0], driver_version="N/A")
    (content,) = desired_slices(node_devices([gpu], names.SHARING_MODE_EXCLUSIVE))
    assert "driverVersion" not in content["devices"][0]["attributes"]
    assert content["devices"][0]["attributes"]["cudaDriverVersion"] == {"version": "13.0.0"}


def test_unknown_topology_is_left_out() -> None:
    gpu = dataclasses.replace(MockBackend("n").discover()[0], numa_node=None, pcie_root=None)
    (content,) = desired_slices(node_devices([gpu], names.SHARING_MODE_CONSUMABLE))
    attrs = content["devices"][0]["attributes"]
    assert "numaNode" not in attrs and "resource.kubernetes.io/pcieRoot" not in attrs


def test_no_gpus_is_one_empty_slice() -> None:
    slices = resource_slice_objects(
        desired_slices(node_devices([], names.SHARING_MODE_CONSUMABLE)), DRIVER, "n", "u", 1
    )
    assert [s["spec"]["devices"] for s in slices] == [[]]
    assert_valid(slices)


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown sharing mode 'shared'"):
        desired_slices(node_devices(MockBackend("n").discover(), "shared"))


def test_names() -> None:
    assert slice_index(slice_generate_name(10, DRIVER, "node") + "x7k2p") == 10
    assert slice_index("random-name") is None
    assert slice_index("zzzz-gpu") is None
    long = slice_generate_name(1, DRIVER, "n" * 253)
    assert len(long) + 5 <= 253 and long.endswith("-") and "--" not in long[-3:]


def test_print_without_owner() -> None:
    (obj,) = resource_slice_objects(
        desired_slices(node_devices([], names.SHARING_MODE_CONSUMABLE)), DRIVER, "n", None, 1
    )
    assert "ownerReferences" not in obj["metadata"]


def test_long_non_ascii_strings_are_cut_to_64_bytes() -> None:
    [gpu] = MockBackend("node-a", count=1).discover()
    gpu = dataclasses.replace(gpu, product_name="NVIDIA H100 \u2013 " + "ü" * 60)
    [content] = desired_slices(node_devices([gpu], names.SHARING_MODE_EXCLUSIVE))
    name = content["devices"][0]["attributes"][names.ATTR_PRODUCT_NAME]["string"]
    assert len(name.encode()) <= 64 and name.startswith("NVIDIA H100 \u2013 ü")
    [obj] = resource_slice_objects([content], DRIVER, "node-a", "uid-1", 1)
    assert validate_resource_slice(obj) == []


def test_slices_are_packed_by_the_validators_device_limit() -> None:
    """The plugin packs by :func:`sharegpu.kube.slicerules.device_limit`, the rule the validator
    applies: every published slice stays within the limit its own devices set."""
    taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    for mode in names.SHARING_MODES:
        slices = objects(96, mode, {"gpu-40": [taint]})
        for s in slices:
            devices = s["spec"].get("devices") or []
            assert len(devices) <= device_limit(devices)
        assert_valid(slices)
