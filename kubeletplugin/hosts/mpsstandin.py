"""A stand-in for ``nvidia-cuda-mps-control`` that runs as a real process, for the simulated host
on a real cluster: the plugin starts it through the same MPS daemon pods a GPU node uses.

- ``-f`` runs the control daemon in the foreground for ``$CUDA_MPS_PIPE_DIRECTORY`` and the GPU
  ``$CUDA_VISIBLE_DEVICES``: it writes its pid file and listens on the unix sockets ``control``
  (read commands, any user) and ``control_privileged`` (every command, owner only) of the pipe
  directory, with the command semantics of
  :class:`~kubeletplugin.hosts.simtools.SimulatedNvidiaTools`. ``quit`` or SIGTERM end it and
  remove its files. It logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log``.
- without arguments it is the client: it sends its standard input to the daemon, prints the
  answer and exits with the daemon's code (1 and ``Cannot find MPS control daemon process`` when
  none answers), as the real tool does.
- ``--install DIR`` writes ``DIR/usr/bin/nvidia-cuda-mps-control``, a script running this
  module, so the daemon pod and its hooks find the tool where a driver's would be.

Invariants: a request is at most :data:`MAX_REQUEST` bytes and is read within
:data:`IO_TIMEOUT_S`; the daemon never follows a symlink in the pipe directory (it removes what
is there before binding) and writes nothing outside its pipe and log directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from kubeletplugin.hosts.fakerunner import RecordedCall
from kubeletplugin.hosts.simtools import PID_FILE, SimulatedNvidiaTools
from kubeletplugin.runner import MPS_CONTROL, CommandResult
from kubeletplugin.sharing.mps import DEFAULTS_ENV
from kubeletplugin.sharing.mpspaths import PRIVILEGED_SOCKET

#: The socket of read commands.
CONTROL_SOCKET: Final = "control"
#: Commands any user may send through :data:`CONTROL_SOCKET`.
READ_COMMANDS: Final = frozenset({"get_server_list", "get_default_active_thread_percentage"})
#: Bytes of one request or answer.
MAX_REQUEST: Final = 64 * 1024
#: Seconds to read a request or an answer.
IO_TIMEOUT_S: Final = 5.0
#: The pipe directory the real tool uses without ``CUDA_MPS_PIPE_DIRECTORY``.
DEFAULT_PIPE: Final = "/tmp/nvidia-mps"
NO_DAEMON: Final = "Cannot find MPS control daemon process\n"
TOOL: Final = "nvidia-cuda-mps-control"
#: This module, as ``python -m`` runs it.
MODULE: Final = "kubeletplugin.hosts.mpsstandin"


def socket_for(commands: str) -> str:
    """The socket a client sends ``commands`` through: the privileged one unless every command
    is a read."""
    words = [line.split()[0] for line in commands.splitlines() if line.split()]
    return CONTROL_SOCKET if words and set(words) <= READ_COMMANDS else PRIVILEGED_SOCKET


def _read_bounded(conn: socket.socket) -> bytes:
    """Everything the peer sends until it shuts down writing; ValueError past the bound."""
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + IO_TIMEOUT_S
    while True:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = conn.recv(8192)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_REQUEST:
            raise ValueError(f"more than {MAX_REQUEST} bytes")
        chunks.append(chunk)


def send(pipe: Path, commands: str) -> CommandResult:
    """Send ``commands`` to the daemon of ``pipe`` and return its answer (the client side, also
    used in-process by the plugin)."""
    argv = (TOOL,)
    path = pipe / socket_for(commands)
    data = commands.encode()
    if len(data) > MAX_REQUEST:
        return CommandResult(argv, 1, "", f"request of more than {MAX_REQUEST} bytes\n")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(IO_TIMEOUT_S)
            conn.connect(str(path))
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            raw = _read_bounded(conn)
    except (OSError, ValueError):
        return CommandResult(argv, 1, NO_DAEMON)
    try:
        answer = json.loads(raw)
        return CommandResult(
            argv, int(answer["returncode"]), str(answer["stdout"]), str(answer["stderr"])
        )
    except (ValueError, KeyError, TypeError):
        return CommandResult(argv, 1, "", "the daemon's answer is not understood\n")


class StandinDaemon:
    """The control daemon of one pipe directory (see the module docstring)."""

    def __init__(self, pipe: Path, uuid: str, env: Mapping[str, str], log_dir: Path | None) -> None:
        self.pipe = pipe
        self.uuid = uuid
        self.log_dir = log_dir
        self.tools = SimulatedNvidiaTools(daemon_pid=os.getpid())
        # The daemon pod's start hook runs the commands of DEFAULTS_ENV; the stand-in leaves them
        # to the hook, as the real daemon does.
        self._env = {k: v for k, v in env.items() if k != DEFAULTS_ENV}
        self._listeners: dict[str, socket.socket] = {}
        self.running = False

    def log(self, message: str) -> None:
        if self.log_dir is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        with contextlib.suppress(OSError), (self.log_dir / "control.log").open("a") as out:
            out.write(f"[{stamp}] {message}\n")

    def start(self) -> None:
        """Write the pid file and listen on both sockets; RuntimeError when a daemon of this
        GPU cannot start (not in DEFAULT compute mode)."""
        self.pipe.mkdir(parents=True, exist_ok=True)
        for name, mode in ((CONTROL_SOCKET, 0o666), (PRIVILEGED_SOCKET, 0o600)):
            path = self.pipe / name
            path.unlink(missing_ok=True)  # a stale socket, or anything planted there
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            os.chmod(path, mode)
            listener.listen(16)
            self._listeners[name] = listener
        if not self.tools.start_daemon(str(self.pipe), self.uuid, self._env, placeholders=False):
            raise RuntimeError(f"cannot start the MPS control daemon of GPU {self.uuid}")
        self.running = True
        self.log(f"Startup (GPU {self.uuid}, pid {os.getpid()})")

    def answer(self, socket_name: str, commands: str) -> CommandResult:
        """The daemon's answer to ``commands`` received on ``socket_name``."""
        if socket_name == CONTROL_SOCKET and socket_for(commands) != CONTROL_SOCKET:
            return CommandResult((TOOL,), 1, "", "this command needs the privileged socket\n")
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe)}
        returncode, out, err = 0, [], []
        # One command per line, each answered in turn, as the real tool reads its input.
        for line in (line for line in commands.splitlines() if line.strip()):
            call = RecordedCall(MPS_CONTROL, (), env, line + "\n")
            result = self.tools.answer_mps_control(call)
            self.log(f"{line.strip()!r} -> exit {result.returncode}")
            returncode = returncode or result.returncode
            out.append(result.stdout)
            err.append(result.stderr)
            if str(self.pipe) not in self.tools.daemons:
                self.running = False  # quit
                break
        return CommandResult((TOOL,), returncode, "".join(out), "".join(err))

    def serve_one(self, socket_name: str) -> None:
        conn, _ = self._listeners[socket_name].accept()
        with conn:
            try:
                commands = _read_bounded(conn).decode()
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                self.log(f"dropped a request: {exc}")
                return
            result = self.answer(socket_name, commands)
            reply = {"returncode": result.returncode, "stdout": result.stdout}
            reply["stderr"] = result.stderr
            with contextlib.suppress(OSError):
                conn.settimeout(IO_TIMEOUT_S)
                conn.sendall(json.dumps(reply).encode())

    def serve(self) -> None:
        """Answer requests until ``quit`` or :meth:`stop`."""
        with selectors.DefaultSelector() as sel:
            for name, listener in self._listeners.items():
                sel.register(listener, selectors.EVENT_READ, name)
            while self.running:
                for key, _ in sel.select(timeout=0.5):
                    self.serve_one(str(key.data))
                    if not self.running:
                        break
        self.stop()

    def stop(self) -> None:
        """End the daemon: close the sockets and remove its files."""
        self.running = False
        for listener in self._listeners.values():
            listener.close()
        self._listeners.clear()
        self.tools.end_daemon(str(self.pipe))
        for name in (CONTROL_SOCKET, PRIVILEGED_SOCKET, PID_FILE):
            (self.pipe / name).unlink(missing_ok=True)
        self.log("Shutdown")


def install(root: Path) -> Path:
    """Write ``root/usr/bin/nvidia-cuda-mps-control`` running this module with this Python."""
    target = root / "usr" / "bin" / TOOL
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f'#!/bin/sh\nexec {sys.executable} -I -m {MODULE} "$@"\n')
    target.chmod(0o755)
    return target


def run_daemon(env: Mapping[str, str]) -> int:
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE)
    log_dir = env.get("CUDA_MPS_LOG_DIRECTORY")
    uuid = env.get("CUDA_VISIBLE_DEVICES", "")
    daemon = StandinDaemon(pipe, uuid, env, Path(log_dir) if log_dir else None)
    try:
        daemon.start()
    except (OSError, RuntimeError) as exc:
        print(f"{TOOL}: {exc}", file=sys.stderr)
        return 1

    def on_term(_signum: int, _frame: object) -> None:
        daemon.running = False

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    daemon.serve()
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    if args == ["-f"]:
        return run_daemon(env)
    if len(args) == 2 and args[0] == "--install" and Path(args[1]).is_absolute():
        print(install(Path(args[1])))
        return 0
    if args:
        print(f"{TOOL}: usage: {TOOL} [-f | --install ABSOLUTE_DIR] (stand-in)", file=sys.stderr)
        return 2
    commands = sys.stdin.read(MAX_REQUEST + 1)
    result = send(Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE), commands)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
