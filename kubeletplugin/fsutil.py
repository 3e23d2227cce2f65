"""Crash-safe file writes shared by the CDI spec writer and the checkpoint.

Invariant: a reader (a container runtime, the plugin after a crash) sees either the old content of
a path or the complete new content, never a partial file. Temporary files start with ``.`` and end
with ``.tmp``, so runtimes that load ``*.json`` from the same directory never pick them up.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_prefix(path: Path) -> str:
    """Prefix of the temporary files :func:`atomic_write` creates for ``path``."""
    return f".{path.name}."


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably.

    Temporary file in the same directory, fsync, rename over ``path``, fsync the directory.
    """
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fchmod(tmp.fileno(), mode)
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    fsync_dir(directory)


def remove_durably(path: Path) -> bool:
    """Remove ``path`` if it exists and fsync its directory; returns whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
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
