"""The one record of a prepared device (share) of a claim.

The state module makes a :class:`DeviceRecord` once per allocated device; the checkpoint stores
it, the CDI writer renders it, the gRPC layer answers kubelet with it (it is a
``PreparedDevice`` of the kubelet kit) and the share enforcer enforces it, deciding its
:class:`Enforcement`. Plain data: no I/O, no checks (the checkpoint checks what it reads back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeletplugin.model import GpuInfo, base_request_names


@dataclass(frozen=True)
class Enforcement:
    """What the share enforcer decided for one device.

    Invariants: ``strategy`` is a GpuConfig strategy; ``0 <= limit_cores <= 100`` and
    ``0 <= limit_memory <=`` the GPU's memory (what the container is limited to: the share's
    request, or its ``burstLimit`` above it (:func:`api.burst.share_caps`), or an override
    below those); ``interval`` (a time-slice interval name) is set exactly for
    ``TimeSlicing``.
    """

    strategy: str
    limit_cores: int
    limit_memory: int
    interval: str | None = None


@dataclass(frozen=True)
class DeviceRecord:
    """One prepared device (share) of a claim: what it is entitled to, where it is rendered, and
    what enforcement decided for it.

    Entitlement: ``1 <= cores <= 100`` (percent of the GPU's compute) and
    ``0 < memory <= gpu.memory_usable`` (bytes); a whole-GPU allocation has every core and the
    GPU's usable memory, a consumable-capacity share has ``share_id``, a partition device
    ``partition``. ``requests`` are the requests served as allocated (``req`` or ``req/sub``);
    ``base_requests`` their base names, computed once here; ``extra`` keeps fields of newer
    checkpoint versions.

    ``gpu_uuid`` is the device's GPU in the node's device table. Dynamic MIG devices: it is the
    physical GPU (what the conflict check indexes, so overlapping placements of one GPU meet),
    and ``mig_gpu_instance``, ``mig_compute_instance`` and ``mig_uuid`` name the MIG instance
    prepare created; all three are None until it exists (``PrepareStarted`` is recorded before
    the create), and None for every other device.

    ``gpu_info`` is never stored: the state module attaches it whenever it makes a record or
    takes one back from a file, so every record it hands to the enforcer or the CDI writer has
    it (:attr:`gpu`): the GPU the device's processes run on, ``gpu_uuid``'s GPU or, for a
    dynamic MIG device whose instance exists, that MIG device (UUID ``mig_uuid``).

    ``enforcement`` is None until the enforcer decided (apply, or restore after a restart), and
    stays None for an adminAccess device (never enforced) and under an enforcer that enforces
    nothing.
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    gpu_uuid: str
    cores: int
    memory: int
    cdi_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    partition: str | None = None
    admin_access: bool = False
    mig_gpu_instance: int | None = None
    mig_compute_instance: int | None = None
    mig_uuid: str | None = None
    enforcement: Enforcement | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    gpu_info: GpuInfo | None = field(default=None, compare=False, repr=False)
    #: ``requests`` reduced to base names (``req/sub`` -> ``req``), in order without repeats.
    base_requests: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_requests", base_request_names(self.requests))

    @property
    def gpu(self) -> GpuInfo:
        """The attached GPU (see the class docstring); ValueError on a record read from a file
        that the state module has not taken back yet."""
        if self.gpu_info is None:
            raise ValueError(f"device {self.device}: the record has no GPU attached")
        return self.gpu_info

    @property
    def enforced(self) -> Enforcement:
        """``enforcement``, for a record the enforcer decided; ValueError otherwise."""
        if self.enforcement is None:
            raise ValueError(f"device {self.device}: no enforcement decided")
        return self.enforcement

    @property
    def is_share(self) -> bool:
        """True for consumable-capacity shares and partitions (enforcement applies)."""
        return self.share_id is not None or self.partition is not None

    @property
    def request_names(self) -> tuple[str, ...]:
        return self.requests

    @property
    def pool_name(self) -> str:
        return self.pool

    @property
    def device_name(self) -> str:
        return self.device
