"""A :class:`~kubeletplugin.runner.Runner` that records commands and answers from a script.

The simulated host runs the simulated NVIDIA tools through it
(:meth:`~kubeletplugin.hosts.simtools.SimulatedNvidiaTools.install`); tests script it directly.
It never starts a process.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from kubeletplugin.runner import CommandError, CommandResult


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


#: How many calls a :class:`FakeRunner` remembers: the simulated host runs one for the daemon's
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
