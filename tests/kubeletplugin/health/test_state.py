"""The health rules without threads: events, the state machine, taints, the monitor's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api import names
from kubeletplugin.devices.table import node_devices
from kubeletplugin.health.events import (
    DEFAULT_IGNORED_XIDS,
    EventKind,
    HealthEvent,
    event_reason,
    is_reset_reason,
    needs_reset,
    parse_xid_list,
)
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.health.restore import PublishedFault, node_boot_time, unhealthy_from_slices
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.health.state import HealthStateMachine
from kubeletplugin.health.taints import taint_value, unhealthy_taint
from kubeletplugin.kubelet.healthservice import Health
from sharegpu.kube import slicerules
from sharegpu.kube.clock import FakeClock
from tests.helpers import eventually
from tests.kubeletplugin.health.helpers import (
    NODE,
    ManualChecker,
    RecordingStream,
    RecordingTaints,
    gpus,
)

DRIVER = names.DEFAULT_DRIVER_NAME
T0 = 1_800_000_000.0


# --- events ----------------------------------------------------------------------------------


def test_default_ignore_list_is_the_application_xids() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS


@pytest.mark.parametrize("xid", sorted(DEFAULT_IGNORED_XIDS))
def test_application_xids_are_not_faults(xid: int) -> None:
    assert event_reason(HealthEvent("u", EventKind.XID, xid=xid), DEFAULT_IGNORED_XIDS) is None


def test_hardware_events_are_faults_with_reasons() -> None:
    ignored = DEFAULT_IGNORED_XIDS
    assert event_reason(HealthEvent("u", EventKind.XID, xid=79), ignored) == (
        "reset required: XID 79: GPU has fallen off the bus"
    )
    assert event_reason(HealthEvent("u", EventKind.XID, xid=92), ignored) == (
        "XID 92: high single-bit ECC error rate"
    )
    assert event_reason(HealthEvent("u", EventKind.XID, xid=999), ignored) == "XID 999"
    assert event_reason(HealthEvent("u", EventKind.DOUBLE_BIT_ECC), ignored) == (
        "reset required: double-bit ECC error"
    )
    assert event_reason(HealthEvent("u", EventKind.GPU_LOST), ignored) == (
        "reset required: GPU lost"
    )
    assert event_reason(HealthEvent("u", EventKind.FAULT, detail="boom"), ignored) == "boom"


def test_an_ignored_xid_can_be_made_a_fault_by_an_empty_ignore_list() -> None:
    assert event_reason(HealthEvent("u", EventKind.XID, xid=13), frozenset()) == "XID 13"


def test_parse_xid_list() -> None:
    assert parse_xid_list("13, 31,,43 ") == frozenset({13, 31, 43})
    assert parse_xid_list("") == frozenset()
    with pytest.raises(ValueError, match="'x1' is not an integer"):
        parse_xid_list("13,x1")
    with pytest.raises(ValueError, match="negative"):
        parse_xid_list("-4")


# --- state machine ---------------------------------------------------------------------------


def machine(recovery: int = 3, window: float = 300.0, factor: int = 8) -> HealthStateMachine:
    m = HealthStateMachine(recovery, window, factor)
    m.set_gpus(["a", "b"], T0)
    return m


def test_fault_makes_unhealthy_once_and_keeps_the_first_reason() -> None:
    m = machine()
    assert m.fault("a", "XID 79", T0 + 1) is True
    assert m.fault("a", "XID 48", T0 + 2) is False
    state = m.get("a")
    assert (state.healthy, state.reason, state.since) == (False, "XID 79", T0 + 1)
    assert m.get("b").healthy is True
    assert m.fault("unknown", "x", T0) is False


def test_failed_probe_makes_unhealthy_with_the_error() -> None:
    m = machine()
    assert m.probe("a", "NVML query failed: GPU is lost", T0 + 1) is True
    assert m.get("a").reason == "NVML query failed: GPU is lost"
    assert m.probe("b", None, T0 + 1) is False


def test_recovery_after_n_consecutive_healthy_probes() -> None:
    m = machine(recovery=3)
    m.fault("a", "XID 79", T0)
    assert [m.probe("a", None, T0 + i) for i in (1, 2)] == [False, False]
    assert m.get("a").healthy is False
    assert m.probe("a", None, T0 + 3) is True
    state = m.get("a")
    assert (state.healthy, state.reason, state.last_recovery) == (True, "", T0 + 3)


def test_a_fault_during_recovery_restarts_the_count() -> None:
    m = machine(recovery=3)
    m.fault("a", "XID 79", T0)
    m.probe("a", None, T0 + 1)
    m.probe("a", None, T0 + 2)
    m.probe("a", "still broken", T0 + 3)
    assert [m.probe("a", None, T0 + 3 + i) for i in (1, 2, 3)] == [False, False, True]


def test_flapping_doubles_the_recovery_probes_up_to_the_cap() -> None:
    m = machine(recovery=2, window=100.0, factor=4)
    now = T0
    needed = []
    for _ in range(4):
        m.fault("a", "XID 79", now)
        count = 0
        while not m.get("a").healthy:
            now += 1
            count += 1
            m.probe("a", None, now)
        needed.append(count)
    assert needed == [2, 4, 8, 8]
    # A failure after a quiet window starts from the configured count again.
    now += 101
    m.fault("a", "XID 79", now)
    assert m.get("a").required == 2


def test_flapping_probes_give_bounded_transitions() -> None:
    """A GPU whose probes alternate fail/ok never recovers: one transition, not one per probe."""
    m = machine(recovery=3)
    changes = sum(m.probe("a", "flaky" if i % 2 == 0 else None, T0 + i) for i in range(100))
    assert changes == 1
    assert m.get("a").healthy is False


def test_set_gpus_keeps_known_and_forgets_removed() -> None:
    m = machine()
    m.fault("a", "x", T0)
    m.set_gpus(["a", "c"], T0 + 5)
    assert m.get("a").healthy is False
    assert m.get("c").healthy is True
    with pytest.raises(KeyError):
        m.get("b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"recovery_probes": 0}, "recovery_probes"), ({"flap_window": -1}, "flap_window")],
)
def test_machine_rejects_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthStateMachine(**kwargs)  # type: ignore[arg-type]


# --- taints ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "XID 79: GPU has fallen off the bus",
        "NVML query failed: GPU is lost",
        "--weird (reason) with ünïcode & a very long tail " * 4,
        "!!!",
        "",
    ],
)
def test_taint_values_are_label_values(reason: str) -> None:
    value = taint_value(reason)
    assert slicerules.is_label_value(value)
    assert len(value) <= 63


def test_unhealthy_taint_shape() -> None:
    taint = unhealthy_taint(DRIVER, "XID 79: GPU has fallen off the bus", T0, "NoExecute")
    assert taint == {
        "key": "gpu.sharegpu.dev/unhealthy",
        "value": "XID-79-GPU-has-fallen-off-the-bus",
        "effect": "NoExecute",
        "timeAdded": "2027-01-15T08:00:00Z",
    }
    assert "value" not in unhealthy_taint(DRIVER, "!!!", T0, "NoSchedule")
    with pytest.raises(ValueError, match="None"):
        unhealthy_taint(DRIVER, "x", T0, "None")


# --- monitor outputs (driven synchronously) --------------------------------------------------


def monitor(
    mode: str = names.SHARING_MODE_CONSUMABLE, count: int = 2, **settings: object
) -> tuple[HealthMonitor, ManualChecker, RecordingTaints, RecordingStream, FakeClock]:
    checker, taints, stream, clock = (
        ManualChecker(),
        RecordingTaints(),
        RecordingStream(),
        FakeClock(),
    )
    m = HealthMonitor(
        checker,
        DRIVER,
        NODE,
        node_devices(gpus(count), mode),
        HealthSettings(probe_interval=3600, **settings),  # type: ignore[arg-type]
        taints=taints,
        stream=stream,
        clock=clock,
    )
    return m, checker, taints, stream, clock


def test_device_table_lists_every_partition_by_gpu() -> None:
    g = gpus(2)
    by_gpu = node_devices(g, names.SHARING_MODE_PARTITIONS).names_by_gpu()
    assert by_gpu[g[1].uuid][0] == "gpu-1"
    assert len(by_gpu[g[1].uuid]) == 1 + 2 + 4 + 8
    assert all(n == "gpu-1" or n.startswith("gpu-1-") for n in by_gpu[g[1].uuid])
    assert node_devices(g, names.SHARING_MODE_EXCLUSIVE).names_by_gpu() == {
        g[0].uuid: ["gpu-0"],
        g[1].uuid: ["gpu-1"],
    }


def test_xid_taints_the_gpu_and_marks_all_its_partitions_on_the_stream() -> None:
    m, checker, taints, stream, clock = monitor(names.SHARING_MODE_PARTITIONS)
    m.start()
    try:
        assert checker.started
        assert len(stream.lists) == 1 and len(stream.lists[0]) == 2 * 15
        assert {d.health for d in stream.lists[0]} == {Health.HEALTHY}
        assert taints.calls == []
        uuid1 = gpus(2)[1].uuid
        clock.advance(10)
        checker.emit(HealthEvent(uuid1, EventKind.XID, xid=79))
        assert taints.calls[-1] == {
            "gpu-1": [
                unhealthy_taint(
                    DRIVER,
                    "reset required: XID 79: GPU has fallen off the bus",
                    clock.time(),
                    "NoSchedule",
                )
            ]
        }
        latest = stream.lists[-1]
        assert len(latest) == 30
        assert {d.pool_name for d in latest} == {NODE}
        bad = {d.device_name for d in latest if d.health == Health.UNHEALTHY}
        assert bad == {
            n for n in node_devices(gpus(2), names.SHARING_MODE_PARTITIONS).names_by_gpu()[uuid1]
        }
        assert {d.message for d in latest if d.health == Health.UNHEALTHY} == {
            "reset required: XID 79: GPU has fallen off the bus"
        }
    finally:
        m.stop()
    assert checker.stopped


def test_ignored_xid_changes_nothing() -> None:
    m, checker, taints, stream, _ = monitor()
    m.start()
    try:
        checker.emit(HealthEvent(gpus(2)[0].uuid, EventKind.XID, xid=13))
        assert taints.calls == []
        assert len(stream.lists) == 1
        assert all(h.healthy for h in m.gpu_health().values())
    finally:
        m.stop()


def test_custom_ignore_list_and_noexecute() -> None:
    m, checker, taints, _, _ = monitor(ignored_xids=frozenset({79}), taint_effect="NoExecute")
    m.start()
    try:
        uuid = gpus(2)[0].uuid
        checker.emit(HealthEvent(uuid, EventKind.XID, xid=79))
        assert taints.calls == []
        checker.emit(HealthEvent(uuid, EventKind.XID, xid=13))
        assert taints.calls[-1]["gpu-0"][0]["effect"] == "NoExecute"
        assert taints.calls[-1]["gpu-0"][0]["value"] == "XID-13"
    finally:
        m.stop()


def test_unidentified_event_marks_every_gpu() -> None:
    m, checker, taints, _, _ = monitor()
    m.start()
    try:
        checker.emit(HealthEvent(None, EventKind.DOUBLE_BIT_ECC))
        assert sorted(taints.calls[-1]) == ["gpu-0", "gpu-1"]
    finally:
        m.stop()


def test_probe_failure_then_recovery_removes_the_taint() -> None:
    m, checker, taints, stream, clock = monitor(recovery_probes=3)
    uuid = gpus(2)[0].uuid
    checker.errors[uuid] = "NVML query failed: GPU is lost"
    m.probe_all()
    assert list(taints.calls[-1]) == ["gpu-0"]
    assert taints.calls[-1]["gpu-0"][0]["value"] == "NVML-query-failed-GPU-is-lost"
    del checker.errors[uuid]
    for _ in range(2):
        clock.advance(5)
        m.probe_all()
    assert len(taints.calls) == 1
    clock.advance(5)
    m.probe_all()
    assert taints.calls[-1] == {}
    assert {d.health for d in stream.lists[-1]} == {Health.HEALTHY}


def test_taints_are_handed_over_only_when_they_change() -> None:
    m, checker, taints, _, clock = monitor()
    uuid = gpus(2)[0].uuid
    checker.errors[uuid] = "broken"
    for _ in range(10):
        clock.advance(1)
        m.probe_all()
    assert len(taints.calls) == 1


def test_stream_is_refreshed_with_fresh_times_without_changes() -> None:
    m, _, _, stream, clock = monitor(stream_refresh=20.0)
    m.probe_all()
    count = len(stream.lists)
    clock.advance(5)
    m.probe_all()
    assert len(stream.lists) == count
    clock.advance(20)
    m.probe_all()
    assert len(stream.lists) == count + 1
    assert {d.last_updated for d in stream.lists[-1]} == {int(clock.time())}


def test_a_crashing_probe_is_an_unhealthy_gpu() -> None:
    m, checker, taints, _, _ = monitor()

    def boom(gpu: object) -> str | None:
        raise RuntimeError("checker bug")

    checker.probe = boom  # type: ignore[method-assign]
    m.probe_all()
    assert sorted(taints.calls[-1]) == ["gpu-0", "gpu-1"]
    assert taints.calls[-1]["gpu-0"][0]["value"].startswith("health-probe-failed-RuntimeError")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe_interval": 0}, "probe interval"),
        ({"recovery_probes": 0}, "recovery probes"),
        ({"taint_effect": "None"}, "taint effect"),
    ],
)
def test_settings_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthSettings(**kwargs)  # type: ignore[arg-type]


def test_stream_refresh_does_not_wait_for_a_slow_probe_interval() -> None:
    stream = RecordingStream()
    m = HealthMonitor(
        ManualChecker(),
        DRIVER,
        NODE,
        node_devices(gpus(1), names.SHARING_MODE_EXCLUSIVE),
        HealthSettings(probe_interval=3600, stream_refresh=0.05),
        stream=stream,
    )
    m.start()
    try:
        eventually(lambda: len(stream.lists) >= 4, "refreshed lists", timeout_s=10.0)
    finally:
        m.stop()
    assert all(len(lst) == 1 and lst[0].health == Health.HEALTHY for lst in stream.lists)


def test_published_taints_are_read_back() -> None:
    taint = unhealthy_taint(DRIVER, "XID 79", T0, "NoSchedule")
    slices: list[dict[str, Any]] = [
        {
            "spec": {
                "driver": DRIVER,
                "devices": [{"name": "gpu-0"}, {"name": "gpu-1", "taints": [taint]}],
            }
        },
        {"spec": {"driver": "other.example", "devices": [{"name": "gpu-0", "taints": [taint]}]}},
        {"spec": {"driver": DRIVER, "sharedCounters": []}},
    ]
    assert unhealthy_from_slices(slices, DRIVER, T0 + 100) == {
        "gpu-1": PublishedFault("XID-79", T0)
    }
    odd = {"key": names.unhealthy_taint_key(DRIVER), "effect": "NoSchedule", "timeAdded": "bad"}
    slices = [{"spec": {"driver": DRIVER, "devices": [{"name": "gpu-0", "taints": [odd]}]}}]
    (fault,) = unhealthy_from_slices(slices, DRIVER, T0 + 100).values()
    assert fault == PublishedFault("unhealthy before the plugin restarted", T0 + 100)


def test_restore_keeps_the_published_taint_unchanged_until_recovery() -> None:
    m, _, taints, stream, _ = monitor(recovery_probes=2)
    published = unhealthy_taint(
        DRIVER, "XID 79: GPU has fallen off the bus", T0 - 3600, "NoSchedule"
    )
    m.restore({"gpu-1": PublishedFault(published["value"], T0 - 3600)})
    assert taints.calls == [{"gpu-1": [published]}]
    assert stream.lists[-1][1].health == Health.UNHEALTHY
    m.probe_all()
    assert len(taints.calls) == 1
    m.probe_all()
    assert taints.calls[-1] == {}


# --- faults that need a GPU reset ------------------------------------------------------------

RESET_XIDS = (48, 63, 64, 74, 79, 94, 95, 119, 120, 154)


@pytest.mark.parametrize("xid", RESET_XIDS)
def test_reset_xids_need_a_reset(xid: int) -> None:
    event = HealthEvent("u", EventKind.XID, xid=xid)
    assert needs_reset(event)
    reason = event_reason(event, DEFAULT_IGNORED_XIDS)
    assert reason is not None and is_reset_reason(reason)
    assert is_reset_reason(taint_value(reason))


@pytest.mark.parametrize("xid", [13, 31, 62, 92, 999])
def test_other_xids_do_not_need_a_reset(xid: int) -> None:
    event = HealthEvent("u", EventKind.XID, xid=xid)
    assert not needs_reset(event)
    reason = event_reason(event, frozenset())
    assert reason is not None and not is_reset_reason(reason)


def test_pending_remap_and_lost_gpu_need_a_reset() -> None:
    for kind in (EventKind.RESET_REQUIRED, EventKind.DOUBLE_BIT_ECC, EventKind.GPU_LOST):
        assert needs_reset(HealthEvent("u", kind, detail="row remapping pending"))
    assert not needs_reset(HealthEvent("u", EventKind.FAULT, detail="boom"))
    reason = event_reason(
        HealthEvent("u", EventKind.RESET_REQUIRED, detail="row remapping pending"), ()
    )
    assert reason == "reset required: row remapping pending"


def test_the_reset_marker_survives_the_cut_to_a_taint_value() -> None:
    reason = "reset required: " + "a very long description of an XID " * 5
    value = taint_value(reason)
    assert len(value) == 63 and is_reset_reason(value)


def test_a_reset_fault_never_recovers_through_probes() -> None:
    m = machine(recovery=2)
    assert m.fault("a", "reset required: XID 79", T0, needs_reset=True)
    assert not any(m.probe("a", None, T0 + i) for i in range(1, 1000))
    assert m.get("a").healthy is False and m.get("a").needs_reset
    m.reset_done("a", T0 + 1000)
    assert [m.probe("a", None, T0 + 1000 + i) for i in (1, 2)] == [False, True]
    assert m.get("a").healthy and not m.get("a").needs_reset


def test_a_reset_fault_on_an_unhealthy_gpu_makes_it_sticky_with_the_new_reason() -> None:
    m = machine(recovery=2)
    m.probe("a", "NVML query failed", T0)
    assert m.fault("a", "reset required: XID 48", T0 + 1, needs_reset=True) is True
    assert (m.get("a").reason, m.get("a").needs_reset) == ("reset required: XID 48", True)
    assert m.fault("a", "reset required: XID 79", T0 + 2, needs_reset=True) is False
    assert not any(m.probe("a", None, T0 + 2 + i) for i in range(1, 10))


def test_monitor_keeps_the_taint_of_a_reset_xid_across_any_number_of_probes() -> None:
    m, _, taints, stream, clock = monitor(recovery_probes=1)
    uuid = gpus(2)[0].uuid
    m.handle_event(HealthEvent(uuid, EventKind.XID, xid=94))
    assert list(taints.calls[-1]) == ["gpu-0"]
    for _ in range(50):
        clock.advance(5)
        m.probe_all()
    assert len(taints.calls) == 1
    assert not m.gpu_health()[uuid].healthy
    assert stream.lists[-1][0].health == Health.UNHEALTHY


def test_probe_failures_still_recover_by_themselves() -> None:
    m, checker, taints, _, clock = monitor(recovery_probes=2)
    uuid = gpus(2)[0].uuid
    checker.errors[uuid] = "NVML query failed: Unknown Error"
    m.probe_all()
    del checker.errors[uuid]
    for _ in range(2):
        clock.advance(5)
        m.probe_all()
    assert taints.calls[-1] == {}


def published_reset_fault(since: float) -> dict[str, PublishedFault]:
    value = taint_value("reset required: XID 79: GPU has fallen off the bus")
    return {"gpu-1": PublishedFault(value, since)}


def test_a_restored_reset_taint_stays_when_the_node_did_not_reboot() -> None:
    m, _, taints, _, clock = monitor(recovery_probes=1)
    m.restore(published_reset_fault(T0 - 3600), booted_at=T0 - 7200)
    for _ in range(20):
        clock.advance(5)
        m.probe_all()
    assert list(taints.calls[-1]) == ["gpu-1"]
    assert m.gpu_health()[gpus(2)[1].uuid].needs_reset


def test_a_restored_reset_taint_recovers_after_a_reboot() -> None:
    m, _, taints, _, clock = monitor(recovery_probes=2)
    m.restore(published_reset_fault(T0 - 3600), booted_at=T0 - 600)
    assert list(taints.calls[-1]) == ["gpu-1"]
    clock.advance(5)
    m.probe_all()
    assert list(taints.calls[-1]) == ["gpu-1"]
    clock.advance(5)
    m.probe_all()
    assert taints.calls[-1] == {}


def test_node_boot_time(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime 1764000000\nprocesses 9\n")
    assert node_boot_time(stat) == 1764000000.0
    stat.write_text("cpu  1 2 3\n")
    assert node_boot_time(stat) is None
    assert node_boot_time(tmp_path / "absent") is None
