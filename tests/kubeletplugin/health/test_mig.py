"""Health of MIG devices: an event that names a MIG instance taints the device of that instance
only (static MIG devices by their instance ids, dynamic placement devices through the resolver);
an event without an instance still taints every device of the GPU; both survive a restart on the
devices they were on."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api import names
from kubeletplugin.devices.migtables import reference_profiles
from kubeletplugin.devices.mock import H100_PRODUCT_NAME, MockBackend, load_mock_config
from kubeletplugin.devices.slices import desired_slices
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.health.events import EventKind, HealthEvent, event_reason
from kubeletplugin.health.instances import InstanceResolver
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.health.nvmlcheck import NO_INSTANCE, NvmlHealthChecker
from kubeletplugin.health.restore import PublishedFault, unhealthy_from_slices
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.kubelet.healthservice import Health
from sharegpu.kube.clock import FakeClock
from tests.helpers import eventually
from tests.kubeletplugin.health.helpers import (
    NODE,
    XID,
    FakeEventNvml,
    ManualChecker,
    RecordingStream,
    RecordingTaints,
)

DRIVER = names.DEFAULT_DRIVER_NAME
MIG_NAMES = ["gpu-0-mig-2-0", "gpu-0-mig-2-1", "gpu-0-mig-9-0"]
#: A reset-required XID (contained ECC error) and an ordinary one (micro-controller halt).
RESET_XID = 94
ORDINARY_XID = 62
#: The dynamic placement device the tests' resolver knows, and its GPU instance id.
PLACED = "gpu-0-mig-1g-10gb-3"
PLACED_GI = 5


def static_table(tmp_path: Path) -> NodeDevices:
    """GPU 0 in MIG mode: GPU instance 2 with two compute instances, GPU instance 9 with one;
    GPU 1 whole."""
    path = tmp_path / "gpus.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            - migDevices:
                - {profile: 1g.10gb, gpuInstance: 9}
                - {profile: 1c.3g.40gb, gpuInstance: 2, computeInstance: 0}
                - {profile: 2c.3g.40gb, gpuInstance: 2, computeInstance: 1}
            - {}
            """
        )
    )
    return node_devices(load_mock_config(NODE, path), names.SHARING_MODE_CONSUMABLE)


def dynamic_table() -> NodeDevices:
    """GPU 0 in MIG mode with the H100 profiles under dynamic MIG (one device per placement);
    GPU 1 in partitions."""
    first, second = MockBackend(NODE, count=2).discover()
    mig = dataclasses.replace(
        first, mig_mode="Enabled", mig_profiles=reference_profiles(H100_PRODUCT_NAME) or ()
    )
    return node_devices(
        [mig, second], names.SHARING_MODE_PARTITIONS, mig_strategy=names.MIG_STRATEGY_DYNAMIC
    )


def resolver_of(table: NodeDevices) -> InstanceResolver:
    """What prepare answers when one claim is prepared on :data:`PLACED` (GPU instance 5)."""
    parent = table.gpus[0].uuid

    def resolve(uuid: str, gpu_instance: int) -> str | None:
        return PLACED if (uuid, gpu_instance) == (parent, PLACED_GI) else None

    return resolve


@dataclasses.dataclass
class Harness:
    table: NodeDevices
    monitor: HealthMonitor
    checker: ManualChecker
    taints: RecordingTaints
    stream: RecordingStream
    clock: FakeClock

    def emit(self, xid: int, gi: int | None = None, ci: int | None = None, gpu: int = 0) -> None:
        self.checker.emit(HealthEvent(self.table.gpus[gpu].uuid, EventKind.XID, xid, "", gi, ci))

    def unhealthy(self) -> set[str]:
        """The devices the latest health-stream list reports unhealthy."""
        return {d.device_name for d in self.stream.lists[-1] if d.health == Health.UNHEALTHY}

    def latest_taints(self) -> dict[str, list[dict[str, object]]]:
        return dict(self.taints.calls[-1]) if self.taints.calls else {}

    def published_taints(self) -> dict[str, list[dict[str, object]]]:
        """Device name -> taints, as the slice builder renders the latest taint map."""
        contents = desired_slices(self.table, self.latest_taints())
        return {d["name"]: d.get("taints", []) for c in contents for d in c.get("devices", [])}

    def probes(self, count: int, error: str | None = None) -> None:
        for _ in range(count):
            if error is None:
                self.checker.errors.clear()
            else:
                self.checker.errors[self.table.gpus[0].uuid] = error
            self.clock.advance(5)
            self.monitor.probe_all()


def harness(
    table: NodeDevices, resolver: InstanceResolver | None = None, start: bool = True
) -> Harness:
    checker, taints, stream, clock = (
        ManualChecker(),
        RecordingTaints(),
        RecordingStream(),
        FakeClock(),
    )
    monitor = HealthMonitor(
        checker,
        DRIVER,
        NODE,
        table,
        HealthSettings(probe_interval=3600, recovery_probes=2),
        taints=taints,
        stream=stream,
        clock=clock,
        instance_resolver=resolver,
    )
    if start:
        monitor.start()
    return Harness(table, monitor, checker, taints, stream, clock)


@pytest.fixture
def running() -> Iterator[Callable[[Harness], Harness]]:
    started: list[Harness] = []

    def track(h: Harness) -> Harness:
        started.append(h)
        return h

    yield track
    for h in started:
        h.monitor.stop()


# --- static MIG devices ----------------------------------------------------------------------


def test_an_xid_on_a_static_mig_instance_taints_only_its_device(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    assert [d.device_name for d in h.stream.lists[0]] == [*MIG_NAMES, "gpu-1"]
    h.emit(RESET_XID, 9, 0)
    (taint,) = h.latest_taints()["gpu-0-mig-9-0"]
    assert list(h.latest_taints()) == ["gpu-0-mig-9-0"]
    assert taint["value"] == "reset-required-XID-94-contained-ECC-error-on-MIG-GI-9-CI-0"
    published = h.published_taints()
    assert published["gpu-0-mig-9-0"] == [taint]
    assert [n for n, t in published.items() if t] == ["gpu-0-mig-9-0"]
    assert h.unhealthy() == {"gpu-0-mig-9-0"}
    latest = {d.device_name: d for d in h.stream.lists[-1]}
    assert "on MIG GI 9 CI 0" in latest["gpu-0-mig-9-0"].message
    assert latest["gpu-0-mig-2-0"].message == ""
    assert h.monitor.gpu_health()[h.table.gpus[0].uuid].healthy


def test_an_event_naming_a_gpu_instance_only_taints_its_compute_instances(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(ORDINARY_XID, 2, None)
    assert set(h.latest_taints()) == {"gpu-0-mig-2-0", "gpu-0-mig-2-1"}
    assert h.unhealthy() == {"gpu-0-mig-2-0", "gpu-0-mig-2-1"}
    h.emit(ORDINARY_XID, 2, 1)
    assert h.unhealthy() == {"gpu-0-mig-2-0", "gpu-0-mig-2-1"}, "already unhealthy"


def test_an_unknown_static_instance_taints_nothing_with_one_info_line(
    tmp_path: Path, running: Callable[[Harness], Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = running(harness(static_table(tmp_path)))
    with caplog.at_level(logging.INFO, logger="kubeletplugin.health"):
        h.emit(RESET_XID, 7, 0)
    assert h.taints.calls == [] and h.unhealthy() == set()
    assert h.monitor.changes == 0
    lines = [r for r in caplog.records if "not a MIG device this node publishes" in r.message]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "GPU instance 7 compute instance 0" in lines[0].message


def test_events_without_an_instance_still_taint_every_device_of_the_gpu(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID)
    (taint,) = h.latest_taints()["gpu-0"]
    assert list(h.latest_taints()) == ["gpu-0"]
    published = h.published_taints()
    assert all(published[n] == [taint] for n in MIG_NAMES) and published["gpu-1"] == []
    assert h.unhealthy() == set(MIG_NAMES)
    h.checker.emit(HealthEvent(None, EventKind.XID, ORDINARY_XID, "", 9, 0))
    assert h.unhealthy() == {*MIG_NAMES, "gpu-1"}, "an event naming no GPU counts for every GPU"


def test_a_gpu_fault_covers_an_instance_fault_which_returns_when_the_gpu_recovers(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID, 9, 0)
    instance_taint = h.latest_taints()["gpu-0-mig-9-0"]
    h.probes(1, error="NVML query failed: GPU is lost")
    assert list(h.latest_taints()) == ["gpu-0"], "one unhealthy taint per device"
    assert all(t == h.latest_taints()["gpu-0"] for t in h.published_taints().values() if t)
    assert h.unhealthy() == set(MIG_NAMES)
    h.probes(2)
    assert h.latest_taints() == {"gpu-0-mig-9-0": instance_taint}
    assert h.unhealthy() == {"gpu-0-mig-9-0"}


# --- fault rules at the instance level ---------------------------------------------------------


def test_a_reset_required_instance_fault_never_recovers_through_probes(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID, 9, 0)
    h.probes(50)
    assert h.unhealthy() == {"gpu-0-mig-9-0"}
    assert h.monitor.instance_health()["gpu-0-mig-9-0"].needs_reset


def test_an_ordinary_instance_fault_recovers_through_healthy_probes_of_its_gpu(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(ORDINARY_XID, 9, 0)
    h.probes(1)
    h.probes(1, error="NVML query failed")
    assert h.unhealthy() == set(MIG_NAMES), "the failing probe is a GPU fault"
    assert h.monitor.instance_health()["gpu-0-mig-9-0"].healthy_probes == 0, "streak restarted"
    h.probes(1)
    assert h.unhealthy() == set(MIG_NAMES)
    h.probes(1)
    assert h.unhealthy() == set(), "GPU and instance recover on the same healthy probes"
    assert h.latest_taints() == {}
    h.emit(RESET_XID, 9, 0)
    assert h.monitor.instance_health()["gpu-0-mig-9-0"].needs_reset


def test_an_ignored_xid_on_an_instance_changes_nothing(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(43, 9, 0)
    assert h.taints.calls == [] and h.unhealthy() == set()


def test_an_nvml_event_naming_an_instance_taints_its_device(tmp_path: Path) -> None:
    table = static_table(tmp_path)
    fake = FakeEventNvml([g.uuid for g in table.gpus])
    taints, stream = RecordingTaints(), RecordingStream()
    monitor = HealthMonitor(
        NvmlHealthChecker(fake.module(), wait_timeout_ms=50),
        DRIVER,
        NODE,
        table,
        HealthSettings(probe_interval=3600),
        taints=taints,
        stream=stream,
        clock=FakeClock(),
    )
    monitor.start()
    try:
        fake.push(table.gpus[0].uuid, XID, RESET_XID, gi=2, ci=1)
        eventually(lambda: bool(taints.calls), "a taint map")
        assert list(taints.calls[-1]) == ["gpu-0-mig-2-1"]
    finally:
        monitor.stop()


# --- dynamic MIG devices -----------------------------------------------------------------------


def test_a_dynamic_instance_taints_the_device_the_resolver_names(
    running: Callable[[Harness], Harness],
) -> None:
    table = dynamic_table()
    h = running(harness(table, resolver_of(table)))
    h.emit(RESET_XID, PLACED_GI, 0)
    assert list(h.latest_taints()) == [PLACED]
    assert h.unhealthy() == {PLACED}
    (taint,) = h.latest_taints()[PLACED]
    assert taint["value"] == f"reset-required-XID-94-contained-ECC-error-on-MIG-GI-{PLACED_GI}-CI-0"
    dynamic = [d.name for d in table if d.dynamic_mig]
    assert len(dynamic) > 20 and all(
        d.health == Health.HEALTHY for d in h.stream.lists[-1] if d.device_name != PLACED
    )


def test_a_resolver_set_later_is_used(running: Callable[[Harness], Harness]) -> None:
    table = dynamic_table()
    h = running(harness(table))
    h.emit(RESET_XID, PLACED_GI, 0)
    assert h.taints.calls == [], "no resolver yet: the instance is unknown"
    h.monitor.set_instance_resolver(resolver_of(table))
    h.emit(RESET_XID, PLACED_GI, 0)
    assert list(h.latest_taints()) == [PLACED]


@pytest.mark.parametrize(
    "answer",
    [None, "gpu-1-half-0", "gpu-0-mig-9-9", "gpu-7-mig-1g-10gb-0"],
    ids=["unknown", "not-mig", "no-such-device", "other-gpu"],
)
def test_an_instance_the_resolver_does_not_know_taints_nothing(
    answer: str | None, running: Callable[[Harness], Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = running(harness(dynamic_table(), lambda uuid, gi: answer))
    with caplog.at_level(logging.INFO, logger="kubeletplugin.health"):
        h.emit(RESET_XID, 12, 0)
    assert h.taints.calls == [] and h.unhealthy() == set()
    lines = [r for r in caplog.records if "not a MIG device this node publishes" in r.message]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_a_failing_resolver_counts_the_fault_for_the_whole_gpu(
    running: Callable[[Harness], Harness],
) -> None:
    def broken(uuid: str, gpu_instance: int) -> str | None:
        raise RuntimeError("state file unreadable")

    table = dynamic_table()
    h = running(harness(table, broken))
    h.emit(RESET_XID, PLACED_GI, 0)
    assert list(h.latest_taints()) == ["gpu-0"]
    assert h.unhealthy() == {d.name for d in table if d.dynamic_mig}


def test_a_dynamic_device_keeps_its_fault_after_its_instance_is_gone(
    running: Callable[[Harness], Harness],
) -> None:
    table = dynamic_table()
    prepared = {PLACED_GI: PLACED}
    h = running(harness(table, lambda uuid, gi: prepared.get(gi)))
    h.emit(ORDINARY_XID, PLACED_GI, 0)
    prepared.clear()  # the claim is unprepared, its instance destroyed
    h.probes(1)
    assert h.unhealthy() == {PLACED}, "the placement's slices were faulty, not the instance"
    h.probes(1)
    assert h.unhealthy() == set() and h.latest_taints() == {}


# --- restart -----------------------------------------------------------------------------------


def restarted(h: Harness, booted_at: float) -> Harness:
    """A new monitor on the same table that restores the taints ``h`` published."""
    slices = [{"spec": {"driver": DRIVER, **c}} for c in desired_slices(h.table, h.latest_taints())]
    published = unhealthy_from_slices(slices, DRIVER, h.clock.time())
    again = harness(h.table, start=False)
    again.clock.advance(h.clock.time() - again.clock.time())
    again.monitor.restore(published, booted_at=booted_at)
    return again


def test_a_restored_instance_taint_comes_back_on_its_device_only(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID, 9, 0)
    before = h.latest_taints()
    again = restarted(h, booted_at=h.clock.time() - 3600)
    assert again.monitor.taints() == before
    assert all(g.healthy for g in again.monitor.gpu_health().values())
    assert again.monitor.instance_health()["gpu-0-mig-9-0"].needs_reset
    assert {
        d.device_name for d in again.monitor.device_health() if d.health == Health.UNHEALTHY
    } == {"gpu-0-mig-9-0"}


def test_a_restored_gpu_instance_taint_stays_on_its_compute_instances(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(ORDINARY_XID, 2, None)
    before = h.latest_taints()
    again = restarted(h, booted_at=h.clock.time() - 3600)
    assert again.monitor.taints() == before
    assert set(before) == {"gpu-0-mig-2-0", "gpu-0-mig-2-1"}


def test_a_restored_gpu_taint_stays_gpu_wide(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID)
    again = restarted(h, booted_at=h.clock.time() - 3600)
    assert again.monitor.taints() == h.latest_taints()
    assert not again.monitor.gpu_health()[h.table.gpus[0].uuid].healthy
    assert all(s.healthy for s in again.monitor.instance_health().values())


def test_a_restored_dynamic_instance_taint_comes_back_on_its_device(
    running: Callable[[Harness], Harness],
) -> None:
    table = dynamic_table()
    h = running(harness(table, resolver_of(table)))
    h.emit(RESET_XID, PLACED_GI, 0)
    again = restarted(h, booted_at=h.clock.time() - 3600)
    assert again.monitor.taints() == h.latest_taints() and list(h.latest_taints()) == [PLACED]
    again.probes(10)
    assert list(again.monitor.taints()) == [PLACED], "still waiting for a reset"


def test_a_restored_reset_instance_taint_recovers_after_a_reboot(
    tmp_path: Path, running: Callable[[Harness], Harness]
) -> None:
    h = running(harness(static_table(tmp_path)))
    h.emit(RESET_XID, 9, 0)
    again = restarted(h, booted_at=h.clock.time() + 1)
    assert list(again.monitor.taints()) == ["gpu-0-mig-9-0"]
    again.probes(2)
    assert again.monitor.taints() == {}


def test_restore_reads_a_fault_on_one_gpu_instance_as_that_instance_s(tmp_path: Path) -> None:
    h = harness(static_table(tmp_path), start=False)
    fault = PublishedFault("XID-62-internal-micro-controller-halt-on-MIG-GI-9-CI-0", 100.0)
    h.monitor.restore({"gpu-0-mig-9-0": fault}, booted_at=50.0)
    assert list(h.monitor.taints()) == ["gpu-0-mig-9-0"]
    assert all(g.healthy for g in h.monitor.gpu_health().values())


def test_restore_reads_a_fault_on_two_gpu_instances_as_gpu_wide(tmp_path: Path) -> None:
    h = harness(static_table(tmp_path), start=False)
    fault = PublishedFault("XID-62-internal-micro-controller-halt", 100.0)
    h.monitor.restore({"gpu-0-mig-9-0": fault, "gpu-0-mig-2-0": fault}, booted_at=50.0)
    assert list(h.monitor.taints()) == ["gpu-0"]


# --- NVML events -------------------------------------------------------------------------------


def test_nvml_events_carry_the_mig_instance_they_name() -> None:
    fake = FakeEventNvml(["GPU-a"])
    checker = NvmlHealthChecker(fake.module(), wait_timeout_ms=50)

    def data(gi: int, ci: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            device={"uuid": "GPU-a"},
            eventType=XID,
            eventData=94,
            gpuInstanceId=gi,
            computeInstanceId=ci,
        )

    event = checker.to_event(data(9, 0))
    assert event == HealthEvent("GPU-a", EventKind.XID, 94, "", 9, 0)
    assert event_reason(event, ()) == (
        "reset required: XID 94: contained ECC error on MIG GI 9 CI 0"
    )
    whole = checker.to_event(data(NO_INSTANCE, NO_INSTANCE))
    assert whole == HealthEvent("GPU-a", EventKind.XID, 94)
    assert event_reason(whole, ()) == "reset required: XID 94: contained ECC error"
    gi_only = checker.to_event(data(3, NO_INSTANCE))
    assert gi_only is not None and (gi_only.gpu_instance, gi_only.compute_instance) == (3, None)
    old = types.SimpleNamespace(device={"uuid": "GPU-a"}, eventType=XID, eventData=94)
    assert checker.to_event(old) == whole, "old pynvml without the instance fields"
