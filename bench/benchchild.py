"""Child processes for the bench scripts: a script re-run with other arguments, each measured
server in its own interpreter as on a node.

A module of bench/ (the scripts run as ``python bench/<name>.py``, so this directory is on the
path).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def bench_child(
    script: str | Path,
    args: list[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """``script`` run by this interpreter with ``args`` in a child process, its standard input
    and output piped (text). The child must stop when its standard input closes: on exit that
    is closed, and the child is killed if it has not exited 30 s later."""
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
