"""The plugin's neutral types: what every stage (devices, sharing, prepare, health) shares.

Nothing here does I/O or imports another part of the plugin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


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


def base_request_names(requests: Iterable[str]) -> tuple[str, ...]:
    """The request names kubelet knows, in order without repeats: a subrequest ``req/sub``
    (DRA's name for an alternative of ``firstAvailable``) becomes its request ``req``."""
    return tuple(dict.fromkeys(r.split("/", 1)[0] for r in requests))
