"""The collector policy of the tracker: freeze every N updates and on demand, or never."""

from __future__ import annotations

import gc

import pytest

from controller.gcfreeze import Freezer


@pytest.fixture
def freezes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of gc.freeze() (replaced: a test must not freeze the test process)."""
    calls: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(1))
    return calls


def test_freezes_after_every_n_updates_and_on_demand(freezes: list[int]) -> None:
    f = Freezer(every=3)
    for _ in range(7):
        f.note()
    assert len(freezes) == 2
    f.freeze()  # a list completed: restarts the count
    assert len(freezes) == 3
    f.note()
    f.note()
    assert len(freezes) == 3
    f.note()
    assert len(freezes) == f.freezes == 4


def test_updates_count_by_weight(freezes: list[int]) -> None:
    f = Freezer(every=10)
    f.note(9)
    assert freezes == []
    f.note()
    assert len(freezes) == 1
    f.note(25)  # one heavy update: one freeze, the count starts again
    assert len(freezes) == 2
    f.note(9)
    assert len(freezes) == 2


def test_disabled_never_touches_the_collector(freezes: list[int]) -> None:
    f = Freezer(enabled=False, every=1)
    for _ in range(5):
        f.note()
    f.freeze()
    assert freezes == [] and f.freezes == 0


def test_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every must be at least 1"):
        Freezer(every=0)
