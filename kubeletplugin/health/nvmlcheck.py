"""GPU health from NVML: an event thread (XIDs, double-bit ECC, lost GPU) and a per-GPU probe.

Invariants:
- NVML is initialised once in :meth:`NvmlHealthChecker.start` and shut down in
  :meth:`NvmlHealthChecker.stop`, which also frees the event set; ``stop`` returns within about
  one wait timeout because ``nvmlEventSetWait`` is always called with a timeout;
- event types a GPU does not support are not registered (the probe still covers that GPU);
- an event whose device cannot be identified counts for every GPU (fail safe); an event with a
  NULL device handle names no GPU and is not looked up (NVML is never passed a NULL handle);
- UUIDs are passed to NVML as bytes (old ``pynvml`` versions do not convert ``str``);
- NVML failures never escape into the caller: registration problems are logged, a failing probe
  is an unhealthy GPU with the NVML error as its reason;
- the probe also reads the conditions only a GPU reset clears (a pending or failed row remap,
  pending page retirement) where the GPU supports them and reports each as a
  :attr:`~kubeletplugin.health.events.EventKind.RESET_REQUIRED` event, so the GPU's taint stays
  until the reset.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Final

from kubeletplugin.health.events import EventKind, HealthEvent
from kubeletplugin.health.monitor import EventHandler
from kubeletplugin.model import GpuInfo

log = logging.getLogger(__name__)

#: NVML event type bits (nvml.h); used when pynvml lacks a constant.
EVENT_DOUBLE_BIT_ECC: Final = 0x0002
EVENT_XID_CRITICAL: Final = 0x0008
EVENT_GPU_UNAVAILABLE: Final = 0x4000
#: ``NVML_ERROR_TIMEOUT``: nvmlEventSetWait found no event in time.
NVML_ERROR_TIMEOUT: Final = 10
DEFAULT_WAIT_TIMEOUT_MS: Final = 1000
#: ``NVML_FEATURE_ENABLED``: what nvmlDeviceGetRetiredPagesPendingStatus returns when pending.
NVML_FEATURE_ENABLED: Final = 1
#: Pause after an unexpected wait failure, so a broken event set cannot spin.
ERROR_PAUSE_S: Final = 5.0
#: The GPU/compute instance id of an NVML event that names no MIG instance (``0xFFFFFFFF``).
NO_INSTANCE: Final = 0xFFFFFFFF


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _instance_id(data: Any, field: str) -> int | None:
    """A MIG instance id of an NVML event; None when absent (old pynvml) or "no instance"."""
    value = getattr(data, field, None)
    if isinstance(value, bool) or not isinstance(value, int) or value == NO_INSTANCE:
        return None
    return value


class NvmlHealthChecker:
    """A :class:`~kubeletplugin.health.monitor.HealthChecker` backed by NVML.

    ``nvml`` is the ``pynvml`` module (imported on :meth:`start` when not given).
    """

    def __init__(
        self, nvml: ModuleType | None = None, wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS
    ) -> None:
        if wait_timeout_ms < 1:
            raise ValueError(f"wait_timeout_ms must be >= 1, got {wait_timeout_ms}")
        self._nvml = nvml
        self.wait_timeout_ms = wait_timeout_ms
        self._event_set: Any = None
        self._initialised = False
        self._init_error: str | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._report: EventHandler | None = None
        #: GPU UUID -> the event types registered for it.
        self.registered: dict[str, int] = {}

    def _module(self) -> ModuleType:
        if self._nvml is None:
            self._nvml = importlib.import_module("pynvml")
        return self._nvml

    def _error(self) -> type[BaseException]:
        """``pynvml.NVMLError``: the base class of every error NVML reports."""
        error: type[BaseException] = self._module().NVMLError
        return error

    def _const(self, name: str, default: int) -> int:
        value = getattr(self._module(), name, default)
        return value if isinstance(value, int) else default

    def _wanted_events(self) -> int:
        wanted = self._const("nvmlEventTypeXidCriticalError", EVENT_XID_CRITICAL)
        wanted |= self._const("nvmlEventTypeDoubleBitEccError", EVENT_DOUBLE_BIT_ECC)
        if hasattr(self._module(), "nvmlEventTypeGpuUnavailableError"):
            wanted |= self._const("nvmlEventTypeGpuUnavailableError", EVENT_GPU_UNAVAILABLE)
        return wanted

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, gpus: Sequence[GpuInfo], report: EventHandler) -> None:
        """Initialise NVML, register for events on every GPU, start the event thread."""
        self._report = report
        try:
            nvml = self._module()
            nvml.nvmlInit()
        except ImportError as exc:  # no pynvml
            self._unavailable(exc)
            return
        except self._error() as exc:
            self._unavailable(exc)
            return
        self._initialised = True
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("GPU health: NVML events unavailable, probing only: %s", exc)
            return
        wanted = self._wanted_events()
        for gpu in gpus:
            self._register(gpu, wanted)
        if not self.registered:
            log.warning("GPU health: no GPU supports the wanted NVML events; probing only")
        self._thread = threading.Thread(target=self._event_loop, name="nvml-events", daemon=True)
        self._thread.start()

    def _unavailable(self, exc: BaseException) -> None:
        self._init_error = f"NVML unavailable: {exc}"
        log.error("GPU health: cannot initialise NVML, every probe fails: %s", exc)

    def _register(self, gpu: GpuInfo, wanted: int) -> None:
        nvml = self._module()
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            except nvml.NVMLError as exc:
                log.debug("GPU %d: supported event types unknown (%s)", gpu.index, exc)
                supported = wanted
            types = wanted & supported
            if not types:
                log.warning("GPU %d supports none of the health events; probing only", gpu.index)
                return
            nvml.nvmlDeviceRegisterEvents(handle, types, self._event_set)
        except nvml.NVMLError as exc:
            log.warning("GPU %d: cannot register NVML health events: %s", gpu.index, exc)
            return
        self.registered[gpu.uuid] = types

    def stop(self) -> None:
        """Stop the event thread, free the event set, shut NVML down."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.wait_timeout_ms / 1000 + 5)
            self._thread = None
        if not self._initialised:
            return
        nvml = self._module()
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._event_set = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
        self._initialised = False

    # --- events ---------------------------------------------------------------------------

    def _is_timeout(self, exc: BaseException) -> bool:
        timeout = self._const("NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT)
        return getattr(exc, "value", None) == timeout

    def _event_loop(self) -> None:
        nvml = self._module()
        while not self._stopping.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, self.wait_timeout_ms)
            except nvml.NVMLError as exc:
                if self._is_timeout(exc):
                    continue
                log.warning("waiting for NVML events failed: %s", exc)
                self._stopping.wait(ERROR_PAUSE_S)
                continue
            event = self.to_event(data)
            if event is not None and self._report is not None:
                self._report(event)

    def to_event(self, data: Any) -> HealthEvent | None:
        """The :class:`HealthEvent` for one ``c_nvmlEventData_t``; None for other event types."""
        uuid: str | None = None
        if not data.device:
            # A NULL handle: the event names no GPU. NVML is never called with a NULL handle.
            log.warning("NVML event names no GPU: applies to every GPU")
        else:
            try:
                uuid = _text(self._module().nvmlDeviceGetUUID(data.device))
            except self._error() as exc:
                log.warning("NVML event from an unidentified GPU (%s): applies to every GPU", exc)
        event_type = int(data.eventType)
        gi = _instance_id(data, "gpuInstanceId")
        ci = _instance_id(data, "computeInstanceId") if gi is not None else None
        if event_type & self._const("nvmlEventTypeXidCriticalError", EVENT_XID_CRITICAL):
            return HealthEvent(uuid, EventKind.XID, int(data.eventData), "", gi, ci)
        if event_type & self._const("nvmlEventTypeDoubleBitEccError", EVENT_DOUBLE_BIT_ECC):
            return HealthEvent(uuid, EventKind.DOUBLE_BIT_ECC, None, "", gi, ci)
        if event_type & self._const("nvmlEventTypeGpuUnavailableError", EVENT_GPU_UNAVAILABLE):
            return HealthEvent(
                uuid, EventKind.GPU_LOST, None, "NVML reports the GPU unavailable", gi, ci
            )
        log.debug("ignoring NVML event type 0x%x", event_type)
        return None

    # --- probe ----------------------------------------------------------------------------

    def probe(self, gpu: GpuInfo) -> str | None:
        """Look the GPU up by UUID and read its memory info; an NVML error is the reason."""
        if not self._initialised:
            return self._init_error or "NVML is not initialised"
        nvml = self._module()
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as exc:
            return f"NVML query failed: {exc}"
        pending = self.reset_pending(handle)
        if pending is not None and self._report is not None:
            self._report(HealthEvent(gpu.uuid, EventKind.RESET_REQUIRED, detail=pending))
        return None

    def reset_pending(self, handle: Any) -> str | None:
        """Why the GPU waits for a reset (row remap pending or failed, page retirement
        pending), or None; a query the GPU or driver does not support counts as nothing."""
        nvml = self._module()
        try:
            _corr, _unc, is_pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
            if failure:
                return "row remapping failed"
            if is_pending:
                return "row remapping pending"
        except (nvml.NVMLError, AttributeError) as exc:  # AttributeError: pynvml too old
            log.debug("remapped rows unknown: %s", exc)
        try:
            status = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
            enabled = self._const("NVML_FEATURE_ENABLED", NVML_FEATURE_ENABLED)
            if int(status) == enabled:
                return "retired pages pending"
        except (nvml.NVMLError, AttributeError) as exc:
            log.debug("retired pages pending status unknown: %s", exc)
        return None
