"""Upstream library test tables (Kubernetes, cel-go) run against sharegpu's CEL environment.

The tables live as data in ``tests/cel/upstream/library_*.json``: each file names the
upstream repository, path and commit it was ported from, and lists cases (expression, expected
value as a CEL expression or expected error, upstream test and case name). A case can carry
``pending`` (a known gap, with the reason; a pending case that passes fails the test, so
the list stays accurate), ``kubernetes_compile_error`` (upstream runs the case in an
environment that accepts it, Kubernetes' refuses it at compile time, with the reason: it
passes when the expression does not compile) or ``not_in_kubernetes`` (upstream tests a
configuration Kubernetes' DRA environment does not have; not run). Every other case must pass.

``python tests/cel/test_upstream_library.py`` prints the pass counts per table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sharegpu.cel import CelCompileError, CelEvalError, compile_selector
from sharegpu.cel.device import device_activation
from sharegpu.cel.environment import compile_expression

TABLES = Path(__file__).parent / "upstream"
#: ``device`` is bound (the DRA environment declares it) but the expressions do not use it.
DEVICE = {"driver": "d", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}


@dataclass(frozen=True)
class Case:
    """One upstream case: where it comes from and what it expects."""

    table: str
    data: dict[str, Any]

    @property
    def ident(self) -> str:
        return f"{self.table}:{self.data['name']}"


def _tables() -> list[Path]:
    return sorted(TABLES.glob("library_*.json"))


def _cases() -> Iterator[Case]:
    for path in _tables():
        doc = json.loads(path.read_text(encoding="utf-8"))
        for data in doc["cases"]:
            yield Case(path.stem, data)


def _error_matches(case: dict[str, Any], message: str) -> bool:
    expected = case["error"]
    if case.get("error_match") == "exact":
        return bool(message == expected)
    return expected in message


def outcome(case: dict[str, Any]) -> tuple[bool, str]:
    """Run one case; (passed, what happened)."""
    expression = case["expression"]
    if "kubernetes_compile_error" in case:
        try:
            compile_expression(expression)
        except CelCompileError as exc:
            return True, f"compile error: {exc.message}"
        return False, "compiles; Kubernetes' compiler refuses it"
    expected = case.get("expected")
    if expected is not None and expected != "true":
        expression = f"({expression}) == ({expected})"
    try:
        if expected is None:
            # An error is expected: upstream evaluates the expression whatever its type,
            # where a selector must be a bool.
            result = compile_expression(expression)({"device": device_activation("d", DEVICE)})
        else:
            result = compile_selector(expression).evaluate(DEVICE)
    except CelCompileError as exc:
        if "compile_error" in case:
            ok = any(re.search(p, exc.message) for p in case["compile_error"])
            return ok, f"compile error: {exc.message}"
        if "error" in case:
            return _error_matches(case, exc.message), f"compile error: {exc.message}"
        return False, f"compile error: {exc.message}"
    except CelEvalError as exc:
        if "error" in case:
            return _error_matches(case, exc.message), f"error: {exc.message}"
        return False, f"error: {exc.message}"
    if expected is None:
        return False, f"no error, result {result!r}"
    return result is True, f"result {result!r}"


ALL_CASES = list(_cases())


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.ident for c in ALL_CASES])
def test_upstream_case(case: Case) -> None:
    data = case.data
    if "not_in_kubernetes" in data:
        pytest.skip(f"not in Kubernetes' environment: {data['not_in_kubernetes']}")
    passed, detail = outcome(data)
    if "pending" in data:
        assert not passed, f"{data['expression']!r} passes now: drop its 'pending' in the data"
        pytest.xfail(f"{data['pending']} ({detail})")
    assert passed, f"{data['expression']!r}: {detail}; wanted {_wanted(data)}"


def _wanted(data: dict[str, Any]) -> str:
    if "expected" in data:
        return f"value {data['expected']}"
    if "compile_error" in data:
        return f"compile error matching {data['compile_error']}"
    return f"error {data['error']!r} ({data.get('error_match', 'contains')})"


def test_tables_record_their_source() -> None:
    for path in _tables():
        source = json.loads(path.read_text(encoding="utf-8"))["source"]
        assert source["repository"] and source["path"]
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), path


def test_every_known_gap_has_a_reason() -> None:
    for case in ALL_CASES:
        for key in ("pending", "not_in_kubernetes", "kubernetes_compile_error"):
            if key in case.data:
                assert len(case.data[key]) > 10, case.ident


def summary() -> dict[str, dict[str, int]]:
    """Per table: cases passed, pending (known gaps), not applicable, failed, and how many of
    the passed ones are still marked pending (their mark can go)."""
    counts: dict[str, dict[str, int]] = {}
    for case in ALL_CASES:
        row = counts.setdefault(
            case.table,
            {"passed": 0, "pending": 0, "not_in_kubernetes": 0, "failed": 0, "stale_pending": 0},
        )
        if "not_in_kubernetes" in case.data:
            row["not_in_kubernetes"] += 1
            continue
        passed, _ = outcome(case.data)
        if passed:
            row["passed"] += 1
            row["stale_pending"] += "pending" in case.data
        elif "pending" in case.data:
            row["pending"] += 1
        else:
            row["failed"] += 1
    return counts


def test_summary_has_no_unlisted_failure(capsys: pytest.CaptureFixture[str]) -> None:
    counts = summary()
    with capsys.disabled():
        print()
        for table, row in counts.items():
            total = sum(row.values()) - row["stale_pending"]
            print(f"  {table:28s} {row['passed']:4d}/{total} passed  {row}")
    assert all(row["failed"] == 0 for row in counts.values()), counts


if __name__ == "__main__":
    for name, counts in summary().items():
        print(name, counts)
