"""A plugin that dies after it drove the node for a claim but before the claim's PrepareCompleted
record: the next start rolls the claim back and undoes what no checkpoint recorded."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from api.gpuconfig import DriverConfigs, decode_driver_configs
from kubeletplugin.devicerecord import DeviceRecord
from kubeletplugin.hosts.fakerunner import RecordedCall
from kubeletplugin.prepare.checkpoint import CHECKPOINT_FILE, STATE_STARTED
from kubeletplugin.runner import CommandResult
from kubeletplugin.sharing.enforcement import Applied, ShareError
from kubeletplugin.sharing.enforcer import SharingEnforcer
from kubeletplugin.sharing.mpspaths import daemon_id
from kubeletplugin.sharing.strategies.timeslicing import TimeSlicingNode
from kubeletplugin.sharing.timeslice import TimeSliceManager
from tests.kubeletplugin.prepare import helpers as h
from tests.kubeletplugin.sharing.helpers import (
    GI,
    Tools,
    gpu_config,
    query_compute_mode,
    record,
)

TIME_SLICING_LONG = gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})


class CrashAfterApply:
    """An enforcer that keeps the checkpoint file as it is on disk right after ``apply`` of one
    claim: what a plugin dying there leaves behind (the claim is PrepareStarted, the exported
    state predates the claim)."""

    def __init__(self, inner: SharingEnforcer, checkpoint: Path, claim_uid: str) -> None:
        self.inner = inner
        self.checkpoint = checkpoint
        self.claim_uid = claim_uid
        self.on_disk: bytes | None = None

    def apply(
        self, claim_uid: str, devices: Sequence[DeviceRecord], configs: DriverConfigs
    ) -> Applied:
        done = self.inner.apply(claim_uid, devices, configs)
        if claim_uid == self.claim_uid:
            self.on_disk = self.checkpoint.read_bytes()
        return done

    def release(self, claim_uid: str) -> None:
        self.inner.release(claim_uid)

    def export_state(self) -> dict[str, Any]:
        return self.inner.export_state()

    def restore(
        self,
        state: Mapping[str, Any] | None,
        prepared: Mapping[str, Sequence[DeviceRecord]],
        *,
        node_gpus: Collection[str],
    ) -> dict[str, Applied]:
        return self.inner.restore(state, prepared, node_gpus=node_gpus)


def prepare(state: Any, obj: dict[str, Any]) -> str:
    return str(state.prepare([h.ref(obj)])[obj["metadata"]["uid"]].error)


def crash_during_prepare(
    node: h.Node,
    claims: h.FakeClaims,
    tools: Tools,
    obj: dict[str, Any],
    survivors: Sequence[dict[str, Any]] = (),
) -> None:
    """Prepare ``survivors``, then ``obj``, and leave the node as a crash right after enforcing
    ``obj`` would: the checkpoint from that moment, no spec file of ``obj``."""
    uid = obj["metadata"]["uid"]
    checkpoint = node.data_dir / CHECKPOINT_FILE
    enforcer = CrashAfterApply(tools.enforcer(node.data_dir), checkpoint, uid)
    state = node.state(claims, enforcer=enforcer)
    claims.add(*survivors, obj)
    for other in survivors:
        assert prepare(state, other) == ""
    assert prepare(state, obj) == ""
    assert enforcer.on_disk is not None
    checkpoint.write_bytes(enforcer.on_disk)
    (node.cdi_dir / f"k8s.{h.DRIVER}-claim_{uid}.json").unlink()
    assert node.checkpoint()["claims"][uid]["state"] == STATE_STARTED


def test_an_interval_set_for_an_interrupted_prepare_is_restored_at_the_next_start(
    tmp_path: Path,
) -> None:
    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    uuid = h.gpus()[0].uuid
    c = h.claim(
        "c",
        [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})],
        configs=[TIME_SLICING_LONG],
    )
    crash_during_prepare(node, claims, tools, c)
    assert tools.sim.timeslices[uuid] == 3
    assert node.checkpoint()["sharing"]["timeSlicing"] == {}  # no record of the setting
    tools.fake.clear()

    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert c["metadata"]["uid"] not in restarted.prepared_claims()
    assert tools.fake.argvs() == [("nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice=0")]
    assert tools.sim.timeslices[uuid] == 0
    assert list((node.data_dir / "timeslice").iterdir()) == []
    assert node.checkpoint()["sharing"]["timeSlicing"] == {}
    # Nothing is left to undo at the start after that.
    tools.fake.clear()
    again = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert tools.fake.argvs() == []
    # Kubelet's retry prepares the claim for real.
    assert prepare(again, c) == ""
    assert tools.sim.timeslices[uuid] == 3


def test_a_gpu_a_surviving_time_slicing_claim_holds_keeps_its_interval(tmp_path: Path) -> None:
    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    shared, alone = h.gpus()[0].uuid, h.gpus()[1].uuid
    survivor = h.claim(
        "survivor",
        [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})],
        configs=[TIME_SLICING_LONG],
    )
    interrupted = h.claim(
        "interrupted",
        [
            h.result("gpu", "gpu-0", share={"cores": 20, "memory": 5 * GI}),
            h.result("gpu", "gpu-1", share={"cores": 20, "memory": 5 * GI}),
        ],
        configs=[TIME_SLICING_LONG],
    )
    crash_during_prepare(node, claims, tools, interrupted, survivors=[survivor])
    assert tools.sim.timeslices == {shared: 3, alone: 3}
    tools.fake.clear()

    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert set(restarted.prepared_claims()) == {survivor["metadata"]["uid"]}
    # The survivor's interval is applied again; only the GPU nobody holds goes back to Default.
    assert tools.fake.argvs() == [
        query_compute_mode(shared),
        ("nvidia-smi", "compute-policy", "-i", shared, "--set-timeslice=3"),
        ("nvidia-smi", "compute-policy", "-i", alone, "--set-timeslice=0"),
    ]
    assert tools.sim.timeslices == {shared: 3, alone: 0}
    assert sorted(p.name for p in (node.data_dir / "timeslice").iterdir()) == [shared]
    assert node.checkpoint()["sharing"]["timeSlicing"] == {shared: {"interval": "Long"}}
    # The survivor's unprepare restores its GPU and drops the marker.
    tools.fake.clear()
    assert restarted.unprepare([h.ref(survivor)])[survivor["metadata"]["uid"]].error == ""
    assert tools.fake.argvs() == [
        ("nvidia-smi", "compute-policy", "-i", shared, "--set-timeslice=0")
    ]
    assert list((node.data_dir / "timeslice").iterdir()) == []


@pytest.mark.parametrize("daemon", ["running", "dead", "never-started"])
def test_the_daemon_of_an_interrupted_prepare_is_stopped_and_its_directory_removed(
    tmp_path: Path, daemon: str
) -> None:
    # "never-started": the plugin died between creating the daemon's directory and launching
    # its pod; "dead": the daemon pod is there but its daemon died.
    node, claims, tools = h.Node(tmp_path), h.FakeClaims(), Tools.new()
    uuid = h.gpus()[0].uuid
    c = h.claim("c", [h.result("gpu", "gpu-0", share={"cores": 30, "memory": 10 * GI})])
    crash_during_prepare(node, claims, tools, c)
    assert node.checkpoint()["sharing"]["mps"] == {}  # no record of the daemon
    directory = tools.mps_root / daemon_id(c["metadata"]["uid"], uuid)
    if daemon != "running":
        tools.sim.kill_daemons()
    if daemon == "never-started":
        tools.pods.pods.clear()
    tools.fake.clear()

    restarted = node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert c["metadata"]["uid"] not in restarted.prepared_claims()
    # quit (answered by a running daemon only), the pod removed; the compute mode never changed
    assert tools.fake.argvs() == [("nvidia-cuda-mps-control",)]
    assert tools.fake.calls[0].stdin == "quit\n"
    assert tools.pods.present() == []
    assert tools.sim.mode(uuid) == "DEFAULT" and tools.sim.daemons == {}
    assert not directory.exists()
    # A prepare that never set an interval leaves no time-slice marker behind.
    assert not (node.data_dir / "timeslice").exists()
    tools.fake.clear()
    node.state(claims, enforcer=tools.enforcer(node.data_dir))
    assert tools.fake.argvs() == []


def test_the_marker_is_durable_before_the_interval_is_set_and_gone_after_default(
    tmp_path: Path,
) -> None:
    tools = Tools.new()
    uuid = h.gpus()[0].uuid
    markers = tmp_path / "timeslice"
    seen: list[str] = []

    def set_timeslice(call: RecordedCall) -> CommandResult:
        seen.append((markers / uuid).read_text() if (markers / uuid).exists() else "")
        return CommandResult(call.argv, 0, "")

    tools.fake.on("nvidia-smi", "compute-policy", answer=set_timeslice)
    ts = TimeSliceManager(tools.fake, markers)
    ts.acquire(uuid, "Medium", "claim-a")
    ts.acquire(uuid, "Medium", "claim-b")
    assert seen == ["Medium\n"] and ts.marked() == [uuid]
    ts.release(uuid, "claim-a")
    assert ts.marked() == [uuid]
    ts.release(uuid, "claim-b")
    assert ts.marked() == [] and len(seen) == 2
    # Asking for Default changes nothing worth a marker.
    ts.acquire(uuid, "Default", "claim-c")
    assert ts.marked() == [] and seen[2:] == [""]


def test_an_interval_whose_marker_cannot_be_written_is_not_set(tmp_path: Path) -> None:
    tools = Tools.new()
    (tmp_path / "timeslice").write_text("in the way")
    enforcer = tools.enforcer(tmp_path)
    gpu = h.gpus()[0]
    share = record(gpu, "gpu-0", ("gpu",), 30, 10 * GI, share_id="s-1")
    config = decode_driver_configs([TIME_SLICING_LONG], h.DRIVER)
    with pytest.raises(ShareError, match="cannot enforce the share"):
        enforcer.apply("claim-a", [share], config)
    # Only the read-only compute-mode query ran: no interval and no mode was set.
    assert tools.fake.argvs() == [query_compute_mode(gpu.uuid)]
    assert enforcer.node_of(TimeSlicingNode).manager.gpus() == []
