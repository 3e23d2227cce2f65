"""kube-scheduler's allocator test table run through the Go oracle too.

The table's expected results come from upstream's unit test, which builds the allocated state
directly; the oracle builds it from allocated claims as kube-scheduler does. Every applicable
case, given to the oracle in the form the table harness gives sharegpu, must get the answer
sharegpu gives: so the oracle's allocated-state input and the table's agree, and a case where
the table and the oracle differ (a 1.36 expectation that 1.37 changed) is seen here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.allocator.upstream_table import (
    CASES_FILE,
    allocated_claims,
    load_cases,
    load_not_applicable,
)
from tests.oracle import upstream
from tests.oracle.compare import allocation_outcome, compare, sharegpu_answer

#: The 1.36 case whose expected result 1.37 changed: an All request over shareable devices,
#: one of which other claims have used up (1.36: the rest is allocated; 1.37: unsatisfiable).
CHANGED_IN_1_37 = (
    "consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-insufficient"
)


def oracle_case(case: dict[str, Any]) -> dict[str, Any]:
    """A table case as an oracle ``allocate`` case (the holdings as allocated claims)."""
    node = case["node"]
    return {
        "id": case["name"],
        "kind": "allocate",
        "node": {"metadata": {"name": node["name"], "labels": node.get("labels") or {}}},
        "slices": case["slices"],
        "classes": case["classes"],
        "allocatedClaims": allocated_claims(case),
        "claims": case["claims"],
    }


def _oracle() -> None:
    try:
        upstream.ensure_built()
    except upstream.OracleUnavailable as exc:
        pytest.skip(f"differential oracle unavailable: {exc}")


@pytest.mark.timeout(1200)
def test_every_applicable_table_case_gets_the_oracles_answer() -> None:
    _oracle()
    skip = load_not_applicable()
    cases = [oracle_case(c) for c in load_cases() if c["name"] not in skip]
    answers = upstream.ask(cases)
    found = [
        d.describe()[:300]
        for case, answer in zip(cases, answers, strict=True)
        for d in compare(case["id"], "allocate", answer, sharegpu_answer(case))
    ]
    assert len(cases) > 150
    assert not found, "\n".join(found)


@pytest.mark.timeout(1200)
def test_the_case_1_37_changed_is_unsatisfiable_upstream_in_both_forms() -> None:
    """The 1.36 form of the case (which expected device-2 alone) and the 1.37 form both get
    "unsatisfiable" from k8s.io/dynamic-resource-allocation v0.37.2, as from sharegpu: the used-up
    device still belongs to the All request."""
    _oracle()
    cases_1_36 = json.loads(CASES_FILE.read_text())["cases"]
    old = next(c for c in cases_1_36 if c["name"] == CHANGED_IN_1_37)
    new = next(c for c in load_cases() if c["name"] == CHANGED_IN_1_37)
    assert old["expectResults"] and not new["expectResults"]
    for case in (oracle_case(old), oracle_case(new)):
        (answer,) = upstream.ask([case])
        assert allocation_outcome(answer) == "unsatisfiable"
        assert allocation_outcome(sharegpu_answer(case)) == "unsatisfiable"
