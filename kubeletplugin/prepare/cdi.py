"""Transient per-claim CDI specs: building, versioning, writing, reading back, deleting.
docs/sharing.md ("The container's environment") documents the variables. Invariants:

- one spec file per prepared claim, ``<cdi-dir>/k8s.<driver>-claim_<claimUID>.json``, kind
  ``k8s.<driver>/claim``; one CDI device per allocated device (share), named
  ``<claimUID>-<device>[-<shareID>]``, unique across claims;
- the file name and the ``SHAREGPU_*`` variables carry all the plugin needs to rebuild its
  state when the checkpoint is lost (no ``annotations``: they need cdiVersion 0.6.0, which
  podman 4.x rejects);
- set variables (``NVIDIA_VISIBLE_DEVICES`` in :func:`cuda_order`, the lists, claim and request)
  are identical in every device of a request, so any merge order of a request's devices gives
  the same value; device variables describe the one device whose edits carry them;
- ``NVIDIA_VISIBLE_DEVICES`` is per request, never the whole claim's; a device serving several
  requests (adminAccess) carries the devices common to all of them;
- a MIG device (static, or dynamic once prepare created it: :attr:`SpecDevice.gpu`) is the GPU
  its container sees: its MIG UUID, whole compute and memory, the parent's device node and the
  capability nodes of its instances (:mod:`kubeletplugin.devices.migcaps`); capability nodes
  that cannot be named fail the prepare;
- ``cdiVersion`` is the lowest version the content needs (:func:`minimum_cdi_version`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from api import names
from kubeletplugin.containeredits import ContainerEdits, DeviceNode, cuda_order, given_together
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.devices.migcaps import MigCaps
from kubeletplugin.devices.procdevices import DEFAULT_PROC_ROOT, ProcDevices
from kubeletplugin.devices.uvm import uvm_device_nodes
from kubeletplugin.fsutil import (
    atomic_write,
    read_bounded,
    remove_if_present,
    remove_stale_temp_files,
)
from kubeletplugin.kubelet.preparer import is_claim_uid
from kubeletplugin.model import GpuInfo

log = logging.getLogger(__name__)

# --- Environment variables every CDI device of a claim sets (the container-side contract) ---
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: ``<namespace>/<name>`` of the claim.
ENV_CLAIM = "SHAREGPU_CLAIM"
ENV_CLAIM_UID = "SHAREGPU_CLAIM_UID"
#: Base request name (``req`` for ``req/sub``); several names are joined with ``,``.
ENV_REQUEST = "SHAREGPU_REQUEST"
#: Device name in the ResourceSlice (``gpu-0``, ``gpu-0-half-1``).
ENV_DEVICE = "SHAREGPU_DEVICE"
ENV_GPU_UUID = "SHAREGPU_GPU_UUID"
#: The scheduler's shareID; set only for consumable-capacity shares.
ENV_SHARE_ID = "SHAREGPU_SHARE_ID"
#: Percentage of the GPU's compute reserved for this device (1-100).
ENV_CORES = "SHAREGPU_CORES"
#: GPU memory reserved for this device, in bytes.
ENV_MEMORY = "SHAREGPU_MEMORY"
#: Partition profile (``half``, ...) for partition devices; unset otherwise.
ENV_PARTITION = "SHAREGPU_PARTITION"
#: ``true`` when the allocation has adminAccess; unset otherwise.
ENV_ADMIN_ACCESS = "SHAREGPU_ADMIN_ACCESS"
#: Device names of every device the container got with this request, comma-separated.
ENV_DEVICES = "SHAREGPU_DEVICES"
#: GPU UUID of each device in ``SHAREGPU_DEVICES`` (same order; a GPU repeats if it holds two).
ENV_GPU_UUIDS = "SHAREGPU_GPU_UUIDS"
#: ``SHAREGPU_CORES`` of each device in ``SHAREGPU_DEVICES`` (same order).
ENV_CORES_LIST = "SHAREGPU_CORES_LIST"
#: ``SHAREGPU_MEMORY`` of each device in ``SHAREGPU_DEVICES`` (same order).
ENV_MEMORY_LIST = "SHAREGPU_MEMORY_LIST"
#: MIG profile (``1g.10gb``) of a MIG device; unset otherwise.
ENV_MIG_PROFILE = "SHAREGPU_MIG_PROFILE"
#: UUID of the physical GPU a MIG device lives on; unset otherwise.
ENV_MIG_PARENT_UUID = "SHAREGPU_MIG_PARENT_UUID"

#: The control node every container with a GPU needs besides ``nvidia<minor>`` (and the UVM
#: nodes of :mod:`kubeletplugin.devices.uvm`).
CONTROL_DEVICE_NODE = "nvidiactl"

_DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
#: A CDI kind ``vendor/class``: vendor letters, digits, ``_.-``; class letters, digits, ``_-``;
#: each starting with a letter and ending with a letter or digit (the chart's schema agrees).
CDI_KIND_PATTERN = r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$"


def is_cdi_kind(text: str) -> bool:
    """Whether ``text`` is a CDI kind (:data:`CDI_KIND_PATTERN`)."""
    return re.fullmatch(CDI_KIND_PATTERN, text) is not None


# --- Versions ----------------------------------------------------------------------------------

#: The oldest cdiVersion runtimes accept.
OLDEST_CDI_VERSION = "0.3.0"


def _edits_of(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    edits = [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    edits.append(spec.get("containerEdits") or {})
    return edits


def _needs_1_1_0(spec: Mapping[str, Any]) -> bool:
    for e in _edits_of(spec):
        rdt = e.get("intelRdt") or {}
        if e.get("netDevices") or "schemata" in rdt or "enableMonitoring" in rdt:
            return True
    return False


def _needs_0_7_0(spec: Mapping[str, Any]) -> bool:
    return any("intelRdt" in e or e.get("additionalGids") for e in _edits_of(spec))


def _needs_0_6_0(spec: Mapping[str, Any]) -> bool:
    if spec.get("annotations"):
        return True
    if any(d.get("annotations") for d in spec.get("devices") or []):
        return True
    kind = str(spec.get("kind", ""))
    return "/" in kind and "." in kind.split("/", 1)[1]


def _needs_0_5_0(spec: Mapping[str, Any]) -> bool:
    for d in spec.get("devices") or []:
        name = str(d.get("name", ""))
        if name and not name[0].isalpha():
            return True
    return any(n.get("hostPath") for e in _edits_of(spec) for n in e.get("deviceNodes") or [])


def _needs_0_4_0(spec: Mapping[str, Any]) -> bool:
    return any(m.get("type") for e in _edits_of(spec) for m in e.get("mounts") or [])


#: What each CDI version added to the spec format, newest first (CDI's specs-go/version.go).
_VERSION_RULES = (
    ("1.1.0", _needs_1_1_0),
    ("0.7.0", _needs_0_7_0),
    ("0.6.0", _needs_0_6_0),
    ("0.5.0", _needs_0_5_0),
    ("0.4.0", _needs_0_4_0),
)


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` that allows every feature ``spec`` uses (``cdiVersion`` itself
    is ignored).

    Deterministic and side-effect free: newer runtimes accept any listed version; older ones
    (podman 4.x: <= 0.5.0) reject files that claim a version they do not know.
    """
    for version, needs in _VERSION_RULES:
        if needs(spec):
            return version
    return OLDEST_CDI_VERSION


# --- Names -------------------------------------------------------------------------------------


def spec_file_name(driver_name: str, claim_uid: str) -> str:
    """``k8s.<driver>-claim_<claimUID>.json`` (CDI's transient-spec naming)."""
    return f"{names.cdi_vendor(driver_name)}-claim_{claim_uid}.json"


def spec_file_prefix(driver_name: str) -> str:
    """Common prefix of every claim spec file of this driver."""
    return f"{names.cdi_vendor(driver_name)}-claim_"


def cdi_device_name(claim_uid: str, device: str, share_id: str | None) -> str:
    """CDI device name of one allocated device (share) of a claim; a valid CDI device name."""
    name = f"{claim_uid}-{device}" + (f"-{share_id}" if share_id else "")
    if not _DEVICE_NAME_RE.match(name):
        raise ValueError(f"invalid CDI device name {name!r}")
    return name


def qualified_id(kind: str, device_name: str) -> str:
    """Fully qualified CDI device ID ``vendor/class=name``."""
    return f"{kind}={device_name}"


# --- What goes into a spec ---------------------------------------------------------------------


@dataclass(frozen=True)
class SpecDevice:
    """One CDI device of a claim: its record (with its GPU attached), plus what the spec needs
    besides."""

    record: DeviceRecord
    claim_namespace: str
    claim_name: str
    claim_uid: str
    #: Extra edits from share enforcement (MPS, limits), applied after the base edits.
    extra_edits: ContainerEdits = field(default_factory=ContainerEdits)

    @property
    def name(self) -> str:
        return self.record.cdi_name

    @property
    def gpu(self) -> GpuInfo:
        """The device's GPU (its minor number names the device node ``/dev/nvidia<minor>``)."""
        return self.record.gpu

    def env(self, together: Sequence[SpecDevice]) -> tuple[str, ...]:
        """This device's variables; ``together``: the devices a container given this one also
        gets, itself included (:func:`given_together`), which the set variables describe."""
        r = self.record
        gpus = cuda_order(d.gpu for d in together)
        rank = {g.uuid: i for i, g in enumerate(gpus)}
        ordered = sorted(together, key=lambda d: (rank[d.gpu.uuid], d.name))
        env = [
            f"{ENV_VISIBLE_DEVICES}={','.join(g.uuid for g in gpus)}",
            f"{ENV_CLAIM}={self.claim_namespace}/{self.claim_name}",
            f"{ENV_CLAIM_UID}={self.claim_uid}",
            f"{ENV_REQUEST}={','.join(r.base_requests)}",
            f"{ENV_DEVICE}={r.device}",
            f"{ENV_GPU_UUID}={self.gpu.uuid}",
            f"{ENV_CORES}={r.cores}",
            f"{ENV_MEMORY}={r.memory}",
            f"{ENV_DEVICES}={','.join(d.record.device for d in ordered)}",
            f"{ENV_GPU_UUIDS}={','.join(d.gpu.uuid for d in ordered)}",
            f"{ENV_CORES_LIST}={','.join(str(d.record.cores) for d in ordered)}",
            f"{ENV_MEMORY_LIST}={','.join(str(d.record.memory) for d in ordered)}",
        ]
        if r.share_id:
            env.append(f"{ENV_SHARE_ID}={r.share_id}")
        if r.partition:
            env.append(f"{ENV_PARTITION}={r.partition}")
        if r.admin_access:
            env.append(f"{ENV_ADMIN_ACCESS}=true")
        mig = self.gpu.mig
        if mig is not None:
            env.append(f"{ENV_MIG_PROFILE}={mig.profile}")
            env.append(f"{ENV_MIG_PARENT_UUID}={mig.parent_uuid}")
        return tuple(env)


@dataclass(frozen=True)
class RecoveredSpec:
    """A claim spec found on disk, decoded from its file name and environment. ``devices`` are
    checkpoint records whose ``cdi_device_ids`` hold only this spec's own IDs."""

    claim_uid: str
    namespace: str
    name: str
    path: Path
    devices: tuple[DeviceRecord, ...]


class CdiSpecError(Exception):
    """A claim spec on disk that cannot be decoded."""


# --- The NVIDIA Container Toolkit's spec -------------------------------------------------------


class NvidiaCdiDetector:
    """Finds the NVIDIA Container Toolkit's CDI device (kind ``nvidia.com/gpu`` by default) of a
    GPU, so its ID can be returned as well (the runtime then injects the driver libraries).

    The device named by the GPU's UUID is preferred (``--device-name-strategy=uuid``); a spec
    generated with the default index names gives the device named by the NVML index. An ID is
    returned only when such a device exists: an ID the runtime cannot resolve fails the
    container.

    Spec directories are scanned on every lookup (the toolkit may be installed after the plugin
    starts); files are parsed again only when their size or mtime changed, and what is
    remembered about a file is dropped once it is gone. Files whose names start with one of
    ``skip_prefixes`` (this driver's own claim specs, which come and go with every claim in
    ``/var/run/cdi``) are never looked at.
    """

    def __init__(
        self, kind: str, spec_dirs: Sequence[Path], skip_prefixes: Sequence[str] = ()
    ) -> None:
        self.kind = kind
        self.spec_dirs = tuple(spec_dirs)
        self.skip_prefixes = tuple(skip_prefixes)
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[int, int], frozenset[str] | None]] = {}
        self._warned = False

    def device_ids(self, gpu_uuid: str, gpu_index: int | None) -> tuple[str, ...]:
        """``(<kind>=<uuid>,)`` or ``(<kind>=<index>,)`` if such a device exists on the host,
        else ``()``. ``gpu_index`` None looks for the UUID only (a MIG device, which the
        toolkit names by UUID or ``<parent index>:<MIG index>``, never by the parent's index)."""
        candidates = [gpu_uuid] + ([] if gpu_index is None else [str(gpu_index)])
        with self._lock:
            found_kind, names_found = self._scan()
            for name in candidates:
                if name in names_found:
                    return (qualified_id(self.kind, name),)
            if found_kind and not self._warned:
                self._warned = True
                log.warning(
                    "CDI spec of kind %s has no device named %s; the driver libraries "
                    "will not be injected",
                    self.kind,
                    " or ".join(candidates),
                )
        return ()

    def spec_found(self) -> bool:
        """True when a spec of this kind with at least one device is on the host now."""
        with self._lock:
            _found_kind, names_found = self._scan()
        return bool(names_found)

    def _scan(self) -> tuple[bool, set[str]]:
        """(a spec of this kind exists, the device names of all such specs); call locked."""
        names_found: set[str] = set()
        found_kind = False
        files = self._spec_files()
        for path in files:
            devices = self._devices_of(path)
            if devices is not None:
                found_kind = True
                names_found |= devices
        # Forget files that are gone (transient claim specs come and go in /var/run/cdi).
        for gone in self._cache.keys() - set(files):
            del self._cache[gone]
        return found_kind, names_found

    def _spec_files(self) -> list[Path]:
        files: list[Path] = []
        for directory in self.spec_dirs:
            try:
                entries = sorted(directory.iterdir())
            except OSError:
                continue
            files.extend(
                p
                for p in entries
                if p.suffix in (".json", ".yaml", ".yml")
                and not p.name.startswith(self.skip_prefixes)
            )
        return files

    def _devices_of(self, path: Path) -> frozenset[str] | None:
        """Device names of ``path`` if it is a spec of our kind, else None."""
        try:
            st = path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        devices: frozenset[str] | None = None
        try:
            text = path.read_text(encoding="utf-8")
            if self.kind in text:
                doc = yaml.safe_load(text)
                if isinstance(doc, dict) and doc.get("kind") == self.kind:
                    devices = frozenset(
                        str(d.get("name")) for d in doc.get("devices") or [] if isinstance(d, dict)
                    )
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            log.warning("cannot read CDI spec %s: %s", path, exc)
        self._cache[path] = (stamp, devices)
        return devices


# --- Writer ------------------------------------------------------------------------------------


class CdiSpecWriter:
    """Writes, reads back and deletes this driver's claim specs in ``cdi_dir``.

    ``dev_root``: where the GPU device nodes live on the host (``/dev`` with the NVML backend);
    ``None`` adds no device nodes (the mock backend). ``proc_root``: the procfs the device
    numbers of the UVM and MIG capability nodes are read from (``/proc``; used only with a
    ``dev_root``). An absent GPU or control node is skipped with a warning, an absent UVM node
    goes in by its numbers (:mod:`~kubeletplugin.devices.uvm`), and the capability nodes of a
    MIG device always go in by their numbers (:mod:`~kubeletplugin.devices.migcaps`).
    """

    def __init__(
        self,
        cdi_dir: Path,
        driver_name: str,
        dev_root: Path | None = None,
        nvidia: NvidiaCdiDetector | None = None,
        proc_root: Path = DEFAULT_PROC_ROOT,
    ) -> None:
        self.cdi_dir = cdi_dir
        self.driver_name = driver_name
        self.kind = names.cdi_kind(driver_name)
        self.dev_root = dev_root
        self.nvidia = nvidia
        self.proc_devices = ProcDevices(proc_root)
        self.mig_caps = MigCaps(proc_root)

    def ensure_dir(self) -> None:
        """Create the CDI directory if needed and remove temporary files of interrupted writes."""
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        for path in remove_stale_temp_files(self.cdi_dir, spec_file_prefix(self.driver_name)):
            log.info("removed temporary file of an interrupted CDI write: %s", path)

    def path_for(self, claim_uid: str) -> Path:
        """The claim's spec file: always directly inside ``cdi_dir`` (ValueError for a UID that
        is not one; the gRPC layer refuses those before they get here)."""
        if not is_claim_uid(claim_uid):
            raise ValueError(f"refusing a spec path for the claim UID {claim_uid!r}")
        return self.cdi_dir / spec_file_name(self.driver_name, claim_uid)

    def cdi_ids(self, name: str, gpu: GpuInfo | None) -> tuple[str, ...]:
        """IDs to return to kubelet for CDI device ``name`` on ``gpu``: the toolkit's when
        available (``gpu`` None: a GPU the node no longer has), then ours, always last.

        Order matters: the CDI library collects the edits of the IDs in the order given (a
        spec's top-level edits with its first device) and applies their ``env`` entries in that
        order, a later entry replacing an earlier one of the same name. The toolkit's spec sets
        ``NVIDIA_VISIBLE_DEVICES=void`` in its top-level edits (so its hook does not inject a
        second time); with our ID last, our ``NVIDIA_VISIBLE_DEVICES`` (the claim's GPUs) wins."""
        ours = qualified_id(self.kind, name)
        extra = (
            self.nvidia.device_ids(gpu.uuid, None if gpu.mig else gpu.index)
            if self.nvidia and gpu
            else ()
        )
        return (*extra, ours)

    def _device_nodes(self, gpu: GpuInfo) -> tuple[DeviceNode, ...]:
        """``/dev/nvidia<minor>`` of the (parent) GPU, the control node, the UVM nodes and, for
        a MIG device, its two capability nodes (:class:`~kubeletplugin.devices.migcaps.
        MigCapsError`, an OSError naming the file and the entry, when they cannot be named)."""
        if self.dev_root is None:
            return ()
        nodes: list[DeviceNode] = []
        for name in (f"nvidia{gpu.minor}", CONTROL_DEVICE_NODE):
            host = self.dev_root / name
            if not host.exists():
                log.warning("device node %s is absent on the host; not adding it", host)
                continue
            nodes.append(DeviceNode(path=f"/dev/{name}", host_path=str(host)))
        nodes += uvm_device_nodes(self.dev_root, self.proc_devices)
        if gpu.mig is not None:
            mig = gpu.mig
            nodes += self.mig_caps.device_nodes(gpu.minor, mig.gpu_instance, mig.compute_instance)
        return tuple(nodes)

    def build(self, devices: Sequence[SpecDevice]) -> dict[str, Any]:
        """The spec document for one claim's devices (``cdiVersion`` computed from content)."""
        if not devices:
            raise ValueError("a CDI spec needs at least one device")
        together = given_together([d.record.requests for d in devices])
        spec: dict[str, Any] = {
            "kind": self.kind,
            "devices": [
                {
                    "name": d.name,
                    "containerEdits": ContainerEdits(
                        env=d.env([devices[j] for j in together[i]]),
                        device_nodes=self._device_nodes(d.gpu),
                    )
                    .merged(d.extra_edits)
                    .to_json(),
                }
                for i, d in enumerate(devices)
            ],
        }
        return {"cdiVersion": minimum_cdi_version(spec), **spec}

    def render(self, devices: Sequence[SpecDevice]) -> bytes:
        """The bytes of the spec file of one claim's devices (the same devices always give the
        same bytes)."""
        return json.dumps(self.build(devices), indent=2).encode() + b"\n"

    def write(self, claim_uid: str, devices: Sequence[SpecDevice]) -> Path:
        """Atomically write the claim's spec (a reader sees the old file or the whole new one),
        without fsync: the checkpoint is the durable record, and :meth:`restore` at start puts
        back a spec that a power loss took; returns its path."""
        path = self.path_for(claim_uid)
        atomic_write(path, self.render(devices), durable=False)
        return path

    def restore(self, claim_uid: str, devices: Sequence[SpecDevice]) -> bool:
        """Make the claim's spec file hold exactly what :meth:`write` writes for ``devices``,
        rewriting it when it is missing or differs (truncated, damaged, a link); returns
        whether it was rewritten. OSError when it cannot be."""
        path = self.path_for(claim_uid)
        data = self.render(devices)
        try:
            if read_bounded(path, len(data) + 1) == data:
                return False
        except OSError:
            pass  # missing or not a plain file: rewritten
        atomic_write(path, data, durable=False)
        return True

    def remove(self, claim_uid: str) -> bool:
        """Delete the claim's spec if present (no fsync: a spec a power loss brings back has
        no record, and the next start removes it); returns whether it existed. A string that
        is no claim UID has no spec (none is ever written for it): nothing is touched."""
        if not is_claim_uid(claim_uid):
            return False
        return remove_if_present(self.path_for(claim_uid))

    def _claim_spec_files(self) -> list[tuple[str, Path]]:
        """(UID, path) of every file named like a claim spec of this driver, by UID."""
        prefix = spec_file_prefix(self.driver_name)
        try:
            entries = list(self.cdi_dir.iterdir())
        except FileNotFoundError:
            return []
        return sorted(
            (p.name[len(prefix) : -len(".json")], p)
            for p in entries
            if p.name.startswith(prefix) and p.name.endswith(".json")
        )

    def list_claim_uids(self) -> list[str]:
        """UIDs of every claim spec of this driver in the directory (files whose name holds no
        claim UID are not claim specs of ours)."""
        return [uid for uid, _ in self._claim_spec_files() if is_claim_uid(uid)]

    def read_claim_specs(self, pool: str) -> tuple[list[RecoveredSpec], list[tuple[Path, str]]]:
        """Decode every claim spec of this driver on disk (devices of ``pool``); returns
        (specs, [(path, problem)])."""
        specs: list[RecoveredSpec] = []
        problems: list[tuple[Path, str]] = []
        for uid, path in self._claim_spec_files():
            if not is_claim_uid(uid):
                problems.append((path, f"{uid!r} in the file name is not a claim UID"))
                continue
            try:
                doc = json.loads(path.read_bytes())
                specs.append(decode_spec(uid, path, doc, self.kind, pool))
            except (OSError, ValueError, CdiSpecError) as exc:
                problems.append((path, str(exc)))
        return specs, problems


def _env_map(entries: Iterable[Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            key, value = entry.split("=", 1)
            env[key] = value
    return env


def decode_spec(claim_uid: str, path: Path, doc: Any, kind: str, pool: str) -> RecoveredSpec:
    """Read a claim spec written by :class:`CdiSpecWriter` back into :class:`RecoveredSpec`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise CdiSpecError(f"{path}: not a CDI spec with a devices list")
    claims: set[str] = set()
    devices: list[DeviceRecord] = []
    for i, d in enumerate(doc["devices"]):
        env = _env_map(((d or {}).get("containerEdits") or {}).get("env") or [])
        try:
            if env[ENV_CLAIM_UID] != claim_uid:
                raise CdiSpecError(f"{path}: devices[{i}] belongs to claim {env[ENV_CLAIM_UID]}")
            claims.add(env[ENV_CLAIM])
            name = str(d["name"])
            devices.append(
                DeviceRecord(
                    requests=tuple(r for r in env[ENV_REQUEST].split(",") if r),
                    pool=pool,
                    device=env[ENV_DEVICE],
                    gpu_uuid=env[ENV_GPU_UUID],
                    cores=int(env[ENV_CORES]),
                    memory=int(env[ENV_MEMORY]),
                    cdi_name=name,
                    cdi_device_ids=(qualified_id(kind, name),),
                    share_id=env.get(ENV_SHARE_ID) or None,
                    partition=env.get(ENV_PARTITION) or None,
                    admin_access=env.get(ENV_ADMIN_ACCESS) == "true",
                )
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CdiSpecError(f"{path}: devices[{i}] lacks or garbles {exc}") from exc
    if not devices:
        raise CdiSpecError(f"{path}: no devices")
    if len(claims) != 1 or "/" not in next(iter(claims)):
        raise CdiSpecError(f"{path}: {ENV_CLAIM} must name one <namespace>/<name>, got {claims}")
    namespace, name = next(iter(claims)).split("/", 1)
    return RecoveredSpec(
        claim_uid=claim_uid, namespace=namespace, name=name, path=path, devices=tuple(devices)
    )
