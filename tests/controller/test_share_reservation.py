"""What a consumable share reserves is one rule (:func:`api.sharepolicy.share_reservation`):
the node plugin grants, the tracker counts and the GpuQuota charge charges the same amounts for
every ``consumedCapacity``, the tracker reading the slices exactly as the plugin publishes them."""

from __future__ import annotations

import pytest

from api import names
from api.quantity import parse_quantity
from api.sharepolicy import (
    memory_policy_max,
    recorded_amounts,
    reserved_amounts,
    share_reservation,
)
from controller.quotacharge import ChargeBasis, basis_of, claim_charge
from controller.reconcile import claim_allocations, newest_generation, pool_hardware
from controller.records import claim_record, slice_record
from kubeletplugin.devices.mock import default_gpu
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from kubeletplugin.prepare.claims import AllocationResult, ClaimError
from kubeletplugin.prepare.shares import device_record
from sharegpu.admission.checks import reserved_cores, reserved_memory
from sharegpu.allocator import allocate
from tests.controller import helpers as h

NODE = "worker-1"
GI = 1024**3
QUALIFIED_CORES = names.qualify(h.DRIVER, names.CAP_CORES)


def _int(_name: str, value: object) -> int:
    return int(str(value))


def test_each_missing_amount_is_the_whole_amount() -> None:
    whole = (100, 80 * GI)
    assert share_reservation(None, h.DRIVER, whole, _int) == whole
    assert share_reservation({}, h.DRIVER, whole, _int) == whole
    assert share_reservation({"cores": "30"}, h.DRIVER, whole, _int) == (30, 80 * GI)
    assert share_reservation({"memory": "7"}, h.DRIVER, whole, _int) == (100, 7)
    assert share_reservation({QUALIFIED_CORES: "20"}, h.DRIVER, whole, _int) == (20, 80 * GI)
    # The plain name wins over the qualified one; other capacities are not read.
    both = {"cores": "10", QUALIFIED_CORES: "20", "other": "x"}
    assert recorded_amounts(both, h.DRIVER, _int) == (10, None)
    assert reserved_amounts((None, 5), whole) == (100, 5)
    assert reserved_amounts(None, whole) == whole


@pytest.mark.parametrize(
    "consumed",
    [
        {"cores": "30", "memory": "10Gi"},
        {"memory": "10Gi"},
        {"cores": "30"},
        {QUALIFIED_CORES: "45", "memory": "2Gi"},
        {},
    ],
    ids=["both", "no-cores", "no-memory", "qualified", "empty"],
)
def test_node_tracker_and_quota_agree_on_what_a_share_reserves(consumed: dict[str, str]) -> None:
    gpus = [default_gpu(NODE, 0, 1)]
    devices = node_devices(gpus, names.SHARING_MODE_CONSUMABLE)
    result = AllocationResult("gpu", NODE, "gpu-0", share_id="s", consumed_capacity=dict(consumed))
    node = device_record(
        [result], devices["gpu-0"], h.DRIVER, "claim default/a", cdi_name="a", cdi_device_ids=()
    )

    [obj] = resource_slice_objects(desired_slices(devices, None), h.DRIVER, NODE, None, 1)
    obj["metadata"]["name"] = "slice-0"
    [(pool, pool_slices)] = newest_generation([slice_record(obj, h.DRIVER)]).items()
    hardware, published = pool_hardware(pool, pool_slices)
    claim = h.claim(
        "a", [{**h.result(NODE, "gpu-0"), "shareID": "s", "consumedCapacity": consumed}]
    )
    record = claim_record(claim, h.DRIVER)
    assert record is not None
    [alloc] = claim_allocations(record, {(pool, n): d for n, d in published.items()}, hardware, {})

    assert (alloc.cores, alloc.memory) == (node.cores, node.memory)

    # The GpuQuota charge reads the same amounts; a missing memory amount is charged the
    # largest grantable memory of the largest GPU (it cannot know which GPU the share is on).
    basis = ChargeBasis(largest_memory=gpus[0].memory_usable)
    charged, allocated = claim_charge(claim, h.DRIVER, ("gpu",), basis)
    assert allocated and charged.devices == 1 and charged.cores == node.cores
    if "memory" in consumed:
        assert charged.memory == node.memory
    else:
        assert charged.memory == memory_policy_max(gpus[0].memory_usable)


def test_a_fractional_consumed_amount_is_refused_by_the_node_and_counted_whole() -> None:
    """The published policies make kube-scheduler record whole amounts. A fraction (some other
    policy's allocation) is refused at prepare rather than granted rounded up; the tracker and
    the GpuQuota charge count it rounded up, never less than kube-scheduler holds."""
    consumed = {"cores": "12500m", "memory": "10Gi"}
    gpus = [default_gpu(NODE, 0, 1)]
    devices = node_devices(gpus, names.SHARING_MODE_CONSUMABLE)
    result = AllocationResult("gpu", NODE, "gpu-0", share_id="s", consumed_capacity=consumed)
    with pytest.raises(ClaimError, match=r"consumedCapacity\.cores: '12500m' is not a whole"):
        device_record(
            [result], devices["gpu-0"], h.DRIVER, "claim default/a", cdi_name="a", cdi_device_ids=()
        )

    [obj] = resource_slice_objects(desired_slices(devices, None), h.DRIVER, NODE, None, 1)
    obj["metadata"]["name"] = "slice-0"
    [(pool, pool_slices)] = newest_generation([slice_record(obj, h.DRIVER)]).items()
    hardware, published = pool_hardware(pool, pool_slices)
    claim = h.claim(
        "a", [{**h.result(NODE, "gpu-0"), "shareID": "s", "consumedCapacity": consumed}]
    )
    record = claim_record(claim, h.DRIVER)
    assert record is not None
    [alloc] = claim_allocations(record, {(pool, n): d for n, d in published.items()}, hardware, {})
    assert (alloc.cores, alloc.memory) == (13, 10 * GI)
    basis = ChargeBasis(largest_memory=gpus[0].memory_usable)
    charged, _ = claim_charge(claim, h.DRIVER, ("gpu",), basis)
    assert (charged.cores, charged.memory) == (13, 10 * GI)


@pytest.mark.parametrize(
    ("asked", "whole", "cores", "memory"),
    [
        ({"cores": "150m", "memory": "1000Mi"}, 1, 3, GI),
        ({"cores": "2", "memory": "1Gi"}, 2, 3, GI),
        ({"cores": "12.5", "memory": "1073741824.5"}, 13, 13, GI + 256 * 1024**2),
        ({"cores": "99001m", "memory": "256Mi"}, 100, 100, 256 * 1024**2),
    ],
    ids=["below-min", "below-smallest-share", "fractions", "milli"],
)
def test_fractional_requests_reserve_the_same_everywhere(
    asked: dict[str, str], whole: int, cores: int, memory: int
) -> None:
    """A fractional request is rounded up by the policy, exactly and once: the GpuQuota charge
    before allocation (from the published GPUs), the allocation's ``consumedCapacity``, the
    node's grant and the tracker's count agree. The admission checks round to whole percent
    (``whole``); the GPU's smallest share (3 cores on an H100 of 48 MPS clients) then applies."""
    gpus = [default_gpu(NODE, 0, 1)]
    devices = node_devices(gpus, names.SHARING_MODE_CONSUMABLE)
    [obj] = resource_slice_objects(desired_slices(devices, None), h.DRIVER, NODE, None, 1)
    obj["metadata"]["name"] = "slice-0"
    claim = h.claim("a")
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": asked}
    assert reserved_cores(parse_quantity(asked["cores"])) == whole
    assert reserved_memory(parse_quantity(asked["memory"])) == memory

    [(pool, pool_slices)] = newest_generation([slice_record(obj, h.DRIVER)]).items()
    [hw] = pool_hardware(pool, pool_slices)[0].values()
    assert hw.min_share_cores == 3
    basis = basis_of([(hw.node, hw.memory, hw.min_share_cores)])
    charged, allocated = claim_charge(claim, h.DRIVER, ("gpu",), basis)
    assert not allocated and (charged.cores, charged.memory) == (cores, memory)

    device_class = {
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{h.DRIVER}'"}}]},
    }
    outcome = allocate(claim, [obj], [device_class], node=NODE)
    assert outcome.allocation is not None, outcome
    [result] = outcome.allocation["devices"]["results"]
    consumed = result["consumedCapacity"]
    assert (parse_quantity(consumed["cores"]), parse_quantity(consumed["memory"])) == (
        cores,
        memory,
    )

    node = device_record(
        [AllocationResult("gpu", NODE, "gpu-0", share_id="s", consumed_capacity=consumed)],
        devices["gpu-0"],
        h.DRIVER,
        "claim default/a",
        cdi_name="a",
        cdi_device_ids=(),
    )
    assert (node.cores, node.memory) == (cores, memory)
    claim["status"] = {"allocation": outcome.allocation}
    record = claim_record(claim, h.DRIVER)
    assert record is not None
    [(pool, pool_slices)] = newest_generation([slice_record(obj, h.DRIVER)]).items()
    hardware, published = pool_hardware(pool, pool_slices)
    [alloc] = claim_allocations(record, {(pool, n): d for n, d in published.items()}, hardware, {})
    assert (alloc.cores, alloc.memory) == (cores, memory)
    charged, allocated = claim_charge(claim, h.DRIVER, ("gpu",), basis)
    assert allocated and (charged.cores, charged.memory) == (cores, memory)
