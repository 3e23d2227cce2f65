"""The shared-memory directory of one MPS daemon: a size-bounded tmpfs, not the host's ``/run``.

A daemon's ``shm`` directory is ``/dev/shm`` of the daemon and of its claim's clients. On a real
node :class:`TmpfsMounter` mounts a tmpfs of at most ``size`` bytes there (``nosuid``, ``nodev``,
``noexec``, mode ``1777``), so one claim's clients can neither fill the host's ``/run`` nor read
another claim's files; the plugin's MPS root is mounted with bidirectional propagation so the
daemon pod and the clients see the mount. :class:`PlainDirectory` leaves the directory as it is
(the mock backend and tests, which cannot mount).

Invariants: ``mount`` on a directory that is already a mount point changes nothing (a restarted
plugin adopts it); ``unmount`` of a directory that is no mount point succeeds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Final, Protocol

#: Default bound of one daemon's shm tmpfs.
DEFAULT_SHM_BYTES: Final = 256 * 1024 * 1024
_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_MS_NOEXEC: Final = 8
_MNT_DETACH: Final = 2


class ShmMounter(Protocol):
    def mount(self, directory: Path, size: int) -> None:
        """Make ``directory`` (which exists) a tmpfs of at most ``size`` bytes; OSError."""
        ...

    def unmount(self, directory: Path) -> None:
        """Undo :meth:`mount` (lazily: open files keep the memory until closed); OSError."""
        ...


class PlainDirectory:
    """Leaves the directory as it is (no mount): the mock backend and tests."""

    def mount(self, directory: Path, size: int) -> None:
        return None

    def unmount(self, directory: Path) -> None:
        return None


class TmpfsMounter:
    """Mounts with ``mount(2)`` (needs CAP_SYS_ADMIN in the host's mount namespace)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def mount(self, directory: Path, size: int) -> None:
        if os.path.ismount(directory):
            return
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        options = f"size={size},mode=1777".encode()
        if self._libc.mount(b"tmpfs", os.fsencode(directory), b"tmpfs", flags, options) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot mount a tmpfs at {directory}: {os.strerror(err)}")

    def unmount(self, directory: Path) -> None:
        if not os.path.ismount(directory):
            return
        if self._libc.umount2(os.fsencode(directory), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot unmount {directory}: {os.strerror(err)}")
