"""A least-recently-used cache bounded by entry count and by total weight (thread-safe).

The compile cache of :mod:`sharegpu.cel.environment` keys compiled selectors by their text.
The memory a compiled selector holds grows with the length of its text (up to a few hundred
bytes per byte of expression), so a cache bounded only by its number of entries lets whoever
chooses the expressions choose its size. :class:`WeightedLru` bounds both.

Invariants, after every call returns:

- ``len(cache) <= max_entries`` and ``cache.weight <= max_weight``;
- ``cache.weight`` is the sum of the weights of the entries held;
- entries are evicted least recently used first (a hit or an insertion counts as a use);
- an entry heavier than ``max_weight`` is never held (storing it only counts as a miss later).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True)
class LruStats:
    """Counters of a :class:`WeightedLru`: lookups that hit and missed, entries held, their
    total weight, and entries evicted to stay within the bounds."""

    hits: int
    misses: int
    size: int
    weight: int
    evictions: int


class WeightedLru(Generic[V]):
    """``str`` -> ``V`` with at most ``max_entries`` entries of at most ``max_weight`` total
    weight; see the module docstring for the invariants."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        if max_entries < 1 or max_weight < 1:
            raise ValueError("a cache needs room for at least one entry of weight 1")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._weight = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held (does not count as a use)."""
        with self._lock:
            return key in self._entries

    @property
    def weight(self) -> int:
        """Total weight of the entries held."""
        with self._lock:
            return self._weight

    def get(self, key: str) -> V | None:
        """The value of ``key`` (now the most recently used), or None (a miss)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self._misses += 1
                return None
            self._hits += 1
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: str, value: V, weight: int) -> bool:
        """Hold ``value`` under ``key`` as the most recently used entry, evicting the least
        recently used ones until both bounds hold. Returns False, holding nothing new, when
        ``weight`` alone is above ``max_weight``."""
        if weight < 0:
            raise ValueError(f"negative weight {weight}")
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._weight -= previous[1]
            if weight > self.max_weight:
                return False
            self._entries[key] = (value, weight)
            self._weight += weight
            while len(self._entries) > self.max_entries or self._weight > self.max_weight:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._weight -= evicted
                self._evictions += 1
            return True

    def keys(self) -> list[str]:
        """The keys held, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._entries)

    def stats(self) -> LruStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return LruStats(
                self._hits, self._misses, len(self._entries), self._weight, self._evictions
            )

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._entries.clear()
            self._weight = self._hits = self._misses = self._evictions = 0
