"""The ``Quantity`` CEL type of Kubernetes (``k8s.io/apiserver/pkg/cel/library/quantity.go``).

A Quantity is an exact decimal; ``compareTo`` and the comparisons are by value, so
``quantity('1Gi')`` equals ``quantity('1024Mi')``.
"""

from __future__ import annotations

from decimal import Decimal

from api.quantity import QuantityError, parse_quantity

from .errors import CelEvalError

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class Quantity:
    """An immutable Kubernetes quantity with the CEL methods of the quantity library."""

    __slots__ = ("text", "value")

    def __init__(self, value: Decimal, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else _format(value)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse ``text`` (``"10Gi"``, ``"500m"``); :class:`CelEvalError` if it is no quantity."""
        try:
            return cls(parse_quantity(text), text)
        except QuantityError as exc:
            raise CelEvalError(f"quantities must match the regular expression: {exc}") from exc

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def compare_to(self, other: Quantity) -> int:
        """-1, 0 or 1 as ``self`` is smaller than, equal to or larger than ``other``."""
        return (self.value > other.value) - (self.value < other.value)

    def is_integer(self) -> bool:
        """True when the value is a whole number that fits in an int64."""
        return self.value == self.value.to_integral_value() and (
            _INT64_MIN <= self.value <= _INT64_MAX
        )

    def as_integer(self) -> int:
        """The value as an int64; :class:`CelEvalError` when it is fractional or too large."""
        if not self.is_integer():
            raise CelEvalError(f"cannot convert value {self.text} to integer")
        return int(self.value)

    def as_approximate_float(self) -> float:
        """The value as a float (possibly rounded)."""
        return float(self.value)

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.value > 0) - (self.value < 0)

    def add(self, other: Quantity | int) -> Quantity:
        """Sum with a quantity or an int."""
        return Quantity(self.value + _operand(other))

    def sub(self, other: Quantity | int) -> Quantity:
        """Difference with a quantity or an int."""
        return Quantity(self.value - _operand(other))


def _operand(other: Quantity | int) -> Decimal:
    if isinstance(other, Quantity):
        return other.value
    if isinstance(other, int) and not isinstance(other, bool):
        return Decimal(other)
    raise CelEvalError(f"no such overload: quantity arithmetic with {type(other).__name__}")


def _format(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")
