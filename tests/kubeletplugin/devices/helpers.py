"""A fake ``pynvml`` module for discovery tests: GPUs described as dicts, faults injectable."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(f"NVML error code {value}")
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Unknown(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


def h100(index: int) -> dict[str, Any]:
    """A fake H100 as NVML would describe it."""
    return {
        "uuid": f"GPU-0000000{index}-1111-2222-3333-444444444444",
        "name": "NVIDIA H100 80GB HBM3",
        "minor": index,
        "busId": f"00000000:{0x1B + index:02X}:00.0",
        "brand": 14,
        "arch": 9,
        "cc": (9, 0),
        "total": 85520809984,
        "reserved": 552337408,
        "numa": index // 4,
        "mig": (0, 0),
    }


#: What NVML reports for MIG devices of an H100 80GB: (profile, memorySizeMB, multiprocessors,
#: GPU instance slices, compute instance slices).
H100_MIG_PROFILES = {
    "1g.10gb": (9856, 16, 1, 1),
    "3g.40gb": (40192, 60, 3, 3),
    "1c.3g.40gb": (40192, 16, 3, 1),
    "7g.80gb": (80896, 132, 7, 7),
}


def h100_mig(parent: int, profile: str, gi: int, ci: int = 0) -> dict[str, Any]:
    """A fake MIG device of fake H100 ``parent`` (a handle as NVML would describe it)."""
    memory_mb, sms, gi_slices, ci_slices = H100_MIG_PROFILES[profile]
    return {
        "uuid": f"MIG-{parent:08x}-{gi:04x}-{ci:04x}-0000-000000000000",
        "gi": gi,
        "ci": ci,
        "total": memory_mb * 1024 * 1024,
        "reserved": 0,
        "attributes": types.SimpleNamespace(
            multiprocessorCount=sms,
            sharedCopyEngineCount=1,
            sharedDecoderCount=1,
            sharedEncoderCount=0,
            sharedJpegCount=1,
            sharedOfaCount=0,
            gpuInstanceSliceCount=gi_slices,
            computeInstanceSliceCount=ci_slices,
            memorySizeMB=memory_mb,
        ),
    }


def mig_h100(index: int, *migs: dict[str, Any], slots: int = 7) -> dict[str, Any]:
    """A fake H100 in MIG mode whose MIG device slots hold ``migs`` (the rest are empty)."""
    gpu = h100(index)
    gpu["mig"] = (1, 1)
    gpu["migSlots"] = [*migs, *[None] * (slots - len(migs))]
    return gpu


@dataclass
class FakeNvml:
    """State behind the fake module; ``calls`` records every function called."""

    gpus: list[dict[str, Any]]
    driver: str | bytes = "580.95.05"
    cuda: int = 12080
    #: function name -> exception to raise from it
    faults: dict[str, BaseException] = field(default_factory=dict)
    #: function names the module does not have
    missing: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        for cls in (
            NVMLError,
            NVMLError_LibraryNotFound,
            NVMLError_DriverNotLoaded,
            NVMLError_NoPermission,
            NVMLError_FunctionNotFound,
            NVMLError_NotSupported,
            NVMLError_Unknown,
            NVMLError_NotFound,
        ):
            setattr(mod, cls.__name__, cls)
        mod.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
        if "nvmlMemory_v2" not in self.missing:
            mod.nvmlMemory_v2 = 33554472  # type: ignore[attr-defined]
        functions: dict[str, Callable[..., Any]] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlSystemGetDriverVersion": lambda: self.driver,
            "nvmlSystemGetCudaDriverVersion_v2": lambda: self.cuda,
            "nvmlSystemGetCudaDriverVersion": lambda: self.cuda,
            "nvmlDeviceGetHandleByIndex": lambda i: self.gpus[i],
            "nvmlDeviceGetUUID": lambda h: h["uuid"],
            "nvmlDeviceGetName": lambda h: h["name"],
            "nvmlDeviceGetMinorNumber": lambda h: h["minor"],
            "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=h["busId"]),
            "nvmlDeviceGetBrand": lambda h: h["brand"],
            "nvmlDeviceGetArchitecture": lambda h: h["arch"],
            "nvmlDeviceGetCudaComputeCapability": lambda h: h["cc"],
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetNumaNodeId": lambda h: h["numa"],
            "nvmlDeviceGetMigMode": lambda h: h["mig"],
            "nvmlDeviceGetMaxMigDeviceCount": lambda h: len(h.get("migSlots", [])),
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_handle,
            "nvmlDeviceGetGpuInstanceId": lambda h: h["gi"],
            "nvmlDeviceGetComputeInstanceId": lambda h: h["ci"],
            "nvmlDeviceGetAttributes": lambda h: h["attributes"],
        }
        for fn_name, fn in functions.items():
            if fn_name not in self.missing:
                setattr(mod, fn_name, self._recorded(fn_name, fn))
        return mod

    def _recorded(self, fn_name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(fn_name)
            fault = self.faults.get(fn_name)
            if fault is None and args and isinstance(args[0], dict):
                # Per-GPU faults: a GPU dict may carry {"faults": {function name: exception}}.
                fault = args[0].get("faults", {}).get(fn_name)
            if fault is not None:
                raise fault
            return fn(*args, **kwargs)

        return call

    @staticmethod
    def _mig_handle(handle: dict[str, Any], slot: int) -> dict[str, Any]:
        found: dict[str, Any] | None = handle.get("migSlots", [])[slot]
        if found is None:
            raise NVMLError_NotFound(6)
        return found

    def _memory(self, handle: dict[str, Any], version: int | None = None) -> Any:
        if version is None:
            total = handle["total"]
            return types.SimpleNamespace(total=total, free=total, used=0)
        if "nvmlDeviceGetMemoryInfo_v2" in self.missing:
            raise NVMLError_FunctionNotFound(13)
        return types.SimpleNamespace(
            total=handle["total"], reserved=handle["reserved"], free=0, used=0
        )
