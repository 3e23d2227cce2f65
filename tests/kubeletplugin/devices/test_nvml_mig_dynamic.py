"""Dynamic MIG through NVML: profile discovery and :class:`NvmlMigPartitioner` over the fake
pynvml module, whose H100 and A100 follow :mod:`kubeletplugin.devices.migtables`."""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

import pytest

from kubeletplugin.devices import migtables
from kubeletplugin.devices.migpartition import MigError, MigPartitioner
from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.devices.nvmlmig import NvmlMigPartitioner
from kubeletplugin.model import GpuInfo, MigPlacement, MigProfile
from tests.kubeletplugin.devices.helpers import (
    NVML_ERROR_IN_USE,
    FakeNvml,
    NVMLError_Unknown,
    h100_mig,
    mig_a100_empty,
    mig_h100,
    mig_h100_empty,
    nvml_error,
)

NO_SYSFS = Path("/nonexistent")


def setup(*gpus: dict) -> tuple[FakeNvml, list[GpuInfo], NvmlMigPartitioner]:  # type: ignore[type-arg]
    fake = FakeNvml(list(gpus))
    backend = NvmlBackend(nvml=fake.module(), sysfs_root=NO_SYSFS)
    return fake, backend.discover(), NvmlMigPartitioner(backend)


def profile(gpu: GpuInfo, name: str) -> MigProfile:
    return next(p for p in gpu.mig_profiles if p.name == name)


@pytest.mark.parametrize(
    ("make", "table"),
    [(mig_h100_empty, migtables.H100_80GB), (mig_a100_empty, migtables.A100_40GB)],
)
def test_discovered_profiles_equal_the_reference_table(make, table) -> None:  # type: ignore[no-untyped-def]
    _fake, (gpu,), _part = setup(make(0))
    assert gpu.mig_profiles == table


def test_profiles_without_driver_names_are_derived(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([mig_h100_empty(0)])
    module = fake.module()
    real = module.nvmlDeviceGetGpuInstanceProfileInfo

    def v1_only(handle: object, index: int, version: int = 2) -> object:
        info = real(handle, index, version=1)
        return info

    module.nvmlDeviceGetGpuInstanceProfileInfo = v1_only  # type: ignore[attr-defined]
    (gpu,) = NvmlBackend(nvml=module, sysfs_root=NO_SYSFS).discover()
    assert [p.name for p in gpu.mig_profiles] == [p.name for p in migtables.H100_80GB]


def test_a_profile_error_leaves_profiles_empty_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = mig_h100_empty(0)
    gpu["faults"] = {"nvmlDeviceGetGpuInstancePossiblePlacements": NVMLError_Unknown()}
    with caplog.at_level(logging.WARNING):
        _fake, (info,), _part = setup(gpu)
    assert info.mig_profiles == () and info.mig_mode == "Enabled"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "GPU 0" in lines[0] and "NVML error code 999" in lines[0]
    assert all(r.exc_info is None for r in caplog.records)


def test_a_huge_placement_count_is_refused_not_allocated(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([mig_h100_empty(0)])
    module = fake.module()

    def broken(handle: object, profile_id: int, array: object, count_ref: object) -> int:
        count_ref._obj.value = 2**31  # type: ignore[attr-defined]
        return 0

    module.nvmlDeviceGetGpuInstancePossiblePlacements = broken  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING):
        (gpu,) = NvmlBackend(nvml=module, sysfs_root=NO_SYSFS).discover()
    assert gpu.mig_profiles == ()
    assert "2147483648 placements" in caplog.text


def test_pending_or_disabled_mig_reads_no_profiles() -> None:
    pending = mig_h100_empty(0)
    pending["mig"] = (1, 0)
    disabled = mig_h100_empty(1)
    disabled["mig"] = (0, 0)
    fake, gpus, _part = setup(pending, disabled)
    assert [g.mig_profiles for g in gpus] == [(), ()]
    assert "nvmlDeviceGetGpuInstanceProfileInfo" not in fake.calls


def test_static_mig_devices_get_their_placement_when_nvml_has_it() -> None:
    fake = FakeNvml([mig_h100(0, h100_mig(0, "1g.10gb", 9))])
    fake.create_instance(0, "3g.40gb", 4)
    (gpu,) = NvmlBackend(nvml=fake.module(), sysfs_root=NO_SYSFS).discover()
    by_gi = {d.mig.gpu_instance: d.mig for d in gpu.mig_devices if d.mig}
    assert (by_gi[9].placement, by_gi[9].profile_id) == (None, None)
    created = next(m for gi, m in by_gi.items() if gi != 9)
    assert (created.placement, created.profile_id) == (MigPlacement(4, 4), 9)


@pytest.mark.parametrize("make", [mig_h100_empty, mig_a100_empty])
def test_create_works_at_every_placement_of_every_profile(make) -> None:  # type: ignore[no-untyped-def]
    fake, (gpu,), part = setup(make(0))
    for prof in gpu.mig_profiles:
        for placement in prof.placements:
            device = part.create(gpu, prof, placement)
            assert device.mig is not None
            assert (device.mig.placement, device.mig.profile_id) == (placement, prof.profile_id)
            assert (device.mig.profile, device.mig.gpu_slices) == (prof.name, prof.slice_count)
            assert device.mig.compute_slices == prof.slice_count
            assert device.memory_total == prof.memory_mb * 1024**2
            assert device.uuid.startswith("MIG-") and device.mig.parent_uuid == gpu.uuid
            assert part.instances(gpu) == (device,)
            assert part.destroy(gpu, device.mig.gpu_instance) is True
            assert part.instances(gpu) == ()
    assert fake.gpus[0]["gpuInstances"] == {}
    assert all(slot is None for slot in fake.gpus[0]["migSlots"])


def test_a_created_device_is_what_discovery_then_reports() -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    created = part.create(gpu, profile(gpu, "2g.20gb"), MigPlacement(2, 2))
    (again,) = NvmlBackend(nvml=fake.module(), sysfs_root=NO_SYSFS).discover()
    (seen,) = again.mig_devices
    assert seen.uuid == created.uuid and seen.mig == created.mig


def test_a_create_the_placement_rule_refuses_leaves_nothing() -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    part.create(gpu, profile(gpu, "3g.40gb"), MigPlacement(0, 4))
    overlapping = profile(gpu, "1g.10gb")
    assert migtables.placement_problem(
        gpu.mig_profiles, [(9, MigPlacement(0, 4))], overlapping.profile_id, MigPlacement(2, 1)
    )
    with pytest.raises(MigError) as err:
        part.create(gpu, overlapping, MigPlacement(2, 1))
    message = str(err.value)
    assert "\n" not in message and "GPU 0" in message and gpu.uuid in message
    assert "1g.10gb" in message and "2:1" in message and "error code 23" in message
    assert len(part.instances(gpu)) == 1 and len(fake.gpus[0]["gpuInstances"]) == 1


def test_a_failed_compute_instance_destroys_the_gpu_instance() -> None:
    fake, (gpu,), part = setup(mig_a100_empty(0))
    fake.faults["nvmlGpuInstanceCreateComputeInstance"] = NVMLError_Unknown()
    with pytest.raises(MigError, match="NVML error code 999"):
        part.create(gpu, profile(gpu, "1g.5gb"), MigPlacement(3, 1))
    assert fake.gpus[0]["gpuInstances"] == {}
    assert "nvmlGpuInstanceDestroy" in fake.calls


def test_a_failure_whose_rollback_fails_says_what_is_left() -> None:
    fake, (gpu,), part = setup(mig_a100_empty(0))
    fake.faults["nvmlGpuInstanceCreateComputeInstance"] = NVMLError_Unknown()
    fake.faults["nvmlGpuInstanceDestroy"] = NVMLError_Unknown(42)
    with pytest.raises(MigError, match="left behind"):
        part.create(gpu, profile(gpu, "1g.5gb"), MigPlacement(3, 1))


def test_a_compute_profile_of_the_wrong_size_is_refused() -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    wrong = dataclasses.replace(profile(gpu, "3g.40gb"), compute_profile=0)
    with pytest.raises(MigError, match="1 slices, not the GPU instance's 3"):
        part.create(gpu, wrong, MigPlacement(0, 4))
    assert fake.gpus[0]["gpuInstances"] == {}


def test_destroy_is_idempotent() -> None:
    _fake, (gpu,), part = setup(mig_h100_empty(0))
    device = part.create(gpu, profile(gpu, "7g.80gb"), MigPlacement(0, 8))
    assert device.mig is not None
    assert part.destroy(gpu, device.mig.gpu_instance) is True
    assert part.destroy(gpu, device.mig.gpu_instance) is False
    assert part.destroy(gpu, 42) is False


def test_destroy_in_use_is_an_error_naming_processes() -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    device = part.create(gpu, profile(gpu, "1g.10gb"), MigPlacement(0, 1))
    assert device.mig is not None
    fake.faults["nvmlComputeInstanceDestroy"] = nvml_error(NVML_ERROR_IN_USE)
    with pytest.raises(MigError, match="processes still use") as err:
        part.destroy(gpu, device.mig.gpu_instance)
    assert "GPU 0" in str(err.value) and f"GPU instance {device.mig.gpu_instance}" in str(err.value)
    del fake.faults["nvmlComputeInstanceDestroy"]
    fake.faults["nvmlGpuInstanceDestroy"] = nvml_error(NVML_ERROR_IN_USE)
    with pytest.raises(MigError, match="processes still use it"):
        part.destroy(gpu, device.mig.gpu_instance)


def test_instances_lists_what_someone_else_created() -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    fake.create_instance(0, "3g.40gb", 4)
    fake.create_instance(0, "1g.10gb", 1, with_ci=False)
    listed = part.instances(gpu)
    assert [(d.mig.profile, d.mig.placement, d.mig.profile_id) for d in listed if d.mig] == [
        ("3g.40gb", MigPlacement(4, 4), 9),
        ("1g.10gb", MigPlacement(1, 1), 19),
    ]
    big, bare = listed
    assert big.uuid.startswith("MIG-") and big.mig is not None and big.mig.compute_instance == 0
    assert bare.uuid == "" and bare.mig is not None and bare.mig.compute_instance == -1
    assert part.destroy(gpu, bare.mig.gpu_instance) is True
    assert len(part.instances(gpu)) == 1


def test_errors_are_one_line_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    fake, (gpu,), part = setup(mig_h100_empty(0))
    fake.faults["nvmlDeviceGetHandleByUUID"] = NVMLError_Unknown()
    for call in (
        lambda: part.create(gpu, gpu.mig_profiles[0], gpu.mig_profiles[0].placements[0]),
        lambda: part.destroy(gpu, 1),
        lambda: part.instances(gpu),
    ):
        with pytest.raises(MigError) as err:
            call()
        assert "\n" not in str(err.value) and "GPU 0" in str(err.value)
        assert err.value.__cause__ is None and err.value.__suppress_context__
    assert all(r.exc_info is None for r in caplog.records)


def test_concurrent_creates_on_one_gpu_are_serialized() -> None:
    _fake, (gpu,), part = setup(mig_h100_empty(0))
    small = profile(gpu, "1g.10gb")
    results: list[GpuInfo | MigError] = []

    def create(start: int) -> None:
        try:
            results.append(part.create(gpu, small, MigPlacement(start, 1)))
        except MigError as exc:
            results.append(exc)

    threads = [threading.Thread(target=create, args=(s,)) for s in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, GpuInfo) for r in results)
    assert len({r.uuid for r in results if isinstance(r, GpuInfo)}) == 7
    assert len(part.instances(gpu)) == 7


def test_is_a_mig_partitioner() -> None:
    _fake, _gpus, part = setup(mig_h100_empty(0))
    checked: MigPartitioner = part
    assert checked is part
