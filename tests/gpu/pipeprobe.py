"""What an MPS client can do to its claim's directories, run inside an emulated container.

Usage (standalone, like :mod:`tests.gpu.cudaprobe`: it imports no project module and runs with
a bare environment as the container's UID):

- ``pipeprobe.py read PATH SECONDS [BYTES]``: open ``PATH`` for reading without blocking (a FIFO
  opens even with no writer) and read what arrives within ``SECONDS``, stopping early once
  ``BYTES`` (at most and by default :data:`MAX_BYTES`) arrived;
- ``pipeprobe.py plant DIR TARGET_DIR NAME...``: for each ``NAME``, replace ``DIR/NAME`` by a
  symlink to ``TARGET_DIR/NAME``.

Each prints one JSON line and exits 0; a usage error exits :data:`EXIT_USAGE`. ``read`` reports
``exists``, ``fifo``, ``opened``, ``error`` (the ``strerror`` of a failed open) and ``bytes`` (how
many were read) with the first :data:`HEAD_BYTES` of them; ``plant`` reports the names planted and
an error per name that could not be.
"""

from __future__ import annotations

import json
import os
import select
import stat
import sys
import time
from typing import Any, Final

#: Bytes ``read`` takes at most, and how many of them it prints.
MAX_BYTES: Final = 65536
HEAD_BYTES: Final = 512
#: How long ``read`` waits before it looks again when no writer has the FIFO open.
POLL_S: Final = 0.1
EXIT_USAGE: Final = 64


def read(path: str, seconds: float, limit: int = MAX_BYTES) -> dict[str, Any]:
    """What a reader of ``path`` gets within ``seconds``, up to ``limit`` bytes (see the module
    docstring)."""
    report: dict[str, Any] = {"path": path, "opened": False, "bytes": 0, "head": ""}
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return {**report, "exists": False, "fifo": False, "error": exc.strerror}
    report.update(exists=True, fifo=stat.S_ISFIFO(mode))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        return {**report, "error": exc.strerror}
    data = b""
    try:
        deadline = time.monotonic() + seconds
        while len(data) < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            try:
                chunk = os.read(fd, limit - len(data))
            except BlockingIOError:
                continue
            if not chunk:  # no writer has it open now: look again later
                time.sleep(POLL_S)
                continue
            data += chunk
    finally:
        os.close(fd)
    head = data[:HEAD_BYTES].decode(errors="replace")
    return {**report, "opened": True, "error": "", "bytes": len(data), "head": head}


def plant(directory: str, target_dir: str, names: list[str]) -> dict[str, Any]:
    """Replace each ``directory/name`` by a symlink to ``target_dir/name``."""
    planted: list[str] = []
    errors: dict[str, str] = {}
    for name in names:
        link = os.path.join(directory, name)
        try:
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.join(target_dir, name), link)
            planted.append(name)
        except OSError as exc:
            errors[name] = str(exc.strerror)
    return {"planted": planted, "errors": errors}


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


def _limit(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) <= MAX_BYTES else None


def main(argv: list[str]) -> int:
    seconds = _seconds(argv[3]) if len(argv) in (4, 5) and argv[1] == "read" else None
    limit = _limit(argv[4]) if len(argv) == 5 else MAX_BYTES
    if seconds is not None and limit is not None:
        report = read(argv[2], seconds, limit)
    elif len(argv) >= 5 and argv[1] == "plant":
        report = plant(argv[2], argv[3], argv[4:])
    else:
        print(__doc__, file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
