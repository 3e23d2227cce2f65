"""kube-scheduler's own allocator test table, run through sharegpu's allocator.

Every applicable case must agree; the cases that test what sharegpu deliberately lacks are
listed with their reason in ``upstream/not_applicable.json``, and that list must name only
cases of the table (so a renamed upstream case cannot hide there).
"""

from __future__ import annotations

from collections import Counter

import pytest

from .upstream_table import category, load_cases, load_not_applicable, run_case

CASES = load_cases()
NOT_APPLICABLE = load_not_applicable()
APPLICABLE = [c for c in CASES if c["name"] not in NOT_APPLICABLE]


def test_table_is_the_whole_upstream_table() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)) > 200
    assert set(NOT_APPLICABLE) <= set(names)
    assert all(reason.strip() for reason in NOT_APPLICABLE.values())


@pytest.mark.parametrize("case", APPLICABLE, ids=[c["name"] for c in APPLICABLE])
def test_upstream_case(case: dict[str, object]) -> None:
    verdict = run_case(case)
    assert verdict.ok, verdict.detail


def test_every_category_has_applicable_cases() -> None:
    """Each feature the allocator models is exercised by the table."""
    counts = Counter(category(c) for c in APPLICABLE)
    for feature in ("core", "ConsumableCapacity", "PrioritizedList", "PartitionableDevices"):
        assert any(feature in name for name in counts), feature
