"""Bounds the selector compiles of the admission webhook, fairly between requesting users.

Compiling a new CEL selector costs CPU and memory in proportion to its length (about 0.1 ms and
a few hundred bytes per byte); each object may bring up to
:data:`sharegpu.admission.checks.MAX_SELECTOR_BYTES_PER_OBJECT` bytes of new selectors. Reviews
whose checks only read compiled (cached) selectors pass straight through; the others take one of
``slots`` slots. Each requesting user (the review's ``request.userInfo.username`` when the API
server is known to have sent it, else the client's address: :mod:`controller.webhook`) runs at
most ``per_user`` compiles at once and queues at most ``queue_per_user`` more; a free slot goes
to the next user in turn (round robin over the users that wait), so a user flooding heavy
selectors only ever waits behind itself. A review that gets no slot within ``wait_s``, or finds
its user's queue full, is not checked: the webhook answers "allowed, not checked" with a
warning, well within the API server's timeout (the chart's ``timeoutSeconds``), as Kubernetes
would have admitted the object anyway.

Invariants: at most ``slots`` compiling checks run at once (so at most ``slots`` objects' worth
of compile memory is live beside the bounded compile cache), at most ``per_user`` of one user;
at most ``queue_per_user`` reviews of one user wait, each at most ``wait_s``; a review whose
user's queue is full returns at once; a check that needs no compile never waits; one user's
reviews, running or queued, never keep another user's review from the next free slot.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

#: Compiling checks that run at once by default.
DEFAULT_SLOTS: Final = 2
#: Seconds a review waits for a slot by default (the chart's webhook timeout is 5 s; a check
#: of a full compile budget takes up to about 2 s more).
DEFAULT_WAIT_S: Final = 1.5
#: Compiling checks of one user that run at once by default (the other slot stays for others).
DEFAULT_PER_USER: Final = 1
#: Reviews of one user that wait for a slot by default; more are answered "not checked" at once.
DEFAULT_QUEUE_PER_USER: Final = 8


class CompileGate:
    """At most ``slots`` compiling checks at once, shared fairly by users (module text);
    thread-safe."""

    def __init__(
        self,
        slots: int = DEFAULT_SLOTS,
        wait_s: float = DEFAULT_WAIT_S,
        per_user: int = DEFAULT_PER_USER,
        queue_per_user: int = DEFAULT_QUEUE_PER_USER,
    ) -> None:
        if slots < 1 or wait_s < 0 or per_user < 1 or queue_per_user < 0:
            raise ValueError(
                "a compile gate needs a slot, a wait >= 0, a slot per user and a queue >= 0 "
                f"(got slots={slots}, wait_s={wait_s}, per_user={per_user}, "
                f"queue_per_user={queue_per_user})"
            )
        self.slots = slots
        self.wait_s = wait_s
        self.per_user = min(per_user, slots)
        self.queue_per_user = queue_per_user
        self._lock = threading.Lock()
        self._free = slots
        #: Compiling checks running, per user (users with none are left out).
        self._running: dict[str, int] = {}
        #: Reviews waiting for a slot, per user, oldest first (users with none are left out).
        self._waiting: dict[str, deque[threading.Event]] = {}
        #: The users that wait, in the order they get the next free slot.
        self._turn: deque[str] = deque()
        #: Checks that found no slot in time or a full queue (answered "not checked").
        self.turned_away = 0

    def running(self, user: str) -> int:
        """Compiling checks of ``user`` running now."""
        with self._lock:
            return self._running.get(user, 0)

    def waiting(self, user: str) -> int:
        """Reviews of ``user`` waiting for a slot now."""
        with self._lock:
            return len(self._waiting.get(user, ()))

    def run(self, compiles: bool, check: Callable[[], T], user: str = "") -> T | None:
        """``check()`` at once when it ``compiles`` nothing, else in a slot of ``user``'s; None
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
            if len(queue or ()) >= self.queue_per_user:
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
