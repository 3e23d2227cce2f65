"""Shared pieces of the health tests: a fake pynvml with the event API, recording sinks."""

from __future__ import annotations

import queue
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeletplugin.devices.mock import MockBackend
from kubeletplugin.health.events import HealthEvent
from kubeletplugin.kubelet.healthservice import DeviceHealthStatus
from kubeletplugin.model import GpuInfo

NODE = "n1"

NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NOT_SUPPORTED = 3

XID = 0x0008
DBE = 0x0002
GPU_UNAVAILABLE = 0x4000
#: The MIG instance id of an NVML event that names none.
NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__({10: "Timeout", 15: "GPU is lost", 3: "Not Supported"}.get(value, value))
        self.value = value


def gpus(count: int = 2) -> list[GpuInfo]:
    return MockBackend(NODE, count=count).discover()


class FakeEventNvml:
    """The part of pynvml the health checker uses.

    ``push(uuid, event_type, data, gi, ci)`` queues an event for ``nvmlEventSetWait`` (``gi``,
    ``ci``: the MIG instance ids it names, ``0xFFFFFFFF`` for none), which honours its timeout
    (raising the timeout error); ``lost`` holds UUIDs whose queries fail with GPU lost.
    """

    def __init__(self, uuids: Sequence[str], supported: int = XID | DBE | GPU_UNAVAILABLE) -> None:
        self.uuids = list(uuids)
        self.supported = supported
        self.events: queue.Queue[tuple[str | None, int, int, int, int]] = queue.Queue()
        self.lost: set[str] = set()
        #: UUID -> (isPending, failureOccurred) of nvmlDeviceGetRemappedRows
        self.remap: dict[str, tuple[bool, bool]] = {}
        #: UUIDs whose retired pages are pending
        self.pages_pending: set[str] = set()
        #: When False the GPU does not support the two queries above (NOT_SUPPORTED)
        self.reset_queries = True
        self.registered: dict[str, int] = {}
        self.calls: list[str] = []
        self.waits = 0
        self.init_error: NVMLError | None = None
        self.shut_down = False
        self.freed = False
        self._lock = threading.Lock()

    def push(
        self,
        uuid: str | None,
        event_type: int,
        data: int = 0,
        gi: int = NO_INSTANCE,
        ci: int = NO_INSTANCE,
    ) -> None:
        self.events.put((uuid, event_type, data, gi, ci))

    def module(self, with_unavailable_constant: bool = True) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        mod.NVMLError = NVMLError  # type: ignore[attr-defined]
        mod.NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT  # type: ignore[attr-defined]
        mod.nvmlEventTypeXidCriticalError = XID  # type: ignore[attr-defined]
        mod.nvmlEventTypeDoubleBitEccError = DBE  # type: ignore[attr-defined]
        if with_unavailable_constant:
            mod.nvmlEventTypeGpuUnavailableError = GPU_UNAVAILABLE  # type: ignore[attr-defined]
        functions: dict[str, Callable[..., Any]] = {
            "nvmlInit": self._init,
            "nvmlShutdown": self._shutdown,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlEventSetFree": self._free,
            "nvmlDeviceGetHandleByUUID": self._handle,
            "nvmlDeviceGetSupportedEventTypes": lambda h: self.supported,
            "nvmlDeviceRegisterEvents": self._register,
            "nvmlEventSetWait": self._wait,
            "nvmlDeviceGetUUID": self._uuid,
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetRemappedRows": self._remapped_rows,
            "nvmlDeviceGetRetiredPagesPendingStatus": self._pages_pending,
        }
        for name, fn in functions.items():
            setattr(mod, name, self._recorded(name, fn))
        return mod

    def _recorded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with self._lock:
                self.calls.append(name)
            return fn(*args)

        return call

    def _init(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def _shutdown(self) -> None:
        self.shut_down = True

    def _free(self, event_set: Any) -> None:
        self.freed = True

    def _handle(self, uuid: str | bytes) -> dict[str, str]:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text not in self.uuids:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return {"uuid": text}

    def _register(self, handle: dict[str, str], types_: int, event_set: Any) -> None:
        if types_ & ~self.supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self.registered[handle["uuid"]] = types_

    def _wait(self, event_set: Any, timeout_ms: int) -> Any:
        self.waits += 1
        try:
            uuid, event_type, data, gi, ci = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        device = {"uuid": uuid} if uuid is not None else None
        return types.SimpleNamespace(
            device=device,
            eventType=event_type,
            eventData=data,
            gpuInstanceId=gi,
            computeInstanceId=ci,
        )

    def _uuid(self, handle: dict[str, str] | None) -> str:
        if handle is None:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle["uuid"]

    def _memory(self, handle: dict[str, str]) -> Any:
        if handle["uuid"] in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return types.SimpleNamespace(total=1, free=1, used=0)

    def _remapped_rows(self, handle: dict[str, str]) -> tuple[int, int, int, int]:
        _unsupported_unless(self.reset_queries)
        pending, failed = self.remap.get(handle["uuid"], (False, False))
        return (0, 1 if pending or failed else 0, int(pending), int(failed))

    def _pages_pending(self, handle: dict[str, str]) -> int:
        _unsupported_unless(self.reset_queries)
        return 1 if handle["uuid"] in self.pages_pending else 0


def _unsupported_unless(flag: bool) -> None:
    if not flag:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


class RecordingTaints:
    """A TaintSink that keeps every taint map it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, list[dict[str, Any]]]] = []

    def set_taints(self, taints: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        self.calls.append({k: [dict(t) for t in v] for k, v in taints.items()})


class RecordingStream:
    """A HealthListSink that keeps every list it was given."""

    def __init__(self) -> None:
        self.lists: list[list[DeviceHealthStatus]] = []

    def publish(self, devices: Sequence[DeviceHealthStatus]) -> None:
        self.lists.append(list(devices))


class ManualChecker:
    """A HealthChecker the test drives: ``errors`` answers probes, ``emit`` sends events."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.report: Callable[[HealthEvent], None] | None = None
        self.started = False
        self.stopped = False

    def start(self, gpus: Sequence[GpuInfo], report: Callable[[HealthEvent], None]) -> None:
        self.started = True
        self.report = report

    def probe(self, gpu: GpuInfo) -> str | None:
        return self.errors.get(gpu.uuid)

    def stop(self) -> None:
        self.stopped = True

    def emit(self, event: HealthEvent) -> None:
        assert self.report is not None, "checker not started"
        self.report(event)
