"""The project's NVML discovery through the real ``pynvml`` module over a faked C library
(:mod:`tests.kubeletplugin.devices.fakenvmllib`), and the GPUs the tests describe with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml

from kubeletplugin.devices.nvml import NvmlBackend
from kubeletplugin.model import GpuInfo
from tests.kubeletplugin.devices.fakenvmllib import FakeGpu, FakeNvmlLib, StrictModule, installed

NO_SYSFS = Path("/nonexistent")


def h100(index: int = 0) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        name="NVIDIA H100 80GB HBM3",
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        minor=index,
        brand=14,
        architecture=9,
        compute_capability=(9, 0),
        memory_total=85520809984,
        memory_reserved=552337408,
        numa_node=1,
    )


@contextmanager
def real_pynvml(lib: FakeNvmlLib) -> Iterator[StrictModule]:
    """pynvml over ``lib``; afterwards, no unknown name, no bad argument, no open session."""
    module = StrictModule(pynvml)
    with installed(lib):
        yield module
    assert module.missing == [], f"names pynvml lacks: {module.missing}"
    assert lib.missing == [], f"C functions the fake lacks: {lib.missing}"
    assert lib.violations == [], f"calls not matching nvml.h: {lib.violations}"
    assert lib.initialised == 0, "an NVML session was left open"


def discover(lib: FakeNvmlLib) -> list[GpuInfo]:
    with real_pynvml(lib) as nvml:
        return NvmlBackend(nvml=nvml, sysfs_root=NO_SYSFS).discover()
