"""The compile gate shares its slots fairly between requesting users: one user's running and
queued compiles never keep another user's compile from a free slot. Checks block on events the
test sets, so every assertion is about order, never about time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from controller.checkgate import CompileGate
from tests.helpers import PATIENCE_S, eventually


class Held:
    """A check that records that it started and returns once released."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name = name
        self.order = order
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.order.append(self.name)
        self.started.set()
        assert self.release.wait(PATIENCE_S)
        return self.name


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def start(
    pool: ThreadPoolExecutor, gate: CompileGate, user: str, check: Callable[[], str]
) -> Future[str | None]:
    return pool.submit(gate.run, True, check, user)


def test_a_users_full_queue_does_not_block_another_users_compile(
    pool: ThreadPoolExecutor,
) -> None:
    """The attack: one tenant keeps its compiles running and its queue full. Its next review is
    answered "not checked" at once, and another tenant's compile takes the other slot at once:
    it never waits behind the flood (it used to wait up to 1.5 s for a slot, then go
    unchecked)."""
    gate = CompileGate(slots=2, wait_s=PATIENCE_S * 4, per_user=1, queue_per_user=2)
    order: list[str] = []
    flood = [Held(f"tenant-{i}", order) for i in range(3)]
    running = start(pool, gate, "user tenant", flood[0])
    assert flood[0].started.wait(PATIENCE_S)
    queued = [start(pool, gate, "user tenant", h) for h in flood[1:]]
    eventually(lambda: gate.waiting("user tenant") == 2)
    # The tenant's queue is full: its next review is turned away without waiting (the wait
    # is four times the test's patience, so a wait would fail the test).
    assert gate.run(True, lambda: "ran", "user tenant") is None
    assert gate.turned_away == 1
    # Another user's compile runs now, in the slot the tenant may not take.
    other = Held("victim", order)
    victim = start(pool, gate, "user victim", other)
    assert other.started.wait(PATIENCE_S)
    assert gate.running("user tenant") == 1 and gate.running("user victim") == 1
    other.release.set()
    assert victim.result(PATIENCE_S) == "victim"
    for held in flood:
        held.release.set()
    assert running.result(PATIENCE_S) == "tenant-0"
    assert [f.result(PATIENCE_S) for f in queued] == ["tenant-1", "tenant-2"]
    assert order.index("victim") < order.index("tenant-1")


def test_a_free_slot_goes_to_the_next_user_in_turn(pool: ThreadPoolExecutor) -> None:
    """With one slot, a user that queued first still gets only every other slot: the user
    that queued after it is served before its second waiting review."""
    gate = CompileGate(slots=1, wait_s=PATIENCE_S * 4, per_user=1, queue_per_user=4)
    order: list[str] = []
    first = Held("a0", order)
    futures = [start(pool, gate, "a", first)]
    assert first.started.wait(PATIENCE_S)
    rest = {name: Held(name, order) for name in ("a1", "a2", "b0")}
    futures.append(start(pool, gate, "a", rest["a1"]))
    futures.append(start(pool, gate, "a", rest["a2"]))
    eventually(lambda: gate.waiting("a") == 2)
    futures.append(start(pool, gate, "b", rest["b0"]))
    eventually(lambda: gate.waiting("b") == 1)
    first.release.set()
    for name in ("a1", "b0", "a2"):
        assert rest[name].started.wait(PATIENCE_S)
        rest[name].release.set()
    assert [f.result(PATIENCE_S) for f in futures] == ["a0", "a1", "a2", "b0"]
    assert order == ["a0", "a1", "b0", "a2"]


def test_a_check_that_compiles_nothing_never_waits(pool: ThreadPoolExecutor) -> None:
    gate = CompileGate(slots=1, wait_s=PATIENCE_S * 4, per_user=1, queue_per_user=0)
    held = Held("busy", [])
    busy = start(pool, gate, "a", held)
    assert held.started.wait(PATIENCE_S)
    assert gate.run(False, lambda: "plain", "a") == "plain"
    assert gate.run(True, lambda: "heavy", "a") is None  # no queue: turned away at once
    held.release.set()
    assert busy.result(PATIENCE_S) == "busy"
    assert gate.run(True, lambda: "heavy", "a") == "heavy"


def test_a_gate_without_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="per_user=0"):
        CompileGate(per_user=0)
