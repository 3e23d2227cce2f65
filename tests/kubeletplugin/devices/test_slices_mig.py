"""Dynamic MIG in the published slices: one device per placement of each MIG profile, the
counter set that models the GPU's memory and compute slices, hidden placements, taints, limits."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes_validate
import pytest

from api import names
from kubeletplugin.devices import migtables
from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from kubeletplugin.model import GpuInfo, MigProfile
from sharegpu.allocator import gather_pools
from sharegpu.kube import slicerules

DRIVER = names.DEFAULT_DRIVER_NAME
NODE = "node-a"
DYNAMIC = names.MIG_STRATEGY_DYNAMIC
PARTITIONS = names.SHARING_MODE_PARTITIONS


def mig_gpu(gpu: GpuInfo, profiles: Sequence[MigProfile] = migtables.H100_80GB) -> GpuInfo:
    """``gpu`` in MIG mode, able to create ``profiles``."""
    return dataclasses.replace(gpu, mig_mode="Enabled", mig_profiles=tuple(profiles))


def node(
    count: int = 1, mig: Sequence[int] | None = None, profiles: Sequence[MigProfile] = ()
) -> list[GpuInfo]:
    """``count`` mock H100s, those of index in ``mig`` (default: all) in MIG mode."""
    gpus = MockBackend(NODE, count=count).discover()
    chosen = range(count) if mig is None else mig
    table = tuple(profiles) or migtables.H100_80GB
    return [mig_gpu(g, table) if g.index in chosen else g for g in gpus]


def contents(
    gpus: Sequence[GpuInfo],
    taints: Mapping[str, Any] | None = None,
    hidden: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    return desired_slices(node_devices(gpus, PARTITIONS, mig_strategy=DYNAMIC), taints, hidden)


def devices_of(slices: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s.get("devices", [])}


def counter_sets(slices: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["counters"] for s in slices for c in s.get("sharedCounters", [])}


def memory(k: int) -> str:
    return names.memory_slice_counter(k)


def test_counter_set_of_an_h100() -> None:
    (counters,) = counter_sets(contents(node())).values()
    expected = {memory(k): {"value": "1"} for k in range(8)}
    expected[names.COUNTER_COMPUTE_SLICES] = {"value": "7"}
    # only 1g.10gb+me (profile id 20) allows fewer instances (1) than it has placements (7)
    expected[names.profile_instances_counter(20)] = {"value": "1"}
    assert counters == expected


def test_counter_set_of_an_a100() -> None:
    gpus = [
        dataclasses.replace(
            mig_gpu(MockBackend(NODE, count=1).discover()[0], migtables.A100_40GB),
            product_name=migtables.A100_40GB_PRODUCT,
        )
    ]
    (counters,) = counter_sets(contents(gpus)).values()
    assert set(counters) == {
        *(memory(k) for k in range(8)),
        names.COUNTER_COMPUTE_SLICES,
        names.profile_instances_counter(20),
    }
    assert len(devices_of(contents(gpus))) == 25


def test_placement_device_is_exact() -> None:
    gpu = node()[0]
    device = devices_of(contents([gpu]))["gpu-0-mig-1g-10gb-me-3"]
    assert device == {
        "name": "gpu-0-mig-1g-10gb-me-3",
        "attributes": {
            # the parent's attributes, but no uuid: the MIG device exists only after prepare
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "index": {"int": 0},
            "minor": {"int": 0},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "numaNode": {"int": 0},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "parentUUID": {"string": gpu.uuid},
            "parentIndex": {"int": 0},
            "profile": {"string": "1g.10gb+me"},
            "migProfileId": {"int": 20},
            "placementStart": {"int": 3},
            "placementSize": {"int": 1},
            "multiprocessorCount": {"int": 16},
            "copyEngineCount": {"int": 1},
            "decoderCount": {"int": 1},
            "encoderCount": {"int": 0},
            "jpegCount": {"int": 1},
            "ofaCount": {"int": 1},
            "migDynamic": {"bool": True},
        },
        "capacity": {"memory": {"value": "9984Mi"}},
        "consumesCounters": [
            {
                "counterSet": "gpu-0-counters",
                "counters": {
                    memory(3): {"value": "1"},
                    names.COUNTER_COMPUTE_SLICES: {"value": "1"},
                    names.profile_instances_counter(20): {"value": "1"},
                },
            }
        ],
    }


@pytest.mark.parametrize(
    ("name", "slots", "compute"),
    [
        ("gpu-0-mig-1g-10gb-6", [6], 1),
        ("gpu-0-mig-1g-20gb-6", [6, 7], 1),
        ("gpu-0-mig-2g-20gb-2", [2, 3], 2),
        ("gpu-0-mig-3g-40gb-4", [4, 5, 6, 7], 3),
        ("gpu-0-mig-4g-40gb-0", [0, 1, 2, 3], 4),
        ("gpu-0-mig-7g-80gb-0", list(range(8)), 7),
    ],
)
def test_each_placement_consumes_its_memory_slices_and_compute_slices(
    name: str, slots: list[int], compute: int
) -> None:
    (consumption,) = devices_of(contents(node()))[name]["consumesCounters"]
    expected = {memory(k): {"value": "1"} for k in slots}
    expected[names.COUNTER_COMPUTE_SLICES] = {"value": str(compute)}
    assert consumption == {"counterSet": "gpu-0-counters", "counters": expected}


def test_every_placement_of_every_profile_is_published() -> None:
    published = devices_of(contents(node()))
    expected = {
        names.mig_placement_device_name(0, p.name, placement.start)
        for p in migtables.H100_80GB
        for placement in p.placements
    }
    assert set(published) == expected
    assert len(published) == 25
    for device in published.values():
        attrs = device["attributes"]
        assert names.ATTR_UUID not in attrs
        total = len(attrs) + len(device["capacity"])
        assert total <= slicerules.MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE


@pytest.mark.parametrize("count", [1, 2, 3, 8, 9])
def test_slices_are_valid_and_within_limits(count: int) -> None:
    """Full ResourceSlice objects pass the API server's rules (counter names are DNS labels,
    at most 64 devices per slice with counters, 8 counter sets, 32 counters per set) and the
    strict schemas; a GPU's placements stay in one slice."""
    objects = resource_slice_objects(contents(node(count)), DRIVER, NODE, "uid-1", 1)
    for obj in objects:
        assert slicerules.validate_resource_slice(obj) == []
        kubernetes_validate.validate(obj, "1.36", strict=True)
        spec = obj["spec"]
        assert (
            len(spec.get("devices", [])) <= slicerules.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        )
        assert len(spec.get("sharedCounters", [])) <= slicerules.MAX_SHARED_COUNTER_SETS_PER_SLICE
        for counter_set in spec.get("sharedCounters", []):
            assert len(counter_set["counters"]) <= slicerules.MAX_COUNTERS_PER_SET
    assert slicerules.validate_pool(list[Mapping[str, Any]](objects)) == []
    where: dict[str, set[int]] = {}
    for i, obj in enumerate(objects):
        for d in obj["spec"].get("devices", []):
            where.setdefault(d["attributes"]["parentUUID"]["string"], set()).add(i)
    assert len(where) == count and all(len(s) == 1 for s in where.values())


def test_allocator_sees_a_valid_pool() -> None:
    """Every consumesCounters entry names a counter set and counter of the pool."""
    objects = resource_slice_objects(contents(node(2)), DRIVER, NODE, "uid-1", 1)
    for obj in objects:
        obj["metadata"]["name"] = obj["metadata"].pop("generateName") + "x"
    (pool,) = gather_pools(objects, NODE)
    assert pool.invalid_reason is None
    assert len(pool.candidates) == 50


def test_mixed_node_keeps_partitions_on_non_mig_gpus() -> None:
    gpus = node(2, mig=[1])
    slices = contents(gpus)
    sets = counter_sets(slices)
    assert set(sets["gpu-0-counters"]) == {names.CAP_CORES, names.CAP_MEMORY}
    assert names.COUNTER_COMPUTE_SLICES in sets["gpu-1-counters"]
    published = devices_of(slices)
    assert {"gpu-0", "gpu-0-half-0", "gpu-0-eighth-7"} <= set(published)
    assert published["gpu-0-half-1"]["consumesCounters"][0]["counters"].keys() == {
        names.CAP_CORES,
        names.CAP_MEMORY,
    }
    assert "gpu-1" not in published and "gpu-1-mig-7g-80gb-0" in published
    # the non-MIG GPU's slices are what a node without MIG publishes
    plain = desired_slices(node_devices(gpus[:1], PARTITIONS))
    assert [published[d["name"]] for s in plain for d in s.get("devices", [])] == [
        d for s in plain for d in s.get("devices", [])
    ]


def test_hidden_placements_are_left_out_counters_stay() -> None:
    full = contents(node())
    hidden = frozenset({"gpu-0-mig-4g-40gb-0", "gpu-0-mig-1g-10gb-2", "gpu-0-mig-7g-80gb-0"})
    partial = contents(node(), hidden=hidden)
    assert set(devices_of(partial)) == set(devices_of(full)) - hidden
    assert counter_sets(partial) == counter_sets(full)


def test_taints_of_the_gpu_cover_every_placement_and_own_taints_stay_own() -> None:
    gpu_taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    own = {"key": f"{DRIVER}/unhealthy", "value": "XID-94", "effect": "NoExecute"}
    published = devices_of(contents(node(2), {"gpu-0": [gpu_taint], "gpu-1-mig-3g-40gb-4": [own]}))
    for name, device in published.items():
        if name.startswith("gpu-0-"):
            assert device["taints"] == [gpu_taint]
        elif name == "gpu-1-mig-3g-40gb-4":
            assert device["taints"] == [own]
        else:
            assert "taints" not in device


def test_static_strategy_is_unchanged() -> None:
    """Without --mig dynamic, a MIG GPU's profiles publish nothing new."""
    gpus = node(1)
    assert desired_slices(node_devices(gpus, PARTITIONS)) == desired_slices(
        node_devices([dataclasses.replace(gpus[0], mig_profiles=())], PARTITIONS)
    )
