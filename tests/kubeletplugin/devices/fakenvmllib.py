"""A fake ``libnvidia-ml.so.1`` at the C-function level, run beneath the real ``pynvml`` module.

pynvml looks each NVML entry point up with ``getattr(pynvml.nvmlLib, name)`` and calls it with
ctypes arguments (``byref`` of a struct or scalar, string buffers, ``c_uint`` values, handles).
:class:`FakeNvmlLib` stands in for that library object, so the project's code runs through
pynvml's own wrappers, structs, versioned names and error mapping; only the C side is emulated.

Invariants:
- each entry point checks its arguments' ctypes types as nvml.h declares them and that every
  handle is one this fake handed out; a mismatch is recorded in :attr:`FakeNvmlLib.violations`
  and answered with ``NVML_ERROR_INVALID_ARGUMENT`` (what a caller sees of a bad call); so is
  a call made outside an NVML session (``NVML_ERROR_UNINITIALIZED``);
- a name the fake does not implement is recorded in :attr:`FakeNvmlLib.missing` (pynvml then
  raises ``NVMLError_FunctionNotFound``); names in ``absent`` emulate an older driver that lacks
  them and are not recorded;
- results are written into the caller's ctypes objects exactly where the C library would;
- a GPU with ``mig_profiles`` (a :mod:`~kubeletplugin.devices.migtables` table) answers the GPU
  and compute instance entry points; a GPU instance is created only where
  :func:`~kubeletplugin.devices.migtables.placement_problem` allows it (else
  ``NVML_ERROR_INSUFFICIENT_RESOURCES``), and each compute instance is a MIG device in ``migs``;
- :func:`installed` swaps pynvml's library and its function-pointer cache in and restores both.
"""

from __future__ import annotations

import ctypes
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import pynvml

from kubeletplugin.devices import migtables
from kubeletplugin.model import MigPlacement, MigProfile

SUCCESS: Final = 0
MIB: Final = 1024**2
#: ``nvmlMemory_v2`` in nvml.h: ``NVML_STRUCT_VERSION(Memory, 2)``.
MEMORY_V2_VERSION: Final = 40 | (2 << 24)


class _BadCall(Exception):
    """Internal: an argument does not match the C prototype."""


@dataclass
class FakeMig:
    """One MIG device as NVML describes it."""

    uuid: str
    gpu_instance: int
    compute_instance: int
    multiprocessors: int
    gpu_slices: int
    compute_slices: int
    memory_mb: int
    reserved: int = 0
    struct: Any = field(default_factory=pynvml.struct_c_nvmlDevice_t, repr=False)


@dataclass(eq=False)
class FakeComputeInstance:
    """A compute instance and its MIG device."""

    id: int
    profile_id: int
    slices: int
    mig: FakeMig
    struct: Any = field(default_factory=pynvml.struct_c_nvmlComputeInstance_t, repr=False)


@dataclass(eq=False)
class FakeGpuInstance:
    """A GPU instance of ``profile`` at ``placement``."""

    id: int
    profile: MigProfile
    placement: MigPlacement
    cis: list[FakeComputeInstance] = field(default_factory=list)
    struct: Any = field(default_factory=pynvml.struct_c_nvmlGpuInstance_t, repr=False)


@dataclass
class FakeGpu:
    """One physical GPU. ``mig_mode`` is ``(current, pending)`` or None (not supported);
    ``utilization`` is ``(pid, microsecond timestamp, SM %)`` samples or None (not supported);
    ``errors`` maps a C function name to the return code it gives for this GPU."""

    uuid: str
    name: str
    bus_id: str
    minor: int
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_total: int
    memory_reserved: int
    numa_node: int | None = None
    mig_mode: tuple[int, int] | None = (0, 0)
    mig_slots: int = 0
    migs: list[FakeMig] = field(default_factory=list)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    #: Pids among ``processes`` that are MPS clients (what the MPS process list reports).
    mps_clients: list[int] = field(default_factory=list)
    utilization: list[tuple[int, int, int]] | None = field(default_factory=list)
    supported_events: int = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x4000
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_pages_pending: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    #: GPU instance profiles (MIG mode only); empty: NVML supports no profile
    mig_profiles: tuple[MigProfile, ...] = ()
    gpu_instances: list[FakeGpuInstance] = field(default_factory=list)
    #: NVLinks, by link number: (active, remote device type, remote PCI bus ID in NVML's form);
    #: None: the GPU has no NVLink (every link call answers NOT_SUPPORTED)
    nvlinks: list[tuple[bool, int, str]] | None = None
    #: NVSwitch fabric registration (cluster UUID, clique id, state, status); None: no fabric
    #: (NOT_SUPPORTED)
    fabric: tuple[bytes, int, int, int] | None = None
    struct: Any = field(default_factory=pynvml.struct_c_nvmlDevice_t, repr=False)


def _out(arg: Any, ctype: Any) -> Any:
    """The object behind ``byref(obj)``; :class:`_BadCall` unless it is a ``ctype``."""
    obj = getattr(arg, "_obj", None)
    if type(arg).__name__ != "CArgObject" or not isinstance(obj, ctype):
        raise _BadCall(f"expected byref({ctype.__name__}), got {arg!r}")
    return obj


def _value(arg: Any, ctype: Any) -> Any:
    """The value of a scalar passed by value: a ``ctype`` or, as ctypes converts it to a C
    ``int``, a Python ``int``; :class:`_BadCall` for anything else."""
    if isinstance(arg, int) and not isinstance(arg, bool) and ctype is not ctypes.c_char_p:
        return arg
    if not isinstance(arg, ctype):
        raise _BadCall(f"expected {ctype.__name__}, got {arg!r}")
    return arg.value


def _write_string(buf: Any, size: Any, text: str) -> int:
    """Copy ``text`` into a ``create_string_buffer`` of the stated size."""
    limit = _value(size, ctypes.c_uint)
    if not isinstance(buf, ctypes.Array) or ctypes.sizeof(buf) < limit:
        raise _BadCall(f"expected a char buffer of {limit} bytes, got {buf!r}")
    data = text.encode()
    if len(data) + 1 > limit:
        return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data
    return SUCCESS


class FakeNvmlLib:
    """The C entry points pynvml calls, over ``gpus``; see the module docstring."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver: str = "580.95.05",
        cuda: int = 13000,
        init_error: int = SUCCESS,
        absent: frozenset[str] = frozenset(),
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.absent = absent
        self.calls: list[str] = []
        self.missing: list[str] = []
        self.violations: list[str] = []
        self.registered: dict[str, int] = {}
        self.memory_versions: list[int] = []
        self.utilization_since: list[int] = []
        self.initialised = 0
        self.event_set = pynvml.struct_c_nvmlEventSet_t()
        self._events: list[tuple[FakeGpu | None, int, int]] = []
        self._cond = threading.Condition()

    # --- the library surface ----------------------------------------------------------

    def __getattr__(self, name: str) -> Callable[..., Any]:
        impl = getattr(type(self), "_c_" + name, None)
        if name in self.absent or not name.startswith("nvml"):
            raise AttributeError(name)
        if impl is None:
            self.missing.append(name)
            raise AttributeError(name)

        if name == "nvmlErrorString":  # returns a string; callable outside a session
            return lambda code: self._c_nvmlErrorString(code)

        def call(*args: Any) -> int:
            self.calls.append(name)
            if name != "nvmlInitWithFlags" and self.initialised == 0:
                self.violations.append(f"{name}: called without an NVML session")
                return int(pynvml.NVML_ERROR_UNINITIALIZED)
            try:
                return int(impl(self, *args))
            except _BadCall as exc:
                self.violations.append(f"{name}: {exc}")
                return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        return call

    def push_event(self, gpu: FakeGpu | None, event_type: int, data: int = 0) -> None:
        """Queue one event for ``nvmlEventSetWait_v2`` (``gpu`` None: no device)."""
        with self._cond:
            self._events.append((gpu, event_type, data))
            self._cond.notify_all()

    # --- handles ----------------------------------------------------------------------

    def _device(self, handle: Any) -> FakeGpu | FakeMig:
        if not isinstance(handle, pynvml.c_nvmlDevice_t):
            raise _BadCall(f"expected an nvmlDevice_t handle, got {handle!r}")
        if not handle:
            raise _BadCall("NULL device handle")
        address = ctypes.addressof(handle.contents)
        for gpu in self.gpus:
            if ctypes.addressof(gpu.struct) == address:
                return gpu
            for mig in gpu.migs:
                if ctypes.addressof(mig.struct) == address:
                    return mig
        raise _BadCall(f"unknown device handle {address:#x}")

    def _gpu(self, handle: Any) -> FakeGpu:
        device = self._device(handle)
        if not isinstance(device, FakeGpu):
            raise _BadCall("a MIG device handle where a GPU handle is required")
        return device

    def _failure(self, device: FakeGpu | FakeMig, name: str) -> int:
        if isinstance(device, FakeGpu):
            return device.errors.get(name, SUCCESS)
        return SUCCESS

    def _set_handle(self, ref: Any, struct: Any) -> int:
        _out(ref, pynvml.c_nvmlDevice_t).contents = struct
        return SUCCESS

    # --- system -----------------------------------------------------------------------

    #: nvmlErrorString's texts for codes pynvml has no text of its own for.
    ERROR_STRINGS: Final = {23: b"Insufficient Resources", 19: b"In use by another client"}

    def _c_nvmlErrorString(self, code: Any) -> bytes:
        self.calls.append("nvmlErrorString")
        return self.ERROR_STRINGS.get(_value(code, ctypes.c_int), b"Unknown Error")

    def _c_nvmlInitWithFlags(self, flags: Any) -> int:
        _value(flags, ctypes.c_uint)
        if self.init_error == SUCCESS:
            self.initialised += 1
        return self.init_error

    def _c_nvmlShutdown(self) -> int:
        if self.initialised == 0:
            return int(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1
        return SUCCESS

    def _c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        return _write_string(buf, size, self.driver)

    def _c_nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        _out(ref, ctypes.c_int).value = self.cuda
        return SUCCESS

    def _c_nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        return self._c_nvmlSystemGetCudaDriverVersion_v2(ref)

    def _c_nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = len(self.gpus)
        return SUCCESS

    def _c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = _value(index, ctypes.c_uint)
        if i >= len(self.gpus):
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = self.gpus[i].errors.get("nvmlDeviceGetHandleByIndex_v2", SUCCESS)
        return code or self._set_handle(ref, self.gpus[i].struct)

    def _c_nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        wanted = _value(uuid, ctypes.c_char_p)
        for gpu in self.gpus:
            devices: list[FakeGpu | FakeMig] = [gpu, *gpu.migs]
            for device in devices:
                if device.uuid.encode() == wanted:
                    code = self._failure(device, "nvmlDeviceGetHandleByUUID")
                    return code or self._set_handle(ref, device.struct)
        return int(pynvml.NVML_ERROR_NOT_FOUND)

    # --- device description -----------------------------------------------------------

    def _c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        device = self._device(handle)
        return self._failure(device, "nvmlDeviceGetUUID") or _write_string(buf, size, device.uuid)

    def _c_nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        return _write_string(buf, size, self._gpu(handle).name)

    def _c_nvmlDeviceGetMinorNumber(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._gpu(handle).minor
        return SUCCESS

    def _c_nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        info = _out(ref, pynvml.nvmlPciInfo_t)
        code = gpu.errors.get("nvmlDeviceGetPciInfo_v3", SUCCESS)
        if code:
            return code
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id.encode()
        return SUCCESS

    def _c_nvmlDeviceGetBrand(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._gpu(handle).brand
        return SUCCESS

    def _c_nvmlDeviceGetArchitecture(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._gpu(handle).architecture
        return SUCCESS

    def _c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu = self._gpu(handle)
        _out(major, ctypes.c_int).value, _out(minor, ctypes.c_int).value = gpu.compute_capability
        return SUCCESS

    def _c_nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        device = self._device(handle)
        memory = _out(ref, pynvml.c_nvmlMemory_t)
        total = device.memory_total if isinstance(device, FakeGpu) else device.memory_mb * MIB
        memory.total, memory.free, memory.used = total, total, 0
        return self._failure(device, "nvmlDeviceGetMemoryInfo")

    def _c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> int:
        device = self._device(handle)
        memory = _out(ref, pynvml.c_nvmlMemory_v2_t)
        self.memory_versions.append(int(memory.version))
        if memory.version != MEMORY_V2_VERSION:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if isinstance(device, FakeGpu):
            total, reserved = device.memory_total, device.memory_reserved
        else:
            total, reserved = device.memory_mb * MIB, device.reserved
        memory.total, memory.reserved = total, reserved
        memory.free, memory.used = total - reserved, 0
        return self._failure(device, "nvmlDeviceGetMemoryInfo_v2")

    def _c_nvmlDeviceGetNumaNodeId(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        node = _out(ref, ctypes.c_int)
        if gpu.numa_node is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        node.value = gpu.numa_node
        return SUCCESS

    # --- NVLink -----------------------------------------------------------------------

    def _link(self, handle: Any, link: Any) -> tuple[bool, int, str] | int:
        """The link's (active, remote type, remote bus ID), or the return code NVML gives:
        NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past the GPU's last link."""
        gpu = self._gpu(handle)
        number = _value(link, ctypes.c_uint)
        if gpu.nvlinks is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= number < len(gpu.nvlinks):
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[number]

    def _c_nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, ref: Any) -> int:
        out = _out(ref, ctypes.c_uint)
        found = self._link(handle, link)
        if isinstance(found, int):
            return found
        out.value = int(found[0])
        return self._gpu(handle).errors.get("nvmlDeviceGetNvLinkState", SUCCESS)

    def _c_nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, ref: Any) -> int:
        out = _out(ref, ctypes.c_uint)
        found = self._link(handle, link)
        if isinstance(found, int):
            return found
        out.value = found[1]
        return SUCCESS

    def _c_nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, ref: Any) -> int:
        info = _out(ref, pynvml.nvmlPciInfo_t)
        found = self._link(handle, link)
        if isinstance(found, int):
            return found
        info.busId = found[2].encode()
        return SUCCESS

    def _c_nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> int:
        info = _out(ref, pynvml.c_nvmlGpuFabricInfo_t)
        gpu = self._gpu(handle)
        if gpu.fabric is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        cluster, clique, state, status = gpu.fabric
        info.clusterUuid[:] = list(cluster)
        info.cliqueId, info.state, info.status = clique, state, status
        return SUCCESS

    # --- MIG --------------------------------------------------------------------------

    def _c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle)
        cur, pend = _out(current, ctypes.c_uint), _out(pending, ctypes.c_uint)
        if gpu.mig_mode is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        cur.value, pend.value = gpu.mig_mode
        return SUCCESS

    def _c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        _out(ref, ctypes.c_uint).value = gpu.mig_slots
        return SUCCESS if gpu.mig_mode is not None else int(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        slot = _value(index, ctypes.c_uint)
        _out(ref, pynvml.c_nvmlDevice_t)
        if slot >= gpu.mig_slots:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(gpu.migs):
            return int(pynvml.NVML_ERROR_NOT_FOUND)
        return self._set_handle(ref, gpu.migs[slot].struct)

    def _mig(self, handle: Any) -> FakeMig:
        device = self._device(handle)
        if not isinstance(device, FakeMig):
            raise _BadCall("a GPU handle where a MIG device handle is required")
        return device

    def _c_nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._mig(handle).gpu_instance
        return SUCCESS

    def _c_nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._mig(handle).compute_instance
        return SUCCESS

    def _c_nvmlDeviceGetAttributes_v2(self, handle: Any, ref: Any) -> int:
        mig = self._mig(handle)
        attrs = _out(ref, pynvml.c_nvmlDeviceAttributes)
        attrs.multiprocessorCount = mig.multiprocessors
        attrs.gpuInstanceSliceCount = mig.gpu_slices
        attrs.computeInstanceSliceCount = mig.compute_slices
        attrs.memorySizeMB = mig.memory_mb
        return SUCCESS

    # --- GPU and compute instances ---------------------------------------------------

    def _profile_at(self, gpu: FakeGpu, index: Any) -> MigProfile | None:
        wanted = _value(index, ctypes.c_uint)
        return next((p for p in gpu.mig_profiles if p.profile_index == wanted), None)

    def _profile_by_id(self, gpu: FakeGpu, profile_id: Any) -> MigProfile | None:
        return migtables.profile_by_id(gpu.mig_profiles, _value(profile_id, ctypes.c_uint))

    @staticmethod
    def _fill_gi_profile(info: Any, profile: MigProfile) -> None:
        info.id, info.isP2pSupported = profile.profile_id, 0
        info.sliceCount, info.instanceCount = profile.slice_count, profile.instance_count
        info.multiprocessorCount = profile.multiprocessors
        info.copyEngineCount, info.decoderCount = profile.copy_engines, profile.decoders
        info.encoderCount, info.jpegCount = profile.encoders, profile.jpeg_engines
        info.ofaCount, info.memorySizeMB = profile.ofa_engines, profile.memory_mb

    def _gi_profile_info(self, handle: Any, index: Any, ref: Any, ctype: Any) -> int | MigProfile:
        gpu = self._gpu(handle)
        info = _out(ref, ctype)
        if gpu.mig_mode is None or _value(index, ctypes.c_uint) >= 0x12:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        profile = self._profile_at(gpu, index)
        if profile is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._fill_gi_profile(info, profile)
        return profile

    def _c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: Any, ref: Any) -> int:
        info = _out(ref, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
        if info.version != pynvml.nvmlGpuInstanceProfileInfo_v2:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        found = self._gi_profile_info(handle, index, ref, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
        if isinstance(found, int):
            return found
        info.name = f"MIG {found.name}".encode()
        return SUCCESS

    def _c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: Any, ref: Any) -> int:
        found = self._gi_profile_info(handle, index, ref, pynvml.c_nvmlGpuInstanceProfileInfo_t)
        return found if isinstance(found, int) else SUCCESS

    def _c_nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count_ref: Any
    ) -> int:
        gpu = self._gpu(handle)
        count = _out(count_ref, ctypes.c_uint)
        profile = self._profile_by_id(gpu, profile_id)
        if profile is None:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if placements is not None:
            kind = pynvml.c_nvmlGpuInstancePlacement_t
            if not isinstance(placements, ctypes.Array) or placements._type_ is not kind:
                raise _BadCall(f"expected an nvmlGpuInstancePlacement_t array, got {placements!r}")
            if len(placements) < len(profile.placements):
                return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for slot, placement in zip(placements, profile.placements, strict=False):
                slot.start, slot.size = placement.start, placement.size
        count.value = len(profile.placements)
        return SUCCESS

    def create_gpu_instance(
        self, gpu: FakeGpu, profile: MigProfile, placement: MigPlacement
    ) -> FakeGpuInstance | int:
        """Create a GPU instance as the driver would; the error code where it does not fit."""
        existing = [(gi.profile.profile_id, gi.placement) for gi in gpu.gpu_instances]
        if migtables.placement_problem(gpu.mig_profiles, existing, profile.profile_id, placement):
            return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        taken = {gi.id for gi in gpu.gpu_instances} | {m.gpu_instance for m in gpu.migs}
        gi_id = next(i for i in range(1, 64) if i not in taken)
        created = FakeGpuInstance(gi_id, profile, placement)
        gpu.gpu_instances.append(created)
        return created

    def _c_nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: Any, placement_ref: Any, ref: Any
    ) -> int:
        gpu = self._gpu(handle)
        where = _out(placement_ref, pynvml.c_nvmlGpuInstancePlacement_t)
        out = _out(ref, pynvml.c_nvmlGpuInstance_t)
        profile = self._profile_by_id(gpu, profile_id)
        if profile is None or gpu.mig_mode != (1, 1) or where.size == 0:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = gpu.errors.get("nvmlDeviceCreateGpuInstanceWithPlacement", SUCCESS)
        if code:
            return code
        created = self.create_gpu_instance(
            gpu, profile, MigPlacement(int(where.start), int(where.size))
        )
        if isinstance(created, int):
            return created
        out.contents = created.struct
        return SUCCESS

    def _instance(self, handle: Any) -> tuple[FakeGpu, FakeGpuInstance]:
        if not isinstance(handle, pynvml.c_nvmlGpuInstance_t) or not handle:
            raise _BadCall(f"expected an nvmlGpuInstance_t handle, got {handle!r}")
        address = ctypes.addressof(handle.contents)
        for gpu in self.gpus:
            for gi in gpu.gpu_instances:
                if ctypes.addressof(gi.struct) == address:
                    return gpu, gi
        raise _BadCall(f"unknown (or destroyed) GPU instance handle {address:#x}")

    def _compute(self, handle: Any) -> tuple[FakeGpu, FakeGpuInstance, FakeComputeInstance]:
        if not isinstance(handle, pynvml.c_nvmlComputeInstance_t) or not handle:
            raise _BadCall(f"expected an nvmlComputeInstance_t handle, got {handle!r}")
        address = ctypes.addressof(handle.contents)
        for gpu in self.gpus:
            for gi in gpu.gpu_instances:
                for ci in gi.cis:
                    if ctypes.addressof(ci.struct) == address:
                        return gpu, gi, ci
        raise _BadCall(f"unknown (or destroyed) compute instance handle {address:#x}")

    def _c_nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        gpu, gi = self._instance(handle)
        if gi.cis:
            return int(pynvml.NVML_ERROR_IN_USE)
        code = gpu.errors.get("nvmlGpuInstanceDestroy", SUCCESS)
        if code:
            return code
        gpu.gpu_instances.remove(gi)
        return SUCCESS

    @staticmethod
    def _list(array: Any, kind: Any, count_ref: Any, items: list[Any], capacity: int) -> int:
        count = _out(count_ref, ctypes.c_uint)
        if not isinstance(array, ctypes.Array) or array._type_ is not kind:
            raise _BadCall(f"expected an array of {kind.__name__}, got {array!r}")
        if len(array) < capacity:
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, item in enumerate(items):
            array[slot] = ctypes.pointer(item.struct)
        count.value = len(items)
        return SUCCESS

    def _c_nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: Any, array: Any, count_ref: Any
    ) -> int:
        gpu = self._gpu(handle)
        profile = self._profile_by_id(gpu, profile_id)
        if profile is None:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = sorted(
            (gi for gi in gpu.gpu_instances if gi.profile is profile), key=lambda gi: gi.id
        )
        kind = pynvml.c_nvmlGpuInstance_t
        return self._list(array, kind, count_ref, found, profile.instance_count)

    def _c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        out = _out(ref, pynvml.c_nvmlGpuInstance_t)
        wanted = _value(gi_id, ctypes.c_uint)
        if gpu.mig_mode != (1, 1):
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for gi in gpu.gpu_instances:
            if gi.id == wanted:
                out.contents = gi.struct
                return SUCCESS
        return int(pynvml.NVML_ERROR_NOT_FOUND)

    def _c_nvmlGpuInstanceGetInfo(self, handle: Any, ref: Any) -> int:
        gpu, gi = self._instance(handle)
        info = _out(ref, pynvml.c_nvmlGpuInstanceInfo_t)
        info.device = ctypes.pointer(gpu.struct)
        info.id, info.profileId = gi.id, gi.profile.profile_id
        info.placement.start, info.placement.size = gi.placement.start, gi.placement.size
        return SUCCESS

    def _c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, handle: Any, profile: Any, engine: Any, ref: Any
    ) -> int:
        _gpu, gi = self._instance(handle)
        info = _out(ref, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t)
        if info.version != pynvml.nvmlComputeInstanceProfileInfo_v2:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        wanted, engine_profile = _value(profile, ctypes.c_uint), _value(engine, ctypes.c_uint)
        slices = next((n for n, v in migtables.CI_FOR_SLICES.items() if v == wanted), None)
        if wanted >= 0x9 or engine_profile != 0:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slices is None or slices > gi.profile.slice_count:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info.id, info.sliceCount = wanted, slices
        info.instanceCount = gi.profile.slice_count // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.slice_count
        info.name = f"MIG {gi.profile.name}".encode()
        return SUCCESS

    def _c_nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile: Any, ref: Any) -> int:
        gpu, gi = self._instance(handle)
        out = _out(ref, pynvml.c_nvmlComputeInstance_t)
        wanted = _value(profile, ctypes.c_uint)
        slices = next((n for n, v in migtables.CI_FOR_SLICES.items() if v == wanted), None)
        if slices is None or slices > gi.profile.slice_count:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        code = gpu.errors.get("nvmlGpuInstanceCreateComputeInstance", SUCCESS)
        if code:
            return code
        used = sum(ci.slices for ci in gi.cis)
        if used + slices > gi.profile.slice_count or len(gpu.migs) >= gpu.mig_slots:
            return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(64) if i not in {ci.id for ci in gi.cis})
        mig = FakeMig(
            f"MIG-{gpu.minor:08x}-{gi.id:04x}-{ci_id:04x}-0000-{len(self.calls):012x}",
            gi.id,
            ci_id,
            gi.profile.multiprocessors * slices // gi.profile.slice_count,
            gi.profile.slice_count,
            slices,
            gi.profile.memory_mb,
        )
        created = FakeComputeInstance(ci_id, wanted, slices, mig)
        gi.cis.append(created)
        gpu.migs.append(mig)
        out.contents = created.struct
        return SUCCESS

    def _c_nvmlGpuInstanceGetComputeInstances(
        self, handle: Any, profile_id: Any, array: Any, count_ref: Any
    ) -> int:
        _gpu, gi = self._instance(handle)
        wanted = _value(profile_id, ctypes.c_uint)
        slices = next((n for n, v in migtables.CI_FOR_SLICES.items() if v == wanted), None)
        if slices is None or slices > gi.profile.slice_count:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = sorted((ci for ci in gi.cis if ci.profile_id == wanted), key=lambda c: c.id)
        kind = pynvml.c_nvmlComputeInstance_t
        return self._list(array, kind, count_ref, found, gi.profile.slice_count // slices)

    def _c_nvmlComputeInstanceGetInfo_v2(self, handle: Any, ref: Any) -> int:
        gpu, gi, ci = self._compute(handle)
        info = _out(ref, pynvml.c_nvmlComputeInstanceInfo_t)
        info.device = ctypes.pointer(gpu.struct)
        info.gpuInstance = ctypes.pointer(gi.struct)
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = 0, ci.slices
        return SUCCESS

    def _c_nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        gpu, gi, ci = self._compute(handle)
        code = gpu.errors.get("nvmlComputeInstanceDestroy", SUCCESS)
        if code:
            return code
        gi.cis.remove(ci)
        gpu.migs.remove(ci.mig)
        return SUCCESS

    # --- health -----------------------------------------------------------------------

    def _c_nvmlEventSetCreate(self, ref: Any) -> int:
        _out(ref, pynvml.c_nvmlEventSet_t).contents = self.event_set
        return SUCCESS

    def _event_set_ok(self, event_set: Any) -> None:
        if not isinstance(event_set, pynvml.c_nvmlEventSet_t) or not event_set:
            raise _BadCall(f"expected an nvmlEventSet_t, got {event_set!r}")
        if ctypes.addressof(event_set.contents) != ctypes.addressof(self.event_set):
            raise _BadCall("unknown event set")

    def _c_nvmlDeviceGetSupportedEventTypes(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_ulonglong).value = self._gpu(handle).supported_events
        return SUCCESS

    def _c_nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._gpu(handle)
        wanted = _value(types, ctypes.c_ulonglong)
        self._event_set_ok(event_set)
        if wanted & ~gpu.supported_events:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered[gpu.uuid] = wanted
        return SUCCESS

    def _c_nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        self._event_set_ok(event_set)
        data = _out(ref, pynvml.c_nvmlEventData_t)
        timeout = _value(timeout_ms, ctypes.c_uint)
        with self._cond:
            if not self._events:
                self._cond.wait(timeout / 1000)
            if not self._events:
                return int(pynvml.NVML_ERROR_TIMEOUT)
            gpu, event_type, event_data = self._events.pop(0)
        if gpu is not None:
            data.device = ctypes.pointer(gpu.struct)
        data.eventType, data.eventData = event_type, event_data
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
        return SUCCESS

    def _c_nvmlEventSetFree(self, event_set: Any) -> int:
        self._event_set_ok(event_set)
        return SUCCESS

    def _c_nvmlDeviceGetRemappedRows(
        self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        gpu = self._gpu(handle)
        refs = [_out(r, ctypes.c_uint) for r in (corr, unc, pending, failure)]
        for ref, value in zip(refs, gpu.remapped_rows, strict=True):
            ref.value = value
        return SUCCESS

    def _c_nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, ref: Any) -> int:
        _out(ref, ctypes.c_uint).value = self._gpu(handle).retired_pages_pending
        return SUCCESS

    # --- usage ------------------------------------------------------------------------

    def _c_nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: Any, count_ref: Any, infos: Any
    ) -> int:
        gpu = self._gpu(handle)
        return self._process_list(
            gpu, "nvmlDeviceGetComputeRunningProcesses_v3", gpu.processes, count_ref, infos
        )

    def _c_nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, handle: Any, count_ref: Any, infos: Any
    ) -> int:
        gpu = self._gpu(handle)
        clients = [p for p in gpu.processes if p[0] in gpu.mps_clients]
        return self._process_list(
            gpu, "nvmlDeviceGetMPSComputeRunningProcesses_v3", clients, count_ref, infos
        )

    def _process_list(
        self,
        gpu: FakeGpu,
        name: str,
        processes: list[tuple[int, int | None]],
        count_ref: Any,
        infos: Any,
    ) -> int:
        count = _out(count_ref, ctypes.c_uint)
        code = gpu.errors.get(name, SUCCESS)
        if code:
            return code
        wanted = len(processes)
        if infos is None:
            count.value = wanted
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE) if wanted else SUCCESS
        if not isinstance(infos, ctypes.Array) or infos._type_ is not pynvml.c_nvmlProcessInfo_v3_t:
            raise _BadCall(f"expected an nvmlProcessInfo_v3_t array, got {infos!r}")
        if count.value < wanted or len(infos) < count.value:
            count.value = wanted
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, (pid, used) in zip(infos, processes, strict=False):
            slot.pid = pid
            slot.usedGpuMemory = used if used is not None else 2**64 - 1
            slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
        count.value = wanted
        return SUCCESS

    def _c_nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count_ref: Any, since: Any
    ) -> int:
        gpu = self._gpu(handle)
        count = _out(count_ref, ctypes.c_uint)
        last_seen = _value(since, ctypes.c_ulonglong)
        if gpu.utilization is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in gpu.utilization if s[1] > last_seen]
        if not fresh:
            return int(pynvml.NVML_ERROR_NOT_FOUND)
        if samples is None:
            self.utilization_since.append(last_seen)
            count.value = len(fresh)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        kind = pynvml.c_nvmlProcessUtilizationSample_t
        if not isinstance(samples, ctypes.Array) or samples._type_ is not kind:
            raise _BadCall(f"expected an nvmlProcessUtilizationSample_t array, got {samples!r}")
        if len(samples) < len(fresh) or count.value < len(fresh):
            count.value = len(fresh)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, (pid, stamp, sm) in zip(samples, fresh, strict=False):
            slot.pid, slot.timeStamp, slot.smUtil = pid, stamp, sm
        count.value = len(fresh)
        return SUCCESS


class StrictModule(types.ModuleType):
    """``module`` as the project sees it, recording in :attr:`missing` every name looked up that
    the module lacks (the project treats an absent pynvml function as "old pynvml" and goes on,
    so a misspelt name would otherwise pass unnoticed)."""

    def __init__(self, module: types.ModuleType) -> None:
        super().__init__(module.__name__)
        self.real = module
        self.missing: list[str] = []

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self.real, name)
        except AttributeError:
            self.missing.append(name)
            raise


@contextmanager
def installed(lib: FakeNvmlLib) -> Iterator[FakeNvmlLib]:
    """Make ``lib`` pynvml's C library for the duration of the block (pynvml keeps one library
    per process: tests using this must not run concurrently)."""
    saved_lib, saved_cache = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield lib
    finally:
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
