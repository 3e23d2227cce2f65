"""Health of MIG devices: a fault of the physical GPU taints every MIG device of it, and an NVML
event that names a MIG instance says so in the reason (health is kept per physical GPU)."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

from api import names
from kubeletplugin.devices.mock import load_mock_config
from kubeletplugin.devices.slices import desired_slices
from kubeletplugin.devices.table import NodeDevices, node_devices
from kubeletplugin.health.events import EventKind, HealthEvent, event_reason
from kubeletplugin.health.monitor import HealthMonitor
from kubeletplugin.health.nvmlcheck import NO_INSTANCE, NvmlHealthChecker
from kubeletplugin.health.restore import PublishedFault
from kubeletplugin.health.settings import HealthSettings
from kubeletplugin.kubelet.healthservice import Health
from tests.kubeletplugin.health.helpers import (
    NODE,
    XID,
    FakeClock,
    FakeEventNvml,
    ManualChecker,
    RecordingStream,
    RecordingTaints,
)

DRIVER = names.DEFAULT_DRIVER_NAME
MIG_NAMES = ["gpu-0-mig-2-0", "gpu-0-mig-9-0", "gpu-0-mig-10-0"]


def mig_table(tmp_path: Path) -> NodeDevices:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            - migDevices:
                - {profile: 1g.10gb, gpuInstance: 9}
                - {profile: 1g.10gb, gpuInstance: 10}
                - {profile: 3g.40gb, gpuInstance: 2}
            - {}
            """
        )
    )
    return node_devices(load_mock_config(NODE, path), names.SHARING_MODE_CONSUMABLE)


def test_an_xid_on_a_mig_instance_taints_every_mig_device_of_the_gpu(tmp_path: Path) -> None:
    table = mig_table(tmp_path)
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
        HealthSettings(probe_interval=3600),
        taints=taints,
        stream=stream,
        clock=clock,
    )
    monitor.start()
    try:
        assert [d.device_name for d in stream.lists[0]] == [*MIG_NAMES, "gpu-1"]
        parent = table.gpus[0]
        checker.emit(HealthEvent(parent.uuid, EventKind.XID, 94, "", 9, 0))
        (taint,) = taints.calls[-1]["gpu-0"]
        assert taint["value"].endswith("on-MIG-GI-9-CI-0")
        latest = {d.device_name: d for d in stream.lists[-1]}
        assert {n for n, d in latest.items() if d.health == Health.UNHEALTHY} == set(MIG_NAMES)
        assert "on MIG GI 9 CI 0" in latest["gpu-0-mig-2-0"].message
        contents = desired_slices(table, taints.calls[-1])
        published = {d["name"]: d for c in contents for d in c["devices"]}
        assert all(published[n]["taints"] == [taint] for n in MIG_NAMES)
        assert "taints" not in published["gpu-1"]
    finally:
        monitor.stop()


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


def test_a_published_taint_on_mig_devices_is_restored_for_their_gpu(tmp_path: Path) -> None:
    table = mig_table(tmp_path)
    taints = RecordingTaints()
    monitor = HealthMonitor(
        ManualChecker(),
        DRIVER,
        NODE,
        table,
        HealthSettings(probe_interval=3600),
        taints=taints,
        stream=RecordingStream(),
        clock=FakeClock(),
    )
    reason = "reset required: XID 79: GPU has fallen off the bus"
    fault = PublishedFault(reason, 100.0)
    monitor.restore({n: fault for n in MIG_NAMES}, booted_at=50.0)
    parent, whole = table.gpus
    health = monitor.gpu_health()
    assert not health[parent.uuid].healthy and health[parent.uuid].reason == reason
    assert health[whole.uuid].healthy
    assert list(monitor.taints()) == ["gpu-0"]
