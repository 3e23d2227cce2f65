"""Go's ``strconv`` parsers, as cel-go's string conversions use them.

``int('...')``, ``uint('...')``, ``double('...')`` and ``bool('...')`` accept exactly what Go
accepts, which is less and more than Python's ``int``/``float``: no surrounding whitespace and
ASCII digits only (Python takes ``' 1'`` and fullwidth digits); no sign on a uint and no
underscores in an integer; hexadecimal floats with a ``p`` exponent (``0x1.8p1``); a decimal
float too large for a double is an error (Python gives ``inf``); ``T`` and ``F`` are booleans.
Each parser returns None for text Go refuses.
"""

from __future__ import annotations

import math
import re
from typing import Final

_INT: Final = re.compile(r"[+-]?[0-9]+")
_UINT: Final = re.compile(r"[0-9]+")
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9_]+\.?[0-9_]*|\.[0-9_]+)(?:[eE][+-]?[0-9_]+)?")
_HEX: Final = re.compile(
    r"([+-]?)0[xX]((?:[0-9a-fA-F_]+\.?[0-9a-fA-F_]*|\.[0-9a-fA-F_]+))[pP]([+-]?[0-9_]+)"
)
#: Go takes a sign before ``inf`` and ``infinity`` only.
_SPECIAL: Final = re.compile(r"[+-]?(?:inf|infinity)|nan", re.IGNORECASE)
_BOOLS: Final = {
    **dict.fromkeys(("1", "t", "T", "true", "TRUE", "True"), True),
    **dict.fromkeys(("0", "f", "F", "false", "FALSE", "False"), False),
}


def parse_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``'s syntax (the range is the caller's to check)."""
    return int(text) if _INT.fullmatch(text) else None


def parse_uint(text: str) -> int | None:
    """``strconv.ParseUint(text, 10, 64)``'s syntax (no sign)."""
    return int(text) if _UINT.fullmatch(text) else None


def parse_bool(text: str) -> bool | None:
    """``strconv.ParseBool``."""
    return _BOOLS.get(text)


def _underscores_ok(number: str) -> bool:
    """Go's ``underscoreOK``: an underscore only between two digits (a ``0x`` prefix counts
    as a digit)."""
    previous = "^"
    digits = "0123456789"
    if number[:2] in ("0x", "0X"):
        number, previous, digits = number[2:], "0", "0123456789abcdefABCDEF"
    for char in number:
        if char == "_":
            if previous != "0":
                return False
            previous = "_"
        elif char in digits:
            previous = "0"
        else:
            if previous == "_":
                return False
            previous = "!"
    return previous != "_"


def parse_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)``: None for a syntax error and for a finite number
    outside a double's range."""
    if _SPECIAL.fullmatch(text):
        return float(text)
    hexadecimal = _HEX.fullmatch(text)
    if hexadecimal is not None:
        sign, mantissa, exponent = hexadecimal.groups()
        if not _underscores_ok(f"0x{mantissa}p{exponent}"):
            return None
        digits = f"0x{mantissa}p{exponent}".replace("_", "")
        try:
            value = float.fromhex(sign + digits)
        except OverflowError:
            return None
        return value
    if not _DECIMAL.fullmatch(text):
        return None
    body = text.lstrip("+-")
    if "_" in body and not _underscores_ok(body):
        return None
    try:
        value = float(body.replace("_", ""))
    except ValueError:
        return None
    if math.isinf(value):
        return None
    return -value if text.startswith("-") else value
