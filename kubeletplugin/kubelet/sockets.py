"""Unix-socket paths for the plugin's gRPC servers, created and removed safely.

Lifecycle of one socket path (:class:`UnixSocketPath`):

1. :meth:`~UnixSocketPath.prepare` before binding: missing parent directories are created with
   mode 0750 (existing ones, such as kubelet's plugin registry, are left as they are); a stale
   socket left by an earlier run is removed; anything else at the path is refused, never deleted.
2. The gRPC server binds ``unix:<path>``; :meth:`~UnixSocketPath.restrict` then sets mode 0600
   before the server starts listening, so no client can connect while the mode is wider.
3. :meth:`~UnixSocketPath.remove` on stop: the socket is gone, so kubelet deregisters the plugin.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kubeletplugin.fsutil import PRIVATE_DIR_MODE, make_private_dirs

log = logging.getLogger(__name__)

DIR_MODE = PRIVATE_DIR_MODE
SOCKET_MODE = 0o600
# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


class SocketPathError(RuntimeError):
    """A socket path that cannot be used; the message names the path and the reason."""


@dataclass(frozen=True)
class UnixSocketPath:
    """An absolute unix-socket path owned by one server."""

    path: Path

    def __post_init__(self) -> None:
        if not self.path.is_absolute():
            raise SocketPathError(f"socket path {self.path} must be absolute")
        size = len(os.fsencode(self.path))
        if size > MAX_SOCKET_PATH_BYTES:
            raise SocketPathError(
                f"socket path {self.path} is {size} bytes long; unix sockets allow at most "
                f"{MAX_SOCKET_PATH_BYTES}"
            )

    @property
    def address(self) -> str:
        """The gRPC address of this socket (``unix:/abs/path``)."""
        return f"unix:{self.path}"

    def prepare(self) -> None:
        """Create missing parent directories (0750) and remove a stale socket at the path."""
        _make_dirs(self.path.parent)
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise SocketPathError(f"{self.path} exists and is not a socket; refusing to replace it")
        log.info("removing stale socket %s", self.path)
        self.path.unlink(missing_ok=True)

    def restrict(self) -> None:
        """Set the bound socket's mode to 0600."""
        try:
            os.chmod(self.path, SOCKET_MODE)
        except FileNotFoundError as err:
            raise SocketPathError(f"socket {self.path} vanished after binding") from err

    def remove(self) -> None:
        """Remove the socket if it is still there (a non-socket at the path is left alone)."""
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        if stat.S_ISSOCK(mode):
            self.path.unlink(missing_ok=True)


def _make_dirs(directory: Path) -> None:
    try:
        make_private_dirs(directory, DIR_MODE)
    except NotADirectoryError as err:
        raise SocketPathError(
            f"{err.filename} is not a directory; cannot create sockets below it"
        ) from None
