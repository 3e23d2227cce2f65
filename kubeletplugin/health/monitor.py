"""Watches GPU health and publishes it: device taints in the slices, the kubelet health stream.

:class:`HealthMonitor` feeds a :class:`HealthChecker`'s events and probes into two
:class:`~kubeletplugin.health.state.HealthStateMachine` levels, per physical GPU and per MIG
instance device (docs/sharing.md says which fault taints what). Invariants:

- on every change it hands the publisher the complete taint map (``gpu-<index>`` for a GPU-wide
  fault, which the slice builder copies onto every device of that GPU; a MIG instance device's
  own name for its own fault), then publishes the complete device list on the health stream;
- a device carries at most one unhealthy taint: its own is left out while its GPU is tainted;
- an instance the node does not publish gets an info line and no taint; a dynamic device keeps
  its fault after its instance is destroyed (the next instance uses the same slices);
- a reset-required fault (:func:`~kubeletplugin.health.events.needs_reset`) stays for the life
  of the process; at start (:meth:`HealthMonitor.restore`) a published one stays sticky unless
  the node booted after it was added;
- the health stream list is resent every ``stream_refresh`` seconds, so kubelet never marks
  devices Unknown for lack of news.
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
from kubeletplugin.health.instances import InstanceDevices, InstanceResolver
from kubeletplugin.health.restore import PublishedFault, node_boot_time, split_published
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.health.state import (
    GpuHealth,
    HealthStateMachine,
)
from kubeletplugin.health.taints import unhealthy_taint
from kubeletplugin.kubelet.healthservice import DeviceHealthStatus, Health
from kubeletplugin.model import GpuInfo, TaintSink
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock

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


class HealthListSink(Protocol):
    """Takes the complete device-health list (the health stream's broadcaster)."""

    def publish(self, devices: Sequence[DeviceHealthStatus]) -> None: ...


class HealthMonitor:
    """Turns checker events and probes into taints and health-stream lists.

    Thread-safe. ``taints`` and ``stream`` may each be None (e.g. no API server in a test).
    ``instance_resolver`` names the dynamic MIG device of a GPU instance (see
    :meth:`set_instance_resolver`).
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
        clock: Clock = SYSTEM_CLOCK,
        instance_resolver: InstanceResolver | None = None,
    ) -> None:
        self.settings = settings or HealthSettings()
        self.checker = checker
        self.driver_name = driver_name
        self.node_name = node_name
        self.sharing_mode = devices.sharing_mode
        self._taint_sink = taints
        self._stream = stream
        #: Wall time of the health timestamps (``lastUpdated``, ``timeAdded``) and of the
        #: stream's refresh; the probe loop paces itself on the process's monotonic time.
        self._clock = clock
        self._lock = threading.RLock()
        self._state = HealthStateMachine(
            self.settings.recovery_probes,
            self.settings.flap_window,
            self.settings.max_recovery_factor,
        )
        #: Health of the MIG instance devices' own faults, by device name.
        self._instance_state = HealthStateMachine(
            self.settings.recovery_probes,
            self.settings.flap_window,
            self.settings.max_recovery_factor,
        )
        self._resolver = instance_resolver
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

    def set_instance_resolver(self, resolver: InstanceResolver | None) -> None:
        """Use ``resolver`` (physical GPU UUID, GPU instance id -> the dynamic MIG device whose
        prepared claim owns that instance, or None) for events naming a GPU instance of a
        dynamic MIG GPU. Until one is set, such events taint nothing (the instance is unknown).
        It is called without the monitor's lock held, from the checker's thread."""
        with self._lock:
            self._resolver = resolver

    def restore(
        self, published: Mapping[str, PublishedFault], booted_at: float | None = None
    ) -> None:
        """Start the GPUs and MIG instance devices whose published unhealthy taints say so as
        unhealthy (same reason and time, so each taint is republished unchanged, on the same
        devices: :func:`~kubeletplugin.health.restore.split_published` tells a GPU-wide fault
        from an instance device's own). A reset-required taint stays sticky unless the node
        booted after it was added (``booted_at``: the node's boot time, read from
        ``/proc/stat`` when None). Call before :meth:`start` and before the publisher's first
        sync."""
        boot = node_boot_time() if booted_at is None else booted_at
        with self._lock:
            changed: list[str] = []
            changed_devices: list[str] = []
            for gpu in self._gpus:
                restored = split_published(
                    names.device_name(gpu.index), self.devices.of_gpu(gpu), published
                )
                if restored.gpu is not None:
                    what = f"GPU {gpu.index}"
                    if self._restore_fault(self._state, gpu.uuid, restored.gpu, boot, what):
                        changed.append(gpu.uuid)
                for name, fault in restored.devices.items():
                    if self._restore_fault(self._instance_state, name, fault, boot, name):
                        changed_devices.append(name)
            self._after_changes(changed, changed_devices)

    @staticmethod
    def _restore_fault(
        machine: HealthStateMachine,
        key: str,
        fault: PublishedFault,
        boot: float | None,
        what: str,
    ) -> bool:
        sticky = is_reset_reason(fault.reason)
        if sticky and boot is not None and boot > fault.since:
            log.info(
                "%s: the node rebooted since its fault (%s); the GPU was reset and recovers "
                "through healthy probes",
                what,
                fault.reason,
            )
            sticky = False
        return machine.fault(key, fault.reason, fault.since, needs_reset=sticky)

    def handle_event(self, event: HealthEvent) -> None:
        """Apply one checker event (called from the checker's thread)."""
        reason = event_reason(event, self.settings.ignored_xids)
        if reason is None:
            log.info("GPU %s: ignoring XID %s (in the ignore list)", event.uuid or "?", event.xid)
            return
        now = self._clock.time()
        if event.uuid is not None and event.gpu_instance is not None:
            # Resolved outside the lock: the resolver takes prepare's lock.
            with self._lock:
                resolver = self._resolver
            devices = self._instances.resolve(
                event.uuid, event.gpu_instance, event.compute_instance, resolver
            )
            if devices is not None:
                self._instance_fault(event, reason, devices, now)
                return
        with self._lock:
            targets = [event.uuid] if event.uuid is not None else [g.uuid for g in self._gpus]
            sticky = needs_reset(event)
            changed = [u for u in targets if self._state.fault(u, reason, now, needs_reset=sticky)]
            if event.uuid is not None and event.uuid not in self._devices:
                log.warning("health event for unknown GPU %s: %s", event.uuid, reason)
            self._after_changes(changed)

    def _instance_fault(
        self, event: HealthEvent, reason: str, targets: Sequence[str], now: float
    ) -> None:
        if not targets:
            where = f"GPU instance {event.gpu_instance}"
            if event.compute_instance is not None:
                where += f" compute instance {event.compute_instance}"
            log.info(
                "GPU %s: %s is not a MIG device this node publishes; not tainting anything for: %s",
                event.uuid,
                where,
                reason,
            )
            return
        sticky = needs_reset(event)
        with self._lock:
            changed = [
                n for n in targets if self._instance_state.fault(n, reason, now, needs_reset=sticky)
            ]
            self._after_changes((), changed)

    def probe_all(self) -> None:
        """Probe every GPU once and apply the results (the probe thread calls this); a GPU's
        result also counts for the own faults of its MIG instance devices."""
        with self._lock:
            gpus = self._gpus
        results = [(gpu, self._probe(gpu)) for gpu in gpus]
        now = self._clock.time()
        with self._lock:
            changed = [g.uuid for g, error in results if self._state.probe(g.uuid, error, now)]
            changed_devices = [
                name
                for gpu, error in results
                for name in self._instances.names_of(gpu.uuid)
                # A healthy device is left alone: a failing probe is the GPU's fault.
                if not self._instance_state.get(name).healthy
                and self._instance_state.probe(name, error, now)
            ]
            if changed or changed_devices:
                self._after_changes(changed, changed_devices)
        self.refresh_stream()

    # --- outputs --------------------------------------------------------------------------

    def gpu_health(self) -> dict[str, GpuHealth]:
        """Current health of every GPU by UUID (GPU-wide faults only)."""
        with self._lock:
            return self._state.snapshot()

    def instance_health(self) -> dict[str, GpuHealth]:
        """Current health of every MIG instance device's own faults, by device name."""
        with self._lock:
            return self._instance_state.snapshot()

    def taints(self) -> Taints:
        """The taint map the publisher gets: ``gpu-<index>`` -> [unhealthy taint] for GPU-wide
        faults, a MIG instance device's name -> [unhealthy taint] for its own fault."""
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
        self._instances = InstanceDevices(devices)
        now = self._clock.time()
        self._state.set_gpus([g.uuid for g in self._gpus], now)
        self._instance_state.set_gpus(self._instances.names(), now)

    def _probe(self, gpu: GpuInfo) -> str | None:
        try:
            return self.checker.probe(gpu)
        except Exception as exc:  # a checker bug must not stop health checking
            log.exception("health probe of GPU %d failed unexpectedly", gpu.index)
            return f"health probe failed: {type(exc).__name__}: {exc}"

    def refresh_stream(self) -> None:
        """Republish the health list when ``stream_refresh`` passed since the last one."""
        with self._lock:
            if self._clock.time() - self._last_stream >= self.settings.stream_refresh:
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

    def _after_changes(self, changed: Sequence[str], changed_devices: Sequence[str] = ()) -> None:
        if not changed and not changed_devices:
            return
        self.changes += len(changed) + len(changed_devices)
        by_uuid = {g.uuid: g for g in self._gpus}
        for uuid in changed:
            index = by_uuid[uuid].index
            _log_change(f"GPU {index} ({uuid})", self._state.get(uuid))
        for name in changed_devices:
            _log_change(f"MIG device {name}", self._instance_state.get(name))
        self._emit_locked(force_stream=True)

    def _taint(self, state: GpuHealth) -> list[dict[str, Any]]:
        return [
            unhealthy_taint(self.driver_name, state.reason, state.since, self.settings.taint_effect)
        ]

    def _taints_locked(self) -> Taints:
        taints: Taints = {}
        for gpu in self._gpus:
            state = self._state.get(gpu.uuid)
            if not state.healthy:
                taints[names.device_name(gpu.index)] = self._taint(state)
                continue
            for name in self._instances.names_of(gpu.uuid):
                own = self._instance_state.get(name)
                if not own.healthy:
                    taints[name] = self._taint(own)
        return taints

    def _device_health_locked(self) -> list[DeviceHealthStatus]:
        # The event watch runs continuously, so the plugin vouches for every device's health
        # at the time the list is sent.
        sent = int(self._clock.time())
        result: list[DeviceHealthStatus] = []
        instances = self._instance_state.snapshot()
        for gpu in self._gpus:
            gpu_state = self._state.get(gpu.uuid)
            for name in self._devices.get(gpu.uuid, []):
                own = instances.get(name)
                state = gpu_state if not gpu_state.healthy or own is None else own
                result.append(
                    DeviceHealthStatus(
                        pool_name=self.node_name,
                        device_name=name,
                        health=Health.HEALTHY if state.healthy else Health.UNHEALTHY,
                        last_updated=sent,
                        message=state.reason[:MAX_MESSAGE_LENGTH],
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
            self._last_stream = self._clock.time()


def _log_change(what: str, state: GpuHealth) -> None:
    if state.healthy:
        log.info("%s recovered", what)
    elif state.needs_reset:
        log.warning("%s is unhealthy until it is reset: %s", what, state.reason)
    else:
        log.warning("%s is unhealthy: %s", what, state.reason)
