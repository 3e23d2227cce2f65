"""Which published devices a MIG instance named by a health event is.

An NVML event can name a GPU instance (and a compute instance) of the physical GPU it comes
from. Its fault then belongs to the device of that instance only:

- a static MIG device (``gpu.mig`` set; the table lists the instances that existed when the
  daemon started) is found by its ``(gpu_instance, compute_instance)`` on its parent; an event
  without a compute instance names every device of its GPU instance;
- a dynamic MIG device (:attr:`~kubeletplugin.devices.table.NodeDevice.dynamic_mig`) has a MIG
  instance only while a claim on it is prepared, so only prepare knows which placement device a
  GPU instance id belongs to: an :data:`InstanceResolver` (physical GPU UUID and GPU instance id
  -> device name, or None) answers for it.

Invariants: :meth:`InstanceDevices.resolve` returns only names of the table's instance devices
of the event's GPU; an empty result means the instance is not one the node publishes (created
by someone else after the table was built, or not prepared by this plugin), and None means the
event cannot be tied to an instance device and counts for the whole GPU (the GPU is not in the
table, or the resolver failed: fail safe, like an event from an unidentified GPU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from kubeletplugin.devices.table import NodeDevice, NodeDevices

log = logging.getLogger(__name__)

#: Physical GPU UUID and GPU instance id -> the name of the dynamic MIG device whose prepared
#: claim owns that instance, or None when no prepared claim does.
InstanceResolver = Callable[[str, int], str | None]

#: Identity of the GPU instance a device lives on, within its physical GPU: ``("gi", id)`` for a
#: static MIG device, ``("placement", name)`` for a dynamic one (one device per instance).
InstanceGroup = tuple[str, int | str]

_STATIC: Final = "gi"
_DYNAMIC: Final = "placement"


def is_instance_device(device: NodeDevice) -> bool:
    """Whether ``device`` is one MIG instance of its GPU (static or dynamic MIG device)."""
    return device.mig is not None or device.dynamic_mig


def instance_group(device: NodeDevice) -> InstanceGroup | None:
    """The GPU instance ``device`` lives on (devices of one static GPU instance share it);
    None for a device that is no MIG instance (whole GPU, partition)."""
    if device.dynamic_mig:
        return (_DYNAMIC, device.name)
    if device.mig is not None:
        return (_STATIC, device.mig.gpu_instance)
    return None


class InstanceDevices:
    """The instance devices of a node's table, indexed for event lookup (immutable)."""

    def __init__(self, devices: NodeDevices) -> None:
        #: Physical GPU UUID -> its instance devices, in publishing order.
        self._by_gpu: dict[str, list[NodeDevice]] = {gpu.uuid: [] for gpu in devices.gpus}
        for device in devices:
            if is_instance_device(device):
                self._by_gpu.setdefault(device.parent_uuid, []).append(device)

    def names(self) -> list[str]:
        """Every instance device's name, in publishing order."""
        return [d.name for devices in self._by_gpu.values() for d in devices]

    def names_of(self, gpu_uuid: str) -> list[str]:
        """The names of the instance devices of physical GPU ``gpu_uuid``, in order."""
        return [d.name for d in self._by_gpu.get(gpu_uuid, [])]

    def resolve(
        self,
        gpu_uuid: str,
        gpu_instance: int,
        compute_instance: int | None,
        resolver: InstanceResolver | None,
    ) -> tuple[str, ...] | None:
        """The devices the MIG instance names (see the module doc for empty and None)."""
        devices = self._by_gpu.get(gpu_uuid)
        if devices is None:
            return None
        if any(d.dynamic_mig for d in devices):
            return self._resolve_dynamic(devices, gpu_uuid, gpu_instance, resolver)
        return tuple(
            d.name
            for d in devices
            if d.mig is not None
            and d.mig.gpu_instance == gpu_instance
            and (compute_instance is None or d.mig.compute_instance == compute_instance)
        )

    @staticmethod
    def _resolve_dynamic(
        devices: Sequence[NodeDevice],
        gpu_uuid: str,
        gpu_instance: int,
        resolver: InstanceResolver | None,
    ) -> tuple[str, ...] | None:
        if resolver is None:
            return ()
        try:
            name = resolver(gpu_uuid, gpu_instance)
        except Exception:  # a resolver bug must not stop health checking
            log.exception(
                "cannot tell which device GPU instance %d of GPU %s is; the fault counts for "
                "the whole GPU",
                gpu_instance,
                gpu_uuid,
            )
            return None
        if name is None:
            return ()
        if not any(d.name == name and d.dynamic_mig for d in devices):
            log.warning(
                "GPU instance %d of GPU %s resolves to %r, which is no dynamic MIG device of "
                "that GPU",
                gpu_instance,
                gpu_uuid,
                name,
            )
            return ()
        return (name,)
