"""Shared builders of the kube-runtime tests (and of the daemons' lifecycle tests)."""

from __future__ import annotations


class Recorder:
    """A lifecycle component that records ``start <name>`` and ``stop <name>`` in ``events``;
    ``fail_start`` makes its start raise."""

    def __init__(self, name: str, events: list[str], fail_start: bool = False) -> None:
        self.name = name
        self.events = events
        self.fail_start = fail_start

    def start(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")
