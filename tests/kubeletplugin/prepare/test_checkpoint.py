"""The checkpoint: corruption, forward compatibility, reboots, interrupted prepares."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.prepare.cdi import CdiSpecWriter, spec_file_prefix
from kubeletplugin.prepare.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_VERSION,
    STATE_STARTED,
    Checkpoint,
    checksum_of,
)
from tests.kubeletplugin.prepare.helpers import (
    DRIVER,
    GI,
    FakeClaims,
    Node,
    RecordingEnforcer,
    assert_valid_cdi,
    claim,
    ref,
    result,
)


def _prepared(node: Node, n: int = 2, **kw: Any) -> tuple[FakeClaims, list[dict[str, Any]]]:
    claims = FakeClaims()
    objs = [
        claim(f"c{i}", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
        for i in range(n)
    ]
    claims.add(*objs)
    outs = node.state(claims, **kw).prepare([ref(o) for o in objs])
    assert all(o.error == "" for o in outs.values())
    return claims, objs


def test_document_shape_and_checksum(node: Node) -> None:
    _, objs = _prepared(node)
    doc = node.checkpoint()
    assert doc["version"] == CHECKPOINT_VERSION
    assert doc["bootID"] == node.boot_id_file.read_text().strip()
    assert doc["checksum"] == checksum_of(doc)
    entry = doc["claims"][objs[0]["metadata"]["uid"]]
    assert entry["state"] == "PrepareCompleted"
    assert (entry["namespace"], entry["name"]) == ("default", "c0")
    (dev,) = entry["devices"]
    assert dev["device"] == "gpu-0" and dev["cores"] == 10 and dev["memory"] == GI
    assert dev["shareID"] == objs[0]["status"]["allocation"]["devices"]["results"][0]["shareID"]
    assert (node.data_dir / CHECKPOINT_FILE).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\x00\xff garbage", b"[1, 2, 3]", b'{"version": 1, "claims": {}}', b'{"truncated": '],
)
def test_garbage_checkpoint_is_moved_aside_and_state_rebuilt_from_specs(
    node: Node, garbage: bytes
) -> None:
    claims, objs = _prepared(node)
    before = {p.name: assert_valid_cdi(p) for p in node.spec_files()}
    (node.data_dir / "checkpoint.json").write_bytes(garbage)
    state = node.state(claims)
    aside = list(node.data_dir.glob("checkpoint.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert {p.name: json.loads(p.read_text()) for p in node.spec_files()} == before
    recovered = state.prepared_claims()
    assert set(recovered) == {o["metadata"]["uid"] for o in objs}
    # The rebuilt state answers prepare without new work and unprepares cleanly.
    gets = claims.gets
    outs = state.prepare([ref(o) for o in objs])
    assert claims.gets == gets
    for o in objs:
        share_id = o["status"]["allocation"]["devices"]["results"][0]["shareID"]
        (dev,) = outs[o["metadata"]["uid"]].devices
        assert (dev.device_name, dev.share_id, dev.request_names) == ("gpu-0", share_id, ("gpu",))
    assert node.checkpoint()["checksum"]  # a fresh, valid checkpoint was written
    state.unprepare([ref(o) for o in objs])
    assert node.spec_files() == []


def test_repeated_corruption_keeps_every_copy(node: Node) -> None:
    claims, _ = _prepared(node)
    for garbage in (b"first", b"second"):
        (node.data_dir / "checkpoint.json").write_bytes(garbage)
        assert len(node.state(claims).prepared_claims()) == 2
    copies = sorted(p.read_bytes() for p in node.data_dir.glob("checkpoint.json.corrupt-*"))
    assert copies == [b"first", b"second"]


def test_tampered_checksum_counts_as_corrupt(node: Node) -> None:
    claims, _ = _prepared(node)
    doc = node.checkpoint()
    doc["claims"] = {}
    node.write_checkpoint(doc, fix_checksum=False)
    state = node.state(claims)
    assert len(list(node.data_dir.glob("checkpoint.json.corrupt-*"))) == 1
    assert len(state.prepared_claims()) == 2


def test_unreadable_checkpoint_is_moved_aside(node: Node) -> None:
    claims, _ = _prepared(node)
    (node.data_dir / CHECKPOINT_FILE).unlink()
    (node.data_dir / CHECKPOINT_FILE).mkdir()
    state = node.state(claims)
    assert len(state.prepared_claims()) == 2
    assert (node.data_dir / CHECKPOINT_FILE).is_file()


def test_unreadable_spec_files_are_removed_during_rebuild(node: Node) -> None:
    claims, objs = _prepared(node)
    broken = node.cdi_dir / f"k8s.{DRIVER}-claim_{objs[0]['metadata']['uid']}.json"
    broken.write_text('{"cdiVersion": "0.3.0"')
    (node.data_dir / "checkpoint.json").write_text("not json")
    state = node.state(claims)
    assert set(state.prepared_claims()) == {objs[1]["metadata"]["uid"]}
    assert not broken.exists()


def test_newer_version_fields_are_kept(node: Node) -> None:
    claims, objs = _prepared(node)
    doc = node.checkpoint()
    uid = objs[0]["metadata"]["uid"]
    doc["version"] = CHECKPOINT_VERSION + 1
    doc["futureTop"] = {"x": [1, 2]}
    doc["claims"][uid]["futureClaim"] = "keep me"
    doc["claims"][uid]["devices"][0]["futureDevice"] = 7
    node.write_checkpoint(doc)
    state = node.state(claims)
    assert not list(node.data_dir.glob("checkpoint.json.corrupt-*"))
    assert len(state.prepared_claims()) == 2
    # A rewrite (unprepare of the other claim) keeps every unknown field.
    state.unprepare([ref(objs[1])])
    after = node.checkpoint()
    assert after["futureTop"] == {"x": [1, 2]}
    assert after["claims"][uid]["futureClaim"] == "keep me"
    assert after["claims"][uid]["devices"][0]["futureDevice"] == 7
    assert after["checksum"] == checksum_of(after)


def test_undecodable_entry_from_a_newer_version_is_rolled_back_not_fatal(node: Node) -> None:
    claims, objs = _prepared(node)
    doc = node.checkpoint()
    uid = objs[0]["metadata"]["uid"]
    doc["claims"][uid]["state"] = "PrepareVerifying"
    node.write_checkpoint(doc)
    state = node.state(claims)
    assert set(state.prepared_claims()) == {objs[1]["metadata"]["uid"]}
    assert len(node.spec_files()) == 1
    # The next call prepares it again.
    assert state.prepare([ref(objs[0])])[uid].error == ""
    assert len(node.spec_files()) == 2


def test_reboot_drops_stale_entries_and_their_specs(node: Node) -> None:
    claims, objs = _prepared(node)
    enforcer = RecordingEnforcer()
    # The CDI dir survives here (a persistent dir); the files must still go.
    node.boot_id_file.write_text("another-boot\n")
    state = node.state(claims, enforcer=enforcer)
    assert state.prepared_claims() == {}
    assert node.spec_files() == []
    assert node.checkpoint()["claims"] == {}
    assert node.checkpoint()["bootID"] == "another-boot"
    assert enforcer.restored is not None and enforcer.restored[0] is None
    # Prepared again on the next call.
    outs = state.prepare([ref(o) for o in objs])
    assert all(o.error == "" for o in outs.values())


def test_prepare_started_is_rolled_back_and_redone(node: Node) -> None:
    claims, objs = _prepared(node, enforcer=RecordingEnforcer())
    doc = node.checkpoint()
    uid = objs[0]["metadata"]["uid"]
    doc["claims"][uid]["state"] = STATE_STARTED
    node.write_checkpoint(doc)
    enforcer = RecordingEnforcer()
    state = node.state(claims, enforcer=enforcer)
    assert ("release", uid) in enforcer.calls
    assert uid not in state.prepared_claims()
    assert not (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").exists()
    assert uid not in node.checkpoint()["claims"]
    out = state.prepare([ref(objs[0])])[uid]
    assert out.error == ""
    assert ("apply", uid) in enforcer.calls
    assert node.checkpoint()["claims"][uid]["state"] == "PrepareCompleted"


#: What a power loss may leave of a spec file written without fsync (or a crash before it was
#: written): nothing, an empty file, its first bytes, other bytes.
SPEC_DAMAGE = {
    "lost": lambda data: None,
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "garbage": lambda data: b"\x00" * len(data),
}


@pytest.mark.parametrize("damage", sorted(SPEC_DAMAGE))
def test_a_lost_or_truncated_spec_of_a_completed_claim_is_restored_identical_at_start(
    node: Node, damage: str
) -> None:
    """Spec files are written atomically but without fsync; the checkpoint, which says the
    claim is prepared, is the record. The start rewrites the spec, byte for byte what prepare
    wrote (the enforcer's edits included), keeps the claim prepared without enforcing it again,
    and leaves an intact spec alone."""
    claims = FakeClaims()
    objs = [
        claim(f"c{i}", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
        for i in range(2)
    ]
    claims.add(*objs)
    refs = [ref(o) for o in objs]
    first = node.state(claims, enforcer=RecordingEnforcer()).prepare(refs)
    assert all(o.error == "" for o in first.values())
    damaged, intact = (node.cdi_dir / f"k8s.{DRIVER}-claim_{r.uid}.json" for r in refs)
    written, intact_inode = damaged.read_bytes(), intact.stat().st_ino
    assert b"SHARE_LIMIT=10" in written  # the enforcer's edits are part of it
    left = SPEC_DAMAGE[damage](written)
    if left is None:
        damaged.unlink()
    else:
        damaged.write_bytes(left)

    enforcer = RecordingEnforcer()
    state = node.state(claims, enforcer=enforcer)
    assert damaged.read_bytes() == written
    assert intact.stat().st_ino == intact_inode  # not rewritten
    assert {r.uid for r in refs} <= set(state.prepared_claims())
    assert state.prepare(refs) == first
    assert enforcer.calls == []  # restored, not enforced again
    assert node.checkpoint()["claims"][refs[0].uid]["state"] == "PrepareCompleted"


def test_a_spec_that_cannot_be_restored_rolls_its_claim_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims, objs = _prepared(node)
    uid = objs[0]["metadata"]["uid"]
    spec = node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json"
    spec.unlink()
    restore = CdiSpecWriter.restore

    def full_disk(writer: CdiSpecWriter, claim_uid: str, devices: Any) -> bool:
        if claim_uid == uid:
            raise OSError(errno.ENOSPC, "No space left on device")
        return restore(writer, claim_uid, devices)

    monkeypatch.setattr(CdiSpecWriter, "restore", full_disk)
    state = node.state(claims)
    assert uid not in state.prepared_claims()
    assert objs[1]["metadata"]["uid"] in state.prepared_claims()
    assert uid not in node.checkpoint()["claims"]
    monkeypatch.undo()
    assert state.prepare([ref(objs[0])])[uid].error == ""
    assert spec.is_file()


def test_orphan_specs_and_temp_files_are_removed_at_start(node: Node) -> None:
    claims, _ = _prepared(node)
    orphan = node.cdi_dir / f"k8s.{DRIVER}-claim_55555555-5555-5555-5555-555555555555.json"
    orphan.write_text("{}")
    tmp = node.cdi_dir / f".k8s.{DRIVER}-claim_x.json.abc.tmp"
    tmp.write_text("partial")
    foreign = node.cdi_dir / "vendor.example.com-thing.json"
    foreign.write_text("{}")
    ck_tmp = node.data_dir / ".checkpoint.json.zz.tmp"
    ck_tmp.write_text("partial")
    node.state(claims)
    assert not orphan.exists() and not tmp.exists() and not ck_tmp.exists()
    assert foreign.exists()


def test_missing_boot_id_file_is_not_fatal(node: Node, tmp_path: Path) -> None:
    cp = Checkpoint(node.data_dir, boot_id_file=tmp_path / "no-such-file")
    assert cp.boot_id == ""
    cp.write({}, {})
    assert cp.load().status == "loaded"


def test_the_data_dir_is_created_private_like_the_socket_dirs(tmp_path: Path) -> None:
    # The daemon loads the checkpoint before it binds the DRA socket in the same directory, so
    # the checkpoint creates the data dir: with the socket directories' mode 0750, whatever the
    # umask, leaving an existing directory as it is.
    data = tmp_path / "plugins" / "gpu.sharegpu.dev"
    old = os.umask(0o022)
    try:
        Checkpoint(data, boot_id_file=tmp_path / "no-such-file").load()
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.stat().st_mode) == 0o750
    assert stat.S_IMODE(data.parent.stat().st_mode) == 0o750
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    Checkpoint(existing, boot_id_file=tmp_path / "no-such-file").write({}, {})
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755


def test_a_file_in_place_of_the_data_dir_is_an_os_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(NotADirectoryError, match="a-file"):
        Checkpoint(blocker / "data", boot_id_file=tmp_path / "no-such-file").load()


@pytest.mark.parametrize("reboot", [False, True])
def test_a_checkpoint_key_that_is_no_claim_uid_touches_nothing_outside_the_cdi_dir(
    node: Node, reboot: bool
) -> None:
    """A tampered checkpoint naming ``../../victim`` as a claim: the entry is rolled back (or
    dropped after a reboot) without building a path from it, and the start does not fail."""
    claims, objs = _prepared(node)
    victim = node.cdi_dir.parent / "victim.json"
    victim.write_text("keep me")
    # With this directory, <cdi-dir>/<prefix>x/../../victim.json resolves to the victim.
    (node.cdi_dir / f"{spec_file_prefix(DRIVER)}x").mkdir(parents=True)
    doc = node.checkpoint()
    uid = objs[0]["metadata"]["uid"]
    doc["claims"]["x/../../victim"] = doc["claims"][uid]
    node.write_checkpoint(doc)
    if reboot:
        node.boot_id_file.write_text("another-boot\n")
    state = node.state(claims)
    assert victim.read_text() == "keep me"
    assert "x/../../victim" not in state.prepared_claims()
    assert "x/../../victim" not in node.checkpoint()["claims"]
