"""The plugin's neutral types: what every stage (devices, sharing, prepare, health) shares.

Nothing here does I/O or imports another part of the plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from api import names


@dataclass(frozen=True, order=True)
class MigPlacement:
    """Where a GPU instance sits on its GPU, in NVML's placement units (memory slices).

    Invariants: ``start >= 0``, ``size >= 1``; the instance occupies memory slices
    ``start .. start + size - 1``.
    """

    start: int
    size: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.size < 1:
            raise ValueError(
                f"MIG placement start {self.start} size {self.size} is not a placement"
            )

    @property
    def slots(self) -> range:
        """The memory slices the placement occupies."""
        return range(self.start, self.start + self.size)

    def overlaps(self, other: MigPlacement) -> bool:
        """Whether the two placements share a memory slice."""
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable GPU, as NVML describes it
    (``nvmlDeviceGetGpuInstanceProfileInfo`` and ``nvmlDeviceGetGpuInstancePossiblePlacements``),
    with the compute-instance profile that fills a GPU instance of it.

    Invariants: ``name`` is the profile name ``nvidia-smi mig -lgip`` prints without ``MIG ``
    (``1g.10gb``, ``1g.10gb+me``); ``profile_id`` is NVML's profile id (``info.id``, what
    ``nvmlDeviceCreateGpuInstanceWithPlacement`` takes) and ``profile_index`` the
    ``NVML_GPU_INSTANCE_PROFILE_*`` value it was read with; ``1 <= slice_count``;
    ``instance_count >= 1``; every placement is one NVML lists for the profile; ``compute_profile``
    is the ``NVML_COMPUTE_INSTANCE_PROFILE_*`` value whose slice count equals ``slice_count``.
    """

    profile_id: int
    profile_index: int
    name: str
    slice_count: int
    instance_count: int
    memory_mb: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[MigPlacement, ...]
    compute_profile: int


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
    #: The GPU instance's placement and profile id (NVML ``nvmlGpuInstanceGetInfo``); None when
    #: the backend could not read them (static MIG devices work without).
    placement: MigPlacement | None = None
    profile_id: int | None = None


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
    #: The NVLink domain (:mod:`kubeletplugin.devices.nvlink`): GPUs of the node with the same
    #: value reach each other over NVLink; None without an NVLink peer (and on a MIG device).
    nvlink_domain: str | None = None
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
    #: The GPU-instance profiles the GPU can create (``mig_mode == "Enabled"`` only), ordered by
    #: (slice count, memory, profile id); empty when NVML could not list them. What dynamic MIG
    #: publishes (:mod:`kubeletplugin.devices.migtables`).
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    #: Set on a MIG device only (see the class docstring).
    mig: MigInfo | None = None
    #: Notes about fallbacks taken during discovery (shown by ``sharegpu devices``).
    notes: tuple[str, ...] = field(default=())

    def mig_device(
        self, uuid: str, memory_total: int, mig: MigInfo, memory_reserved: int = 0
    ) -> GpuInfo:
        """This GPU's MIG device ``mig``: its UUID and memory; every other field (index,
        minor, PCI, NUMA, product, versions) this GPU's; no MIG mode, MIG devices, MIG profiles
        or notes of its own, and no NVLink domain (MIG devices have no NVLink peer-to-peer; see the
        class docstring). The one builder of MIG device records."""
        return replace(
            self,
            uuid=uuid,
            memory_total=memory_total,
            memory_reserved=memory_reserved,
            memory_usable=memory_total - memory_reserved,
            mig_mode=None,
            mig_pending=False,
            mig_devices=(),
            mig_profiles=(),
            mig=mig,
            nvlink_domain=None,
            notes=(),
        )


def base_request_names(requests: Iterable[str]) -> tuple[str, ...]:
    """The request names kubelet knows, in order without repeats: a subrequest ``req/sub``
    (DRA's name for an alternative of ``firstAvailable``) becomes its request ``req``."""
    return tuple(dict.fromkeys(names.base_request_name(r) for r in requests))


#: Device name -> the taints the driver puts on it (``spec.devices[].taints`` entries).
Taints = Mapping[str, Sequence[Mapping[str, Any]]]


class TaintSink(Protocol):
    """Takes a stage's complete taint map (the slice publisher, or one source of a merger)."""

    def set_taints(self, taints: Taints) -> None: ...
