"""The NVML health checker against a fake pynvml: event registration, waits, probes, stop."""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any

import pytest

from api import names
from kubeletplugin.devices.table import node_devices
from kubeletplugin.health.events import DEFAULT_IGNORED_XIDS, EventKind, HealthEvent
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.health.nvmlcheck import NvmlHealthChecker
from kubeletplugin.health.settings import HealthSettings
from tests.helpers import eventually
from tests.kubeletplugin.health.helpers import (
    DBE,
    GPU_UNAVAILABLE,
    NVML_ERROR_GPU_IS_LOST,
    XID,
    FakeEventNvml,
    NVMLError,
    RecordingTaints,
    gpus,
)


class Events:
    def __init__(self) -> None:
        self.q: queue.Queue[HealthEvent] = queue.Queue()

    def __call__(self, event: HealthEvent) -> None:
        self.q.put(event)

    def next(self) -> HealthEvent:
        return self.q.get(timeout=10)


def started(fake: FakeEventNvml, count: int = 2) -> tuple[NvmlHealthChecker, Events]:
    checker = NvmlHealthChecker(fake.module(), wait_timeout_ms=50)
    events = Events()
    checker.start(gpus(count), events)
    return checker, events


def test_registers_the_wanted_events_on_every_gpu() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    checker, _ = started(fake)
    try:
        assert fake.registered == {x.uuid: XID | DBE | GPU_UNAVAILABLE for x in g}
        assert checker.registered == fake.registered
    finally:
        checker.stop()


def test_registers_only_supported_events_and_without_the_gpu_lost_constant() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g], supported=XID)
    checker = NvmlHealthChecker(fake.module(with_unavailable_constant=False), 50)
    checker.start(g, Events())
    try:
        assert fake.registered == {x.uuid: XID for x in g}
    finally:
        checker.stop()


def test_gpu_without_any_supported_event_is_left_to_the_probe() -> None:
    g = gpus(1)
    fake = FakeEventNvml([g[0].uuid], supported=0x0004)
    checker, _ = started(fake, 1)
    try:
        assert fake.registered == {}
        assert checker.probe(g[0]) is None
    finally:
        checker.stop()


def test_events_become_health_events() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    checker, events = started(fake)
    try:
        fake.push(g[1].uuid, XID, 79)
        assert events.next() == HealthEvent(g[1].uuid, EventKind.XID, xid=79)
        fake.push(g[0].uuid, DBE)
        assert events.next() == HealthEvent(g[0].uuid, EventKind.DOUBLE_BIT_ECC)
        fake.push(g[0].uuid, GPU_UNAVAILABLE)
        event = events.next()
        assert (event.uuid, event.kind) == (g[0].uuid, EventKind.GPU_LOST)
        fake.push(None, XID, 48)
        assert events.next() == HealthEvent(None, EventKind.XID, xid=48)
    finally:
        checker.stop()


def test_wait_uses_a_timeout_and_stop_ends_the_thread() -> None:
    g = gpus(1)
    fake = FakeEventNvml([g[0].uuid])
    checker, _ = started(fake, 1)
    eventually(lambda: fake.waits >= 3, "several timed-out waits")
    checker.stop()
    assert not any(t.name == "nvml-events" for t in threading.enumerate())
    assert fake.freed and fake.shut_down
    assert fake.calls.count("nvmlInit") == 1


def test_probe_reports_the_nvml_error() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    checker, _ = started(fake)
    try:
        fake.lost.add(g[1].uuid)
        assert checker.probe(g[0]) is None
        assert checker.probe(g[1]) == "NVML query failed: GPU is lost"
        fake.uuids.remove(g[0].uuid)
        assert checker.probe(g[0]) == "NVML query failed: GPU is lost"
    finally:
        checker.stop()


def test_nvml_init_failure_makes_every_probe_fail() -> None:
    g = gpus(1)
    fake = FakeEventNvml([g[0].uuid])
    fake.init_error = NVMLError(NVML_ERROR_GPU_IS_LOST)
    checker, _ = started(fake, 1)
    assert checker.probe(g[0]) == "NVML unavailable: GPU is lost"
    checker.stop()
    assert not fake.shut_down


def test_without_pynvml_every_probe_names_the_missing_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the import fails
    g = gpus(1)
    checker = NvmlHealthChecker()
    checker.start(g, Events())
    reason = checker.probe(g[0])
    checker.stop()
    assert reason is not None and reason.startswith("NVML unavailable: ")
    assert "pynvml" in reason


def test_an_error_that_is_not_nvmls_is_not_reported_as_the_gpus_fault() -> None:
    """Only NVML errors are GPU faults: a defect (here a TypeError) reaches the caller, whose
    monitor logs it with its traceback instead of quoting it as an NVML answer."""
    g = gpus(1)
    fake = FakeEventNvml([g[0].uuid])
    module = fake.module()

    def broken(handle: Any) -> Any:
        raise TypeError("unexpected handle")

    module.nvmlDeviceGetMemoryInfo = broken  # type: ignore[attr-defined]
    checker = NvmlHealthChecker(module, wait_timeout_ms=50)
    checker.start(g, Events())
    try:
        with pytest.raises(TypeError, match="unexpected handle"):
            checker.probe(g[0])
        fake.lost.add(g[0].uuid)
        module.nvmlDeviceGetMemoryInfo = fake.module().nvmlDeviceGetMemoryInfo  # type: ignore[attr-defined]
        assert checker.probe(g[0]) == "NVML query failed: GPU is lost"
    finally:
        checker.stop()


def test_ignored_xid_from_nvml_leaves_the_gpu_healthy_and_a_critical_one_taints_it() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    taints = RecordingTaints()
    mon = HealthMonitor(
        NvmlHealthChecker(fake.module(), wait_timeout_ms=50),
        names.DEFAULT_DRIVER_NAME,
        "n1",
        node_devices(g, names.SHARING_MODE_CONSUMABLE),
        HealthSettings(probe_interval=3600),
        taints=taints,
    )
    mon.start()
    try:
        for xid in sorted(DEFAULT_IGNORED_XIDS):
            fake.push(g[0].uuid, XID, xid)
        fake.push(g[1].uuid, XID, 79)
        eventually(lambda: bool(taints.calls), "a taint")
        eventually(lambda: fake.events.empty(), "all events consumed")
        assert taints.calls == [{"gpu-1": taints.calls[0]["gpu-1"]}]
        assert (
            taints.calls[0]["gpu-1"][0]["value"]
            == "reset-required-XID-79-GPU-has-fallen-off-the-bus"
        )
    finally:
        mon.stop()


def test_real_pynvml_without_the_library_fails_every_probe_with_the_cause() -> None:
    """This test machine has pynvml but no NVIDIA driver: the probe names that."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a project dependency")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present on this machine; covered by the fake tests")
    g = gpus(1)
    checker = NvmlHealthChecker()
    checker.start(g, Events())
    reason = checker.probe(g[0])
    checker.stop()
    assert reason is not None and reason.startswith("NVML unavailable: ")


@pytest.mark.parametrize(
    ("setup", "detail"),
    [
        (lambda f, u: f.remap.__setitem__(u, (True, False)), "row remapping pending"),
        (lambda f, u: f.remap.__setitem__(u, (False, True)), "row remapping failed"),
        (lambda f, u: f.pages_pending.add(u), "retired pages pending"),
    ],
)
def test_probe_reports_conditions_that_need_a_reset(setup: Any, detail: str) -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    setup(fake, g[1].uuid)
    checker, events = started(fake)
    try:
        assert checker.probe(g[0]) is None
        assert events.q.empty()
        assert checker.probe(g[1]) is None
        assert events.next() == HealthEvent(g[1].uuid, EventKind.RESET_REQUIRED, detail=detail)
    finally:
        checker.stop()


def test_unsupported_reset_queries_are_no_fault() -> None:
    g = gpus(1)
    fake = FakeEventNvml([g[0].uuid])
    fake.reset_queries = False
    checker, events = started(fake, 1)
    try:
        assert checker.probe(g[0]) is None
        assert events.q.empty()
    finally:
        checker.stop()


def test_pending_row_remap_keeps_the_taint_through_the_monitor() -> None:
    g = gpus(2)
    fake = FakeEventNvml([x.uuid for x in g])
    fake.remap[g[0].uuid] = (True, False)
    taints = RecordingTaints()
    monitor = HealthMonitor(
        NvmlHealthChecker(fake.module(), wait_timeout_ms=50),
        names.DEFAULT_DRIVER_NAME,
        "n1",
        node_devices(g, names.SHARING_MODE_EXCLUSIVE),
        HealthSettings(probe_interval=3600, recovery_probes=1),
        taints=taints,
    )
    monitor.start()
    try:
        monitor.probe_all()
        assert taints.calls[-1]["gpu-0"][0]["value"] == "reset-required-row-remapping-pending"
        del fake.remap[g[0].uuid]  # a pending remap does not go away without a reset ...
        for _ in range(5):
            monitor.probe_all()
        # ... and healthy probes do not remove the taint of a reset-required fault.
        assert list(taints.calls[-1]) == ["gpu-0"]
    finally:
        monitor.stop()
