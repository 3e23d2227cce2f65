"""Which devices this node publishes, and what each allocation result is entitled to.

:func:`device_record` is the one place that turns the allocation results of one device (share)
into its :class:`~kubeletplugin.devicerecord.DeviceRecord` and what it is entitled to (cores and
memory): from ``consumedCapacity`` for consumable-capacity shares
(:func:`api.sharepolicy.share_reservation`, the rule the tracker and quota apply too), from the
partition profile for partition devices (:func:`kubeletplugin.devices.slices.partition_share`,
the amounts the slice publishes), the whole GPU otherwise.

A dynamic MIG device's record is on its physical GPU until prepare has created its instance
(every core, the profile's memory); prepare then attaches the created MIG device and its
memory. Such a device is never a consumable-capacity share and never prepared with adminAccess:
its instance exists only for the claim that holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from api import names
from api.quantity import QuantityError, quantity_whole
from api.sharepolicy import share_reservation
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.devices.mig import MIB
from kubeletplugin.devices.slices import partition_share
from kubeletplugin.devices.table import NodeDevice
from kubeletplugin.prepare.claims import AllocationResult, ClaimError


def _quantity(label: str) -> Callable[[str, Any], int]:
    """Reads one ``consumedCapacity`` amount exactly. The published request policies
    (:func:`api.sharepolicy.consumable_capacity`) grant whole cores and whole bytes, so
    kube-scheduler records whole amounts; a fraction is refused, never rounded (up would grant
    more than the share, down would silently shrink it)."""

    def parse(name: str, value: Any) -> int:
        try:
            return quantity_whole(value)
        except QuantityError as exc:
            raise ClaimError(
                f"{label}: consumedCapacity.{name}: {exc} (the device's request policy grants "
                "whole cores and memory in whole bytes)"
            ) from exc

    return parse


def device_record(
    results: Sequence[AllocationResult],
    device: NodeDevice,
    driver_name: str,
    claim_label: str,
    *,
    cdi_name: str,
    cdi_device_ids: tuple[str, ...],
) -> DeviceRecord:
    """The record of what ``results`` (one or more results of a claim naming the same device
    and shareID) grant on ``device``'s GPU (see the module docstring), with that GPU attached
    and rendered as CDI device ``cdi_name`` (``cdi_device_ids`` answered to kubelet)."""
    if not results:
        raise ValueError("device_record needs at least one allocation result")
    result = results[0]
    gpu = device.gpu
    label = f"{claim_label}: request {result.request!r} on {result.device}"
    if device.mig_profile is not None:
        if result.share_id is not None or any(r.admin_access for r in results):
            raise ClaimError(
                f"{label}: a dynamic MIG device is prepared only as a whole device, without "
                "shareID or adminAccess (its MIG instance is created for the one claim holding it)"
            )
        cores = names.CORES_PER_GPU
        memory = min(device.mig_profile.memory_mb * MIB, gpu.memory_usable)
    elif device.partition is not None:
        cores, memory = partition_share(gpu, device.partition)
    elif result.share_id is not None:
        cores, memory = share_reservation(
            result.consumed_capacity,
            driver_name,
            (names.CORES_PER_GPU, gpu.memory_usable),
            _quantity(label),
        )
    else:
        cores, memory = names.CORES_PER_GPU, gpu.memory_usable
    if not 1 <= cores <= names.CORES_PER_GPU:
        raise ClaimError(f"{label}: consumed cores {cores} outside 1..{names.CORES_PER_GPU}")
    if not 0 < memory <= gpu.memory_usable:
        raise ClaimError(
            f"{label}: consumed memory {memory} bytes outside 1..{gpu.memory_usable} "
            f"(the GPU's usable memory)"
        )
    return DeviceRecord(
        requests=tuple(dict.fromkeys(r.request for r in results)),
        pool=result.pool,
        device=result.device,
        gpu_uuid=gpu.uuid,
        cores=cores,
        memory=memory,
        cdi_name=cdi_name,
        cdi_device_ids=cdi_device_ids,
        share_id=result.share_id,
        partition=device.partition,
        admin_access=all(r.admin_access for r in results),
        gpu_info=gpu,
    )
