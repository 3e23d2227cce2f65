"""A fair gate: at most ``slots`` costly checks at once, shared between keys (requesting users,
client addresses) in turn.

Each key runs at most ``per_user`` checks at once and queues at most ``queue_per_user`` more
(and, with ``most_per_user``, has at most that many running and waiting together); a
free slot goes to the next key in turn (round robin over the keys that wait), so a key that
floods the gate only ever waits behind itself. A check that finds its key's queue full returns
at once without running; one that gets no slot within ``wait_s`` returns without running.

Invariants: at most ``slots`` checks run at once, at most ``per_user`` of one key; at most
``queue_per_user`` checks of one key wait, each at most ``wait_s``; a check whose key's queue is
full returns at once; a check that needs no slot never waits; one key's checks, running or
queued, never keep another key's check from the next free slot; the state kept is bounded by
the checks running or waiting (a key with none is forgotten).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class FairGate:
    """At most ``slots`` checks at once, shared fairly by keys (module text); thread-safe."""

    def __init__(
        self,
        slots: int,
        wait_s: float,
        per_user: int = 1,
        queue_per_user: int = 1,
        most_per_user: int | None = None,
    ) -> None:
        if slots < 1 or wait_s < 0 or per_user < 1 or queue_per_user < 0:
            raise ValueError(
                "a gate needs a slot, a wait >= 0, a slot per user and a queue >= 0 "
                f"(got slots={slots}, wait_s={wait_s}, per_user={per_user}, "
                f"queue_per_user={queue_per_user})"
            )
        self.slots = slots
        self.wait_s = wait_s
        self.per_user = min(per_user, slots)
        self.queue_per_user = queue_per_user
        self.most_per_user = most_per_user
        self._lock = threading.Lock()
        self._free = slots
        #: Checks running, per user (users with none are left out).
        self._running: dict[str, int] = {}
        #: Reviews waiting for a slot, per user, oldest first (users with none are left out).
        self._waiting: dict[str, deque[threading.Event]] = {}
        #: The users that wait, in the order they get the next free slot.
        self._turn: deque[str] = deque()
        #: Checks that found no slot in time or a full queue (they did not run).
        self.turned_away = 0

    def running(self, user: str) -> int:
        """Checks of ``user`` running now."""
        with self._lock:
            return self._running.get(user, 0)

    def waiting(self, user: str) -> int:
        """Reviews of ``user`` waiting for a slot now."""
        with self._lock:
            return len(self._waiting.get(user, ()))

    def run(self, compiles: bool, check: Callable[[], T], user: str = "") -> T | None:
        """``check()`` at once when it ``compiles`` nothing (needs no slot), else in a slot of
        ``user``'s; None
        when no slot came free within ``wait_s`` or ``user``'s queue was full (the check did
        not run)."""
        if not compiles:
            return check()
        if not self._enter(user):
            return None
        try:
            return check()
        finally:
            self._leave(user)

    def _enter(self, user: str) -> bool:
        with self._lock:
            if self._free > 0 and self._running.get(user, 0) < self.per_user:
                self._take(user)
                return True
            queue = self._waiting.get(user)
            waiting = len(queue or ())
            held = self._running.get(user, 0) + waiting
            most = self.most_per_user
            if waiting >= self.queue_per_user or (most is not None and held >= most):
                self.turned_away += 1
                return False
            granted = threading.Event()
            if queue is None:
                queue = self._waiting[user] = deque()
                self._turn.append(user)
            queue.append(granted)
        if granted.wait(self.wait_s):
            return True
        with self._lock:
            if granted.is_set():  # granted while the wait ended
                return True
            queue.remove(granted)
            if not queue:
                del self._waiting[user]
                self._turn.remove(user)
            self.turned_away += 1
            return False

    def _leave(self, user: str) -> None:
        with self._lock:
            left = self._running[user] - 1
            if left:
                self._running[user] = left
            else:
                del self._running[user]
            self._free += 1
            self._grant()

    def _take(self, user: str) -> None:
        """Give ``user`` a slot. Called with the lock held and a slot free."""
        self._free -= 1
        self._running[user] = self._running.get(user, 0) + 1

    def _grant(self) -> None:
        """Hand free slots to waiting users in turn. Called with the lock held."""
        while self._free > 0:
            for _ in range(len(self._turn)):
                user = self._turn[0]
                self._turn.rotate(-1)
                if self._running.get(user, 0) < self.per_user:
                    break
            else:
                return  # nobody waits, or every waiting user runs its most already
            queue = self._waiting[user]
            self._take(user)
            queue.popleft().set()
            if not queue:
                del self._waiting[user]
                self._turn.remove(user)
