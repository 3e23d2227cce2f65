"""The project's NVML code through the real ``pynvml`` module, with only the C library faked.

Discovery (incl. MIG), the health checker and the usage source run unchanged; pynvml's own
wrappers build the ctypes arguments and map return codes to its error classes. Every test fails
when the project asks pynvml or the C library for a name neither has, or passes an argument of
the wrong ctypes type (see :mod:`tests.kubeletplugin.devices.fakenvmllib`).
"""

from __future__ import annotations

import threading

import pynvml
import pytest

from kubeletplugin.devices import migtables
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.migpartition import MigError
from kubeletplugin.devices.nvml import MEMORY_V1_NOTE, NvmlBackend
from kubeletplugin.devices.nvmlmig import NvmlMigPartitioner
from kubeletplugin.health.events import EventKind, HealthEvent
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.model import MigPlacement
from kubeletplugin.usage.model import ProcessSample
from kubeletplugin.usage.source import NvmlUsageSource, UsageSourceError
from tests.kubeletplugin.devices.fakenvmllib import (
    MEMORY_V2_VERSION,
    FakeGpu,
    FakeMig,
    FakeNvmlLib,
    installed,
)
from tests.kubeletplugin.devices.realpynvml import NO_SYSFS, discover, h100, real_pynvml

GIB = 1024**3
#: Long enough for the event thread to pick an event up on a loaded machine; never asserted.
EVENT_WAIT_S = 30.0


def a100_mig(index: int = 1) -> FakeGpu:
    """An A100 40GB in MIG mode with a 3g.20gb and a 1g.5gb device (listed by NVML in slots
    0 and 1, in the opposite order of their instance ids) and no per-process utilisation."""
    return FakeGpu(
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd",
        name="NVIDIA A100-PCIE-40GB",
        bus_id=f"00000000:{0x3B + index:02X}:00.0",
        minor=index,
        brand=2,
        architecture=7,
        compute_capability=(8, 0),
        memory_total=42949672960,
        memory_reserved=0,
        mig_mode=(1, 1),
        mig_slots=7,
        migs=[
            FakeMig("MIG-4d1f0000-0000-0000-0000-000000000002", 2, 0, 42, 3, 3, 19968, 1 << 20),
            FakeMig("MIG-4d1f0000-0000-0000-0000-000000000001", 1, 0, 14, 1, 1, 4864),
        ],
        utilization=None,
    )


# --- discovery ------------------------------------------------------------------------------


def test_h100_is_described_through_pynvml() -> None:
    lib = FakeNvmlLib([h100(0)])
    (gpu,) = discover(lib)
    assert (gpu.index, gpu.minor, gpu.uuid) == (0, 0, "GPU-00000000-1111-2222-3333-444444444444")
    assert (gpu.product_name, gpu.brand, gpu.architecture) == (
        "NVIDIA H100 80GB HBM3",
        "Nvidia",
        "Hopper",
    )
    assert gpu.cuda_compute_capability == "9.0"
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("580.95.05", "13.0")
    assert gpu.pci_bus_id == "0000:18:00.0"
    assert (gpu.memory_total, gpu.memory_reserved) == (85520809984, 552337408)
    assert gpu.memory_info_version == "v2" and gpu.notes == ()
    assert lib.memory_versions == [MEMORY_V2_VERSION]
    assert gpu.numa_node == 1
    assert (gpu.mig_mode, gpu.mig_pending, gpu.mig_devices) == ("Disabled", False, ())


def test_a100_in_mig_mode_lists_its_mig_devices() -> None:
    (_h100, a100) = discover(FakeNvmlLib([h100(0), a100_mig(1)]))
    assert (a100.mig_mode, a100.mig_pending, a100.architecture) == ("Enabled", False, "Ampere")
    assert [m.uuid for m in a100.mig_devices] == [
        "MIG-4d1f0000-0000-0000-0000-000000000001",
        "MIG-4d1f0000-0000-0000-0000-000000000002",
    ]
    small, large = a100.mig_devices
    assert small.mig is not None and large.mig is not None
    assert (small.mig.gpu_instance, small.mig.compute_instance, small.mig.profile) == (
        1,
        0,
        "1g.5gb",
    )
    assert (large.mig.gpu_instance, large.mig.profile, large.mig.multiprocessors) == (
        2,
        "3g.20gb",
        42,
    )
    assert small.mig.parent_uuid == a100.uuid
    assert (large.memory_total, large.memory_reserved) == (19968 * 1024**2, 1 << 20)
    assert small.numa_node is None  # NVML reports no NUMA node for this A100


def test_pending_mig_mode_lists_no_mig_devices() -> None:
    gpu = a100_mig(0)
    gpu.mig_mode = (0, 1)
    (info,) = discover(FakeNvmlLib([gpu]))
    assert (info.mig_mode, info.mig_pending, info.mig_devices) == ("Disabled", True, ())


def test_gpu_without_mig_support_has_no_mig_mode() -> None:
    gpu = h100(0)
    gpu.mig_mode = None
    (info,) = discover(FakeNvmlLib([gpu]))
    assert (info.mig_mode, info.mig_pending) == (None, False)


def test_a_failing_gpu_is_left_out_and_the_other_published() -> None:
    broken = h100(1)
    broken.errors["nvmlDeviceGetPciInfo_v3"] = pynvml.NVML_ERROR_GPU_IS_LOST
    gpus = discover(FakeNvmlLib([h100(0), broken, h100(2)]))
    assert [g.index for g in gpus] == [0, 2]


def test_no_gpu_readable_is_a_discovery_error() -> None:
    broken = h100(0)
    broken.errors["nvmlDeviceGetHandleByIndex_v2"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(DiscoveryError, match="none could be read"):
        discover(FakeNvmlLib([broken]))


def test_driver_not_loaded_is_named() -> None:
    lib = FakeNvmlLib([h100(0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(DiscoveryError, match="kernel driver is not loaded"):
        discover(lib)


def test_old_driver_falls_back_to_memory_info_v1_and_cuda_version_v1() -> None:
    lib = FakeNvmlLib(
        [h100(0)],
        cuda=12020,
        absent=frozenset({"nvmlDeviceGetMemoryInfo_v2", "nvmlSystemGetCudaDriverVersion_v2"}),
    )
    (gpu,) = discover(lib)
    assert (gpu.memory_info_version, gpu.memory_reserved) == ("v1", 0)
    assert gpu.notes == (MEMORY_V1_NOTE,)
    assert gpu.cuda_driver_version == "12.2"


# --- health ---------------------------------------------------------------------------------


class Events:
    """Collects reported events; :meth:`wait_for` blocks until ``n`` arrived."""

    def __init__(self) -> None:
        self.seen: list[HealthEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: HealthEvent) -> None:
        with self._cond:
            self.seen.append(event)
            self._cond.notify_all()

    def wait_for(self, n: int) -> list[HealthEvent]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.seen) >= n, EVENT_WAIT_S)
            return list(self.seen)


def test_health_registers_events_and_reports_them() -> None:
    gpus_fake = [h100(0), a100_mig(1)]
    gpus_fake[1].supported_events = 0x2 | 0x8  # no GPU-unavailable event on this one
    lib = FakeNvmlLib(gpus_fake)
    gpus = discover(lib)
    events = Events()
    with real_pynvml(lib) as nvml:
        checker = NvmlHealthChecker(nvml=nvml, wait_timeout_ms=50)
        checker.start(gpus, events)
        try:
            assert checker.registered == {gpus[0].uuid: 0x400A, gpus[1].uuid: 0x000A}
            assert lib.registered == checker.registered
            lib.push_event(gpus_fake[1], pynvml.nvmlEventTypeXidCriticalError, 79)
            lib.push_event(gpus_fake[0], pynvml.nvmlEventTypeDoubleBitEccError)
            lib.push_event(None, pynvml.nvmlEventTypeGpuUnavailableError)
            seen = events.wait_for(3)
        finally:
            checker.stop()
    assert seen == [
        HealthEvent(gpus[1].uuid, EventKind.XID, 79),
        HealthEvent(gpus[0].uuid, EventKind.DOUBLE_BIT_ECC),
        HealthEvent(None, EventKind.GPU_LOST, None, "NVML reports the GPU unavailable"),
    ]


def test_health_probe_healthy_failing_and_reset_pending() -> None:
    good, lost, remap = h100(0), h100(1), h100(2)
    lost.errors["nvmlDeviceGetHandleByUUID"] = pynvml.NVML_ERROR_GPU_IS_LOST
    remap.remapped_rows = (0, 1, 1, 0)
    lib = FakeNvmlLib([good, lost, remap])
    gpus = discover(FakeNvmlLib([h100(0), h100(1), h100(2)]))
    events = Events()
    with real_pynvml(lib) as nvml:
        checker = NvmlHealthChecker(nvml=nvml, wait_timeout_ms=50)
        checker.start(gpus, events)
        try:
            assert checker.probe(gpus[0]) is None
            reason = checker.probe(gpus[1])
            assert reason is not None and "GPU is lost" in reason
            assert checker.probe(gpus[2]) is None
        finally:
            checker.stop()
    assert events.seen == [
        HealthEvent(gpus[2].uuid, EventKind.RESET_REQUIRED, detail="row remapping pending")
    ]
    assert gpus[1].uuid not in checker.registered


def test_health_probe_reports_retired_pages_pending() -> None:
    gpu = h100(0)
    gpu.retired_pages_pending = 1
    lib = FakeNvmlLib([gpu])
    (info,) = discover(FakeNvmlLib([h100(0)]))
    with real_pynvml(lib) as nvml:
        checker = NvmlHealthChecker(nvml=nvml, wait_timeout_ms=50)
        events = Events()
        checker.start([info], events)
        checker.probe(info)
        checker.stop()
    assert events.seen == [
        HealthEvent(info.uuid, EventKind.RESET_REQUIRED, detail="retired pages pending")
    ]


# --- usage ----------------------------------------------------------------------------------


def test_usage_lists_processes_and_utilisation_since_the_last_sample() -> None:
    gpu = h100(0)
    gpu.processes = [(4242, 9 * GIB), (4343, None)]
    gpu.utilization = [(4242, 1_000, 30), (4343, 2_000, 150), (4242, 3_000, 55)]
    lib = FakeNvmlLib([gpu])
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        try:
            first = source.sample(gpu.uuid)
            second = source.sample(gpu.uuid)
            gpu.utilization.append((4343, 4_000, 7))
            third = source.sample(gpu.uuid)
        finally:
            source.close()
    assert first.processes == (ProcessSample(4242, 9 * GIB), ProcessSample(4343, None))
    assert first.sm_utilization == {4242: 55, 4343: 100}
    assert second.sm_utilization == {4242: 0, 4343: 0}  # NotFound: nothing since 3000 us
    assert third.sm_utilization == {4343: 7}
    assert lib.utilization_since == [0, 3_000]


def test_usage_without_processes() -> None:
    lib = FakeNvmlLib([h100(0)])
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        sample = source.sample(lib.gpus[0].uuid)
        source.close()
    assert (sample.processes, sample.sm_utilization) == ((), {})


def test_usage_utilisation_not_supported_is_absent_and_not_asked_again() -> None:
    gpu = a100_mig(0)
    gpu.processes = [(77, GIB)]
    lib = FakeNvmlLib([gpu])
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        samples = [source.sample(gpu.uuid) for _ in range(2)]
        source.close()
    assert [s.sm_utilization for s in samples] == [None, None]
    assert samples[1].processes == (ProcessSample(77, GIB),)
    assert lib.calls.count("nvmlDeviceGetProcessUtilization") == 1


def test_usage_failing_gpu_is_a_source_error() -> None:
    gpu = h100(0)
    gpu.errors["nvmlDeviceGetComputeRunningProcesses_v3"] = pynvml.NVML_ERROR_GPU_IS_LOST
    lib = FakeNvmlLib([gpu])
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        with pytest.raises(UsageSourceError, match="GPU is lost"):
            source.sample(gpu.uuid)
        with pytest.raises(UsageSourceError, match="Not Found"):
            source.sample("GPU-00000000-0000-0000-0000-00000000beef")
        source.close()


def test_usage_driver_without_process_info_v3_is_a_source_error() -> None:
    lib = FakeNvmlLib([h100(0)], absent=frozenset({"nvmlDeviceGetComputeRunningProcesses_v3"}))
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        with pytest.raises(UsageSourceError, match="compute processes"):
            source.sample(lib.gpus[0].uuid)
        source.close()


def test_usage_marks_the_mps_clients_when_asked() -> None:
    gpu = h100(0)
    gpu.processes = [(10, 3 * GIB), (11, 69 * 2**20), (12, 2 * GIB)]
    gpu.mps_clients = [10]
    lib = FakeNvmlLib([gpu])
    with real_pynvml(lib) as nvml:
        source = NvmlUsageSource(nvml=nvml)
        source.open()
        plain = source.sample(gpu.uuid)
        mps = source.sample(gpu.uuid, mps=True)
        gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"] = pynvml.NVML_ERROR_NOT_SUPPORTED
        unsupported = [source.sample(gpu.uuid, mps=True) for _ in range(2)]
        source.close()
    assert not plain.mps_listed and not any(p.mps_client for p in plain.processes)
    assert mps.mps_listed
    assert [(p.pid, p.mps_client) for p in mps.processes] == [(10, True), (11, False), (12, False)]
    # A driver that cannot list its MPS clients: nothing judged, and not asked again.
    assert [s.mps_listed for s in unsupported] == [False, False]
    # pynvml asks twice for a list (its size, then the list), once for the NotSupported answer.
    assert lib.calls.count("nvmlDeviceGetMPSComputeRunningProcesses_v3") == 2 + 1


def test_fake_catches_a_wrong_argument_type() -> None:
    """The net that makes these tests worth running: a call that does not match nvml.h."""
    lib = FakeNvmlLib([h100(0)])
    with installed(lib):
        pynvml.nvmlInit()
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetHandleByIndex_v2")
        assert fn(0, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        pynvml.nvmlShutdown()
    assert lib.violations == [
        "nvmlDeviceGetHandleByIndex_v2: expected byref(LP_struct_c_nvmlDevice_t), got None"
    ]
    assert lib.missing == ["nvmlDeviceGetPowerUsage"]


# --- dynamic MIG ------------------------------------------------------------------------------


def h100_mig_empty(index: int = 0) -> FakeGpu:
    """An H100 in MIG mode with no GPU instance and the H100 profile table."""
    gpu = h100(index)
    gpu.mig_mode, gpu.mig_slots, gpu.mig_profiles = (1, 1), 7, migtables.H100_80GB
    return gpu


def test_mig_profiles_and_placements_are_read_through_pynvml() -> None:
    (gpu,) = discover(FakeNvmlLib([h100_mig_empty()]))
    assert gpu.mig_profiles == migtables.H100_80GB


def test_mig_instances_are_created_listed_and_destroyed_through_pynvml() -> None:
    lib = FakeNvmlLib([h100_mig_empty()])
    with real_pynvml(lib) as nvml:
        backend = NvmlBackend(nvml=nvml, sysfs_root=NO_SYSFS)
        (gpu,) = backend.discover()
        part = NvmlMigPartitioner(backend)
        small = next(p for p in gpu.mig_profiles if p.name == "1g.10gb+me")
        big = next(p for p in gpu.mig_profiles if p.name == "3g.40gb")
        first = part.create(gpu, small, MigPlacement(6, 1))
        second = part.create(gpu, big, MigPlacement(0, 4))
        with pytest.raises(MigError, match="Insufficient Resources"):
            part.create(gpu, big, MigPlacement(4, 4))  # overlaps 6:1
        assert part.instances(gpu) == tuple(
            sorted((first, second), key=lambda d: d.mig.gpu_instance if d.mig else 0)
        )
        assert first.mig is not None and second.mig is not None
        assert (first.mig.profile, first.mig.placement) == ("1g.10gb+me", MigPlacement(6, 1))
        assert second.memory_total == big.memory_mb * 1024**2
        (again,) = backend.discover()
        assert {d.uuid for d in again.mig_devices} == {first.uuid, second.uuid}
        assert part.destroy(gpu, first.mig.gpu_instance) is True
        assert part.destroy(gpu, first.mig.gpu_instance) is False
        assert part.destroy(gpu, second.mig.gpu_instance) is True
        assert part.instances(gpu) == ()
    assert lib.gpus[0].gpu_instances == [] and lib.gpus[0].migs == []
