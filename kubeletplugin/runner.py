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

:class:`FakeRunner` records commands and answers from a script; tests and the mock backend use it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class RecordedCall:
    """One command a :class:`FakeRunner` was asked to run."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        """``(command, *args)``: what the call would run."""
        return (self.command, *self.args)


#: A scripted answer: a fixed result, or a function of the call.
Answer = CommandResult | Callable[[RecordedCall], CommandResult]


@dataclass
class _Rule:
    command: str
    prefix: tuple[str, ...]
    stdin: str | None
    answer: Answer
    once: bool


#: How many calls a :class:`FakeRunner` remembers: the mock backend runs one for the daemon's
#: whole life, so its record is bounded (tests look at far fewer).
FAKE_RUNNER_HISTORY: Final = 1000


class FakeRunner:
    """Records the last ``history`` commands and answers from scripted rules (thread-safe).

    A call is answered by the most recently added rule whose command matches, whose ``prefix``
    starts the argument list and whose ``stdin`` (when given) equals the call's stdin; ``once``
    rules are used up by their first match. Unmatched calls succeed with empty output. A rule
    answering with a non-zero exit code raises :class:`CommandError` when ``check`` is true,
    exactly as :class:`HostRunner` does.
    """

    def __init__(self, history: int = FAKE_RUNNER_HISTORY) -> None:
        #: The most recent calls, oldest first (at most ``history``).
        self.calls: deque[RecordedCall] = deque(maxlen=history)
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()

    def on(
        self,
        command: str,
        *prefix: str,
        stdin: str | None = None,
        stdout: str = "",
        stderr: str = "",
        returncode: int = 0,
        answer: Callable[[RecordedCall], CommandResult] | None = None,
        once: bool = False,
    ) -> None:
        """Script the answer to calls of ``command`` whose arguments start with ``prefix``."""
        result: Answer = (
            answer
            if answer is not None
            else CommandResult((command, *prefix), returncode, stdout, stderr)
        )
        with self._lock:
            self._rules.append(_Rule(command, tuple(prefix), stdin, result, once))

    def argvs(self) -> list[tuple[str, ...]]:
        """The recorded calls as ``(command, *args)`` tuples, in order."""
        with self._lock:
            return [c.argv for c in self.calls]

    def clear(self) -> None:
        """Forget the recorded calls (the rules stay)."""
        with self._lock:
            self.calls.clear()

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
        call = RecordedCall(command, tuple(args), dict(env or {}), stdin)
        with self._lock:
            self.calls.append(call)
            rule = self._match(call)
        if rule is None:
            result = CommandResult(call.argv, 0)
        elif callable(rule.answer):
            result = rule.answer(call)
        else:
            result = CommandResult(
                call.argv, rule.answer.returncode, rule.answer.stdout, rule.answer.stderr
            )
        if check and result.returncode != 0:
            raise CommandError(
                call.argv,
                f"exit code {result.returncode}",
                returncode=result.returncode,
                stderr=result.stderr or result.stdout,
            )
        return result

    def _match(self, call: RecordedCall) -> _Rule | None:
        for i in range(len(self._rules) - 1, -1, -1):
            rule = self._rules[i]
            if rule.command != call.command or call.args[: len(rule.prefix)] != rule.prefix:
                continue
            if rule.stdin is not None and rule.stdin != call.stdin:
                continue
            if rule.once:
                del self._rules[i]
            return rule
        return None
