"""The mock backend: default H100-like GPUs, YAML configs and the MIG profiles of MIG GPUs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from api import names
from kubeletplugin.devices import migtables
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mock import H100_MEMORY_TOTAL, MockBackend, mock_uuid
from kubeletplugin.devices.table import node_devices


def test_default_gpus_look_like_h100() -> None:
    gpus = MockBackend("n1").discover()
    assert len(gpus) == 8
    gpu = gpus[0]
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert (gpu.brand, gpu.architecture, gpu.cuda_compute_capability) == ("Nvidia", "Hopper", "9.0")
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("580.95.05", "13.0")
    assert gpu.memory_total == 81559 * 1024 * 1024 == H100_MEMORY_TOTAL
    assert 400 * 2**20 < gpu.memory_reserved < 600 * 2**20
    assert gpu.memory_usable == gpu.memory_total - gpu.memory_reserved
    assert [g.index for g in gpus] == [g.minor for g in gpus] == list(range(8))
    assert [g.numa_node for g in gpus] == [0] * 4 + [1] * 4
    assert [g.pcie_root for g in gpus] == ["pci0000:00"] * 4 + ["pci0000:80"] * 4
    assert len({g.pci_bus_id for g in gpus}) == 8
    assert all(re.fullmatch(r"0000:[0-9a-f]{2}:00\.0", g.pci_bus_id) for g in gpus)


def test_uuids_stable_per_node_and_distinct() -> None:
    a = [g.uuid for g in MockBackend("n1").discover()]
    assert a == [g.uuid for g in MockBackend("n1").discover()]
    b = [g.uuid for g in MockBackend("n2").discover()]
    assert not set(a) & set(b)
    assert len(set(a)) == 8
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", a[0])
    assert a[3] == mock_uuid("n1", 3)


@pytest.mark.parametrize("count", [1, 3, 64, 128])
def test_counts(count: int) -> None:
    gpus = MockBackend("n1", count=count).discover()
    assert len(gpus) == count
    assert len({g.pci_bus_id for g in gpus}) == count


@pytest.mark.parametrize("count", [0, -1, 129])
def test_bad_count(count: int) -> None:
    with pytest.raises(DiscoveryError, match="--mock-gpus must be between 1 and 128"):
        MockBackend("n1", count=count)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    return path


def test_config_with_camel_and_snake_case(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
- productName: NVIDIA A100-SXM4-40GB
  architecture: Ampere
  cudaComputeCapability: "8.0"
  memory_total: 40Gi
  memoryReserved: 512Mi
  numaNode: null
  pcieRoot: null
- index: 1
  uuid: GPU-custom
  pciBusID: "0000:af:00.0"
  notes: [hand-written]
""",
    )
    gpus = MockBackend("n1", config_file=path).discover()
    assert len(gpus) == 2
    a100, second = gpus
    assert a100.product_name == "NVIDIA A100-SXM4-40GB"
    assert a100.architecture == "Ampere"
    assert a100.cuda_compute_capability == "8.0"
    assert a100.memory_usable == 40 * 2**30 - 512 * 2**20
    assert a100.numa_node is None and a100.pcie_root is None
    assert a100.uuid == mock_uuid("n1", 0)
    assert second.uuid == "GPU-custom"
    assert second.pci_bus_id == "0000:af:00.0"
    assert second.notes == ("hand-written",)
    assert second.product_name == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- colour: green\n", r"mock GPU entry 0: unknown field 'colour' \(allowed: "),
        ("- {}\n- index: x\n", r"mock GPU entry 1: field 'index' must be an integer, got 'x'"),
        ("- index: true\n", r"entry 0: field 'index' must be an integer"),
        ("- cudaComputeCapability: 9.0\n", r"field 'cuda_compute_capability' must be a string"),
        ("- memoryTotal: lots\n", r"entry 0: field 'memory_total': invalid quantity 'lots'"),
        ("- memoryTotal: 1Gi\n  memoryReserved: 2Gi\n", r"usable memory must be positive"),
        ("- memoryUsable: 5\n", r"memory_usable must equal memory_total - memory_reserved"),
        ("- notes: abc\n", r"field 'notes' must be a list of strings"),
        ("- 3\n", r"entry 0: expected a mapping"),
        ("{a: 1}\n", r"must be a non-empty YAML list"),
        ("[]\n", r"must be a non-empty YAML list"),
        ("- index: 0\n- index: 0\n", r"duplicate GPU index 0"),
        ("- [unclosed\n", r"is not valid YAML"),
        ("- numa_node: 1\n  numaNode: 0\n", r"field 'numaNode' given twice"),
    ],
)
def test_bad_config(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message) as info:
        MockBackend("n1", config_file=write(tmp_path, text)).discover()
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="cannot read mock config"):
        MockBackend("n1", config_file=tmp_path / "absent.yaml").discover()


# -- MIG profiles (dynamic MIG) --------------------------------------------------------------


def test_default_gpus_have_no_mig_profiles() -> None:
    assert all(
        g.mig_profiles == () and g.mig_mode == "Disabled" for g in MockBackend("n1").discover()
    )


def test_mig_enabled_default_gpus_get_the_h100_table() -> None:
    gpus = MockBackend("n1", count=2, mig_enabled=True).discover()
    assert [(g.mig_mode, g.mig_devices) for g in gpus] == [("Enabled", ())] * 2
    assert all(g.mig_profiles == migtables.H100_80GB for g in gpus)
    table = node_devices(
        gpus, names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )
    assert "gpu-1-mig-1g-10gb-6" in table.devices and "gpu-0" not in table.devices


def test_mig_enabled_entries_get_their_products_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
- migMode: Enabled
- productName: {migtables.A100_40GB_PRODUCT}
  memoryTotal: 40Gi
  memoryReserved: 512Mi
  migMode: Enabled
- migDevices: [{{profile: 3g.40gb, gpuInstance: 2}}]
- productName: NVIDIA A30
  migMode: Disabled
""",
    )
    h100, a100, static, a30 = MockBackend("n1", config_file=path).discover()
    assert h100.mig_profiles == migtables.H100_80GB
    assert a100.mig_profiles == migtables.A100_40GB
    assert [p.name for p in a100.mig_profiles][:3] == ["1g.5gb", "1g.5gb+me", "1g.10gb"]
    assert static.mig_profiles == migtables.H100_80GB
    assert [d.mig_profiles for d in static.mig_devices] == [()], "MIG devices have no profiles"
    assert a30.mig_profiles == ()


def test_an_h200_entry_gets_the_h200_table(tmp_path: Path) -> None:
    total = migtables.REFERENCE_MEMORY_TOTAL[migtables.H200_PRODUCT] // 2**20
    path = write(
        tmp_path,
        f"- {{productName: {migtables.H200_PRODUCT}, memoryTotal: {total}Mi, migMode: Enabled}}\n",
    )
    (h200,) = MockBackend("n1", config_file=path).discover()
    assert h200.mig_profiles == migtables.H200
    table = node_devices(
        [h200], names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )
    assert {"gpu-0-mig-3g-71gb-0", "gpu-0-mig-7g-141gb-0"} <= set(table.devices)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "- {productName: NVIDIA L40S, migMode: Enabled}\n",
            r"mock GPU entry 0: migMode 'Enabled' needs a product with MIG profiles; 'NVIDIA L40S'"
            r" has none \(products with profiles: 'NVIDIA H100 80GB HBM3', 'NVIDIA H200', "
            r"'NVIDIA A100-SXM4-40GB', 'NVIDIA A100-SXM4-80GB'\)",
        ),
        (
            "- {}\n- {productName: NVIDIA A30, migDevices: [{profile: 1g.6gb, gpuInstance: 1}]}\n",
            r"mock GPU entry 1: migMode 'Enabled' needs a product with MIG profiles; 'NVIDIA A30'",
        ),
        (
            f"- {{productName: {migtables.A100_40GB_PRODUCT}, memoryTotal: 20Gi, "
            "migMode: Enabled}\n",
            r"entry 0: memory_total 21474836480 bytes is less than the 40192 MiB of MIG profile "
            r"7g.40gb",
        ),
        ("- migProfiles: []\n", r"entry 0: unknown field 'migProfiles'"),
        ("- mig_profiles: []\n", r"entry 0: unknown field 'mig_profiles'"),
    ],
)
def test_bad_mig_config(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message) as info:
        MockBackend("n1", config_file=write(tmp_path, text)).discover()
    assert "\n" not in str(info.value)
