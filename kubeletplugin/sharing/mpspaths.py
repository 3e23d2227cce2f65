"""Where the MPS control daemon of one claim on one GPU keeps its files on the host, and the
socket-length rule.

Per daemon the plugin owns ``<root>/<daemon id>/{pipe,shm,log}`` on the host (``<root>`` is the
chart's ``/run/sharegpu/mps``): ``pipe`` holds the daemon's unix sockets and pid file, ``shm`` is
mounted at ``/dev/shm`` in the daemon and in the claim's clients on that GPU, ``log`` holds the
daemon's logs and is never given to clients.

Invariants:

- the daemon id is a function of the claim UID and the GPU UUID alone (the first
  :data:`DAEMON_ID_LENGTH` hex digits of the SHA-256 of both), so a restarted plugin finds the
  directories and pods of the daemons it started, and two claims never share one;
- a unix socket path holds at most :data:`MAX_SOCKET_PATH` bytes; :func:`check_socket_paths` is
  the one place that checks every socket the daemon creates in a pipe directory, on the host and
  where clients see it, before anything is started.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubeletplugin.fsutil import child_path

#: ``sizeof(sockaddr_un.sun_path)`` on Linux is 108 bytes, one of which is the terminating NUL.
MAX_SOCKET_PATH: Final = 107
#: Unix sockets ``nvidia-cuda-mps-control`` creates in its pipe directory; ``control_privileged``
#: is the longest name.
DAEMON_SOCKETS: Final = ("control", "control_privileged")
#: The socket of privileged control commands (``quit``, ``set_default_*``): clients never need it.
PRIVILEGED_SOCKET: Final = "control_privileged"
SHORT_ID_LENGTH: Final = 8
#: Hex digits of a daemon id (48 bits: a collision among one node's daemons is not a concern).
DAEMON_ID_LENGTH: Final = 12
_DAEMON_ID: Final = re.compile(f"[0-9a-f]{{{DAEMON_ID_LENGTH}}}")


class MpsPathError(ValueError):
    """A pipe directory whose sockets would not fit a unix socket address."""


def short_id(name: str) -> str:
    """8 hex digits naming ``name`` (a node or GPU) in labels, stable across restarts."""
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:SHORT_ID_LENGTH]


def daemon_id(claim_uid: str, uuid: str) -> str:
    """The id of claim ``claim_uid``'s daemon on GPU ``uuid``: its directory and pod name."""
    both = f"{claim_uid}\0{uuid}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(both).hexdigest()[:DAEMON_ID_LENGTH]


def is_daemon_id(name: str) -> bool:
    """Whether ``name`` has the shape of :func:`daemon_id` (directory names found on disk)."""
    return _DAEMON_ID.fullmatch(name) is not None


@dataclass(frozen=True)
class MpsPaths:
    """The host directories of daemon ``id`` under ``root``."""

    root: Path
    id: str

    @staticmethod
    def of(root: Path, claim_uid: str, uuid: str) -> MpsPaths:
        """The directories of claim ``claim_uid``'s daemon on GPU ``uuid``."""
        return MpsPaths(root, daemon_id(claim_uid, uuid))

    @property
    def directory(self) -> Path:
        return child_path(self.root, self.id)

    @property
    def pipe(self) -> Path:
        return self.directory / "pipe"

    @property
    def shm(self) -> Path:
        return self.directory / "shm"

    @property
    def log(self) -> Path:
        return self.directory / "log"


def socket_path_problems(pipe_dir: str | Path) -> list[str]:
    """One line per socket of :data:`DAEMON_SOCKETS` under ``pipe_dir`` that is too long."""
    problems = []
    for name in DAEMON_SOCKETS:
        path = os.path.join(os.fspath(pipe_dir), name)
        size = len(os.fsencode(path))
        if size > MAX_SOCKET_PATH:
            problems.append(
                f"the MPS socket path {path} is {size} bytes; a unix socket path holds at most "
                f"{MAX_SOCKET_PATH}"
            )
    return problems


def check_socket_paths(*pipe_dirs: str | Path) -> None:
    """Raise :class:`MpsPathError` naming every socket path of the daemon (in each of
    ``pipe_dirs``: its host directory and where clients see it) that would not fit."""
    problems = [p for d in pipe_dirs for p in socket_path_problems(d)]
    if problems:
        raise MpsPathError(
            "; ".join(problems) + " (choose a shorter MPS root: kubeletPlugin.mps.hostRoot, "
            "the plugin's --mps-root)"
        )
