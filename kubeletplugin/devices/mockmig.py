"""Dynamic MIG on mock GPUs: MIG instances kept in a JSON file, created and destroyed in NVML's
two steps (GPU instance, then compute instance; destroyed in reverse), so a kill between them
leaves a GPU instance without a compute instance (``compute_instance`` -1, empty UUID) for the
plugin's restart to clean up. A MIG UUID (uuid5 of node, parent, GPU instance id and the
file's creation ``serial``) is new each time an id is reused, like a real one.

Invariants: every change is durable (:func:`kubeletplugin.fsutil.atomic_write`) before a call
returns and every call re-reads the file, under one thread lock and ``flock`` of
``.<name>.lock``, so partitioners in other threads or processes see the same instances; the file
is read without following a link, at most :data:`MAX_FILE_BYTES`, and checked whole
(:func:`parse_state`) with errors naming the field path; instances obey
:func:`~kubeletplugin.devices.migtables.placement_problem`; GPU instance ids are the smallest
unused id >= 1 of the parent, compute instance ids 0."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from kubeletplugin import fsutil
from kubeletplugin.devices.migpartition import MigError
from kubeletplugin.devices.migtables import placement_problem, profile_by_id
from kubeletplugin.devices.mock import MAX_MOCK_GPUS, MIB, MOCK_UUID_NAMESPACE
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement, MigProfile

#: The only file format version.
STATE_VERSION: Final = 1
#: Largest state file read (a full file of 128 GPUs with 8 instances each is about 100 KiB).
MAX_FILE_BYTES: Final = 1024 * 1024
#: Largest GPU instance id (NVML's ids are small; H100 and A100 stay below 16).
MAX_GPU_INSTANCE_ID: Final = 64
#: Largest compute instance id.
MAX_COMPUTE_INSTANCE_ID: Final = 64
#: Most GPU instances one GPU has (one per memory slice).
MAX_INSTANCES_PER_GPU: Final = 8
#: Largest placement start and size (memory slices).
MAX_SLOT: Final = 64
#: Largest NVML profile id.
MAX_PROFILE_ID: Final = 1024
#: Largest creation counter.
MAX_SERIAL: Final = 2**53
#: Longest parent UUID key.
MAX_UUID_CHARS: Final = 128
#: Mode of the state file (only the plugin reads it).
FILE_MODE: Final = 0o600

_TOP_KEYS: Final = ("version", "serial", "gpus")
_INSTANCE_KEYS: Final = ("gpuInstance", "computeInstance", "profileId", "start", "size", "serial")


@dataclass(frozen=True)
class Instance:
    """One GPU instance in the file; ``compute_instance`` None when it has no compute instance
    (a create or destroy was cut between its two steps)."""

    gpu_instance: int
    compute_instance: int | None
    profile_id: int
    placement: MigPlacement
    serial: int


@dataclass
class MockMigState:
    """The whole file: the creation counter and each parent's instances (in file order; this
    module writes them by GPU instance id)."""

    serial: int = 0
    gpus: dict[str, list[Instance]] = field(default_factory=dict)


def mock_dynamic_mig_uuid(node_name: str, parent_uuid: str, gpu_instance: int, serial: int) -> str:
    """MIG UUID of the compute instance of a created GPU instance: ``MIG-<uuid5>``."""
    key = f"{node_name}/{parent_uuid}/dynamic-mig/{gpu_instance}/{serial}"
    return f"MIG-{uuid.uuid5(MOCK_UUID_NAMESPACE, key)}"


def _int(where: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where}: must be an integer from {low} to {high}, got {value!r:.40}")
    return value


def _instance(where: str, raw: Any) -> Instance:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in _INSTANCE_KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown field {unknown[0]!r:.60} (allowed: {', '.join(_INSTANCE_KEYS)})"
        )
    missing = [k for k in _INSTANCE_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: is required")
    ci = raw["computeInstance"]
    return Instance(
        gpu_instance=_int(f"{where}.gpuInstance", raw["gpuInstance"], 1, MAX_GPU_INSTANCE_ID),
        compute_instance=None
        if ci is None
        else _int(f"{where}.computeInstance", ci, 0, MAX_COMPUTE_INSTANCE_ID),
        profile_id=_int(f"{where}.profileId", raw["profileId"], 0, MAX_PROFILE_ID),
        placement=MigPlacement(
            _int(f"{where}.start", raw["start"], 0, MAX_SLOT),
            _int(f"{where}.size", raw["size"], 1, MAX_SLOT),
        ),
        serial=_int(f"{where}.serial", raw["serial"], 1, MAX_SERIAL),
    )


def parse_state(data: Any) -> MockMigState:
    """Check and convert the decoded file; ValueError naming the field path. The file::

        {"version": 1, "serial": 3,
         "gpus": {"GPU-...": [{"gpuInstance": 1, "computeInstance": 0, "profileId": 19,
                               "start": 0, "size": 1, "serial": 3}]}}

    Checked here: the schema (keys, types, id ranges), GPU instance ids and serials unique per
    parent and file, serials at most the counter, placements of one parent not overlapping. The
    profile rules need the parent's profiles: :func:`check_layout`."""
    if not isinstance(data, dict):
        raise ValueError(f"the file must hold a JSON object, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in _TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r:.60} (allowed: {', '.join(_TOP_KEYS)})")
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"version: must be {STATE_VERSION}, got {data.get('version')!r:.40}")
    counter = _int("serial", data.get("serial"), 0, MAX_SERIAL)
    raw_gpus = data.get("gpus")
    if not isinstance(raw_gpus, dict):
        raise ValueError(f"gpus: must be an object, got {type(raw_gpus).__name__}")
    if len(raw_gpus) > MAX_MOCK_GPUS:
        raise ValueError(f"gpus: at most {MAX_MOCK_GPUS} GPUs, got {len(raw_gpus)}")
    state = MockMigState(serial=counter)
    serials: set[int] = set()
    for parent, raw_list in raw_gpus.items():
        if (
            not parent.startswith("GPU-")
            or len(parent) > MAX_UUID_CHARS
            or not parent.isprintable()
        ):
            raise ValueError(
                f"gpus: key {parent!r:.60} is not a GPU UUID (GPU-..., at most "
                f"{MAX_UUID_CHARS} characters)"
            )
        where = f"gpus[{parent}]"
        if not isinstance(raw_list, list) or not 1 <= len(raw_list) <= MAX_INSTANCES_PER_GPU:
            raise ValueError(f"{where}: must be a list of 1 to {MAX_INSTANCES_PER_GPU} instances")
        instances: list[Instance] = []
        for i, raw in enumerate(raw_list):
            here = f"{where}[{i}]"
            inst = _instance(here, raw)
            if inst.serial > counter:
                raise ValueError(
                    f"{here}.serial: {inst.serial} is above the file's serial {counter}"
                )
            if inst.serial in serials:
                raise ValueError(f"{here}.serial: {inst.serial} is used twice")
            for other in instances:
                if other.gpu_instance == inst.gpu_instance:
                    raise ValueError(f"{here}.gpuInstance: {inst.gpu_instance} is used twice")
                if other.placement.overlaps(inst.placement):
                    raise ValueError(
                        f"{here}: placement {inst.placement.start}:{inst.placement.size} overlaps "
                        f"GPU instance {other.gpu_instance} at "
                        f"{other.placement.start}:{other.placement.size}"
                    )
            serials.add(inst.serial)
            instances.append(inst)
        state.gpus[parent] = instances
    return state


def check_layout(profiles: tuple[MigProfile, ...], instances: list[Instance], where: str) -> None:
    """ValueError unless each instance fits (:func:`placement_problem`) next to the ones before
    it, naming the field path of the first that does not."""
    existing: list[tuple[int, MigPlacement]] = []
    for i, inst in enumerate(instances):
        problem = placement_problem(profiles, existing, inst.profile_id, inst.placement)
        if problem is not None:
            raise ValueError(f"{where}[{i}] (GPU instance {inst.gpu_instance}): {problem}")
        existing.append((inst.profile_id, inst.placement))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r:.60} is given twice")
        result[key] = value
    return result


def _dump(state: MockMigState) -> bytes:
    gpus = {
        parent: [
            {
                "gpuInstance": inst.gpu_instance,
                "computeInstance": inst.compute_instance,
                "profileId": inst.profile_id,
                "start": inst.placement.start,
                "size": inst.placement.size,
                "serial": inst.serial,
            }
            for inst in instances
        ]
        for parent, instances in sorted(state.gpus.items())
        if instances
    }
    doc = {"version": STATE_VERSION, "serial": state.serial, "gpus": gpus}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


class MockMigPartitioner:
    """:class:`~kubeletplugin.devices.migpartition.MigPartitioner` of mock GPUs (their
    ``mig_profiles`` come from :mod:`kubeletplugin.devices.migtables`), with the instances in
    ``state_file`` (see the module docstring). ``node_name`` seeds the MIG UUIDs.
    ``step_seconds``: how long the wait between the two durable steps of a create or destroy
    lasts (NVML takes a noticeable time to create or destroy an instance; the daemon's kill -9
    tests use it to land kills between the steps)."""

    def __init__(self, state_file: Path, node_name: str, step_seconds: float = 0.0) -> None:
        if not 0.0 <= step_seconds <= 60.0:
            raise ValueError(f"MIG step time {step_seconds} s is outside 0 to 60 s")
        self.state_file = state_file
        self.node_name = node_name
        self.step_seconds = step_seconds
        self._lock = threading.Lock()
        self._lock_file = state_file.parent / f".{state_file.name}.lock"
        self._temp_cleaned = False

    # -- the MigPartitioner protocol -------------------------------------------------------

    def instances(self, parent: GpuInfo) -> tuple[GpuInfo, ...]:
        """Every GPU instance on ``parent`` by GPU instance id (``compute_instance`` -1 and the
        UUID empty for one without a compute instance); raises MigError."""
        profiles = self._profiles(parent)
        with self._locked():
            state = self._load()
            found = self._checked(state, parent, profiles)
        ordered = sorted(found, key=lambda x: x.gpu_instance)
        return tuple(self._device(parent, profiles, inst) for inst in ordered)

    def create(self, parent: GpuInfo, profile: MigProfile, placement: MigPlacement) -> GpuInfo:
        """Create a GPU instance of ``profile`` at ``placement`` (first durable step), then its
        compute instance (second); return its MIG device. Raises MigError; when the second step
        fails the GPU instance is destroyed again first."""
        profiles = self._profiles(parent)
        known = profile_by_id(profiles, profile.profile_id)
        if known is None or known != profile:
            raise MigError(
                f"GPU {parent.uuid}: MIG profile {profile.name} (id {profile.profile_id}) is not "
                f"one of its profiles"
            )
        with self._locked():
            state = self._load()
            found = self._checked(state, parent, profiles)
            existing = [(inst.profile_id, inst.placement) for inst in found]
            problem = placement_problem(profiles, existing, profile.profile_id, placement)
            if problem is not None:
                raise MigError(
                    f"GPU {parent.uuid}: cannot create a {profile.name} instance: {problem}"
                )
            used = {inst.gpu_instance for inst in found}
            gi = next(i for i in range(1, MAX_GPU_INSTANCE_ID + 1) if i not in used)
            state.serial += 1
            created = Instance(gi, None, profile.profile_id, placement, state.serial)
            state.gpus[parent.uuid] = sorted([*found, created], key=lambda x: x.gpu_instance)
            self._write(state, f"creating GPU instance {gi} on GPU {parent.uuid}")
            self._between_steps()
            done = Instance(gi, 0, profile.profile_id, placement, created.serial)
            self._replace(state, parent.uuid, done)
            try:
                self._write(state, f"creating the compute instance of GPU instance {gi}")
            except MigError as exc:
                self._undo_create(state, parent.uuid, gi, exc)
        return self._device(parent, profiles, done)

    def destroy(self, parent: GpuInfo, gpu_instance: int) -> bool:
        """Remove the compute instance of GPU instance ``gpu_instance`` (first durable step),
        then the GPU instance (second); False when it did not exist. Raises MigError."""
        with self._locked():
            state = self._load()
            found = state.gpus.get(parent.uuid, [])
            inst = next((x for x in found if x.gpu_instance == gpu_instance), None)
            if inst is None:
                return False
            if inst.compute_instance is not None:
                self._replace(
                    state,
                    parent.uuid,
                    Instance(inst.gpu_instance, None, inst.profile_id, inst.placement, inst.serial),
                )
                self._write(
                    state, f"destroying the compute instance of GPU instance {gpu_instance}"
                )
                self._between_steps()
            state.gpus[parent.uuid] = [x for x in found if x.gpu_instance != gpu_instance]
            self._write(state, f"destroying GPU instance {gpu_instance} of GPU {parent.uuid}")
        return True

    # -- helpers ---------------------------------------------------------------------------

    def _between_steps(self) -> None:
        if self.step_seconds:
            time.sleep(self.step_seconds)

    def _profiles(self, parent: GpuInfo) -> tuple[MigProfile, ...]:
        if parent.mig is not None:
            raise MigError(f"{parent.uuid} is a MIG device, not a GPU")
        if not parent.mig_profiles:
            raise MigError(f"GPU {parent.uuid} has no MIG profiles (is it in MIG mode?)")
        return parent.mig_profiles

    def _checked(
        self, state: MockMigState, parent: GpuInfo, profiles: tuple[MigProfile, ...]
    ) -> list[Instance]:
        found = state.gpus.get(parent.uuid, [])
        try:
            check_layout(profiles, found, f"gpus[{parent.uuid}]")
        except ValueError as exc:
            raise MigError(f"mock MIG state file {self.state_file}: {exc}") from None
        return found

    @staticmethod
    def _replace(state: MockMigState, parent_uuid: str, inst: Instance) -> None:
        state.gpus[parent_uuid] = [
            inst if x.gpu_instance == inst.gpu_instance else x for x in state.gpus[parent_uuid]
        ]

    def _undo_create(
        self, state: MockMigState, parent_uuid: str, gi: int, cause: MigError
    ) -> NoReturn:
        state.gpus[parent_uuid] = [x for x in state.gpus[parent_uuid] if x.gpu_instance != gi]
        try:
            self._write(state, f"destroying GPU instance {gi} after a failed create")
        except MigError as again:
            raise MigError(
                f"{cause}; GPU instance {gi} is left without a compute instance ({again})"
            ) from None
        raise cause

    def _device(self, parent: GpuInfo, profiles: tuple[MigProfile, ...], inst: Instance) -> GpuInfo:
        profile = profile_by_id(profiles, inst.profile_id)
        if profile is None:  # excluded by check_layout
            raise MigError(f"GPU {parent.uuid}: unknown MIG profile id {inst.profile_id}")
        ci = -1 if inst.compute_instance is None else inst.compute_instance
        mig_uuid = (
            ""
            if inst.compute_instance is None
            else mock_dynamic_mig_uuid(self.node_name, parent.uuid, inst.gpu_instance, inst.serial)
        )
        return parent.mig_device(
            mig_uuid,
            profile.memory_mb * MIB,
            MigInfo(
                parent_uuid=parent.uuid,
                gpu_instance=inst.gpu_instance,
                compute_instance=ci,
                profile=profile.name,
                multiprocessors=profile.multiprocessors,
                gpu_slices=profile.slice_count,
                compute_slices=profile.slice_count,
                placement=inst.placement,
                profile_id=profile.profile_id,
            ),
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The thread lock, then an exclusive ``flock`` of the lock file (other processes)."""
        with self._lock:
            try:
                fsutil.make_private_dirs(self.state_file.parent)
                fd = os.open(
                    self._lock_file,
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    FILE_MODE,
                )
            except OSError as exc:
                reason = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
                raise MigError(f"cannot lock {self._lock_file}: {reason}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not self._temp_cleaned:
                    # Under the lock: no other partitioner is between mkstemp and rename.
                    with contextlib.suppress(OSError):
                        fsutil.remove_stale_temp_files(self.state_file.parent, self.state_file.name)
                    self._temp_cleaned = True
                yield
            finally:
                os.close(fd)

    def _load(self) -> MockMigState:
        """The file's state; a missing file is no instance. MigError for anything else."""
        where = f"mock MIG state file {self.state_file}"
        try:
            fd = os.open(
                self.state_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            )
        except FileNotFoundError:
            return MockMigState()
        except OSError as exc:
            reason = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise MigError(f"cannot read {where}: {reason}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise MigError(f"cannot read {where}: not a regular file")
            raw = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise MigError(f"cannot read {where}: {exc.strerror}") from None
        finally:
            os.close(fd)
        if len(raw) > MAX_FILE_BYTES:
            raise MigError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
        try:
            data = json.loads(
                raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant
            )
            return parse_state(data)
        except (ValueError, RecursionError) as exc:
            message = str(exc).replace("\n", " ") or type(exc).__name__
            raise MigError(f"{where}: {message}") from None

    def _write(self, state: MockMigState, doing: str) -> None:
        """Write ``state`` durably; MigError naming ``doing`` when the disk refuses."""
        try:
            fsutil.atomic_write(self.state_file, _dump(state), FILE_MODE)
        except OSError as exc:
            raise MigError(
                f"{doing}: cannot write mock MIG state file {self.state_file}: {exc.strerror}"
            ) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
