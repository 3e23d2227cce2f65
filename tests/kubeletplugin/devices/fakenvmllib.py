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
    utilization: list[tuple[int, int, int]] | None = field(default_factory=list)
    supported_events: int = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x4000
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_pages_pending: int = 0
    errors: dict[str, int] = field(default_factory=dict)
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

    def __getattr__(self, name: str) -> Callable[..., int]:
        impl = getattr(type(self), "_c_" + name, None)
        if name in self.absent or not name.startswith("nvml"):
            raise AttributeError(name)
        if impl is None:
            self.missing.append(name)
            raise AttributeError(name)

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
        count = _out(count_ref, ctypes.c_uint)
        code = gpu.errors.get("nvmlDeviceGetComputeRunningProcesses_v3", SUCCESS)
        if code:
            return code
        wanted = len(gpu.processes)
        if infos is None:
            count.value = wanted
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE) if wanted else SUCCESS
        if not isinstance(infos, ctypes.Array) or infos._type_ is not pynvml.c_nvmlProcessInfo_v3_t:
            raise _BadCall(f"expected an nvmlProcessInfo_v3_t array, got {infos!r}")
        if count.value < wanted or len(infos) < count.value:
            count.value = wanted
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, (pid, used) in zip(infos, gpu.processes, strict=False):
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
