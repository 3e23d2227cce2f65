"""The daemon lifecycle both daemons use: ordered start, reverse stop, run until asked to stop."""

from __future__ import annotations

import threading

import pytest

from sharegpu.kube.lifecycle import Lifecycle
from tests.kube.helpers import Recorder


def test_components_start_in_order_and_stop_in_reverse_after_running_ones() -> None:
    events: list[str] = []
    life = Lifecycle()
    life.running("client", lambda: events.append("stop client"))
    life.add(Recorder("publisher", events))
    life.add(Recorder("grpc", events))
    life.start()
    assert events == ["start publisher", "start grpc"]
    life.stop()
    life.stop()  # idempotent
    assert events[2:] == ["stop grpc", "stop publisher", "stop client"]


def test_a_failed_start_stops_what_runs_and_reraises() -> None:
    events: list[str] = []
    life = Lifecycle()
    life.running("client", lambda: events.append("stop client"))
    life.add(Recorder("a", events))
    life.add(Recorder("b", events, fail_start=True))
    life.add(Recorder("c", events))
    with pytest.raises(RuntimeError, match="b cannot start"):
        life.start()
    assert events == ["start a", "stop a", "stop client"]


def test_stop_never_raises_and_stops_the_rest() -> None:
    events: list[str] = []
    life = Lifecycle()
    life.add(Recorder("a", events))

    def broken() -> None:
        raise OSError("socket already gone")

    life.running("broken", broken)
    life.start()
    life.stop()
    assert events == ["start a", "stop a"]


def test_components_cannot_be_added_once_started() -> None:
    life = Lifecycle()
    life.start()
    with pytest.raises(RuntimeError, match="before the daemon starts"):
        life.add(Recorder("late", []))


def test_run_returns_after_a_stop_request_with_everything_stopped() -> None:
    events: list[str] = []
    life = Lifecycle()
    life.add(Recorder("a", events))
    started = threading.Event()
    runner = threading.Thread(target=life.run, kwargs={"on_started": started.set})
    runner.start()
    assert started.wait(10)
    life.request_stop()
    runner.join(10)
    assert not runner.is_alive()
    assert events == ["start a", "stop a"]
