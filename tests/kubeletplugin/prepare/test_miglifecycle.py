"""The MIG instances seam of the claim state: which implementation a device table gets, and the
dynamic one's bookkeeping (health lookups, spec-file records) around create and destroy. The
crash and restart behaviour is tested through ``DeviceState`` in test_dynamic_mig.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeletplugin.devices.table import node_devices
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.checkpoint import STATE_STARTED, ClaimRecord
from kubeletplugin.prepare.miglifecycle import (
    DynamicMigInstances,
    NoMigInstances,
    claim_instances,
)
from tests.kubeletplugin.prepare.helpers import gpus
from tests.kubeletplugin.prepare.migfakes import FakePartitioner, mig_node_devices
from tests.kubeletplugin.sharing.helpers import record


def _ids(name: str, gpu: GpuInfo | None) -> tuple[str, ...]:
    return (f"test/{name}={'none' if gpu is None else gpu.uuid}",)


def test_a_table_without_dynamic_mig_gets_no_instances() -> None:
    devices = node_devices(gpus(2), "consumable")
    instances = claim_instances(None, devices, _ids)
    assert isinstance(instances, NoMigInstances)
    gpu = devices.gpus[0]
    rec = ClaimRecord("u1", "ns", "c", STATE_STARTED, (record(gpu, "gpu-0", ("r",), 30, 2**30),))
    assert instances.create(rec, lambda _rec: pytest.fail("nothing to record")) is rec
    instances.destroy(rec)
    assert instances.recover({"u1": rec}, set()) == set()
    assert instances.from_spec(rec.devices[0]) is rec.devices[0]
    assert instances.hidden_devices() == frozenset()
    assert instances.device_for(gpu.uuid, 1) is None


def test_dynamic_mig_devices_need_a_partitioner() -> None:
    with pytest.raises(ValueError, match="dynamic MIG devices but no MIG partitioner"):
        claim_instances(None, mig_node_devices(), _ids)
    assert isinstance(
        claim_instances(FakePartitioner(), mig_node_devices(), _ids), DynamicMigInstances
    )


def test_a_created_instance_is_recorded_resolved_and_forgotten_with_its_destroy() -> None:
    devices = mig_node_devices()
    fake = FakePartitioner()
    instances = claim_instances(fake, devices, _ids)
    device = next(d for d in devices if d.dynamic_mig)
    started = ClaimRecord(
        "u1",
        "ns",
        "c",
        STATE_STARTED,
        (record(device.gpu, device.name, ("r",), 0, 0),),
    )
    seen: list[ClaimRecord] = []
    created = instances.create(started, seen.append)
    assert seen == [created]
    (d,) = created.devices
    assert d.mig_gpu_instance is not None and d.mig_uuid is not None
    assert d.gpu.uuid == d.mig_uuid  # the record is attached to its MIG device
    assert d.cores == 100 and d.memory == d.gpu.memory_usable
    assert d.cdi_device_ids == _ids(d.cdi_name, d.gpu)
    assert instances.device_for(device.gpu.uuid, d.mig_gpu_instance) == device.name
    instances.destroy(created)
    assert instances.device_for(device.gpu.uuid, d.mig_gpu_instance) is None
    assert not list(fake.instances(device.gpu))


def test_a_spec_files_mig_device_is_recorded_on_its_physical_gpu() -> None:
    devices = mig_node_devices()
    instances = claim_instances(FakePartitioner(), devices, _ids)
    device = next(d for d in devices if d.dynamic_mig)
    from_spec = record(device.gpu, device.name, ("r",), 100, 2**30)
    spec_device = replace(from_spec, gpu_uuid="MIG-1234")
    recorded = instances.from_spec(spec_device)
    assert (recorded.gpu_uuid, recorded.mig_uuid) == (device.gpu.uuid, "MIG-1234")
    assert instances.from_spec(from_spec) is from_spec  # already on the physical GPU
