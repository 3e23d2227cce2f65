"""Keeping the collector's pauses short in a process that holds a large, long-lived cache.

CPython's full collection walks every container object it tracks; with the records of 10,000
nodes and 200,000 claims that is seconds per pause. The tracker's records live until their
object changes, and are freed by reference counting then (they form no cycles), so they need no
collector at all: :class:`Freezer` moves everything allocated so far into the permanent
generation (``gc.freeze()``) after every ``every`` updates and whenever a list completes. Later
collections then scan only what was allocated since, whatever the size of the cache.

The price: a reference cycle that becomes garbage after it was frozen is never collected. The
records make none; the rare cycles elsewhere (an exception kept with its traceback) leak at most
once per freeze.
"""

from __future__ import annotations

import gc
from typing import Final

#: Weight of the updates between two freezes: enough to make the freeze itself (a list splice)
#: negligible, little enough that what a full collection scans stays below some 100,000 objects.
FREEZE_EVERY: Final = 5_000


class Freezer:
    """Calls ``gc.freeze()`` once updates of total weight ``every`` have been noted since the
    last freeze (:meth:`note`), and on :meth:`freeze`.

    Disabled (``enabled`` False), it never touches the collector. Not thread-safe: its owner
    calls it under its own lock.
    """

    def __init__(self, enabled: bool = True, every: int = FREEZE_EVERY) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1 (got {every})")
        self.enabled = enabled
        self.every = every
        self.freezes = 0
        self._pending = 0

    def note(self, weight: int = 1) -> None:
        """One update made, of ``weight`` (about the records it made, in units of one claim's:
        a slice of 8 devices weighs 9); freeze when ``every`` is reached."""
        self._pending += weight
        if self._pending >= self.every:
            self.freeze()

    def freeze(self) -> None:
        """Move every object the collector tracks now into the permanent generation."""
        self._pending = 0
        if self.enabled:
            gc.freeze()
            self.freezes += 1
