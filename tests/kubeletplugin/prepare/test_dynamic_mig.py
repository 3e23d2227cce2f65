"""Dynamic MIG in the state module: prepare creates each placement device's MIG instance,
unprepare destroys it, and a restart after a crash at any point of either (then kubelet's
retries) leaves no instance without a prepared claim, no prepared claim without its instance,
and every instance someone else created untouched, with the placements it blocks hidden.

The GPUs' instances live in a :class:`FakePartitioner` that outlives each ``DeviceState``, as
MIG instances outlive the daemon; a "crash" is a BaseException after which the old state makes
no further call, and a restart is a new ``DeviceState`` on the same directories.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.devices.table import NodeDevices
from kubeletplugin.kubelet.preparer import ClaimRef
from kubeletplugin.prepare.cdi import CdiSpecWriter
from kubeletplugin.prepare.checkpoint import (
    STATE_COMPLETED,
    STATE_STARTED,
    Checkpoint,
    CheckpointError,
    device_from_json,
    device_to_json,
)
from kubeletplugin.prepare.state import DeviceState
from kubeletplugin.sharing.enforcement import ShareEnforcer
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    NODE,
    FakeClaims,
    Node,
    assert_valid_cdi,
    claim,
    ref,
    result,
    spec_env,
)
from tests.kubeletplugin.prepare.migfakes import (
    CAPS_MAJOR,
    CREATE_AFTER,
    CREATE_AFTER_GI,
    CREATE_BEFORE,
    CREATE_POINTS,
    DESTROY_BEFORE_GI,
    DESTROY_POINTS,
    Crash,
    FakePartitioner,
    Instance,
    cap_minors,
    check_invariants,
    mig_node_devices,
    spec_envs_of,
    write_host,
)
from tests.kubeletplugin.sharing.helpers import Tools, gpu_config

H100_1G = "gpu-0-mig-1g-10gb-{}"
H100_2G = "gpu-0-mig-2g-20gb-{}"
H100_3G = "gpu-0-mig-3g-40gb-{}"
A100_1G = "gpu-1-mig-1g-5gb-{}"


@dataclass
class MigNode:
    """One node: its directories, device table, GPUs' MIG instances and API server claims."""

    node: Node
    devices: NodeDevices = field(default_factory=mig_node_devices)
    fake: FakePartitioner = field(default_factory=FakePartitioner)
    claims: FakeClaims = field(default_factory=FakeClaims)
    dev: Path | None = None
    proc: Path | None = None
    tools: Tools | None = None
    #: Instances created by someone else: (parent UUID, GPU instance) -> instance.
    foreign: dict[tuple[str, int], Instance] = field(default_factory=dict)

    def start(self) -> DeviceState:
        """A fresh plugin on this node (the restart after a crash)."""
        self.fake.revive()
        enforcer: ShareEnforcer | None = (
            self.tools.enforcer(self.node.data_dir) if self.tools is not None else None
        )
        state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=self.devices,
            claims=self.claims,
            cdi=CdiSpecWriter(
                self.node.cdi_dir,
                DRIVER,
                dev_root=self.dev,
                proc_root=self.proc if self.proc is not None else self.node.root / "proc",
            ),
            checkpoint=Checkpoint(self.node.data_dir, boot_id_file=self.node.boot_id_file),
            enforcer=enforcer,
            partitioner=self.fake,
        )
        state.start()
        return state

    def claim(self, name: str, *devices: str, configs: Sequence[dict[str, Any]] = ()) -> ClaimRef:
        obj = claim(name, [result(f"r{i}", d) for i, d in enumerate(devices)], configs=configs)
        self.claims.add(obj)
        return ref(obj)

    def add_foreign(self, gpu_index: int, profile: str, start: int) -> Instance:
        inst = self.fake.add_foreign(self.devices.gpus[gpu_index], profile, start)
        self.foreign[(inst.parent, inst.gi)] = replace(inst)  # as created
        return inst

    def check(self, state: DeviceState) -> None:
        check_invariants(
            state, self.devices, self.fake, self.foreign, spec_envs_of(self.node.spec_files())
        )


@pytest.fixture
def mig(node: Node) -> MigNode:
    return MigNode(node)


def prepare_ok(state: DeviceState, *refs: ClaimRef) -> None:
    outcomes = state.prepare(list(refs))
    assert {r.uid: outcomes[r.uid].error for r in refs} == {r.uid: "" for r in refs}


def instances_of(fake: FakePartitioner) -> list[tuple[str, int, int]]:
    """(profile, start, size) of every instance, sorted."""
    return sorted((i.profile.name, i.placement.start, i.placement.size) for i in fake.all())


# --- prepare and unprepare ----------------------------------------------------------------------


def test_prepare_creates_one_instance_per_placement_device_and_the_spec_names_it(
    mig: MigNode, tmp_path: Path
) -> None:
    mig.dev, mig.proc = write_host(tmp_path / "host")
    c = mig.claim("two", H100_1G.format(0), H100_2G.format(2))
    state = mig.start()
    prepare_ok(state, c)
    (first, second) = state.prepared_claims()[c.uid].devices
    assert instances_of(mig.fake) == [("1g.10gb", 0, 1), ("2g.20gb", 2, 2)]
    assert mig.fake.creates == 2
    by_start = {i.placement.start: i for i in mig.fake.all()}
    doc = assert_valid_cdi(mig.node.spec_files()[0])
    for index, (record, inst) in enumerate(((first, by_start[0]), (second, by_start[2]))):
        env = spec_env(doc, index)
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["SHAREGPU_GPU_UUID"] == inst.uuid
        assert env["SHAREGPU_MIG_PROFILE"] == inst.profile.name
        assert env["SHAREGPU_MIG_PARENT_UUID"] == mig.devices.gpus[0].uuid
        assert env["SHAREGPU_MEMORY"] == str(inst.profile.memory_mb * 1024**2)
        nodes = doc["devices"][index]["containerEdits"]["deviceNodes"]
        assert [n["path"] for n in nodes] == [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            f"/dev/nvidia-caps/nvidia-cap{cap_minors(0, inst.gi, None)}",
            f"/dev/nvidia-caps/nvidia-cap{cap_minors(0, inst.gi, 0)}",
        ]
        # The new instance's capability nodes do not exist on the host: they go in by number.
        assert [(n.get("type"), n.get("major"), n.get("minor")) for n in nodes[-2:]] == [
            ("c", CAPS_MAJOR, cap_minors(0, inst.gi, None)),
            ("c", CAPS_MAJOR, cap_minors(0, inst.gi, 0)),
        ]
        assert (record.mig_gpu_instance, record.mig_compute_instance) == (inst.gi, 0)
        assert record.mig_uuid == inst.uuid
        assert record.gpu_uuid == mig.devices.gpus[0].uuid, "the record names the physical GPU"
    (entry,) = mig.node.checkpoint()["claims"].values()
    assert entry["state"] == STATE_COMPLETED
    assert [(d["migGpuInstance"], d["migUUID"]) for d in entry["devices"]] == [
        (by_start[0].gi, by_start[0].uuid),
        (by_start[2].gi, by_start[2].uuid),
    ]
    assert state.mig_device_for(mig.devices.gpus[0].uuid, by_start[2].gi) == H100_2G.format(2)
    assert state.mig_device_for(mig.devices.gpus[1].uuid, by_start[2].gi) is None
    mig.check(state)


def test_unprepare_destroys_the_instances(mig: MigNode) -> None:
    c = mig.claim("one", H100_3G.format(4))
    state = mig.start()
    prepare_ok(state, c)
    (inst,) = mig.fake.all()
    assert state.unprepare([c])[c.uid].error == ""
    assert mig.fake.all() == [] and mig.fake.destroys == 1
    assert mig.node.spec_files() == [] and state.prepared_claims() == {}
    assert state.mig_device_for(inst.parent, inst.gi) is None
    assert mig.node.checkpoint()["claims"] == {}
    # Unpreparing again is a no-op.
    assert state.unprepare([c])[c.uid].error == ""
    assert mig.fake.destroys == 1


def test_prepare_again_creates_nothing(mig: MigNode) -> None:
    c = mig.claim("one", A100_1G.format(3))
    state = mig.start()
    first = state.prepare([c])
    assert state.prepare([c]) == first
    assert mig.start().prepare([c]) == first, "after a restart, answered from the checkpoint"
    assert mig.fake.creates == 1 and len(mig.fake.all()) == 1


@pytest.mark.parametrize("point", [CREATE_BEFORE, CREATE_AFTER_GI, CREATE_AFTER])
def test_a_failed_create_fails_only_its_claim_and_leaves_nothing(mig: MigNode, point: str) -> None:
    good = mig.claim("good", H100_1G.format(6))
    bad = mig.claim("bad", H100_1G.format(0), H100_2G.format(2))
    state = mig.start()
    mig.fake.arm(point, "fail", skip=1)  # the good claim's create passes, then bad's first
    outcomes = state.prepare([good, bad])
    assert outcomes[good.uid].error == ""
    assert "injected failure" in outcomes[bad.uid].error
    assert bad.uid in outcomes[bad.uid].error and "mig" not in outcomes[good.uid].error
    assert instances_of(mig.fake) == [("1g.10gb", 6, 1)]
    assert set(state.prepared_claims()) == {good.uid}
    assert set(mig.node.checkpoint()["claims"]) == {good.uid}
    mig.check(state)
    # kubelet retries; this time the create works.
    prepare_ok(state, bad)
    mig.check(state)


def test_a_failed_second_create_destroys_the_first(mig: MigNode) -> None:
    bad = mig.claim("bad", H100_1G.format(0), H100_2G.format(2))
    state = mig.start()
    mig.fake.arm(CREATE_BEFORE, "fail", skip=1)
    assert "injected failure" in state.prepare([bad])[bad.uid].error
    assert mig.fake.all() == [] and mig.fake.destroys == 1
    assert state.prepared_claims() == {} and mig.node.spec_files() == []


def test_a_placement_an_instance_overlaps_fails_the_claim_before_anything_is_recorded(
    mig: MigNode,
) -> None:
    big = mig.claim("big", "gpu-0-mig-7g-80gb-0")
    mig.add_foreign(0, "1g.10gb", 5)
    state = mig.start()
    writes = mig.node.checkpoint()
    error = state.prepare([big])[big.uid].error
    assert "gpu-0-mig-7g-80gb-0 (memory slices 0:8) overlaps GPU instance 1 (1g.10gb at 5:1)" in (
        error
    )
    assert mig.fake.creates == 0 and mig.node.checkpoint() == writes, "no intent recorded"
    mig.check(state)


def test_a_placement_the_gpu_cannot_take_fails_the_claim(mig: MigNode) -> None:
    a = mig.claim("a", "gpu-0-mig-1g-10gb-me-0")
    b = mig.claim("b", "gpu-0-mig-1g-10gb-me-1")  # the profile allows one instance
    state = mig.start()
    prepare_ok(state, a)
    error = state.prepare([b])[b.uid].error
    assert "profile 1g.10gb+me allows 1 instances; 1 exist" in error
    assert set(mig.node.checkpoint()["claims"]) == {a.uid}
    mig.check(state)


def test_overlapping_placements_of_two_claims_are_refused(mig: MigNode) -> None:
    a = mig.claim("a", H100_2G.format(0))  # memory slices 0-1
    b = mig.claim("b", H100_1G.format(1))  # memory slice 1
    c = mig.claim("c", H100_1G.format(2))  # memory slice 2: no overlap
    state = mig.start()
    outcomes = state.prepare([a, b, c])
    assert outcomes[a.uid].error == "" and outcomes[c.uid].error == ""
    error = outcomes[b.uid].error
    assert "gpu-0-mig-1g-10gb-1 overlaps gpu-0-mig-2g-20gb-0" in error
    assert "refusing" in error
    assert instances_of(mig.fake) == [("1g.10gb", 2, 1), ("2g.20gb", 0, 2)]
    assert mig.fake.creates == 2, "the refused claim created nothing"
    # Once a is gone, b fits.
    assert state.unprepare([a])[a.uid].error == ""
    prepare_ok(state, b)
    mig.check(state)


def test_overlapping_placements_within_one_claim_are_refused(mig: MigNode) -> None:
    c = mig.claim("c", H100_3G.format(4), H100_1G.format(5))
    state = mig.start()
    error = state.prepare([c])[c.uid].error
    assert "overlap" in error and mig.fake.creates == 0


def test_the_same_placement_device_twice_is_refused(mig: MigNode) -> None:
    a = mig.claim("a", H100_1G.format(3))
    b = mig.claim("b", H100_1G.format(3))
    state = mig.start()
    outcomes = state.prepare([a, b])
    assert outcomes[a.uid].error == "" and "overlaps" in outcomes[b.uid].error
    assert mig.fake.creates == 1


def test_admin_access_to_a_placement_device_is_refused(mig: MigNode) -> None:
    obj = claim("admin", [result("r", H100_1G.format(0), admin=True)])
    mig.claims.add(obj)
    error = mig.start().prepare([ref(obj)])[obj["metadata"]["uid"]].error
    assert "without shareID or adminAccess" in error and mig.fake.creates == 0


def test_an_unprepare_whose_destroy_fails_keeps_the_claim_for_kubelets_retry(
    mig: MigNode,
) -> None:
    c = mig.claim("c", H100_1G.format(0))
    state = mig.start()
    prepare_ok(state, c)
    mig.fake.arm(DESTROY_BEFORE_GI, "fail")
    error = state.unprepare([c])[c.uid].error
    assert "injected failure" in error and c.uid in error
    assert set(state.prepared_claims()) == {c.uid}
    assert set(mig.node.checkpoint()["claims"]) == {c.uid}
    (inst,) = mig.fake.all()
    assert state.mig_device_for(inst.parent, inst.gi) == H100_1G.format(0)
    assert state.unprepare([c])[c.uid].error == ""
    assert mig.fake.all() == [] and state.prepared_claims() == {}


def test_a_failed_undo_keeps_the_record_until_a_retry_destroys_the_instance(
    mig: MigNode,
) -> None:
    c = mig.claim("c", H100_1G.format(0), H100_1G.format(1))
    other = mig.claim("other", H100_1G.format(0))
    state = mig.start()
    mig.fake.arm(CREATE_BEFORE, "fail", skip=1)  # the second create fails ...
    mig.fake.arm(DESTROY_BEFORE_GI, "fail")  # ... and so does destroying the first
    assert "injected failure" in state.prepare([c])[c.uid].error
    (left,) = mig.fake.all()
    rec = state.prepared_claims()[c.uid]
    assert rec.state == STATE_STARTED
    assert rec.devices[0].mig_gpu_instance == left.gi, "recorded for the retry"
    assert mig.node.checkpoint()["claims"][c.uid]["devices"][0]["migGpuInstance"] == left.gi
    assert "overlaps" in state.prepare([other])[other.uid].error, "the slice is still in use"
    prepare_ok(state, c)  # kubelet's retry destroys the leftover, then prepares
    assert len(mig.fake.all()) == 2
    mig.check(state)


def test_the_node_wide_lock_is_never_held_across_a_partitioner_call(mig: MigNode) -> None:
    c = mig.claim("c", H100_1G.format(0), A100_1G.format(2))
    stale = mig.claim("stale", H100_1G.format(4))
    state = mig.start()
    mig.fake.arm(CREATE_AFTER, "crash")
    with pytest.raises(Crash):
        state.prepare([stale])
    calls: list[bool] = []

    def free() -> None:
        # Single-threaded: a lock this thread cannot take is one it holds.
        taken = state._mu.acquire(blocking=False)
        if taken:
            state._mu.release()
        calls.append(taken)

    mig.fake.hook = free
    state = mig.start()
    prepare_ok(state, c, stale)
    assert state.unprepare([c, stale])[c.uid].error == ""
    assert len(calls) >= 8 and all(calls)


def test_claims_on_one_gpu_are_prepared_concurrently(node: Node) -> None:
    claims = FakeClaims(barrier=threading.Barrier(4))
    mig = MigNode(node, claims=claims)
    refs = [mig.claim(f"c{i}", H100_1G.format(i)) for i in range(4)]
    state = mig.start()
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda r: state.prepare([r])[r.uid].error, refs))
    assert outcomes == [""] * 4
    assert instances_of(mig.fake) == [("1g.10gb", i, 1) for i in range(4)]
    mig.check(state)


# --- foreign instances ------------------------------------------------------------------------


def test_foreign_instances_are_left_alone_and_hide_the_placements_they_overlap(
    mig: MigNode,
) -> None:
    mig.add_foreign(0, "3g.40gb", 4)
    mig.add_foreign(1, "1g.5gb", 0)
    state = mig.start()
    hidden = state.hidden_devices()
    assert H100_1G.format(4) in hidden and H100_1G.format(6) in hidden
    assert H100_1G.format(3) not in hidden and "gpu-0-mig-7g-80gb-0" in hidden
    assert A100_1G.format(0) in hidden and A100_1G.format(1) not in hidden
    c = mig.claim("c", H100_3G.format(0))
    prepare_ok(state, c)
    assert state.unprepare([c])[c.uid].error == ""
    state = mig.start()
    mig.check(state)
    assert len(mig.fake.all()) == 2


def test_a_foreign_media_extension_instance_hides_every_other_media_extension_placement(
    mig: MigNode,
) -> None:
    # The profile allows one instance: the others cannot be created, though they overlap nothing.
    mig.add_foreign(0, "1g.10gb+me", 6)
    hidden = mig.start().hidden_devices()
    me = {f"gpu-0-mig-1g-10gb-me-{start}" for start in range(7)}
    assert me <= hidden
    assert H100_1G.format(5) not in hidden and H100_1G.format(6) in hidden


def test_hidden_devices_are_empty_without_instances(mig: MigNode) -> None:
    assert mig.start().hidden_devices() == frozenset()


# --- restart after a crash --------------------------------------------------------------------


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_a_crash_during_create_then_restart_and_retry(mig: MigNode, point: str) -> None:
    foreign = mig.add_foreign(0, "1g.10gb", 6)
    keep = mig.claim("keep", H100_2G.format(0))
    c = mig.claim("c", H100_1G.format(2), H100_1G.format(3))
    state = mig.start()
    prepare_ok(state, keep)
    mig.fake.arm(point, "crash", skip=1)  # during the second device's create
    with pytest.raises(Crash):
        state.prepare([c])
    state = mig.start()
    mig.check(state)
    assert set(state.prepared_claims()) == {keep.uid}
    prepare_ok(state, c)  # kubelet's retry
    mig.check(state)
    assert len(mig.fake.all()) == 4 and (foreign.parent, foreign.gi) in mig.foreign


@pytest.mark.parametrize("point", DESTROY_POINTS)
def test_a_crash_during_unprepare_then_restart_and_retry(mig: MigNode, point: str) -> None:
    mig.add_foreign(1, "2g.10gb", 4)
    keep = mig.claim("keep", A100_1G.format(0))
    c = mig.claim("c", H100_3G.format(0), A100_1G.format(2))
    state = mig.start()
    prepare_ok(state, keep, c)
    mig.fake.arm(point, "crash", skip=1)  # during the second device's destroy
    with pytest.raises(Crash):
        state.unprepare([c])
    state = mig.start()
    mig.check(state)
    assert set(state.prepared_claims()) == {keep.uid}
    assert state.unprepare([c])[c.uid].error == ""  # kubelet's retry
    mig.check(state)
    assert instances_of(mig.fake) == [("1g.5gb", 0, 1), ("2g.10gb", 4, 2)]


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_a_crash_during_create_then_restart_and_unprepare(mig: MigNode, point: str) -> None:
    c = mig.claim("c", H100_1G.format(2))
    state = mig.start()
    mig.fake.arm(point, "crash")
    with pytest.raises(Crash):
        state.prepare([c])
    state = mig.start()
    assert state.unprepare([c])[c.uid].error == ""  # the pod went away meanwhile
    mig.check(state)
    assert mig.fake.all() == []


def test_a_prepared_claim_whose_instance_vanished_is_prepared_again(mig: MigNode) -> None:
    c = mig.claim("c", H100_1G.format(2))
    state = mig.start()
    prepare_ok(state, c)
    (inst,) = mig.fake.all()
    del mig.fake.instances_by_gpu[inst.parent][inst.gi]  # someone destroyed it
    state = mig.start()
    assert state.prepared_claims() == {} and mig.node.spec_files() == []
    prepare_ok(state, c)
    mig.check(state)
    assert len(mig.fake.all()) == 1


def test_a_gpu_instance_id_reused_elsewhere_is_not_taken_for_the_claims(mig: MigNode) -> None:
    c = mig.claim("c", H100_1G.format(2))
    state = mig.start()
    prepare_ok(state, c)
    (inst,) = mig.fake.all()
    del mig.fake.instances_by_gpu[inst.parent][inst.gi]
    other = mig.add_foreign(0, "1g.10gb", 5)  # gets the same GPU instance id
    assert other.gi == inst.gi
    state = mig.start()
    assert state.prepared_claims() == {}
    mig.check(state)
    assert H100_1G.format(5) in state.hidden_devices()


def test_an_instance_someone_else_made_at_the_claims_placement_is_never_destroyed(
    mig: MigNode,
) -> None:
    c = mig.claim("c", H100_1G.format(2))
    state = mig.start()
    prepare_ok(state, c)
    (inst,) = mig.fake.all()
    del mig.fake.instances_by_gpu[inst.parent][inst.gi]  # ours went
    other = mig.add_foreign(0, "1g.10gb", 2)  # same placement, same profile, same id
    assert (other.gi, other.placement) == (inst.gi, inst.placement) and other.uuid != inst.uuid
    assert state.unprepare([c])[c.uid].error == ""
    assert mig.fake.all() == [other] and mig.fake.destroys == 0
    # the same at a restart: the record's instance is gone, the other one stays
    prepare_ok(state, mig.claim("d", H100_1G.format(3)))
    (mine,) = [i for i in mig.fake.all() if i is not other]
    del mig.fake.instances_by_gpu[mine.parent][mine.gi]
    again = mig.add_foreign(0, "1g.10gb", 3)
    state = mig.start()
    assert state.prepared_claims() == {}
    assert sorted(i.uuid for i in mig.fake.all()) == sorted([other.uuid, again.uuid])
    mig.check(state)


def test_a_spec_file_lost_after_prepare_is_restored_with_its_instance_kept(
    mig: MigNode,
) -> None:
    c = mig.claim("c", H100_1G.format(2))
    state = mig.start()
    prepare_ok(state, c)
    instances = mig.fake.all()
    written = {path: path.read_bytes() for path in mig.node.spec_files()}
    assert len(written) == 1
    for path in written:
        path.unlink()
    state = mig.start()
    # The MIG device's spec (its MIG UUID and capability nodes) comes back as prepare wrote it.
    assert {path: path.read_bytes() for path in mig.node.spec_files()} == written
    assert mig.fake.all() == instances and len(state.prepared_claims()) == 1
    prepare_ok(state, c)
    mig.check(state)


def test_a_corrupt_checkpoint_adopts_the_instances_named_in_the_spec_files(
    mig: MigNode,
) -> None:
    c = mig.claim("c", H100_1G.format(2), A100_1G.format(1))
    state = mig.start()
    first = state.prepare([c])
    before = {(i.parent, i.gi) for i in mig.fake.all()}
    state.close()
    (mig.node.data_dir / "checkpoint.dat").write_bytes(b"garbage")
    state = mig.start()
    mig.check(state)
    assert {(i.parent, i.gi) for i in mig.fake.all()} == before
    rec = state.prepared_claims()[c.uid]
    assert rec.devices == first[c.uid].devices
    assert state.unprepare([c])[c.uid].error == ""
    assert mig.fake.all() == []


def test_instances_of_a_gpu_that_cannot_be_listed_stay_and_its_placements_are_hidden(
    mig: MigNode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from kubeletplugin.devices.migpartition import MigError

    keep = mig.claim("keep", H100_1G.format(2))
    interrupted = mig.claim("interrupted", H100_1G.format(4))
    state = mig.start()
    prepare_ok(state, keep)
    mig.fake.arm(CREATE_AFTER, "crash")
    with pytest.raises(Crash):
        state.prepare([interrupted])
    real = mig.fake.instances
    h100 = mig.devices.gpus[0].uuid

    def broken(parent: Any) -> Any:
        if parent.uuid == h100:
            raise MigError("NVML says no")
        return real(parent)

    monkeypatch.setattr(mig.fake, "instances", broken)
    with caplog.at_level(logging.ERROR):
        state = mig.start()
    assert "cannot list the MIG instances of GPU" in caplog.text
    claims = state.prepared_claims()
    assert claims[keep.uid].state == STATE_COMPLETED, "kept as recorded"
    assert claims[interrupted.uid].state == STATE_STARTED, "kept for a retry"
    assert all(d.startswith("gpu-0-mig-") for d in state.hidden_devices())
    assert len([d for d in mig.devices if d.dynamic_mig and d.gpu.uuid == h100]) == len(
        state.hidden_devices()
    )
    monkeypatch.setattr(mig.fake, "instances", real)
    # kubelet's retry of the interrupted claim destroys the leftover and prepares it.
    prepare_ok(state, interrupted)
    assert len(mig.fake.all()) == 2
    state = mig.start()
    mig.check(state)


def test_start_without_a_partitioner_for_a_dynamic_table_is_refused(mig: MigNode) -> None:
    with pytest.raises(ValueError, match="no MIG partitioner"):
        DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=mig.devices,
            claims=mig.claims,
            cdi=CdiSpecWriter(mig.node.cdi_dir, DRIVER),
            checkpoint=Checkpoint(mig.node.data_dir, boot_id_file=mig.node.boot_id_file),
        )


# --- enforcement ------------------------------------------------------------------------------


def test_a_dynamic_mig_device_is_enforced_like_a_static_one(
    mig: MigNode, caplog: pytest.LogCaptureFixture
) -> None:
    mig.tools = Tools.new()
    plain = mig.claim("plain", H100_1G.format(0))
    mps = mig.claim("mps", H100_1G.format(1), configs=[gpu_config({"strategy": "MPS"})])
    state = mig.start()
    outcomes = state.prepare([plain, mps])
    assert outcomes[plain.uid].error == ""
    assert "supports only strategy Exclusive, not MPS" in outcomes[mps.uid].error
    assert mig.tools.fake.argvs() == [], "no compute mode, no daemon, nothing on the parent"
    (inst,) = mig.fake.all()
    enforcer = mig.tools.enforcer(mig.node.data_dir)
    mig.tools = None
    with caplog.at_level(logging.WARNING):
        state = DeviceState(
            driver_name=DRIVER,
            node_name=NODE,
            devices=mig.devices,
            claims=mig.claims,
            cdi=CdiSpecWriter(mig.node.cdi_dir, DRIVER),
            checkpoint=Checkpoint(mig.node.data_dir, boot_id_file=mig.node.boot_id_file),
            enforcer=enforcer,
            partitioner=mig.fake,
        )
        state.start()
    assert "cannot be decoded" not in caplog.text
    (held,) = enforcer.held()[plain.uid]
    assert held.gpu.uuid == inst.uuid, "restored on the MIG device, not its parent"
    assert held.enforced.strategy == "Exclusive"


# --- the checkpoint ---------------------------------------------------------------------------


def _device_json(**extra: Any) -> dict[str, Any]:
    return {
        "requests": ["r"],
        "pool": NODE,
        "device": H100_1G.format(0),
        "gpuUUID": "GPU-1",
        "cores": 100,
        "memory": 1,
        "cdiName": "x",
        "cdiDeviceIds": ["k8s.x/claim=x"],
        **extra,
    }


def test_device_records_carry_the_instance_only_when_set() -> None:
    plain = device_from_json(_device_json(), "d")
    assert (plain.mig_gpu_instance, plain.mig_compute_instance, plain.mig_uuid) == (None,) * 3
    assert "migGpuInstance" not in device_to_json(plain)
    assert "migUUID" not in device_to_json(plain)
    full = device_from_json(
        _device_json(migGpuInstance=3, migComputeInstance=0, migUUID="MIG-abc"), "d"
    )
    assert (full.mig_gpu_instance, full.mig_compute_instance, full.mig_uuid) == (3, 0, "MIG-abc")
    assert device_from_json(device_to_json(full), "d") == full
    assert full.extra == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"migGpuInstance": "3"}, "d.migGpuInstance must be an integer"),
        ({"migGpuInstance": True}, "d.migGpuInstance must be an integer"),
        ({"migGpuInstance": -1}, "d.migGpuInstance -1 is outside 0..9999"),
        ({"migGpuInstance": 1, "migComputeInstance": 10000}, "d.migComputeInstance 10000 is"),
        ({"migComputeInstance": 0}, "d.migComputeInstance is set without migGpuInstance"),
        ({"migUUID": 7}, "d.migUUID must be a string"),
        ({"migUUID": "MIG-x,GPU-y"}, "d.migUUID 'MIG-x,GPU-y' is not a MIG UUID"),
        ({"migUUID": ""}, "is not a MIG UUID"),
    ],
)
def test_bad_instance_fields_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
        device_from_json(_device_json(**fields), "d")


def test_instance_fields_on_a_device_that_is_not_dynamic_roll_the_claim_back(
    node: Node, mig: MigNode
) -> None:
    c = mig.claim("c", "gpu-2")
    state = mig.start()
    prepare_ok(state, c)
    state.close()
    doc = mig.node.checkpoint()
    doc["claims"][c.uid]["devices"][0]["migGpuInstance"] = 1
    mig.node.write_checkpoint(doc)
    state = mig.start()
    assert state.prepared_claims() == {}


def test_a_recorded_strategy_other_than_exclusive_on_a_mig_device_rolls_the_claim_back(
    mig: MigNode, caplog: pytest.LogCaptureFixture
) -> None:
    mig.tools = Tools.new()
    c = mig.claim("c", H100_1G.format(0))
    state = mig.start()
    prepare_ok(state, c)
    state.close()
    doc = mig.node.checkpoint()
    (device,) = doc["claims"][c.uid]["devices"]
    assert device["enforcement"]["strategy"] == "Exclusive"
    device["enforcement"]["strategy"] = "MPS"
    mig.node.write_checkpoint(doc)
    with caplog.at_level(logging.WARNING):
        state = mig.start()
    assert state.prepared_claims() == {}
    assert "enforcement.strategy MPS: MIG device" in caplog.text
    assert mig.tools.sim.daemons == {}


# --- randomized crashes -----------------------------------------------------------------------

SEED = 4815
STEPS = 300


def test_random_prepares_unprepares_crashes_and_restarts_keep_the_invariants(
    mig: MigNode,
) -> None:
    """Claims of one or two random placement devices are prepared and unprepared in random
    order; a random share of calls crashes at a random point (or fails), after which the node
    restarts and kubelet retries the call. The invariants hold after every start and every
    call that returned."""
    rng = random.Random(SEED)
    dynamic = [d.name for d in mig.devices if d.dynamic_mig]
    small = [d.name for d in mig.devices if d.mig_profile and d.mig_profile.slice_count == 1]
    mig.add_foreign(0, "1g.10gb", 6)
    mig.add_foreign(1, "1g.5gb", 0)
    refs = [
        mig.claim(f"c{i}", *rng.sample(rng.choice((small, small, dynamic)), rng.choice((1, 2))))
        for i in range(14)
    ]
    successes = 0
    #: What kubelet believes: the claims whose prepare succeeded and were not unprepared.
    prepared: set[str] = set()
    state = mig.start()
    mig.check(state)
    crashes = 0
    for _ in range(STEPS):
        c = rng.choice(refs)
        op = "unprepare" if c.uid in prepared or rng.random() < 0.2 else "prepare"
        roll = rng.random()
        if roll < 0.35:
            points = CREATE_POINTS if op == "prepare" else DESTROY_POINTS
            mig.fake.arm(rng.choice(points), rng.choice(("crash", "crash", "fail")))
        elif roll < 0.4:
            state.close()
            state = mig.start()
            mig.check(state)
        while True:
            try:
                if op == "prepare":
                    error = state.prepare([c])[c.uid].error
                    if error == "":
                        prepared.add(c.uid)
                        successes += 1
                    else:
                        assert c.uid not in state.prepared_claims() or (
                            state.prepared_claims()[c.uid].state == STATE_STARTED
                        )
                else:
                    error = state.unprepare([c])[c.uid].error
                    if error == "":
                        prepared.discard(c.uid)
                break
            except Crash:
                crashes += 1
                state = mig.start()
                mig.check(state)
                # kubelet retries the call that got no answer
        mig.fake.disarm()
        if op == "unprepare" and error:
            assert "injected failure" in error
            # kubelet retries an unprepare until it succeeds.
            assert state.unprepare([c])[c.uid].error == ""
            prepared.discard(c.uid)
        if any(r.state == STATE_STARTED for r in state.prepared_claims().values()):
            continue  # a failed destroy is kept for kubelet's retry
        mig.check(state)
        completed = {
            uid for uid, r in state.prepared_claims().items() if r.state == STATE_COMPLETED
        }
        assert completed == prepared
    assert crashes >= 10, f"only {crashes} crashes: the seed exercises too little"
    assert successes >= 20, f"only {successes} prepares succeeded: the seed exercises too little"
    for c in refs:
        state.unprepare([c])
    state = mig.start()
    mig.check(state)
    assert sorted((i.parent, i.gi) for i in mig.fake.all()) == sorted(mig.foreign)


def test_spec_envs_helper_reads_every_claim(mig: MigNode) -> None:
    c = mig.claim("c", H100_1G.format(0))
    prepare_ok(mig.start(), c)
    (path,) = mig.node.spec_files()
    assert spec_envs_of([path])[c.uid][0]["SHAREGPU_DEVICE"] == H100_1G.format(0)
    assert json.loads(path.read_text())["kind"].endswith("/claim")
