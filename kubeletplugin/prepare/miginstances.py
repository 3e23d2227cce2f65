"""The MIG instances of dynamic MIG devices: found, checked free, created, destroyed and
reconciled with the checkpoint's records at start (the NVML side of
:mod:`kubeletplugin.prepare.miglifecycle`).

Invariants: an instance is a record's only when its placement and profile are the device's and,
where the record has a MIG UUID, its UUID is that one (:meth:`MigInstances.find`), so an
instance someone else made at our placement is never taken for ours. At start
(:meth:`MigInstances.reconcile`) an instance a surviving record owns is never destroyed, every
instance of a rolled-back record is destroyed before the rollback is persisted (one that cannot
be stays ``PrepareStarted`` and is retried), and instances no record owns are foreign: never
destroyed, and the placements they block are hidden from the slices. The partitioner
serialises calls per GPU."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubeletplugin.devices.migpartition import MigError, MigPartitioner
from kubeletplugin.devices.migtables import placement_problem
from kubeletplugin.devices.table import NodeDevice, NodeDevices
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedInstance:
    """What a checkpoint record says about the instance of one dynamic MIG device.

    ``device`` is the placement device (its ``gpu`` the physical GPU); the ids and UUID are None
    while the record does not know them; ``memory`` is the recorded memory in bytes (used only
    to describe an instance that cannot be listed)."""

    device: NodeDevice
    gpu_instance: int | None = None
    compute_instance: int | None = None
    mig_uuid: str | None = None
    memory: int = 0

    @property
    def parent(self) -> GpuInfo:
        return self.device.gpu


@dataclass
class Reconciled:
    """What :meth:`MigInstances.reconcile` found and did."""

    #: (claim UID, device name) -> the MIG device the surviving record owns.
    owned: dict[tuple[str, str], GpuInfo] = field(default_factory=dict)
    #: Claims that were to stay but whose instance is missing or not theirs: roll them back.
    missing: set[str] = field(default_factory=set)
    #: Rolled-back claims whose instance could not be destroyed: keep them recorded (as
    #: ``PrepareStarted``) so that a later call destroys it.
    pending: set[str] = field(default_factory=set)
    #: Instances no record owns, never touched.
    foreign: list[GpuInfo] = field(default_factory=list)
    #: Placement devices the hardware rule refuses next to the foreign instances (or on a GPU
    #: that cannot be listed).
    hidden: frozenset[str] = frozenset()


def _owns(instance: GpuInfo, recorded: RecordedInstance) -> bool:
    """Whether ``instance`` sits at the recorded device's placement with its profile."""
    mig, device = instance.mig, recorded.device
    return (
        mig is not None
        and device.mig_profile is not None
        and mig.placement == device.placement
        and mig.profile_id == device.mig_profile.profile_id
    )


def _usable(instance: GpuInfo, recorded: RecordedInstance) -> bool:
    """Whether ``instance`` (owned) is the whole MIG device the record describes: it has its
    compute instance and UUID, and the recorded ones where recorded."""
    mig = instance.mig
    return (
        mig is not None
        and mig.compute_instance >= 0
        and bool(instance.uuid)
        and recorded.compute_instance in (None, mig.compute_instance)
        and recorded.mig_uuid in (None, instance.uuid)
    )


def _key(instance: GpuInfo) -> tuple[str, int]:
    mig = instance.mig
    assert mig is not None
    return mig.parent_uuid, mig.gpu_instance


def describe(instance: GpuInfo) -> str:
    """``GPU instance <gi> (<profile> at <start>:<size>) of GPU <parent>`` for logs/errors."""
    mig = instance.mig
    if mig is None:
        return instance.uuid
    where = f" at {mig.placement.start}:{mig.placement.size}" if mig.placement else ""
    return f"GPU instance {mig.gpu_instance} ({mig.profile}{where}) of GPU {mig.parent_uuid}"


class MigInstances:
    """Creates, finds and destroys the instances of dynamic MIG devices (see module doc).

    ``partitioner`` None: the node has no dynamic MIG devices; every call that would need one
    raises :class:`MigError`.
    """

    def __init__(self, partitioner: MigPartitioner | None, devices: NodeDevices) -> None:
        self._partitioner = partitioner
        self._devices = devices

    def _need(self) -> MigPartitioner:
        if self._partitioner is None:
            raise MigError("this node's plugin has no MIG partitioner (dynamic MIG is off)")
        return self._partitioner

    def check_free(self, device: NodeDevice) -> None:
        """MigError when an instance already overlaps placement device ``device``. Prepare asks
        before it records its intent, so that a record without an instance id is never written
        for a placement an instance holds (whose instance a restart would take for the
        record's)."""
        placement = device.placement
        if placement is None:
            raise MigError(f"device {device.name} is not a dynamic MIG device")
        for instance in self._need().instances(device.gpu):
            mig = instance.mig
            if mig is not None and (mig.placement is None or mig.placement.overlaps(placement)):
                raise MigError(
                    f"device {device.name} (memory slices {placement.start}:{placement.size}) "
                    f"overlaps {describe(instance)}"
                )

    def create(self, device: NodeDevice) -> GpuInfo:
        """Create the instance of placement device ``device``; its MIG device. MigError leaves
        nothing behind (the partitioner's invariant, and an instance created somewhere else
        than asked is destroyed again)."""
        profile, placement = device.mig_profile, device.placement
        if profile is None or placement is None:
            raise MigError(f"device {device.name} is not a dynamic MIG device")
        partitioner = self._need()
        created = partitioner.create(device.gpu, profile, placement)
        mig = created.mig
        if (
            mig is None
            or mig.parent_uuid != device.gpu.uuid
            or mig.placement != placement
            or mig.profile_id != profile.profile_id
            or mig.compute_instance < 0
        ):
            if mig is not None and mig.parent_uuid == device.gpu.uuid:
                partitioner.destroy(device.gpu, mig.gpu_instance)
            raise MigError(
                f"GPU {device.gpu.uuid}: creating {profile.name} at "
                f"{placement.start}:{placement.size} gave {describe(created)}, not that instance"
            )
        return created

    def find(self, instances: Iterable[GpuInfo], recorded: RecordedInstance) -> GpuInfo | None:
        """The instance among ``instances`` (the parent's) that ``recorded`` owns, or None: the
        one with the recorded GPU instance id, else MIG UUID, else (a record written before its
        create returned) the one at the recorded placement with its profile; it must match the
        placement, profile and any recorded UUID (one without a compute instance has no UUID
        yet: a destroy interrupted between its steps)."""
        listed = [i for i in instances if i.mig is not None]
        if recorded.gpu_instance is not None:
            found = next(
                (i for i in listed if i.mig and i.mig.gpu_instance == recorded.gpu_instance), None
            )
        elif recorded.mig_uuid is not None:
            found = next((i for i in listed if i.uuid == recorded.mig_uuid), None)
        else:
            found = next((i for i in listed if _owns(i, recorded)), None)
        if found is None or not _owns(found, recorded):
            return None
        if recorded.mig_uuid is not None and found.uuid not in (recorded.mig_uuid, ""):
            return None  # another instance at our placement (ours went): never ours
        return found

    def destroy(self, recorded: RecordedInstance) -> GpuInfo | None:
        """Destroy the instance ``recorded`` owns; the destroyed instance, or None when there
        was none. Raises MigError (the instance may still exist)."""
        partitioner = self._need()
        found = self.find(partitioner.instances(recorded.parent), recorded)
        if found is None or found.mig is None:
            return None
        partitioner.destroy(recorded.parent, found.mig.gpu_instance)
        log.info("destroyed %s (device %s)", describe(found), recorded.device.name)
        return found

    def reconcile(
        self, recorded: Mapping[str, Sequence[RecordedInstance]], keep: Collection[str]
    ) -> Reconciled:
        """Match the instances on the GPUs with the records (claim UID -> its dynamic MIG
        devices), for the claims in ``keep`` (the others are rolled back); destroy what the
        rolled-back claims own. See the module invariants."""
        out = Reconciled()
        parents = {d.gpu.uuid: d.gpu for d in self._devices if d.dynamic_mig}
        if not parents:
            return out
        partitioner = self._need()
        listing: dict[str, list[GpuInfo]] = {}
        for uuid, parent in parents.items():
            try:
                listing[uuid] = list(partitioner.instances(parent))
            except MigError as exc:
                log.error(
                    "cannot list the MIG instances of GPU %s (%s): keeping its claims as "
                    "recorded and publishing none of its placements",
                    uuid,
                    exc,
                )
        taken: set[tuple[str, int]] = set()
        for uid in sorted(set(keep) & set(recorded)):
            mine: dict[tuple[str, str], GpuInfo] = {}
            for r in recorded[uid]:
                instances = listing.get(r.parent.uuid)
                found = _described(r) if instances is None else self.find(instances, r)
                if found is None or not _usable(found, r) or _key(found) in taken:
                    log.warning(
                        "the MIG instance of device %s of claim %s is gone or not its own; "
                        "rolling the claim back",
                        r.device.name,
                        uid,
                    )
                    out.missing.add(uid)
                    break
                mine[(uid, r.device.name)] = found
            else:
                out.owned.update(mine)
                taken.update(_key(i) for i in mine.values())
        claimed = set(taken)
        for uid in sorted(set(recorded) - (set(keep) - out.missing)):
            for r in recorded[uid]:
                instances = listing.get(r.parent.uuid)
                if instances is None:
                    out.pending.add(uid)
                    continue
                found = self.find(instances, r)
                if found is None or found.mig is None or _key(found) in claimed:
                    continue
                try:
                    partitioner.destroy(r.parent, found.mig.gpu_instance)
                except MigError as exc:
                    log.error(
                        "cannot destroy %s of rolled-back claim %s (%s); it stays recorded and "
                        "is destroyed by its claim's next call or the next start",
                        describe(found),
                        uid,
                        exc,
                    )
                    out.pending.add(uid)
                    claimed.add(_key(found))
                    continue
                log.info("destroyed %s of rolled-back claim %s", describe(found), uid)
                instances.remove(found)
        hidden: set[str] = set()
        for uuid, parent in parents.items():
            devices = [d for d in self._devices.of_gpu(parent) if d.dynamic_mig]
            instances = listing.get(uuid)
            if instances is None:
                hidden.update(d.name for d in devices)
                continue
            foreign: list[tuple[int, MigPlacement]] = []
            unknown = False
            for instance in instances:
                if instance.mig is None or _key(instance) in claimed:
                    continue
                out.foreign.append(instance)
                log.info(
                    "%s was not created for a claim of this node; leaving it alone and not "
                    "publishing the placements it blocks",
                    describe(instance),
                )
                if instance.mig.placement is None or instance.mig.profile_id is None:
                    unknown = True
                else:
                    foreign.append((instance.mig.profile_id, instance.mig.placement))
            # A placement is hidden when the hardware rule refuses it next to the foreign
            # instances: it overlaps one, or its profile's instance limit is used up by them
            # (a foreign 1g.10gb+me hides every other +me placement). The counters then fit
            # exactly what the GPU can still create around the foreign instances.
            hidden.update(
                d.name
                for d in devices
                if unknown
                or (
                    d.mig_profile is not None
                    and d.placement is not None
                    and placement_problem(
                        parent.mig_profiles, foreign, d.mig_profile.profile_id, d.placement
                    )
                    is not None
                )
            )
        out.hidden = frozenset(hidden)
        return out


def _described(recorded: RecordedInstance) -> GpuInfo | None:
    """The MIG device a record describes, for a GPU whose instances cannot be listed (None when
    the record does not name the whole instance)."""
    profile, placement = recorded.device.mig_profile, recorded.device.placement
    if (
        profile is None
        or recorded.gpu_instance is None
        or recorded.compute_instance is None
        or not recorded.mig_uuid
        or recorded.memory <= 0
    ):
        return None
    parent = recorded.parent
    return parent.mig_device(
        recorded.mig_uuid,
        recorded.memory,
        MigInfo(
            parent_uuid=parent.uuid,
            gpu_instance=recorded.gpu_instance,
            compute_instance=recorded.compute_instance,
            profile=profile.name,
            multiprocessors=max(1, profile.multiprocessors),
            gpu_slices=profile.slice_count,
            compute_slices=profile.slice_count,
            placement=placement,
            profile_id=profile.profile_id,
        ),
    )
