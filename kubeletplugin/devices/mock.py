"""A mock GPU backend for tests, demos and clusters without GPUs.

By default it reports ``count`` GPUs that look like an NVIDIA H100 80GB HBM3 in a two-socket
server: the first half of the GPUs on PCIe root ``pci0000:00`` / NUMA node 0, the second half on
``pci0000:80`` / NUMA node 1, all on one NVSwitch board (NVLink domain
:data:`~kubeletplugin.devices.nvlink.NVSWITCH_DOMAIN`, an HGX H100). UUIDs are derived from the
node name and index (uuid5), so they are stable across restarts of the plugin on the same node
and differ between nodes.

``config_file`` replaces the defaults with a YAML list of GPUs; each entry may set any
:class:`~kubeletplugin.devices.backend.GpuInfo` field (snake_case or camelCase keys); fields it
leaves out
take the default H100 value for that index. ``nvlinkDomain`` models the NVLink topology: GPUs
with the same value are NVLink-connected, ``null`` means no NVLink (a PCIe board with NVLink
bridges in pairs gives each pair a value of its own, docs/configuration.md).

MIG: an entry may list ``migDevices`` (which puts the GPU in MIG mode), each a mapping with
``profile`` (``1g.10gb``) and ``gpuInstance`` (required), and ``computeInstance`` (default 0),
``uuid`` (default: stable per node, GPU and instances), ``memory`` (bytes or a quantity; default
the profile's GB figure in decimal gigabytes) and ``multiprocessors`` (default 16 per compute
slice); ``migPending: true`` models a MIG mode change that waits for a GPU reset.

Dynamic MIG: a GPU in MIG mode (``migMode: Enabled``, or ``migDevices``) gets the MIG profiles
of its product from :mod:`kubeletplugin.devices.migtables` (``mig_profiles``, derived like
``mig``: a config entry cannot set it); a MIG-enabled entry whose product has no reference table
is a config error. ``MockBackend(..., mig_enabled=True)`` puts the default GPUs in MIG mode.
The MIG instances dynamic MIG creates live in the file of a
:class:`~kubeletplugin.devices.mockmig.MockMigPartitioner`, not in the config.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from pathlib import Path
from typing import Any, Final

import yaml

from api import names
from api.quantity import QuantityError, quantity_int
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mig import MIG_ENABLED, instance_key, parse_profile
from kubeletplugin.devices.migtables import (
    H100_80GB_PRODUCT,
    REFERENCE_MEMORY_TOTAL,
    REFERENCE_TABLES,
    reference_profiles,
)
from kubeletplugin.devices.nvlink import NVSWITCH_DOMAIN, domain_problem
from kubeletplugin.model import GpuInfo, MigInfo, MigProfile

MIB: Final = 1024 * 1024
#: What NVML reports for an H100 80GB HBM3.
H100_PRODUCT_NAME: Final = H100_80GB_PRODUCT
H100_MEMORY_TOTAL: Final = REFERENCE_MEMORY_TOTAL[H100_PRODUCT_NAME]
#: Memory reserved by the driver and firmware (NVML memory info v2 ``reserved``).
H100_MEMORY_RESERVED: Final = 527 * MIB
DEFAULT_DRIVER_VERSION: Final = "580.95.05"
DEFAULT_CUDA_DRIVER_VERSION: Final = "13.0"
#: Largest number of mock GPUs; keeps the generated PCI bus IDs distinct and valid.
MAX_MOCK_GPUS: Final = 128
#: Namespace of the mock UUIDs (uuid5 of the node name and index under it).
MOCK_UUID_NAMESPACE: Final = uuid.UUID("6f1d3c2e-5a0b-4c8e-9d47-2b1e0f6a9c31")
_H100_PROFILES: Final = reference_profiles(H100_PRODUCT_NAME) or ()

_FIELDS: Final = {f.name: f for f in dataclasses.fields(GpuInfo)}
_INT_FIELDS: Final = {"index", "minor"}
_BYTES_FIELDS: Final = {"memory_total", "memory_reserved", "memory_usable"}
_OPTIONAL_INT_FIELDS: Final = {"numa_node"}
_OPTIONAL_STR_FIELDS: Final = {"pcie_root", "mig_mode", "nvlink_domain"}
_BOOL_FIELDS: Final = {"mig_pending"}
#: Fields a config entry cannot set (derived: ``mig`` is set on MIG devices only;
#: ``mig_profiles`` comes from the product's reference table).
_DERIVED_FIELDS: Final = {"mig", "mig_profiles"}
#: Keys of one ``migDevices`` entry -> whether it is required.
_MIG_KEYS: Final = {
    "profile": True,
    "gpuInstance": True,
    "computeInstance": False,
    "uuid": False,
    "memory": False,
    "multiprocessors": False,
}
#: Default streaming multiprocessors per compute slice of a mock MIG device.
MOCK_MULTIPROCESSORS_PER_SLICE: Final = 16
#: Largest GPU or compute instance id a mock MIG device may have.
MAX_MOCK_INSTANCE_ID: Final = 64


def mock_uuid(node_name: str, index: int) -> str:
    """Stable GPU UUID for GPU ``index`` of ``node_name``: ``GPU-xxxxxxxx-xxxx-...``."""
    return f"GPU-{uuid.uuid5(MOCK_UUID_NAMESPACE, f'{node_name}/{index}')}"


def mock_mig_uuid(node_name: str, index: int, gpu_instance: int, compute_instance: int) -> str:
    """Stable MIG UUID of a mock MIG device: ``MIG-xxxxxxxx-xxxx-...``."""
    key = f"{node_name}/{index}/mig/{gpu_instance}/{compute_instance}"
    return f"MIG-{uuid.uuid5(MOCK_UUID_NAMESPACE, key)}"


def default_gpu(node_name: str, index: int, count: int, mig_enabled: bool = False) -> GpuInfo:
    """The default mock GPU ``index`` of ``count`` on ``node_name`` (an H100 80GB HBM3); with
    ``mig_enabled`` in MIG mode with the H100's MIG profiles and no MIG device."""
    half = (count + 1) // 2
    socket, position = (0, index) if index < half else (1, index - half)
    bus = (0x10 if socket == 0 else 0x90) + position
    return GpuInfo(
        index=index,
        minor=index,
        uuid=mock_uuid(node_name, index),
        product_name=H100_PRODUCT_NAME,
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        driver_version=DEFAULT_DRIVER_VERSION,
        cuda_driver_version=DEFAULT_CUDA_DRIVER_VERSION,
        pci_bus_id=f"0000:{bus:02x}:00.0",
        memory_total=H100_MEMORY_TOTAL,
        memory_reserved=H100_MEMORY_RESERVED,
        memory_usable=H100_MEMORY_TOTAL - H100_MEMORY_RESERVED,
        pcie_root="pci0000:00" if socket == 0 else "pci0000:80",
        numa_node=socket,
        nvlink_domain=NVSWITCH_DOMAIN,
        memory_info_version="v2",
        mig_mode=MIG_ENABLED if mig_enabled else "Disabled",
        mig_profiles=_H100_PROFILES if mig_enabled else (),
    )


def _profiles(where: str, gpu: GpuInfo) -> tuple[MigProfile, ...]:
    """The MIG profiles of mock GPU ``gpu`` (its product's reference table) when it is in MIG
    mode, else none; DiscoveryError for a MIG-enabled product without a table or with less
    memory than its largest profile needs."""
    if gpu.mig_mode != MIG_ENABLED:
        return ()
    profiles = reference_profiles(gpu.product_name)
    if profiles is None:
        known = ", ".join(repr(p) for p in REFERENCE_TABLES)
        raise DiscoveryError(
            f"{where}: migMode {MIG_ENABLED!r} needs a product with MIG profiles; "
            f"{gpu.product_name!r} has none (products with profiles: {known})"
        )
    largest = max(profiles, key=lambda p: p.memory_mb)
    if largest.memory_mb * MIB > gpu.memory_total:
        raise DiscoveryError(
            f"{where}: memory_total {gpu.memory_total} bytes is less than the "
            f"{largest.memory_mb} MiB of MIG profile {largest.name} of {gpu.product_name!r}"
        )
    return profiles


def _snake(key: str) -> str:
    """``cudaComputeCapability`` -> ``cuda_compute_capability``; snake_case keys unchanged."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _convert(where: str, name: str, value: Any) -> Any:
    """Check and convert one config value for GpuInfo field ``name`` (``mig_devices`` stays
    the raw list; :func:`mig_devices_from_entries` builds them once the parent is known)."""
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise DiscoveryError(f"{where}: field {name!r} must be true or false, got {value!r}")
        return value
    if name == "mig_devices":
        if not isinstance(value, list) or not value:
            raise DiscoveryError(f"{where}: field 'migDevices' must be a non-empty list")
        return value
    if name in _INT_FIELDS or (name in _OPTIONAL_INT_FIELDS and value is not None):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DiscoveryError(f"{where}: field {name!r} must be an integer, got {value!r}")
        return value
    if name in _BYTES_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise DiscoveryError(
                f"{where}: field {name!r} must be bytes or a quantity such as '80Gi', got {value!r}"
            )
        try:
            return quantity_int(value)
        except QuantityError as exc:
            raise DiscoveryError(f"{where}: field {name!r}: {exc}") from None
    if name == "notes":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DiscoveryError(f"{where}: field 'notes' must be a list of strings")
        return tuple(value)
    if name in _OPTIONAL_STR_FIELDS | _OPTIONAL_INT_FIELDS and value is None:
        return None
    if not isinstance(value, str):
        raise DiscoveryError(
            f"{where}: field {name!r} must be a string (quote numbers such as versions in "
            f"YAML), got {value!r}"
        )
    if name == "nvlink_domain":
        problem = domain_problem(value)
        if problem is not None:
            raise DiscoveryError(f"{where}: field 'nvlinkDomain' {problem}")
    return value


def gpu_from_entry(node_name: str, position: int, count: int, entry: Any) -> GpuInfo:
    """Build a GpuInfo from config entry number ``position`` (0-based) of ``count``."""
    where = f"mock GPU entry {position}"
    if not isinstance(entry, dict):
        raise DiscoveryError(f"{where}: expected a mapping of GPU fields, got {entry!r}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        name = _snake(str(key))
        if name not in _FIELDS or name in _DERIVED_FIELDS:
            allowed = ", ".join(sorted(set(_FIELDS) - _DERIVED_FIELDS))
            raise DiscoveryError(f"{where}: unknown field {key!r} (allowed: {allowed})")
        if name in values:
            raise DiscoveryError(f"{where}: field {key!r} given twice")
        values[name] = _convert(where, name, value)
    index = values.get("index", position)
    base = {f: getattr(default_gpu(node_name, index, count), f) for f in _FIELDS}
    raw_migs = values.pop("mig_devices", None)
    if raw_migs is not None:
        mode = values.setdefault("mig_mode", MIG_ENABLED)
        if mode != MIG_ENABLED:
            raise DiscoveryError(f"{where}: migDevices needs migMode {MIG_ENABLED!r}, not {mode!r}")
    base.update(values)
    if "memory_usable" not in values:
        base["memory_usable"] = base["memory_total"] - base["memory_reserved"]
    elif base["memory_usable"] != base["memory_total"] - base["memory_reserved"]:
        raise DiscoveryError(
            f"{where}: memory_usable must equal memory_total - memory_reserved "
            f"({base['memory_total']} - {base['memory_reserved']})"
        )
    if base["memory_usable"] <= 0:
        raise DiscoveryError(f"{where}: usable memory must be positive")
    gpu = GpuInfo(**base)
    gpu = dataclasses.replace(gpu, mig_profiles=_profiles(where, gpu))
    if raw_migs is None:
        return gpu
    return dataclasses.replace(
        gpu, mig_devices=mig_devices_from_entries(node_name, gpu, raw_migs, where)
    )


def _mig_int(where: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DiscoveryError(f"{where}: {key!r} must be an integer from {low} to {high}")
    return value


def mig_device_from_entry(node_name: str, parent: GpuInfo, entry: Any, where: str) -> GpuInfo:
    """One mock MIG device of ``parent`` from a ``migDevices`` entry (see the module doc)."""
    if not isinstance(entry, dict):
        raise DiscoveryError(f"{where}: expected a mapping of MIG device fields, got {entry!r}")
    unknown = sorted(str(k) for k in entry if k not in _MIG_KEYS)
    if unknown:
        allowed = ", ".join(_MIG_KEYS)
        raise DiscoveryError(f"{where}: unknown field {unknown[0]!r} (allowed: {allowed})")
    for key, required in _MIG_KEYS.items():
        if required and key not in entry:
            raise DiscoveryError(f"{where}: field {key!r} is required")
    profile = entry["profile"]
    if not isinstance(profile, str):
        raise DiscoveryError(f"{where}: 'profile' must be a string such as '1g.10gb'")
    try:
        gpu_slices, compute_slices, memory_gb = parse_profile(profile)
    except ValueError as exc:
        raise DiscoveryError(f"{where}: {exc}") from None
    gi = _mig_int(where, "gpuInstance", entry["gpuInstance"], 0, MAX_MOCK_INSTANCE_ID)
    ci = _mig_int(
        where, "computeInstance", entry.get("computeInstance", 0), 0, MAX_MOCK_INSTANCE_ID
    )
    multiprocessors = _mig_int(
        where,
        "multiprocessors",
        entry.get("multiprocessors", MOCK_MULTIPROCESSORS_PER_SLICE * compute_slices),
        1,
        1024,
    )
    raw_memory = entry.get("memory", memory_gb * 1000**3)
    if isinstance(raw_memory, bool) or not isinstance(raw_memory, int | str):
        raise DiscoveryError(f"{where}: 'memory' must be bytes or a quantity such as '10Gi'")
    try:
        memory = quantity_int(raw_memory)
    except QuantityError as exc:
        raise DiscoveryError(f"{where}: 'memory': {exc}") from None
    if not 0 < memory <= parent.memory_usable:
        raise DiscoveryError(
            f"{where}: 'memory' must be positive and at most the GPU's usable memory "
            f"({parent.memory_usable} bytes)"
        )
    mig_uuid = entry.get("uuid", mock_mig_uuid(node_name, parent.index, gi, ci))
    if not isinstance(mig_uuid, str) or not mig_uuid.startswith("MIG-"):
        raise DiscoveryError(f"{where}: 'uuid' must be a string starting with 'MIG-'")
    return parent.mig_device(
        mig_uuid,
        memory,
        MigInfo(
            parent_uuid=parent.uuid,
            gpu_instance=gi,
            compute_instance=ci,
            profile=profile,
            multiprocessors=multiprocessors,
            gpu_slices=gpu_slices,
            compute_slices=compute_slices,
        ),
    )


def mig_devices_from_entries(
    node_name: str, parent: GpuInfo, entries: list[Any], where: str
) -> tuple[GpuInfo, ...]:
    """The mock MIG devices of ``parent``, ordered by (GPU instance, compute instance); each
    (GPU instance, compute instance) pair and UUID at most once."""
    devices = [
        mig_device_from_entry(node_name, parent, entry, f"{where}, MIG device {i}")
        for i, entry in enumerate(entries)
    ]
    seen: set[object] = set()
    for device in devices:
        for key in (instance_key(device), device.uuid):
            if key in seen:
                raise DiscoveryError(f"{where}: MIG device {key!r} is listed twice")
            seen.add(key)
    return tuple(sorted(devices, key=instance_key))


def load_mock_config(node_name: str, path: Path) -> list[GpuInfo]:
    """Read a YAML list of GPUs; raise :class:`DiscoveryError` naming the entry and field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise DiscoveryError(f"cannot read mock config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise DiscoveryError(
            f"mock config {path} is not valid YAML: {exc}".replace("\n", " ")
        ) from None
    if not isinstance(data, list) or not data:
        raise DiscoveryError(f"mock config {path} must be a non-empty YAML list of GPUs")
    gpus = [gpu_from_entry(node_name, i, len(data), entry) for i, entry in enumerate(data)]
    for what, key in (("index", "index"), ("UUID", "uuid"), ("PCI bus ID", "pci_bus_id")):
        seen: set[object] = set()
        for gpu in gpus:
            value = getattr(gpu, key)
            if value in seen:
                raise DiscoveryError(f"mock config {path}: duplicate GPU {what} {value!r}")
            seen.add(value)
    return sorted(gpus, key=lambda g: g.index)


class MockBackend:
    """Reports default H100-like GPUs (in MIG mode with ``mig_enabled``), or the GPUs of a YAML
    config file (``mig_enabled`` does not apply to those: their entries say)."""

    name = names.MOCK_BACKEND

    def __init__(
        self,
        node_name: str,
        count: int = 8,
        config_file: Path | None = None,
        mig_enabled: bool = False,
    ) -> None:
        if config_file is None and not 1 <= count <= MAX_MOCK_GPUS:
            raise DiscoveryError(f"--mock-gpus must be between 1 and {MAX_MOCK_GPUS}, got {count}")
        self.node_name = node_name
        self.count = count
        self.config_file = config_file
        self.mig_enabled = mig_enabled

    def discover(self) -> list[GpuInfo]:
        """The mock GPUs, ordered by index."""
        if self.config_file is not None:
            return load_mock_config(self.node_name, self.config_file)
        return [
            default_gpu(self.node_name, i, self.count, self.mig_enabled) for i in range(self.count)
        ]
