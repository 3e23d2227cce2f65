"""MIG devices: NVML discovery, profile names, the device table, the slices, the mock backend."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from api import names
from kubeletplugin.containeredits import cuda_order
from kubeletplugin.devices import migtables
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mig import parse_profile, profile_memory_gb, profile_name
from kubeletplugin.devices.mock import MockBackend, load_mock_config
from kubeletplugin.devices.nvml import NvmlBackend, mig_profile_name
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from kubeletplugin.model import GpuInfo
from sharegpu.kube.slicerules import validate_pool, validate_resource_slice
from tests.kubeletplugin.devices.helpers import (
    FakeNvml,
    NVMLError_Unknown,
    h100,
    h100_mig,
    mig_h100,
)

DRIVER = names.DEFAULT_DRIVER_NAME
MIB = 1024 * 1024
H100_TOTAL = 85520809984
H200_TOTAL = 143771 * MIB

#: The node of the MIG tests: GPU 0 in MIG mode with two 1g.10gb and one 3g.40gb, GPU 1 whole.
MIG_NAMES = ["gpu-0-mig-2-0", "gpu-0-mig-9-0", "gpu-0-mig-10-0"]


def mig_node() -> FakeNvml:
    return FakeNvml(
        [
            mig_h100(
                0,
                h100_mig(0, "1g.10gb", 9),
                h100_mig(0, "3g.40gb", 2),
                h100_mig(0, "1g.10gb", 10),
            ),
            h100(1),
        ]
    )


def discover(fake: FakeNvml) -> list[GpuInfo]:
    return NvmlBackend(fake.module(), sysfs_root=Path("/nonexistent")).discover()


def slice_objects(gpus: list[GpuInfo], mode: str) -> list[Any]:
    contents = desired_slices(node_devices(gpus, mode))
    return resource_slice_objects(contents, DRIVER, "node-a", "uid-1", 1)


def devices_by_name(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


# --- profile names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gi", "ci", "total", "memory_mb", "expected"),
    [
        (1, 1, H100_TOTAL, 9856, "1g.10gb"),
        (1, 1, H100_TOTAL, 19968, "1g.20gb"),
        (2, 2, H100_TOTAL, 20096, "2g.20gb"),
        (3, 3, H100_TOTAL, 40192, "3g.40gb"),
        (3, 1, H100_TOTAL, 40192, "1c.3g.40gb"),
        (4, 4, H100_TOTAL, 40192, "4g.40gb"),
        (7, 7, H100_TOTAL, 80896, "7g.80gb"),
        # A100 40GB (42949672960 bytes).
        (1, 1, 42949672960, 4864, "1g.5gb"),
        (3, 3, 42949672960, 19968, "3g.20gb"),
        (7, 7, 42949672960, 40192, "7g.40gb"),
        # H200 (143771 MiB), as NVML names its GPU-instance profiles on driver 580: half a GB
        # rounds up (4/8 of 141 GB is 70.5 -> 71), as in NVIDIA's go-nvlib.
        (1, 1, H200_TOTAL, 16384, "1g.18gb"),
        (1, 1, H200_TOTAL, 33280, "1g.35gb"),
        (2, 2, H200_TOTAL, 33280, "2g.35gb"),
        (3, 3, H200_TOTAL, 71424, "3g.71gb"),
        (4, 4, H200_TOTAL, 71424, "4g.71gb"),
        (7, 7, H200_TOTAL, 143360, "7g.141gb"),
        (3, 1, H200_TOTAL, 71424, "1c.3g.71gb"),
    ],
)
def test_profile_names_match_nvidia_smi(
    gi: int, ci: int, total: int, memory_mb: int, expected: str
) -> None:
    assert profile_name(gi, ci, total, memory_mb) == expected
    assert parse_profile(expected) == (gi, ci, int(expected.split(".")[-1][:-2]))


@pytest.mark.parametrize("product", sorted(migtables.REFERENCE_TABLES))
def test_derived_names_match_every_reference_table(product: str) -> None:
    """The name derived when NVML gives none is the reference table's, ``+me`` included."""
    total = migtables.REFERENCE_MEMORY_TOTAL[product]
    for p in migtables.REFERENCE_TABLES[product]:
        assert mig_profile_name(b"", p.profile_index, p.slice_count, total, p.memory_mb) == p.name
        assert mig_profile_name(b"MIG " + p.name.encode(), 0, 1, total, 1) == p.name


@pytest.mark.parametrize(
    ("product", "names"),
    [
        (
            migtables.H200_PRODUCT,
            ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
        ),
        (
            migtables.H100_80GB_PRODUCT,
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            migtables.A100_80GB_PRODUCT,
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            migtables.A100_40GB_PRODUCT,
            ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        ),
    ],
)
def test_reference_tables_carry_nvidias_names(product: str, names: list[str]) -> None:
    """The names of NVIDIA's MIG user guide ("Supported MIG Profiles"), in table order."""
    assert [p.name for p in migtables.REFERENCE_TABLES[product]] == names


@pytest.mark.parametrize(
    ("memory_mb", "expected"),
    [
        # 141 GB parent: eighths give 17.625, 35.25, 52.875, 70.5, 88.125, 105.75, 123.375, 141.
        (16384, 18),
        (33280, 35),
        (49000, 53),
        (71424, 71),
        (88000, 88),
        (105000, 106),
        (123000, 123),
        (143360, 141),
    ],
)
def test_memory_figures_round_half_up(memory_mb: int, expected: int) -> None:
    assert profile_memory_gb(H200_TOTAL, memory_mb) == expected


def test_an_exact_half_rounds_up_on_an_even_figure_too() -> None:
    """Half to even would give 2 for 2.5 and 4 for 4.5; half up gives 3 and 5."""
    # A 20 GiB parent: 1/8 is 2.5 GB, 2/8 is 5, ... ; a 36 GiB parent: 1/8 is 4.5.
    assert profile_memory_gb(20 * 1024**3, 2560) == 3
    assert profile_memory_gb(36 * 1024**3, 4608) == 5


@pytest.mark.parametrize(("gi", "ci"), [(0, 0), (9, 1), (2, 3)])
def test_impossible_slice_counts_are_refused(gi: int, ci: int) -> None:
    with pytest.raises(ValueError, match="slice counts"):
        profile_name(gi, ci, H100_TOTAL, 9856)


def test_non_positive_memory_is_refused() -> None:
    with pytest.raises(ValueError, match="not a size"):
        profile_memory_gb(H100_TOTAL, 0)


@pytest.mark.parametrize("bad", ["", "1g", "0g.10gb", "9g.10gb", "3c.1g.10gb", "1g.10GB", "x"])
def test_malformed_profiles_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="MIG profile"):
        parse_profile(bad)


# --- NVML discovery ---------------------------------------------------------------------------


def test_nvml_reads_every_existing_mig_device() -> None:
    gpu0, gpu1 = discover(mig_node())
    assert gpu0.mig_mode == "Enabled" and not gpu0.mig_pending
    assert [d.mig.profile for d in gpu0.mig_devices if d.mig] == ["3g.40gb", "1g.10gb", "1g.10gb"]
    small = gpu0.mig_devices[1]
    assert small.uuid == "MIG-00000000-0009-0000-0000-000000000000"
    assert small.mig is not None
    assert (small.mig.gpu_instance, small.mig.compute_instance) == (9, 0)
    assert (small.mig.multiprocessors, small.mig.gpu_slices, small.mig.compute_slices) == (16, 1, 1)
    assert small.mig.parent_uuid == gpu0.uuid
    assert small.memory_usable == 9856 * MIB
    # Everything else is the parent's.
    assert (small.index, small.minor, small.pci_bus_id, small.product_name) == (
        gpu0.index,
        gpu0.minor,
        gpu0.pci_bus_id,
        gpu0.product_name,
    )
    assert gpu1.mig_mode == "Disabled" and gpu1.mig_devices == ()


@pytest.mark.parametrize("mode", [(1, 0), (0, 1)])
def test_pending_mig_mode_reads_no_mig_device(mode: tuple[int, int]) -> None:
    fake = mig_node()
    fake.gpus[0]["mig"] = mode
    gpu0, _ = discover(fake)
    assert gpu0.mig_pending and gpu0.mig_devices == ()
    assert "nvmlDeviceGetMigDeviceHandleByIndex" not in fake.calls


def test_a_mig_device_nvml_cannot_describe_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    fake = mig_node()
    fake.gpus[0]["migSlots"][1]["faults"] = {"nvmlDeviceGetAttributes": NVMLError_Unknown()}
    with caplog.at_level(logging.WARNING):
        gpu0, _ = discover(fake)
    assert [d.mig.gpu_instance for d in gpu0.mig_devices if d.mig] == [9, 10]
    (line,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "MIG device 1 of GPU 0" in line and "nvmlDeviceGetAttributes" in line


def test_old_pynvml_without_mig_listing_publishes_no_mig_device() -> None:
    fake = mig_node()
    fake.missing.add("nvmlDeviceGetMaxMigDeviceCount")
    gpu0, _ = discover(fake)
    assert gpu0.mig_mode == "Enabled" and gpu0.mig_devices == ()
    assert [d.name for d in node_devices([gpu0], names.SHARING_MODE_CONSUMABLE)] == []


# --- table and slices -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", names.SHARING_MODES)
def test_a_mig_gpu_is_published_as_its_mig_devices_only(mode: str) -> None:
    gpus = discover(mig_node())
    table = node_devices(gpus, mode)
    mig_names = [d.name for d in table if d.mig is not None]
    assert mig_names == sorted(MIG_NAMES, key=lambda n: int(n.split("-")[3]))
    assert "gpu-0" not in table
    assert all(d.gpu.index == 1 for d in table if d.mig is None)
    assert [d.name for d in table.of_gpu(gpus[0])] == mig_names
    assert table.names_by_gpu()[gpus[0].uuid] == mig_names


@pytest.mark.parametrize("mode", names.SHARING_MODES)
def test_mig_slices_follow_the_slice_rules(mode: str) -> None:
    slices = slice_objects(discover(mig_node()), mode)
    for obj in slices:
        assert validate_resource_slice(obj) == []
        for version in ("1.34", "1.36"):
            kubernetes_validate.validate(obj, version, strict=True)
    assert validate_pool(list(slices)) == []
    big = devices_by_name(slices)["gpu-0-mig-2-0"]
    assert set(big) == {"name", "attributes", "capacity"}, "exclusive: nothing to share"
    assert big["capacity"] == {"memory": {"value": f"{40192}Mi"}}
    attrs = big["attributes"]
    assert attrs["uuid"] == {"string": "MIG-00000000-0002-0000-0000-000000000000"}
    assert attrs["parentUUID"] == {"string": "GPU-00000000-1111-2222-3333-444444444444"}
    assert attrs["parentIndex"] == attrs["index"] == {"int": 0}
    assert attrs["profile"] == {"string": "3g.40gb"}
    assert (attrs["migGpuInstance"], attrs["migComputeInstance"]) == ({"int": 2}, {"int": 0})
    assert attrs["multiprocessorCount"] == {"int": 60}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs[names.ATTR_PCI_BUS_ID] == {"string": "0000:1b:00.0"}


def test_cuda_order_puts_mig_devices_at_their_parent_by_instance() -> None:
    gpu0, gpu1 = discover(mig_node())
    big, small_9, small_10 = gpu0.mig_devices
    ordered = cuda_order([gpu1, small_10, big, small_9])
    assert [g.uuid for g in ordered] == [big.uuid, small_9.uuid, small_10.uuid, gpu1.uuid]


def test_a_taint_on_the_parent_taints_every_mig_device() -> None:
    gpus = discover(mig_node())
    taint = {"key": f"{DRIVER}/unhealthy", "value": "XID-79", "effect": "NoSchedule"}
    contents = desired_slices(node_devices(gpus, names.SHARING_MODE_CONSUMABLE), {"gpu-0": [taint]})
    devices = {d["name"]: d for c in contents for d in c.get("devices", [])}
    assert all(devices[n]["taints"] == [taint] for n in MIG_NAMES)
    assert "taints" not in devices["gpu-1"]


def test_a_pending_gpu_is_published_as_nothing_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = mig_node()
    fake.gpus[0]["mig"] = (1, 0)
    gpus = discover(fake)
    with caplog.at_level(logging.WARNING):
        table = node_devices(gpus, names.SHARING_MODE_CONSUMABLE)
    assert [d.name for d in table] == ["gpu-1"]
    lines = [r.getMessage() for r in caplog.records if "MIG mode change" in r.getMessage()]
    assert len(lines) == 1 and "GPU 0" in lines[0]


def test_a_mig_device_of_another_gpu_is_refused() -> None:
    gpu0, gpu1 = discover(mig_node())
    stray = dataclasses.replace(gpu1, mig_mode="Enabled", mig_devices=gpu0.mig_devices)
    with pytest.raises(ValueError, match="not a MIG device of GPU"):
        node_devices([gpu0, stray], names.SHARING_MODE_EXCLUSIVE)


# --- mock backend -----------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_mock_config_models_mig_devices(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        - migDevices:
            - {profile: 1g.10gb, gpuInstance: 9}
            - {profile: 1g.10gb, gpuInstance: 10}
            - {profile: 3g.40gb, gpuInstance: 2, memory: 40192Mi, multiprocessors: 60}
        - {}
        - migPending: true
        """,
    )
    gpus = MockBackend("node-a", config_file=path).discover()
    assert gpus[0].mig_mode == "Enabled"
    table = node_devices(gpus, names.SHARING_MODE_CONSUMABLE)
    assert [d.name for d in table] == [*MIG_NAMES, "gpu-1"]
    big = table["gpu-0-mig-2-0"].gpu
    assert big.mig is not None and big.mig.multiprocessors == 60
    assert big.memory_usable == 40192 * MIB
    small = table["gpu-0-mig-9-0"].gpu
    assert small.memory_usable == 10 * 1000**3 and small.uuid.startswith("MIG-")
    again = MockBackend("node-a", config_file=path).discover()
    assert again[0].mig_devices == gpus[0].mig_devices, "stable UUIDs"
    slices: list[Any] = resource_slice_objects(desired_slices(table), DRIVER, "node-a", "uid", 1)
    assert validate_pool(list(slices)) == [] and all(
        validate_resource_slice(s) == [] for s in slices
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("migDevices: []", "non-empty list"),
        ("migDevices: [{gpuInstance: 1}]", "'profile' is required"),
        ("migDevices: [{profile: 1g.10gb}]", "'gpuInstance' is required"),
        ("migDevices: [{profile: 2x.10gb, gpuInstance: 1}]", "MIG profile '2x.10gb'"),
        ("migDevices: [{profile: 1g.10gb, gpuInstance: -1}]", "integer from 0"),
        ("migDevices: [{profile: 1g.10gb, gpuInstance: 1, color: red}]", "unknown field 'color'"),
        ("migDevices: [{profile: 1g.10gb, gpuInstance: 1, memory: 1Ti}]", "usable memory"),
        ("migDevices: [{profile: 1g.10gb, gpuInstance: 1, uuid: GPU-1}]", "starting with 'MIG-'"),
        (
            "migDevices: [{profile: 1g.10gb, gpuInstance: 1}, {profile: 1g.10gb, gpuInstance: 1}]",
            "listed twice",
        ),
        ("{migMode: Disabled, migDevices: [{profile: 1g.10gb, gpuInstance: 1}]}", "needs migMode"),
        ("migPending: yes please", "true or false"),
        ("mig: {}", "unknown field 'mig'"),
    ],
)
def test_bad_mock_mig_config_is_one_clear_error(tmp_path: Path, entry: str, message: str) -> None:
    path = write(tmp_path, f"- {entry}\n")
    with pytest.raises(DiscoveryError, match=message) as info:
        load_mock_config("node-a", path)
    assert "mock GPU entry 0" in str(info.value)
