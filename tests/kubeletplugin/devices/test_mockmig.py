"""The mock MIG partitioner: the hardware rule, durable two-step create/destroy, hostile files."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeletplugin import fsutil
from kubeletplugin.devices import migtables
from kubeletplugin.devices.migpartition import MigError, MigPartitioner
from kubeletplugin.devices.mock import MIB, default_gpu, gpu_from_entry
from kubeletplugin.devices.mockmig import (
    MAX_FILE_BYTES,
    MockMigPartitioner,
    mock_dynamic_mig_uuid,
)
from kubeletplugin.model import GpuInfo, MigPlacement, MigProfile

NODE = "node-a"
H100 = default_gpu(NODE, 0, 2, mig_enabled=True)
H100_B = default_gpu(NODE, 1, 2, mig_enabled=True)
A100 = gpu_from_entry(
    NODE,
    0,
    1,
    {
        "productName": migtables.A100_40GB_PRODUCT,
        "memoryTotal": "40Gi",
        "memoryReserved": "512Mi",
        "migMode": "Enabled",
    },
)


class Killed(BaseException):
    """A kill -9 between two durable steps: nothing after it runs."""


def partitioner(tmp_path: Path) -> MockMigPartitioner:
    return MockMigPartitioner(tmp_path / "state" / "mig.json", NODE)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


def profile(gpu: GpuInfo, name: str) -> MigProfile:
    return next(p for p in gpu.mig_profiles if p.name == name)


def layout(part: MockMigPartitioner, gpu: GpuInfo) -> list[tuple[int, int, str, int, int]]:
    """(GI, CI, profile, start, size) of every instance."""
    result = []
    for device in part.instances(gpu):
        mig = device.mig
        assert mig is not None and mig.placement is not None
        result.append(
            (
                mig.gpu_instance,
                mig.compute_instance,
                mig.profile,
                mig.placement.start,
                mig.placement.size,
            )
        )
    return result


def test_is_a_mig_partitioner(tmp_path: Path) -> None:
    part: MigPartitioner = partitioner(tmp_path)
    assert part.instances(H100) == ()


@pytest.mark.parametrize(
    ("gpu", "prof", "placement"),
    [
        pytest.param(gpu, p, pl, id=f"{gpu.product_name}-{p.name}-{pl.start}")
        for gpu in (H100, A100)
        for p in gpu.mig_profiles
        for pl in p.placements
    ],
)
def test_create_at_every_placement_of_every_profile(
    state_dir: Path, gpu: GpuInfo, prof: MigProfile, placement: MigPlacement
) -> None:
    part = partitioner(state_dir.parent)
    device = part.create(gpu, prof, placement)
    mig = device.mig
    assert mig is not None
    assert (mig.parent_uuid, mig.gpu_instance, mig.compute_instance) == (gpu.uuid, 1, 0)
    assert (mig.profile, mig.profile_id, mig.placement) == (prof.name, prof.profile_id, placement)
    assert (mig.gpu_slices, mig.compute_slices) == (prof.slice_count, prof.slice_count)
    assert mig.multiprocessors == prof.multiprocessors
    assert device.uuid == mock_dynamic_mig_uuid(NODE, gpu.uuid, 1, 1)
    assert device.uuid.startswith("MIG-")
    assert device.memory_total == device.memory_usable == prof.memory_mb * MIB
    assert device.memory_reserved == 0
    for same in ("index", "minor", "pci_bus_id", "product_name", "driver_version", "numa_node"):
        assert getattr(device, same) == getattr(gpu, same)
    assert (device.mig_mode, device.mig_devices, device.mig_profiles) == (None, (), ())
    assert part.instances(gpu) == (device,)
    assert part.destroy(gpu, 1) is True
    assert part.instances(gpu) == ()


def test_every_profile_and_placement_of_an_empty_gpu_is_placeable() -> None:
    """The parametrised test above covers each profile's whole placement list."""
    for gpu in (H100, A100):
        assert gpu.mig_profiles
        assert sum(len(p.placements) for p in gpu.mig_profiles) >= 20


@pytest.mark.parametrize(
    ("steps", "refused", "message"),
    [
        ([("1g.10gb", 0)], ("1g.10gb", 0), "placement 0:1 overlaps the 1g.10gb instance at 0:1"),
        ([("3g.40gb", 4)], ("1g.10gb", 5), "placement 5:1 overlaps the 3g.40gb instance at 4:4"),
        ([("7g.80gb", 0)], ("1g.10gb", 6), "overlaps the 7g.80gb instance at 0:8"),
        (
            [("1g.10gb+me", 0)],
            ("1g.10gb+me", 1),
            r"profile 1g.10gb\+me allows 1 instances; 1 exist",
        ),
        (
            [("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)],
            ("1g.10gb", 1),
            "overlaps the 1g.20gb instance at 0:2",
        ),
    ],
)
def test_placement_rule_refuses_with_its_message(
    state_dir: Path,
    steps: list[tuple[str, int]],
    refused: tuple[str, int],
    message: str,
) -> None:
    part = partitioner(state_dir.parent)
    for name, start in steps:
        prof = profile(H100, name)
        part.create(H100, prof, next(p for p in prof.placements if p.start == start))
    before = layout(part, H100)
    prof = profile(H100, refused[0])
    place = next(p for p in prof.placements if p.start == refused[1])
    with pytest.raises(MigError, match=f"GPU {H100.uuid}: cannot create a .*{message}") as info:
        part.create(H100, prof, place)
    assert "\n" not in str(info.value)
    assert layout(part, H100) == before


def test_placement_not_of_the_profile_is_refused(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    with pytest.raises(MigError, match=r"placement 1:4 is not a placement of profile 3g.40gb"):
        part.create(H100, profile(H100, "3g.40gb"), MigPlacement(1, 4))
    assert part.instances(H100) == ()


def test_compute_slices_rule_is_enforced(state_dir: Path) -> None:
    """A table where memory fits but compute slices do not (the real tables never get there)."""
    wide = dataclasses.replace(
        profile(H100, "4g.40gb"),
        profile_id=90,
        name="4g.10gb",
        instance_count=2,
        placements=(MigPlacement(0, 1), MigPlacement(1, 1)),
    )
    gpu = dataclasses.replace(H100, mig_profiles=(wide,))
    part = partitioner(state_dir.parent)
    part.create(gpu, wide, MigPlacement(0, 1))
    with pytest.raises(
        MigError, match=r"4 of 4 compute slices are in use; profile 4g.10gb needs 4"
    ):
        part.create(gpu, wide, MigPlacement(1, 1))


def test_profile_not_of_the_gpu_is_refused(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    with pytest.raises(MigError, match=r"MIG profile 1g.5gb .* is not one of its profiles"):
        part.create(H100, profile(A100, "1g.5gb"), MigPlacement(0, 1))


def test_gpu_without_profiles_is_refused(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    disabled = default_gpu(NODE, 0, 1)
    with pytest.raises(MigError, match=f"GPU {disabled.uuid} has no MIG profiles"):
        part.instances(disabled)
    with pytest.raises(MigError, match="has no MIG profiles"):
        part.create(disabled, profile(H100, "1g.10gb"), MigPlacement(0, 1))


def test_mig_device_as_parent_is_refused(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    device = part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    with pytest.raises(MigError, match="is a MIG device, not a GPU"):
        part.instances(dataclasses.replace(device, mig_profiles=H100.mig_profiles))


def test_instances_survive_a_restart_and_ids_are_reused_with_new_uuids(state_dir: Path) -> None:
    first = partitioner(state_dir.parent)
    small = profile(H100, "1g.10gb")
    made = [first.create(H100, small, MigPlacement(s, 1)) for s in (0, 1, 2)]
    other = first.create(H100_B, profile(H100, "3g.40gb"), MigPlacement(4, 4))
    restarted = partitioner(state_dir.parent)
    assert restarted.instances(H100) == tuple(made)
    assert restarted.instances(H100_B) == (other,)
    assert restarted.destroy(H100, 2) is True
    again = restarted.create(H100, small, MigPlacement(5, 1))
    assert again.mig is not None and again.mig.gpu_instance == 2, "smallest unused id"
    assert again.uuid not in {d.uuid for d in made}, "a recreated instance gets a new UUID"
    assert [d.mig.gpu_instance for d in restarted.instances(H100) if d.mig] == [1, 2, 3]
    assert MockMigPartitioner(state_dir / "mig.json", "node-b").instances(H100)[0].uuid != (
        made[0].uuid
    ), "UUIDs differ between nodes"


def test_destroy_is_idempotent_and_per_gpu(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    assert part.destroy(H100_B, 1) is False
    assert part.destroy(H100, 1) is True
    assert part.destroy(H100, 1) is False
    assert part.destroy(H100, 7) is False
    assert part.instances(H100) == ()


def test_foreign_instances_are_listed_and_block_placements(state_dir: Path) -> None:
    mine = partitioner(state_dir.parent)
    someone_else = MockMigPartitioner(state_dir / "mig.json", NODE)
    foreign = someone_else.create(H100, profile(H100, "4g.40gb"), MigPlacement(0, 4))
    assert mine.instances(H100) == (foreign,)
    with pytest.raises(MigError, match=r"overlaps the 4g.40gb instance at 0:4"):
        mine.create(H100, profile(H100, "1g.10gb"), MigPlacement(2, 1))
    made = mine.create(H100, profile(H100, "3g.40gb"), MigPlacement(4, 4))
    assert made.mig is not None and made.mig.gpu_instance == 2


def failing_writes(
    monkeypatch: pytest.MonkeyPatch, fail_on: set[int], error: Callable[[], BaseException]
) -> list[int]:
    """Make write number ``n`` (1-based) in ``fail_on`` raise ``error()``; returns the count."""
    calls: list[int] = []
    real = fsutil.atomic_write

    def write(path: Path, data: bytes, mode: int = 0o644) -> None:
        calls.append(1)
        if len(calls) in fail_on:
            raise error()
        real(path, data, mode)

    monkeypatch.setattr(fsutil, "atomic_write", write)
    return calls


def test_kill_between_gpu_and_compute_instance_leaves_a_bare_gpu_instance(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = partitioner(state_dir.parent)
    failing_writes(monkeypatch, {2}, Killed)
    with pytest.raises(Killed):
        part.create(H100, profile(H100, "2g.20gb"), MigPlacement(2, 2))
    monkeypatch.undo()
    restarted = partitioner(state_dir.parent)
    (bare,) = restarted.instances(H100)
    assert bare.uuid == ""
    assert bare.mig is not None
    assert (bare.mig.gpu_instance, bare.mig.compute_instance) == (1, -1)
    assert (bare.mig.profile, bare.mig.placement) == ("2g.20gb", MigPlacement(2, 2))
    with pytest.raises(MigError, match=r"overlaps the 2g.20gb instance at 2:2"):
        restarted.create(H100, profile(H100, "1g.10gb"), MigPlacement(3, 1))
    assert restarted.destroy(H100, 1) is True
    assert restarted.instances(H100) == ()


def test_kill_between_the_destroy_steps_leaves_a_bare_gpu_instance(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = partitioner(state_dir.parent)
    part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    failing_writes(monkeypatch, {2}, Killed)
    with pytest.raises(Killed):
        part.destroy(H100, 1)
    monkeypatch.undo()
    restarted = partitioner(state_dir.parent)
    assert layout(restarted, H100) == [(1, -1, "1g.10gb", 0, 1)]
    assert restarted.destroy(H100, 1) is True
    assert restarted.destroy(H100, 1) is False


def test_failed_compute_instance_step_destroys_the_gpu_instance(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = partitioner(state_dir.parent)
    failing_writes(monkeypatch, {2}, lambda: OSError(28, "No space left on device"))
    with pytest.raises(MigError, match=r"compute instance of GPU instance 1: .*No space left"):
        part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    assert part.instances(H100) == ()


def test_failed_undo_says_what_is_left(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = partitioner(state_dir.parent)
    failing_writes(monkeypatch, {2, 3}, lambda: OSError(5, "Input/output error"))
    with pytest.raises(MigError, match="GPU instance 1 is left without a compute instance"):
        part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    monkeypatch.undo()
    assert layout(part, H100) == [(1, -1, "1g.10gb", 0, 1)]


def test_failed_first_write_leaves_nothing(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = partitioner(state_dir.parent)
    failing_writes(monkeypatch, {1}, lambda: OSError(13, "Permission denied"))
    with pytest.raises(MigError, match=r"creating GPU instance 1 on GPU .*Permission denied"):
        part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    monkeypatch.undo()
    assert part.instances(H100) == ()


def test_concurrent_creates_never_overlap(state_dir: Path) -> None:
    """14 threads on two partitioners of one file (two processes' worth of locks) race for the
    7 one-slice placements, two threads each: exactly one of each pair wins."""
    parts = [partitioner(state_dir.parent), partitioner(state_dir.parent)]
    small = profile(H100, "1g.10gb")
    barrier = threading.Barrier(14)
    won: list[GpuInfo] = []
    lost: list[str] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            won.append(parts[i % 2].create(H100, small, MigPlacement(i // 2, 1)))
        except MigError as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(14)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 7 and len(lost) == 7
    assert all("overlaps the 1g.10gb instance" in m for m in lost)
    listed = layout(parts[0], H100)
    assert sorted(gi for gi, *_ in listed) == list(range(1, 8))
    assert sorted(start for *_, start, _ in listed) == list(range(7))
    assert {d.uuid for d in won} == {d.uuid for d in parts[1].instances(H100)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 30), st.integers(0, 7), st.integers(1, 8)),
        max_size=25,
    )
)
def test_partitioner_agrees_with_the_placement_rule(
    ops: list[tuple[bool, int, int, int]],
) -> None:
    """Any sequence of creates (any profile, any start) and destroys: the partitioner accepts
    exactly what placement_problem accepts against a model of the instances, and lists the
    model."""
    profiles = H100.mig_profiles
    with tempfile.TemporaryDirectory() as tmp:
        part = MockMigPartitioner(Path(tmp) / "mig.json", NODE)
        model: dict[int, tuple[int, MigPlacement]] = {}
        for is_create, which, start, gi in ops:
            if not is_create:
                assert part.destroy(H100, gi) is (gi in model)
                model.pop(gi, None)
                continue
            prof = profiles[which % len(profiles)]
            place = MigPlacement(start, prof.placements[0].size)
            problem = migtables.placement_problem(
                profiles, list(model.values()), prof.profile_id, place
            )
            if problem is None:
                device = part.create(H100, prof, place)
                assert device.mig is not None
                expected_gi = min(set(range(1, 9)) - set(model))
                assert device.mig.gpu_instance == expected_gi
                model[expected_gi] = (prof.profile_id, place)
            else:
                with pytest.raises(MigError) as info:
                    part.create(H100, prof, place)
                assert problem in str(info.value)
        listed = {
            d.mig.gpu_instance: (d.mig.profile_id, d.mig.placement)
            for d in part.instances(H100)
            if d.mig is not None
        }
        assert listed == model


# -- hostile files ----------------------------------------------------------------------------


BASE_INSTANCE: dict[str, Any] = {
    "gpuInstance": 1,
    "computeInstance": 0,
    "profileId": 19,
    "start": 0,
    "size": 1,
    "serial": 1,
}


def doc(*instances: dict[str, Any], serial: int = 9) -> bytes:
    """A state file of H100 whose instances are BASE_INSTANCE with each override applied."""
    listed = [BASE_INSTANCE | override for override in instances]
    return json.dumps({"version": 1, "serial": serial, "gpus": {H100.uuid: listed}}).encode()


GPU_PATH = re.escape(f"gpus[{H100.uuid}]")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"{not json", "Expecting property name", id="bad-json"),
        pytest.param(b"\xff\xfe", "codec can't decode", id="not-utf8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "RecursionError|recursion|nest", id="deep"),
        pytest.param(b"[]", "must hold a JSON object, got list", id="list"),
        pytest.param(b'{"version": 2, "serial": 0, "gpus": {}}', "version: must be 1", id="v2"),
        pytest.param(
            b'{"version": 1, "serial": "x", "gpus": {}}',
            "serial: must be an integer",
            id="serial-str",
        ),
        pytest.param(
            b'{"version": 1, "serial": NaN, "gpus": {}}', "NaN is not a JSON number", id="nan"
        ),
        pytest.param(
            b'{"version": 1, "serial": 0, "gpus": []}', "gpus: must be an object", id="gpus-list"
        ),
        pytest.param(
            b'{"version": 1, "serial": 0, "gpus": {}, "x": 1}', "unknown field 'x'", id="extra"
        ),
        pytest.param(
            b'{"version": 1, "version": 1, "serial": 0, "gpus": {}}',
            "'version' is given twice",
            id="dup-key",
        ),
        pytest.param(
            json.dumps({"version": 1, "serial": 0, "gpus": {"../../etc": [{}]}}).encode(),
            "key '../../etc' is not a GPU UUID",
            id="bad-key",
        ),
        pytest.param(
            doc({"gpuInstance": "1"}),
            rf"{GPU_PATH}\[0\].gpuInstance: must be an integer from 1 to 64, got '1'",
            id="gi-str",
        ),
        pytest.param(doc({"gpuInstance": True}), r"\[0\].gpuInstance: must be", id="gi-bool"),
        pytest.param(doc({"gpuInstance": 0}), "gpuInstance: must be", id="gi-0"),
        pytest.param(doc({"computeInstance": -1}), "computeInstance: must be", id="ci"),
        pytest.param(doc({"start": 10**30}), "start: must be", id="start"),
        pytest.param(doc({"size": 0}), "size: must be", id="size"),
        pytest.param(doc({"serial": 6}, serial=5), "above the file's serial 5", id="serial"),
        pytest.param(doc({"colour": 1}), "unknown field 'colour'", id="field"),
        pytest.param(
            json.dumps(
                {"version": 1, "serial": 1, "gpus": {H100.uuid: [{"gpuInstance": 1}]}}
            ).encode(),
            r"\[0\].computeInstance: is required",
            id="missing",
        ),
        pytest.param(doc({}).replace(b"[{", b"[7, {"), r"\[0\]: must be an object", id="inst-int"),
        pytest.param(
            doc({}, {"start": 1, "serial": 2}), "gpuInstance: 1 is used twice", id="dup-gi"
        ),
        pytest.param(
            doc({}, {"gpuInstance": 2, "start": 1}), "serial: 1 is used twice", id="dup-serial"
        ),
        pytest.param(
            doc({}, {"gpuInstance": 2, "serial": 2}),
            r"\[1\]: placement 0:1 overlaps GPU instance 1 at 0:1",
            id="overlap",
        ),
        pytest.param(
            doc(*({"gpuInstance": i + 1, "serial": i + 1, "start": i} for i in range(9))),
            "must be a list of 1 to 8 instances",
            id="too-many",
        ),
        pytest.param(
            doc({"profileId": 999}),
            "GPU instance profile 999 is not one of this GPU's",
            id="unknown-profile",
        ),
        pytest.param(
            doc({"profileId": 9, "start": 1, "size": 4}),
            "placement 1:4 is not a placement of profile 3g.40gb",
            id="bad-placement",
        ),
        pytest.param(
            doc({"profileId": 20}, {"profileId": 20, "gpuInstance": 2, "serial": 2, "start": 1}),
            r"\[1\] \(GPU instance 2\): profile 1g.10gb\+me allows 1 instances",
            id="instance-count",
        ),
        pytest.param(b" " * (MAX_FILE_BYTES + 1), f"larger than {MAX_FILE_BYTES} bytes", id="huge"),
    ],
)
def test_hostile_file_is_one_clear_error(state_dir: Path, content: bytes, message: str) -> None:
    path = state_dir / "mig.json"
    path.write_bytes(content)
    part = partitioner(state_dir.parent)
    for call in (
        lambda: part.instances(H100),
        lambda: part.create(H100, profile(H100, "1g.10gb"), MigPlacement(6, 1)),
    ):
        with pytest.raises(MigError, match=message) as info:
            call()
        text = str(info.value)
        assert "\n" not in text and len(text) < 1000
        assert text.startswith(f"mock MIG state file {path}") or "cannot" in text
    assert path.read_bytes() == content, "a bad file is never rewritten"


def test_symlinked_state_file_is_refused_and_its_target_untouched(
    state_dir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(doc({}))
    before = elsewhere.read_bytes()
    (state_dir / "mig.json").symlink_to(elsewhere)
    part = partitioner(state_dir.parent)
    with pytest.raises(MigError, match="is a symbolic link"):
        part.instances(H100)
    with pytest.raises(MigError, match="is a symbolic link"):
        part.create(H100, profile(H100, "1g.10gb"), MigPlacement(6, 1))
    with pytest.raises(MigError, match="is a symbolic link"):
        part.destroy(H100, 1)
    assert elsewhere.read_bytes() == before
    assert (state_dir / "mig.json").is_symlink()


def test_symlinked_lock_file_is_refused(state_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    (state_dir / ".mig.json.lock").symlink_to(target)
    with pytest.raises(MigError, match=r"cannot lock .* is a symbolic link"):
        partitioner(state_dir.parent).instances(H100)
    assert not target.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_state_path_that_is_no_file_is_refused(state_dir: Path, kind: str) -> None:
    path = state_dir / "mig.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(MigError, match="not a regular file"):
        partitioner(state_dir.parent).instances(H100)


def test_writes_stay_in_the_directory(state_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    stale = state_dir / ".mig.json.abc123.tmp"
    stale.write_text("half-written")
    part = partitioner(tmp_path)
    part.create(H100, profile(H100, "1g.10gb"), MigPlacement(0, 1))
    part.create(H100_B, profile(H100, "7g.80gb"), MigPlacement(0, 8))
    part.destroy(H100, 1)
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert found == ["outside.txt", "state", "state/.mig.json.lock", "state/mig.json"]
    assert outside.read_text() == "keep"
    assert oct((state_dir / "mig.json").stat().st_mode & 0o777) == "0o600"
    doc = json.loads((state_dir / "mig.json").read_text())
    assert doc["serial"] == 2 and list(doc["gpus"]) == [H100_B.uuid], "empty GPUs are dropped"


def test_missing_file_is_no_instance(state_dir: Path) -> None:
    part = partitioner(state_dir.parent)
    assert part.instances(H100) == ()
    assert part.destroy(H100, 1) is False
    assert not (state_dir / "mig.json").exists()


def test_hand_written_file_is_listed_by_gpu_instance(state_dir: Path) -> None:
    """Instances in any order, one without a compute instance: listed by GPU instance id; the
    next create takes the smallest free id."""
    (state_dir / "mig.json").write_bytes(
        doc(
            {"gpuInstance": 3, "start": 4, "serial": 4},
            {"gpuInstance": 1, "computeInstance": None, "start": 0, "serial": 2},
        )
    )
    part = partitioner(state_dir.parent)
    assert layout(part, H100) == [(1, -1, "1g.10gb", 0, 1), (3, 0, "1g.10gb", 4, 1)]
    made = part.create(H100, profile(H100, "1g.10gb"), MigPlacement(1, 1))
    assert made.mig is not None and made.mig.gpu_instance == 2
    assert made.uuid == mock_dynamic_mig_uuid(NODE, H100.uuid, 2, 10), "serial 9 + 1"
