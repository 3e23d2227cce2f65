"""The plugin's neutral types: what every stage (devices, sharing, prepare, health) shares.

Nothing here does I/O or imports another part of the plugin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigInfo:
    """What makes a :class:`GpuInfo` a MIG device: its place on the parent GPU.

    Invariants: ``gpu_instance`` and ``compute_instance`` are NVML's ids (unique per parent as a
    pair); ``profile`` is the MIG profile name (``1g.10gb``, ``1c.3g.40gb``);
    ``compute_slices <= gpu_slices``; ``multiprocessors > 0``.
    """

    parent_uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str
    multiprocessors: int
    gpu_slices: int
    compute_slices: int


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as discovered on the node, or one MIG device of such a GPU.

    Invariants: ``memory_usable = memory_total - memory_reserved`` and is > 0; versions are the
    raw strings the driver reports (normalised to semver only when published); ``index`` is the
    NVML index, never a position in some other ordering.

    A MIG device is what its container sees as its GPU: ``mig`` is set, ``uuid`` is the MIG
    UUID (``MIG-...``), the memory fields are the MIG device's, and every other field
    (``index``, ``minor``, PCI, NUMA, product, versions) is its parent GPU's. A MIG device has no
    ``mig_devices`` of its own.
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
    #: The current mode: the one the GPU runs in until its next reset.
    mig_mode: str | None = None
    #: True when the pending MIG mode differs from the current one (a change that waits for a
    #: GPU reset): such a GPU is published as no device at all.
    mig_pending: bool = False
    #: The MIG devices that exist on this GPU (``mig_mode == "Enabled"`` only), ordered by
    #: (GPU instance, compute instance).
    mig_devices: tuple[GpuInfo, ...] = field(default=())
    #: Set on a MIG device only (see the class docstring).
    mig: MigInfo | None = None
    #: Notes about fallbacks taken during discovery (shown by ``sharegpu devices``).
    notes: tuple[str, ...] = field(default=())


def base_request_names(requests: Iterable[str]) -> tuple[str, ...]:
    """The request names kubelet knows, in order without repeats: a subrequest ``req/sub``
    (DRA's name for an alternative of ``firstAvailable``) becomes its request ``req``."""
    return tuple(dict.fromkeys(r.split("/", 1)[0] for r in requests))
