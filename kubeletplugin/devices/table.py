"""The node's device table: every device the node publishes in its sharing mode, computed once.

:func:`node_devices` is the one place that decides which devices exist and what they are named.
The daemon builds the table once from the discovered GPUs and hands the same object to the
publisher (which renders the slices from it, :func:`kubeletplugin.devices.slices.desired_slices`),
to prepare (which resolves allocated device names through it) and to health (which taints and
streams the devices of each GPU), so the three cannot disagree about a device's name or GPU.

Invariants: names are unique; devices are in publishing order (GPUs by NVML index, then each
GPU's devices in the order its slice lists them); every device's GPU is in :attr:`gpus`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from api import names
from kubeletplugin.model import GpuInfo


@dataclass(frozen=True)
class NodeDevice:
    """One published device: a whole GPU or, in ``partitions`` mode, a ``1/n`` slice of one.

    ``profile`` is the partition profile the device is published with (``partitions`` mode
    only; the GPU's whole device there has the ``whole`` profile). ``partition`` is the profile
    of a true partition (``n > 1``) and None for a whole GPU in every mode: what a prepared
    device records and its container sees.
    """

    name: str
    gpu: GpuInfo
    profile: str | None = None

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
        """The devices published for ``gpu``, in publishing order."""
        return [d for d in self.devices.values() if d.gpu.uuid == gpu.uuid]

    def names_by_gpu(self) -> dict[str, list[str]]:
        """GPU UUID -> names of the devices published for it (partitions included), in order."""
        result: dict[str, list[str]] = {gpu.uuid: [] for gpu in self.gpus}
        for device in self.devices.values():
            result[device.gpu.uuid].append(device.name)
        return result


def node_devices(
    gpus: Sequence[GpuInfo],
    sharing_mode: str,
    default_share_cores: int = names.CORES_PER_GPU,
) -> NodeDevices:
    """The table of the devices published for ``gpus`` in ``sharing_mode``.

    Raises ValueError for an unknown sharing mode (the message lists the allowed ones) or a
    ``default_share_cores`` outside 1 to 100.
    """
    if sharing_mode not in names.SHARING_MODES:
        raise ValueError(
            f"unknown sharing mode {sharing_mode!r} (allowed: {', '.join(names.SHARING_MODES)})"
        )
    if not 1 <= default_share_cores <= names.CORES_PER_GPU:
        raise ValueError(
            f"default share cores must be 1 to {names.CORES_PER_GPU}, got {default_share_cores}"
        )
    ordered = tuple(sorted(gpus, key=lambda g: g.index))
    table: dict[str, NodeDevice] = {}
    for gpu in ordered:
        if sharing_mode != names.SHARING_MODE_PARTITIONS:
            whole = names.device_name(gpu.index)
            table[whole] = NodeDevice(whole, gpu)
            continue
        for profile, parts in names.PARTITION_PROFILES.items():
            for j in range(parts):
                name = (
                    names.device_name(gpu.index)
                    if parts == 1
                    else names.partition_device_name(gpu.index, profile, j)
                )
                table[name] = NodeDevice(name, gpu, profile)
    return NodeDevices(sharing_mode, ordered, table, default_share_cores)
