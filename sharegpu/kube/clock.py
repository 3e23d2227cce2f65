"""The one time source of the daemons: the system's clocks, or a fake one in tests.

A component that takes a :class:`Clock` reads wall time with :meth:`Clock.time` (timestamps others
read: ``timeAdded``, ``lastUpdated``, ages compared with stored timestamps), measures intervals
with :meth:`Clock.monotonic`, and sleeps with :meth:`Clock.wait` (an ``Event.wait`` on that
clock), so a test can drive it through minutes of its time in milliseconds, step by step,
instead of sleeping and hoping a busy machine kept up. :func:`rfc3339` is the one way a wall
time becomes the API's seconds-precision timestamp.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Final, Protocol


def rfc3339(seconds: float) -> str:
    """Wall time ``seconds`` (since the epoch) as RFC 3339 in UTC, whole seconds (truncated),
    the form of Kubernetes' ``metav1.Time``: ``2026-01-02T03:04:05Z``."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Clock(Protocol):
    """Wall time and monotonic time in seconds, and waiting on the monotonic one."""

    def time(self) -> float:
        """Seconds since the epoch (may jump when the system's time is set)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Like ``event.wait(timeout)`` with ``timeout`` on this clock: True once ``event`` is
        set, False when ``timeout`` seconds of this clock passed first."""
        ...

    def wait_condition(self, cond: threading.Condition, timeout: float) -> bool:
        """Like ``cond.wait(timeout)`` (the caller holds ``cond``) with ``timeout`` on this
        clock: True when notified, False when the time passed. Callers re-check their state
        after it returns, as with any condition wait."""
        ...


class SystemClock:
    """The process's clocks: ``time.time`` and ``time.monotonic``."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)

    def wait_condition(self, cond: threading.Condition, timeout: float) -> bool:
        return cond.wait(timeout)


SYSTEM_CLOCK: Final = SystemClock()

#: How often a waiter on a :class:`FakeClock` looks at its event (real seconds).
_POLL_S: Final = 0.005


#: The wall time a :class:`FakeClock` starts at by default (2027-01-15T08:00:00Z).
FAKE_WALL_START: Final = 1_800_000_000.0


class FakeClock:
    """A clock that moves only when :meth:`advance` is called (tests).

    Its wall time and its monotonic time move together: :meth:`time` is always
    ``wall - start`` ahead of :meth:`monotonic`.
    :meth:`wait` returns when its event is set or when the clock was advanced past its deadline.
    :meth:`advance` returns once every waiter it woke has left :meth:`wait`, and
    :meth:`wait_for_waiters` once the driven threads wait again, so a test steps the clock one
    observed step at a time. Both bound their real waiting by ``timeout``.
    """

    def __init__(self, start: float = 1000.0, wall: float = FAKE_WALL_START) -> None:
        self._now = start
        self._wall_offset = wall - start
        self._cond = threading.Condition()
        #: Deadlines of the threads now inside :meth:`wait` (one entry per thread).
        self._deadlines: list[float] = []

    def time(self) -> float:
        with self._cond:
            return self._now + self._wall_offset

    def monotonic(self) -> float:
        with self._cond:
            return self._now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self._cond:
            deadline = self._now + timeout
            self._deadlines.append(deadline)
            self._cond.notify_all()
            try:
                while not event.is_set() and self._now < deadline:
                    self._cond.wait(_POLL_S)
                return event.is_set()
            finally:
                self._deadlines.remove(deadline)
                self._cond.notify_all()

    def wait_condition(self, cond: threading.Condition, timeout: float) -> bool:
        with self._cond:
            deadline = self._now + timeout
            self._deadlines.append(deadline)
            self._cond.notify_all()
        try:
            while self.monotonic() < deadline:
                if cond.wait(_POLL_S):
                    return True
            return False
        finally:
            with self._cond:
                self._deadlines.remove(deadline)
                self._cond.notify_all()

    def advance(self, seconds: float, timeout: float = 10.0) -> bool:
        """Move the clock forward; True once every waiter whose deadline passed has woken."""
        end = time.monotonic() + timeout
        with self._cond:
            self._now += seconds
            self._cond.notify_all()
            while any(d <= self._now for d in self._deadlines):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_for_waiters(self, count: int, timeout: float = 10.0) -> bool:
        """Block (real time, at most ``timeout``) until ``count`` threads wait on the clock."""
        end = time.monotonic() + timeout
        with self._cond:
            while len(self._deadlines) < count:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True
