"""GPU discovery through NVML (the ``pynvml`` module of nvidia-ml-py).

Invariants:
- every NVML session opened here is closed (``nvmlShutdown``), also on errors;
- an expected failure (no library, no driver, no GPU, an NVML error) becomes one
  :class:`~kubeletplugin.devices.backend.DiscoveryError` whose message names the cause;
- functions that older drivers or older ``pynvml`` versions lack degrade to a documented default
  instead of failing discovery (memory info v1, no NUMA node, no MIG mode, ...).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from kubeletplugin.devices.backend import DiscoveryError
from kubeletplugin.model import GpuInfo

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


def numa_node_from_sysfs(sysfs_root: Path, pci_bus_id: str) -> int | None:
    """NUMA node from ``/sys/bus/pci/devices/<bus id>/numa_node``; None when absent or -1."""
    path = sysfs_root / "bus" / "pci" / "devices" / pci_bus_id / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


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

    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None, sysfs_root: Path | None = None) -> None:
        self._nvml = nvml
        self._sysfs_root = sysfs_root if sysfs_root is not None else DEFAULT_SYSFS_ROOT

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
        """Return every GPU in NVML index order; raise :class:`DiscoveryError` on failure."""
        self._init()
        try:
            count = int(self._call("the device count", "nvmlDeviceGetCount"))
            if count == 0:
                raise DiscoveryError("NVML reports no NVIDIA GPUs on this node")
            system = self._system_info()
            return [self._device(index, *system) for index in range(count)]
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

        total, reserved, memory_version = self._memory(index, handle)
        if memory_version == "v1":
            notes.append(MEMORY_V1_NOTE)
        if total - reserved <= 0:
            raise DiscoveryError(
                f"GPU {index}: NVML reports no usable memory (total {total}, reserved {reserved})"
            )

        try:
            numa: int | None = int(
                self._optional("the NUMA node", "nvmlDeviceGetNumaNodeId", handle)
            )
            if numa is not None and numa < 0:
                numa = None
        except _Missing:
            numa = numa_node_from_sysfs(self._sysfs_root, bus_id)

        return GpuInfo(
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
            mig_mode=self._mig_mode(handle),
            notes=tuple(notes),
        )

    def _memory(self, index: int, handle: Any) -> tuple[int, int, str]:
        """(total, reserved, "v2"|"v1") from NVML memory info, v2 when available."""
        version = getattr(self._module(), "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = self._optional(
                    f"the memory of GPU {index}", "nvmlDeviceGetMemoryInfo", handle, version=version
                )
                return int(info.total), int(info.reserved), "v2"
            except _Missing:
                pass
        info = self._call(f"the memory of GPU {index}", "nvmlDeviceGetMemoryInfo", handle)
        return int(info.total), 0, "v1"

    def _mig_mode(self, handle: Any) -> str | None:
        try:
            current, _pending = self._optional("the MIG mode", "nvmlDeviceGetMigMode", handle)
        except _Missing:
            return None
        enabled = getattr(self._module(), "NVML_DEVICE_MIG_ENABLE", 1)
        return "Enabled" if int(current) == int(enabled) else "Disabled"


class _NeverRaised(Exception):
    """Stands in for ``pynvml.NVMLError`` when a module lacks it (nothing raises it)."""
