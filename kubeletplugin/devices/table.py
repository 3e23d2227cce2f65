"""The node's device table: every device the node publishes in its sharing mode, computed once.

:func:`node_devices` is the one place that decides which devices exist and their names; the
publisher, prepare and health all use the same table, so they cannot disagree about a device.
Invariants: names are unique; devices are in publishing order (GPUs by NVML index, then as their
slice lists them); every device's physical GPU (:attr:`NodeDevice.parent`) is in :attr:`gpus`.
A GPU in MIG mode is never published whole or shared: each existing MIG device is one exclusive
device, or with ``--mig dynamic`` each placement of each profile is one
(:func:`api.names.mig_placement_device_name`, the instance created at prepare); a GPU whose MIG
mode change is pending is no device (one warning). The table never changes while the daemon
runs: placements someone else's instances block are hidden from the slices, not the table. No
GPU holds more shares than its :meth:`NodeDevices.share_limit` (:mod:`.sharelimit`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from api import names
from kubeletplugin.devices import sharelimit
from kubeletplugin.devices.mig import MIG_ENABLED, mig_device_name
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement, MigProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeDevice:
    """One published device: a whole GPU or, in ``partitions`` mode, a ``1/n`` slice of one.

    ``profile`` is the partition profile the device is published with (``partitions`` mode
    only; the GPU's whole device there has the ``whole`` profile). ``partition`` is the profile
    of a true partition (``n > 1``) and None for a whole GPU in every mode: what a prepared
    device records and its container sees.

    A MIG device has ``gpu.mig`` set: ``gpu`` is the MIG device (its UUID and memory), never a
    partition, and :attr:`parent_uuid` names the physical GPU it lives on.
    """

    name: str
    gpu: GpuInfo
    profile: str | None = None
    #: Dynamic MIG only: the GPU-instance profile and placement prepare creates; ``gpu`` is then
    #: the physical GPU. Both set or both None.
    mig_profile: MigProfile | None = None
    placement: MigPlacement | None = None

    @property
    def dynamic_mig(self) -> bool:
        """Whether prepare creates this device's MIG instance (dynamic MIG)."""
        return self.mig_profile is not None

    @property
    def mig(self) -> MigInfo | None:
        """The device's MIG identity; None for whole GPUs and partitions."""
        return self.gpu.mig

    @property
    def parent_uuid(self) -> str:
        """UUID of the physical GPU the device lives on (its own GPU's unless MIG)."""
        return self.gpu.mig.parent_uuid if self.gpu.mig is not None else self.gpu.uuid

    @property
    def partition(self) -> str | None:
        if self.profile is None or names.PARTITION_PROFILES[self.profile] == 1:
            return None
        return self.profile


@dataclass(frozen=True)
class NodeDevices:
    """The devices of one node in one sharing mode (see the module docstring)."""

    sharing_mode: str
    #: The node's GPUs in NVML index order.
    gpus: tuple[GpuInfo, ...]
    #: Device name -> device, in publishing order.
    devices: Mapping[str, NodeDevice] = field(repr=False)
    #: Consumable mode: the cores (percent of a GPU) a request that names none is charged, e.g.
    #: one asking only for memory (the cores request policy's default; 1 to 100).
    default_share_cores: int = names.CORES_PER_GPU
    #: The node's bound on the shares of one GPU (``--max-shares-per-gpu``; 0: MPS's bound
    #: alone); :meth:`share_limit` gives a GPU's.
    max_shares: int = 0

    def share_limit(self, gpu: GpuInfo) -> int:
        """The most shares ``gpu`` holds at once (:func:`~kubeletplugin.devices.sharelimit.
        share_limit`)."""
        return sharelimit.share_limit(gpu, self.max_shares)

    def __iter__(self) -> Iterator[NodeDevice]:
        return iter(self.devices.values())

    def __len__(self) -> int:
        return len(self.devices)

    def __contains__(self, name: object) -> bool:
        return name in self.devices

    def __getitem__(self, name: str) -> NodeDevice:
        return self.devices[name]

    def get(self, name: str) -> NodeDevice | None:
        """The device called ``name``, or None when the node publishes no such device."""
        return self.devices.get(name)

    def of_gpu(self, gpu: GpuInfo) -> list[NodeDevice]:
        """The devices published for physical GPU ``gpu`` (its MIG devices included), in
        publishing order."""
        return [d for d in self.devices.values() if d.parent_uuid == gpu.uuid]

    def names_by_gpu(self) -> dict[str, list[str]]:
        """Physical GPU UUID -> names of the devices published for it (partitions and MIG
        devices included), in order."""
        result: dict[str, list[str]] = {gpu.uuid: [] for gpu in self.gpus}
        for device in self.devices.values():
            result[device.parent_uuid].append(device.name)
        return result


def node_devices(
    gpus: Sequence[GpuInfo],
    sharing_mode: str,
    default_share_cores: int = names.CORES_PER_GPU,
    mig_strategy: str = names.MIG_STRATEGY_STATIC,
    max_shares: int = 0,
) -> NodeDevices:
    """The table of the devices published for ``gpus`` in ``sharing_mode``.

    Raises ValueError for an unknown sharing mode or MIG strategy (the message lists the allowed
    ones), dynamic MIG outside ``partitions`` mode, a ``default_share_cores`` outside 1 to 100,
    or a GPU whose MIG devices are not its own or repeat a (GPU instance, compute instance) pair,
    or a ``max_shares`` outside 0 to :data:`~kubeletplugin.devices.sharelimit.MAX_SHARES_PER_GPU`.
    A partition profile of more parts than the GPU's share limit is left out.
    """
    if mig_strategy not in names.MIG_STRATEGIES:
        raise ValueError(
            f"unknown MIG strategy {mig_strategy!r} (allowed: {', '.join(names.MIG_STRATEGIES)})"
        )
    dynamic = mig_strategy == names.MIG_STRATEGY_DYNAMIC
    if dynamic and sharing_mode != names.SHARING_MODE_PARTITIONS:
        raise ValueError(
            f"dynamic MIG needs sharing mode {names.SHARING_MODE_PARTITIONS}, not {sharing_mode}"
        )
    if sharing_mode not in names.SHARING_MODES:
        raise ValueError(
            f"unknown sharing mode {sharing_mode!r} (allowed: {', '.join(names.SHARING_MODES)})"
        )
    if not 1 <= default_share_cores <= names.CORES_PER_GPU:
        raise ValueError(
            f"default share cores must be 1 to {names.CORES_PER_GPU}, got {default_share_cores}"
        )
    if not 0 <= max_shares <= sharelimit.MAX_SHARES_PER_GPU:
        raise ValueError(
            f"max shares per GPU must be 0 to {sharelimit.MAX_SHARES_PER_GPU}, got {max_shares}"
        )
    ordered = tuple(sorted(gpus, key=lambda g: g.index))
    table: dict[str, NodeDevice] = {}
    for gpu in ordered:
        if gpu.mig_pending:
            log.warning(
                "GPU %d (%s): its MIG mode change waits for a GPU reset; publishing no device "
                "for it until then",
                gpu.index,
                gpu.uuid,
            )
            continue
        if gpu.mig_mode == MIG_ENABLED and dynamic and gpu.mig_profiles:
            for device in _placement_devices(gpu):
                table[device.name] = device
            continue
        if gpu.mig_mode == MIG_ENABLED:
            if dynamic:
                log.warning(
                    "GPU %d (%s): NVML lists no MIG profiles for it; publishing its existing MIG "
                    "devices as with --mig static",
                    gpu.index,
                    gpu.uuid,
                )
            if not gpu.mig_devices:
                log.warning(
                    "GPU %d (%s) is in MIG mode without MIG devices; publishing no device for it",
                    gpu.index,
                    gpu.uuid,
                )
            for mig in _mig_devices(gpu):
                if mig.name in table:
                    raise ValueError(f"GPU {gpu.uuid} lists MIG device {mig.name} twice")
                table[mig.name] = mig
            continue
        if sharing_mode != names.SHARING_MODE_PARTITIONS:
            whole = names.device_name(gpu.index)
            table[whole] = NodeDevice(whole, gpu)
            continue
        limit = sharelimit.share_limit(gpu, max_shares)
        for profile, parts in names.PARTITION_PROFILES.items():
            if parts > limit:
                continue
            for j in range(parts):
                name = (
                    names.device_name(gpu.index)
                    if parts == 1
                    else names.partition_device_name(gpu.index, profile, j)
                )
                table[name] = NodeDevice(name, gpu, profile)
    return NodeDevices(sharing_mode, ordered, table, default_share_cores, max_shares)


def _mig_devices(gpu: GpuInfo) -> list[NodeDevice]:
    """The devices of ``gpu``'s MIG devices; ValueError for one that is not of ``gpu``."""
    devices = []
    for device in gpu.mig_devices:
        mig = device.mig
        if mig is None or mig.parent_uuid != gpu.uuid or device.index != gpu.index:
            raise ValueError(f"MIG device {device.uuid} is not a MIG device of GPU {gpu.uuid}")
        name = mig_device_name(gpu.index, mig.gpu_instance, mig.compute_instance)
        devices.append(NodeDevice(name, device))
    return devices


def _placement_devices(gpu: GpuInfo) -> list[NodeDevice]:
    """One device per placement of each MIG profile of ``gpu`` (profiles in the GPU's order,
    placements by start)."""
    return [
        NodeDevice(
            names.mig_placement_device_name(gpu.index, profile.name, placement.start),
            gpu,
            mig_profile=profile,
            placement=placement,
        )
        for profile in gpu.mig_profiles
        for placement in sorted(profile.placements)
    ]
