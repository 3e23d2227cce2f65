"""The ``Quantity`` CEL type of Kubernetes (``k8s.io/apiserver/pkg/cel/library/quantity.go``).

A Quantity is an exact decimal; ``compareTo`` and the comparisons are by value, so
``quantity('1Gi')`` equals ``quantity('1024Mi')``.

``isInteger``/``asInteger`` answer as apimachinery's ``Quantity.AsInt64`` does, which depends
on how ``ParseQuantity`` stored the value: as an int64 with a decimal scale (its fast path,
kept here as :attr:`Quantity.int64`) or as an arbitrary-precision decimal (``inf.Dec``, here
``None``). Only an int64 form of scale >= 0 whose value fits an int64 converts: ``1500m``,
``2000m``, ``1.0``, ``1.5Gi``, ``1Ei`` and ``9223372036854775807`` do not (the last three are
stored as decimals), ``16G`` and ``80Gi`` do. ``add``/``sub`` keep the int64 form while it
does not overflow, as ``Quantity.Add`` does.

A decimal quantity beyond int64 (``quantity('10E')``) is valid, as in Kubernetes, up to
:data:`MAX_DECIMAL_EXPONENT` (the project's API types refuse such values elsewhere).
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Decimal, localcontext
from typing import Final

from api.quantity import FORMAT_WRONG, QuantityError, QuantityRangeError, parse_quantity

from .errors import CelEvalError

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
#: The largest power of ten of a decimal quantity beyond int64 accepted here (Kubernetes
#: takes any int32 exponent; arithmetic on such values is exact and so unbounded there).
MAX_DECIMAL_EXPONENT: Final = 1000
#: apimachinery's ``maxInt64Factors``: the decimal digits its fast path takes.
_MAX_INT64_FACTORS: Final = 18
_NANO_SCALE: Final = -9
_SCANNER: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)")
_DECIMAL_SUFFIXES: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_EXPONENT: Final = re.compile(r"[eE]([+-]?[0-9]+)")

Int64Form = tuple[int, int]


class Quantity:
    """An immutable Kubernetes quantity with the CEL methods of the quantity library.

    ``value`` is the exact value, ``int64`` the ``(value, scale)`` of apimachinery's int64
    form (the quantity is ``value * 10**scale``) or None when it stores a decimal.
    ``arithmetic`` marks a result of ``add`` or ``sub``: Kubernetes returns those as a pointer
    (``*Quantity``), which its ``Quantity.Equal`` does not accept as the other operand
    (``q == q.add(0)`` is "no such overload"; ``q.add(0) == q`` is true)."""

    __slots__ = ("arithmetic", "int64", "text", "value")

    def __init__(
        self,
        value: Decimal,
        text: str | None = None,
        int64: Int64Form | None = None,
        *,
        arithmetic: bool = False,
    ) -> None:
        self.value = value
        self.text = text if text is not None else _format(value)
        self.int64 = int64
        self.arithmetic = arithmetic

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse ``text`` (``"10Gi"``, ``"500m"``); :class:`CelEvalError` if it is no quantity."""
        try:
            value = parse_quantity(text)
        except QuantityRangeError:
            value = _large_decimal(text)
        except QuantityError as exc:
            raise CelEvalError(f"quantities must match the regular expression: {exc}") from exc
        return cls(value, text, _int64_form(text))

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
        """``Quantity.AsInt64``'s ok: an int64 form of scale >= 0 whose value fits."""
        return self._as_int64() is not None

    def _as_int64(self) -> int | None:
        if self.int64 is None:
            return None
        value, scale = self.int64
        if scale < 0:
            return None
        return _scaled(value, scale)

    def as_integer(self) -> int:
        """The value as an int64; :class:`CelEvalError` where ``AsInt64`` cannot convert."""
        result = self._as_int64()
        if result is None:
            raise CelEvalError("cannot convert value to integer")
        return result

    def as_approximate_float(self) -> float:
        """The value as a float (possibly rounded)."""
        return float(self.value)

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.value > 0) - (self.value < 0)

    def add(self, other: Quantity | int) -> Quantity:
        """Sum with a quantity or an int."""
        value, form = _operand(other)
        return Quantity(self.value + value, int64=_add_int64(self.int64, form), arithmetic=True)

    def sub(self, other: Quantity | int) -> Quantity:
        """Difference with a quantity or an int."""
        value, form = _operand(other)
        if form is not None and form[0] == _INT64_MIN:
            # Go's negation of the smallest int64 is itself: apimachinery's int64 Sub then
            # adds it (1Gi.sub(-2^63) is 1Gi - 2^63), unless that overflows too.
            wrapped = _add_int64(self.int64, form)
            if wrapped is not None:
                return Quantity(self.value + value, int64=wrapped, arithmetic=True)
        negated = None if form is None else (-form[0], form[1])
        int64 = _add_int64(self.int64, negated)
        return Quantity(self.value - value, int64=int64, arithmetic=True)


def _scaled(value: int, scale: int) -> int | None:
    """``value * 10**scale`` when it fits an int64 (``positiveScaleInt64``), else None."""
    result = value * 10**scale
    return result if _INT64_MIN <= result <= _INT64_MAX else None


def _add_int64(a: Int64Form | None, b: Int64Form | None) -> Int64Form | None:
    """apimachinery's ``int64Amount.Add``: the sum in int64 form at the smaller scale, or None
    (a decimal) when either is a decimal or the sum overflows."""
    if a is None or b is None:
        return None
    (av, ascale), (bv, bscale) = a, b
    if bv == 0:
        return a
    if av == 0:
        return b
    low = min(ascale, bscale)
    left, right = _scaled(av, ascale - low), _scaled(bv, bscale - low)
    if left is None or right is None or not _INT64_MIN <= left + right <= _INT64_MAX:
        return None
    return left + right, low


def _operand(other: Quantity | int) -> tuple[Decimal, Int64Form | None]:
    if isinstance(other, Quantity):
        return other.value, other.int64
    if isinstance(other, int) and not isinstance(other, bool):
        return Decimal(other), (other, 0)
    raise CelEvalError(f"no such overload: quantity arithmetic with {type(other).__name__}")


def _int64_form(text: str) -> Int64Form | None:
    """The int64 form ``ParseQuantity`` stores ``text`` in (its fast path), or None when it
    stores a decimal. ``text`` is a valid quantity."""
    if text == "0":
        return 0, 0
    scanned = _SCANNER.fullmatch(text)
    if scanned is None:
        return None
    sign, whole, denom, suffix = scanned.groups()
    num = whole.lstrip("0") or "0"
    denom = denom or ""
    if not whole.strip("0") and not denom and not suffix:
        return 0, 0
    mantissa = 1
    if suffix in _BINARY_SUFFIXES:
        exponent = _BINARY_SUFFIXES[suffix]
        if denom:
            return None
        mantissa = 1 << exponent
        precision = 15 - len(num) - exponent * 3 // 10 - 1
        scale = 0
    else:
        if suffix in _DECIMAL_SUFFIXES:
            scale = _DECIMAL_SUFFIXES[suffix]
        else:
            match = _EXPONENT.fullmatch(suffix)
            if match is None:
                return None
            scale = (int(match.group(1)) + 2**31) % 2**32 - 2**31
        precision = _MAX_INT64_FACTORS - len(num) - len(denom)
    if precision < 0:
        return None
    scale -= len(denom)
    if scale < _NANO_SCALE:
        return None
    result = int(num + denom) * mantissa
    if not _INT64_MIN <= result <= _INT64_MAX:
        return None
    return (-result if sign == "-" else result), scale


def _large_decimal(text: str) -> Decimal:
    """A decimal quantity beyond int64 (Kubernetes stores it as ``inf.Dec``), rounded up to
    a whole nano; :class:`CelEvalError` beyond :data:`MAX_DECIMAL_EXPONENT`."""
    scanned = _SCANNER.fullmatch(text)
    match = _EXPONENT.fullmatch(scanned.group(4)) if scanned else None
    exponent = _DECIMAL_SUFFIXES.get(scanned.group(4)) if scanned else None
    if scanned is not None and exponent is None and match is not None:
        exponent = int(match.group(1))
    if scanned is None or exponent is None:
        raise CelEvalError(f"quantities must match the regular expression: {FORMAT_WRONG}")
    sign, whole, fraction, _ = scanned.groups()
    number = Decimal(f"{sign}{whole or '0'}.{fraction or ''}")
    if number.adjusted() + exponent > MAX_DECIMAL_EXPONENT:
        raise CelEvalError(
            f"invalid quantity {text[:40]!r}: sharegpu accepts quantities up to "
            f"1e{MAX_DECIMAL_EXPONENT} in CEL"
        )
    with localcontext() as context:
        context.prec = 2 * MAX_DECIMAL_EXPONENT + 200
        context.Emax = 4 * MAX_DECIMAL_EXPONENT
        return number.scaleb(exponent).quantize(Decimal("1e-9"), rounding=ROUND_UP)


def _format(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")
