"""What the plugin knows about one physical GPU, and the backend interface that discovers GPUs.

Backends (NVML, mock) return :class:`GpuInfo` records in NVML index order. Everything downstream
(slices, prepare, health) works from these records only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class DiscoveryError(RuntimeError):
    """An expected failure to discover GPUs (no NVML library, no GPU, an NVML error).

    The message is one line that names the cause; callers print it and exit non-zero.
    """


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as discovered on the node.

    Invariants: ``memory_usable = memory_total - memory_reserved`` and is > 0; versions are the
    raw strings the driver reports (normalised to semver only when published); ``index`` is the
    NVML index, never a position in some other ordering.
    """

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    driver_version: str
    cuda_driver_version: str
    pci_bus_id: str
    memory_total: int
    memory_reserved: int
    memory_usable: int
    pcie_root: str | None = None
    numa_node: int | None = None
    #: "v2" when NVML memory info v2 gave the reserved memory; "v1" when it was unavailable.
    memory_info_version: str = "v2"
    #: MIG mode as reported ("Enabled"/"Disabled"), or None when the GPU does not support MIG.
    mig_mode: str | None = None
    #: Notes about fallbacks taken during discovery (shown by ``sharegpu devices``).
    notes: tuple[str, ...] = field(default=())


class DeviceBackend(Protocol):
    """Discovers the node's GPUs. Implementations: NVML (real GPUs) and mock."""

    #: Backend name as given to ``--device-backend``.
    name: str

    def discover(self) -> list[GpuInfo]:
        """Return the node's GPUs ordered by NVML index; raise :class:`DiscoveryError`."""
        ...
