"""The plugin's crash-safe record of prepared claims: one versioned, checksummed JSON document in
a two-slot file (``<data dir>/checkpoint.dat``); docs/architecture.md ("The checkpoint") has the
document format, the format-1 compatibility and the file layout. Invariants:

- each device entry is one :class:`~kubeletplugin.devicerecord.DeviceRecord`; fields this
  version does not know are kept verbatim on rewrite and never fatal;
- a checksum mismatch, invalid JSON or a wrong shape makes the document corrupt; a different
  ``bootID`` at load makes every claim stale; a device entry that fails a check makes only its
  claim undecodable (the caller rolls it back);
- every write is durable (one ``pwrite`` and one ``fdatasync`` into the slot not in use); a torn
  write leaves the previous document; when neither slot holds a usable document the file is
  moved aside to ``checkpoint.dat.corrupt-<timestamp>``;
- a ``checkpoint.json`` of the single-file format is the newest record and is removed only after
  its document is in the two-slot file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from api.names import CORES_PER_GPU
from api.quantity import MAX_QUANTITY
from kubeletplugin.devicerecord import DeviceRecord, Enforcement
from kubeletplugin.fsutil import DEFAULT_BOOT_ID_FILE as DEFAULT_BOOT_ID_FILE
from kubeletplugin.fsutil import make_private_dirs, remove_durably, remove_stale_temp_files
from kubeletplugin.kubelet.preparer import is_claim_uid
from kubeletplugin.prepare.slotfile import SlotFile, SlotFileError
from kubeletplugin.sharing.strategies.base import SettingsError
from kubeletplugin.sharing.strategies.registry import DEFAULT_REGISTRY, StrategyRegistry

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2
CHECKPOINT_FILE = "checkpoint.dat"
#: The single-file format's name; read once, migrated and removed.
LEGACY_CHECKPOINT_FILE = "checkpoint.json"

STATE_STARTED = "PrepareStarted"
STATE_COMPLETED = "PrepareCompleted"
CLAIM_STATES = (STATE_STARTED, STATE_COMPLETED)

_DEVICE_KEYS = frozenset(
    {
        "requests",
        "pool",
        "device",
        "gpuUUID",
        "cores",
        "memory",
        "shareID",
        "partition",
        "adminAccess",
        "cdiName",
        "cdiDeviceIds",
        "migGpuInstance",
        "migComputeInstance",
        "migUUID",
        "enforcement",
    }
)
#: The largest GPU or compute instance id a record may hold (four digits: what the driver's
#: ``mig-minors`` file names).
MAX_MIG_INSTANCE_ID = 9999
#: What a recorded MIG UUID may look like (``MIG-<uuid>``, or ``MIG-GPU-<uuid>/<gi>/<ci>`` of
#: older drivers): it ends up in container environments, so no separators or whitespace.
MIG_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}$")
_CLAIM_KEYS = frozenset({"state", "namespace", "name", "devices", "sharing"})
_TOP_KEYS = frozenset({"version", "bootID", "checksum", "claims", "sharing"})


class CheckpointError(ValueError):
    """A checkpoint document (or one entry of it) that cannot be decoded."""


def device_to_json(d: DeviceRecord) -> dict[str, Any]:
    """The document entry of one device (see the module docstring)."""
    optional: dict[str, Any] = {}
    if d.mig_gpu_instance is not None:
        optional["migGpuInstance"] = d.mig_gpu_instance
    if d.mig_compute_instance is not None:
        optional["migComputeInstance"] = d.mig_compute_instance
    if d.mig_uuid is not None:
        optional["migUUID"] = d.mig_uuid
    if d.enforcement is not None:
        optional["enforcement"] = _enforcement_to_json(d.enforcement)
    return {
        **d.extra,
        **optional,
        "requests": list(d.requests),
        "pool": d.pool,
        "device": d.device,
        "gpuUUID": d.gpu_uuid,
        "cores": d.cores,
        "memory": d.memory,
        "shareID": d.share_id,
        "partition": d.partition,
        "adminAccess": d.admin_access,
        "cdiName": d.cdi_name,
        "cdiDeviceIds": list(d.cdi_device_ids),
    }


def device_from_json(
    raw: Any, where: str, strategies: StrategyRegistry = DEFAULT_REGISTRY
) -> DeviceRecord:
    """One device entry, every field checked (CheckpointError names the first that does not
    fit; an ``enforcement`` names a strategy of ``strategies``, which checks its setting); no
    GPU attached."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where} is not an object")
    try:
        record = DeviceRecord(
            requests=tuple(_str_list(raw["requests"], f"{where}.requests")),
            pool=_str(raw["pool"], f"{where}.pool"),
            device=_str(raw["device"], f"{where}.device"),
            gpu_uuid=_str(raw["gpuUUID"], f"{where}.gpuUUID"),
            cores=_int(raw["cores"], f"{where}.cores"),
            memory=_int(raw["memory"], f"{where}.memory"),
            cdi_name=_str(raw["cdiName"], f"{where}.cdiName"),
            cdi_device_ids=tuple(_str_list(raw["cdiDeviceIds"], f"{where}.cdiDeviceIds")),
            share_id=_opt_str(raw.get("shareID"), f"{where}.shareID"),
            partition=_opt_str(raw.get("partition"), f"{where}.partition"),
            admin_access=raw.get("adminAccess") is True,
            **_mig_fields(raw, where),
            extra={k: v for k, v in raw.items() if k not in _DEVICE_KEYS},
        )
    except KeyError as exc:
        raise CheckpointError(f"{where}: missing field {exc}") from exc
    enforcement = raw.get("enforcement")
    if enforcement is None:
        return record
    return replace(
        record,
        enforcement=_enforcement_from_json(
            enforcement, record, f"{where}.enforcement", _ENFORCEMENT_KEYS, strategies
        ),
    )


def _enforcement_to_json(e: Enforcement) -> dict[str, Any]:
    out: dict[str, Any] = {
        "strategy": e.strategy,
        "limitCores": e.limit_cores,
        "limitMemory": e.limit_memory,
    }
    if e.interval is not None:
        out["interval"] = e.interval
    return out


#: The JSON names of :class:`Enforcement`'s fields: in a device's ``enforcement`` (this format)
#: and in a format-1 grant.
_ENFORCEMENT_KEYS: Final = ("strategy", "limitCores", "limitMemory", "interval")
_GRANT_KEYS: Final = ("strategy", "limit_cores", "limit_memory", "interval")


def _enforcement_from_json(
    raw: Any,
    record: DeviceRecord,
    where: str,
    keys: tuple[str, str, str, str],
    strategies: StrategyRegistry,
) -> Enforcement:
    """An :class:`Enforcement` of ``record`` read from ``raw`` under the JSON names ``keys``
    (strategy, limit cores, limit memory, setting), checked against the registered strategies,
    the record's share and the strategy's own setting check (see the module docstring)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where} is not an object")
    strategy_key, cores_key, memory_key, interval_key = keys
    strategy = raw.get(strategy_key)
    if not isinstance(strategy, str) or strategy not in strategies:
        raise CheckpointError(
            f"{where}.{strategy_key} is {strategy!r}; known: {strategies.known()}"
        )
    if record.admin_access:
        raise CheckpointError(f"{where}: an adminAccess device is never enforced")
    limit_cores = _int(raw.get(cores_key), f"{where}.{cores_key}")
    if not 0 <= limit_cores <= CORES_PER_GPU:
        raise CheckpointError(
            f"{where}.{cores_key} {limit_cores} is outside 0..{CORES_PER_GPU} (the GPU's cores)"
        )
    limit_memory = _int(raw.get(memory_key), f"{where}.{memory_key}")
    if not 0 <= limit_memory <= MAX_QUANTITY:
        raise CheckpointError(
            f"{where}.{memory_key} {limit_memory} is outside 0..{MAX_QUANTITY} (a quantity's "
            "range; the state check bounds it by the GPU's memory)"
        )
    try:
        interval = strategies[strategy].setting_from_json(
            raw.get(interval_key), f"{where}.{interval_key}"
        )
    except SettingsError as exc:
        raise CheckpointError(str(exc)) from None
    return Enforcement(
        strategy=strategy, limit_cores=limit_cores, limit_memory=limit_memory, interval=interval
    )


def _with_format1_grants(
    devices: tuple[DeviceRecord, ...],
    sharing: Mapping[str, Any],
    where: str,
    strategies: StrategyRegistry,
) -> tuple[DeviceRecord, ...]:
    """Format 1: a claim's enforcement was its ``sharing.grants``, one grant per device that is
    not adminAccess, in device order. Each grant becomes its device's ``enforcement`` when it
    pairs with the device (same device, requests, cores and memory; GPU the device's, or its
    MIG device's) and passes the checks of this format; CheckpointError otherwise. A claim
    without grants (none were recorded) keeps its devices undecided."""
    grants = sharing.get("grants")
    if grants is None:
        return devices
    at = f"{where}.sharing.grants"
    if not isinstance(grants, list):
        raise CheckpointError(f"{at} is not a list")
    enforced = [i for i, d in enumerate(devices) if not d.admin_access]
    if len(grants) != len(enforced):
        raise CheckpointError(
            f"{at} has {len(grants)} entries for {len(enforced)} devices without adminAccess"
        )
    out = list(devices)
    for n, (i, grant) in enumerate(zip(enforced, grants, strict=True)):
        d = devices[i]
        if not isinstance(grant, dict):
            raise CheckpointError(f"{at}[{n}] is not an object")
        expected = {
            "device": d.device,
            "requests": list(d.requests),
            "cores": d.cores,
            "memory": d.memory,
        }
        for key, value in expected.items():
            if grant.get(key) != value:
                raise CheckpointError(
                    f"{at}[{n}].{key} is {grant.get(key)!r}, not devices[{i}]'s {value!r}"
                )
        if grant.get("gpu_uuid") not in {d.gpu_uuid, d.mig_uuid} - {None}:
            raise CheckpointError(
                f"{at}[{n}].gpu_uuid {grant.get('gpu_uuid')!r} is not devices[{i}]'s GPU"
            )
        out[i] = replace(
            d, enforcement=_enforcement_from_json(grant, d, f"{at}[{n}]", _GRANT_KEYS, strategies)
        )
    return tuple(out)


def format1_sharing(devices: tuple[DeviceRecord, ...]) -> dict[str, Any]:
    """The claim's ``sharing`` as format 1 wrote it, derived from the devices' ``enforcement``,
    so that a plugin downgraded to format 1 resumes the same strategies. Written only when every
    device without adminAccess is decided (format 1 wrote all grants or none); never read back
    while the devices carry ``enforcement``."""
    enforced = [d for d in devices if not d.admin_access]
    if not enforced or any(d.enforcement is None for d in enforced):
        return {}
    grants = []
    for d in enforced:
        e = d.enforcement
        assert e is not None
        grants.append(
            {
                "gpu_uuid": d.mig_uuid or d.gpu_uuid,
                "device": d.device,
                "requests": list(d.requests),
                "strategy": e.strategy,
                "cores": d.cores,
                "memory": d.memory,
                "limit_cores": e.limit_cores,
                "limit_memory": e.limit_memory,
                "interval": e.interval,
            }
        )
    return {"grants": grants}


def _mig_fields(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The MIG instance fields of a device entry, checked (see the module docstring)."""
    out: dict[str, Any] = {}
    for key, attr in (
        ("migGpuInstance", "mig_gpu_instance"),
        ("migComputeInstance", "mig_compute_instance"),
    ):
        value = raw.get(key)
        if value is None:
            continue
        number = _int(value, f"{where}.{key}")
        if not 0 <= number <= MAX_MIG_INSTANCE_ID:
            raise CheckpointError(f"{where}.{key} {number} is outside 0..{MAX_MIG_INSTANCE_ID}")
        out[attr] = number
    if "mig_compute_instance" in out and "mig_gpu_instance" not in out:
        raise CheckpointError(f"{where}.migComputeInstance is set without migGpuInstance")
    uuid = raw.get("migUUID")
    if uuid is not None:
        text = _str(uuid, f"{where}.migUUID")
        if not MIG_UUID_RE.match(text):
            raise CheckpointError(
                f"{where}.migUUID {text[:64]!r} is not a MIG UUID (letters, digits and "
                "/_.:- only, at most 128 characters)"
            )
        out["mig_uuid"] = text
    return out


@dataclass(frozen=True)
class ClaimRecord:
    """One claim in the checkpoint. Immutable: state changes replace the record."""

    uid: str
    namespace: str
    name: str
    state: str
    devices: tuple[DeviceRecord, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def canonical_json(self) -> bytes:
        """:func:`canonical_json` of :meth:`to_json` (computed once: the record is immutable)."""
        return canonical_json(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {
            **self.extra,
            "state": self.state,
            "namespace": self.namespace,
            "name": self.name,
            "devices": [device_to_json(d) for d in self.devices],
            "sharing": format1_sharing(self.devices),
        }

    @classmethod
    def from_json(
        cls, uid: str, raw: Any, strategies: StrategyRegistry = DEFAULT_REGISTRY
    ) -> ClaimRecord:
        """The record of claim ``uid`` read back from ``raw``; the devices' enforcements name
        strategies of ``strategies``."""
        where = f"claims[{uid}]"
        if not is_claim_uid(uid):
            raise CheckpointError(f"claims[{uid!r}]: the key is not a claim UID")
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where} is not an object")
        state = raw.get("state")
        if state not in CLAIM_STATES:
            raise CheckpointError(f"{where}.state is {state!r}; known: {', '.join(CLAIM_STATES)}")
        devices = raw.get("devices")
        if not isinstance(devices, list):
            raise CheckpointError(f"{where}.devices is not a list")
        records = tuple(
            device_from_json(d, f"{where}.devices[{i}]", strategies) for i, d in enumerate(devices)
        )
        sharing = raw.get("sharing") or {}
        if not isinstance(sharing, dict):
            raise CheckpointError(f"{where}.sharing is not an object")
        if sharing and all(d.enforcement is None for d in records):
            records = _with_format1_grants(records, sharing, where, strategies)
        return cls(
            uid=uid,
            namespace=_str(raw.get("namespace"), f"{where}.namespace"),
            name=_str(raw.get("name"), f"{where}.name"),
            state=state,
            devices=records,
            extra={k: v for k, v in raw.items() if k not in _CLAIM_KEYS},
        )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CheckpointError(f"{where} must be a string")
    return value


def _opt_str(value: Any, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{where} must be an integer")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{where} must be a list of strings")
    return value


def canonical_json(doc: Any) -> bytes:
    """The byte form the checksum covers: sorted keys, no insignificant whitespace."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum_of(doc: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``doc`` without its ``checksum`` field."""
    payload = {k: v for k, v in doc.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(canonical_json(payload)).hexdigest()


def decode_document(raw: bytes) -> dict[str, Any]:
    """The checkpoint document in ``raw``, with its checksum, version and the shape of its
    ``claims`` and ``sharing`` checked (entries are decoded later, one by one); CheckpointError
    names the first problem."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointError("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise CheckpointError("the document is not a JSON object")
    try:
        matches = doc.get("checksum") == checksum_of(doc)
    except RecursionError:
        raise CheckpointError("JSON nested too deeply") from None
    if not matches:
        raise CheckpointError("checksum mismatch")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"version is {version!r}, expected a positive integer")
    if not isinstance(doc.get("claims") or {}, dict):
        raise CheckpointError("claims is not an object")
    if not isinstance(doc.get("sharing") or {}, dict):
        raise CheckpointError("sharing is not an object")
    return doc


def read_boot_id(path: Path) -> str:
    """The kernel boot ID, or "" where the file does not exist (then reboots go undetected)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError as exc:
        log.warning("cannot read boot ID from %s (%s); reboots will not be detected", path, exc)
        return ""


#: How a load went, for logs and tests.
LOAD_FRESH = "fresh"
LOAD_OK = "loaded"
LOAD_REBOOTED = "rebooted"
LOAD_CORRUPT = "corrupt"


@dataclass
class Loaded:
    """What :meth:`Checkpoint.load` found.

    ``claims`` holds the decodable entries; ``bad_claims`` maps the UIDs of entries that could not
    be decoded to the problem (their claims must be rolled back); ``sharing`` is the enforcer's
    state, None when it is unusable (first start, reboot, corrupt file).
    """

    status: str
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    bad_claims: dict[str, str] = field(default_factory=dict)
    sharing: dict[str, Any] | None = None
    #: Claims recorded before a reboot (their CDI files must go).
    stale_claim_uids: tuple[str, ...] = ()
    #: Where a corrupt file was moved to.
    moved_to: Path | None = None


class Checkpoint:
    """Reads and writes ``<data_dir>/checkpoint.dat`` (and migrates ``checkpoint.json``); not
    thread-safe (callers serialize)."""

    def __init__(
        self,
        data_dir: Path,
        boot_id_file: Path = DEFAULT_BOOT_ID_FILE,
        *,
        strategies: StrategyRegistry = DEFAULT_REGISTRY,
    ) -> None:
        """``strategies``: the strategies a recorded enforcement may name (the enforcer's)."""
        self.strategies = strategies
        self.path = data_dir / CHECKPOINT_FILE
        self.legacy_path = data_dir / LEGACY_CHECKPOINT_FILE
        self.boot_id = read_boot_id(boot_id_file)
        self._extra: dict[str, Any] = {}
        self._slots = SlotFile(self.path, mode=0o600)

    def load(self) -> Loaded:
        """Load the newest document. Never raises for a missing, corrupt or newer file: a
        corrupt or unreadable one is moved aside (see the module invariants). Raises OSError
        only where the data dir cannot be made, or the migration of ``checkpoint.json`` cannot
        write."""
        directory = self.path.parent
        make_private_dirs(directory)
        for name in (self.path.name, self.legacy_path.name):
            remove_stale_temp_files(directory, name)
        migrated = self._migrate()
        if migrated is not None:
            return migrated
        try:
            found = self._slots.open()
        except (OSError, SlotFileError) as exc:
            return self._corrupt(self.path, f"unreadable: {exc}")
        if found is None:
            return Loaded(status=LOAD_FRESH)
        problems = list(found.problems)
        for slot in found.valid:
            try:
                doc = decode_document(slot.body)
            except CheckpointError as exc:
                problems.append(f"slot {slot.index} (sequence {slot.seq}): {exc}")
                continue
            if problems:
                log.warning(
                    "checkpoint %s: %s; loaded slot %d (sequence %d)",
                    self.path,
                    "; ".join(problems),
                    slot.index,
                    slot.seq,
                )
            self._slots.use(slot.index)
            return self._loaded(doc)
        return self._corrupt(self.path, "; ".join(problems) or "no slot holds a document")

    def _migrate(self) -> Loaded | None:
        """Move a ``checkpoint.json`` into the two-slot file (see the module invariants); None
        when there is none."""
        try:
            raw = self.legacy_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._corrupt_legacy(f"unreadable: {exc}")
        try:
            doc = decode_document(raw)
        except CheckpointError as exc:
            return self._corrupt_legacy(str(exc))
        self._slots.close()
        self._slots.replace(raw)
        remove_durably(self.legacy_path)
        log.info("moved checkpoint %s into %s", self.legacy_path, self.path)
        return self._loaded(doc)

    def _corrupt_legacy(self, problem: str) -> Loaded:
        """A corrupt ``checkpoint.json``: moved aside, and the two-slot file (older than it) is
        removed, so that only the state the caller rebuilds is ever loaded again."""
        loaded = self._corrupt(self.legacy_path, problem)
        self._slots.close()
        if remove_durably(self.path):
            log.warning(
                "removed %s, which is older than the corrupt %s", self.path, self.legacy_path
            )
        return loaded

    def _loaded(self, doc: dict[str, Any]) -> Loaded:
        """The claims of a decoded document, unless the node rebooted since it was written."""
        version = doc["version"]
        claims_raw: dict[str, Any] = doc.get("claims") or {}
        if version > CHECKPOINT_VERSION:
            log.info(
                "checkpoint %s has format version %d (this plugin writes %d); "
                "unknown fields are kept",
                self.path,
                version,
                CHECKPOINT_VERSION,
            )
        self._extra = {k: v for k, v in doc.items() if k not in _TOP_KEYS}
        boot_id = doc.get("bootID", "")
        if boot_id and self.boot_id and boot_id != self.boot_id:
            log.info(
                "node rebooted since the checkpoint was written (boot ID %s, now %s): "
                "dropping %d recorded claims",
                boot_id,
                self.boot_id,
                len(claims_raw),
            )
            return Loaded(status=LOAD_REBOOTED, stale_claim_uids=tuple(sorted(claims_raw)))
        loaded = Loaded(status=LOAD_OK, sharing=doc.get("sharing") or {})
        for uid, entry in claims_raw.items():
            try:
                loaded.claims[uid] = ClaimRecord.from_json(uid, entry, self.strategies)
            except CheckpointError as exc:
                loaded.bad_claims[uid] = str(exc)
        return loaded

    def _corrupt(self, path: Path, problem: str) -> Loaded:
        """Move the corrupt file ``path`` aside to ``<name>.corrupt-<timestamp>``."""
        if path == self.path:
            self._slots.close()
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(path, aside)
        except OSError as exc:
            log.error(
                "checkpoint %s is corrupt (%s) and cannot be moved aside: %s", path, problem, exc
            )
            return Loaded(status=LOAD_CORRUPT)
        log.error("checkpoint %s is corrupt (%s); moved it to %s", path, problem, aside)
        return Loaded(status=LOAD_CORRUPT, moved_to=aside)

    def serialize(self, claims: Mapping[str, ClaimRecord], sharing: Mapping[str, Any]) -> bytes:
        """The bytes :meth:`write` stores: the canonical JSON of the document, ``checksum``
        first. Each claim's canonical JSON is computed once per record (records are immutable),
        so a write costs little more than joining bytes."""
        top: dict[str, Any] = {
            **self._extra,
            "version": CHECKPOINT_VERSION,
            "bootID": self.boot_id,
            "sharing": dict(sharing),
        }
        claims_json = (
            b"{"
            + b",".join(
                canonical_json(uid) + b":" + rec.canonical_json
                for uid, rec in sorted(claims.items())
            )
            + b"}"
        )
        payload = (
            b"{"
            + b",".join(
                canonical_json(key)
                + b":"
                + (claims_json if key == "claims" else canonical_json(top[key]))
                for key in sorted({*top, "claims"})
            )
            + b"}"
        )
        checksum = "sha256:" + hashlib.sha256(payload).hexdigest()
        return b'{"checksum":' + canonical_json(checksum) + b"," + payload[1:] + b"\n"

    def write(self, claims: Mapping[str, ClaimRecord], sharing: Mapping[str, Any]) -> None:
        """Durably replace the document with ``claims`` and ``sharing`` (one pwrite and one
        fdatasync; the slow way for the first document and one that outgrows its slot). On
        OSError the previous document stays the one a load finds."""
        data = self.serialize(claims, sharing)
        if self._slots.slot_size == 0:
            make_private_dirs(self.path.parent)
        self._slots.write(data)

    def close(self) -> None:
        """Close the file (a later write opens it again)."""
        self._slots.close()
