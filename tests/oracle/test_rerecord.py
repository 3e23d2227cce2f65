"""``python -m tests.oracle.regressions --rerecord`` (the oracle-data step of moving to a new
Kubernetes release) rewrites what the pinned oracle now answers, and only that."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import regressions, upstream
from tests.oracle.regressions import REGRESSION_DIR, load, rerecord

CEL_CASE = "cel-arithmetic-of-dyn-is-dyn"
ALLOCATION_CASE = "alloc-admin-access-all"


def _copies(tmp_path: Path) -> list[regressions.Regression]:
    out = []
    for name in (CEL_CASE, ALLOCATION_CASE):
        target = tmp_path / f"{name}.json"
        shutil.copy(REGRESSION_DIR / f"{name}.json", target)
        doc = json.loads(target.read_text())
        doc["answeredBy"] = "k8s.io/dynamic-resource-allocation v0.36.3"
        target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out.append(load(target))
    return out


def test_an_answer_with_the_same_outcome_is_kept_and_a_changed_one_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = _copies(tmp_path)
    before = {r.name: json.loads(r.path.read_text()) for r in cases}
    # The CEL case now compiles and evaluates to true (another outcome); the allocation case
    # is still unsatisfiable, worded differently (the same outcome).
    answers: list[dict[str, Any]] = [
        {"id": CEL_CASE, "value": True},
        {"id": ALLOCATION_CASE, "unsatisfiable": True, "note": "worded otherwise"},
    ]
    monkeypatch.setattr(upstream, "ask", lambda batch: answers)
    assert rerecord(cases) == [CEL_CASE]
    after = {r.name: json.loads(r.path.read_text()) for r in cases}
    pinned = f"{upstream.ALLOCATOR_MODULE} {upstream.pinned_version()}"
    assert after[CEL_CASE]["upstream"] == {"value": True}
    assert after[ALLOCATION_CASE]["upstream"] == before[ALLOCATION_CASE]["upstream"]
    for name in (CEL_CASE, ALLOCATION_CASE):
        assert after[name]["answeredBy"] == pinned
        assert after[name]["finding"] == before[name]["finding"]
        assert after[name].get("xfail") == before[name].get("xfail")
