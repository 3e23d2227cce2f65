"""Fractional capacity ranges (Kubernetes 1.37, DRAFractionalCapacityRange): the step arithmetic
of a request policy in exact milli-units, and Kubernetes' integer arithmetic where it applies."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import names
from api.quantity import parse_quantity
from api.sharepolicy import consumable_capacity
from sharegpu.allocator import AllocatorInputError, allocate, allocate_many
from sharegpu.allocator.capacity import NotRepresentable, PolicyViolation, consumed_amount

from .helpers import claim, device_class, exactly, resource_slice

Obj = dict[str, Any]


def capacity(value: str, low: str, step: str, high: str | None = None) -> Obj:
    rng = {"min": low, "step": step}
    if high is not None:
        rng["max"] = high
    return {"value": value, "requestPolicy": {"validRange": rng}}


@pytest.mark.parametrize(
    ("policy", "requested", "consumed"),
    [
        # the milli-unit path: min, max and step whole milli-units, step at least 1m
        (capacity("1", "100m", "100m"), "150m", "0.2"),
        (capacity("1", "100m", "100m"), "200m", "0.2"),
        (capacity("1", "200m", "100m", "1"), "250m", "0.3"),
        (capacity("1", "200m", "100m", "1"), "50m", "0.2"),  # below min: min
        (capacity("10", "1", "500m"), "1.2", "1.5"),
        (capacity("10", "1", "1"), "1.5", "2"),
        (capacity("1Gi", "1Mi", "1Mi"), "1.5Mi", "2Mi"),
        # a step below 1m: Quantity.Value() integers, fractions rounded up
        (capacity("10", "0", "500u"), "1.2", "2"),
    ],
)
def test_step_rounding(policy: Obj, requested: str, consumed: str) -> None:
    got = consumed_amount("c", policy, _amount(requested), "device")
    assert got == _amount(consumed)


def test_a_request_finer_than_milli_units_cannot_be_rounded() -> None:
    with pytest.raises(NotRepresentable, match="not a whole number of milli-units"):
        consumed_amount("c", capacity("1", "100m", "100m"), _amount("150100u"), "device")


def test_integer_path_requests_past_int64_cannot_be_rounded() -> None:
    """A step below 1m works on Quantity.Value() integers: a request, or its rounded value,
    past MaxInt64 cannot be represented there either."""
    policy = capacity("10", "0", "500u")
    with pytest.raises(NotRepresentable, match="exceeds MaxInt64"):
        consumed_amount("c", policy, Decimal(2**63), "device")
    rounding = capacity("10", "1", "1500u")  # Value() of the step is 1: rounds up by 1
    assert consumed_amount("c", rounding, Decimal(2**63 - 1), "device") == Decimal(2**63 - 1)
    odd = capacity("10", "0", "1500u")
    odd["requestPolicy"]["validRange"]["min"] = "2"
    odd["requestPolicy"]["validRange"]["step"] = "2.0001"  # Value() 3
    with pytest.raises(NotRepresentable, match="passes MaxInt64"):
        consumed_amount("c", odd, Decimal(2**63 - 2), "device")


def test_off_grid_default_and_above_max_violate_the_policy() -> None:
    policy = capacity("2", "200m", "100m", "1")
    policy["requestPolicy"]["default"] = "250m"
    assert consumed_amount("c", policy, None, "device") == _amount("250m")  # the default
    assert isinstance(consumed_amount("c", policy, _amount("1.1"), "device"), PolicyViolation)


def fractional_device(value: str = "1") -> Obj:
    return {
        "name": "dev-0",
        "allowMultipleAllocations": True,
        "capacity": {"share": capacity(value, "100m", "100m")},
    }


def test_a_150m_request_consumes_200m_and_shares_add_up_exactly() -> None:
    slices = [resource_slice("s", [fractional_device()])]
    classes = [device_class()]
    claims = [
        claim(f"c{i}", [exactly(capacity={"share": "150m"})], namespace="default") for i in range(6)
    ]
    outcomes = allocate_many(claims, slices, classes, node="n1")
    consumed = [
        o.allocation["devices"]["results"][0]["consumedCapacity"]["share"]
        for o in outcomes
        if o.allocation is not None
    ]
    # 5 x 200m fill the capacity of 1 exactly; the sixth does not fit
    assert consumed == ["200m"] * 5
    assert outcomes[5].allocation is None


def test_an_unrepresentable_request_stops_the_allocation() -> None:
    slices = [resource_slice("s", [fractional_device()])]
    c = claim("c", [exactly(capacity={"share": "150100u"})])
    with pytest.raises(AllocatorInputError, match="cannot be represented"):
        allocate(c, slices, [device_class()], node="n1")


def test_an_unrepresentable_request_stops_the_allocation_before_a_short_capacity() -> None:
    """Every capacity is rounded before any is judged: a request past the milli-unit range
    stops the allocation although the device is too small for it anyway."""
    slices = [resource_slice("s", [fractional_device()])]
    c = claim("c", [exactly(capacity={"share": "9E"})])
    with pytest.raises(AllocatorInputError, match="cannot be represented"):
        allocate(c, slices, [device_class()], node="n1")


def _amount(text: str) -> Decimal:
    return parse_quantity(text)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    cores_milli=st.integers(min_value=1, max_value=100_000),
    memory_milli=st.integers(min_value=1, max_value=80 * 2**30 * 1000),
)
def test_the_drivers_own_capacities_are_always_consumed_in_whole_units(
    cores_milli: int, memory_milli: int
) -> None:
    """The node, the tracker and GpuQuota count cores and memory in whole units: exact,
    because every capacity the plugin publishes has whole-number values, minimums and steps,
    so whatever a claim asks (fractions included), what it consumes is whole or refused."""
    published = consumable_capacity(80 * 2**30)
    for name, asked in ((names.CAP_CORES, cores_milli), (names.CAP_MEMORY, memory_milli)):
        got = consumed_amount(name, published[name], Decimal(asked) / 1000, "device")
        if not isinstance(got, PolicyViolation):
            assert got == got.to_integral_value(), (name, asked, got)
