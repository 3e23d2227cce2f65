"""The fake clock the tests drive time-dependent components with."""

from __future__ import annotations

import threading
import time

from sharegpu.kube.clock import FAKE_WALL_START, SYSTEM_CLOCK, FakeClock, rfc3339


def test_a_waiter_wakes_only_when_the_clock_passes_its_deadline() -> None:
    clock = FakeClock()
    event = threading.Event()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(clock.wait(event, 5.0)))
    waiter.start()
    assert clock.wait_for_waiters(1)
    assert clock.advance(4.9)
    assert results == [] and clock.wait_for_waiters(1)
    assert clock.advance(0.1)
    waiter.join(10)
    assert results == [False]
    assert clock.monotonic() == 1005.0


def test_a_set_event_ends_the_wait_at_once() -> None:
    clock = FakeClock()
    event = threading.Event()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(clock.wait(event, 3600.0)))
    waiter.start()
    assert clock.wait_for_waiters(1)
    event.set()
    waiter.join(10)
    assert results == [True]


def test_waiting_for_absent_waiters_gives_up_after_its_real_timeout() -> None:
    assert not FakeClock().wait_for_waiters(1, timeout=0.05)


def test_the_system_clock_is_monotonic_and_waits_on_the_event() -> None:
    event = threading.Event()
    event.set()
    before = SYSTEM_CLOCK.monotonic()
    assert SYSTEM_CLOCK.wait(event, 10.0)
    assert SYSTEM_CLOCK.monotonic() >= before


def test_a_condition_wait_ends_when_notified_or_when_the_clock_passes_its_deadline() -> None:
    clock = FakeClock()
    cond = threading.Condition()
    results: list[bool] = []

    def waiter() -> None:
        with cond:
            results.append(clock.wait_condition(cond, 2.0))

    first = threading.Thread(target=waiter)
    first.start()
    assert clock.wait_for_waiters(1)
    with cond:
        cond.notify_all()
    first.join(10)
    second = threading.Thread(target=waiter)
    second.start()
    assert clock.wait_for_waiters(1)
    assert clock.advance(2.0)
    second.join(10)
    assert results == [True, False]


def test_the_fake_wall_time_moves_with_its_monotonic_time() -> None:
    clock = FakeClock(start=10.0, wall=1_700_000_000.0)
    assert (clock.monotonic(), clock.time()) == (10.0, 1_700_000_000.0)
    assert clock.advance(2.5)
    assert (clock.monotonic(), clock.time()) == (12.5, 1_700_000_002.5)
    assert FakeClock().time() == FAKE_WALL_START


def test_the_system_wall_time_is_the_epochs() -> None:
    before = time.time()
    assert before <= SYSTEM_CLOCK.time() <= time.time()


def test_rfc3339_is_utc_and_truncated_to_whole_seconds() -> None:
    assert rfc3339(FAKE_WALL_START) == "2027-01-15T08:00:00Z"
    assert rfc3339(FAKE_WALL_START + 59.999) == "2027-01-15T08:00:59Z"
    assert rfc3339(0) == "1970-01-01T00:00:00Z"
