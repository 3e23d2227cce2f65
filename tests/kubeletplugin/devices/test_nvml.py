"""NVML -> GpuInfo mapping, with a fake pynvml module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.nvml import (
    MEMORY_V1_NOTE,
    NvmlBackend,
    cuda_version_string,
    normalize_pci_bus_id,
    pcie_root_from_sysfs,
)
from tests.kubeletplugin.devices.helpers import (
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    NVMLError_Unknown,
    h100,
)


def discover(fake: FakeNvml, sysfs: Path | None = None) -> list:  # type: ignore[type-arg]
    return NvmlBackend(nvml=fake.module(), sysfs_root=sysfs or Path("/nonexistent")).discover()


def make_sysfs(tmp_path: Path, bus_id: str, root: str, numa: str | None) -> Path:
    """A sysfs tree where ``bus/pci/devices/<bus_id>`` links below ``devices/<root>``."""
    device_dir = tmp_path / "devices" / root / "0000:00:01.0" / bus_id
    device_dir.mkdir(parents=True)
    if numa is not None:
        (device_dir / "numa_node").write_text(numa + "\n")
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / bus_id).symlink_to(device_dir)
    return tmp_path


def test_maps_every_field() -> None:
    fake = FakeNvml([h100(0), h100(1)])
    gpus = discover(fake)
    assert [g.index for g in gpus] == [0, 1]
    gpu = gpus[1]
    assert gpu.uuid == "GPU-00000001-1111-2222-3333-444444444444"
    assert gpu.minor == 1
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert gpu.brand == "Nvidia"
    assert gpu.architecture == "Hopper"
    assert gpu.cuda_compute_capability == "9.0"
    assert gpu.driver_version == "580.95.05"
    assert gpu.cuda_driver_version == "12.8"
    assert gpu.pci_bus_id == "0000:1c:00.0"
    assert gpu.memory_total == 85520809984
    assert gpu.memory_reserved == 552337408
    assert gpu.memory_usable == 85520809984 - 552337408
    assert gpu.memory_info_version == "v2"
    assert gpu.numa_node == 0
    assert gpu.mig_mode == "Disabled"
    assert gpu.pcie_root is None
    assert gpu.notes == ()
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"


def test_bytes_from_old_pynvml_are_decoded() -> None:
    gpu = h100(0)
    gpu.update(uuid=b"GPU-abc", name=b"Tesla V100", busId=b"00000000:3B:00.0", arch=5, brand=2)
    fake = FakeNvml([gpu], driver=b"470.82.01", cuda=11040)
    (info,) = discover(fake)
    assert (info.uuid, info.product_name, info.pci_bus_id) == (
        "GPU-abc",
        "Tesla V100",
        "0000:3b:00.0",
    )
    assert (info.driver_version, info.cuda_driver_version) == ("470.82.01", "11.4")
    assert (info.architecture, info.brand) == ("Volta", "Tesla")


def test_memory_v1_fallback_when_v2_function_is_missing() -> None:
    fake = FakeNvml([h100(0)], missing={"nvmlDeviceGetMemoryInfo_v2"})
    (gpu,) = discover(fake)
    assert gpu.memory_info_version == "v1"
    assert gpu.memory_reserved == 0
    assert gpu.memory_usable == gpu.memory_total == 85520809984
    assert gpu.notes == (MEMORY_V1_NOTE,)


def test_memory_v1_fallback_with_old_pynvml_without_v2_struct() -> None:
    (gpu,) = discover(FakeNvml([h100(0)], missing={"nvmlMemory_v2"}))
    assert gpu.memory_info_version == "v1"
    assert "v2 is not available" in gpu.notes[0]


def test_missing_optional_functions_degrade(tmp_path: Path) -> None:
    fake = FakeNvml(
        [h100(0)],
        missing={
            "nvmlDeviceGetNumaNodeId",
            "nvmlSystemGetCudaDriverVersion_v2",
            "nvmlDeviceGetArchitecture",
        },
        faults={
            "nvmlDeviceGetMigMode": NVMLError_NotSupported(3),
            "nvmlDeviceGetBrand": NVMLError_NotSupported(3),
        },
    )
    sysfs = make_sysfs(tmp_path, "0000:1b:00.0", "pci0000:17", "1")
    (gpu,) = discover(fake, sysfs)
    assert gpu.numa_node == 1
    assert gpu.pcie_root == "pci0000:17"
    assert gpu.cuda_driver_version == "12.8"
    assert gpu.mig_mode is None
    assert gpu.architecture == "Unknown"
    assert gpu.brand == "Unknown"


def test_unknown_enum_values_map_to_unknown() -> None:
    gpu = h100(0)
    gpu.update(arch=4294967295, brand=99)
    (info,) = discover(FakeNvml([gpu]))
    assert (info.architecture, info.brand) == ("Unknown", "Unknown")


def test_numa_minus_one_means_unknown(tmp_path: Path) -> None:
    gpu = h100(0)
    gpu["numa"] = -1
    (info,) = discover(FakeNvml([gpu]))
    assert info.numa_node is None
    sysfs = make_sysfs(tmp_path, "0000:1b:00.0", "pci0000:00", "-1")
    (info,) = discover(FakeNvml([h100(0)], missing={"nvmlDeviceGetNumaNodeId"}), sysfs)
    assert info.numa_node is None


def test_mig_enabled_is_reported() -> None:
    gpu = h100(0)
    gpu["mig"] = (1, 1)
    (info,) = discover(FakeNvml([gpu]))
    assert info.mig_mode == "Enabled"


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (NVMLError_LibraryNotFound(12), "NVML library (libnvidia-ml.so.1) was not found"),
        (NVMLError_DriverNotLoaded(9), "NVIDIA kernel driver is not loaded"),
        (NVMLError_Unknown(999), "cannot initialise NVML: NVML error code 999"),
    ],
)
def test_init_errors_are_one_clear_line(fault: Exception, message: str) -> None:
    fake = FakeNvml([h100(0)], faults={"nvmlInit": fault})
    with pytest.raises(DiscoveryError) as info:
        discover(fake)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_no_gpus() -> None:
    fake = FakeNvml([])
    with pytest.raises(DiscoveryError, match="no NVIDIA GPUs"):
        discover(fake)
    assert fake.calls[-1] == "nvmlShutdown"


def test_device_error_names_gpu_and_function_and_shuts_down() -> None:
    fake = FakeNvml([h100(0)], faults={"nvmlDeviceGetUUID": NVMLError_Unknown(15)})
    with pytest.raises(DiscoveryError, match=r"UUID of GPU 0 \(nvmlDeviceGetUUID\)"):
        discover(fake)
    assert fake.calls[-1] == "nvmlShutdown"


def test_memory_error_that_is_not_missing_fails() -> None:
    fake = FakeNvml([h100(0)], faults={"nvmlDeviceGetMemoryInfo": NVMLError_Unknown(15)})
    with pytest.raises(DiscoveryError, match="memory of GPU 0"):
        discover(fake)


def test_missing_required_function() -> None:
    with pytest.raises(DiscoveryError, match="nvmlDeviceGetUUID is missing"):
        discover(FakeNvml([h100(0)], missing={"nvmlDeviceGetUUID"}))


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DiscoveryError, match="pynvml module"):
        NvmlBackend().discover()


def test_real_pynvml_without_a_gpu_gives_a_clear_error() -> None:
    """On machines without an NVIDIA driver the real module fails at nvmlInit."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be exercised")
    with pytest.raises(DiscoveryError, match="cannot initialise NVML"):
        NvmlBackend().discover()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:af:1f.7", "0000:af:1f.7"),
        (b"00000001:01:00.1", "0001:01:00.1"),
    ],
)
def test_normalize_pci_bus_id(raw: str | bytes, expected: str) -> None:
    assert normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["3b:00.0", "0000:3g:00.0", "0000:3b:00", "0000:3b:20.0"])
def test_normalize_pci_bus_id_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="PCI bus ID"):
        normalize_pci_bus_id(raw)


def test_cuda_version_string() -> None:
    assert cuda_version_string(12080) == "12.8"
    assert cuda_version_string(13000) == "13.0"
    assert cuda_version_string(11040) == "11.4"


def test_pcie_root_absent(tmp_path: Path) -> None:
    assert pcie_root_from_sysfs(tmp_path, "0000:3b:00.0") is None


# --- one failing GPU does not hide the others ------------------------------------------------


def test_a_gpu_with_an_nvml_error_is_left_out_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = h100(1)
    broken["faults"] = {"nvmlDeviceGetMemoryInfo": NVMLError_Unknown(15)}
    fake = FakeNvml([h100(0), broken, h100(2)])
    with caplog.at_level("WARNING", logger="kubeletplugin.devices.nvml"):
        gpus = discover(fake)
    assert [g.index for g in gpus] == [0, 2]
    assert [g.uuid for g in gpus] == [h100(0)["uuid"], h100(2)["uuid"]]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert lines[0].startswith("GPU 1 left out")
    assert "NVML error code 15" in lines[0] and "nvmlDeviceGetMemoryInfo" in lines[0]
    assert fake.calls[-1] == "nvmlShutdown"


def test_a_gpu_whose_handle_cannot_be_had_is_left_out() -> None:
    fake = FakeNvml([h100(0), h100(1)])
    module = fake.module()
    real = module.nvmlDeviceGetHandleByIndex

    def handle(index: int) -> object:
        if index == 0:
            raise NVMLError_Unknown(15)
        return real(index)

    module.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    gpus = NvmlBackend(nvml=module, sysfs_root=Path("/nonexistent")).discover()
    assert [g.index for g in gpus] == [1]


def test_no_working_gpu_is_one_line_naming_the_count_and_the_error() -> None:
    gpus = [h100(0), h100(1)]
    for gpu in gpus:
        gpu["faults"] = {"nvmlDeviceGetUUID": NVMLError_Unknown(15)}
    fake = FakeNvml(gpus)
    with pytest.raises(DiscoveryError) as info:
        discover(fake)
    message = str(info.value)
    assert "2 GPU(s) but none could be read" in message
    assert "UUID of GPU 0 (nvmlDeviceGetUUID): NVML error code 15" in message
    assert "\n" not in message
    assert fake.calls[-1] == "nvmlShutdown"


def test_a_malformed_bus_id_leaves_only_that_gpu_out() -> None:
    bad = h100(0)
    bad["busId"] = "garbage"
    gpus = discover(FakeNvml([bad, h100(1)]))
    assert [g.index for g in gpus] == [1]


# --- NUMA node: sysfs first, NVML as fallback ------------------------------------------------


def test_sysfs_numa_node_wins_over_nvml(tmp_path: Path) -> None:
    """On Grace systems NVML reports the GPU memory's node; sysfs has the attachment node."""
    gpu = h100(0)
    gpu["numa"] = 4
    sysfs = make_sysfs(tmp_path, "0000:1b:00.0", "pci0000:00", "1")
    (info,) = discover(FakeNvml([gpu]), sysfs)
    assert info.numa_node == 1


def test_sysfs_minus_one_means_no_node_even_when_nvml_has_one(tmp_path: Path) -> None:
    gpu = h100(0)
    gpu["numa"] = 4
    sysfs = make_sysfs(tmp_path, "0000:1b:00.0", "pci0000:00", "-1")
    fake = FakeNvml([gpu])
    (info,) = discover(fake, sysfs)
    assert info.numa_node is None
    assert "nvmlDeviceGetNumaNodeId" not in fake.calls


def test_nvml_numa_node_is_the_fallback_without_sysfs(tmp_path: Path) -> None:
    gpu = h100(0)
    gpu["numa"] = 4
    # The device exists in sysfs but has no numa_node file (kernel without NUMA support).
    sysfs = make_sysfs(tmp_path, "0000:1b:00.0", "pci0000:00", None)
    (info,) = discover(FakeNvml([gpu]), sysfs)
    assert info.numa_node == 4


def test_sysfs_numa_lookup_uses_the_lower_case_four_digit_domain_form(tmp_path: Path) -> None:
    gpu = h100(0)
    gpu.update(busId="00000000:AB:00.0", numa=0)
    sysfs = make_sysfs(tmp_path, "0000:ab:00.0", "pci0000:a0", "3")
    (info,) = discover(FakeNvml([gpu]), sysfs)
    assert (info.numa_node, info.pcie_root) == (3, "pci0000:a0")
