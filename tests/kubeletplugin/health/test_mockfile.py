"""The mock backend's injected health: file format, polling, reload, errors."""

from __future__ import annotations

import json
import logging
import queue
from pathlib import Path

import pytest

from kubeletplugin.health.events import EventKind, HealthEvent
from kubeletplugin.health.mockfile import (
    HealthFileError,
    InjectedHealth,
    MockHealthChecker,
    parse_health_file,
)
from tests.kubeletplugin.health.helpers import gpus


def test_parse_by_index_string_index_and_uuid() -> None:
    g = gpus(3)
    text = json.dumps(
        {
            "0": {"healthy": False, "reason": "XID 79"},
            g[1].uuid: {"xids": [79, 13]},
            "2": None,
        }
    )
    assert parse_health_file(text, g) == {
        g[0].uuid: InjectedHealth(False, "XID 79"),
        g[1].uuid: InjectedHealth(True, xids=(79, 13)),
        g[2].uuid: InjectedHealth(),
    }
    assert parse_health_file("1: {healthy: false}\n", g)[g[1].uuid].healthy is False
    assert parse_health_file("", g) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a mapping of GPU index or UUID"),
        ("7: {healthy: false}", "key '7': no such GPU"),
        ("0: {healthy: 'no'}", r"entry 0.healthy: expected true or false"),
        ("0: {reason: 5}", r"entry 0.reason: expected a non-empty string"),
        ("0: {xids: [79, x]}", r"entry 0.xids: expected a list of non-negative integers"),
        ("0: {helthy: false}", "unknown field 'helthy'"),
        ("0: 5", "entry 0: expected a mapping"),
        ("0: {}\n'0': {}", "named twice"),
        ("0: [", "not valid YAML or JSON"),
    ],
)
def test_invalid_files_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(HealthFileError, match=message):
        parse_health_file(text, gpus(2))


class Events:
    def __init__(self) -> None:
        self.q: queue.Queue[HealthEvent] = queue.Queue()

    def __call__(self, event: HealthEvent) -> None:
        self.q.put(event)

    def next(self) -> HealthEvent:
        return self.q.get(timeout=10)


def test_changes_are_applied_when_the_file_changes(tmp_path: Path) -> None:
    g = gpus(2)
    path = tmp_path / "health.yaml"
    checker = MockHealthChecker(path, poll_interval=0.05)
    events = Events()
    checker.start(g, events)
    try:
        assert checker.probe(g[0]) is None
        path.write_text("0: {healthy: false, reason: 'XID 79'}\n")
        assert events.next() == HealthEvent(g[0].uuid, EventKind.FAULT, detail="XID 79")
        assert checker.probe(g[0]) == "XID 79"
        assert checker.probe(g[1]) is None
        path.write_text("1: {xids: [13, 48]}\n")
        assert events.next() == HealthEvent(g[1].uuid, EventKind.XID, xid=13)
        assert events.next() == HealthEvent(g[1].uuid, EventKind.XID, xid=48)
        assert checker.probe(g[0]) is None
        checker.reload()
        assert events.next() == HealthEvent(g[1].uuid, EventKind.XID, xid=13)
    finally:
        checker.stop()


def test_an_invalid_file_keeps_the_previous_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    g = gpus(1)
    path = tmp_path / "health.yaml"
    path.write_text("0: {healthy: false, reason: broken}\n")
    checker = MockHealthChecker(path, poll_interval=3600)
    events = Events()
    checker.start(g, events)
    try:
        assert events.next().detail == "broken"
        path.write_text("0: {healthy: maybe}\n")
        with caplog.at_level(logging.ERROR, logger="kubeletplugin.health.mockfile"):
            checker.check_file()
        assert "0.healthy: expected true or false" in caplog.text
        assert checker.probe(g[0]) == "broken"
        path.unlink()
        checker.check_file()
        assert checker.probe(g[0]) is None
    finally:
        checker.stop()


def test_without_a_file_every_gpu_is_healthy() -> None:
    g = gpus(2)
    checker = MockHealthChecker(None)
    checker.start(g, Events())
    assert [checker.probe(x) for x in g] == [None, None]
    checker.stop()
