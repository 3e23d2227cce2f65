"""The reconcile reads the slices exactly as the kubelet plugin publishes them, in each mode."""

from __future__ import annotations

from typing import Any

import pytest

from api import names
from api.quantity import format_quantity, quantity_int
from controller.reconcile import reconcile
from kubeletplugin.devices.mock import default_gpu
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import allocate_many, seeded_share_ids
from tests.controller import helpers as h

NODE = "worker-1"


def plugin_slices(mode: str, taints: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    gpus = [default_gpu(NODE, i, 4) for i in range(4)]
    objs = resource_slice_objects(
        desired_slices(node_devices(gpus, mode), taints), h.DRIVER, NODE, None, 3
    )
    for i, obj in enumerate(objs):  # the API server would name them from generateName
        obj["metadata"]["name"] = f"{obj['metadata']['generateName']}{i}"
    return objs


@pytest.mark.parametrize("mode", names.SHARING_MODES)
def test_spec_matches_the_discovered_gpus(mode: str) -> None:
    objs = reconcile(plugin_slices(mode), [], [], h.DRIVER)
    assert sorted(objs) == [names.gpu_object_name(NODE, i) for i in range(4)]
    for i in range(4):
        gpu, spec = default_gpu(NODE, i, 4), objs[names.gpu_object_name(NODE, i)].spec
        assert (spec.node, spec.index, spec.uuid, spec.model) == (
            NODE,
            i,
            gpu.uuid,
            gpu.product_name,
        )
        assert quantity_int(spec.memory) == gpu.memory_usable
        assert spec.cores == 100 and spec.sharing_mode == mode and spec.pool == NODE


def test_partitions_sum_on_their_gpu() -> None:
    claims = [
        h.claim("half", [h.result(NODE, "gpu-1-half-0")]),
        h.claim("quarter", [h.result(NODE, "gpu-1-quarter-2")]),
        h.claim("whole", [h.result(NODE, "gpu-2")]),
    ]
    objs = reconcile(plugin_slices(names.SHARING_MODE_PARTITIONS), claims, [], h.DRIVER)
    usable = default_gpu(NODE, 1, 4).memory_usable
    g1 = objs[names.gpu_object_name(NODE, 1)].status
    assert g1.allocated.cores == 50 + 25
    assert quantity_int(g1.allocated.memory) == usable // 2 + usable // 4
    assert g1.claim_count == 2
    g2 = objs[names.gpu_object_name(NODE, 2)].status
    assert g2.allocatable.cores == 0 and g2.allocatable.memory == "0"


def test_consumable_shares_as_the_scheduler_records_them() -> None:
    claims = [
        h.claim("a", [h.result(NODE, "gpu-0", cores=30, memory="10Gi")]),
        h.claim("b", [h.result(NODE, "gpu-0", cores=70, memory="20Gi")]),
    ]
    objs = reconcile(plugin_slices(names.SHARING_MODE_CONSUMABLE), claims, [], h.DRIVER)
    status = objs[names.gpu_object_name(NODE, 0)].status
    usable = default_gpu(NODE, 0, 4).memory_usable
    assert status.cores_summary == "100/100"
    assert status.allocatable.memory == format_quantity(usable - 30 * h.GI)


def test_health_taint_from_the_plugin() -> None:
    taint = {"key": names.unhealthy_taint_key(h.DRIVER), "value": "Xid79", "effect": "NoSchedule"}
    slices = plugin_slices(names.SHARING_MODE_PARTITIONS, {"gpu-3": [taint]})
    objs = reconcile(slices, [], [], h.DRIVER)
    assert objs[names.gpu_object_name(NODE, 3)].status.health == "Unhealthy"
    assert objs[names.gpu_object_name(NODE, 3)].status.health_reason == "Xid79"
    assert objs[names.gpu_object_name(NODE, 0)].status.health == "Healthy"


def test_allocations_written_by_the_allocator() -> None:
    """Claims allocated by the project's allocator (kube-scheduler's semantics) add up."""
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": h.DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{h.DRIVER}'"}}]},
    }
    claims = []
    for i in range(10):
        c = h.claim(f"c{i}")
        c["spec"]["devices"]["requests"][0]["exactly"] = {
            "deviceClassName": h.DRIVER,
            "capacity": {"requests": {"cores": "30", "memory": "1000Mi"}},
        }
        claims.append(c)
    slices = plugin_slices(names.SHARING_MODE_CONSUMABLE)
    outcomes = allocate_many(
        claims, slices, [device_class], node=NODE, share_ids=seeded_share_ids(1)
    )
    for c, outcome in zip(claims, outcomes, strict=True):
        assert outcome.allocation is not None, outcome.error
        c["status"] = {"allocation": outcome.allocation}
    objs = reconcile(slices, claims, [], h.DRIVER)
    # 10 shares of 30 cores: 3 per GPU on the first three GPUs, one on the fourth
    assert sum(o.status.allocated.cores for o in objs.values()) == 300
    # memory is reserved in 256Mi steps: 1000Mi becomes 1Gi
    total = sum(quantity_int(o.status.allocated.memory) for o in objs.values())
    assert total == 10 * h.GI
    assert all(o.status.allocated.cores <= 100 for o in objs.values())
