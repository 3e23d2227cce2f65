"""The node's prepared claims: prepare, unprepare, the checkpoint, recovery (a ClaimPreparer).

Invariants:

- A claim is prepared in three durable steps: record ``PrepareStarted`` in the checkpoint, do the
  work (share enforcement, CDI spec file), record ``PrepareCompleted``. A crash in between leaves a
  ``PrepareStarted`` record, which the next start rolls back (CDI file removed, enforcement
  released) so the next call redoes it.
- Prepare is idempotent: a ``PrepareCompleted`` claim whose spec file still exists gets its
  recorded answer again, with no new side effects (no API call, no write).
- Unprepare removes the spec file, releases enforcement, then drops the record; unknown claims
  succeed.
- The spec file and the ``PrepareCompleted`` record are written concurrently; a
  ``PrepareCompleted`` record whose spec file is missing is rolled back at start and prepared
  again by the next call, and spec files without a record are removed at start.
- Concurrency: claims are fetched from the API server before any lock; each claim then holds its
  own lock for the whole operation, and the node-wide lock guards only in-memory state (a few
  dictionary operations; the conflict check looks only at the claims that hold the same GPUs).
  Checkpoint writes are group-committed: a write covers every state change made before it began
  (``PrepareStarted``, ``PrepareCompleted`` and dropped records of any claims), one write runs at
  a time, and a caller whose change a write covered returns without writing; each write is one
  ``fdatasync`` (see :mod:`kubeletplugin.prepare.checkpoint`). Slow work for different claims
  therefore runs in parallel, and concurrent prepares share their durable writes.
- Last line of defence: a GPU prepared exclusively for one claim is never prepared for another
  at the same time (only consumable-capacity shares, partitions and adminAccess allocations may
  share a GPU; the same partition device is never held twice).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from api.names import CORES_PER_GPU
from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.fsutil import remove_durably
from kubeletplugin.kubelet.preparer import (
    ClaimRef,
    PrepareOutcome,
    UnprepareOutcome,
    claim_ref_problem,
)
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
    DeviceRecord,
)
from kubeletplugin.prepare.claims import (
    REASON_CONFLICT,
    REASON_ENFORCEMENT,
    REASON_INTERNAL,
    REASON_IO,
    AllocationResult,
    ClaimAllocation,
    ClaimError,
    ClaimGetter,
    extract_allocation,
)
from kubeletplugin.prepare.metrics import StateMetrics
from kubeletplugin.prepare.shares import device_share
from kubeletplugin.sharing.enforcement import DeviceShare, NoEnforcement, ShareEnforcer, ShareError
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


def _conflict(new: DeviceRecord, held: DeviceRecord) -> bool:
    """Whether ``new`` cannot be prepared while another claim holds ``held``."""
    if new.admin_access or held.admin_access or new.gpu_uuid != held.gpu_uuid:
        return False
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
    ) -> None:
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
            elif not self._cdi.path_for(uid).exists():
                log.warning(
                    "CDI spec of prepared claim %s/%s (UID %s) is missing; it will be "
                    "prepared again on the next call",
                    rec.namespace,
                    rec.name,
                    uid,
                )
                rollback.add(uid)
        # Only the claims that stay prepared: resuming enforcement for a claim about to be
        # rolled back would start daemons just to stop them. Whatever a rolled-back claim left
        # running is a leftover the enforcer cleans up when no remaining claim needs it.
        self._enforcer.restore(
            loaded.sharing,
            {
                uid: (self._shares_of(rec), rec.sharing)
                for uid, rec in claims.items()
                if uid not in rollback
            },
            node_gpus=tuple(self._gpus_by_uuid),
        )
        for uid in sorted(rollback):
            self._cdi.remove(uid)
            self._enforcer.release(uid)
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

    def _revalidated(self, rec: ClaimRecord) -> ClaimRecord:
        """``rec`` (read from the checkpoint or a spec file) checked against the node's device
        table and the fixed vocabularies, with every derived field derived again: the CDI names
        and the IDs answered to kubelet are rebuilt from the claim UID, device and share ID,
        never replayed from the file. CheckpointError names the first field that does not fit.
        """
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
            if not 0 <= d.cores <= CORES_PER_GPU:
                raise CheckpointError(f"{at}.cores {d.cores} is outside 0..{CORES_PER_GPU}")
            if not 0 <= d.memory <= gpu.memory_total:
                raise CheckpointError(f"{at}.memory {d.memory} is outside 0..{gpu.memory_total}")
            try:
                name = cdimod.cdi_device_name(rec.uid, d.device, d.share_id)
            except ValueError as exc:
                raise CheckpointError(f"{at}.shareID: {exc}") from None
            devices.append(replace(d, cdi_name=name, cdi_device_ids=self._cdi.cdi_ids(name, gpu)))
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
                devices=tuple(spec.devices),
            )
            for spec in specs
        }

    def _shares_of(self, rec: ClaimRecord) -> list[DeviceShare]:
        """Device shares of a recorded claim (devices of GPUs no longer present are left out)."""
        shares = []
        for d in rec.devices:
            gpu = self._gpus_by_uuid.get(d.gpu_uuid)
            if gpu is not None:
                shares.append(
                    DeviceShare(
                        gpu=gpu,
                        device=d.device,
                        requests=d.requests,
                        cores=d.cores,
                        memory=d.memory,
                        share_id=d.share_id,
                        partition=d.partition,
                        admin_access=d.admin_access,
                    )
                )
        return shares

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
                self._undo(stale.uid)
            if fetched is None:
                fetched = self._fetch(ref)
            if isinstance(fetched, ClaimError):
                raise fetched
            allocation = extract_allocation(
                fetched, ref, self.driver_name, self.node_name, self._devices
            )
            return self._prepare_allocation(allocation, self._device_shares(allocation))

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

    def _device_shares(self, allocation: ClaimAllocation) -> list[DeviceShare]:
        """One share per distinct (device, shareID) of the claim, in result order."""
        groups: dict[tuple[str, str | None], list[AllocationResult]] = {}
        for result in allocation.results:
            groups.setdefault((result.device, result.share_id), []).append(result)
        ref = allocation.ref
        label = _claim_label(ref.namespace, ref.name, ref.uid)
        return [
            device_share(results, self._devices[device], self.driver_name, label)
            for (device, _), results in groups.items()
        ]

    def _prepare_allocation(
        self, allocation: ClaimAllocation, shares: Sequence[DeviceShare]
    ) -> PrepareOutcome:
        ref = allocation.ref
        label = _claim_label(ref.namespace, ref.name, ref.uid)
        names = [cdimod.cdi_device_name(ref.uid, s.device, s.share_id) for s in shares]
        records = tuple(
            DeviceRecord(
                requests=s.requests,
                pool=self.node_name,
                device=s.device,
                gpu_uuid=s.gpu.uuid,
                cores=s.cores,
                memory=s.memory,
                cdi_name=name,
                cdi_device_ids=self._cdi.cdi_ids(name, s.gpu),
                share_id=s.share_id,
                partition=s.partition,
                admin_access=s.admin_access,
            )
            for s, name in zip(shares, names, strict=True)
        )
        started = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=STATE_STARTED,
            devices=records,
        )
        with self._mu:
            conflict = self._find_conflict(started)
            if conflict is not None:
                raise ClaimError(f"{label}: {conflict}", REASON_CONFLICT)
            self._put(started)
            change = self._changed()
        try:
            self._persist(change)
            enforcement = self._enforcer.apply(ref.uid, shares, allocation.configs)
            if len(enforcement.device_edits) != len(shares):
                raise ShareError(
                    f"share enforcement returned edits for {len(enforcement.device_edits)} "
                    f"devices, expected {len(shares)}"
                )
            spec_devices = [
                SpecDevice(
                    record=rec,
                    claim_namespace=ref.namespace,
                    claim_name=ref.name,
                    claim_uid=ref.uid,
                    gpu=s.gpu,
                    extra_edits=edits,
                )
                for rec, s, edits in zip(records, shares, enforcement.device_edits, strict=True)
            ]
            completed = replace(started, state=STATE_COMPLETED, sharing=dict(enforcement.record))
            # The spec file and the PrepareCompleted record are written concurrently: a crash
            # that leaves either without the other is rolled back at the next start.
            with self._mu:
                self._put(completed)
                change = self._changed()
            spec_written = self._io.submit(self._cdi.write, ref.uid, spec_devices)
            try:
                self._persist(change)
            finally:
                spec_written.result()
        except (ShareError, OSError) as exc:
            log.warning("preparing %s failed: %s", label, exc)
            self._undo_quietly(ref.uid)
            reason = REASON_ENFORCEMENT if isinstance(exc, ShareError) else REASON_IO
            raise ClaimError(f"{label}: {exc}", reason) from exc
        except BaseException:
            self._undo_quietly(ref.uid)
            raise
        log.info("prepared %s: %s", label, ", ".join(d.cdi_name for d in completed.devices))
        return self._outcome(completed)

    def _find_conflict(self, new: ClaimRecord) -> str | None:
        """Caller holds ``_mu``. Why ``new`` cannot be prepared now, or None. Only claims that
        hold one of ``new``'s GPUs can conflict with it."""
        for a in new.devices:
            for uid, other in self._by_gpu.get(a.gpu_uuid, {}).items():
                if uid == new.uid:
                    continue
                for b in other.devices:
                    if _conflict(a, b):
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
        return None

    def _undo(self, uid: str) -> None:
        """Roll back whatever a prepare of ``uid`` did, then drop its record durably."""
        self._cdi.remove(uid)
        self._enforcer.release(uid)
        with self._mu:
            self._drop(uid)
            change = self._changed()
        self._persist(change)

    def _undo_quietly(self, uid: str) -> None:
        try:
            self._undo(uid)
        except (ShareError, OSError) as exc:
            # Expected (a full disk, a command that failed): the next start or call retries.
            log.error("rolling back the failed prepare of claim %s failed: %s", uid, exc)
            self._forget(uid)
        except Exception:
            log.exception("rolling back the failed prepare of claim %s failed", uid)
            self._forget(uid)

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
                    with self._mu:
                        self._drop(ref.uid)
                        self._changed()
                    dropped.append(label)
            return UnprepareOutcome()
        except (ShareError, OSError) as exc:
            log.warning("unpreparing %s failed: %s", label, exc)
            return UnprepareOutcome(error=f"{label}: {exc}")
        except Exception as exc:
            log.exception("unexpected error unpreparing %s", label)
            return UnprepareOutcome(error=f"internal error unpreparing {label}: {exc}")
