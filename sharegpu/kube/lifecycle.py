"""The one daemon lifecycle of both daemons: components started in order, stopped in reverse,
run until SIGTERM or SIGINT.

Invariants:

- components start in the order they were added; :meth:`Lifecycle.start` returns once every one
  runs, or, when one fails, stops those already running (reverse order) and re-raises;
- :meth:`Lifecycle.stop` stops every running component in reverse start order, is idempotent and
  never raises (a failing stop is logged, the others still stop);
- things that run from the moment they are made (an HTTP server, an API client to close) join
  with :meth:`Lifecycle.running`, in the order they came up, so they stop in reverse too.

Both daemons rely on the reverse order: the node plugin stops its gRPC server before the state
module it calls; the controller stops the tracker (and its writes) before it releases its Lease.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)

#: How often :meth:`Lifecycle.run` wakes while it waits for a stop request.
WAIT_SLICE_S = 1.0


class Component(Protocol):
    """A part of a running daemon. ``start`` returns once it runs; ``stop`` is idempotent."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class _Running:
    """Something already running that only needs stopping."""

    name: str
    stop_fn: Callable[[], None]

    def start(self) -> None:
        return None

    def stop(self) -> None:
        self.stop_fn()


def _name(component: Component) -> str:
    return component.name if isinstance(component, _Running) else type(component).__name__


class Lifecycle:
    """Ordered start and reverse stop of a daemon's components (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: list[Component] = []
        self._started: list[Component] = []
        self._lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._starting = False

    def add(self, component: Component) -> None:
        """Start ``component`` with the others (call before :meth:`start`)."""
        with self._lock:
            if self._starting:
                raise RuntimeError("components must be added before the daemon starts")
            self._pending.append(component)

    def running(self, name: str, stop: Callable[[], None]) -> None:
        """Record something that already runs; ``stop`` is called in reverse order."""
        with self._lock:
            self._started.append(_Running(name, stop))

    def start(self) -> None:
        """Start the added components in order; on a failure, stop every running one."""
        with self._lock:
            self._starting = True
            pending, self._pending = self._pending, []
            for component in pending:
                try:
                    component.start()
                except BaseException:
                    self._stop_locked()
                    raise
                self._started.append(component)

    def stop(self) -> None:
        """Stop every running component in reverse start order (idempotent, never raises)."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        while self._started:
            component = self._started.pop()
            try:
                component.stop()
            except Exception:
                log.exception("stopping %s failed", _name(component))

    def request_stop(self) -> None:
        """Ask :meth:`run` to return (safe from signal handlers and other threads)."""
        self._stop_requested.set()

    def run(
        self,
        on_started: Callable[[], None] | None = None,
        *,
        start: Callable[[], None] | None = None,
    ) -> None:
        """Start (``start``, default :meth:`start`), call ``on_started``, wait for SIGTERM or
        SIGINT (or :meth:`request_stop`), stop.

        Exceptions of starting propagate after everything is stopped. Signal handlers are
        installed only from the main thread and restored on return.
        """

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            self.request_stop()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            (start or self.start)()
            if on_started is not None:
                on_started()
            while not self._stop_requested.wait(WAIT_SLICE_S):
                pass
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
