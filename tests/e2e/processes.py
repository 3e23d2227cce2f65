"""Child processes of the end-to-end run, each logging to its own file and stopped by its PID.

A failure anywhere is reported as :class:`StepFailed`: the step, the command and the last lines
of the log that explains it, so a red run says what broke without digging through files.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from tests.helpers import eventually

#: Lines of a log quoted in a failure.
LOG_TAIL_LINES = 40


class StepFailed(AssertionError):
    """A step of the run failed; the message names the step, the command and a log tail."""


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` (empty when there is no such file)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64 * 1024))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def failure(step: str, command: Sequence[str] | str, detail: str, log: Path | None = None) -> str:
    """The message of a failed step: what ran, what it said and the end of the relevant log."""
    shown = command if isinstance(command, str) else " ".join(command)
    message = f"step {step!r} failed\n  command: {shown}\n  {detail.strip()}"
    tail = log_tail(log)
    if tail:
        message += f"\n  last lines of {log}:\n" + "\n".join(
            "    " + ln for ln in tail.splitlines()
        )
    return message


@contextlib.contextmanager
def step(name: str, command: Sequence[str] | str = "", log: Path | None = None) -> Iterator[None]:
    """Run a block as the named step: an assertion or error inside becomes :class:`StepFailed`."""
    try:
        yield
    except StepFailed:
        raise
    except Exception as exc:
        raise StepFailed(failure(name, command, f"{type(exc).__name__}: {exc}", log)) from exc


class Process:
    """One started child: its command, log file and :class:`subprocess.Popen`."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._log_file = log.open("ab")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        except OSError:
            self._log_file.close()
            raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def check_running(self, step_name: str) -> None:
        """Fail the step when the process has exited."""
        code = self.popen.poll()
        if code is not None:
            raise StepFailed(
                failure(step_name, self.argv, f"{self.name} exited with code {code}", self.log)
            )

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to this PID, SIGKILL after ``grace_s``; idempotent."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(grace_s)
        self._log_file.close()


class Processes:
    """The children of one run, stopped in reverse start order by :meth:`stop_all`."""

    def __init__(
        self,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        wrap: Callable[[Sequence[str]], list[str]] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.env = dict(os.environ if env is None else env)
        #: Applied to every command line (the sealed namespace's ``nsenter``).
        self.wrap = wrap
        self.started: list[Process] = []

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Process:
        argv = self.wrap(argv) if self.wrap is not None else list(argv)
        process = Process(name, argv, self.log_dir / f"{name}.log", {**self.env, **(env or {})})
        self.started.append(process)
        return process

    def stop(self, process: Process) -> None:
        process.stop()
        self.started.remove(process)

    def stop_all(self, grace_s: float = 20.0) -> None:
        for process in reversed(self.started):
            process.stop(grace_s)
        self.started.clear()


def wait_until(
    condition: Callable[[], bool],
    step_name: str,
    what: str,
    *,
    process: Process | None = None,
    deadline_s: float = 180.0,
    interval_s: float = 0.5,
) -> None:
    """Poll ``condition`` until it holds; fail the step (with the process's log) at the deadline
    or as soon as ``process`` exits."""
    last_error = ""

    def holds() -> bool:
        nonlocal last_error
        if process is not None:
            process.check_running(step_name)
        try:
            return bool(condition())
        except Exception as exc:
            last_error = f" (last error: {type(exc).__name__}: {exc})"
            return False

    try:
        eventually(holds, what, timeout_s=deadline_s, interval_s=interval_s)
    except StepFailed:  # the process exited
        raise
    except AssertionError:
        raise StepFailed(
            failure(
                step_name,
                process.argv if process is not None else what,
                f"{what} not reached within {deadline_s:.0f}s{last_error}",
                process.log if process is not None else None,
            )
        ) from None


#: An API server's 403 in a log line: the status code or the word, never the milliseconds of a
#: log timestamp (``10:32:01,403``) or part of a longer number.
_FORBIDDEN = re.compile(r"(?<![\d,.:])403(?!\d)|[Ff]orbidden")


def forbidden_lines(text: str) -> list[str]:
    """The lines of ``text`` that show a 403 (Forbidden) answer."""
    return [line for line in text.splitlines() if _FORBIDDEN.search(line)]


def assert_no_forbidden(process: Process, step_name: str) -> None:
    """Fail the step when ``process`` has exited or its log shows a 403 (Forbidden) answer of the
    API server, quoting the first such line."""
    process.check_running(step_name)
    text = process.log.read_text(errors="replace")
    forbidden = forbidden_lines(text)
    if forbidden:
        raise StepFailed(
            failure(
                step_name,
                process.argv,
                f"the API server refused {process.name}: {forbidden[0]}",
                process.log,
            )
        )


def interrupt_on_signals() -> None:
    """Make the first SIGINT or SIGTERM end the run like Ctrl-C (KeyboardInterrupt) and ignore
    later ones, so that a second signal cannot cut the cleanup short and leave processes and
    mounts behind (SIGINT is ignored in a background job, SIGTERM is what ``kill`` sends)."""

    def interrupt(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
