"""Kubernetes resource quantities: parsing and canonical formatting.

:func:`parse_quantity` implements ``k8s.io/apimachinery/pkg/api/resource.ParseQuantity``: the
same grammar (``^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`` with the suffixes ``n u m k M G T
P E``, ``Ki ... Ei`` and ``e<int>``), non-zero values rounded up to a whole nano, binary values
capped at 2^63-1. Its upstream test table is ported in ``tests/api/test_quantity.py``.

Bounded, because every quantity comes from outside (claims, slices, opaque configs, YAML):
a text longer than :data:`MAX_QUANTITY_TEXT` characters or a value larger in magnitude than
:data:`MAX_QUANTITY` (int64, the largest value ``Quantity.Value()`` returns and the largest
capacity a device can publish) is a :class:`QuantityError`, decided from the exponent before
any arithmetic, so ``1e1500000`` costs microseconds. Kubernetes itself stores such a decimal
quantity; sharegpu refuses it with an error, because no device can ever satisfy it.

Formatting produces the canonical form the API server writes back, so values round-trip.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_UP, Context, Decimal, localcontext

#: The largest magnitude sharegpu accepts (int64; Kubernetes caps binary quantities here).
MAX_QUANTITY = 2**63 - 1
#: The longest quantity text accepted. Canonical quantities are at most 22 characters.
MAX_QUANTITY_TEXT = 128

_BINARY_NAMES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
_DECIMAL_NAMES = ("E", "P", "T", "G", "M", "k")
_BINARY_SUFFIXES = tuple((s, 2 ** (10 * (6 - i))) for i, s in enumerate(_BINARY_NAMES))
_DECIMAL_SUFFIXES = tuple((s, 10 ** (3 * (6 - i))) for i, s in enumerate(_DECIMAL_NAMES))

#: Suffix -> (base, exponent), as apimachinery's suffixer interprets it.
_SUFFIX_EXPONENTS: dict[str, tuple[int, int]] = {
    "n": (10, -9),
    "u": (10, -6),
    "m": (10, -3),
    "": (10, 0),
    "k": (10, 3),
    "M": (10, 6),
    "G": (10, 9),
    "T": (10, 12),
    "P": (10, 15),
    "E": (10, 18),
    "Ki": (2, 10),
    "Mi": (2, 20),
    "Gi": (2, 30),
    "Ti": (2, 40),
    "Pi": (2, 50),
    "Ei": (2, 60),
}
#: The upstream scanner: sign, digits, optional fraction, suffix letters, optional signed digits.
_SCANNER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
#: apimachinery's ``ErrFormatWrong`` text: what the API server answers for a malformed quantity.
FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_FORMAT_WRONG = FORMAT_WRONG
#: The OpenAPI ``pattern`` of a quantity string in a CRD schema, as controller-gen writes it for
#: ``resource.Quantity`` fields, so the API server itself refuses ``"lots"`` or ``"10GB"``.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NANO = Decimal("1e-9")
#: Exact arithmetic for at most MAX_QUANTITY_TEXT digits times 2^60, with room to spare.
_EXACT = Context(prec=2 * MAX_QUANTITY_TEXT + 40, Emax=1000, Emin=-1000, rounding=ROUND_UP)
#: Every value with adjusted exponent above this exceeds MAX_QUANTITY (9.2e18).
_MAX_ADJUSTED = len(str(MAX_QUANTITY)) - 1


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity, or one out of sharegpu's range."""


class QuantityRangeError(QuantityError):
    """A valid quantity larger in magnitude than :data:`MAX_QUANTITY`."""


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """Parse a quantity (``"10Gi"``, ``"500m"``, ``30``) into an exact ``Decimal``.

    Strings follow Kubernetes' grammar exactly (no surrounding spaces, no ``_``, no ``inf``);
    a JSON number is parsed from its text, as ``Quantity.UnmarshalJSON`` does. Raises
    :class:`QuantityError` naming the offending text for anything else, and for values outside
    ``[-MAX_QUANTITY, MAX_QUANTITY]``.
    """
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: expected a number or a string")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:
            raise QuantityRangeError(_out_of_range(value))
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"invalid quantity {value!r}: not a finite number")
        return parse_quantity(repr(value))
    if isinstance(value, Decimal):
        # The exponent first: abs() of a value such as 1E+1500000 overflows the default
        # decimal context.
        if not value.is_finite() or (value and value.adjusted() > _MAX_ADJUSTED):
            raise QuantityRangeError(_out_of_range(value))
        if abs(value) > MAX_QUANTITY:
            raise QuantityRangeError(_out_of_range(value))
        return value
    if not isinstance(value, str):
        raise QuantityError(f"invalid quantity {_show(value)}: expected a number or a string")
    if len(value) > MAX_QUANTITY_TEXT:
        raise QuantityError(
            f"invalid quantity {_show(value)}: longer than {MAX_QUANTITY_TEXT} characters"
        )
    return _parse_text(value)


def _parse_text(text: str) -> Decimal:
    if not text:
        raise QuantityError(f"invalid quantity '': {_FORMAT_WRONG}")
    scanned = _SCANNER.fullmatch(text)
    if scanned is None:
        raise QuantityError(f"invalid quantity {_show(text)}: {_FORMAT_WRONG}")
    sign, whole, fraction, suffix = scanned.groups()
    base, exponent = _interpret_suffix(text, suffix)
    number = Decimal(f"{sign}{whole or '0'}.{fraction or ''}")
    if not number:
        return Decimal(0)
    if base == 2:
        # At most MAX_QUANTITY_TEXT digits times 2^60: exact and cheap. Kubernetes caps
        # binary quantities at 2^63-1 instead of refusing them.
        with localcontext(_EXACT):
            amount = _round_up_to_nano(number * (2**exponent))
        return _signed(min(abs(amount), Decimal(MAX_QUANTITY)), number)
    adjusted = number.adjusted() + exponent
    if adjusted > _MAX_ADJUSTED:
        raise QuantityRangeError(_out_of_range(text))
    if adjusted < -10:
        # Below a nano: Kubernetes rounds every non-zero amount up to 1n.
        return _signed(_NANO, number)
    with localcontext(_EXACT):
        amount = _round_up_to_nano(number.scaleb(exponent))
    if abs(amount) > MAX_QUANTITY:
        raise QuantityRangeError(_out_of_range(text))
    return amount


def _interpret_suffix(text: str, suffix: str) -> tuple[int, int]:
    """(base, exponent) of a suffix, as apimachinery's suffixer reads it."""
    known = _SUFFIX_EXPONENTS.get(suffix)
    if known is not None:
        return known
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(f"invalid quantity {_show(text)}: unable to parse quantity's suffix")
    parsed = int(exponent.group(1))
    if not _INT64_MIN <= parsed <= _INT64_MAX:
        raise QuantityError(f"invalid quantity {_show(text)}: unable to parse quantity's suffix")
    # apimachinery parses the exponent as int64 and keeps its low 32 bits (int32(parsed)).
    return 10, (parsed + 2**31) % 2**32 - 2**31


def _round_up_to_nano(amount: Decimal) -> Decimal:
    """``amount`` rounded away from zero to a whole nano, as ParseQuantity rounds; whole
    numbers come back without exponent (``Decimal(1000000000)``, not ``1E+9``)."""
    rounded = amount.quantize(_NANO, rounding=ROUND_UP)
    if rounded == rounded.to_integral_value():
        return Decimal(int(rounded))
    return rounded.normalize()


def _signed(magnitude: Decimal, like: Decimal) -> Decimal:
    return -magnitude if like < 0 else magnitude


def _out_of_range(value: object) -> str:
    return (
        f"invalid quantity {_show(value)}: out of range, sharegpu accepts quantities up to "
        f"{MAX_QUANTITY} (2^63-1) in magnitude"
    )


def _show(value: object) -> str:
    """The offending input, quoted and cut short so a huge input makes a short message."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:40] + "...") if len(text) > 40 else repr(text)


def quantity_int(value: str | int | float | Decimal) -> int:
    """Parse a quantity and round it up to an integer, as ``Quantity.Value()`` does."""
    d = parse_quantity(value)
    i = int(d)
    return i + 1 if d > i else i


def quantity_whole(value: str | int | float | Decimal) -> int:
    """Parse a quantity that must be a whole number, exactly; :class:`QuantityError` for a
    fraction (``12500m``), which nothing here rounds: rounding it up would grant more than was
    allocated, rounding it down would drop part of what was."""
    d = parse_quantity(value)
    if d != d.to_integral_value():
        raise QuantityError(f"{_show(value)} is not a whole number")
    return int(d)


def format_quantity(value: int) -> str:
    """Canonical text of an integer quantity: the largest exact binary suffix (``80Gi``),
    else the largest exact decimal one (``3k``), else the plain integer."""
    if value == 0:
        return "0"
    for suffix, factor in _BINARY_SUFFIXES:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    for suffix, factor in _DECIMAL_SUFFIXES:
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def format_bytes_human(value: int) -> str:
    """Short human-readable size for tables (``79.6Gi``); not a canonical quantity."""
    for suffix, factor in _BINARY_SUFFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.1f}{suffix}".replace(".0" + suffix, suffix)
    return str(value)


#: ``<number><letters>`` as users write sizes and percentages (``10GB``, ``10gi``, ``30%``).
_HINT_SHAPE = re.compile(r"\s*([+-]?[0-9]*\.?[0-9]+)\s*([A-Za-z%]*)\s*")
#: Lower-case size letter -> (decimal suffix, binary suffix, power of ten, power of two).
_SIZE_LETTERS: dict[str, tuple[str, str, int, int]] = {
    "k": ("k", "Ki", 3, 10),
    "m": ("M", "Mi", 6, 20),
    "g": ("G", "Gi", 9, 30),
    "t": ("T", "Ti", 12, 40),
    "p": ("P", "Pi", 15, 50),
    "e": ("E", "Ei", 18, 60),
}


def quantity_hint(text: object) -> str | None:
    """How to fix a text that is not a Kubernetes quantity, when it is a common near miss.

    The one rule for such hints (the admission checks and GpuConfig messages use it): sizes
    written with a byte unit, in the wrong case or with a space (``10GB``, ``10gi``, ``10 Gi``)
    get the decimal and the binary spelling, a plain byte count with ``B`` the number alone, and
    a percentage (``30%``) the number without ``%``. None when ``text`` parses as a quantity or
    is no known near miss. Pure: it only reads ``text``.
    """
    if not isinstance(text, str) or len(text) > MAX_QUANTITY_TEXT:
        return None
    try:
        parse_quantity(text)
    except QuantityError:
        pass
    else:
        return None
    shape = _HINT_SHAPE.fullmatch(text)
    if shape is None:
        return None
    number, unit = shape.groups()
    head = f'"{text}" is not a Kubernetes quantity'
    if unit == "%":
        return (
            f'{head}: write {number} without "%"; cores are a number from 1 to 100 '
            "(percent of a GPU), memory is bytes such as 10Gi"
        )
    letters = unit.lower().removesuffix("b").removesuffix("i")
    size = _SIZE_LETTERS.get(letters) if len(letters) == 1 else None
    if size is not None and unit.lower() in (letters, letters + "b", letters + "i", letters + "ib"):
        decimal, binary, ten, two = size
        return f"{head}: use {number}{decimal} (10^{ten} bytes) or {number}{binary} (2^{two} bytes)"
    if unit.lower() == "b":
        return f"{head}: write plain bytes without B ({number})"
    return None
