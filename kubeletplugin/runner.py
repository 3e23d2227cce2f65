"""The one way the plugin runs external programs (``nvidia-smi``, ``nvidia-cuda-mps-control``).

Invariants:

- commands are argument lists, never a shell string;
- every run has a timeout; a program that outlives it is killed;
- binaries are looked up under the configured driver root (``/`` or e.g. ``/run/nvidia/driver``)
  in ``<root>/usr/bin`` then ``<root>/bin``, never on the plugin's own ``PATH``; with a root other
  than ``/`` the root's library directories are put first on ``LD_LIBRARY_PATH``;
- output is captured through files, not pipes, so a program that leaves a daemon behind
  (``nvidia-cuda-mps-control -d``) cannot block the caller by holding a pipe open;
- failures raise :class:`CommandError`, whose message names the command line, the exit code (or
  the timeout) and the tail of stderr.

The simulated host answers commands with :class:`~kubeletplugin.hosts.fakerunner.FakeRunner`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

#: Default seconds a command may run.
DEFAULT_TIMEOUT_S: Final = 30.0
#: Directories under the driver root searched for binaries, in order.
BINARY_DIRS: Final = ("usr/bin", "bin")
#: Library directories under a driver root other than ``/``, added to ``LD_LIBRARY_PATH`` so the
#: driver's tools find ``libnvidia-ml.so`` from the same installation.
LIBRARY_DIRS: Final = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
)
#: Characters of stderr quoted in a CommandError.
STDERR_TAIL_CHARS: Final = 400

NVIDIA_SMI: Final = "nvidia-smi"
MPS_CONTROL: Final = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandError(RuntimeError):
    """A command that could not be run, timed out or exited non-zero."""

    def __init__(
        self,
        argv: Sequence[str],
        problem: str,
        *,
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        tail = stderr.strip()[-STDERR_TAIL_CHARS:]
        message = f"{shlex.join(self.argv)}: {problem}"
        if tail:
            message += f": {tail}"
        super().__init__(message)


class Runner(Protocol):
    """Runs one external command to completion."""

    def run(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``command`` (a binary name such as ``nvidia-smi``) with ``args``.

        ``env`` is added to the plugin's environment; ``stdin`` is fed to the program.
        With ``check`` a non-zero exit raises :class:`CommandError`; without it the result
        carries the exit code. Not finding the binary or a timeout always raise.
        """
        ...


class HostRunner:
    """Runs commands on the host, binaries taken from the driver root."""

    def __init__(
        self,
        driver_root: str | Path = "/",
        *,
        default_timeout: float = DEFAULT_TIMEOUT_S,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.driver_root = Path(driver_root)
        self.default_timeout = default_timeout
        self._base_env = dict(os.environ if base_env is None else base_env)
        if self.driver_root != Path("/"):
            libs = [
                str(self.driver_root / d) for d in LIBRARY_DIRS if (self.driver_root / d).is_dir()
            ]
            inherited = self._base_env.get("LD_LIBRARY_PATH")
            if libs:
                self._base_env["LD_LIBRARY_PATH"] = ":".join(
                    [*libs, *([inherited] if inherited else [])]
                )

    def resolve(self, command: str) -> Path:
        """The executable for ``command`` under the driver root; raises CommandError if absent."""
        searched = [self.driver_root / d for d in BINARY_DIRS]
        for directory in searched:
            candidate = directory / command
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        where = ", ".join(str(d) for d in searched)
        raise CommandError([command], f"not found (searched {where})")

    def run(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> CommandResult:
        argv = [str(self.resolve(command)), *args]
        limit = self.default_timeout if timeout is None else timeout
        full_env = {**self._base_env, **(env or {})}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                completed = subprocess.run(
                    argv,
                    input=None if stdin is None else stdin.encode(),
                    stdin=subprocess.DEVNULL if stdin is None else None,
                    stdout=out,
                    stderr=err,
                    env=full_env,
                    timeout=limit,
                    check=False,
                    close_fds=True,
                )
            except subprocess.TimeoutExpired:
                err.seek(0)
                raise CommandError(
                    argv, f"timed out after {limit:g}s", stderr=_decode(err.read())
                ) from None
            except OSError as exc:
                raise CommandError(argv, f"could not be started: {exc.strerror or exc}") from None
            out.seek(0)
            err.seek(0)
            result = CommandResult(
                tuple(argv), completed.returncode, _decode(out.read()), _decode(err.read())
            )
        if check and result.returncode != 0:
            raise CommandError(
                argv,
                f"exit code {result.returncode}",
                returncode=result.returncode,
                stderr=result.stderr or result.stdout,
            )
        return result


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
