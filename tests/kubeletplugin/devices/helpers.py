"""A fake ``pynvml`` module for discovery tests: GPUs described as dicts, faults injectable.

A GPU in MIG mode made by :func:`mig_h100_empty` / :func:`mig_a100_empty` (or any GPU dict with
``migProfiles``) also answers the GPU/compute instance functions with pynvml's signatures: its
profile table is :mod:`kubeletplugin.devices.migtables`' reference table, a create is refused
with ``NVML_ERROR_INSUFFICIENT_RESOURCES`` where
:func:`~kubeletplugin.devices.migtables.placement_problem` says no (like the driver), and each
compute instance appears as a MIG device handle in the GPU's ``migSlots``. GPU and compute
instance handles are :class:`FakeGpuInstance` / :class:`FakeComputeInstance` objects; arrays of
them are ``ctypes.py_object`` arrays (``c_nvmlGpuInstance_t`` of this module).
"""

from __future__ import annotations

import ctypes
import itertools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeletplugin.devices import migtables
from kubeletplugin.model import MigPlacement, MigProfile

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
#: n -> NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE
COMPUTE_PROFILE_FOR_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


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


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_InUse(NVMLError):
    pass


class NVMLError_InsufficientResources(NVMLError):
    pass


class NVMLError_InsufficientSize(NVMLError):
    pass


_ERRORS: dict[int, type[NVMLError]] = {
    NVML_ERROR_INVALID_ARGUMENT: NVMLError_InvalidArgument,
    NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported,
    NVML_ERROR_NOT_FOUND: NVMLError_NotFound,
    NVML_ERROR_INSUFFICIENT_SIZE: NVMLError_InsufficientSize,
    NVML_ERROR_IN_USE: NVMLError_InUse,
    NVML_ERROR_INSUFFICIENT_RESOURCES: NVMLError_InsufficientResources,
}


def nvml_error(code: int) -> NVMLError:
    """The exception pynvml raises for return code ``code`` (its ``NVMLError_*`` subclass)."""
    return _ERRORS.get(code, NVMLError)(code)


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    """pynvml's placement struct (``start``, ``size``)."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def _deref(ref: Any, what: str) -> Any:
    """The object behind ``byref(obj)`` or ``pointer(obj)``; TypeError for anything else (a
    struct or scalar passed by value, which the C function would misread)."""
    if type(ref).__name__ == "CArgObject":
        return ref._obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    raise TypeError(f"{what} must be passed by reference (byref/pointer), got {ref!r}")


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


def a100(index: int) -> dict[str, Any]:
    """A fake A100-SXM4-40GB as NVML would describe it."""
    gpu = h100(index)
    gpu.update(
        uuid=f"GPU-0000000{index}-aaaa-2222-3333-444444444444",
        name=migtables.A100_40GB_PRODUCT,
        arch=7,
        cc=(8, 0),
        total=40960 * 1024 * 1024,
        reserved=419430400,
    )
    return gpu


def mig_h100(index: int, *migs: dict[str, Any], slots: int = 7) -> dict[str, Any]:
    """A fake H100 in MIG mode whose MIG device slots hold ``migs`` (the rest are empty); it
    has the H100 profile table (:data:`~kubeletplugin.devices.migtables.H100_80GB`)."""
    gpu = h100(index)
    gpu["mig"] = (1, 1)
    gpu["migSlots"] = [*migs, *[None] * (slots - len(migs))]
    gpu["migProfiles"] = migtables.H100_80GB
    gpu["gpuInstances"] = {}
    return gpu


def mig_h100_empty(index: int) -> dict[str, Any]:
    """A fake H100 in MIG mode with no GPU instance (7 empty MIG device slots)."""
    return mig_h100(index)


def mig_a100_empty(index: int) -> dict[str, Any]:
    """A fake A100-SXM4-40GB in MIG mode with no GPU instance (7 empty MIG device slots)."""
    gpu = a100(index)
    gpu["mig"] = (1, 1)
    gpu["migSlots"] = [None] * 7
    gpu["migProfiles"] = migtables.A100_40GB
    gpu["gpuInstances"] = {}
    return gpu


@dataclass(eq=False)
class FakeComputeInstance:
    """A compute instance (a ``nvmlComputeInstance_t``); ``mig`` is its MIG device handle."""

    gpu_instance: FakeGpuInstance
    id: int
    profile_id: int
    slice_count: int
    mig: dict[str, Any]
    faults: dict[str, BaseException] = field(default_factory=dict)
    destroyed: bool = False


@dataclass(eq=False)
class FakeGpuInstance:
    """A GPU instance (a ``nvmlGpuInstance_t``) of GPU dict ``gpu``."""

    gpu: dict[str, Any] = field(repr=False)
    id: int
    profile_id: int
    placement: MigPlacement
    compute_instances: dict[int, FakeComputeInstance] = field(default_factory=dict)
    faults: dict[str, BaseException] = field(default_factory=dict)
    destroyed: bool = False

    @property
    def profile(self) -> MigProfile:
        found = migtables.profile_by_id(self.gpu["migProfiles"], self.profile_id)
        assert found is not None
        return found


_INSTANCES = (FakeGpuInstance, FakeComputeInstance)


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
            NVMLError_InvalidArgument,
            NVMLError_InUse,
            NVMLError_InsufficientResources,
            NVMLError_InsufficientSize,
        ):
            setattr(mod, cls.__name__, cls)
        mod.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(mod, name, value)
        for slices, value in COMPUTE_PROFILE_FOR_SLICES.items():
            setattr(mod, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", value)
        mod.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = migtables.GI_1_SLICE_REV1  # type: ignore[attr-defined]
        mod.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0  # type: ignore[attr-defined]
        mod.c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t  # type: ignore[attr-defined]
        mod.c_nvmlGpuInstance_t = ctypes.py_object  # type: ignore[attr-defined]
        mod.c_nvmlComputeInstance_t = ctypes.py_object  # type: ignore[attr-defined]
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
            "nvmlDeviceGetHandleByUUID": self._by_uuid,
            "nvmlDeviceGetGpuInstanceProfileInfo": self._gi_profile_info,
            "nvmlDeviceGetGpuInstancePossiblePlacements": self._possible_placements,
            "nvmlDeviceCreateGpuInstanceWithPlacement": self._create_gi,
            "nvmlDeviceGetGpuInstances": self._gpu_instances,
            "nvmlDeviceGetGpuInstanceById": self._gi_by_id,
            "nvmlGpuInstanceGetInfo": self._gi_info,
            "nvmlGpuInstanceDestroy": self._destroy_gi,
            "nvmlGpuInstanceGetComputeInstanceProfileInfo": self._ci_profile_info,
            "nvmlGpuInstanceCreateComputeInstance": self._create_ci,
            "nvmlGpuInstanceGetComputeInstances": self._compute_instances,
            "nvmlComputeInstanceGetInfo": self._ci_info,
            "nvmlComputeInstanceDestroy": self._destroy_ci,
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
            if (
                fault is None
                and args
                and isinstance(args[0], FakeGpuInstance | FakeComputeInstance)
            ):
                fault = args[0].faults.get(fn_name)
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

    # --- GPU and compute instances --------------------------------------------------------

    serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _by_uuid(self, uuid: str | bytes) -> dict[str, Any]:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu["uuid"] == text:
                return gpu
        raise nvml_error(NVML_ERROR_NOT_FOUND)

    @staticmethod
    def _profiles(gpu: dict[str, Any]) -> Sequence[MigProfile]:
        if gpu.get("mig", (0, 0))[0] != 1 or "migProfiles" not in gpu:
            raise nvml_error(NVML_ERROR_NOT_SUPPORTED)
        profiles: Sequence[MigProfile] = gpu["migProfiles"]
        return profiles

    def _profile(self, gpu: dict[str, Any], profile_id: int) -> MigProfile:
        found = migtables.profile_by_id(self._profiles(gpu), profile_id)
        if found is None:
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        return found

    def _gi_profile_info(self, gpu: dict[str, Any], index: int, version: int = 2) -> Any:
        if not 0 <= index < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        profile = next((p for p in self._profiles(gpu) if p.profile_index == index), None)
        if profile is None:
            raise nvml_error(NVML_ERROR_NOT_SUPPORTED)
        info = types.SimpleNamespace(
            id=profile.profile_id,
            isP2pSupported=0,
            sliceCount=profile.slice_count,
            instanceCount=profile.instance_count,
            multiprocessorCount=profile.multiprocessors,
            copyEngineCount=profile.copy_engines,
            decoderCount=profile.decoders,
            encoderCount=profile.encoders,
            jpegCount=profile.jpeg_engines,
            ofaCount=profile.ofa_engines,
            memorySizeMB=profile.memory_mb,
        )
        if version == 2:
            info.version = 0x02000098
            info.name = f"MIG {profile.name}".encode()
        return info

    def _possible_placements(
        self, gpu: dict[str, Any], profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        profile = self._profile(gpu, profile_id)
        count = _deref(count_ref, "count")
        if placements is None:
            count.value = len(profile.placements)
            return 0
        if not isinstance(placements, ctypes.Array) or len(placements) < len(profile.placements):
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        for slot, placement in zip(placements, profile.placements, strict=False):
            slot.start, slot.size = placement.start, placement.size
        count.value = len(profile.placements)
        return 0

    @staticmethod
    def _instances(gpu: dict[str, Any]) -> dict[int, FakeGpuInstance]:
        instances: dict[int, FakeGpuInstance] = gpu.setdefault("gpuInstances", {})
        return instances

    def _create_gi(self, gpu: dict[str, Any], profile_id: int, placement: Any) -> FakeGpuInstance:
        where = _deref(placement, "placement")
        if not isinstance(where, c_nvmlGpuInstancePlacement_t):
            raise TypeError(f"placement must be a c_nvmlGpuInstancePlacement_t, got {where!r}")
        profiles = self._profiles(gpu)
        self._profile(gpu, profile_id)
        wanted = MigPlacement(where.start, where.size) if where.size else None
        if wanted is None:
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        return self.create_gpu_instance(gpu, profile_id, wanted, profiles)

    def create_gpu_instance(
        self,
        gpu: dict[str, Any],
        profile_id: int,
        placement: MigPlacement,
        profiles: Sequence[MigProfile] | None = None,
    ) -> FakeGpuInstance:
        """Create a GPU instance as the driver would (also what "someone else" does in tests);
        NVMLError INSUFFICIENT_RESOURCES where the placement rule says no."""
        profiles = profiles if profiles is not None else self._profiles(gpu)
        instances = self._instances(gpu)
        existing = [(gi.profile_id, gi.placement) for gi in instances.values()]
        if migtables.placement_problem(profiles, existing, profile_id, placement) is not None:
            raise nvml_error(NVML_ERROR_INSUFFICIENT_RESOURCES)
        taken = set(instances) | {m["gi"] for m in gpu.get("migSlots", []) if m is not None}
        gi_id = next(i for i in itertools.count(1) if i not in taken)
        created = FakeGpuInstance(gpu, gi_id, profile_id, placement)
        instances[gi_id] = created
        return created

    def _gpu_instances(
        self, gpu: dict[str, Any], profile_id: int, array: Any, count_ref: Any
    ) -> int:
        profile = self._profile(gpu, profile_id)
        count = _deref(count_ref, "count")
        found = [gi for gi in self._instances(gpu).values() if gi.profile_id == profile_id]
        if not isinstance(array, ctypes.Array) or len(array) < profile.instance_count:
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        for slot, gi in enumerate(sorted(found, key=lambda g: g.id)):
            array[slot] = gi
        count.value = len(found)
        return 0

    def _gi_by_id(self, gpu: dict[str, Any], gi_id: int) -> FakeGpuInstance:
        self._profiles(gpu)
        found = self._instances(gpu).get(gi_id)
        if found is None:
            raise nvml_error(NVML_ERROR_NOT_FOUND)
        return found

    @staticmethod
    def _live(instance: FakeGpuInstance | FakeComputeInstance) -> None:
        if instance.destroyed:
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)

    def _gi_info(self, gi: FakeGpuInstance) -> Any:
        self._live(gi)
        return types.SimpleNamespace(
            device=gi.gpu,
            id=gi.id,
            profileId=gi.profile_id,
            placement=types.SimpleNamespace(start=gi.placement.start, size=gi.placement.size),
        )

    def _destroy_gi(self, gi: FakeGpuInstance) -> int:
        self._live(gi)
        if gi.compute_instances:
            raise nvml_error(NVML_ERROR_IN_USE)
        gi.destroyed = True
        del self._instances(gi.gpu)[gi.id]
        return 0

    def _ci_profile_info(
        self, gi: FakeGpuInstance, profile: int, engine_profile: int, version: int = 2
    ) -> Any:
        self._live(gi)
        slices = next(
            (n for n, value in COMPUTE_PROFILE_FOR_SLICES.items() if value == profile), None
        )
        if slices is None or slices > gi.profile.slice_count or engine_profile != 0:
            raise nvml_error(NVML_ERROR_NOT_SUPPORTED)
        info = types.SimpleNamespace(
            id=profile,
            sliceCount=slices,
            instanceCount=gi.profile.slice_count // slices,
            multiprocessorCount=gi.profile.multiprocessors * slices // gi.profile.slice_count,
            sharedCopyEngineCount=gi.profile.copy_engines,
            sharedDecoderCount=gi.profile.decoders,
            sharedEncoderCount=gi.profile.encoders,
            sharedJpegCount=gi.profile.jpeg_engines,
            sharedOfaCount=gi.profile.ofa_engines,
        )
        if version == 2:
            info.version = 0x02000088
            info.name = f"MIG {gi.profile.name}".encode()
        return info

    def _create_ci(self, gi: FakeGpuInstance, profile_id: int) -> FakeComputeInstance:
        info = self._ci_profile_info(gi, profile_id, 0)
        used = sum(ci.slice_count for ci in gi.compute_instances.values())
        if used + int(info.sliceCount) > gi.profile.slice_count:
            raise nvml_error(NVML_ERROR_INSUFFICIENT_RESOURCES)
        slots: list[dict[str, Any] | None] = gi.gpu.setdefault("migSlots", [])
        free = next((i for i, m in enumerate(slots) if m is None), None)
        if free is None:
            raise nvml_error(NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in itertools.count(0) if i not in gi.compute_instances)
        profile = gi.profile
        mig = {
            "uuid": f"MIG-{gi.gpu['minor']:08x}-{gi.id:04x}-{ci_id:04x}-{next(self.serial):04x}"
            "-000000000000",
            "gi": gi.id,
            "ci": ci_id,
            "total": profile.memory_mb * 1024 * 1024,
            "reserved": 0,
            "attributes": types.SimpleNamespace(
                multiprocessorCount=int(info.multiprocessorCount),
                sharedCopyEngineCount=profile.copy_engines,
                sharedDecoderCount=profile.decoders,
                sharedEncoderCount=profile.encoders,
                sharedJpegCount=profile.jpeg_engines,
                sharedOfaCount=profile.ofa_engines,
                gpuInstanceSliceCount=profile.slice_count,
                computeInstanceSliceCount=int(info.sliceCount),
                memorySizeMB=profile.memory_mb,
            ),
        }
        slots[free] = mig
        created = FakeComputeInstance(gi, ci_id, profile_id, int(info.sliceCount), mig)
        gi.compute_instances[ci_id] = created
        return created

    def _compute_instances(
        self, gi: FakeGpuInstance, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        info = self._ci_profile_info(gi, profile_id, 0)
        count = _deref(count_ref, "count")
        found = [ci for ci in gi.compute_instances.values() if ci.profile_id == profile_id]
        if not isinstance(array, ctypes.Array) or len(array) < int(info.instanceCount):
            raise nvml_error(NVML_ERROR_INVALID_ARGUMENT)
        for slot, ci in enumerate(sorted(found, key=lambda c: c.id)):
            array[slot] = ci
        count.value = len(found)
        return 0

    def _ci_info(self, ci: FakeComputeInstance) -> Any:
        self._live(ci)
        return types.SimpleNamespace(
            device=ci.gpu_instance.gpu,
            gpuInstance=ci.gpu_instance,
            id=ci.id,
            profileId=ci.profile_id,
            placement=types.SimpleNamespace(start=0, size=ci.slice_count),
        )

    def _destroy_ci(self, ci: FakeComputeInstance) -> int:
        self._live(ci)
        ci.destroyed = True
        del ci.gpu_instance.compute_instances[ci.id]
        slots: list[dict[str, Any] | None] = ci.gpu_instance.gpu["migSlots"]
        slots[slots.index(ci.mig)] = None
        return 0

    def create_instance(
        self, gpu_index: int, profile_name: str, start: int, with_ci: bool = True
    ) -> FakeGpuInstance:
        """Create a GPU instance (and a compute instance filling it) directly on fake GPU
        ``gpu_index``, as another tool (nvidia-smi, mig-parted) would."""
        gpu = self.gpus[gpu_index]
        profile = next(p for p in gpu["migProfiles"] if p.name == profile_name)
        placement = next(p for p in profile.placements if p.start == start)
        gi = self.create_gpu_instance(gpu, profile.profile_id, placement)
        if with_ci:
            self._create_ci(gi, COMPUTE_PROFILE_FOR_SLICES[profile.slice_count])
        return gi
