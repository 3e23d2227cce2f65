"""GPU discovery through NVML (the ``pynvml`` module of nvidia-ml-py).

Invariants: every NVML session opened is closed, also on errors; an expected failure is one
:class:`~kubeletplugin.devices.backend.DiscoveryError` naming the cause; a GPU or MIG device NVML
cannot describe is left out with one warning (never published with made-up attributes) and
discovery fails only when no GPU can be described; the NUMA node comes from sysfs (NVML's is the
memory's node on Grace systems); functions older drivers or ``pynvml`` lack degrade to a
documented default; on a GPU in MIG mode with no change pending the existing MIG devices
(:meth:`NvmlBackend._mig_devices`) and the creatable profiles with their placements
(:meth:`NvmlBackend.mig_profiles`; empty with one warning on an error) are read, a pending change
gives ``mig_pending``; every count and size NVML returns is bounded (:data:`MAX_NVML_COUNT`,
:data:`MAX_MEMORY_SLICES`) before it is used."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from api import names
from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.devices.mig import MIG_DISABLED, MIG_ENABLED, instance_key, profile_name
from kubeletplugin.devices.nvlink import NvLinkView, nvlink_domains
from kubeletplugin.model import GpuInfo, MigInfo, MigPlacement, MigProfile

log = logging.getLogger(__name__)

#: NVML brand enum (``nvmlBrandType_t``) -> name. Values follow nvml.h.
BRAND_NAMES: Final[dict[int, str]] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
    17: "NvidiaDLA",
    18: "NvidiaVGameDev",
    19: "NvidiaNPU",
}

#: NVML architecture enum (``nvmlDeviceArchitecture_t``) -> name. Values follow nvml.h.
ARCHITECTURE_NAMES: Final[dict[int, str]] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    11: "DLA",
    12: "DLA2",
    13: "Rubin",
    15: "NPU3",
}

UNKNOWN: Final = "Unknown"

#: Where sysfs lives; tests point this at a temporary directory.
DEFAULT_SYSFS_ROOT: Final = Path("/sys")

#: Note recorded when NVML memory info v2 is unavailable.
MEMORY_V1_NOTE: Final = (
    "NVML memory info v2 is not available (old driver): reserved memory is unknown and "
    "counted as 0, so the published memory may exceed what applications can allocate"
)


#: The most items (profiles, placements, instances, MIG device slots) one NVML listing may
#: report; a larger count is treated as a malformed answer.
MAX_NVML_COUNT: Final = 64

#: The most memory slices a placement may reach into (8 on A100/H100).
MAX_MEMORY_SLICES: Final = 32

#: The largest slice count of a GPU-instance profile (8ths of a GPU).
MAX_PROFILE_SLICES: Final = 8

#: The most NVLinks read per GPU (NVML_NVLINK_MAX_LINKS is 18 or 36, by pynvml version).
MAX_NVLINKS: Final = 64
#: ``nvmlNvLinkDeviceType_t`` values (nvml.h).
NVLINK_DEVICE_TYPE_GPU: Final = 0x00
NVLINK_DEVICE_TYPE_SWITCH: Final = 0x02
NVLINK_DEVICE_TYPE_UNKNOWN: Final = 0xFF
#: ``NVML_GPU_FABRIC_STATE_COMPLETED``: the GPU's fabric registration is done.
NVML_GPU_FABRIC_STATE_COMPLETED: Final = 3

# nvml.h values used when a pynvml module lacks the constant.
NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_INSUFFICIENT_RESOURCES: Final = 23
NVML_GPU_INSTANCE_PROFILE_COUNT: Final = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_COUNT: Final = 0x9
#: ``NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1`` and ``..._2_SLICE_REV1``: the media-extension
#: profiles (``+me``).
MEDIA_EXTENSION_PROFILE_INDEXES: Final = frozenset({0x7, 0x8})

#: A profile name as NVML's profile info names it (after ``MIG ``) that is safe in a device
#: name: ``1g.10gb``, ``1g.10gb+me``, ``1g.24gb-me``.
_PROFILE_NAME_RE: Final = re.compile(r"^[1-8]g\.[1-9][0-9]{0,3}gb([+-][a-z]{1,8}){0,2}$")


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code of a ``pynvml.NVMLError`` (its ``value``), or None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bounded_count(what: str, value: Any, limit: int = MAX_NVML_COUNT) -> int:
    """``value`` as an int in ``0..limit``; ValueError naming ``what`` otherwise."""
    count = int(value)
    if not 0 <= count <= limit:
        raise ValueError(f"NVML reports {count} {what} (at most {limit} expected)")
    return count


def mig_profile_name(raw: str | bytes, index: int, slices: int, parent_total: int, mb: int) -> str:
    """The profile name of GPU-instance profile ``index``: NVML's own (``MIG 1g.10gb+me`` ->
    ``1g.10gb+me``) when it gives one of the expected form, else derived from the slice count
    and memory (:func:`~kubeletplugin.devices.mig.profile_name`, ``+me`` for the
    media-extension profile indexes). ValueError when neither works."""
    text = _text(raw).strip().removeprefix("MIG ").strip()
    if _PROFILE_NAME_RE.match(text):
        return text
    derived = profile_name(slices, slices, parent_total, mb)
    return derived + "+me" if index in MEDIA_EXTENSION_PROFILE_INDEXES else derived


def normalize_pci_bus_id(raw: str | bytes) -> str:
    """Return the bus ID in the ``0000:3b:00.0`` form (4-digit domain, lowercase).

    NVML reports ``00000000:3B:00.0`` (8-digit domain); Kubernetes' ``pciBusID`` attribute uses
    the Linux sysfs form. Raises :class:`ValueError` for anything else.
    """
    text = _text(raw).strip().lower()
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        numbers = (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        raise ValueError(f"PCI bus ID {text!r} is not of the form DDDD:BB:DD.F") from None
    if numbers[0] > 0xFFFF or numbers[1] > 0xFF or numbers[2] > 0x1F or numbers[3] > 0x7:
        raise ValueError(f"PCI bus ID {text!r} is out of range")
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*numbers)


def cuda_version_string(encoded: int) -> str:
    """NVML's CUDA driver version integer (``12080``) as ``"12.8"``."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def pcie_root_from_sysfs(sysfs_root: Path, pci_bus_id: str) -> str | None:
    """The PCIe root complex of a device (``pci0000:00``), or None when sysfs does not show it.

    ``/sys/bus/pci/devices/<bus id>`` links to ``/sys/devices/pci<domain>:<bus>/.../<bus id>``;
    the first ``pci*`` component below ``devices`` is the root.
    """
    link = sysfs_root / "bus" / "pci" / "devices" / pci_bus_id
    if not link.exists():
        return None
    for part in Path(os.path.realpath(link)).parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def numa_node_file(sysfs_root: Path, pci_bus_id: str) -> int | None:
    """The raw ``/sys/bus/pci/devices/<bus id>/numa_node`` value (``-1``: the kernel knows of no
    NUMA affinity); None when the file is absent or unreadable. ``pci_bus_id`` must be in the
    sysfs form (:func:`normalize_pci_bus_id`: lower case, 4-digit domain)."""
    path = sysfs_root / "bus" / "pci" / "devices" / pci_bus_id / "numa_node"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _text(value: str | bytes) -> str:
    """pynvml returns ``bytes`` in old versions and ``str`` in new ones."""
    return value.decode() if isinstance(value, bytes) else value


class _Missing(Exception):
    """Internal: an optional NVML function is absent or not supported."""


class NvmlBackend:
    """Discovers GPUs with NVML.

    ``nvml`` is the ``pynvml`` module; by default it is imported when :meth:`discover` runs, so
    this class can be constructed on machines without the library. ``sysfs_root`` is where PCIe
    root and NUMA information are looked up.
    """

    name = names.NVML_BACKEND

    def __init__(self, nvml: ModuleType | None = None, sysfs_root: Path | None = None) -> None:
        self._nvml = nvml
        self._sysfs_root = sysfs_root if sysfs_root is not None else DEFAULT_SYSFS_ROOT

    # --- shared with the MIG partitioner (kubeletplugin.devices.nvmlmig) -------------------

    def module(self) -> ModuleType:
        """The pynvml module (imported on first use); DiscoveryError when it is missing."""
        return self._module()

    def nvml_error(self) -> type[BaseException]:
        """``pynvml.NVMLError`` (an exception class nothing raises when the module lacks it)."""
        return self._nvml_error()

    @contextmanager
    def session(self) -> Iterator[ModuleType]:
        """An NVML session: ``nvmlInit`` (DiscoveryError naming the cause when it fails) and
        ``nvmlShutdown`` on leaving, also on errors. NVML counts its sessions, so sessions of
        several threads may overlap."""
        self._init()
        try:
            yield self._module()
        finally:
            try:
                self._module().nvmlShutdown()
            except Exception as exc:
                log.warning("nvmlShutdown failed: %s", exc)

    # --- error handling -------------------------------------------------------------------

    def _module(self) -> ModuleType:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise DiscoveryError(
                    f"the pynvml module (package nvidia-ml-py) is not installed: {exc}"
                ) from None
        return self._nvml

    def _error_class(self, name: str) -> type[BaseException] | None:
        cls = getattr(self._module(), name, None)
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None

    def _is_missing(self, exc: BaseException) -> bool:
        """True for errors that mean "this driver cannot answer this question"."""
        if isinstance(exc, AttributeError | TypeError):
            return True
        for name in ("NVMLError_FunctionNotFound", "NVMLError_NotSupported"):
            cls = self._error_class(name)
            if cls is not None and isinstance(exc, cls):
                return True
        return False

    def _nvml_error(self) -> type[BaseException]:
        cls = self._error_class("NVMLError")
        return cls if cls is not None else _NeverRaised

    def _call(self, what: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a required NVML function; NVML errors become a :class:`DiscoveryError`."""
        fn: Callable[..., Any] | None = getattr(self._module(), fn_name, None)
        if fn is None:
            raise DiscoveryError(f"NVML function {fn_name} is missing (pynvml too old?)")
        try:
            return fn(*args, **kwargs)
        except self._nvml_error() as exc:
            raise DiscoveryError(f"NVML error while reading {what} ({fn_name}): {exc}") from None

    def _optional(self, what: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call an NVML function that old drivers may lack; raise :class:`_Missing` then."""
        fn: Callable[..., Any] | None = getattr(self._module(), fn_name, None)
        if fn is None:
            raise _Missing(fn_name)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if self._is_missing(exc):
                log.debug("NVML cannot report %s (%s): %s", what, fn_name, exc)
                raise _Missing(fn_name) from None
            if isinstance(exc, self._nvml_error()):
                raise DiscoveryError(
                    f"NVML error while reading {what} ({fn_name}): {exc}"
                ) from None
            raise

    # --- discovery ------------------------------------------------------------------------

    def _init(self) -> None:
        nvml = self._module()
        try:
            nvml.nvmlInit()
        except Exception as exc:
            for name, cause in (
                ("NVMLError_LibraryNotFound", "the NVML library (libnvidia-ml.so.1) was not found"),
                ("NVMLError_DriverNotLoaded", "the NVIDIA kernel driver is not loaded"),
                ("NVMLError_NoPermission", "no permission to access the NVIDIA devices"),
            ):
                cls = self._error_class(name)
                if cls is not None and isinstance(exc, cls):
                    raise DiscoveryError(f"cannot initialise NVML: {cause}") from None
            if isinstance(exc, self._nvml_error()):
                raise DiscoveryError(f"cannot initialise NVML: {exc}") from None
            raise

    def discover(self) -> list[GpuInfo]:
        """Return every GPU NVML can describe, in NVML index order.

        A GPU that fails is left out with one warning line; :class:`DiscoveryError` is raised
        when NVML cannot start, reports no GPU, or no GPU can be described."""
        self._init()
        try:
            count = int(self._call("the device count", "nvmlDeviceGetCount"))
            if count == 0:
                raise DiscoveryError("NVML reports no NVIDIA GPUs on this node")
            system = self._system_info()
            found: list[GpuInfo] = []
            failures: list[str] = []
            for index in range(count):
                try:
                    found.append(self._device(index, *system))
                except DiscoveryError as exc:
                    log.warning("GPU %d left out (not published): %s", index, exc)
                    failures.append(str(exc))
            if not found:
                raise DiscoveryError(
                    f"NVML reports {count} GPU(s) but none could be read; first error: "
                    f"{failures[0]}"
                )
            return self._with_nvlink_domains(found)
        finally:
            try:
                self._module().nvmlShutdown()
            except Exception as exc:
                log.warning("nvmlShutdown failed: %s", exc)

    def _system_info(self) -> tuple[str, str]:
        driver = _text(self._call("the driver version", "nvmlSystemGetDriverVersion"))
        try:
            cuda = cuda_version_string(
                int(self._optional("the CUDA version", "nvmlSystemGetCudaDriverVersion_v2"))
            )
        except _Missing:
            try:
                cuda = cuda_version_string(
                    int(self._optional("the CUDA version", "nvmlSystemGetCudaDriverVersion"))
                )
            except _Missing:
                raise DiscoveryError("NVML cannot report the CUDA driver version") from None
        return driver, cuda

    def _device(self, index: int, driver_version: str, cuda_version: str) -> GpuInfo:
        handle = self._call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
        notes: list[str] = []
        uuid = _text(self._call(f"the UUID of GPU {index}", "nvmlDeviceGetUUID", handle))
        name = _text(self._call(f"the name of GPU {index}", "nvmlDeviceGetName", handle))
        minor = int(
            self._call(f"the minor number of GPU {index}", "nvmlDeviceGetMinorNumber", handle)
        )
        pci = self._call(f"the PCI info of GPU {index}", "nvmlDeviceGetPciInfo", handle)
        try:
            bus_id = normalize_pci_bus_id(pci.busId)
        except ValueError as exc:
            raise DiscoveryError(f"GPU {index}: {exc}") from None

        try:
            brand = BRAND_NAMES.get(
                int(self._optional("the brand", "nvmlDeviceGetBrand", handle)), UNKNOWN
            )
        except _Missing:
            brand = UNKNOWN
        try:
            arch = ARCHITECTURE_NAMES.get(
                int(self._optional("the architecture", "nvmlDeviceGetArchitecture", handle)),
                UNKNOWN,
            )
        except _Missing:
            arch = UNKNOWN
        try:
            major, minor_cc = self._optional(
                "the compute capability", "nvmlDeviceGetCudaComputeCapability", handle
            )
            compute = f"{int(major)}.{int(minor_cc)}"
        except _Missing:
            raise DiscoveryError(
                f"NVML cannot report the compute capability of GPU {index}"
            ) from None

        total, reserved, memory_version = self._memory(f"GPU {index}", handle)
        if memory_version == "v1":
            notes.append(MEMORY_V1_NOTE)
        if total - reserved <= 0:
            raise DiscoveryError(
                f"GPU {index}: NVML reports no usable memory (total {total}, reserved {reserved})"
            )

        numa = self._numa_node(index, handle, bus_id)
        mig_mode, mig_pending = self._mig_mode(handle)

        gpu = GpuInfo(
            index=index,
            minor=minor,
            uuid=uuid,
            product_name=name,
            brand=brand,
            architecture=arch,
            cuda_compute_capability=compute,
            driver_version=driver_version,
            cuda_driver_version=cuda_version,
            pci_bus_id=bus_id,
            memory_total=total,
            memory_reserved=reserved,
            memory_usable=total - reserved,
            pcie_root=pcie_root_from_sysfs(self._sysfs_root, bus_id),
            numa_node=numa,
            memory_info_version=memory_version,
            mig_mode=mig_mode,
            mig_pending=mig_pending,
            notes=tuple(notes),
        )
        if mig_mode != MIG_ENABLED or mig_pending:
            return gpu
        return dataclasses.replace(
            gpu,
            mig_devices=self._mig_devices(gpu, handle),
            mig_profiles=self._discover_mig_profiles(gpu, handle),
        )

    # --- NVLink topology ------------------------------------------------------------------

    def _with_nvlink_domains(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        """``gpus`` with their NVLink domains (:mod:`kubeletplugin.devices.nvlink`); a GPU whose
        links NVML cannot read gets none, with one warning line (it is still published)."""
        views: list[NvLinkView] = []
        for gpu in gpus:
            try:
                handle = self._call(f"GPU {gpu.index}", "nvmlDeviceGetHandleByIndex", gpu.index)
                views.append(self._nvlink_view(gpu, handle))
            except (DiscoveryError, ValueError) as exc:
                log.warning(
                    "GPU %d: NVLink topology not read (no nvlinkDomain): %s", gpu.index, exc
                )
        domains = nvlink_domains(views)
        return [dataclasses.replace(g, nvlink_domain=domains.get(g.pci_bus_id)) for g in gpus]

    def _nvlink_view(self, gpu: GpuInfo, handle: Any) -> NvLinkView:
        """The fabric registration and the active NVLinks of ``gpu`` (at most
        :data:`MAX_NVLINKS` links; the first link NVML refuses ends the list)."""
        what = f"the NVLinks of GPU {gpu.index}"
        limit = min(
            bounded_count("NVLinks", getattr(self._module(), "NVML_NVLINK_MAX_LINKS", 18), 1024),
            MAX_NVLINKS,
        )
        switch = False
        peers: set[str] = set()
        for link in range(limit):
            try:
                state = self._link_call(what, "nvmlDeviceGetNvLinkState", handle, link)
            except _Missing:
                break
            if state is None:
                break  # no such link (or no NVLink at all)
            if int(state) != 1:
                continue
            try:
                kind = self._link_call(what, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            except _Missing:
                kind = None
            kind = NVLINK_DEVICE_TYPE_UNKNOWN if kind is None else int(kind)
            if kind == NVLINK_DEVICE_TYPE_SWITCH:
                switch = True
            elif kind in (NVLINK_DEVICE_TYPE_GPU, NVLINK_DEVICE_TYPE_UNKNOWN):
                try:
                    pci = self._link_call(what, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                except _Missing:
                    pci = None
                if pci is not None:
                    peers.add(normalize_pci_bus_id(pci.busId))
        return NvLinkView(gpu.pci_bus_id, self._fabric(gpu, handle), switch, frozenset(peers))

    def _link_call(self, what: str, fn_name: str, handle: Any, link: int) -> Any:
        """One per-link NVML call: its answer, None when NVML says the link does not exist
        (invalid argument, not supported, not found), :class:`_Missing` without the function,
        DiscoveryError for any other NVML error."""
        fn: Callable[..., Any] | None = getattr(self._module(), fn_name, None)
        if fn is None:
            raise _Missing(fn_name)
        try:
            return fn(handle, link)
        except self._nvml_error() as exc:
            code = nvml_error_code(exc)
            if code in (
                NVML_ERROR_INVALID_ARGUMENT,
                NVML_ERROR_NOT_SUPPORTED,
                NVML_ERROR_NOT_FOUND,
            ):
                return None
            if self._is_missing(exc):
                raise _Missing(fn_name) from None
            raise DiscoveryError(
                f"NVML error while reading {what} ({fn_name}, link {link}): {exc}"
            ) from None

    def _fabric(self, gpu: GpuInfo, handle: Any) -> tuple[bytes, int] | None:
        """(cluster UUID, clique id) of the GPU's completed NVSwitch fabric registration, or
        None (no fabric, not registered yet, or a driver or pynvml that cannot say)."""
        struct = getattr(self._module(), "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            return None
        info = struct()
        try:
            self._optional(
                f"the fabric of GPU {gpu.index}",
                "nvmlDeviceGetGpuFabricInfo",
                handle,
                ctypes.byref(info),
            )
        except _Missing:
            return None
        if int(info.state) != NVML_GPU_FABRIC_STATE_COMPLETED or int(info.status) != 0:
            return None
        return bytes(info.clusterUuid), int(info.cliqueId)

    def _memory(self, what: str, handle: Any) -> tuple[int, int, str]:
        """(total, reserved, "v2"|"v1") of device ``what`` (``GPU 0``) from NVML memory info,
        v2 when available."""
        version = getattr(self._module(), "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = self._optional(
                    f"the memory of {what}", "nvmlDeviceGetMemoryInfo", handle, version=version
                )
                return int(info.total), int(info.reserved), "v2"
            except _Missing:
                pass
        info = self._call(f"the memory of {what}", "nvmlDeviceGetMemoryInfo", handle)
        return int(info.total), 0, "v1"

    def _numa_node(self, index: int, handle: Any, bus_id: str) -> int | None:
        """sysfs first (``-1`` there means none); NVML's value only when sysfs has no file."""
        raw = numa_node_file(self._sysfs_root, bus_id)
        if raw is None:
            try:
                raw = int(
                    self._optional(
                        f"the NUMA node of GPU {index}", "nvmlDeviceGetNumaNodeId", handle
                    )
                )
            except _Missing:
                return None
        return raw if raw >= 0 else None

    def _mig_mode(self, handle: Any) -> tuple[str | None, bool]:
        """(current mode ``Enabled``/``Disabled`` or None without MIG support, whether the
        pending mode differs from the current one)."""
        try:
            current, pending = self._optional("the MIG mode", "nvmlDeviceGetMigMode", handle)
        except _Missing:
            return None, False
        enabled = int(getattr(self._module(), "NVML_DEVICE_MIG_ENABLE", 1))
        mode = MIG_ENABLED if int(current) == enabled else MIG_DISABLED
        return mode, int(current) != int(pending)

    def _mig_devices(self, parent: GpuInfo, handle: Any) -> tuple[GpuInfo, ...]:
        """The MIG devices that exist on ``parent``, ordered by (GPU instance, compute
        instance); each one NVML cannot describe is left out with one warning line."""
        where = f"GPU {parent.index}"
        try:
            slots = int(
                self._optional(
                    f"the MIG device count of {where}", "nvmlDeviceGetMaxMigDeviceCount", handle
                )
            )
        except _Missing:
            log.warning("%s: MIG is enabled but NVML cannot list its MIG devices", where)
            return ()
        except DiscoveryError as exc:
            log.warning("%s: MIG devices left out (not published): %s", where, exc)
            return ()
        if not 0 <= slots <= MAX_NVML_COUNT:
            log.warning("%s: MIG devices left out: NVML reports %d MIG device slots", where, slots)
            return ()
        found: list[GpuInfo] = []
        for slot in range(slots):
            try:
                mig_handle = self._optional(
                    f"MIG device {slot} of {where}",
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    handle,
                    slot,
                )
            except (_Missing, DiscoveryError):
                continue  # an empty slot: NVML answers NOT_FOUND (or not supported)
            try:
                found.append(self.mig_device(parent, slot, mig_handle, handle))
            except (_Missing, DiscoveryError, ValueError) as exc:
                log.warning("MIG device %d of %s left out (not published): %s", slot, where, exc)
        return tuple(sorted(found, key=instance_key))

    def mig_device(
        self, parent: GpuInfo, slot: int, handle: Any, parent_handle: Any = None
    ) -> GpuInfo:
        """One MIG device of ``parent`` (see :class:`~kubeletplugin.model.GpuInfo`), read from
        its MIG device ``handle`` in slot ``slot``; with ``parent_handle`` its GPU instance's
        placement and profile id too, when NVML gives them. Raises DiscoveryError or ValueError
        for a device NVML cannot describe."""
        try:
            return self._mig_device(parent, slot, handle, parent_handle)
        except _Missing as exc:
            raise DiscoveryError(
                f"MIG device {slot} of GPU {parent.index}: NVML function {exc} is missing"
            ) from None

    def _mig_device(self, parent: GpuInfo, slot: int, handle: Any, parent_handle: Any) -> GpuInfo:
        what = f"MIG device {slot} of GPU {parent.index}"
        uuid = _text(self._call(f"the UUID of {what}", "nvmlDeviceGetUUID", handle))
        gi = int(self._call(f"the GPU instance of {what}", "nvmlDeviceGetGpuInstanceId", handle))
        ci = int(
            self._call(f"the compute instance of {what}", "nvmlDeviceGetComputeInstanceId", handle)
        )
        attrs = self._call(f"the attributes of {what}", "nvmlDeviceGetAttributes", handle)
        total, reserved, _version = self._memory(what, handle)
        multiprocessors = int(attrs.multiprocessorCount)
        gpu_slices = int(attrs.gpuInstanceSliceCount)
        compute_slices = int(attrs.computeInstanceSliceCount)
        if multiprocessors <= 0:
            raise DiscoveryError(f"{what}: NVML reports {multiprocessors} multiprocessors")
        if total - reserved <= 0:
            raise DiscoveryError(f"{what}: NVML reports no usable memory (total {total})")
        mig = MigInfo(
            parent_uuid=parent.uuid,
            gpu_instance=gi,
            compute_instance=ci,
            profile=profile_name(
                gpu_slices, compute_slices, parent.memory_total, int(attrs.memorySizeMB)
            ),
            multiprocessors=multiprocessors,
            gpu_slices=gpu_slices,
            compute_slices=compute_slices,
        )
        if parent_handle is not None:
            placement, profile_id = self.gpu_instance_placement(parent_handle, gi)
            mig = dataclasses.replace(mig, placement=placement, profile_id=profile_id)
        return parent.mig_device(uuid, total, mig, memory_reserved=reserved)

    def gpu_instance_placement(
        self, parent_handle: Any, gpu_instance: int
    ) -> tuple[MigPlacement | None, int | None]:
        """(placement, profile id) of GPU instance ``gpu_instance`` of the GPU ``parent_handle``
        (``nvmlDeviceGetGpuInstanceById`` + ``nvmlGpuInstanceGetInfo``); (None, None) when NVML
        cannot tell (old driver, no permission, static MIG set up without GI records). Quiet:
        static MIG devices work without these."""
        nvml = self._module()
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(parent_handle, gpu_instance)
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            placement = MigPlacement(int(info.placement.start), int(info.placement.size))
            return placement, int(info.profileId)
        except (AttributeError, TypeError, ValueError, self._nvml_error()) as exc:
            log.debug("GPU instance %d: placement unknown: %s", gpu_instance, exc)
            return None, None

    # --- MIG profiles ---------------------------------------------------------------------

    def _discover_mig_profiles(self, gpu: GpuInfo, handle: Any) -> tuple[MigProfile, ...]:
        """:meth:`mig_profiles`, or () with one warning line naming the GPU and the cause."""
        try:
            return self.mig_profiles(gpu, handle)
        except (ValueError, _Missing, self._nvml_error()) as exc:
            cause = str(exc)
            if isinstance(exc, _Missing):
                cause = f"NVML function {exc} is missing (pynvml or driver too old)"
            log.warning(
                "GPU %d (%s): MIG profiles not read (no dynamic MIG devices): %s",
                gpu.index,
                gpu.uuid,
                cause,
            )
            return ()

    def gpu_instance_profile_infos(self, handle: Any) -> list[tuple[int, Any]]:
        """``(profile index, nvmlGpuInstanceProfileInfo)`` of every GPU-instance profile index
        the GPU supports, one per profile id, in index order. Indexes NVML answers
        NOT_SUPPORTED or INVALID_ARGUMENT for are skipped; other NVML errors are raised."""
        nvml = self._module()
        fn: Callable[..., Any] | None = getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfo", None)
        if fn is None:
            raise _Missing("nvmlDeviceGetGpuInstanceProfileInfo")
        count = bounded_count(
            "GPU instance profile indexes",
            getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", NVML_GPU_INSTANCE_PROFILE_COUNT),
        )
        skip = {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT}
        found: list[tuple[int, Any]] = []
        seen: set[int] = set()
        for index in range(count):
            try:
                info = self._profile_info(fn, handle, index)
            except self._nvml_error() as exc:
                if nvml_error_code(exc) in skip:
                    continue
                raise
            profile_id = int(info.id)
            if profile_id not in seen:
                seen.add(profile_id)
                found.append((index, info))
        return found

    def _profile_info(self, fn: Callable[..., Any], handle: Any, index: int) -> Any:
        """Profile info v2 (with its name); v1 where the driver lacks v2."""
        try:
            return fn(handle, index)
        except self._nvml_error() as exc:
            cls = self._error_class("NVMLError_FunctionNotFound")
            if cls is None or not isinstance(exc, cls):
                raise
        return fn(handle, index, version=1)

    def possible_placements(self, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
        """Every placement NVML allows for GPU-instance profile ``profile_id``, ordered by start.

        ``nvmlDeviceGetGpuInstancePossiblePlacements`` is asked twice as nvml.h describes:
        with a NULL array for the count, then with an array of that size."""
        nvml = self._module()
        fn: Callable[..., Any] | None = getattr(
            nvml, "nvmlDeviceGetGpuInstancePossiblePlacements", None
        )
        placement_type = getattr(nvml, "c_nvmlGpuInstancePlacement_t", None)
        if fn is None or placement_type is None:
            raise _Missing("nvmlDeviceGetGpuInstancePossiblePlacements")
        count = ctypes.c_uint(0)
        fn(handle, profile_id, None, ctypes.byref(count))
        size = bounded_count(f"placements of profile {profile_id}", count.value)
        if size == 0:
            return ()
        array = (placement_type * size)()
        count = ctypes.c_uint(size)
        fn(handle, profile_id, array, ctypes.byref(count))
        filled = bounded_count(f"placements of profile {profile_id}", count.value, size)
        placements = []
        for item in array[:filled]:
            placement = MigPlacement(int(item.start), int(item.size))
            if placement.start + placement.size > MAX_MEMORY_SLICES:
                raise ValueError(
                    f"profile {profile_id}: placement {placement.start}:{placement.size} "
                    f"reaches beyond {MAX_MEMORY_SLICES} memory slices"
                )
            placements.append(placement)
        return tuple(sorted(set(placements)))

    def mig_profiles(self, gpu: GpuInfo, handle: Any) -> tuple[MigProfile, ...]:
        """The GPU-instance profiles of MIG-enabled ``gpu`` with their placements, ordered by
        (slice count, memory, profile id). A profile whose slice count has no
        ``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`` or that NVML gives no placement is left
        out. Raises NVMLError, ValueError (malformed answer) or an internal "missing" error."""
        nvml = self._module()
        profiles: list[MigProfile] = []
        for index, info in self.gpu_instance_profile_infos(handle):
            profile_id = int(info.id)
            slices = int(info.sliceCount)
            memory_mb = int(info.memorySizeMB)
            if not 1 <= slices <= MAX_PROFILE_SLICES or memory_mb <= 0:
                raise ValueError(
                    f"profile {profile_id}: NVML reports {slices} slices and {memory_mb} MiB"
                )
            compute_profile = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
            if not isinstance(compute_profile, int):
                log.debug(
                    "profile %d: no compute instance profile of %d slices", profile_id, slices
                )
                continue
            placements = self.possible_placements(handle, profile_id)
            if not placements:
                continue
            name = mig_profile_name(
                getattr(info, "name", b""), index, slices, gpu.memory_total, memory_mb
            )
            profiles.append(
                MigProfile(
                    profile_id=profile_id,
                    profile_index=index,
                    name=name,
                    slice_count=slices,
                    instance_count=max(1, bounded_count("instances", info.instanceCount)),
                    memory_mb=memory_mb,
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                    placements=placements,
                    compute_profile=compute_profile,
                )
            )
        profiles.sort(key=lambda p: (p.slice_count, p.memory_mb, p.profile_id))
        return _unique_names(gpu, profiles)


def _unique_names(gpu: GpuInfo, profiles: list[MigProfile]) -> tuple[MigProfile, ...]:
    """``profiles`` without a profile whose name an earlier one has (device names must be
    unique); each one left out is named in a warning line."""
    kept: dict[str, MigProfile] = {}
    for profile in profiles:
        first = kept.setdefault(profile.name, profile)
        if first is not profile:
            log.warning(
                "GPU %d: MIG profile %d left out: its name %s is profile %d's too",
                gpu.index,
                profile.profile_id,
                profile.name,
                first.profile_id,
            )
    return tuple(kept.values())


class _NeverRaised(Exception):
    """Stands in for ``pynvml.NVMLError`` when a module lacks it (nothing raises it)."""
