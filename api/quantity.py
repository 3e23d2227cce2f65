"""Kubernetes resource quantities: parsing and canonical formatting.

Parsing uses the kubernetes client's parser (exact ``Decimal`` arithmetic); formatting produces
the canonical form the API server writes back, so values round-trip unchanged.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from kubernetes.utils.quantity import parse_quantity as _parse

_BINARY_NAMES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
_DECIMAL_NAMES = ("E", "P", "T", "G", "M", "k")
_BINARY_SUFFIXES = tuple((s, 2 ** (10 * (6 - i))) for i, s in enumerate(_BINARY_NAMES))
_DECIMAL_SUFFIXES = tuple((s, 10 ** (3 * (6 - i))) for i, s in enumerate(_DECIMAL_NAMES))


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity."""


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """Parse a quantity (``"10Gi"``, ``"500m"``, ``30``) into an exact ``Decimal``.

    Raises :class:`QuantityError` with the offending text for anything else.
    """
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: expected a number or a string")
    try:
        return Decimal(_parse(value))
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise QuantityError(f"invalid quantity {value!r}: {exc}") from exc


def quantity_int(value: str | int | float | Decimal) -> int:
    """Parse a quantity and round it up to an integer, as ``Quantity.Value()`` does."""
    d = parse_quantity(value)
    i = int(d)
    return i + 1 if d > i else i


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
