"""The real plugin process with kill points by event, not by time, started by a fork server.

``python -m tests.kubeletplugin.prepare.crashpoints ROOT`` is a fork server: it imports the node
daemon once, then, for each ``start LOG FLAGS-JSON`` line on its standard input, forks a process
that runs ``kubeletplugin.main`` with those flags (output to ``LOG``) and answers its pid; a
restart after a kill then costs the daemon's start, not the interpreter's and the imports'.
``poll PID`` answers ``running`` or the exit status of a child (negative: the signal), ``wait
PID`` waits for it first. The children are real processes: SIGKILL ends them as it ends the
daemon on a node. The server holds no thread, channel or server of gRPC when it forks.

In a child, its *steps* are numbered: a kubelet call received, every call that changes a file
under ``ROOT`` (``os.pwrite``, ``os.fsync``, ``os.fdatasync``, ``os.replace``, ``os.rename``,
``os.unlink``: the checkpoint's slots, the CDI spec files, the mock MIG state, the MPS stand-in's
files), and the answer about to be sent. A step is named by what it does and to which file
(``replace:cdi/claim-spec``; a rename by its destination), and counted by name: kubelet makes
one call at a time, so a call makes the same steps, the same number of times each, on every run
and machine. (Their order is not always the same: a prepare writes its spec file and its
checkpoint record concurrently.)

A test arms a kill by writing ``ROOT/crash-arm`` (``"<generation> <step> <k>"``, replaced
atomically): the child kills itself with SIGKILL just before its ``k``-th step named ``step``
since it first saw that generation (``-`` as the step: never). Without the file nothing is killed.
Every step is appended to ``ROOT/crash-trace`` (``"<generation> <step>"``, ``-`` as the generation
when unarmed), so the test knows the steps of each call and which one a kill landed on. The
control files are not steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

ARM_FILE: Final = "crash-arm"
TRACE_FILE: Final = "crash-trace"
#: The file-changing calls that are steps; the first argument is a path or a descriptor.
PATH_CALLS: Final = ("replace", "rename", "unlink")
FD_CALLS: Final = ("pwrite", "fsync", "fdatasync")


class Stepper:
    """Counts the steps under ``root`` by name and kills the process at the armed one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.arm = root / ARM_FILE
        self.trace = root / TRACE_FILE
        self.generation: str | None = None
        self.counts: dict[str, int] = {}
        #: Steps of concurrent threads are recorded (and killed at) one at a time.
        self.lock = threading.Lock()

    def step(self, name: str) -> None:
        """Record step ``name``; SIGKILL this process first when it is the armed one."""
        with self.lock:
            try:
                generation, target, occurrence = self.arm.read_text().split()
            except (FileNotFoundError, ValueError):
                generation, target, occurrence = "-", "-", "0"
            if generation != self.generation:
                self.generation, self.counts = generation, {}
            self.counts[name] = self.counts.get(name, 0) + 1
            with self.trace.open("a") as out:  # page cache: survives the process's SIGKILL
                out.write(f"{generation} {name}\n")
            if name == target and self.counts[name] == int(occurrence):
                os.kill(os.getpid(), signal.SIGKILL)

    def watched(self, path: Any) -> str | None:
        """``path`` relative to the root when it is under it and no control file, else None."""
        try:
            text = os.fsdecode(path)
        except TypeError:
            return None
        relative = os.path.relpath(text, self.root)
        if relative.startswith("..") or relative in (ARM_FILE, TRACE_FILE):
            return None
        return relative


#: A path component that differs between claims or runs (a share's or claim's id).
_ID = re.compile(r"^[0-9a-f]{8,}(-[0-9a-f]{4,})*$")
#: A temporary file of ``kubeletplugin.fsutil``: ``.<name>.<random>.tmp``.
_TEMP = re.compile(r"^\.(.+)\.[^.]+\.tmp$")


def _kind(relative: str) -> str:
    """The file a step changes, without the parts that differ between claims and runs (UIDs,
    share ids, the random part of temporary names): ``cdi/claim-spec``, ``data/checkpoint.dat``,
    ``cdi/.claim-spec.tmp``..."""
    relative = "/".join("<id>" if _ID.match(part) else part for part in relative.split("/"))
    head, _, name = relative.rpartition("/")
    temporary = _TEMP.match(name)
    if temporary is not None:
        name = temporary.group(1)
    if name.startswith("k8s.") and name.endswith(".json"):
        name = "claim-spec"
    if temporary is not None:
        name = f".{name}.tmp"
    return f"{head}/{name}" if head else name


def install(stepper: Stepper) -> None:
    """Wrap the file-changing calls of :mod:`os` and the DRA servicer's two calls."""
    for name in PATH_CALLS:
        original_path_call = getattr(os, name)

        def path_call(*args: Any, _name: str = name, _call: Any = original_path_call) -> Any:
            # A rename is named by the file it changes: its destination.
            relative = stepper.watched(args[1] if _name in ("replace", "rename") else args[0])
            if relative is not None:
                stepper.step(f"{_name}:{_kind(relative)}")
            return _call(*args)

        setattr(os, name, path_call)
    for name in FD_CALLS:
        original_fd_call = getattr(os, name)

        def fd_call(*args: Any, _name: str = name, _call: Any = original_fd_call) -> Any:
            try:
                target = os.readlink(f"/proc/self/fd/{args[0]}")
            except OSError:
                target = ""
            relative = stepper.watched(target) if target else None
            if relative is not None:
                stepper.step(f"{_name}:{_kind(relative)}")
            return _call(*args)

        setattr(os, name, fd_call)

    from kubeletplugin.kubelet.draservice import _DraServicer

    for method in ("NodePrepareResources", "NodeUnprepareResources"):
        original_method = getattr(_DraServicer, method)

        def handler(
            self: Any, request: Any, context: Any, _m: str = method, _call: Any = original_method
        ) -> Any:
            stepper.step(f"{_m}:received")
            response = _call(self, request, context)
            stepper.step(f"{_m}:answering")
            return response

        setattr(_DraServicer, method, handler)


def _child(log: str, flags: Sequence[str]) -> None:
    """In the forked child: output to ``log``, run the daemon, exit with its status."""
    code = 1
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        from kubeletplugin.main import main as plugin_main

        code = plugin_main(list(flags))
    except BaseException as exc:  # the child never returns into the server's loop
        print(f"crashpoints child: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _status(status: int) -> int:
    """A wait status as Popen's returncode: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(root: Path) -> int:
    """The fork server's loop (see the module text); ends at the end of its input."""
    install(Stepper(root))
    import kubeletplugin.main  # noqa: F401  (imported once, before any fork)

    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "start":
            log, _, flags = rest.partition(" ")
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(log, json.loads(flags))
            answer = str(pid)
        elif command in ("poll", "wait"):
            pid = int(rest)
            done, status = os.waitpid(pid, os.WNOHANG if command == "poll" else 0)
            answer = "running" if done == 0 else str(_status(status))
        else:
            answer = f"error: unknown command {command!r}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(Path(sys.argv[1])))
