"""The two-slot checkpoint file: torn and damaged slots, sequence order, growth, migration from
``checkpoint.json`` with crashes between its steps, hostile headers, and the cost of a write."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.prepare import checkpoint as checkpoint_module
from kubeletplugin.prepare import slotfile
from kubeletplugin.prepare.checkpoint import (
    CHECKPOINT_FILE,
    LEGACY_CHECKPOINT_FILE,
    LOAD_CORRUPT,
    LOAD_FRESH,
    LOAD_OK,
    Checkpoint,
    checksum_of,
)
from kubeletplugin.prepare.slotfile import (
    DEFAULT_SLOT_SIZE,
    HEADER_SIZE,
    MAX_SLOT_SIZE,
    SEQ_MODULUS,
    SlotError,
    SlotFile,
    SlotFileError,
    encode_slot,
    newer,
    read_slot,
    scan,
)
from tests.helpers import eventually
from tests.kubeletplugin.prepare.checkpoint_files import read_document
from tests.kubeletplugin.prepare.helpers import GI, FakeClaims, Node, claim, ref, result

#: Offsets of each kind of byte in a slot holding a body of at least two bytes: header fields,
#: the checksum, the body.
OFFSET_CLASSES = {
    "magic": 0,
    "layout version": 8,
    "reserved": 12,
    "sequence": 16,
    "slot size": 24,
    "length": 32,
    "checksum first byte": 40,
    "checksum last byte": HEADER_SIZE - 1,
    "body first byte": HEADER_SIZE,
    "body last byte": -1,
}


class Crash(BaseException):
    """The process dies here (raised from an injected fault; nothing after it runs)."""


def _write_all(path: Path, bodies: list[bytes]) -> SlotFile:
    slots = SlotFile(path)
    for body in bodies:
        slots.write(body)
    return slots


def _newest(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        found = scan(fd)
    finally:
        os.close(fd)
    assert found.valid, found.problems
    return found.valid[0].body


def _slot_offset(path: Path, index: int) -> int:
    return index * (path.stat().st_size // 2)


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _absolute(path: Path, slot: int, body_len: int, where: int) -> int:
    base = _slot_offset(path, slot)
    return base + (HEADER_SIZE + body_len - 1 if where == -1 else where)


# --- The slot file -------------------------------------------------------------------------


@pytest.mark.parametrize("newest_slot", [0, 1])
@pytest.mark.parametrize("where", list(OFFSET_CLASSES.values()), ids=list(OFFSET_CLASSES))
def test_a_damaged_newest_slot_falls_back_to_the_other(
    tmp_path: Path, newest_slot: int, where: int
) -> None:
    path = tmp_path / "f"
    bodies = [b"first state", b"second state", b"third state"]
    # The first body goes into slot 0 (a new file), then slots alternate.
    _write_all(path, bodies[: 3 - newest_slot])
    newest, previous = bodies[2 - newest_slot], bodies[1 - newest_slot]
    assert _newest(path) == newest
    _flip(path, _absolute(path, newest_slot, len(newest), where))
    assert _newest(path) == previous


@pytest.mark.parametrize("older_slot", [0, 1])
@pytest.mark.parametrize(
    "kept",
    [0, 10, 20, 40, 41, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 7, -1],
    ids=lambda n: f"prefix-{n}",
)
def test_a_torn_write_into_the_older_slot_leaves_the_newest(
    tmp_path: Path, older_slot: int, kept: int
) -> None:
    """A crash in the middle of a write: only a prefix of the new slot reached the disk."""
    path = tmp_path / "f"
    bodies = [b"state one", b"state two", b"state three"]
    slots = _write_all(path, bodies[: 2 + older_slot])
    newest = bodies[1 + older_slot]
    torn = encode_slot(99, path.stat().st_size // 2, b"the torn state, longer than the rest")
    prefix = torn[: len(torn) - 1 if kept == -1 else kept]
    with path.open("r+b") as f:
        f.seek(_slot_offset(path, older_slot))
        f.write(prefix)
    assert _newest(path) == newest
    # The next write, after a restart, goes into the torn slot and wins.
    slots.close()
    reopened = SlotFile(path)
    assert reopened.open() is not None
    reopened.write(b"after the crash")
    assert _newest(path) == b"after the crash"
    assert reopened.current == older_slot


def test_bytes_after_the_body_mean_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f"
    _write_all(path, [b"a much longer first body", b"short"])
    _flip(path, _absolute(path, 1, len(b"short"), HEADER_SIZE + len(b"short") + 3))
    assert _newest(path) == b"short"


@pytest.mark.parametrize(
    ("a", "b", "a_is_newer"),
    [
        (2, 1, True),
        (1, 2, False),
        (5, 5, False),
        (0, SEQ_MODULUS - 1, True),  # the wrap
        (SEQ_MODULUS - 1, 0, False),
        (3, SEQ_MODULUS - 2, True),
        (SEQ_MODULUS // 2 - 1, 0, True),
        (SEQ_MODULUS // 2, 0, False),  # opposite numbers: neither is newer
        (0, SEQ_MODULUS // 2, False),
    ],
)
def test_sequence_order_is_serial_arithmetic(a: int, b: int, a_is_newer: bool) -> None:
    assert newer(a, b) is a_is_newer


def _two_slots(path: Path, seqs: tuple[int, int], bodies: tuple[bytes, bytes]) -> None:
    size = DEFAULT_SLOT_SIZE
    data = bytearray(2 * size)
    for index in (0, 1):
        raw = encode_slot(seqs[index], size, bodies[index])
        data[index * size : index * size + len(raw)] = raw
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("wrapped_slot", [0, 1])
def test_the_sequence_number_wraps(tmp_path: Path, wrapped_slot: int) -> None:
    path = tmp_path / "f"
    seqs = (0, SEQ_MODULUS - 1) if wrapped_slot == 0 else (SEQ_MODULUS - 1, 0)
    bodies = (b"slot zero", b"slot one")
    _two_slots(path, seqs, bodies)
    assert _newest(path) == bodies[wrapped_slot]
    slots = SlotFile(path)
    assert slots.open() is not None
    slots.write(b"next")
    fd = os.open(path, os.O_RDONLY)
    try:
        written = read_slot(fd, 1 - wrapped_slot, DEFAULT_SLOT_SIZE)
    finally:
        os.close(fd)
    assert written is not None and (written.body, written.seq) == (b"next", 1)
    assert _newest(path) == b"next"


def test_writes_alternate_between_the_slots_with_rising_numbers(tmp_path: Path) -> None:
    path = tmp_path / "f"
    slots = SlotFile(path)
    seen = []
    for i in range(5):
        slots.write(f"body {i}".encode())
        fd = os.open(path, os.O_RDONLY)
        try:
            found = scan(fd)
        finally:
            os.close(fd)
        seen.append((found.valid[0].index, found.valid[0].seq, found.valid[0].body))
    assert seen == [(i % 2, i + 1, f"body {i}".encode()) for i in range(5)]


# --- Hostile files -------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of every pread of the slot file module."""
    sizes: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        sizes.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    yield sizes


def _with_header(path: Path, **fields: int) -> None:
    """A file whose slot 0 header has ``fields`` replaced (checksum left as it was)."""
    _two_slots(path, (1, 0), (b'{"x": 1}', b""))
    names = ("magic", "version", "reserved", "seq", "slot_size", "length")
    with path.open("r+b") as f:
        head = list(struct.unpack("<8sIIQQQ", f.read(40)))
        for key, value in fields.items():
            head[names.index(key)] = value
        f.seek(0)
        f.write(struct.pack("<8sIIQQQ", *head))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"length": 2**64 - 1}, "body length"),
        ({"length": 2**63}, "body length"),
        ({"length": DEFAULT_SLOT_SIZE - HEADER_SIZE + 1}, "body length"),
        ({"slot_size": 2**64 - 1}, "slot size"),
        ({"slot_size": 0}, "slot size"),
        ({"version": 2**32 - 1}, "layout version"),
        ({"magic": int.from_bytes(b"NOTASLOT", "little")}, "magic"),
    ],
)
def test_an_absurd_header_is_an_invalid_slot_without_a_large_read(
    tmp_path: Path, reads: list[int], fields: dict[str, int], problem: str
) -> None:
    path = tmp_path / "f"
    if "magic" in fields:
        fields = {"magic": fields["magic"].to_bytes(8, "little")}  # type: ignore[dict-item]
    _with_header(path, **fields)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(SlotError, match=problem):
            read_slot(fd, 0, DEFAULT_SLOT_SIZE)
    finally:
        os.close(fd)
    assert max(reads) <= DEFAULT_SLOT_SIZE


@pytest.mark.parametrize(
    "size",
    [1, 4095, 8191, 3 * 4096, 2 * 4096 + 2, 2 * MAX_SLOT_SIZE * 2, 2**40],
    ids=lambda n: f"size-{n}",
)
def test_a_file_size_that_fits_no_layout_is_rejected_before_any_read(
    tmp_path: Path, reads: list[int], size: int
) -> None:
    path = tmp_path / "f"
    with path.open("wb") as f:
        f.truncate(size)  # sparse: no disk used
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(SlotFileError, match=f"size {size} is no two-slot layout"):
            scan(fd)
    finally:
        os.close(fd)
    assert reads == []


def test_a_huge_sparse_checkpoint_is_moved_aside_not_read(tmp_path: Path, reads: list[int]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with (data / CHECKPOINT_FILE).open("wb") as f:
        f.truncate(2**40)
    loaded = Checkpoint(data, boot_id_file=tmp_path / "none").load()
    assert loaded.status == LOAD_CORRUPT
    assert loaded.moved_to is not None and loaded.moved_to.name.startswith(
        "checkpoint.dat.corrupt-"
    )
    assert reads == []


def test_a_body_larger_than_the_largest_slot_is_an_os_error(tmp_path: Path) -> None:
    slots = SlotFile(tmp_path / "f")
    slots.write(b"small")
    with pytest.raises(OSError, match="does not fit the largest slot"):
        slots.write(bytes(MAX_SLOT_SIZE))
    assert _newest(tmp_path / "f") == b"small"


# --- The checkpoint in its file -----------------------------------------------------------


def _checkpoint(tmp_path: Path) -> Checkpoint:
    return Checkpoint(tmp_path / "data", boot_id_file=tmp_path / "boot_id")


@pytest.fixture
def boot(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("boot-1\n")


@pytest.mark.usefixtures("boot")
def test_a_write_is_one_fdatasync_and_no_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 0})  # the first write creates the file
    calls: list[str] = []
    for name in ("fsync", "fdatasync", "replace", "rename", "open"):
        real = getattr(os, name)

        def spy(*args: Any, _name: str = name, _real: Callable[..., Any] = real) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, spy)
    for n in range(1, 4):
        cp.write({}, {"n": n})
    monkeypatch.undo()
    assert calls == ["fdatasync"] * 3
    loaded = _checkpoint(tmp_path).load()
    assert loaded.sharing == {"n": 3}


@pytest.mark.usefixtures("boot")
@pytest.mark.parametrize("damaged", ["torn", "corrupt document"])
def test_a_bad_newest_slot_loads_the_previous_document(tmp_path: Path, damaged: str) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    cp.write({}, {"n": 2})  # into slot 1
    path = cp.path
    if damaged == "torn":
        _flip(path, _slot_offset(path, 1) + HEADER_SIZE + 5)
    else:
        # A whole, checksummed slot whose document fails its own checksum.
        doc = json.loads(_newest(path))
        doc["sharing"] = {"n": 99}
        body = json.dumps(doc).encode()
        with path.open("r+b") as f:
            f.seek(_slot_offset(path, 1))
            f.write(encode_slot(3, path.stat().st_size // 2, body))
    again = _checkpoint(tmp_path)
    loaded = again.load()
    assert (loaded.status, loaded.sharing) == (LOAD_OK, {"n": 1})
    # The next write goes into the bad slot, numbered after both.
    again.write({}, {"n": 4})
    assert _checkpoint(tmp_path).load().sharing == {"n": 4}
    assert json.loads(_newest(path))["sharing"] == {"n": 4}


@pytest.mark.usefixtures("boot")
def test_both_slots_bad_is_the_corrupt_path(tmp_path: Path) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    cp.write({}, {"n": 2})
    for slot in (0, 1):
        _flip(cp.path, _slot_offset(cp.path, slot) + 20)
    loaded = _checkpoint(tmp_path).load()
    assert loaded.status == LOAD_CORRUPT and loaded.sharing is None
    assert loaded.moved_to is not None and loaded.moved_to.name.startswith(
        "checkpoint.dat.corrupt-"
    )
    assert not cp.path.exists()


def test_both_slots_bad_rebuilds_the_node_from_its_spec_files(tmp_path: Path) -> None:
    node = Node(tmp_path)
    claims = FakeClaims()
    objs = [
        claim(f"c{i}", [result("gpu", "gpu-0", share={"cores": 10, "memory": GI})])
        for i in range(2)
    ]
    claims.add(*objs)
    assert all(o.error == "" for o in node.state(claims).prepare([ref(o) for o in objs]).values())
    path = node.data_dir / CHECKPOINT_FILE
    for slot in (0, 1):
        _flip(path, _slot_offset(path, slot) + 3)
    state = node.state(claims)
    assert set(state.prepared_claims()) == {o["metadata"]["uid"] for o in objs}
    assert len(list(node.data_dir.glob("checkpoint.dat.corrupt-*"))) == 1
    doc = node.checkpoint()
    assert doc["checksum"] == checksum_of(doc) and set(doc["claims"]) == set(
        state.prepared_claims()
    )


@pytest.mark.usefixtures("boot")
def test_a_document_that_outgrows_its_slot_grows_the_file(tmp_path: Path) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    assert cp.path.stat().st_size == 2 * DEFAULT_SLOT_SIZE
    big = {"blob": "x" * DEFAULT_SLOT_SIZE}
    cp.write({}, big)
    assert cp.path.stat().st_size == 2 * 4 * DEFAULT_SLOT_SIZE
    assert _checkpoint(tmp_path).load().sharing == big
    cp.write({}, {"n": 3})  # back to in-place writes in the larger file
    assert cp.path.stat().st_size == 2 * 4 * DEFAULT_SLOT_SIZE
    assert _checkpoint(tmp_path).load().sharing == {"n": 3}


@pytest.mark.usefixtures("boot")
@pytest.mark.parametrize("step", ["fill", "fsync", "replace"])
def test_a_crash_during_growth_leaves_the_previous_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    cp.write({}, {"n": 2})
    _crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        cp.write({}, {"blob": "x" * DEFAULT_SLOT_SIZE})
    monkeypatch.undo()
    again = _checkpoint(tmp_path)
    assert again.load().sharing == {"n": 2}
    assert [p.name for p in cp.path.parent.iterdir()] == [CHECKPOINT_FILE]  # no temp file left
    assert cp.path.stat().st_size == 2 * DEFAULT_SLOT_SIZE


def _crash_at(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Make the next slow-path file write die at ``step`` (its temporary file stays behind,
    as after a kill)."""

    def crash(*_: Any) -> None:
        raise Crash(step)

    if step == "fill":
        monkeypatch.setattr(slotfile, "_pwrite_all", crash)
    elif step == "fsync":
        monkeypatch.setattr(os, "fsync", crash)
    else:
        monkeypatch.setattr(os, "replace", crash)
    # A killed process removes nothing: keep the temporary file.
    monkeypatch.setattr(os, "unlink", lambda *_: None)


@pytest.mark.usefixtures("boot")
def test_after_a_failed_write_the_next_rebuilds_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(OSError, match="Input/output"):
        cp.write({}, {"n": 2})
    monkeypatch.undo()
    inode = cp.path.stat().st_ino
    cp.write({}, {"n": 3})
    assert cp.path.stat().st_ino != inode  # a new file, renamed into place
    assert _checkpoint(tmp_path).load().sharing == {"n": 3}


# --- Migration from checkpoint.json ---------------------------------------------------------


def _legacy_doc(boot_id: str, **sharing: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1,
        "bootID": boot_id,
        "claims": {},
        "sharing": sharing,
        "futureTop": ["kept"],
    }
    doc["checksum"] = checksum_of(doc)
    return doc


def _write_legacy(tmp_path: Path, doc: dict[str, Any]) -> Path:
    legacy = tmp_path / "data" / LEGACY_CHECKPOINT_FILE
    legacy.parent.mkdir(exist_ok=True)
    legacy.write_text(json.dumps(doc))
    return legacy


@pytest.mark.usefixtures("boot")
def test_checkpoint_json_is_migrated_verbatim_and_removed(tmp_path: Path) -> None:
    legacy = _write_legacy(tmp_path, _legacy_doc("boot-1", n=7))
    raw = legacy.read_bytes()
    cp = _checkpoint(tmp_path)
    loaded = cp.load()
    assert (loaded.status, loaded.sharing) == (LOAD_OK, {"n": 7})
    assert not legacy.exists()
    assert _newest(cp.path) == raw
    cp.write({}, {"n": 8})
    assert read_document(tmp_path / "data")["futureTop"] == ["kept"]  # unknown fields stay
    assert _checkpoint(tmp_path).load().sharing == {"n": 8}


@pytest.mark.usefixtures("boot")
@pytest.mark.parametrize("step", ["fill", "fsync", "replace", "remove"])
def test_a_crash_at_any_step_of_the_migration_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    legacy = _write_legacy(tmp_path, _legacy_doc("boot-1", n=7))
    if step == "remove":

        def crash(_: Path) -> bool:
            raise Crash(step)

        monkeypatch.setattr(checkpoint_module, "remove_durably", crash)
    else:
        _crash_at(monkeypatch, step)
    with pytest.raises(Crash):
        _checkpoint(tmp_path).load()
    monkeypatch.undo()
    assert legacy.exists()
    cp = _checkpoint(tmp_path)
    assert cp.load().sharing == {"n": 7}
    assert sorted(p.name for p in legacy.parent.iterdir()) == [CHECKPOINT_FILE]
    assert read_document(tmp_path / "data")["sharing"] == {"n": 7}


@pytest.mark.usefixtures("boot")
def test_checkpoint_json_newer_than_the_slot_file_wins(tmp_path: Path) -> None:
    """A plugin that writes only checkpoint.json ran after this one (a downgrade)."""
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    _write_legacy(tmp_path, _legacy_doc("boot-1", n=2))
    assert _checkpoint(tmp_path).load().sharing == {"n": 2}
    assert read_document(tmp_path / "data")["sharing"] == {"n": 2}


@pytest.mark.usefixtures("boot")
def test_a_corrupt_checkpoint_json_removes_the_older_slot_file(tmp_path: Path) -> None:
    cp = _checkpoint(tmp_path)
    cp.write({}, {"n": 1})
    (tmp_path / "data" / LEGACY_CHECKPOINT_FILE).write_bytes(b"{ torn")
    loaded = _checkpoint(tmp_path).load()
    assert loaded.status == LOAD_CORRUPT
    assert loaded.moved_to is not None and loaded.moved_to.name.startswith(
        "checkpoint.json.corrupt-"
    )
    assert not cp.path.exists()
    assert _checkpoint(tmp_path).load().status == LOAD_FRESH


# --- Group commit ----------------------------------------------------------------------------


def test_concurrent_prepares_share_their_checkpoint_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one write is held, every other claim records PrepareStarted; the next write covers
    all of them, and the whole batch takes fewer writes than state changes."""
    import threading

    node = Node(tmp_path)
    claims = FakeClaims()
    objs = [
        claim(f"c{i}", [result("gpu", f"gpu-{i % 8}", share={"cores": 10, "memory": GI})])
        for i in range(8)
    ]
    claims.add(*objs)
    state = node.state(claims)
    gate = threading.Event()
    held = threading.Event()
    written: list[dict[str, str]] = []
    real_write = state._checkpoint.write

    def write(records: Any, sharing: Any) -> None:
        if not written:
            held.set()
            assert gate.wait(timeout=60)
        written.append({uid: rec.state for uid, rec in records.items()})
        real_write(records, sharing)

    monkeypatch.setattr(state._checkpoint, "write", write)
    threads = [threading.Thread(target=state.prepare, args=([ref(o)],)) for o in objs]
    for t in threads:
        t.start()
    assert held.wait(timeout=60)

    def started() -> int:
        return len(state.prepared_claims())

    eventually(lambda: started() == len(objs), "every claim started", timeout_s=60)
    gate.set()
    for t in threads:
        t.join(timeout=60)
    uids = {o["metadata"]["uid"] for o in objs}
    assert set(written[1]) == uids  # the write after the held one covers every claim
    assert len(written) <= 2 + len(objs) < 2 * len(objs)
    assert all(s == "PrepareCompleted" for s in written[-1].values()) and set(written[-1]) == uids
