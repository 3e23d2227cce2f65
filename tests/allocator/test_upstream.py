"""kube-scheduler's own allocator test table, run through sharegpu's allocator.

Every applicable case must agree; the cases that test what sharegpu deliberately lacks are
listed with their reason in ``upstream/not_applicable.json``, and that list must name only
cases of the table (so a renamed upstream case cannot hide there).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from .upstream_table import (
    CASES_1_37_FILE,
    category,
    load_cases,
    load_cases_1_37,
    load_not_applicable,
    run_case,
)

CASES = load_cases()
NOT_APPLICABLE = load_not_applicable()
APPLICABLE = [c for c in CASES if c["name"] not in NOT_APPLICABLE]


def test_table_is_the_whole_upstream_table() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)) > 200
    assert set(NOT_APPLICABLE) <= set(names)
    assert all(reason.strip() for reason in NOT_APPLICABLE.values())


def test_1_37_cases_are_pinned_and_none_is_dropped() -> None:
    """The 1.37 cases name the module version and checksum they come from, are all applicable,
    and replace 1.36 cases one for one (the merged table has each name once)."""
    source = json.loads(CASES_1_37_FILE.read_text(encoding="utf-8"))["source"]
    assert source["module"] == "k8s.io/dynamic-resource-allocation"
    assert source["version"] == "v0.37.2"
    assert source["go.sum"].startswith("h1:")
    newer = [c["name"] for c in load_cases_1_37()]
    assert len(newer) == len(set(newer))
    assert not set(newer) & set(NOT_APPLICABLE)
    merged = sorted((c for c in CASES if c["name"] in newer), key=lambda c: str(c["name"]))
    assert merged == sorted(load_cases_1_37(), key=lambda c: str(c["name"]))


@pytest.mark.parametrize("case", APPLICABLE, ids=[c["name"] for c in APPLICABLE])
def test_upstream_case(case: dict[str, object]) -> None:
    verdict = run_case(case)
    assert verdict.ok, verdict.detail


def test_every_category_has_applicable_cases() -> None:
    """Each feature the allocator models is exercised by the table."""
    counts = Counter(category(c) for c in APPLICABLE)
    for feature in ("core", "ConsumableCapacity", "PrioritizedList", "PartitionableDevices"):
        assert any(feature in name for name in counts), feature
