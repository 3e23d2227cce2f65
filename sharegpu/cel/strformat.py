"""``<string>.format(<list>)`` and ``strings.quote`` of cel-go's strings extension.

Kubernetes' base environment has version 2 of that extension, so ``format`` behaves as
cel-go's first formatter (before the cel-spec rewrite of version 4): clauses ``%s %d %f %e
%b %o %x %X`` with an optional precision (``%.3f``), ``%%`` for a percent sign, the
``en_US`` number style for ``%f`` and ``%e`` (``1,234.500000``; a mantissa, narrow no-break
spaces, a multiplication sign and a superscript exponent; an infinity sign; ``%e`` takes
its precision as a field width, as cel-go v0.26.0 does), and errors worded as cel-go words
them. :func:`check_format` is cel-go's compile-time check of a constant format string;
:func:`go_double` is Go's ``%g`` (how CEL prints a double).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .celtypes import CelType
from .errors import CelEvalError
from .timevalues import Duration, Timestamp
from .values import type_name

DEFAULT_PRECISION = 6
_SUPERSCRIPT = str.maketrans(
    "0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b"
)
_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _cel_type_name(value: Any) -> str:
    name = type_name(value)
    return {"Quantity": "kubernetes.Quantity", "Semver": "kubernetes.Semver"}.get(name, name)


def _go_exponent(exp: int) -> str:
    return f"{'-' if exp < 0 else '+'}{abs(exp):02d}"


def go_double(value: float) -> str:
    """Go's ``fmt.Sprintf("%g", value)``: shortest digits, exponent form from 1e6 up
    (and below 1e-4), ``+Inf``/``-Inf``/``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    digits_text = repr(abs(value))
    mantissa, _, exp_text = digits_text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + (int(exp_text) if exp_text else 0)
    if whole == "0":
        stripped = frac.lstrip("0")
        point = -(len(frac) - len(stripped)) + (int(exp_text) if exp_text else 0)
        digits = stripped
    digits = digits.rstrip("0") or "0"
    exp = point - 1
    sign = "-" if value < 0 else ""
    if exp < -4 or exp >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{body}e{_go_exponent(exp)}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def quote(text: str) -> str:
    """``strings.quote``: double quotes, C escapes for control characters, ``\\`` and ``"``;
    invalid UTF-8 (lone surrogates here) becomes U+FFFD."""
    out = []
    for ch in text:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            ch = "\ufffd"
        out.append(_QUOTE_ESCAPES.get(ch, ch))
    return '"' + "".join(out) + '"'


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string."""
    out = []
    for ch in text:
        if ch in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


#: Per clause: the static types cel-go's compile-time check accepts for its argument, and the
#: start of the error a value of another type gets (at compile time and at evaluation).
_CLAUSE_TYPES: dict[str, tuple[frozenset[str], str]] = {
    "s": (
        frozenset(
            {
                "list",
                "map",
                "int",
                "uint",
                "double",
                "bool",
                "string",
                "google.protobuf.Timestamp",
                "bytes",
                "google.protobuf.Duration",
                "type",
                "null_type",
            }
        ),
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, "
        "types, durations, and timestamps",
    ),
    "d": (frozenset({"int", "uint"}), "decimal clause can only be used on integers"),
    "f": (frozenset({"double", "string"}), "fixed-point clause can only be used on doubles"),
    "e": (frozenset({"double", "string"}), "scientific clause can only be used on doubles"),
    "b": (frozenset({"int", "uint", "bool"}), "only integers and bools can be formatted as binary"),
    "x": (
        frozenset({"int", "uint", "string", "bytes"}),
        "only integers, byte buffers, and strings can be formatted as hex",
    ),
    "o": (frozenset({"int", "uint"}), "octal clause can only be used on integers"),
}
_CLAUSE_TYPES["X"] = _CLAUSE_TYPES["x"]


def clause_type_error(verb: str, type_name: str) -> str:
    """cel-go's message for the clause ``%<verb>`` given a value of CEL type ``type_name``."""
    return f"{_CLAUSE_TYPES[verb][1]}, was given {type_name}"


def check_format(fmt: str, arg_types: Sequence[str]) -> str | None:
    """cel-go's compile-time check of ``'<fmt>'.format([<list literal>])`` (strings
    extension, version 1 to 3): the error for a bad clause, a missing argument, an argument
    whose static CEL type (``arg_types``, ``dyn`` when unknown) the clause refuses, or
    arguments left over; ``None`` when the call is valid. The order of the checks is cel-go's.
    """
    i = index = 0
    while i < len(fmt):
        if fmt[i] != "%":
            i += 1
            continue
        if fmt[i + 1 : i + 2] == "%":
            i += 2
            continue
        if i + 1 >= len(fmt):
            return "unexpected end of string"
        if index >= len(arg_types):
            return f"index {index} out of range"
        try:
            end, verb, _ = _parse_clause(fmt, i + 1)
        except CelEvalError as exc:
            return exc.message
        arg_type = arg_types[index]
        if arg_type != "dyn" and arg_type not in _CLAUSE_TYPES[verb][0]:
            return "error during formatting: " + clause_type_error(verb, arg_type)
        i = end
        index += 1
    if len(arg_types) > index:
        return (
            f"too many arguments supplied to string.format (expected {index}, got {len(arg_types)})"
        )
    return None


class _ClauseError(Exception):
    """A formatting clause applied to a value it cannot format."""


def _to_text(value: Any) -> str:
    """``%s``: the value's string conversion; lists and maps in CEL literal style."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_in_aggregate(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return _format_map(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return go_double(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Timestamp | Duration | CelType):
        return str(value)
    raise _ClauseError(clause_type_error("s", _cel_type_name(value)))


def _in_aggregate(value: Any) -> str:
    """A list element or map value: typed formatting, then CEL quoting where needed."""
    if isinstance(value, float):
        text = go_fixed(value, DEFAULT_PRECISION)
        return go_quote(text) if math.isinf(value) or math.isnan(value) else text
    if isinstance(value, Timestamp):
        return f"timestamp({go_quote(str(value))})"
    if isinstance(value, Duration):
        return f"duration({go_quote(str(value))})"
    text = _to_text(value)
    if isinstance(value, str):
        return go_quote(text)
    if isinstance(value, bytes):
        return "b" + go_quote(text)
    return text


def _format_map(value: Mapping[Any, Any]) -> str:
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str | bool | int):
            raise _ClauseError(f"no formatting function for map key of type {_cel_type_name(key)}")
        key_text = go_quote(key) if isinstance(key, str) else _to_text(key)
        pairs.append((key_text, _in_aggregate(item)))
    pairs.sort(key=lambda pair: pair[0])
    return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"


def _decimal(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    raise _ClauseError(clause_type_error("d", _cel_type_name(value)))


def _as_double(value: Any, verb: str) -> float:
    if isinstance(value, float):
        return value
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    raise _ClauseError(clause_type_error(verb, _cel_type_name(value)))


def _special(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "\u221e" if value > 0 else "-\u221e"
    return None


def _fixed(value: float, precision: int) -> str:
    """``%f`` in the ``en_US`` style: digit grouping, ``∞`` for infinities."""
    special = _special(value)
    return special if special is not None else f"{value:,.{precision}f}"


def go_fixed(value: float, precision: int) -> str:
    """Go's ``%.<precision>f`` (``NaN``, ``+Inf``, ``-Inf`` for the special values)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.{precision}f}"


def _scientific(value: float, precision: int) -> str:
    special = _special(value)
    if special is not None:
        return special
    mantissa, _, exp = f"{value:.{precision}e}".partition("e")
    exponent = int(exp)
    digits = f"{abs(exponent):02d}"
    power = ("-" if exponent < 0 else "") + digits
    return f"{mantissa}\u202f\u00d7\u202f10{power.translate(_SUPERSCRIPT)}"


def _binary(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return format(int(value), "b")
    raise _ClauseError(clause_type_error("b", _cel_type_name(value)))


def _hex(value: Any, upper: bool) -> str:
    if isinstance(value, str):
        text = value.encode("utf-8", "surrogateescape").hex()
    elif isinstance(value, bytes):
        text = value.hex()
    elif isinstance(value, int) and not isinstance(value, bool):
        text = format(int(value), "x")
    else:
        raise _ClauseError(clause_type_error("x", _cel_type_name(value)))
    return text.upper() if upper else text


def _octal(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return format(int(value), "o")
    raise _ClauseError(clause_type_error("o", _cel_type_name(value)))


def _clause(verb: str, precision: int | None, value: Any) -> str:
    p = DEFAULT_PRECISION if precision is None else precision
    if verb == "s":
        return _to_text(value)
    if verb == "d":
        return _decimal(value)
    if verb == "f":
        return _fixed(_as_double(value, "f"), p)
    if verb == "e":
        # cel-go v0.26.0 builds "%<precision>e" for this clause: the precision becomes a
        # field width (right-aligned, counted in characters) and the precision stays 6.
        text = _scientific(_as_double(value, "e"), DEFAULT_PRECISION)
        return text.rjust(precision or 0)
    if verb == "b":
        return _binary(value)
    if verb in ("x", "X"):
        return _hex(value, verb == "X")
    return _octal(value)


def _parse_clause(fmt: str, start: int) -> tuple[int, str, int | None]:
    """The end of the clause starting after ``%`` at ``start``, its verb and precision."""
    i = start
    precision = None
    if fmt[i] == ".":
        i += 1
        digits_start = i
        while True:
            if i >= len(fmt):
                raise CelEvalError(
                    "could not parse formatting clause: error while parsing precision: "
                    "could not find end of precision specifier"
                )
            if not ("0" <= fmt[i] <= "9"):
                break
            i += 1
        digits = fmt[digits_start:i]
        if not digits:
            raise CelEvalError(
                "could not parse formatting clause: error while parsing precision: error while "
                'converting precision to integer: strconv.Atoi: parsing "": invalid syntax'
            )
        precision = int(digits)
    verb = fmt[i]
    if verb not in "sdfebxXo":
        raise CelEvalError(
            f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
        )
    return i + 1, verb, precision


def format_string(fmt: str, args: Any) -> str:
    """``fmt.format(args)``; :class:`CelEvalError` with cel-go's message on a bad clause,
    a missing argument or a value of the wrong type."""
    if not isinstance(args, list | tuple):
        raise CelEvalError(f"no such overload: format(string, {type_name(args)})")
    out: list[str] = []
    i = 0
    index = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        if i + 1 < len(fmt) and fmt[i + 1] == "%":
            out.append("%")
            i += 2
            continue
        if index >= len(args):
            raise CelEvalError(f"index {index} out of range")
        if i + 1 >= len(fmt):
            raise CelEvalError("unexpected end of string")
        end, verb, precision = _parse_clause(fmt, i + 1)
        try:
            out.append(_clause(verb, precision, args[index]))
        except _ClauseError as exc:
            raise CelEvalError(f"error during formatting: {exc}") from None
        i = end
        index += 1
    return "".join(out)
