"""Watches GPU health and publishes it: device taints in the slices, the kubelet health stream.

:class:`HealthMonitor` owns the :class:`~kubeletplugin.health.state.HealthStateMachine`. Its
inputs are a :class:`HealthChecker` (NVML or mock) that pushes events from its own thread and
answers periodic probes. On every change of a GPU's health it, at once and in this order:

1. hands the publisher the complete taint map (``gpu-<index>`` -> the unhealthy taint; the
   slice builder copies it onto every device of that GPU, partitions included, and re-splits
   slices to the tainted-device limit); the publisher writes it within its debounce interval
   (at most one publish per second), so a flapping GPU costs at most one write per second;
2. publishes the complete device list (every published device of every GPU, pool = node
   name) on the health stream.

A fault that needs a GPU reset (:func:`~kubeletplugin.health.events.needs_reset`) keeps its
taint for the life of this process: probes never clear it, because the GPU answers NVML
normally long before it is usable again. Resetting a GPU needs every process that holds it
stopped, this plugin included, so the reset is seen at the next start (:meth:`restore`): a
published reset-required taint stays sticky unless the node booted after it was added (a
reboot resets every GPU), in which case it is an ordinary fault that recovers through the usual
healthy probes. After a reset without a reboot, deleting the node's ResourceSlices while the
plugin is stopped drops the published taint (the documented operator action).

The health stream list is also refreshed every ``stream_refresh`` seconds (whatever the probe
interval) with ``last_updated`` = the time it is sent, so kubelet never sees a stale list (it
marks devices Unknown after 30 s without news).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from api import names
from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.health.events import HealthEvent, event_reason, is_reset_reason, needs_reset
from kubeletplugin.health.restore import PublishedFault, node_boot_time
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.health.state import (
    GpuHealth,
    HealthStateMachine,
)
from kubeletplugin.health.taints import unhealthy_taint
from kubeletplugin.kubelet.healthservice import DeviceHealthStatus, Health
from kubeletplugin.model import GpuInfo

log = logging.getLogger(__name__)

#: Longest message kubelet keeps (it truncates longer ones).
MAX_MESSAGE_LENGTH: Final = 1024

Taints = dict[str, list[dict[str, Any]]]
#: Receives events from a checker's thread.
EventHandler = Callable[[HealthEvent], None]


class HealthChecker(Protocol):
    """A source of GPU health: pushed events plus a cheap per-GPU probe."""

    def start(self, gpus: Sequence[GpuInfo], report: EventHandler) -> None:
        """Begin watching ``gpus``; call ``report`` (from any thread) for each event."""
        ...

    def probe(self, gpu: GpuInfo) -> str | None:
        """None when ``gpu`` answers normally, else the reason it is unhealthy."""
        ...

    def stop(self) -> None:
        """Stop watching and release everything; returns within a few seconds."""
        ...


class TaintSink(Protocol):
    """Takes the complete taint map (the slice publisher)."""

    def set_taints(self, taints: Mapping[str, Sequence[Mapping[str, Any]]]) -> None: ...


class HealthListSink(Protocol):
    """Takes the complete device-health list (the health stream's broadcaster)."""

    def publish(self, devices: Sequence[DeviceHealthStatus]) -> None: ...


class HealthMonitor:
    """Turns checker events and probes into taints and health-stream lists.

    Thread-safe. ``taints`` and ``stream`` may each be None (e.g. no API server in a test).
    """

    def __init__(
        self,
        checker: HealthChecker,
        driver_name: str,
        node_name: str,
        devices: NodeDevices,
        settings: HealthSettings | None = None,
        taints: TaintSink | None = None,
        stream: HealthListSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or HealthSettings()
        self.checker = checker
        self.driver_name = driver_name
        self.node_name = node_name
        self.sharing_mode = devices.sharing_mode
        self._taint_sink = taints
        self._stream = stream
        self._clock = clock
        self._lock = threading.RLock()
        self._state = HealthStateMachine(
            self.settings.recovery_probes,
            self.settings.flap_window,
            self.settings.max_recovery_factor,
        )
        self._gpus: tuple[GpuInfo, ...] = ()
        self._devices: dict[str, list[str]] = {}
        self._last_taints: Taints = {}
        self._last_stream = float("-inf")
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Number of health changes seen (for logs and tests).
        self.changes = 0
        self._set_devices(devices)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Publish the initial (all healthy) list, start the checker and the probe thread."""
        if self._thread is not None:
            raise RuntimeError("HealthMonitor already started")
        with self._lock:
            self._emit_locked(force_stream=True)
            gpus = self._gpus
        self.checker.start(gpus, self.handle_event)
        self._thread = threading.Thread(target=self._probe_loop, name="health-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop probing and the checker. Taints stay as published."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.checker.stop()

    # --- inputs ---------------------------------------------------------------------------

    def restore(
        self, published: Mapping[str, PublishedFault], booted_at: float | None = None
    ) -> None:
        """Start the GPUs whose ``gpu-<index>`` device (in MIG mode: one of its MIG devices)
        carries a published unhealthy taint as unhealthy (same reason and time, so the taint
        is republished unchanged). A reset-required taint stays sticky unless the node booted
        after it was added (``booted_at``: the node's boot time, read from ``/proc/stat`` when
        None). Call before :meth:`start` and before the publisher's first sync."""
        boot = node_boot_time() if booted_at is None else booted_at
        with self._lock:
            changed = []
            for gpu in self._gpus:
                # A GPU in MIG mode publishes no gpu-<index>: its taint is on its MIG devices.
                candidates = [names.device_name(gpu.index), *self._devices.get(gpu.uuid, [])]
                fault = next((published[n] for n in candidates if n in published), None)
                if fault is None:
                    continue
                sticky = is_reset_reason(fault.reason)
                if sticky and boot is not None and boot > fault.since:
                    log.info(
                        "GPU %d: the node rebooted since its fault (%s); the GPU was reset and "
                        "recovers through healthy probes",
                        gpu.index,
                        fault.reason,
                    )
                    sticky = False
                if self._state.fault(gpu.uuid, fault.reason, fault.since, needs_reset=sticky):
                    changed.append(gpu.uuid)
            self._after_changes(changed)

    def handle_event(self, event: HealthEvent) -> None:
        """Apply one checker event (called from the checker's thread)."""
        reason = event_reason(event, self.settings.ignored_xids)
        if reason is None:
            log.info("GPU %s: ignoring XID %s (in the ignore list)", event.uuid or "?", event.xid)
            return
        now = self._clock()
        with self._lock:
            targets = [event.uuid] if event.uuid is not None else [g.uuid for g in self._gpus]
            sticky = needs_reset(event)
            changed = [u for u in targets if self._state.fault(u, reason, now, needs_reset=sticky)]
            if event.uuid is not None and event.uuid not in self._devices:
                log.warning("health event for unknown GPU %s: %s", event.uuid, reason)
            self._after_changes(changed)

    def probe_all(self) -> None:
        """Probe every GPU once and apply the results (the probe thread calls this)."""
        with self._lock:
            gpus = self._gpus
        results = [(gpu, self._probe(gpu)) for gpu in gpus]
        now = self._clock()
        with self._lock:
            changed = [g.uuid for g, error in results if self._state.probe(g.uuid, error, now)]
            if changed:
                self._after_changes(changed)
        self.refresh_stream()

    # --- outputs --------------------------------------------------------------------------

    def gpu_health(self) -> dict[str, GpuHealth]:
        """Current health of every GPU by UUID."""
        with self._lock:
            return self._state.snapshot()

    def taints(self) -> Taints:
        """The taint map the publisher gets: ``gpu-<index>`` -> [unhealthy taint]."""
        with self._lock:
            return self._taints_locked()

    def device_health(self) -> list[DeviceHealthStatus]:
        """The complete health-stream list (every published device)."""
        with self._lock:
            return self._device_health_locked()

    # --- internals ------------------------------------------------------------------------

    def _set_devices(self, devices: NodeDevices) -> None:
        self.devices = devices
        self._gpus = devices.gpus
        #: GPU UUID -> names of its published devices (the health stream lists every one).
        self._devices = devices.names_by_gpu()
        self._state.set_gpus([g.uuid for g in self._gpus], self._clock())

    def _probe(self, gpu: GpuInfo) -> str | None:
        try:
            return self.checker.probe(gpu)
        except Exception as exc:  # a checker bug must not stop health checking
            log.exception("health probe of GPU %d failed unexpectedly", gpu.index)
            return f"health probe failed: {type(exc).__name__}: {exc}"

    def refresh_stream(self) -> None:
        """Republish the health list when ``stream_refresh`` passed since the last one."""
        with self._lock:
            if self._clock() - self._last_stream >= self.settings.stream_refresh:
                self._emit_locked(force_stream=True)

    def _probe_loop(self) -> None:
        tick = min(self.settings.probe_interval, self.settings.stream_refresh)
        next_probe = time.monotonic()
        while not self._stopping.is_set():
            if time.monotonic() >= next_probe:
                self.probe_all()
                next_probe = time.monotonic() + self.settings.probe_interval
            else:
                self.refresh_stream()
            self._stopping.wait(max(0.0, min(tick, next_probe - time.monotonic())))

    def _after_changes(self, changed: Sequence[str]) -> None:
        if not changed:
            return
        self.changes += len(changed)
        by_uuid = {g.uuid: g for g in self._gpus}
        for uuid in changed:
            state = self._state.get(uuid)
            index = by_uuid[uuid].index
            if state.healthy:
                log.info("GPU %d (%s) recovered", index, uuid)
            elif state.needs_reset:
                log.warning(
                    "GPU %d (%s) is unhealthy until it is reset: %s", index, uuid, state.reason
                )
            else:
                log.warning("GPU %d (%s) is unhealthy: %s", index, uuid, state.reason)
        self._emit_locked(force_stream=True)

    def _taints_locked(self) -> Taints:
        taints: Taints = {}
        for gpu in self._gpus:
            state = self._state.get(gpu.uuid)
            if not state.healthy:
                taints[names.device_name(gpu.index)] = [
                    unhealthy_taint(
                        self.driver_name, state.reason, state.since, self.settings.taint_effect
                    )
                ]
        return taints

    def _device_health_locked(self) -> list[DeviceHealthStatus]:
        # The event watch runs continuously, so the plugin vouches for every device's health
        # at the time the list is sent.
        sent = int(self._clock())
        result: list[DeviceHealthStatus] = []
        for gpu in self._gpus:
            state = self._state.get(gpu.uuid)
            health = Health.HEALTHY if state.healthy else Health.UNHEALTHY
            message = state.reason[:MAX_MESSAGE_LENGTH]
            for name in self._devices.get(gpu.uuid, []):
                result.append(
                    DeviceHealthStatus(
                        pool_name=self.node_name,
                        device_name=name,
                        health=health,
                        last_updated=sent,
                        message=message,
                    )
                )
        return result

    def _emit_locked(self, force_stream: bool) -> None:
        taints = self._taints_locked()
        if taints != self._last_taints and self._taint_sink is not None:
            self._taint_sink.set_taints(taints)
        self._last_taints = taints
        if force_stream and self._stream is not None:
            self._stream.publish(self._device_health_locked())
            self._last_stream = self._clock()
