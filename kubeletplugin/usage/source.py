"""Where samples come from: the :class:`UsageSource` seam and its NVML implementation.

:class:`NvmlUsageSource` opens one NVML session for its lifetime (``open`` / ``close``) and per
sample calls, for each GPU (by UUID):

- ``nvmlDeviceGetComputeRunningProcesses``: the compute processes and their used memory (None
  where the driver does not report it, e.g. without the right to see other processes);
- ``nvmlDeviceGetProcessUtilization(handle, last_seen)``: per-process SM utilisation since the
  previous sample of that GPU (microsecond timestamps). ``NotSupported`` makes utilisation
  absent for the GPU (None, never zero) and is not asked again; ``NotFound`` (no sample since
  ``last_seen``) means no process used the SMs: zero for each listed process. MPS clients are
  not in it: their SM time is reported under their MPS server;
- with ``mps`` (the GPU has MPS shares), ``nvmlDeviceGetMPSComputeRunningProcesses``: the
  GPU's MPS clients only (measured on driver 580: clients are in both lists, servers and plain
  processes only in the first). Where it fails or is missing the sample's ``mps_listed`` is
  False (no escape is judged), and a GPU answering ``NotSupported`` is not asked again.

A failing call fails only that GPU's sample (:class:`UsageSourceError`), also pynvml's
``NVMLLibraryMismatchError`` (no NVMLError: a driver without the versioned process query).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterable
from dataclasses import replace
from types import ModuleType
from typing import Any, Protocol

from kubeletplugin.usage.model import GpuSample, ProcessSample

log = logging.getLogger(__name__)

#: More memory than any GPU has (1 PiB): NVML's "not available" markers are above it.
_MAX_BYTES = 2**50


class UsageSourceError(RuntimeError):
    """One GPU could not be sampled; the message names the GPU and the call."""


class UsageSource(Protocol):
    """Reports the compute processes of GPUs. Thread use: one sampler thread."""

    def open(self) -> None:
        """Prepare for sampling (raise :class:`UsageSourceError` when impossible)."""
        ...

    def sample(self, gpu_uuid: str, mps: bool = False) -> GpuSample:
        """The GPU's processes now, with its MPS clients marked when ``mps`` (raise
        :class:`UsageSourceError` for this GPU)."""
        ...

    def close(self) -> None:
        """Release what :meth:`open` took (never raises)."""
        ...


class NvmlUsageSource:
    """:class:`UsageSource` over NVML (``nvml``: the ``pynvml`` module, imported on open by
    default; tests pass a fake module)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._handles: dict[str, Any] = {}
        self._last_seen: dict[str, int] = {}
        self._unsupported: set[str] = set()
        self._mps_unsupported: set[str] = set()
        self._open = False
        self._lock = threading.Lock()

    def _module(self) -> ModuleType:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise UsageSourceError(
                    f"the pynvml module (package nvidia-ml-py) is not installed: {exc}"
                ) from None
        return self._nvml

    def _error(self, name: str) -> type[BaseException]:
        found = getattr(self._module(), name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
        return _NeverRaised

    def open(self) -> None:
        with self._lock:
            if self._open:
                return
            try:
                self._module().nvmlInit()
            except self._error("NVMLError") as exc:
                raise UsageSourceError(f"nvmlInit failed: {exc}") from None
            self._open = True

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
            self._handles.clear()
            try:
                self._module().nvmlShutdown()
            except Exception as exc:
                log.warning("nvmlShutdown failed: %s", exc)

    def _handle(self, gpu_uuid: str) -> Any:
        handle = self._handles.get(gpu_uuid)
        if handle is None:
            handle = self._module().nvmlDeviceGetHandleByUUID(gpu_uuid)
            self._handles[gpu_uuid] = handle
        return handle

    def sample(self, gpu_uuid: str, mps: bool = False) -> GpuSample:
        nvml = self._module()
        failures = (self._error("NVMLError"), self._error("NVMLLibraryMismatchError"))
        try:
            handle = self._handle(gpu_uuid)
            raw = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except failures as exc:
            self._handles.pop(gpu_uuid, None)
            raise UsageSourceError(f"GPU {gpu_uuid}: listing compute processes: {exc}") from None
        processes = tuple(_process(p) for p in raw or ())
        clients = self._mps_clients(gpu_uuid, handle) if mps else None
        if clients is not None:
            processes = tuple(
                replace(p, mps_client=True) if p.pid in clients else p for p in processes
            )
        return GpuSample(
            gpu_uuid,
            processes,
            self._utilization(gpu_uuid, handle, processes),
            mps_listed=clients is not None,
        )

    def _mps_clients(self, gpu_uuid: str, handle: Any) -> frozenset[int] | None:
        """The pids of the GPU's MPS clients, None when NVML cannot tell."""
        if gpu_uuid in self._mps_unsupported:
            return None
        nvml = self._module()
        try:
            raw = nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
        except self._error("NVMLError_NotSupported"):
            log.warning(
                "GPU %s does not list its MPS clients; escapes from MPS go unseen", gpu_uuid
            )
            self._mps_unsupported.add(gpu_uuid)
            return None
        except (
            self._error("NVMLError"),
            self._error("NVMLLibraryMismatchError"),
            AttributeError,
        ) as exc:
            log.warning("GPU %s: listing MPS clients: %s", gpu_uuid, exc)
            return None
        return frozenset(p.pid for p in (_process(r) for r in raw or ()) if p.pid > 0)

    def _utilization(
        self, gpu_uuid: str, handle: Any, processes: Iterable[ProcessSample]
    ) -> dict[int, int] | None:
        if gpu_uuid in self._unsupported:
            return None
        nvml = self._module()
        since = self._last_seen.get(gpu_uuid, 0)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self._error("NVMLError_NotSupported"):
            log.info("GPU %s reports no per-process utilisation; it stays absent", gpu_uuid)
            self._unsupported.add(gpu_uuid)
            return None
        except self._error("NVMLError_NotFound"):
            return {p.pid: 0 for p in processes}
        except (self._error("NVMLError"), AttributeError) as exc:
            log.warning("GPU %s: per-process utilisation: %s", gpu_uuid, exc)
            return None
        out: dict[int, int] = {}
        newest = since
        for s in samples or ():
            pid, sm = getattr(s, "pid", None), getattr(s, "smUtil", None)
            stamp = getattr(s, "timeStamp", 0)
            if not isinstance(pid, int) or not isinstance(sm, int):
                continue
            out[pid] = max(out.get(pid, 0), min(max(sm, 0), 100))
            if isinstance(stamp, int) and stamp > newest:
                newest = stamp
        self._last_seen[gpu_uuid] = newest
        return out


def _process(raw: Any) -> ProcessSample:
    pid = getattr(raw, "pid", 0)
    used = getattr(raw, "usedGpuMemory", None)
    return ProcessSample(
        pid=pid if isinstance(pid, int) else 0,
        # pynvml gives None for "not available"; an absurd amount is treated alike.
        used_memory=used if isinstance(used, int) and 0 <= used < _MAX_BYTES else None,
    )


class _NeverRaised(Exception):
    """Stands in for an NVML error class a module lacks."""
