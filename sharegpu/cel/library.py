"""Functions of the Kubernetes CEL environment for DRA selectors.

Two tables: global functions (``quantity('1Gi')``) and receiver-style methods
(``q.compareTo(r)``, receiver first). Each entry lists the argument counts it accepts, which
the compiler checks. Covered: the CEL standard functions and conversions (timestamps,
durations and type values included), cel-go's strings extension at version 2 (``format`` and
``strings.quote`` included), its sets extension and lists extension at version 3, and
Kubernetes' lists, regex (RE2), URL, IP, CIDR, quantity, semver and named-format
libraries (:mod:`sharegpu.cel.namedformats`).

Namespaced functions (``sets.contains``, ``lists.range``, ``strings.quote``,
``ip.isCanonical``) are global functions whose names contain a dot: the compiler resolves
``ns.f(args)`` to ``GLOBAL_FUNCTIONS['ns.f']`` when ``ns`` is not a variable. Method names that
start with ``@`` cannot be written in an expression; the compiler emits them for macros
(``sortBy``). :data:`TYPE_IDENTIFIERS` lists the identifiers that denote type values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from . import gostrconv, lib_lists, lib_net, lib_time, namedformats, re2regex
from .celtypes import TYPE_IDENTIFIERS, CelType, type_of
from .errors import CelEvalError
from .netaddr import CIDR, IP
from .quantity import Quantity
from .semver import Semver
from .strformat import format_string, go_double, quote
from .timevalues import Duration, Timestamp
from .values import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    UInt,
    cel_add,
    comparable,
    compare_result,
    no_overload,
    type_name,
)

__all__ = ["GLOBAL_FUNCTIONS", "METHODS", "TYPE_IDENTIFIERS", "Function", "constant_call_error"]


def constant_call_error(name: str, args: tuple[Any, ...]) -> str | None:
    """The compile error Kubernetes reports for a call of ``name`` with these arguments
    (receiver first for a method; ``None`` stands for an argument that is not a constant),
    or ``None`` when it reports none.

    Kubernetes (1.29+) checks the constant string arguments that matter whatever the other
    arguments are: the pattern of ``matches`` (cel-go's regex literal validator), of ``find``
    and ``findAll`` (the regex precompilation of its regex library), and the literal argument of
    ``duration()`` and ``timestamp()`` (cel-go's duration and timestamp literal validators:
    ``timestamp(-62135596801)`` is refused as ``timestamp('0000-...')`` is).
    So ``device.driver.matches('(?<=a)b')`` fails to compile although the receiver is not a
    constant.
    """
    if name in ("matches", "find", "findAll") and len(args) >= 2 and isinstance(args[1], str):
        return re2regex.compile_time_message(name, args[1])
    if name in ("duration", "timestamp") and len(args) == 1 and args[0] is not None:
        try:
            (lib_time.duration if name == "duration" else lib_time.timestamp)(args[0])
        except CelEvalError:
            return f"invalid {name} argument"
    return None


@dataclass(frozen=True)
class Function:
    """A CEL function: its implementation and the numbers of arguments it accepts."""

    impl: Callable[..., Any]
    arities: frozenset[int]


def _fn(impl: Callable[..., Any], *arities: int) -> Function:
    return Function(impl, frozenset(arities))


def _expect(op: str, cond: bool, *args: Any) -> None:
    if not cond:
        raise no_overload(op, *args)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool | UInt)


# --- standard functions -------------------------------------------------------------------


_TWO_63 = 2.0**63
_TWO_64 = 2.0**64


def _size(v: Any) -> int:
    if isinstance(v, str | bytes | list | tuple | Mapping):
        return len(v)
    raise no_overload("size", v)


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise no_overload("int", v)
    if isinstance(v, Timestamp):
        return v.unix_seconds()
    if isinstance(v, Duration):
        return v.nanos
    if isinstance(v, int):
        result = int(v)
    elif isinstance(v, float):
        # cel-go refuses both bounds: float64(2^63 - 1) is 2^63, and -2^63 is refused alike.
        if not -_TWO_63 < v < _TWO_63:
            raise CelEvalError("double out of range for int conversion")
        result = int(v)
    elif isinstance(v, str):
        parsed = gostrconv.parse_int(v)
        if parsed is None:
            raise CelEvalError(f"cannot convert {v!r} to int")
        result = parsed
    else:
        raise no_overload("int", v)
    if not INT64_MIN <= result <= INT64_MAX:
        raise CelEvalError("int out of range")
    return result


def _to_uint(v: Any) -> UInt:
    if isinstance(v, bool):
        raise no_overload("uint", v)
    if isinstance(v, int | float):
        if isinstance(v, float) and not 0.0 <= v < _TWO_64:
            raise CelEvalError("double out of range for uint conversion")
        result = int(v)
    elif isinstance(v, str):
        parsed = gostrconv.parse_uint(v)
        if parsed is None:
            raise CelEvalError(f"cannot convert {v!r} to uint")
        result = parsed
    else:
        raise no_overload("uint", v)
    if not 0 <= result <= UINT64_MAX:
        raise CelEvalError("uint out of range")
    return UInt(result)


def _to_double(v: Any) -> float:
    if isinstance(v, bool):
        raise no_overload("double", v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        parsed = gostrconv.parse_float(v)
        if parsed is None:
            raise CelEvalError(f"cannot convert {v!r} to double")
        return parsed
    raise no_overload("double", v)


def _to_string(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return go_double(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise CelEvalError("invalid UTF-8 in bytes to string conversion") from None
    if isinstance(v, IP | CIDR | Timestamp | Duration):
        return str(v)
    # No overload takes a quantity, a semver or a URL (Kubernetes has none).
    raise no_overload("string", v)


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        parsed = gostrconv.parse_bool(v)
        if parsed is None:
            raise CelEvalError(f"cannot convert {v!r} to bool")
        return parsed
    raise no_overload("bool", v)


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    raise no_overload("bytes", v)


def _contains(s: Any, sub: Any) -> bool:
    _expect("contains", isinstance(s, str) and isinstance(sub, str), s, sub)
    return bool(sub in s)


def _starts_with(s: Any, prefix: Any) -> bool:
    _expect("startsWith", isinstance(s, str) and isinstance(prefix, str), s, prefix)
    return bool(s.startswith(prefix))


def _ends_with(s: Any, suffix: Any) -> bool:
    _expect("endsWith", isinstance(s, str) and isinstance(suffix, str), s, suffix)
    return bool(s.endswith(suffix))


def _type(v: Any) -> CelType:
    return type_of(v, type_name(v))


def _matches(s: Any, pattern: Any) -> bool:
    _expect("matches", isinstance(s, str) and isinstance(pattern, str), s, pattern)
    return re2regex.matches(s, pattern)


# --- Kubernetes string and regex extensions ----------------------------------------------


def _char_at(s: Any, i: Any) -> str:
    _expect("charAt", isinstance(s, str) and _is_int(i), s, i)
    if not 0 <= i <= len(s):
        raise CelEvalError(f"index out of range: {i}")
    return str(s[i : i + 1])


def _index_of(s: Any, sub: Any, start: Any = 0) -> int:
    if isinstance(s, list | tuple):
        from .values import cel_eq

        for i, item in enumerate(s):
            if cel_eq(item, sub):
                return i
        return -1
    _expect("indexOf", isinstance(s, str) and isinstance(sub, str) and _is_int(start), s, sub)
    if start < 0:
        raise CelEvalError(f"index out of range: {start}")
    if sub == "":
        return min(int(start), len(s))  # cel-go clamps the empty match to the end
    if start >= len(s):
        return -1
    return int(s.find(sub, start))


def _last_index_of(s: Any, sub: Any, end: Any = None) -> int:
    if isinstance(s, list | tuple):
        from .values import cel_eq

        for i in range(len(s) - 1, -1, -1):
            if cel_eq(s[i], sub):
                return i
        return -1
    _expect("lastIndexOf", isinstance(s, str) and isinstance(sub, str), s, sub)
    if end is None:
        if sub == "":
            return len(s)
        if len(s.encode()) < len(sub.encode()):
            return -1
        end = len(s) - 1
    _expect("lastIndexOf", _is_int(end), s, sub, end)
    if end < 0:
        raise CelEvalError(f"index out of range: {end}")
    if sub == "":
        return min(int(end), len(s))  # cel-go clamps the empty match to the end
    if end >= len(s):
        return -1
    return int(s.rfind(sub, 0, end + len(sub)))


def _lower_ascii(s: Any) -> str:
    _expect("lowerAscii", isinstance(s, str), s)
    return "".join(c.lower() if c.isascii() else c for c in s)


def _upper_ascii(s: Any) -> str:
    _expect("upperAscii", isinstance(s, str), s)
    return "".join(c.upper() if c.isascii() else c for c in s)


def _replace(s: Any, old: Any, new: Any, n: Any = -1) -> str:
    _expect("replace", all(isinstance(x, str) for x in (s, old, new)) and _is_int(n), s, old, new)
    return str(s.replace(old, new, n if n >= 0 else -1))


def _split(s: Any, sep: Any, n: Any = -1) -> list[str]:
    _expect("split", isinstance(s, str) and isinstance(sep, str) and _is_int(n), s, sep)
    if n == 0:
        return []
    if sep == "":
        chars = list(s)
        if n > 0 and len(chars) > n:
            chars = [*chars[: n - 1], "".join(chars[n - 1 :])]
        return chars
    return list(s.split(sep, n - 1 if n > 0 else -1))


def _substring(s: Any, start: Any, end: Any = None) -> str:
    stop = len(s) if end is None and isinstance(s, str) else end
    _expect("substring", isinstance(s, str) and _is_int(start) and _is_int(stop), s, start)
    if start > stop and end is not None:
        raise CelEvalError(f"invalid substring range. start: {start}, end: {stop}")
    for index in (start, stop):
        if not 0 <= index <= len(s):
            raise CelEvalError(f"index out of range: {index}")
    return str(s[start:stop])


#: What Go's ``unicode.IsSpace`` (and so cel-go's ``trim``) counts as white space.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
)


def _trim(s: Any) -> str:
    _expect("trim", isinstance(s, str), s)
    return str(s.strip(_GO_SPACE))


def _join(items: Any, sep: Any = "") -> str:
    _expect("join", isinstance(items, list | tuple) and isinstance(sep, str), items, sep)
    if not all(isinstance(x, str) for x in items):
        raise no_overload("join", items)
    return str(sep.join(items))


def _find(s: Any, pattern: Any) -> str:
    _expect("find", isinstance(s, str) and isinstance(pattern, str), s, pattern)
    return re2regex.find(s, pattern)


def _find_all(s: Any, pattern: Any, n: Any = -1) -> list[str]:
    _expect("findAll", isinstance(s, str) and isinstance(pattern, str) and _is_int(n), s, pattern)
    return re2regex.find_all(s, pattern, n)


def _format(s: Any, args: Any) -> str:
    _expect("format", isinstance(s, str) and isinstance(args, list | tuple), s, args)
    return format_string(s, args)


def _quote(s: Any) -> str:
    _expect("strings.quote", isinstance(s, str), s)
    return quote(s)


# --- Kubernetes list extensions ----------------------------------------------------------


def _is_sorted(items: Any) -> bool:
    """Kubernetes' ``isSorted``: every element must be comparable, met in order; false at
    the first element smaller than the one before (a comparison that errs is passed over)."""
    _expect("isSorted", isinstance(items, list | tuple), items)
    previous: Any = _NOTHING
    for item in items:
        _expect("isSorted", comparable(item), items)
        if previous is not _NOTHING and compare_result(previous, item) == 1:
            return False
        previous = item
    return True


#: No element seen yet.
_NOTHING: Final = object()


def _sum(items: Any) -> Any:
    _expect("sum", isinstance(items, list | tuple), items)
    for item in items:
        # Kubernetes declares sum() for lists of int, uint, double and duration only.
        _expect(
            "sum", isinstance(item, int | float | Duration) and not isinstance(item, bool), item
        )
    total: Any = 0
    for i, item in enumerate(items):
        total = item if i == 0 else cel_add(total, item)
    return total


def _extreme(name: str, items: Any, replace_when: int) -> Any:
    """Kubernetes' ``min`` (``replace_when`` 1) and ``max`` (-1): every element must be
    comparable; the kept element is replaced by one it compares to as ``replace_when`` (a
    comparison that errs keeps it)."""
    _expect(name, isinstance(items, list | tuple), items)
    best: Any = _NOTHING
    for item in items:
        _expect(name, comparable(item), items)
        if best is _NOTHING or compare_result(best, item) == replace_when:
            best = item
    if best is _NOTHING:
        raise CelEvalError(f"{name} called on empty list")
    return best


def _min(items: Any) -> Any:
    return _extreme("min", items, 1)


def _max(items: Any) -> Any:
    return _extreme("max", items, -1)


# --- quantity library --------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _parsed_quantity(text: str) -> Quantity:
    """Quantities are immutable, so one parse serves every evaluation of ``quantity('40Gi')``
    (a selector re-evaluates its constant arguments for each device)."""
    return Quantity.parse(text)


@lru_cache(maxsize=1024)
def _parsed_semver(text: str, normalize: bool) -> Semver:
    """Semvers are immutable: one parse per distinct text, as for quantities."""
    return Semver(text, normalize)


def _quantity(s: Any) -> Quantity:
    """A new quantity per call, as Kubernetes makes one (a map keyed by quantities finds a key
    only by the same object: ``{dyn(quantity('1')): 1} == {dyn(quantity('1')): 1}`` is
    false); the parse itself is cached."""
    _expect("quantity", isinstance(s, str), s)
    parsed = _parsed_quantity(s)
    return Quantity(parsed.value, parsed.text, parsed.int64)


def _is_quantity(s: Any) -> bool:
    _expect("isQuantity", isinstance(s, str), s)
    try:
        Quantity.parse(s)
    except CelEvalError:
        return False
    return True


def _q(op: str, receiver: Any, *args: Any) -> Quantity:
    _expect(op, isinstance(receiver, Quantity), receiver, *args)
    return receiver  # type: ignore[no-any-return]


def _is_integer(q: Any) -> bool:
    return _q("isInteger", q).is_integer()


def _as_integer(q: Any) -> int:
    return _q("asInteger", q).as_integer()


def _as_approximate_float(q: Any) -> float:
    return _q("asApproximateFloat", q).as_approximate_float()


def _sign(q: Any) -> int:
    return _q("sign", q).sign()


def _q_add(q: Any, other: Any) -> Quantity:
    _expect("add", isinstance(other, Quantity) or _is_int(other), q, other)
    return _q("add", q, other).add(other)


def _q_sub(q: Any, other: Any) -> Quantity:
    _expect("sub", isinstance(other, Quantity) or _is_int(other), q, other)
    return _q("sub", q, other).sub(other)


# --- semver library ----------------------------------------------------------------------


def _semver(s: Any, normalize: Any = False) -> Semver:
    _expect("semver", isinstance(s, str) and isinstance(normalize, bool), s, normalize)
    return _parsed_semver(s, normalize)


def _is_semver(s: Any, normalize: Any = False) -> bool:
    _expect("isSemver", isinstance(s, str) and isinstance(normalize, bool), s, normalize)
    return Semver.is_valid(s, normalize)


def _sv(op: str, receiver: Any) -> Semver:
    _expect(op, isinstance(receiver, Semver), receiver)
    return receiver  # type: ignore[no-any-return]


def _as_int64(number: int) -> int:
    """A uint64 version number as Kubernetes returns it (``types.Int(v.Major)``: wrapped)."""
    return number - 2**64 if number > INT64_MAX else number


def _major(v: Any) -> int:
    return _as_int64(_sv("major", v).major)


def _minor(v: Any) -> int:
    return _as_int64(_sv("minor", v).minor)


def _patch(v: Any) -> int:
    return _as_int64(_sv("patch", v).patch)


# --- shared by both libraries ------------------------------------------------------------


def _compare_to(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare_to(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare_to(b)
    raise no_overload("compareTo", a, b)


def _is_greater_than(a: Any, b: Any) -> bool:
    _expect("isGreaterThan", isinstance(a, Quantity | Semver), a, b)
    return _compare_to(a, b) > 0


def _is_less_than(a: Any, b: Any) -> bool:
    _expect("isLessThan", isinstance(a, Quantity | Semver), a, b)
    return _compare_to(a, b) < 0


def _method_size(v: Any) -> int:
    return _size(v)


GLOBAL_FUNCTIONS: dict[str, Function] = {
    "size": _fn(_size, 1),
    "int": _fn(_to_int, 1),
    "uint": _fn(_to_uint, 1),
    "double": _fn(_to_double, 1),
    "string": _fn(_to_string, 1),
    "bool": _fn(_to_bool, 1),
    "bytes": _fn(_to_bytes, 1),
    "dyn": _fn(lambda v: v, 1),
    "type": _fn(_type, 1),
    "matches": _fn(_matches, 2),
    "timestamp": _fn(lib_time.timestamp, 1),
    "duration": _fn(lib_time.duration, 1),
    # strings extension (version 2)
    "strings.quote": _fn(_quote, 1),
    # sets extension
    "sets.contains": _fn(lib_lists.sets_contains, 2),
    "sets.equivalent": _fn(lib_lists.sets_equivalent, 2),
    "sets.intersects": _fn(lib_lists.sets_intersects, 2),
    # lists extension (version 3)
    "lists.range": _fn(lib_lists.lists_range, 1),
    # IP, CIDR and URL libraries
    "ip": _fn(lib_net.ip, 1),
    "isIP": _fn(lib_net.is_ip_, 1),
    "ip.isCanonical": _fn(lib_net.ip_is_canonical, 1),
    "cidr": _fn(lib_net.cidr, 1),
    "isCIDR": _fn(lib_net.is_cidr_, 1),
    "url": _fn(lib_net.url, 1),
    "isURL": _fn(lib_net.is_url, 1),
    "quantity": _fn(_quantity, 1),
    "isQuantity": _fn(_is_quantity, 1),
    # Kubernetes declares sign() as a global function only: ``sign(q)``, never ``q.sign()``.
    "sign": _fn(_sign, 1),
    "semver": _fn(_semver, 1, 2),
    "isSemver": _fn(_is_semver, 1, 2),
    # named formats (format.named('dns1123Label'), format.dns1123Label(), ...)
    "format.named": _fn(namedformats.format_named, 1),
    **{f"format.{name}": _fn(lambda f=f: f, 0) for name, f in namedformats.FORMATS.items()},
}

METHODS: dict[str, Function] = {
    # standard
    "size": _fn(_method_size, 0),
    "contains": _fn(_contains, 1),
    "startsWith": _fn(_starts_with, 1),
    "endsWith": _fn(_ends_with, 1),
    "matches": _fn(_matches, 1),
    # strings extension
    "charAt": _fn(_char_at, 1),
    "indexOf": _fn(_index_of, 1, 2),
    "lastIndexOf": _fn(_last_index_of, 1, 2),
    "lowerAscii": _fn(_lower_ascii, 0),
    "upperAscii": _fn(_upper_ascii, 0),
    "replace": _fn(_replace, 2, 3),
    "split": _fn(_split, 1, 2),
    "substring": _fn(_substring, 1, 2),
    "trim": _fn(_trim, 0),
    "join": _fn(_join, 0, 1),
    "format": _fn(_format, 1),
    # regex extension
    "find": _fn(_find, 1),
    "findAll": _fn(_find_all, 1, 2),
    # lists extension
    "isSorted": _fn(_is_sorted, 0),
    "sum": _fn(_sum, 0),
    "min": _fn(_min, 0),
    "max": _fn(_max, 0),
    # cel-go lists extension (version 3)
    "slice": _fn(lib_lists.slice_, 2),
    "flatten": _fn(lib_lists.flatten, 0, 1),
    "distinct": _fn(lib_lists.distinct, 0),
    "reverse": _fn(lib_lists.reverse, 0),
    "sort": _fn(lib_lists.sort, 0),
    "@sortByAssociatedKeys": _fn(lib_lists.sort_by_associated_keys, 1),
    # timestamps and durations
    "getFullYear": _fn(lib_time.get_full_year, 0, 1),
    "getMonth": _fn(lib_time.get_month, 0, 1),
    "getDate": _fn(lib_time.get_date, 0, 1),
    "getDayOfMonth": _fn(lib_time.get_day_of_month, 0, 1),
    "getDayOfWeek": _fn(lib_time.get_day_of_week, 0, 1),
    "getDayOfYear": _fn(lib_time.get_day_of_year, 0, 1),
    "getHours": _fn(lib_time.get_hours, 0, 1),
    "getMinutes": _fn(lib_time.get_minutes, 0, 1),
    "getSeconds": _fn(lib_time.get_seconds, 0, 1),
    "getMilliseconds": _fn(lib_time.get_milliseconds, 0, 1),
    # IP library
    "family": _fn(lib_net.family, 0),
    "isUnspecified": _fn(lib_net.is_unspecified, 0),
    "isLoopback": _fn(lib_net.is_loopback, 0),
    "isLinkLocalMulticast": _fn(lib_net.is_link_local_multicast, 0),
    "isLinkLocalUnicast": _fn(lib_net.is_link_local_unicast, 0),
    "isGlobalUnicast": _fn(lib_net.is_global_unicast, 0),
    # CIDR library
    "containsIP": _fn(lib_net.contains_ip, 1),
    "containsCIDR": _fn(lib_net.contains_cidr, 1),
    "ip": _fn(lib_net.cidr_ip, 0),
    "masked": _fn(lib_net.masked, 0),
    "prefixLength": _fn(lib_net.prefix_length, 0),
    # URL library
    "getScheme": _fn(lib_net.get_scheme, 0),
    "getHost": _fn(lib_net.get_host, 0),
    "getHostname": _fn(lib_net.get_hostname, 0),
    "getPort": _fn(lib_net.get_port, 0),
    "getEscapedPath": _fn(lib_net.get_escaped_path, 0),
    "getQuery": _fn(lib_net.get_query, 0),
    # quantity
    "isInteger": _fn(_is_integer, 0),
    "asInteger": _fn(_as_integer, 0),
    "asApproximateFloat": _fn(_as_approximate_float, 0),
    "add": _fn(_q_add, 1),
    "sub": _fn(_q_sub, 1),
    # semver
    "major": _fn(_major, 0),
    "minor": _fn(_minor, 0),
    "patch": _fn(_patch, 0),
    # quantity and semver
    "compareTo": _fn(_compare_to, 1),
    "isGreaterThan": _fn(_is_greater_than, 1),
    "isLessThan": _fn(_is_less_than, 1),
    # named formats
    "validate": _fn(namedformats.validate, 1),
}
