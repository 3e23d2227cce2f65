"""Consumable capacity (KEP-5075): how much of each capacity one allocation consumes.

For every capacity of a device with ``allowMultipleAllocations``:

- not requested: ``requestPolicy.default``, or the whole ``value`` without a policy;
- requested without a policy: the requested amount;
- ``validRange``: below ``min`` becomes ``min``; with ``step`` rounded up to ``min + n*step``;
  above ``max`` violates the policy;
- ``validValues``: the smallest listed value not below the request; none violates.

All arithmetic is on integers (``Quantity.Value()``, rounding fractions up).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.quantity import QuantityError, format_quantity, quantity_int

from .model import AllocatorInputError


def _int(value: Any, path: str) -> int:
    try:
        return quantity_int(value)
    except QuantityError as exc:
        raise AllocatorInputError(f"{path}: {exc}") from None


def capacity_key(driver: str, capacities: Mapping[str, Any], name: str) -> str | None:
    """The key under which ``capacities`` (a device's ``capacity``) holds ``name``.

    A name qualified with the driver's own domain also matches the unqualified key and the
    reverse, as attribute and capacity names are resolved against the driver.
    """
    if name in capacities:
        return name
    domain, sep, ident = name.rpartition("/")
    if sep and domain == driver and ident in capacities:
        return ident
    if not sep and f"{driver}/{name}" in capacities:
        return f"{driver}/{name}"
    return None


@dataclass(frozen=True)
class PolicyViolation:
    """A requested amount that the device's ``requestPolicy`` does not allow."""

    capacity: str
    requested: int
    rounded: int | None
    policy: str

    def message(self) -> str:
        """Human text."""
        got = "no allowed value" if self.rounded is None else format_quantity(self.rounded)
        return (
            f"capacity {self.capacity}: request {format_quantity(self.requested)} rounds to "
            f"{got}, which the request policy ({self.policy}) does not allow"
        )


def describe_policy(policy: Mapping[str, Any]) -> str:
    """Short text of a request policy for messages."""
    if policy.get("validValues"):
        return "validValues " + ", ".join(str(v) for v in policy["validValues"])
    rng = policy.get("validRange") or {}
    parts = [f"min {rng.get('min')}"]
    if rng.get("max") is not None:
        parts.append(f"max {rng['max']}")
    if rng.get("step") is not None:
        parts.append(f"step {rng['step']}")
    return "validRange " + ", ".join(parts)


def consumed_amount(
    name: str, capacity: Mapping[str, Any], requested: int | None, path: str
) -> int | PolicyViolation:
    """Amount of capacity ``name`` one allocation consumes, or the policy violation."""
    value = _int(capacity.get("value"), f"{path}.value")
    policy = capacity.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") is not None:
            return _int(policy["default"], f"{path}.requestPolicy.default")
        return value
    if not policy:
        return requested
    valid_values = policy.get("validValues")
    if valid_values:
        allowed = sorted(_int(v, f"{path}.requestPolicy.validValues") for v in valid_values)
        for v in allowed:
            if v >= requested:
                return v
        return PolicyViolation(name, requested, None, describe_policy(policy))
    rng = policy.get("validRange")
    if not rng:
        return requested
    low = _int(rng.get("min"), f"{path}.requestPolicy.validRange.min")
    rounded = max(requested, low)
    if rng.get("step") is not None:
        step = _int(rng["step"], f"{path}.requestPolicy.validRange.step")
        if step > 0:
            steps = -(-(rounded - low) // step)
            rounded = low + steps * step
    if rng.get("max") is not None:
        high = _int(rng["max"], f"{path}.requestPolicy.validRange.max")
        if rounded > high:
            return PolicyViolation(name, requested, rounded, describe_policy(policy))
    return rounded
