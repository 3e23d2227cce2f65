"""The node's prepared claims (a ClaimPreparer): prepare, unprepare, the checkpoint, recovery.

Invariants:

- A prepare is two durable steps around the work: ``PrepareStarted``, the work (enforcement,
  dynamic MIG instances through :class:`~kubeletplugin.prepare.miglifecycle.ClaimInstances`, the
  CDI spec, written atomically but not durably), ``PrepareCompleted``. The checkpoint is the
  record; spec files are derived from it: ``start`` rolls back every ``PrepareStarted`` record,
  rewrites the spec of every completed one that is missing or differs (a power loss may take a
  spec), and removes spec files without a record. A failure undoes only its claim; a record
  stays while its MIG instance cannot be destroyed (kubelet retries).
- Prepare is idempotent (a completed claim with its spec file gets its recorded answer, no side
  effect); unprepare of an unknown claim succeeds.
- Claims are fetched before any lock; each claim holds its own lock for its operation, the
  node-wide lock guards only in-memory state, and NVML is never called under it. Checkpoint
  writes are group-committed (one ``fdatasync`` covers every change made before it began).
- A GPU prepared exclusively for one claim is never prepared for another at the same time (only
  shares, partitions, non-overlapping dynamic MIG placements and adminAccess share a GPU)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from api.gpuconfig import STRATEGY_EXCLUSIVE
from api.names import CORES_PER_GPU
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.devices.migpartition import MigError, MigPartitioner
from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.fsutil import remove_durably
from kubeletplugin.kubelet.preparer import (
    ClaimRef,
    PrepareOutcome,
    UnprepareOutcome,
    claim_ref_problem,
)
from kubeletplugin.model import MigPlacement
from kubeletplugin.prepare import cdi as cdimod
from kubeletplugin.prepare.cdi import CdiSpecWriter, SpecDevice
from kubeletplugin.prepare.checkpoint import (
    LOAD_CORRUPT,
    LOAD_REBOOTED,
    STATE_COMPLETED,
    STATE_STARTED,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
)
from kubeletplugin.prepare.claims import (
    REASON_CONFLICT,
    REASON_ENFORCEMENT,
    REASON_INTERNAL,
    REASON_IO,
    REASON_MIG,
    REASON_NOT_FOUND,
    AllocationResult,
    ClaimAllocation,
    ClaimError,
    ClaimGetter,
    extract_allocation,
)
from kubeletplugin.prepare.metrics import StateMetrics
from kubeletplugin.prepare.miglifecycle import claim_instances
from kubeletplugin.prepare.shares import device_record
from kubeletplugin.sharing.enforcement import (
    Applied,
    Decisions,
    NoEnforcement,
    ShareEnforcer,
    ShareError,
)
from sharegpu.kube.telemetry import Telemetry

log = logging.getLogger(__name__)


class KeyedLocks:
    """One lock per key, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, list[int]]] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._mu:
            lock, users = self._locks.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        lock.acquire()
        try:
            yield
        finally:
            lock.release()
            with self._mu:
                users[0] -= 1
                if users[0] == 0:
                    del self._locks[key]


def _claim_label(namespace: str, name: str, uid: str) -> str:
    return f"ResourceClaim {namespace}/{name} (UID {uid})"


def _decided(rec: ClaimRecord, decisions: Decisions) -> ClaimRecord:
    """``rec`` with the enforcer's decision for each of its devices (``decisions[i]`` is
    ``devices[i]``'s); ShareError when the enforcer answered for another number of devices."""
    if len(decisions) != len(rec.devices):
        raise ShareError(
            f"share enforcement decided for {len(decisions)} devices, expected {len(rec.devices)}"
        )
    return replace(
        rec,
        devices=tuple(
            replace(d, enforcement=e) for d, e in zip(rec.devices, decisions, strict=True)
        ),
    )


def _within(d: DeviceRecord, cores: int, memory: int) -> DeviceRecord:
    """``d`` entitled to ``cores`` and ``memory``, its enforcement limits at most those."""
    enforced = d.enforcement
    if enforced is not None:
        enforced = replace(
            enforced,
            limit_cores=min(enforced.limit_cores, cores),
            limit_memory=min(enforced.limit_memory, memory),
        )
    return replace(d, cores=cores, memory=memory, enforcement=enforced)


def _conflict(
    new: DeviceRecord,
    held: DeviceRecord,
    new_placement: MigPlacement | None,
    held_placement: MigPlacement | None,
) -> bool:
    """Whether ``new`` cannot be prepared while another claim holds ``held`` (the placements:
    those of dynamic MIG devices, None for other devices)."""
    if new.admin_access or held.admin_access or new.gpu_uuid != held.gpu_uuid:
        return False
    if new_placement is not None and held_placement is not None:
        # Two MIG instances of one GPU coexist unless they share a memory slice.
        return new_placement.overlaps(held_placement)
    new_whole = new.share_id is None and new.partition is None
    held_whole = held.share_id is None and held.partition is None
    if new_whole or held_whole:
        return True
    # Two partitions of one GPU coexist; the same partition device twice does not.
    return new.partition is not None and new.device == held.device


class DeviceState:
    """Prepares and unprepares claims for kubelet; implements ``ClaimPreparer``.

    Call :meth:`start` once before serving.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: NodeDevices,
        claims: ClaimGetter,
        cdi: CdiSpecWriter,
        checkpoint: Checkpoint,
        enforcer: ShareEnforcer | None = None,
        telemetry: Telemetry | None = None,
        partitioner: MigPartitioner | None = None,
    ) -> None:
        """``partitioner`` creates and destroys the MIG instances of dynamic MIG devices; it is
        needed (ValueError without it) exactly when ``devices`` has such devices."""
        #: The MIG instances of the claims' dynamic MIG devices.
        self._instances = claim_instances(partitioner, devices, cdi.cdi_ids)
        self.driver_name = driver_name
        self.node_name = node_name
        #: The node's device table (shared with the publisher and health; never changed here).
        self._devices = devices
        #: Every GPU a device of the table stands on, by UUID: physical GPUs and MIG devices
        #: (which are GPUs of their own to prepare and enforcement).
        self._gpus_by_uuid = {g.uuid: g for g in devices.gpus} | {
            nd.gpu.uuid: nd.gpu for nd in devices
        }
        self._getter = claims
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._enforcer: ShareEnforcer = enforcer or NoEnforcement()
        self._claim_locks = KeyedLocks()
        #: Guards ``_claims`` and the commit counters; held only for in-memory operations.
        self._mu = threading.Lock()
        self._claims: dict[str, ClaimRecord] = {}
        #: ``_claims`` by GPU UUID (the conflict check's index); changed with ``_claims`` only
        #: through :meth:`_put` and :meth:`_drop`.
        self._by_gpu: dict[str, dict[str, ClaimRecord]] = {}
        #: Serializes checkpoint writes (group commit).
        self._write_lock = threading.Lock()
        self._changes = 0
        self._written = 0
        self._started = False
        self._metrics = StateMetrics(telemetry, self._count_prepared)
        #: Writes spec files while the calling thread writes the checkpoint.
        self._io = ThreadPoolExecutor(max_workers=32, thread_name_prefix="cdi-write")

    @property
    def devices(self) -> NodeDevices:
        """The node's device table that allocation results are resolved through."""
        return self._devices

    # --- Startup ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the checkpoint, recover from crashes, reboots and corruption, and persist the
        consistent state. Never raises for a bad checkpoint."""
        self._cdi.ensure_dir()
        loaded = self._checkpoint.load()
        recorded = dict(loaded.claims)
        if loaded.status == LOAD_REBOOTED:
            for uid in loaded.stale_claim_uids:
                self._cdi.remove(uid)  # touches nothing for a key that is no claim UID
        elif loaded.status == LOAD_CORRUPT:
            recorded = self._rebuild_from_specs()
            log.warning(
                "rebuilt %d prepared claims from the CDI spec files after a corrupt checkpoint",
                len(recorded),
            )
        bad_claims = dict(loaded.bad_claims)
        claims: dict[str, ClaimRecord] = {}
        for uid, rec in recorded.items():
            try:
                claims[uid] = self._revalidated(rec)
            except CheckpointError as exc:
                bad_claims[uid] = str(exc)
        rollback = set(bad_claims)
        for uid, problem in bad_claims.items():
            log.warning(
                "checkpoint entry of claim %s cannot be decoded (%s); rolling it back", uid, problem
            )
        for uid, rec in claims.items():
            if rec.state != STATE_COMPLETED:
                log.info(
                    "claim %s/%s (UID %s) was interrupted during prepare; rolling it back",
                    rec.namespace,
                    rec.name,
                    uid,
                )
                rollback.add(uid)
        self._check_against_allocations(claims, rollback)
        pending = self._instances.recover(claims, rollback)
        # Only the claims that stay prepared: resuming enforcement for a claim about to be
        # rolled back would start daemons just to stop them. Whatever a rolled-back claim left
        # running is a leftover the enforcer cleans up when no remaining claim needs it.
        restored = self._enforcer.restore(
            loaded.sharing,
            {uid: rec.devices for uid, rec in claims.items() if uid not in rollback},
            node_gpus=tuple(self._gpus_by_uuid),
        )
        for uid, applied in sorted(restored.items()):
            try:
                claims[uid] = _decided(claims[uid], applied.decisions)
                self._restore_spec(claims[uid], applied)
            except (KeyError, ShareError, OSError) as exc:
                log.error("cannot restore claim %s (%s); rolling it back", uid, exc)
                rollback.add(uid)
        for uid in sorted(rollback):
            self._cdi.remove(uid)
            self._enforcer.release(uid)
            if uid in pending:
                # Its MIG instance could not be destroyed: keep it recorded for a retry.
                claims[uid] = replace(claims[uid], state=STATE_STARTED)
            else:
                claims.pop(uid, None)
        for uid in self._cdi.list_claim_uids():
            if uid not in claims:
                log.info("removing CDI spec of claim %s, which is not prepared", uid)
                self._cdi.remove(uid)
        with self._mu:
            self._claims = {}
            self._by_gpu = {}
            for rec in claims.values():
                self._put(rec)
            change = self._changed()
        self._persist(change)
        self._started = True
        log.info(
            "device state ready: %d prepared claims (checkpoint %s)", len(claims), loaded.status
        )

    def _restore_spec(self, rec: ClaimRecord, applied: Applied) -> None:
        """Rewrite the spec file of restored claim ``rec`` if it is not what prepare wrote for
        it (lost or truncated in a power loss, or gone in a crash before it was written: it is
        written without fsync). ShareError when the enforcer answered for another number of
        devices; OSError when it cannot be written."""
        if len(applied.device_edits) != len(rec.devices):
            raise ShareError(
                f"share enforcement restored edits for {len(applied.device_edits)} devices, "
                f"expected {len(rec.devices)}"
            )
        if self._cdi.restore(rec.uid, self._spec_devices(rec, applied)):
            log.warning(
                "CDI spec of prepared claim %s/%s (UID %s) was missing or differed; "
                "rewrote it from the checkpoint",
                rec.namespace,
                rec.name,
                rec.uid,
            )

    @staticmethod
    def _spec_devices(rec: ClaimRecord, applied: Applied) -> list[SpecDevice]:
        """The devices of ``rec``'s spec file, each with the enforcer's edits for it."""
        return [
            SpecDevice(
                record=d,
                claim_namespace=rec.namespace,
                claim_name=rec.name,
                claim_uid=rec.uid,
                extra_edits=edits,
            )
            for d, edits in zip(rec.devices, applied.device_edits, strict=True)
        ]

    def _check_against_allocations(
        self, claims: dict[str, ClaimRecord], rollback: set[str]
    ) -> None:
        """Hold each restored claim with shares to what its allocation grants, where the API
        server answers: a recorded share larger or smaller than the allocation's is set to the
        allocation's (an enforcement limit above it lowered to it), with an error logged; a
        recorded device the allocation does not have rolls the claim back. A claim the API
        server no longer has (or that was replaced, or lost its allocation) is left as recorded:
        kubelet unprepares it. After the first answer that is not about the claim itself (the
        API server is down) the remaining records are kept as recorded, with one warning, so a
        start never waits on one timeout per claim."""
        for uid in sorted(claims):
            rec = claims[uid]
            if uid in rollback or rec.state != STATE_COMPLETED:
                continue
            if not any(d.is_share for d in rec.devices):
                continue  # a whole GPU or MIG device: the device table already bounds it
            ref = ClaimRef(namespace=rec.namespace, uid=uid, name=rec.name)
            fetched = self._fetch(ref)
            if isinstance(fetched, ClaimError):
                if fetched.reason == REASON_NOT_FOUND:
                    continue
                log.warning(
                    "cannot check the restored shares against their allocations (%s); the "
                    "remaining claims keep their recorded shares",
                    fetched,
                )
                return
            try:
                allocation = extract_allocation(
                    fetched, ref, self.driver_name, self.node_name, self._devices
                )
            except ClaimError:
                continue
            granted = {(d.device, d.share_id): d for d in self._device_records(allocation)}
            label = _claim_label(rec.namespace, rec.name, uid)
            devices = []
            for d in rec.devices:
                want = granted.get((d.device, d.share_id))
                if want is None:
                    log.error(
                        "checkpoint of %s records device %s (share %s), which its allocation "
                        "does not have; rolling the claim back",
                        label,
                        d.device,
                        d.share_id,
                    )
                    rollback.add(uid)
                    break
                if (d.cores, d.memory) != (want.cores, want.memory):
                    log.error(
                        "checkpoint of %s records %d cores and %d bytes for device %s, its "
                        "allocation grants %d cores and %d bytes; restoring the allocation's",
                        label,
                        d.cores,
                        d.memory,
                        d.device,
                        want.cores,
                        want.memory,
                    )
                    d = _within(d, want.cores, want.memory)
                devices.append(d)
            else:
                claims[uid] = replace(rec, devices=tuple(devices))

    def hidden_devices(self) -> frozenset[str]:
        """Dynamic MIG devices not to publish: the hardware rule refuses their placement next to
        the instances no prepared claim owns (an administrator's: the placement overlaps one,
        or the profile's instance limit is used up), found at start (empty before)."""
        return self._instances.hidden_devices()

    def mig_device_for(self, parent_uuid: str, gpu_instance: int) -> str | None:
        """The dynamic MIG device whose claim's instance is GPU instance ``gpu_instance`` of
        GPU ``parent_uuid``, or None (for health events)."""
        return self._instances.device_for(parent_uuid, gpu_instance)

    def _revalidated(self, rec: ClaimRecord) -> ClaimRecord:
        """``rec`` (read from the checkpoint or a spec file) checked against the node's device
        table and the fixed vocabularies, with every derived field derived again: the CDI names
        and the IDs answered to kubelet are rebuilt from the claim UID, device and share ID,
        never replayed from the file, and each record gets its device's GPU attached (a dynamic
        MIG device its MIG device later, once its instance is found). CheckpointError names the
        first field that does not fit."""
        where = f"claims[{rec.uid}]"
        problem = claim_ref_problem(ClaimRef(namespace=rec.namespace, uid=rec.uid, name=rec.name))
        if problem is not None:
            raise CheckpointError(f"{where}: {problem}")
        devices = []
        for i, d in enumerate(rec.devices):
            at = f"{where}.devices[{i}]"
            node_device = self._devices.get(d.device)
            if node_device is None:
                raise CheckpointError(f"{at}.device {d.device!r} is not a device of this node")
            gpu = node_device.gpu
            if d.gpu_uuid != gpu.uuid:
                raise CheckpointError(
                    f"{at}.gpuUUID {d.gpu_uuid!r} is not the GPU of device {d.device} ({gpu.uuid})"
                )
            if d.pool != self.node_name:
                raise CheckpointError(f"{at}.pool {d.pool!r} is not this node's pool")
            if d.partition != node_device.partition:
                raise CheckpointError(
                    f"{at}.partition {d.partition!r} is not device {d.device}'s "
                    f"({node_device.partition!r})"
                )
            if node_device.dynamic_mig and d.admin_access:
                raise CheckpointError(
                    f"{at}.adminAccess: dynamic MIG device {d.device} is never prepared with "
                    "adminAccess"
                )
            if not node_device.dynamic_mig and d.mig_gpu_instance is not None:
                raise CheckpointError(
                    f"{at}.migGpuInstance is set, but {d.device} is not a dynamic MIG device"
                )
            if not node_device.dynamic_mig and d.mig_uuid is not None:
                raise CheckpointError(
                    f"{at}.migUUID is set, but {d.device} is not a dynamic MIG device"
                )
            if not 0 <= d.cores <= CORES_PER_GPU:
                raise CheckpointError(f"{at}.cores {d.cores} is outside 0..{CORES_PER_GPU}")
            if not 0 <= d.memory <= gpu.memory_total:
                raise CheckpointError(f"{at}.memory {d.memory} is outside 0..{gpu.memory_total}")
            if d.enforcement and d.enforcement.limit_memory > gpu.memory_total:
                raise CheckpointError(
                    f"{at}.enforcement.limitMemory {d.enforcement.limit_memory} is above the "
                    f"GPU's {gpu.memory_total} bytes"
                )
            mig = node_device.dynamic_mig or gpu.mig is not None
            if mig and d.enforcement and d.enforcement.strategy != STRATEGY_EXCLUSIVE:
                raise CheckpointError(
                    f"{at}.enforcement.strategy {d.enforcement.strategy}: MIG device {d.device} "
                    f"is enforced only as {STRATEGY_EXCLUSIVE}"
                )
            try:
                name = cdimod.cdi_device_name(rec.uid, d.device, d.share_id)
            except ValueError as exc:
                raise CheckpointError(f"{at}.shareID: {exc}") from None
            devices.append(
                replace(d, cdi_name=name, cdi_device_ids=self._cdi.cdi_ids(name, gpu), gpu_info=gpu)
            )
        return replace(rec, devices=tuple(devices))

    def _rebuild_from_specs(self) -> dict[str, ClaimRecord]:
        """The claims recorded in the spec files, as read (``start`` checks them and derives
        their CDI names and IDs again, as for checkpoint records)."""
        specs, problems = self._cdi.read_claim_specs(self.node_name)
        for path, problem in problems:
            log.warning("cannot recover claim from %s (%s); removing it", path, problem)
            remove_durably(path)
        return {
            spec.claim_uid: ClaimRecord(
                uid=spec.claim_uid,
                namespace=spec.namespace,
                name=spec.name,
                state=STATE_COMPLETED,
                devices=tuple(self._instances.from_spec(d) for d in spec.devices),
            )
            for spec in specs
        }

    # --- Checkpoint ------------------------------------------------------------------------

    def _put(self, rec: ClaimRecord) -> None:
        """Caller holds ``_mu``: record ``rec`` (replacing the claim's previous record)."""
        self._drop(rec.uid)
        self._claims[rec.uid] = rec
        for gpu in {d.gpu_uuid for d in rec.devices}:
            self._by_gpu.setdefault(gpu, {})[rec.uid] = rec

    def _drop(self, uid: str) -> None:
        """Caller holds ``_mu``: forget ``uid``'s record, if any."""
        rec = self._claims.pop(uid, None)
        if rec is None:
            return
        for gpu in {d.gpu_uuid for d in rec.devices}:
            holders = self._by_gpu[gpu]
            del holders[rec.uid]
            if not holders:
                del self._by_gpu[gpu]

    def _changed(self) -> int:
        """Caller holds ``_mu`` and has just changed ``_claims``: number that change."""
        self._changes += 1
        return self._changes

    def _persist(self, target: int | None = None) -> None:
        """Make change ``target`` (default: every change so far) durable. Group commit: each
        write covers every change made before its snapshot, so a caller whose change a
        concurrent write already covered returns without writing."""
        if target is None:
            with self._mu:
                target = self._changed()
        with self._write_lock:
            if self._written >= target:
                return
            with self._mu:
                snapshot = dict(self._claims)
                covered = self._changes
            self._checkpoint.write(snapshot, self._enforcer.export_state())
            self._written = covered

    def _count_prepared(self) -> int:
        with self._mu:
            return sum(1 for rec in self._claims.values() if rec.state == STATE_COMPLETED)

    def close(self) -> None:
        """Stop the writer threads and close the checkpoint (after the gRPC server stopped
        calling in)."""
        self._io.shutdown(wait=True)
        with self._write_lock:
            self._checkpoint.close()

    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """A snapshot of the recorded claims (both states)."""
        with self._mu:
            return dict(self._claims)

    # --- Prepare ---------------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        if not self._started:
            raise RuntimeError("DeviceState.start() must be called before prepare")
        outcomes: dict[str, PrepareOutcome] = {}
        fetched: dict[str, dict[str, Any] | ClaimError] = {}
        for ref in claims:
            # Claims are fetched before any lock; a completed claim needs no fetch.
            if ref.uid not in fetched and self._completed_answer(ref.uid) is None:
                fetched[ref.uid] = self._fetch(ref)
        for ref in claims:
            if ref.uid in outcomes:
                continue
            with self._metrics.prepare(ref) as done:
                try:
                    outcomes[ref.uid] = self._prepare_claim(ref, fetched.get(ref.uid))
                    done(None)
                except ClaimError as exc:
                    outcomes[ref.uid] = PrepareOutcome(error=str(exc))
                    done(exc.reason)
                except Exception as exc:
                    log.exception("unexpected error preparing claim %s/%s", ref.namespace, ref.name)
                    label = _claim_label(ref.namespace, ref.name, ref.uid)
                    outcomes[ref.uid] = PrepareOutcome(
                        error=f"internal error preparing {label}: {exc}"
                    )
                    done(REASON_INTERNAL)
        return outcomes

    def _completed_answer(self, uid: str) -> PrepareOutcome | None:
        with self._mu:
            rec = self._claims.get(uid)
        if rec is None or rec.state != STATE_COMPLETED:
            return None
        if not self._cdi.path_for(uid).exists():
            return None
        return self._outcome(rec)

    @staticmethod
    def _outcome(rec: ClaimRecord) -> PrepareOutcome:
        """The answer to kubelet: the claim's device records themselves."""
        return PrepareOutcome(devices=rec.devices)

    def _prepare_claim(
        self, ref: ClaimRef, fetched: dict[str, Any] | ClaimError | None
    ) -> PrepareOutcome:
        with self._claim_locks.hold(ref.uid):
            answer = self._completed_answer(ref.uid)
            if answer is not None:
                return answer
            with self._mu:
                stale = self._claims.get(ref.uid)
            if stale is not None:
                # Recorded but unusable (spec file gone): undo and prepare again.
                try:
                    self._undo(stale.uid)
                except MigError as exc:
                    label = _claim_label(ref.namespace, ref.name, ref.uid)
                    raise ClaimError(
                        f"{label}: cannot destroy the MIG instance of its earlier prepare: {exc}",
                        REASON_MIG,
                    ) from exc
            if fetched is None:
                fetched = self._fetch(ref)
            if isinstance(fetched, ClaimError):
                raise fetched
            allocation = extract_allocation(
                fetched, ref, self.driver_name, self.node_name, self._devices
            )
            return self._prepare_allocation(allocation, self._device_records(allocation))

    def _fetch(self, ref: ClaimRef) -> dict[str, Any] | ClaimError:
        """The claim, or the error that fails only this claim (never the other claims of the
        same call, whatever the getter raises)."""
        try:
            return self._getter.get_claim(ref.namespace, ref.name)
        except ClaimError as exc:
            return exc
        except Exception as exc:
            log.exception("unexpected error getting claim %s/%s", ref.namespace, ref.name)
            label = _claim_label(ref.namespace, ref.name, ref.uid)
            return ClaimError(f"cannot get {label}: {type(exc).__name__}: {exc}", REASON_INTERNAL)

    def _device_records(self, allocation: ClaimAllocation) -> tuple[DeviceRecord, ...]:
        """One record per distinct (device, shareID) of the claim, in result order: where each
        record of a prepared device is made."""
        groups: dict[tuple[str, str | None], list[AllocationResult]] = {}
        for result in allocation.results:
            groups.setdefault((result.device, result.share_id), []).append(result)
        ref = allocation.ref
        label = _claim_label(ref.namespace, ref.name, ref.uid)
        records = []
        for (device, share_id), results in groups.items():
            node_device = self._devices[device]
            name = cdimod.cdi_device_name(ref.uid, device, share_id)
            records.append(
                device_record(
                    results,
                    node_device,
                    self.driver_name,
                    label,
                    cdi_name=name,
                    cdi_device_ids=self._cdi.cdi_ids(name, node_device.gpu),
                )
            )
        return tuple(records)

    def _prepare_allocation(
        self, allocation: ClaimAllocation, records: tuple[DeviceRecord, ...]
    ) -> PrepareOutcome:
        ref = allocation.ref
        label = _claim_label(ref.namespace, ref.name, ref.uid)
        started = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=STATE_STARTED,
            devices=records,
        )
        dynamic = [self._devices[d.device] for d in records if self._devices[d.device].dynamic_mig]
        if dynamic:
            # The claims of this node first (the clearer message), then the GPUs' instances.
            with self._mu:
                conflict = self._find_conflict(started)
            if conflict is not None:
                raise ClaimError(f"{label}: {conflict}", REASON_CONFLICT)
            try:
                self._instances.check_free(dynamic)
            except MigError as exc:
                raise ClaimError(f"{label}: {exc}", REASON_MIG) from exc
        with self._mu:
            conflict = self._find_conflict(started)
            if conflict is not None:
                raise ClaimError(f"{label}: {conflict}", REASON_CONFLICT)
            self._put(started)
            change = self._changed()
        try:
            self._persist(change)
            started = self._instances.create(started, self._record_instance)
            applied = self._enforcer.apply(ref.uid, started.devices, allocation.configs)
            if len(applied.device_edits) != len(started.devices):
                raise ShareError(
                    f"share enforcement returned edits for {len(applied.device_edits)} "
                    f"devices, expected {len(started.devices)}"
                )
            completed = replace(_decided(started, applied.decisions), state=STATE_COMPLETED)
            # The spec file (atomic, not durable) is written while the durable PrepareCompleted
            # record is: a crash before the record is durable rolls the claim back at the next
            # start, and a spec missing after it is rewritten from the record then.
            with self._mu:
                self._put(completed)
                change = self._changed()
            spec_written = self._io.submit(
                self._cdi.write, ref.uid, self._spec_devices(completed, applied)
            )
            try:
                self._persist(change)
            finally:
                spec_written.result()
        except (ShareError, OSError, MigError) as exc:
            log.warning("preparing %s failed: %s", label, exc)
            self._undo_quietly(ref.uid)
            reason = (
                REASON_ENFORCEMENT
                if isinstance(exc, ShareError)
                else REASON_MIG
                if isinstance(exc, MigError)
                else REASON_IO
            )
            raise ClaimError(f"{label}: {exc}", reason) from exc
        except BaseException:
            self._undo_quietly(ref.uid)
            raise
        log.info("prepared %s: %s", label, ", ".join(d.cdi_name for d in completed.devices))
        return self._outcome(completed)

    def _record_instance(self, rec: ClaimRecord) -> None:
        """A MIG instance of ``rec`` was just created: record it in memory, so an undo destroys
        it by its id."""
        with self._mu:
            self._put(rec)

    def _placement(self, device: str) -> MigPlacement | None:
        """The placement of dynamic MIG device ``device``; None for other devices."""
        node_device = self._devices.get(device)
        return node_device.placement if node_device is not None else None

    def _find_conflict(self, new: ClaimRecord) -> str | None:
        """Caller holds ``_mu``. Why ``new`` cannot be prepared now, or None. Only claims that
        hold one of ``new``'s GPUs can conflict with it; two dynamic MIG devices of ``new``
        itself conflict when their placements overlap."""
        for i, a in enumerate(new.devices):
            pa = self._placement(a.device)
            for b in new.devices[i + 1 :]:
                pb = self._placement(b.device)
                if (
                    pa is not None
                    and pb is not None
                    and a.device != b.device
                    and a.gpu_uuid == b.gpu_uuid
                    and pa.overlaps(pb)
                ):
                    return (
                        f"MIG devices {a.device} and {b.device} of GPU {a.gpu_uuid} overlap "
                        "(they share a memory slice); refusing to prepare both"
                    )
            for uid, other in self._by_gpu.get(a.gpu_uuid, {}).items():
                if uid == new.uid:
                    continue
                for b in other.devices:
                    pb = self._placement(b.device)
                    if not _conflict(a, b, pa, pb):
                        continue
                    if pa is not None and pb is not None:
                        return (
                            f"GPU {a.gpu_uuid}: MIG device {a.device} overlaps {b.device}, "
                            f"already prepared for ResourceClaim {other.namespace}/{other.name} "
                            f"(UID {uid}); refusing to hand the memory slices out twice"
                        )
                    how = (
                        "exclusively"
                        if b.share_id is None and b.partition is None
                        else (f"as {b.device}" if b.partition else "as a share")
                    )
                    return (
                        f"GPU {a.gpu_uuid} ({a.device}) is already prepared {how} for "
                        f"ResourceClaim {other.namespace}/{other.name} (UID {uid}); "
                        "refusing to hand it out twice"
                    )
        return self._over_share_limit(new)

    def _over_share_limit(self, new: ClaimRecord) -> str | None:
        """Caller holds ``_mu``. Why ``new``'s shares would put a GPU above its share limit
        (the published slices already keep the scheduler within it: this holds for
        allocations made against older slices), or None."""
        for uuid in sorted({d.gpu_uuid for d in new.devices if d.is_share}):
            node_gpu = next((g for g in self._devices.gpus if g.uuid == uuid), None)
            if node_gpu is None:
                continue
            held = sum(
                1
                for uid, other in self._by_gpu.get(uuid, {}).items()
                if uid != new.uid
                for d in other.devices
                if d.is_share and d.gpu_uuid == uuid
            )
            adding = sum(1 for d in new.devices if d.is_share and d.gpu_uuid == uuid)
            limit = self._devices.share_limit(node_gpu)
            if held + adding > limit:
                return (
                    f"GPU {uuid} already holds {held} shares and its limit is {limit} (MPS's "
                    "clients per GPU, or --max-shares-per-gpu); refusing another"
                )
        return None

    def _undo(self, uid: str) -> None:
        """Roll back whatever a prepare of ``uid`` did, then drop its record durably. MigError:
        an instance could not be destroyed, and the record stays."""
        self._cdi.remove(uid)
        self._enforcer.release(uid)
        self._destroy_instances(uid)
        with self._mu:
            self._drop(uid)
            change = self._changed()
        self._persist(change)

    def _destroy_instances(self, uid: str) -> None:
        """Destroy the MIG instances ``uid``'s record owns (the record stays; MigError for the
        first that cannot be destroyed)."""
        with self._mu:
            rec = self._claims.get(uid)
        if rec is not None:
            self._instances.destroy(rec)

    def _undo_quietly(self, uid: str) -> None:
        try:
            self._undo(uid)
            return
        except MigError as exc:
            self._keep_for_retry(uid, exc)
            return
        except (ShareError, OSError) as exc:
            # Expected (a full disk, a command that failed): the next start or call retries.
            log.error("rolling back the failed prepare of claim %s failed: %s", uid, exc)
        except Exception:
            log.exception("rolling back the failed prepare of claim %s failed", uid)
        try:
            self._destroy_instances(uid)
        except MigError as exc:
            self._keep_for_retry(uid, exc)
            return
        self._forget(uid)

    def _keep_for_retry(self, uid: str, exc: MigError) -> None:
        """A failed prepare whose MIG instance could not be destroyed: its record (with the
        instance ids known) stays, so the claim's next call or the next start destroys it."""
        log.error(
            "cannot destroy the MIG instance of the failed prepare of claim %s (%s); its next "
            "call or the next start retries",
            uid,
            exc,
        )
        try:
            self._persist()
        except OSError as write_error:
            log.error("cannot write the checkpoint: %s", write_error)

    def _forget(self, uid: str) -> None:
        """Drop ``uid``'s record from memory; the next checkpoint write makes it durable."""
        with self._mu:
            self._drop(uid)
            self._changed()

    # --- Unprepare -------------------------------------------------------------------------

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareOutcome]:
        """Remove each claim's spec file and enforcement, then drop the records with one
        checkpoint write for the whole call."""
        if not self._started:
            raise RuntimeError("DeviceState.start() must be called before unprepare")
        outcomes: dict[str, UnprepareOutcome] = {}
        dropped: list[str] = []
        for ref in claims:
            if ref.uid in outcomes:
                continue
            label = _claim_label(ref.namespace, ref.name, ref.uid)
            with self._metrics.unprepare(ref) as done:
                outcomes[ref.uid] = self._unprepare_claim(ref, label, dropped)
                done(outcomes[ref.uid].error == "")
        if dropped:
            try:
                self._persist()
            except OSError as exc:
                # The records are gone from memory and their files from disk; a restart with
                # the old checkpoint rolls them back (their spec files are missing).
                log.error("cannot write the checkpoint after unprepare: %s", exc)
                return {
                    uid: UnprepareOutcome(error=f"cannot write the checkpoint: {exc}")
                    for uid in outcomes
                }
            for label in dropped:
                log.info("unprepared %s", label)
        return outcomes

    def _unprepare_claim(self, ref: ClaimRef, label: str, dropped: list[str]) -> UnprepareOutcome:
        """Remove the claim's spec file and enforcement and drop its record from memory
        (appending ``label`` to ``dropped``); the caller persists."""
        try:
            with self._claim_locks.hold(ref.uid):
                self._cdi.remove(ref.uid)
                with self._mu:
                    known = ref.uid in self._claims
                if known:
                    self._enforcer.release(ref.uid)
                    # Before the record goes: a MigError keeps it, and kubelet retries.
                    self._destroy_instances(ref.uid)
                    with self._mu:
                        self._drop(ref.uid)
                        self._changed()
                    dropped.append(label)
            return UnprepareOutcome()
        except (ShareError, OSError, MigError) as exc:
            log.warning("unpreparing %s failed: %s", label, exc)
            return UnprepareOutcome(error=f"{label}: {exc}")
        except Exception as exc:
            log.exception("unexpected error unpreparing %s", label)
            return UnprepareOutcome(error=f"internal error unpreparing {label}: {exc}")
