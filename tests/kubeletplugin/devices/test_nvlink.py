"""NVLink domains: the rules of :mod:`kubeletplugin.devices.nvlink`, their discovery through the
real ``pynvml`` over a fake C library (links, NVSwitch, fabric registration, faults, bounds),
the mock backend's topologies and what the slices publish."""

from __future__ import annotations

import dataclasses
import logging
import uuid

import pynvml
import pytest

from api import names
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mock import MockBackend, gpu_from_entry
from kubeletplugin.devices.nvlink import (
    NVSWITCH_DOMAIN,
    NvLinkView,
    domain_problem,
    fabric_domain,
    nvlink_domains,
)
from kubeletplugin.devices.slices import desired_slices, gpu_attributes
from kubeletplugin.devices.table import node_devices
from tests.kubeletplugin.devices.fakenvmllib import FakeGpu, FakeNvmlLib
from tests.kubeletplugin.devices.realpynvml import discover, h100

GPU, SWITCH, NPU = 0x00, 0x02, 0x01
CLUSTER = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")


def nvml_bus(index: int) -> str:
    """The NVML form of the bus ID of :func:`h100` ``index``."""
    return f"00000000:{0x18 + index:02X}:00.0"


def sysfs_bus(index: int) -> str:
    return f"0000:{0x18 + index:02x}:00.0"


def with_links(index: int, links: list[tuple[bool, int, str]] | None, **kw: object) -> FakeGpu:
    return dataclasses.replace(h100(index), nvlinks=links, **kw)  # type: ignore[arg-type]


# --- the rules -------------------------------------------------------------------------------


def test_direct_links_group_gpus_and_name_the_group_after_its_lowest_bus_id() -> None:
    views = [
        NvLinkView("0000:02:00.0", peers=frozenset({"0000:01:00.0"})),
        NvLinkView("0000:01:00.0"),  # the link seen from one end only still joins them
        NvLinkView("0000:03:00.0", peers=frozenset({"0000:04:00.0"})),
        NvLinkView("0000:04:00.0", peers=frozenset({"0000:03:00.0"})),
        NvLinkView("0000:05:00.0", peers=frozenset({"0000:99:00.0"})),  # peer not a GPU here
        NvLinkView("0000:06:00.0"),
    ]
    domains = nvlink_domains(views)
    assert domains == {
        "0000:01:00.0": "nvlink-0000:01:00.0",
        "0000:02:00.0": "nvlink-0000:01:00.0",
        "0000:03:00.0": "nvlink-0000:03:00.0",
        "0000:04:00.0": "nvlink-0000:03:00.0",
    }
    assert nvlink_domains(reversed(views)) == domains


def test_fabric_comes_before_switch_and_switch_before_peers() -> None:
    cluster = CLUSTER.bytes
    views = [
        NvLinkView("0000:01:00.0", fabric=(cluster, 7), switch=True),
        NvLinkView("0000:02:00.0", switch=True, peers=frozenset({"0000:03:00.0"})),
        NvLinkView("0000:03:00.0", peers=frozenset({"0000:02:00.0"})),
        NvLinkView("0000:04:00.0", fabric=(bytes(16), 0), switch=True),  # zero UUID: unused
    ]
    assert nvlink_domains(views) == {
        "0000:01:00.0": f"{CLUSTER}.7",
        "0000:02:00.0": NVSWITCH_DOMAIN,
        "0000:04:00.0": NVSWITCH_DOMAIN,
    }


@pytest.mark.parametrize(
    ("cluster", "clique", "expected"),
    [
        (CLUSTER.bytes, 0, f"{CLUSTER}.0"),
        (CLUSTER.bytes, 2**32 - 1, f"{CLUSTER}.{2**32 - 1}"),
        (bytes(16), 1, None),
        (b"short", 1, None),
        (CLUSTER.bytes, -1, None),
        (CLUSTER.bytes, 2**32, None),
    ],
)
def test_fabric_domain(cluster: bytes, clique: int, expected: str | None) -> None:
    value = fabric_domain(cluster, clique)
    assert value == expected
    if value is not None:
        assert domain_problem(value) is None


@pytest.mark.parametrize("value", ["", "a" * 65, "has space", "-leading", "trailing.", "é"])
def test_domain_problem_names_what_is_wrong(value: str) -> None:
    assert domain_problem(value)


# --- discovery through pynvml ----------------------------------------------------------------


def test_a_single_gpu_without_nvlink_has_no_domain() -> None:
    (gpu,) = discover(FakeNvmlLib([h100(0)]))
    assert gpu.nvlink_domain is None
    assert names.ATTR_NVLINK_DOMAIN not in gpu_attributes(gpu)


def test_inactive_links_and_links_to_other_devices_give_no_domain() -> None:
    gpus = [
        with_links(0, [(False, GPU, nvml_bus(1)), (True, NPU, "00000000:40:00.0")]),
        with_links(1, [(False, GPU, nvml_bus(0))]),
    ]
    assert [g.nvlink_domain for g in discover(FakeNvmlLib(gpus))] == [None, None]


def test_bridged_pairs_are_one_domain_each() -> None:
    gpus = [
        with_links(0, [(True, GPU, nvml_bus(1)), (True, GPU, nvml_bus(1))]),
        with_links(1, [(True, GPU, nvml_bus(0)), (True, GPU, nvml_bus(0))]),
        with_links(2, [(True, GPU, nvml_bus(3))]),
        with_links(3, [(True, GPU, nvml_bus(2))]),
    ]
    found = discover(FakeNvmlLib(gpus))
    assert [g.nvlink_domain for g in found] == [
        f"nvlink-{sysfs_bus(0)}",
        f"nvlink-{sysfs_bus(0)}",
        f"nvlink-{sysfs_bus(2)}",
        f"nvlink-{sysfs_bus(2)}",
    ]


def test_an_nvswitch_board_is_one_domain_and_a_fabric_registration_wins() -> None:
    completed = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    switch = [(True, SWITCH, "00000000:00:00.0")] * 4
    gpus = [with_links(i, switch) for i in range(3)]
    assert {g.nvlink_domain for g in discover(FakeNvmlLib(gpus))} == {NVSWITCH_DOMAIN}
    registered = [dataclasses.replace(g, fabric=(CLUSTER.bytes, 3, completed, 0)) for g in gpus]
    assert {g.nvlink_domain for g in discover(FakeNvmlLib(registered))} == {f"{CLUSTER}.3"}
    pending = [dataclasses.replace(g, fabric=(CLUSTER.bytes, 3, completed - 1, 0)) for g in gpus]
    assert {g.nvlink_domain for g in discover(FakeNvmlLib(pending))} == {NVSWITCH_DOMAIN}


def test_links_are_read_up_to_the_bound_only() -> None:
    many = [(True, GPU, nvml_bus(1))] * 200
    lib = FakeNvmlLib([with_links(0, many), with_links(1, [(True, GPU, nvml_bus(0))])])
    discover(lib)
    assert lib.calls.count("nvmlDeviceGetNvLinkState") <= 2 * pynvml.NVML_NVLINK_MAX_LINKS


def test_an_nvml_error_on_a_link_leaves_that_gpu_without_a_domain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = with_links(
        0,
        [(True, GPU, nvml_bus(1))],
        errors={"nvmlDeviceGetNvLinkState": pynvml.NVML_ERROR_UNKNOWN},
    )
    caplog.set_level(logging.WARNING)
    found = discover(FakeNvmlLib([broken, with_links(1, [(True, GPU, nvml_bus(0))])]))
    assert [g.nvlink_domain for g in found] == [None, None]
    assert "GPU 0: NVLink topology not read" in caplog.text
    assert len(found) == 2  # both GPUs are still published


def test_an_old_driver_without_the_nvlink_functions_degrades() -> None:
    absent = frozenset(
        {
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            "nvmlDeviceGetGpuFabricInfo",
        }
    )
    gpus = [with_links(0, [(True, GPU, nvml_bus(1))]), with_links(1, [(True, GPU, nvml_bus(0))])]
    assert [g.nvlink_domain for g in discover(FakeNvmlLib(gpus, absent=absent))] == [None, None]


# --- the mock backend and the slices ---------------------------------------------------------


def test_the_default_mock_is_an_nvswitch_board() -> None:
    assert {g.nvlink_domain for g in MockBackend("n", 8).discover()} == {NVSWITCH_DOMAIN}


def test_a_mock_pcie_board_with_bridged_pairs() -> None:
    entries = [{"nvlinkDomain": f"pair-{i // 2}"} for i in range(4)] + [{"nvlinkDomain": None}]
    gpus = [gpu_from_entry("n", i, len(entries), e) for i, e in enumerate(entries)]
    assert [g.nvlink_domain for g in gpus] == ["pair-0", "pair-0", "pair-1", "pair-1", None]


@pytest.mark.parametrize("value", [7, "bad value", "x" * 65])
def test_a_bad_mock_domain_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(DiscoveryError, match=r"entry 0: field 'nvlink(Domain|_domain)'"):
        gpu_from_entry("n", 0, 1, {"nvlinkDomain": value})


def test_mig_devices_and_placements_publish_no_domain() -> None:
    parent = gpu_from_entry("n", 0, 1, {"migDevices": [{"profile": "1g.10gb", "gpuInstance": 9}]})
    assert parent.nvlink_domain == NVSWITCH_DOMAIN
    (mig,) = parent.mig_devices
    assert mig.nvlink_domain is None
    dynamic = MockBackend("n", 1, mig_enabled=True).discover()
    for content in desired_slices(
        node_devices(
            dynamic, names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
        )
    ):
        for device in content.get("devices", []):
            assert names.ATTR_NVLINK_DOMAIN not in device["attributes"], device["name"]
