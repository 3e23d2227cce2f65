"""Consumable capacity (KEP-5075): how much of each capacity one allocation consumes, and
whether a request fits a device, as kube-scheduler's ``consumable_capacity.go`` decides.

Amounts are exact :class:`~decimal.Decimal` values (quantities are parsed to whole nanos), so
two ``500m`` shares of a capacity of ``1`` both fit. The ``step`` arithmetic of a ``validRange``
is Kubernetes 1.37's (DRAFractionalCapacityRange, beta and on): in milli-units when ``min``,
``max`` and ``step`` are all whole milli-units and ``step`` is at least ``1m`` (step ``100m``:
a request of ``150m`` consumes ``200m``); else on ``Quantity.Value()`` integers (fractions
rounded up), as before 1.37. A request that is not a whole number of milli-units (on the
milli-unit path), or that or its rounded value lies past the int64 range, cannot be rounded:
the allocation stops with :class:`NotRepresentable`, as kube-scheduler's does
(``errCapacityRequestNotRepresentable``), before any capacity is judged short or against its
policy.

For every capacity of a device:

- not requested: ``requestPolicy.default``, else the whole ``value`` (checked against the
  policy like any other amount);
- requested without a policy: the requested amount;
- ``validRange``: below ``min`` becomes ``min``; with ``step`` rounded up to ``min + n*step``;
- ``validValues``: the smallest listed value not below the request, else the request itself.

The result then violates the policy when it is not the default and lies above ``max``, off the
``step`` grid, or outside ``validValues``. A requested capacity name must be a key of the
device's ``capacity`` as written (``cores`` does not match ``gpu.sharegpu.dev/cores``), as
kube-scheduler looks it up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from api.quantity import QuantityError, format_quantity, parse_quantity

from .model import AllocatorInputError

#: An exact quantity (whole nanos).
Amount = Decimal


def amount(value: Any, path: str) -> Amount:
    """The exact value of a quantity field; bad input names ``path``."""
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise AllocatorInputError(f"{path}: {exc}") from None


def format_amount(value: Amount | int) -> str:
    """Canonical text of an amount: :func:`format_quantity` for whole numbers, else the
    smallest of ``m``, ``u``, ``n`` that makes it whole (``500m``)."""
    if value == int(value):
        return format_quantity(int(value))
    for suffix, factor in (("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = Decimal(value) * factor
        if scaled == int(scaled):
            return f"{int(scaled)}{suffix}"
    return str(value)


def _value_int(value: Amount) -> int:
    """``Quantity.Value()``: rounded up to an integer."""
    return math.ceil(value)


#: ``MilliValue()`` must fit a signed 64-bit integer.
_INT64_MAX = 2**63 - 1


class NotRepresentable(AllocatorInputError):
    """A capacity request the range arithmetic cannot represent; the allocation stops."""


def _milli(value: Amount) -> int | None:
    """``value`` in whole milli-units, or None when that loses precision or leaves int64."""
    scaled = value * 1000
    if scaled != scaled.to_integral_value() or abs(scaled) > _INT64_MAX:
        return None
    return int(scaled)


def _range_bounds(rng: Mapping[str, Any], path: str) -> dict[str, Amount]:
    where = f"{path}.requestPolicy.validRange"
    return {
        k: amount(rng[k], f"{where}.{k}") for k in ("min", "max", "step") if rng.get(k) is not None
    }


def _use_milli(bounds: Mapping[str, Amount]) -> bool:
    """Whether the range is worked in milli-units (see the module docstring)."""
    millis = {k: _milli(v) for k, v in bounds.items()}
    if any(m is None for m in millis.values()):
        return False
    step = millis.get("step")
    return step is None or step >= 1


def _round_up_milli(requested: Amount, low: Amount, step: Amount, path: str) -> Amount:
    req_m, low_m, step_m = _milli(requested), _milli(low), _milli(step)
    assert low_m is not None and step_m is not None  # checked by _use_milli
    if req_m is None:
        raise NotRepresentable(
            f"{path}: capacity request cannot be represented in the device's range arithmetic: "
            f"request {format_amount(requested)} is not a whole number of milli-units"
        )
    steps = -(-(req_m - low_m) // step_m)
    if low_m + step_m * steps > _INT64_MAX:
        raise NotRepresentable(
            f"{path}: capacity request cannot be represented in the device's range arithmetic: "
            f"rounding request {format_amount(requested)} up to the next step passes the "
            "milli-value range"
        )
    return Decimal(low_m + step_m * steps) / 1000


@dataclass(frozen=True)
class PolicyViolation:
    """A requested amount that the device's ``requestPolicy`` does not allow."""

    capacity: str
    requested: Amount
    rounded: Amount | None
    policy: str

    def message(self) -> str:
        """Human text."""
        got = "no allowed value" if self.rounded is None else format_amount(self.rounded)
        return (
            f"capacity {self.capacity}: request {format_amount(self.requested)} rounds to "
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


def _rounded(requested: Amount, policy: Mapping[str, Any], path: str) -> Amount:
    rng = policy.get("validRange")
    if rng and rng.get("min") is not None:
        bounds = _range_bounds(rng, path)
        low = bounds["min"]
        if requested < low:
            return low
        if "step" not in bounds:
            return requested
        if _use_milli(bounds):
            return _round_up_milli(requested, low, bounds["step"], path)
        if requested > _INT64_MAX:
            raise NotRepresentable(
                f"{path}: capacity request cannot be represented in the device's range "
                f"arithmetic: request {format_amount(requested)} exceeds MaxInt64"
            )
        step = _value_int(bounds["step"])
        base = _value_int(low)
        added = _value_int(requested) - base
        steps = added // step + (1 if step and added % step else 0) if step > 0 else 0
        if base >= 0 and base + step * steps > _INT64_MAX:
            raise NotRepresentable(
                f"{path}: capacity request cannot be represented in the device's range "
                f"arithmetic: rounding request {format_amount(requested)} up to the next step "
                "passes MaxInt64"
            )
        return Decimal(base + step * steps)
    valid_values = policy.get("validValues")
    if valid_values is not None:
        for i, v in enumerate(valid_values):
            allowed = amount(v, f"{path}.requestPolicy.validValues[{i}]")
            if requested <= allowed:
                return allowed
    return requested


def _violates(consumed: Amount, policy: Mapping[str, Any], path: str) -> bool:
    default = policy.get("default")
    if default is not None and consumed == amount(default, f"{path}.requestPolicy.default"):
        return False
    rng = policy.get("validRange")
    if rng:
        bounds = _range_bounds(rng, path)
        if "max" in bounds and consumed > bounds["max"]:
            return True
        if "step" in bounds:
            low = bounds.get("min", Amount(0))
            if _use_milli(bounds):
                consumed_m, low_m, step_m = _milli(consumed), _milli(low), _milli(bounds["step"])
                assert low_m is not None and step_m is not None
                return consumed_m is None or bool((consumed_m - low_m) % step_m)
            step = _value_int(bounds["step"])
            if step and (_value_int(consumed) - _value_int(low)) % step:
                return True
        return False
    valid_values = policy.get("validValues")
    if valid_values:
        return all(
            consumed != amount(v, f"{path}.requestPolicy.validValues[{i}]")
            for i, v in enumerate(valid_values)
        )
    return False


def consumed_amount(
    name: str, capacity: Mapping[str, Any], requested: Amount | int | None, path: str
) -> Amount | PolicyViolation:
    """Amount of capacity ``name`` one allocation consumes, or the policy violation."""
    value = amount(capacity.get("value"), f"{path}.value")
    policy = capacity.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") is not None:
            return amount(policy["default"], f"{path}.requestPolicy.default")
        # Without a default the whole value is consumed, and kube-scheduler holds it to the
        # policy too (a range whose max is below the value refuses the device).
        if policy and _violates(value, policy, path):
            return PolicyViolation(name, value, value, describe_policy(policy))
        return value
    requested = Decimal(requested)
    if not policy:
        return requested
    consumed = _rounded(requested, policy, path)
    if _violates(consumed, policy, path):
        return PolicyViolation(name, requested, consumed, describe_policy(policy))
    return consumed
