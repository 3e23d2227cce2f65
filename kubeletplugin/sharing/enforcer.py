"""The share enforcer (:class:`~kubeletplugin.sharing.enforcement.ShareEnforcer`): GpuConfig
strategies turned into node state and per-device container edits.

Invariants, per claim: each device's GpuConfig is resolved by
:meth:`api.gpuconfig.DriverConfigs.resolve`, its caps are the share's request or the
``burstLimit`` its DeviceClass allows (:mod:`api.burst`), its overrides never exceed them, and
``Limits`` needs an interception library; under the locks of its GPUs the claim's strategies
must coexist with the other claims' (MPS only with MPS, TimeSlicing with Limits, Exclusive
alone) and granted cores and memory never exceed the GPU's; adminAccess allocations are neither
counted nor enforced. Every GPU fact comes from the record's attached GPU
(:attr:`DeviceRecord.gpu`). Before the node is changed a mark is left (a daemon's directory or
pod, a time-slice marker): ``restore`` adopts the daemons of prepared claims and undoes every
mark no surviving claim needs; ``release`` stops a claim's daemons and restores a GPU's
time-slice interval after its last holder, retrying a failed stop on every later call."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from api import burst, sharepolicy
from api.gpuconfig import (
    STRATEGY_EXCLUSIVE,
    STRATEGY_LIMITS,
    STRATEGY_MPS,
    STRATEGY_TIME_SLICING,
    DriverConfigs,
    GpuConfig,
    GpuConfigError,
    default_strategy,
)
from api.names import CORES_PER_GPU
from api.quantity import format_bytes_human
from kubeletplugin.containeredits import ContainerEdits, visible_gpus
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.fsutil import child_path
from kubeletplugin.runner import CommandError, Runner
from kubeletplugin.sharing.daemons import DaemonLauncher
from kubeletplugin.sharing.enforcement import Applied, Decisions, ShareError
from kubeletplugin.sharing.limits import limits_edits
from kubeletplugin.sharing.mps import MPS_ERRORS, MpsLimits, MpsManager
from kubeletplugin.sharing.shm import DEFAULT_SHM_BYTES, ShmMounter
from kubeletplugin.sharing.timeslice import (
    DEFAULT_INTERVAL,
    TimeSliceConflict,
    TimeSliceManager,
)

log = logging.getLogger(__name__)

#: Bound of a Limits claim's lock directory (a tmpfs; the library keeps a few lock files there).
LIMITS_LOCK_BYTES: Final = 4 * 1024 * 1024

STATE_VERSION: Final = 2

#: Strategies that may share one GPU between different claims.
_COMPATIBLE: Final = {
    STRATEGY_MPS: frozenset({STRATEGY_MPS}),
    STRATEGY_TIME_SLICING: frozenset({STRATEGY_TIME_SLICING, STRATEGY_LIMITS}),
    STRATEGY_LIMITS: frozenset({STRATEGY_TIME_SLICING, STRATEGY_LIMITS}),
    STRATEGY_EXCLUSIVE: frozenset(),
}


def takes_whole_gpu(share: DeviceRecord) -> bool:
    """:func:`api.sharepolicy.takes_whole_gpu` of ``share``: such a share defaults to
    Exclusive, like a whole-GPU allocation."""
    return sharepolicy.takes_whole_gpu(
        partition=share.partition is not None,
        cores=share.cores,
        memory=share.memory,
        memory_usable=share.gpu.memory_usable,
    )


def _label(share: DeviceRecord) -> str:
    quoted = ", ".join(f'"{r}"' for r in share.requests)
    return f"device {share.device} (request {quoted})"


class SharingEnforcer:
    """Enforces shares with MPS, time-slicing and an interception library (see module doc)."""

    def __init__(
        self,
        runner: Runner,
        data_dir: str | Path,
        *,
        driver_name: str,
        launcher: DaemonLauncher,
        limits_library: str | None = None,
        mps_root: str | Path | None = None,
        shm: ShmMounter | None = None,
        shm_bytes: int = DEFAULT_SHM_BYTES,
    ) -> None:
        """``launcher`` runs the MPS daemons; their host directories live under ``mps_root``
        (default ``<data_dir>/mps``; keep it short: socket paths hold at most 107 bytes) and
        ``shm`` mounts each daemon's shared memory, at most ``shm_bytes``."""
        self.runner = runner
        self.driver_name = driver_name
        self.limits_library = limits_library
        self.mps = MpsManager(
            runner,
            Path(data_dir) / "mps" if mps_root is None else Path(mps_root),
            launcher,
            shm=shm,
            shm_bytes=shm_bytes,
        )
        #: Parent of the per-claim lock directories of the Limits strategy (see limits.py).
        self.limits_lock_root = Path(data_dir) / "limits" / "vgpulock"
        self.timeslice = TimeSliceManager(runner, Path(data_dir) / "timeslice")
        #: The enforced devices of each claim (records with ``enforcement`` set; adminAccess
        #: devices are left out).
        self._held: dict[str, tuple[DeviceRecord, ...]] = {}
        self._lock = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)

    # --- the seam ---

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
        with self._lock:
            known = claim_uid in self._held
        if known:
            self.release(claim_uid)
        decisions = tuple(None if d.admin_access else self._plan(d, configs) for d in devices)
        held = _decided(devices, decisions)
        _check_mps_single_gpu_per_request(held)
        uuids = sorted({d.gpu.uuid for d in held})
        with self._locked(uuids):
            self._check_against_others(claim_uid, held)
            self._drive_node(claim_uid, held)
            with self._lock:
                self._held[claim_uid] = held
        return Applied(decisions=decisions, device_edits=self._edits(claim_uid, devices, held))

    def release(self, claim_uid: str) -> None:
        with self._lock:
            held = self._held.pop(claim_uid, ())
            needed = self._needed_daemons()
        if any(d.enforced.strategy == STRATEGY_LIMITS for d in held):
            self._remove_lock_dir(claim_uid)
        # This claim's daemons, and any whose earlier stop failed, and every GPU with a held or
        # unrestored interval: failed stops and restores are retried on every release.
        unneeded = {i: d.uuid for i, d in self.mps.running().items() if i not in needed}
        uuids = sorted(
            {d.gpu.uuid for d in held} | set(unneeded.values()) | set(self.timeslice.gpus())
        )
        problems: list[str] = []
        with self._locked(uuids):
            # A daemon another claim's apply started before the snapshot above has its devices
            # recorded once that apply released its GPU lock: ask again under the lock.
            with self._lock:
                needed = self._needed_daemons()
            for daemon_id, uuid in sorted(unneeded.items()):
                if daemon_id in needed:
                    continue
                try:
                    self.mps.stop(daemon_id)
                except MPS_ERRORS as exc:
                    problems.append(f"cannot stop the MPS daemon {daemon_id} of GPU {uuid}: {exc}")
            for uuid in uuids:
                problems += self._settle_timeslice(uuid, claim_uid)
        if problems:
            raise ShareError("; ".join(problems))

    def _needed_daemons(self) -> dict[str, tuple[str, str, MpsLimits]]:
        """``{daemon id: (claim, GPU, limits)}`` of the held claims' MPS devices (call with
        ``self._lock`` held)."""
        needed: dict[str, tuple[str, str, MpsLimits]] = {}
        for claim_uid, held in self._held.items():
            for uuid, limits in _daemon_limits(held).items():
                needed[self.mps.paths(claim_uid, uuid).id] = (claim_uid, uuid, limits)
        return needed

    def export_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "mps": self.mps.export_state(),
            "timeSlicing": self.timeslice.export_state(),
        }

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Decisions]:
        state = state if isinstance(state, Mapping) else {}
        known = frozenset(node_gpus)
        intervals = _on_node(
            TimeSliceManager.intervals(_mapping(state.get("timeSlicing"))),
            known,
            "time-slice interval",
        )
        decisions = {
            claim_uid: tuple(
                None if d.admin_access else d.enforcement or _default_enforcement(d)
                for d in devices
            )
            for claim_uid, devices in prepared.items()
        }
        with self._lock:
            for claim_uid, devices in prepared.items():
                self._held[claim_uid] = _decided(devices, decisions[claim_uid])
            needed = self._needed_daemons()
            all_held = [(c, d) for c, held in self._held.items() for d in held]
        for uuid, interval in intervals.items():
            self.timeslice.adopt(uuid, interval)
        for claim_uid, uuid, limits in sorted(needed.values()):
            try:
                self.mps.ensure_running(claim_uid, uuid, limits)
            except MPS_ERRORS as exc:
                log.error(
                    "cannot resume the MPS daemon of claim %s on GPU %s: %s", claim_uid, uuid, exc
                )
        for claim_uid, d in all_held:
            if d.enforced.strategy == STRATEGY_TIME_SLICING and d.enforced.interval is not None:
                try:
                    self.timeslice.acquire(d.gpu.uuid, _interval(d.enforced.interval), claim_uid)
                except (CommandError, TimeSliceConflict) as exc:
                    log.error("cannot resume time-slicing on GPU %s: %s", d.gpu.uuid, exc)
        # Daemons no prepared claim needs: found through their directories or their launcher
        # (a claim unprepared while the plugin was down, or a prepare interrupted before its
        # record).
        for daemon_id in self.mps.leftovers(needed):
            try:
                self.mps.stop(daemon_id)
            except MPS_ERRORS as exc:
                log.error("cannot stop the leftover MPS daemon %s: %s", daemon_id, exc)
        # Lock directories of claims that are not prepared any more (the checkpoint decides).
        with self._lock:
            prepared_claims = set(self._held)
        for leftover in self._lock_dir_claims() - prepared_claims:
            self._remove_lock_dir(leftover)
        # Intervals no claim holds: recorded in the checkpoint, or only marked (a prepare
        # interrupted before its record); a GPU a surviving claim holds keeps its setting.
        for uuid in self.timeslice.marked():
            if uuid in known:
                self.timeslice.adopt(uuid, DEFAULT_INTERVAL)
            else:
                log.warning("ignoring the time-slice marker of %r: this node has no such GPU", uuid)
        for uuid in self.timeslice.gpus():
            if not self.timeslice.holders(uuid):
                try:
                    self.timeslice.release(uuid, "")
                except CommandError as exc:
                    log.error("cannot restore the time-slice interval of GPU %s: %s", uuid, exc)
        return decisions

    def _lock_dir_claims(self) -> set[str]:
        """Claim UIDs with a Limits lock directory (plain directories only)."""
        try:
            return {
                p.name for p in self.limits_lock_root.iterdir() if p.is_dir() and not p.is_symlink()
            }
        except OSError:
            return set()

    # --- views for tests, the demo and the CLI ---

    def held(self) -> dict[str, tuple[DeviceRecord, ...]]:
        """The enforced devices by claim UID (each with its ``enforcement``)."""
        with self._lock:
            return dict(self._held)

    def usage(self) -> dict[str, tuple[int, int]]:
        """``{gpu_uuid: (held cores, held memory bytes)}`` over all claims."""
        totals: dict[str, tuple[int, int]] = {}
        for held in self.held().values():
            for d in held:
                cores, memory = totals.get(d.gpu.uuid, (0, 0))
                totals[d.gpu.uuid] = (cores + d.cores, memory + d.memory)
        return totals

    # --- planning ---

    def _plan(self, share: DeviceRecord, configs: DriverConfigs) -> Enforcement:
        label = _label(share)
        shared = share.is_share and not takes_whole_gpu(share)
        try:
            resolved = [configs.resolve(request, shared=shared) for request in share.requests]
        except GpuConfigError as exc:
            raise ShareError(f"{label}: invalid GpuConfig: {exc}") from None
        if not resolved:
            raise ShareError(f"{label}: the allocation names no request")
        config = resolved[0]
        if any(other != config for other in resolved[1:]):
            raise ShareError(
                f"{label}: the requests sharing this device resolve to different GpuConfigs; "
                "give them one config"
            )
        strategy = config.strategy or default_strategy(shared)
        if share.gpu.mig is not None and strategy != STRATEGY_EXCLUSIVE:
            raise ShareError(
                f"{label}: MIG device {share.gpu.uuid} ({share.gpu.mig.profile}) supports only "
                f"strategy {STRATEGY_EXCLUSIVE}, not {strategy}: a MIG device is already an "
                "isolated slice of its GPU"
            )
        try:
            policy = burst.allocation_policy(configs, share.requests[0])
        except GpuConfigError as exc:
            raise ShareError(f"{label}: invalid GpuConfig: {exc}") from None
        limit_cores, limit_memory = _limits(config, share, label, policy)
        if strategy == STRATEGY_LIMITS and not self.limits_library:
            raise ShareError(
                f"{label}: strategy Limits needs an interception library, and this node's "
                "plugin has none configured (--limits-library)"
            )
        interval = None
        if strategy == STRATEGY_TIME_SLICING:
            ts = config.sharing.time_slicing if config.sharing else None
            interval = ts.interval if ts else "Default"
        return Enforcement(
            strategy=strategy, limit_cores=limit_cores, limit_memory=limit_memory, interval=interval
        )

    def _check_against_others(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        gpus = {d.gpu.uuid: d.gpu for d in held}
        with self._lock:
            others = [
                (uid, d)
                for uid, devices in self._held.items()
                if uid != claim_uid
                for d in devices
                if d.gpu.uuid in gpus
            ]
        for mine in held:
            uuid, ours = mine.gpu.uuid, mine.enforced
            for other in held:
                theirs = other.enforced
                if (
                    other is not mine
                    and other.gpu.uuid == uuid
                    and theirs.strategy != ours.strategy
                    and STRATEGY_MPS in (ours.strategy, theirs.strategy)
                ):
                    raise ShareError(
                        f"device {mine.device}: strategy {ours.strategy} cannot share GPU "
                        f"{uuid} with strategy {theirs.strategy} of device "
                        f"{other.device} in the same claim"
                    )
            for uid, other in others:
                theirs = other.enforced
                if other.gpu.uuid != uuid:
                    continue
                if theirs.strategy not in _COMPATIBLE[ours.strategy]:
                    raise ShareError(
                        f"device {mine.device}: strategy {ours.strategy} cannot share GPU "
                        f"{uuid} with strategy {theirs.strategy} already used there "
                        f"by claim {uid}"
                    )
                if (
                    ours.strategy == STRATEGY_TIME_SLICING
                    and theirs.strategy == STRATEGY_TIME_SLICING
                    and theirs.interval != ours.interval
                ):
                    raise ShareError(
                        f"device {mine.device}: time-slice interval {ours.interval} conflicts "
                        f"with interval {theirs.interval} already used on GPU {uuid} "
                        f"by claim {uid}"
                    )
        for uuid, gpu in gpus.items():
            held_cores = sum(d.cores for _, d in others if d.gpu.uuid == uuid)
            held_memory = sum(d.memory for _, d in others if d.gpu.uuid == uuid)
            new_cores = sum(d.cores for d in held if d.gpu.uuid == uuid)
            new_memory = sum(d.memory for d in held if d.gpu.uuid == uuid)
            if held_cores + new_cores > CORES_PER_GPU or held_memory + new_memory > (
                gpu.memory_usable
            ):
                raise ShareError(
                    f"GPU {uuid} (gpu-{gpu.index}) cannot hold this claim's {new_cores} cores "
                    f"and {format_bytes_human(new_memory)}: other claims already hold "
                    f"{held_cores} of {CORES_PER_GPU} cores and "
                    f"{format_bytes_human(held_memory)} of "
                    f"{format_bytes_human(gpu.memory_usable)}"
                )

    # --- node state ---

    def _drive_node(self, claim_uid: str, held: Sequence[DeviceRecord]) -> None:
        """Start or adopt the claim's MPS daemons and set intervals; on failure undo this
        claim's part."""
        started: list[str] = []
        acquired: list[str] = []
        if any(d.enforced.strategy == STRATEGY_LIMITS for d in held):
            self._make_lock_dir(claim_uid)
        try:
            for uuid, limits in sorted(_daemon_limits(held).items()):
                started.append(self.mps.ensure_running(claim_uid, uuid, limits).paths.id)
            for d in held:
                uuid, e = d.gpu.uuid, d.enforced
                if e.strategy == STRATEGY_TIME_SLICING and uuid not in acquired:
                    self.timeslice.acquire(uuid, _interval(e.interval), claim_uid)
                    acquired.append(uuid)
        except (*MPS_ERRORS, TimeSliceConflict) as exc:
            for uuid in acquired:
                with contextlib.suppress(CommandError):
                    self.timeslice.release(uuid, claim_uid)
            for daemon_id in started:
                with contextlib.suppress(*MPS_ERRORS):
                    self.mps.stop(daemon_id)
            raise ShareError(f"cannot enforce the share: {exc}") from None

    def _settle_timeslice(self, uuid: str, released_claim: str) -> list[str]:
        """After ``released_claim`` left: drop its interval hold on ``uuid``."""
        problems: list[str] = []
        holders = self.timeslice.holders(uuid)
        if released_claim in holders or (uuid in self.timeslice.gpus() and not holders):
            try:
                self.timeslice.release(uuid, released_claim)
            except CommandError as exc:
                problems.append(f"cannot restore the time-slice interval of GPU {uuid}: {exc}")
        return problems

    @contextlib.contextmanager
    def _locked(self, uuids: Sequence[str]) -> Iterator[None]:
        with self._lock:
            locks = [self._gpu_locks[u] for u in sorted(set(uuids))]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    # --- container edits ---

    def lock_dir(self, claim_uid: str) -> Path:
        """The Limits lock directory of one claim: only that claim's containers mount it."""
        return child_path(self.limits_lock_root, claim_uid)

    def _make_lock_dir(self, claim_uid: str) -> None:
        # The parent is the plugin's; the claim's own directory is writable by every user of
        # the claim's containers, like the /tmp the library expects it to be, and a tmpfs of
        # at most LIMITS_LOCK_BYTES: a tenant cannot fill the kubelet's file system through it.
        try:
            self.limits_lock_root.mkdir(parents=True, exist_ok=True)
            self.limits_lock_root.chmod(0o755)
            directory = self.lock_dir(claim_uid)
            directory.mkdir(exist_ok=True)
            directory.chmod(0o1777)
            self.mps.shm.mount(directory, LIMITS_LOCK_BYTES)
        except OSError as exc:
            raise ShareError(f"cannot make the Limits lock directory: {exc}") from None

    def _remove_lock_dir(self, claim_uid: str) -> None:
        try:
            self.mps.shm.unmount(self.lock_dir(claim_uid))
            shutil.rmtree(self.lock_dir(claim_uid))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("cannot remove the Limits lock directory of claim %s: %s", claim_uid, exc)

    def _edits(
        self, claim_uid: str, devices: Sequence[DeviceRecord], held: Sequence[DeviceRecord]
    ) -> tuple[ContainerEdits, ...]:
        """Per-device edits (``held``: the enforced ones among ``devices``, decided). Devices of
        one request on one GPU are injected together and share one set of variables, so each
        carries the group's total; a Limits ordinal is the GPU's CUDA ordinal among the GPUs the
        container sees with the device (``containeredits.visible_gpus``: the order of its
        ``NVIDIA_VISIBLE_DEVICES``, by PCI bus ID as ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers
        them)."""
        limits = _group_limits(held)
        decided = iter(held)
        visible = visible_gpus([d.requests for d in devices], [d.gpu for d in devices])
        edits: list[ContainerEdits] = []
        for i, device in enumerate(devices):
            if device.admin_access:
                edits.append(ContainerEdits())
                continue
            d = next(decided)
            uuid, strategy = d.gpu.uuid, d.enforced.strategy
            cores, memory = limits[(d.requests, uuid, strategy)]
            if strategy == STRATEGY_MPS:
                edits.append(self.mps.container_edits(claim_uid, uuid, cores, memory))
            elif strategy == STRATEGY_LIMITS and self.limits_library:
                edits.append(
                    limits_edits(
                        self.limits_library,
                        str(self.lock_dir(claim_uid)),
                        [g.uuid for g in visible[i]].index(uuid),
                        memory,
                        cores,
                    )
                )
            else:
                edits.append(ContainerEdits())
        return tuple(edits)


def _decided(devices: Sequence[DeviceRecord], decisions: Decisions) -> tuple[DeviceRecord, ...]:
    """The devices with a decision, each carrying it (``decisions[i]`` is ``devices[i]``'s)."""
    return tuple(
        replace(d, enforcement=e) for d, e in zip(devices, decisions, strict=True) if e is not None
    )


def _default_enforcement(d: DeviceRecord) -> Enforcement:
    """What a device recorded without a decision gets at restore (a claim rebuilt from its CDI
    spec, or recorded by a plugin that kept none): the default strategy, limited to its share."""
    return Enforcement(
        strategy=default_strategy(d.is_share and not takes_whole_gpu(d)),
        limit_cores=d.cores,
        limit_memory=d.memory,
    )


def _group_limits(
    held: Sequence[DeviceRecord],
) -> dict[tuple[tuple[str, ...], str, str], tuple[int, int]]:
    """(cores, memory bytes) one container is limited to, per (requests, GPU, strategy): devices
    of one request on one GPU are injected together, so their limits add up (cores at most the
    GPU's)."""
    groups: dict[tuple[tuple[str, ...], str, str], list[Enforcement]] = defaultdict(list)
    for d in held:
        groups[(d.requests, d.gpu.uuid, d.enforced.strategy)].append(d.enforced)
    return {
        key: (
            min(CORES_PER_GPU, sum(e.limit_cores for e in group)),
            sum(e.limit_memory for e in group),
        )
        for key, group in groups.items()
    }


def _daemon_limits(held: Sequence[DeviceRecord]) -> dict[str, MpsLimits]:
    """The default limits of one claim's MPS daemon per GPU: the largest limits a container of
    the claim gets there (a container with lower limits sets its own client variables)."""
    daemons: dict[str, MpsLimits] = {}
    for (_, uuid, strategy), (cores, memory) in _group_limits(held).items():
        if strategy != STRATEGY_MPS:
            continue
        known = daemons.get(uuid)
        daemons[uuid] = (
            MpsLimits(cores, memory)
            if known is None
            else MpsLimits(max(known.cores, cores), max(known.memory, memory))
        )
    return daemons


def _limits(
    config: GpuConfig, share: DeviceRecord, label: str, policy: burst.ClassPolicy
) -> tuple[int, int]:
    """(cores, memory bytes) the container is limited to: the share's caps
    (:func:`api.burst.share_caps`: its request, or its ``burstLimit`` as ``policy``, the
    DeviceClass's, allows), or an override at most those caps."""
    sharing = config.sharing
    problems = burst.limit_problems(
        sharing,
        policy,
        cores=share.cores,
        memory=share.memory,
        gpu_memory=share.gpu.memory_usable,
    )
    if problems:
        raise ShareError(f"{label}: " + "; ".join(problems))
    cap_cores, cap_memory = burst.share_caps(sharing, share.cores, share.memory)
    whose = "the share's burstLimit" if sharing and sharing.burst_limit else "the share's"
    cores_override: int | None = None
    memory_override: int | None = None
    cores_field = memory_field = ""
    if sharing is not None and sharing.mps is not None:
        cores_override = sharing.mps.active_thread_percentage
        memory_override = sharing.mps.pinned_memory_limit_bytes()
        cores_field, memory_field = "mps.activeThreadPercentage", "mps.pinnedMemoryLimit"
    elif sharing is not None and sharing.limits is not None:
        cores_override = sharing.limits.sm_limit
        memory_override = sharing.limits.device_memory_limit_bytes()
        cores_field, memory_field = "limits.smLimit", "limits.deviceMemoryLimit"
    if cores_override is not None and cores_override > cap_cores:
        raise ShareError(
            f"{label}: sharing.{cores_field} {cores_override} is above {whose} {cap_cores} cores"
        )
    if memory_override is not None and memory_override > cap_memory:
        raise ShareError(
            f"{label}: sharing.{memory_field} {format_bytes_human(memory_override)} is above "
            f"{whose} memory {format_bytes_human(cap_memory)}"
        )
    return (
        cap_cores if cores_override is None else cores_override,
        cap_memory if memory_override is None else memory_override,
    )


def _check_mps_single_gpu_per_request(held: Sequence[DeviceRecord]) -> None:
    """A container attaches to one MPS daemon, which exposes one GPU as CUDA device 0, so a
    request with MPS shares needs all its devices on one GPU (then that GPU is also all its
    ``NVIDIA_VISIBLE_DEVICES`` lists)."""
    gpus_by_request: dict[str, set[str]] = defaultdict(set)
    mps_requests: set[str] = set()
    for d in held:
        for request in d.base_requests:
            gpus_by_request[request].add(d.gpu.uuid)
            if d.enforced.strategy == STRATEGY_MPS:
                mps_requests.add(request)
    for request in sorted(mps_requests):
        gpus = gpus_by_request[request]
        if len(gpus) > 1:
            raise ShareError(
                f'request "{request}": MPS shares of one request must be on one GPU, with '
                f"every other device of the request (got {', '.join(sorted(gpus))}); a container "
                "attaches to one MPS daemon; use one request per GPU or strategy Limits"
            )


def _interval(value: str | None) -> Any:
    return value or "Default"


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _on_node(found: dict[str, str], known: frozenset[str], what: str) -> dict[str, str]:
    """The entries of ``found`` (by GPU UUID, from a checkpoint) for GPUs this node has; the
    others are logged and dropped, never acted on."""
    for uuid in sorted(set(found) - known):
        log.warning("ignoring the recorded %s of %r: this node has no such GPU", what, uuid)
    return {uuid: value for uuid, value in found.items() if uuid in known}


@dataclass(frozen=True)
class ShareTools:
    """What enforcement drives on a host: the runner of the driver's tools, the launcher of the
    MPS daemons and the mounter of their shared memory."""

    runner: Runner
    launcher: DaemonLauncher
    shm: ShmMounter


def build_enforcer(
    tools: ShareTools,
    data_dir: str | Path,
    *,
    driver_name: str,
    limits_library: str | None = None,
    mps_root: str | Path | None = None,
    mps_shm_bytes: int = DEFAULT_SHM_BYTES,
) -> SharingEnforcer:
    """The enforcer for a plugin, driving the host through ``tools``."""
    return SharingEnforcer(
        tools.runner,
        data_dir,
        driver_name=driver_name,
        launcher=tools.launcher,
        limits_library=limits_library,
        mps_root=mps_root,
        shm=tools.shm,
        shm_bytes=mps_shm_bytes,
    )
