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

from typing import Final

from controller.fairgate import FairGate

#: Compiling checks that run at once by default.
DEFAULT_SLOTS: Final = 2
#: Seconds a review waits for a slot by default (the chart's webhook timeout is 5 s; a check
#: of a full compile budget takes up to about 2 s more).
DEFAULT_WAIT_S: Final = 1.5
#: Compiling checks of one user that run at once by default (the other slot stays for others).
DEFAULT_PER_USER: Final = 1
#: Reviews of one user that wait for a slot by default; more are answered "not checked" at once.
DEFAULT_QUEUE_PER_USER: Final = 8


class CompileGate(FairGate):
    """At most ``slots`` compiling checks at once, shared fairly by requesting users (module
    text, :class:`~controller.fairgate.FairGate`); thread-safe."""

    def __init__(
        self,
        slots: int = DEFAULT_SLOTS,
        wait_s: float = DEFAULT_WAIT_S,
        per_user: int = DEFAULT_PER_USER,
        queue_per_user: int = DEFAULT_QUEUE_PER_USER,
    ) -> None:
        super().__init__(slots, wait_s, per_user, queue_per_user)
