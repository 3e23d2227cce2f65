"""The MIG instances of the node's claims, behind the :class:`ClaimInstances` seam the claim
state uses (as share enforcement sits behind ``ShareEnforcer``).

:class:`DynamicMigInstances` serves a device table with dynamic MIG devices
(:mod:`kubeletplugin.prepare.miginstances` matches records with the GPUs' instances);
:class:`NoMigInstances` any other table. The state calls, per claim and under that claim's
lock, never with its node-wide lock held (NVML is slow):

- :meth:`ClaimInstances.check_free` before it records ``PrepareStarted``;
- :meth:`ClaimInstances.create` once that record is durable: each instance, as soon as it
  exists, is handed back through ``record`` (so an undo finds it by its id) and the record
  returned names the created MIG devices (ids, UUID, CDI IDs, every core, the MIG device's
  memory);
- :meth:`ClaimInstances.destroy` before the claim's record is dropped (undo, unprepare); a
  MigError keeps the record, and the next call or start retries;
- :meth:`ClaimInstances.recover` at start, before share enforcement is restored.

A device without a recorded instance id owns no instance (its create failed cleanly, or never
ran), except for a claim whose create was interrupted or whose instance could not be
destroyed at start (*unsure*): the instance at its placement may be its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from api.names import CORES_PER_GPU
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.devices.migpartition import MigError, MigPartitioner
from kubeletplugin.devices.table import NodeDevice, NodeDevices
from kubeletplugin.model import GpuInfo
from kubeletplugin.prepare.checkpoint import ClaimRecord
from kubeletplugin.prepare.miginstances import MigInstances, RecordedInstance

#: The IDs returned to kubelet for a CDI device name on a GPU (the CDI writer's ``cdi_ids``).
CdiIds = Callable[[str, GpuInfo | None], tuple[str, ...]]


class ClaimInstances(Protocol):
    """The MIG instances the claims' dynamic MIG devices own (see module doc)."""

    def check_free(self, devices: Iterable[NodeDevice]) -> None:
        """MigError when an instance on the GPU overlaps the placement of one of ``devices``
        (the dynamic MIG devices of a claim about to be prepared)."""
        ...

    def create(self, rec: ClaimRecord, record: Callable[[ClaimRecord], None]) -> ClaimRecord:
        """Create the instance of each dynamic MIG device of ``rec`` (``PrepareStarted`` is
        durable); call ``record`` with the claim's record after each. MigError: that device's
        instance was not created; any other exception: it may have been."""
        ...

    def destroy(self, rec: ClaimRecord) -> None:
        """Destroy the instances ``rec`` owns; MigError for the first that cannot be."""
        ...

    def recover(self, claims: dict[str, ClaimRecord], rollback: set[str]) -> set[str]:
        """Start: match the recorded instances with the GPUs'. Adds the claims whose instance
        is missing to ``rollback``, gives the surviving records their instance (and the CDI
        IDs of its MIG device) in ``claims``; returns the rolled-back claims to keep recorded
        (their instance could not be destroyed)."""
        ...

    def from_spec(self, device: DeviceRecord) -> DeviceRecord:
        """A device read from a claim's spec file, recorded as prepare records it."""
        ...

    def hidden_devices(self) -> frozenset[str]:
        """Placement devices not to publish (blocked by instances no record owns)."""
        ...

    def device_for(self, parent_uuid: str, gpu_instance: int) -> str | None:
        """The dynamic MIG device whose claim's instance is GPU instance ``gpu_instance`` of
        GPU ``parent_uuid``, or None."""
        ...


class NoMigInstances:
    """A table without dynamic MIG devices: no instance is ever created or destroyed."""

    def check_free(self, devices: Iterable[NodeDevice]) -> None:
        return None

    def create(self, rec: ClaimRecord, record: Callable[[ClaimRecord], None]) -> ClaimRecord:
        return rec

    def destroy(self, rec: ClaimRecord) -> None:
        return None

    def recover(self, claims: dict[str, ClaimRecord], rollback: set[str]) -> set[str]:
        return set()

    def from_spec(self, device: DeviceRecord) -> DeviceRecord:
        return device

    def hidden_devices(self) -> frozenset[str]:
        return frozenset()

    def device_for(self, parent_uuid: str, gpu_instance: int) -> str | None:
        return None


class DynamicMigInstances:
    """:class:`ClaimInstances` of a table with dynamic MIG devices, over a partitioner."""

    def __init__(self, partitioner: MigPartitioner, devices: NodeDevices, cdi_ids: CdiIds) -> None:
        self._devices = devices
        self._cdi_ids = cdi_ids
        self._mig = MigInstances(partitioner, devices)
        #: Guards the two fields below; held only for in-memory operations.
        self._lock = threading.Lock()
        #: Dynamic MIG device name -> the MIG device (instance) the claim holding it has; set
        #: when the instance is created or adopted at start, dropped when it is destroyed.
        self._mig_devices: dict[str, GpuInfo] = {}
        #: Claims whose create was interrupted, or recorded at start with instances that could
        #: not be destroyed: a device of theirs without a recorded instance id may still own
        #: the instance at its placement.
        self._unsure: set[str] = set()
        #: Placement devices that instances no record owns block (computed at start).
        self._hidden: frozenset[str] = frozenset()

    def check_free(self, devices: Iterable[NodeDevice]) -> None:
        for device in devices:
            self._mig.check_free(device)

    def create(self, rec: ClaimRecord, record: Callable[[ClaimRecord], None]) -> ClaimRecord:
        started = rec
        for i, d in enumerate(started.devices):
            device = self._devices[d.device]
            if not device.dynamic_mig:
                continue
            try:
                mig = self._mig.create(device)
            except MigError:
                raise  # the partitioner left nothing behind
            except BaseException:
                # Interrupted: the instance may exist, without its id known here.
                with self._lock:
                    self._unsure.add(rec.uid)
                raise
            rec = self._with_instance(rec, d.device, mig)
            created = replace(rec.devices[i], cores=CORES_PER_GPU, memory=mig.memory_usable)
            rec = replace(rec, devices=(*rec.devices[:i], created, *rec.devices[i + 1 :]))
            record(rec)
            with self._lock:
                self._mig_devices[d.device] = mig
        return rec

    def destroy(self, rec: ClaimRecord) -> None:
        with self._lock:
            unsure = rec.uid in self._unsure
        for recorded in self._recorded_instances(rec):
            known = recorded.gpu_instance is not None or recorded.mig_uuid is not None
            if known or unsure:
                self._mig.destroy(recorded)
            with self._lock:
                self._mig_devices.pop(recorded.device.name, None)
        with self._lock:
            self._unsure.discard(rec.uid)

    def recover(self, claims: dict[str, ClaimRecord], rollback: set[str]) -> set[str]:
        recorded = {
            uid: found for uid, rec in claims.items() if (found := self._recorded_instances(rec))
        }
        reconciled = self._mig.reconcile(recorded, [u for u in recorded if u not in rollback])
        rollback |= reconciled.missing
        for (uid, device), mig in reconciled.owned.items():
            claims[uid] = self._with_instance(claims[uid], device, mig)
        with self._lock:
            self._mig_devices = {device: mig for (_, device), mig in reconciled.owned.items()}
            self._unsure = set(reconciled.pending)
        self._hidden = reconciled.hidden
        return reconciled.pending

    def from_spec(self, device: DeviceRecord) -> DeviceRecord:
        """A dynamic MIG device's spec names its MIG device's UUID, its record the physical GPU
        (and the MIG UUID, by which :meth:`recover` finds the instance)."""
        node_device = self._devices.get(device.device)
        if (
            node_device is None
            or not node_device.dynamic_mig
            or device.gpu_uuid == node_device.gpu.uuid
        ):
            return device
        return replace(device, gpu_uuid=node_device.gpu.uuid, mig_uuid=device.gpu_uuid)

    def hidden_devices(self) -> frozenset[str]:
        return self._hidden

    def device_for(self, parent_uuid: str, gpu_instance: int) -> str | None:
        with self._lock:
            for name, device in self._mig_devices.items():
                mig = device.mig
                if mig and mig.parent_uuid == parent_uuid and mig.gpu_instance == gpu_instance:
                    return name
        return None

    def _recorded_instances(self, rec: ClaimRecord) -> list[RecordedInstance]:
        """What ``rec`` says about the instances of its dynamic MIG devices."""
        out = []
        for d in rec.devices:
            device = self._devices.get(d.device)
            if device is not None and device.dynamic_mig:
                out.append(
                    RecordedInstance(
                        device=device,
                        gpu_instance=d.mig_gpu_instance,
                        compute_instance=d.mig_compute_instance,
                        mig_uuid=d.mig_uuid,
                        memory=d.memory,
                    )
                )
        return out

    def _with_instance(self, rec: ClaimRecord, device: str, mig: GpuInfo) -> ClaimRecord:
        """``rec`` with the device record of ``device`` naming MIG device ``mig`` (its ids,
        UUID and CDI IDs) and attached to it."""
        info = mig.mig
        assert info is not None
        return replace(
            rec,
            devices=tuple(
                replace(
                    d,
                    mig_gpu_instance=info.gpu_instance,
                    mig_compute_instance=info.compute_instance,
                    mig_uuid=mig.uuid,
                    cdi_device_ids=self._cdi_ids(d.cdi_name, mig),
                    gpu_info=mig,
                )
                if d.device == device
                else d
                for d in rec.devices
            ),
        )


def claim_instances(
    partitioner: MigPartitioner | None, devices: NodeDevices, cdi_ids: CdiIds
) -> ClaimInstances:
    """The instances seam for ``devices``: a partitioner is needed (ValueError without it)
    exactly when the table has dynamic MIG devices."""
    if not any(d.dynamic_mig for d in devices):
        return NoMigInstances()
    if partitioner is None:
        raise ValueError("the device table has dynamic MIG devices but no MIG partitioner")
    return DynamicMigInstances(partitioner, devices, cdi_ids)
