"""One byte string kept durably in a file rewritten in place: two preallocated slots of
``slot_size`` (a power of two, :data:`MIN_SLOT_SIZE` to :data:`MAX_SLOT_SIZE`), each a checksummed
header (:data:`HEADER_SIZE`, layout below the imports) and a body.

Invariants:

- Of the valid slots (magic, version, size, length fit, checksum matches) the newer sequence
  number wins (serial-number arithmetic modulo 2**64; equal or opposite: slot 0).
- A write goes to the slot not in use with one ``pwrite`` and one ``fdatasync``, no rename, into
  blocks written with zeros at creation: a torn write leaves an invalid slot and the previous
  body wins.
- Creating, growing and rebuilding go the slow way (temporary file, fsync, rename, directory
  fsync), so a crash leaves the old file or the new one; after a failed write the next write
  rebuilds (the kernel may have dropped the dirty pages).
- Reads are bounded: a size that is no two-slot layout is refused before reading, a header's
  length is checked before its body is read, nothing larger than one slot is allocated.

Not thread-safe: the owner serializes calls."""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path

from kubeletplugin.fsutil import atomic_create

# Slot i starts at byte i * slot_size with a 72-byte header, integers little-endian, then the
# body; bytes after the body mean nothing, an all-zero header is an empty slot:
#   offset size field
#   0      8    magic b"SGPUSLOT"
#   8      4    layout version, 1
#   12     4    reserved, 0
#   16     8    sequence number (unsigned; wraps from 2**64 - 1 to 0)
#   24     8    slot size (the file's; a header that disagrees is invalid)
#   32     8    body length, at most slot size - 72
#   40     32   SHA-256 of header bytes 0..40 followed by the body
MAGIC = b"SGPUSLOT"
LAYOUT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQ")
#: Bytes of the header the checksum covers (everything before the checksum).
_COVERED = _HEADER.size
HEADER_SIZE = _COVERED + hashlib.sha256().digest_size
MIN_SLOT_SIZE = 4096
#: The slot size of a new file: room for a few hundred prepared claims.
DEFAULT_SLOT_SIZE = 256 * 1024
MAX_SLOT_SIZE = 64 * 1024 * 1024
SEQ_MODULUS = 2**64
_EMPTY_HEADER = bytes(HEADER_SIZE)
#: Zeros are written in chunks of this size when a file is created.
_ZERO_CHUNK = 1024 * 1024


class SlotFileError(ValueError):
    """A file that is no two-slot file at all (its size fits no layout)."""


class SlotError(ValueError):
    """One slot that holds no valid body."""


def newer(a: int, b: int) -> bool:
    """Whether sequence number ``a`` comes after ``b`` (serial-number arithmetic modulo 2**64:
    true when ``a`` is less than 2**63 steps ahead of ``b``)."""
    return 0 < (a - b) % SEQ_MODULUS < SEQ_MODULUS // 2


def slot_size_for(length: int, current: int = 0) -> int:
    """The slot size for a body of ``length`` bytes: ``current`` when it fits, else the smallest
    power of two, at least :data:`DEFAULT_SLOT_SIZE`, with room for twice the body (so growth is
    rare). OSError(EFBIG) when even :data:`MAX_SLOT_SIZE` is too small."""
    needed = HEADER_SIZE + length
    if needed > MAX_SLOT_SIZE:
        raise OSError(
            errno.EFBIG,
            f"a body of {length} bytes does not fit the largest slot ({MAX_SLOT_SIZE} bytes)",
        )
    if current and needed <= current:
        return current
    size = DEFAULT_SLOT_SIZE
    while size < 2 * needed and size < MAX_SLOT_SIZE:
        size *= 2
    return size


def encode_slot(seq: int, slot_size: int, body: bytes) -> bytes:
    """Header and body of one slot, as written at the slot's start."""
    if not 0 <= seq < SEQ_MODULUS:
        raise ValueError(f"sequence number {seq} is outside 0..2**64-1")
    if HEADER_SIZE + len(body) > slot_size:
        raise ValueError(f"a body of {len(body)} bytes does not fit a slot of {slot_size}")
    head = _HEADER.pack(MAGIC, LAYOUT_VERSION, 0, seq, slot_size, len(body))
    return head + hashlib.sha256(head + body).digest() + body


def layout_slot_size(file_size: int) -> int:
    """The slot size of a file of ``file_size`` bytes; SlotFileError when no layout fits."""
    slot_size = file_size // 2
    if (
        file_size % 2
        or not MIN_SLOT_SIZE <= slot_size <= MAX_SLOT_SIZE
        or slot_size & (slot_size - 1)
    ):
        raise SlotFileError(
            f"size {file_size} is no two-slot layout (two slots of a power of two from "
            f"{MIN_SLOT_SIZE} to {MAX_SLOT_SIZE} bytes)"
        )
    return slot_size


@dataclass(frozen=True)
class Slot:
    """The valid body of slot ``index``."""

    index: int
    seq: int
    body: bytes


@dataclass(frozen=True)
class Scan:
    """What a file's two slots hold: ``valid`` newest first; ``problems`` one line per invalid
    (not empty) slot."""

    slot_size: int
    valid: tuple[Slot, ...]
    problems: tuple[str, ...]


def read_slot(fd: int, index: int, slot_size: int) -> Slot | None:
    """Slot ``index`` of the file open as ``fd``: its body, None when it is empty, SlotError
    naming the problem when it is invalid. Reads at most one slot."""
    offset = index * slot_size
    header = os.pread(fd, HEADER_SIZE, offset)
    if header == _EMPTY_HEADER:
        return None
    if len(header) < HEADER_SIZE:
        raise SlotError(f"slot {index}: the header is cut short")
    magic, version, _, seq, recorded_size, length = _HEADER.unpack_from(header)
    if magic != MAGIC:
        raise SlotError(f"slot {index}: no slot header (magic {magic!r})")
    if version != LAYOUT_VERSION:
        raise SlotError(
            f"slot {index}: layout version {version}, this plugin reads {LAYOUT_VERSION}"
        )
    if recorded_size != slot_size:
        raise SlotError(
            f"slot {index}: the header's slot size {recorded_size} is not the file's {slot_size}"
        )
    if length > slot_size - HEADER_SIZE:
        raise SlotError(f"slot {index}: body length {length} does not fit the slot")
    body = os.pread(fd, length, offset + HEADER_SIZE)
    if len(body) != length:
        raise SlotError(f"slot {index}: the body is cut short")
    if hashlib.sha256(header[:_COVERED] + body).digest() != header[_COVERED:]:
        raise SlotError(f"slot {index}: checksum mismatch (a torn or damaged write)")
    return Slot(index=index, seq=seq, body=body)


def scan(fd: int) -> Scan:
    """Both slots of the file open as ``fd``, newest valid first (see the module invariants)."""
    slot_size = layout_slot_size(os.fstat(fd).st_size)
    valid: list[Slot] = []
    problems: list[str] = []
    for index in (0, 1):
        try:
            slot = read_slot(fd, index, slot_size)
        except SlotError as exc:
            problems.append(str(exc))
            continue
        if slot is not None:
            valid.append(slot)
    if len(valid) == 2 and newer(valid[1].seq, valid[0].seq):
        valid.reverse()
    return Scan(slot_size=slot_size, valid=tuple(valid), problems=tuple(problems))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class SlotFile:
    """The two-slot file at ``path``: :meth:`open` it to read, :meth:`write` bodies into it.

    Keeps one read-write descriptor open between calls (closed by :meth:`close`, or when the
    object is collected).
    """

    def __init__(self, path: Path, *, mode: int = 0o600) -> None:
        self.path = path
        self._mode = mode
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], SlotFile] | None = None
        self._slot_size = 0
        #: The slot holding the body in use; None when no slot does.
        self._current: int | None = None
        self._next_seq = 1
        #: A write failed: the next one rebuilds the file.
        self._broken = False

    @property
    def slot_size(self) -> int:
        """The open file's slot size (0 when none is open)."""
        return self._slot_size

    @property
    def current(self) -> int | None:
        """The slot holding the body in use, None when no file is open or no slot is in use."""
        return self._current

    def open(self) -> Scan | None:
        """Open the file and scan it; None when there is none. The newest valid slot is in use
        from now on (see :meth:`use`). OSError when it cannot be opened or read, SlotFileError
        when its size fits no layout (then it is left closed)."""
        self.close()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            found = scan(fd)
        except BaseException:
            os.close(fd)
            raise
        self._adopt(fd, found.slot_size)
        if found.valid:
            self._current = found.valid[0].index
            self._next_seq = (found.valid[0].seq + 1) % SEQ_MODULUS
        return found

    def use(self, index: int) -> None:
        """Make slot ``index`` the one in use (its body was taken although a newer slot was
        valid): the next write goes into the other slot, with a number after both."""
        self._current = index

    def write(self, body: bytes) -> None:
        """Store ``body`` durably: into the slot not in use with one pwrite and one fdatasync,
        or the slow way (create, grow, rebuild) where the module invariants say so. OSError when
        it cannot; the previously stored body then stays the one a load finds."""
        if self._fd is None and not self._broken:
            self._open_for_write()
        fd = self._fd
        if fd is None or self._broken or HEADER_SIZE + len(body) > self._slot_size:
            self.replace(body)
            return
        target = 0 if self._current is None else 1 - self._current
        data = encode_slot(self._next_seq, self._slot_size, body)
        try:
            _pwrite_all(fd, data, target * self._slot_size)
            os.fdatasync(fd)
        except BaseException:
            self._broken = True
            raise
        self._current = target
        self._next_seq = (self._next_seq + 1) % SEQ_MODULUS

    def replace(self, body: bytes) -> None:
        """Store ``body`` the slow way: a new file (temporary file, fsync, rename, directory
        fsync) with ``body`` in slot 0, sized by :func:`slot_size_for`."""
        slot_size = slot_size_for(len(body), self._slot_size)
        data = encode_slot(self._next_seq, slot_size, body)

        def fill(fd: int) -> None:
            _pwrite_all(fd, data, 0)
            zeros = bytes(min(_ZERO_CHUNK, 2 * slot_size))
            offset = len(data)
            while offset < 2 * slot_size:
                chunk = min(len(zeros), 2 * slot_size - offset)
                _pwrite_all(fd, zeros[:chunk], offset)
                offset += chunk

        fd = atomic_create(self.path, fill, self._mode)
        self._adopt(fd, slot_size)
        self._current = 0
        self._next_seq = (self._next_seq + 1) % SEQ_MODULUS
        self._broken = False

    def _open_for_write(self) -> None:
        """Open an existing file to continue it (a write without a load); a file that is missing
        or holds no valid slot is left closed, so the write creates a new one."""
        try:
            found = self.open()
        except (OSError, SlotFileError):
            found = None
        if found is None or not found.valid:
            self.close()

    def _adopt(self, fd: int, slot_size: int) -> None:
        self.close()
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)
        self._slot_size = slot_size
        self._current = None

    def close(self) -> None:
        """Close the descriptor (a later write opens the file again)."""
        if self._closer is not None:
            self._closer()
        self._closer = None
        self._fd = None
        self._slot_size = 0
        self._current = None
