"""Crash-safe file writes shared by the CDI spec writer and the checkpoint, and bounded reads of
files the host provides (procfs).

Invariant: a reader (a container runtime, the plugin after a crash) sees either the old content of
a path or the complete new content, never a partial file. Temporary files start with ``.`` and end
with ``.tmp``, so runtimes that load ``*.json`` from the same directory never pick them up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

#: The kernel's boot ID; a change means the node rebooted.
DEFAULT_BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")

TEMP_SUFFIX = ".tmp"
#: Mode of the directories the plugin creates for its sockets and state (kubelet and the plugin
#: run as root; nobody else needs to enter them).
PRIVATE_DIR_MODE = 0o750


class HostFileError(OSError):
    """A host file that cannot be used: unreadable, larger than its bound, or not ASCII text.
    The message names the file. An :class:`OSError`, so a prepare reports it as an I/O
    failure of the claim."""


#: The longest file name Linux file systems take.
_NAME_MAX = 255


def child_path(root: Path, name: str) -> Path:
    """``root / name`` where ``name`` must be one plain path component: not empty, not ``.`` or
    ``..``, no ``/`` or NUL, at most 255 bytes. Every path built from a name that came from
    outside (a checkpoint, a GPU UUID, a claim UID) goes through here, so it stays under
    ``root``; anything else raises ValueError."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\0" in name
        or len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX
    ):
        raise ValueError(f"refusing {name!r} as a file name under {root}")
    return root / name


def temp_prefix(path: Path) -> str:
    """Prefix of the temporary files :func:`atomic_write` creates for ``path``."""
    return f".{path.name}."


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically and, unless ``durable`` is False, durably.

    Temporary file in the same directory, fsync, rename over ``path``, fsync the directory.
    Without ``durable`` there is no fsync: readers, and the plugin after its own crash, still
    see the old or the complete new content, but after a power loss the file may be old, new,
    empty or gone. Only for files that the plugin's start rebuilds from a durable record.
    """
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fchmod(tmp.fileno(), mode)
            if durable:
                os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    if durable:
        fsync_dir(directory)


def atomic_create(path: Path, fill: Callable[[int], None], mode: int = 0o644) -> int:
    """:func:`atomic_write` for content written through a descriptor, which stays open.

    ``fill`` writes a temporary file in ``path``'s directory through its read-write descriptor;
    the file then gets ``mode``, is fsynced, renamed over ``path``, and the directory is fsynced.
    Returns the descriptor, now of ``path`` (the caller closes it). On any error the temporary
    file is removed and its descriptor closed.
    """
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TEMP_SUFFIX, dir=directory)
    try:
        fill(fd)
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.replace(tmp_name, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    try:
        fsync_dir(directory)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_durably(path: Path) -> bool:
    """Remove ``path`` if it exists and fsync its directory; returns whether it existed."""
    if not remove_if_present(path):
        return False
    fsync_dir(path.parent)
    return True


def remove_if_present(path: Path) -> bool:
    """Remove ``path`` if it exists, without fsync (a power loss may bring it back: only for
    files the plugin's start reconciles with a durable record); returns whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry change (create, rename, unlink) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(directory: Path, name_prefix: str) -> list[Path]:
    """Remove temporary files left by an interrupted :func:`atomic_write` of files whose names
    start with ``name_prefix``; returns the removed paths."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        name = entry.name
        if name.startswith("." + name_prefix) and name.endswith(TEMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(entry)
    return removed


def make_private_dirs(directory: Path, mode: int = PRIVATE_DIR_MODE) -> None:
    """Create ``directory`` and its missing parents with exactly ``mode`` (not filtered by the
    umask); directories that already exist (such as kubelet's) are left as they are. Raises
    NotADirectoryError when something other than a directory is in the way."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    if not current.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(current))
    for created in reversed(missing):
        try:
            created.mkdir(mode=mode)
        except FileExistsError:
            if not created.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(created)
                ) from None
            continue
        # mkdir's mode is filtered by the umask; set it exactly.
        os.chmod(created, mode)


def read_bounded(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """At most ``limit`` bytes of ``path``, opened non-blocking (a FIFO in the way cannot hang
    the reader) and, unless ``follow``, not through a final symbolic link (raises OSError)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_host_text(path: Path, limit: int) -> str:
    """The whole of host file ``path`` as ASCII text (procfs files are), read in one bounded
    call: :class:`HostFileError` naming the file when it cannot be read, holds more than
    ``limit`` bytes (never truncated to fit) or bytes that are not ASCII."""
    try:
        data = read_bounded(path, limit + 1)
    except OSError as exc:
        raise HostFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise HostFileError(f"{path} is larger than {limit} bytes; refusing it")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise HostFileError(f"{path} is not ASCII text (byte {exc.start})") from None
