"""Bounds the selector compiles of the admission webhook.

Compiling a new CEL selector costs CPU and memory in proportion to its length (about 0.1 ms and
a few hundred bytes per byte); each object may bring up to
:data:`sharegpu.admission.checks.MAX_SELECTOR_BYTES_PER_OBJECT` bytes of new selectors. Reviews
whose checks only read compiled (cached) selectors pass straight through; the others take one of
``slots`` slots, waiting at most ``wait_s`` for one. A review that gets no slot in time is not
checked: the webhook answers "allowed, not checked" with a warning, well within the API server's
timeout (the chart's ``timeoutSeconds``), as Kubernetes would have admitted the object anyway.

Invariants: at most ``slots`` compiling checks run at once (so at most ``slots`` objects' worth
of compile memory is live beside the bounded compile cache); a review waits at most ``wait_s``
for a slot; a check that needs no compile never waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

#: Compiling checks that run at once by default.
DEFAULT_SLOTS: Final = 2
#: Seconds a review waits for a slot by default (the chart's webhook timeout is 5 s; a check
#: of a full compile budget takes up to about 2 s more).
DEFAULT_WAIT_S: Final = 1.5


class CompileGate:
    """At most ``slots`` compiling checks at once (module text); thread-safe."""

    def __init__(self, slots: int = DEFAULT_SLOTS, wait_s: float = DEFAULT_WAIT_S) -> None:
        if slots < 1 or wait_s < 0:
            raise ValueError(f"a compile gate needs a slot and a wait >= 0 (got {slots}, {wait_s})")
        self.slots = slots
        self.wait_s = wait_s
        self._free = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        #: Checks that found no slot in time (answered "not checked").
        self.turned_away = 0

    def run(self, compiles: bool, check: Callable[[], T]) -> T | None:
        """``check()`` at once when it ``compiles`` nothing, else in a slot; None when no slot
        came free within ``wait_s`` (the check did not run)."""
        if not compiles:
            return check()
        if not self._free.acquire(timeout=self.wait_s):
            with self._lock:
                self.turned_away += 1
            return None
        try:
            return check()
        finally:
            self._free.release()
