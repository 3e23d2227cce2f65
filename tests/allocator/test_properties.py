"""Property tests: never over capacity or counters, never a device twice exclusively,
deterministic for the same input."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.quantity import quantity_int
from sharegpu.allocator import allocate_many, seeded_share_ids
from tests.allocator.helpers import (
    DRIVER,
    H100_USABLE,
    claim,
    consumable_slices,
    device_class,
    exactly,
    exclusive_slices,
    partition_slices,
)

CLASSES = [device_class()]
SETTINGS = settings(max_examples=40, deadline=None)

cores = st.one_of(st.none(), st.integers(min_value=1, max_value=100).map(str))
memory = st.one_of(st.none(), st.sampled_from(["256Mi", "1Gi", "7500Mi", "20Gi", "40Gi", "79Gi"]))


@st.composite
def share_claims(draw: st.DrawFn) -> list[dict[str, Any]]:
    claims = []
    for i in range(draw(st.integers(min_value=1, max_value=12))):
        requests = []
        for j in range(draw(st.integers(min_value=1, max_value=2))):
            capacity = {}
            c, m = draw(cores), draw(memory)
            if c is not None:
                capacity["cores"] = c
            if m is not None:
                capacity["memory"] = m
            requests.append(
                exactly(f"r{j}", count=draw(st.integers(1, 2)), capacity=capacity or None)
            )
        claims.append(claim(f"c{i}", requests))
    return claims


@SETTINGS
@given(share_claims(), st.integers(min_value=1, max_value=3))
def test_shares_never_exceed_capacity_and_are_deterministic(
    claims: list[dict[str, Any]], gpus: int
) -> None:
    slices = consumable_slices(gpus)
    outs = allocate_many(claims, slices, CLASSES, node="n1", share_ids=seeded_share_ids(5))
    again = allocate_many(claims, slices, CLASSES, node="n1", share_ids=seeded_share_ids(5))
    assert [o.to_dict() for o in outs] == [o.to_dict() for o in again]
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    share_ids = []
    for out in outs:
        if out.allocation is None:
            assert out.reports
            continue
        for result in out.allocation["devices"]["results"]:
            share_ids.append(result["shareID"])
            consumed = result["consumedCapacity"]
            assert set(consumed) == {"cores", "memory"}
            for name, value in consumed.items():
                used[result["device"]][name] += quantity_int(value)
    assert len(share_ids) == len(set(share_ids))
    for usage in used.values():
        assert usage["cores"] <= 100
        assert usage["memory"] <= H100_USABLE


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=6),
)
def test_exclusive_devices_are_never_given_twice(shapes: list[tuple[int, bool]], gpus: int) -> None:
    claims = [
        claim(f"c{i}", [exactly(all_mode=True) if all_mode else exactly(count=count)])
        for i, (count, all_mode) in enumerate(shapes)
    ]
    outs = allocate_many(claims, exclusive_slices(gpus), CLASSES, node="n1")
    seen: set[str] = set()
    for out in outs:
        if out.allocation is None:
            continue
        devices = [r["device"] for r in out.allocation["devices"]["results"]]
        assert not seen & set(devices)
        assert len(devices) == len(set(devices))
        seen.update(devices)
    assert len(seen) <= gpus


profiles = st.sampled_from(["whole", "half", "quarter", "eighth"])


@SETTINGS
@given(st.lists(profiles, min_size=1, max_size=16), st.integers(min_value=1, max_value=2))
def test_partitions_never_exceed_counters(wanted: list[str], gpus: int) -> None:
    claims = [
        claim(f"p{i}", [exactly(selectors=[f"device.attributes['{DRIVER}'].partition == '{p}'"])])
        for i, p in enumerate(wanted)
    ]
    slices = partition_slices(gpus)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    outs = allocate_many(claims, slices, CLASSES, node="n1")
    charged: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    names: list[str] = []
    for out in outs:
        if out.allocation is None:
            continue
        for result in out.allocation["devices"]["results"]:
            names.append(result["device"])
            for use in devices[result["device"]]["consumesCounters"]:
                for counter, value in use["counters"].items():
                    charged[use["counterSet"]][counter] += quantity_int(value["value"])
    assert len(names) == len(set(names))
    for counters in charged.values():
        assert counters["cores"] <= 100
        assert counters["memory"] <= H100_USABLE
    # A claim fails only for lack of counters or because the partitions are taken.
    for out in outs:
        if not out.ok:
            found = {r.kind for rep in out.reports for r in rep.rejections}
            assert found <= {"counter-short", "selector-false", "already-allocated"}
            assert found & {"counter-short", "already-allocated"}
