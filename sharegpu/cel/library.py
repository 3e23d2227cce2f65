"""Functions of the Kubernetes CEL environment for DRA selectors.

Two tables: global functions (``quantity('1Gi')``) and receiver-style methods
(``q.compareTo(r)``, receiver first). Each entry lists the argument counts it accepts, which
the compiler checks. Covered: the CEL standard functions and conversions, Kubernetes' string,
regex and list extensions, and the quantity and semver libraries.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .errors import CelEvalError
from .quantity import Quantity
from .semver import Semver
from .values import INT64_MAX, INT64_MIN, UINT64_MAX, UInt, cel_add, cel_compare, no_overload


@dataclass(frozen=True)
class Function:
    """A CEL function: its implementation and the numbers of arguments it accepts."""

    impl: Callable[..., Any]
    arities: frozenset[int]


def _fn(impl: Callable[..., Any], *arities: int) -> Function:
    return Function(impl, frozenset(arities))


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CelEvalError(f"invalid regular expression {pattern!r}: {exc}") from exc


def _expect(op: str, cond: bool, *args: Any) -> None:
    if not cond:
        raise no_overload(op, *args)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool | UInt)


# --- standard functions -------------------------------------------------------------------


def _size(v: Any) -> int:
    if isinstance(v, str | bytes | list | tuple | Mapping):
        return len(v)
    raise no_overload("size", v)


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise no_overload("int", v)
    if isinstance(v, int):
        result = int(v)
    elif isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise CelEvalError("double out of range for int conversion")
        result = int(v)
    elif isinstance(v, str):
        try:
            result = int(v, 10)
        except ValueError:
            raise CelEvalError(f"cannot convert {v!r} to int") from None
    else:
        raise no_overload("int", v)
    if not INT64_MIN <= result <= INT64_MAX:
        raise CelEvalError("int out of range")
    return result


def _to_uint(v: Any) -> UInt:
    if isinstance(v, bool):
        raise no_overload("uint", v)
    if isinstance(v, int | float):
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            raise CelEvalError("double out of range for uint conversion")
        result = int(v)
    elif isinstance(v, str):
        try:
            result = int(v, 10)
        except ValueError:
            raise CelEvalError(f"cannot convert {v!r} to uint") from None
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
        try:
            return float(v)
        except ValueError:
            raise CelEvalError(f"cannot convert {v!r} to double") from None
    raise no_overload("double", v)


def _to_string(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int | float):
        return str(v) if not isinstance(v, float) or not v.is_integer() else f"{v:g}"
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise CelEvalError("invalid UTF-8 in bytes to string conversion") from None
    if isinstance(v, Quantity):
        return v.text
    if isinstance(v, Semver):
        return v.text
    raise no_overload("string", v)


_BOOL_STRINGS = {
    **dict.fromkeys(("1", "t", "true", "TRUE", "True"), True),
    **dict.fromkeys(("0", "f", "false", "FALSE", "False"), False),
}


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        if v in _BOOL_STRINGS:
            return _BOOL_STRINGS[v]
        raise CelEvalError(f"cannot convert {v!r} to bool")
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


def _matches(s: Any, pattern: Any) -> bool:
    _expect("matches", isinstance(s, str) and isinstance(pattern, str), s, pattern)
    return _regex(pattern).search(s) is not None


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
    if not 0 <= start <= len(s):
        raise CelEvalError(f"index out of range: {start}")
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
        return int(s.rfind(sub))
    _expect("lastIndexOf", _is_int(end), s, sub, end)
    if not 0 <= end < max(len(s), 1):
        raise CelEvalError(f"index out of range: {end}")
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
    if not 0 <= start <= stop <= len(s):
        raise CelEvalError(f"substring index out of range: [{start}:{stop}]")
    return str(s[start:stop])


def _trim(s: Any) -> str:
    _expect("trim", isinstance(s, str), s)
    return str(s.strip())


def _join(items: Any, sep: Any = "") -> str:
    _expect("join", isinstance(items, list | tuple) and isinstance(sep, str), items, sep)
    if not all(isinstance(x, str) for x in items):
        raise no_overload("join", items)
    return str(sep.join(items))


def _find(s: Any, pattern: Any) -> str:
    _expect("find", isinstance(s, str) and isinstance(pattern, str), s, pattern)
    m = _regex(pattern).search(s)
    return m.group(0) if m else ""


def _find_all(s: Any, pattern: Any, n: Any = -1) -> list[str]:
    _expect("findAll", isinstance(s, str) and isinstance(pattern, str) and _is_int(n), s, pattern)
    found = [m.group(0) for m in _regex(pattern).finditer(s)]
    return found if n < 0 else found[:n]


# --- Kubernetes list extensions ----------------------------------------------------------


def _is_sorted(items: Any) -> bool:
    _expect("isSorted", isinstance(items, list | tuple), items)
    return all(cel_compare("isSorted", a, b) <= 0 for a, b in itertools.pairwise(items))


def _sum(items: Any) -> Any:
    _expect("sum", isinstance(items, list | tuple), items)
    total: Any = 0
    for i, item in enumerate(items):
        total = item if i == 0 else cel_add(total, item)
    return total


def _min(items: Any) -> Any:
    _expect("min", isinstance(items, list | tuple), items)
    if not items:
        raise CelEvalError("min called on empty list")
    best = items[0]
    for item in items[1:]:
        if cel_compare("min", item, best) < 0:
            best = item
    return best


def _max(items: Any) -> Any:
    _expect("max", isinstance(items, list | tuple), items)
    if not items:
        raise CelEvalError("max called on empty list")
    best = items[0]
    for item in items[1:]:
        if cel_compare("max", item, best) > 0:
            best = item
    return best


# --- quantity library --------------------------------------------------------------------


def _quantity(s: Any) -> Quantity:
    _expect("quantity", isinstance(s, str), s)
    return Quantity.parse(s)


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
    return Semver(s, normalize)


def _is_semver(s: Any, normalize: Any = False) -> bool:
    _expect("isSemver", isinstance(s, str) and isinstance(normalize, bool), s, normalize)
    return Semver.is_valid(s, normalize)


def _sv(op: str, receiver: Any) -> Semver:
    _expect(op, isinstance(receiver, Semver), receiver)
    return receiver  # type: ignore[no-any-return]


def _major(v: Any) -> int:
    return _sv("major", v).major


def _minor(v: Any) -> int:
    return _sv("minor", v).minor


def _patch(v: Any) -> int:
    return _sv("patch", v).patch


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
    "matches": _fn(_matches, 2),
    "quantity": _fn(_quantity, 1),
    "isQuantity": _fn(_is_quantity, 1),
    "semver": _fn(_semver, 1, 2),
    "isSemver": _fn(_is_semver, 1, 2),
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
    # regex extension
    "find": _fn(_find, 1),
    "findAll": _fn(_find_all, 1, 2),
    # lists extension
    "isSorted": _fn(_is_sorted, 0),
    "sum": _fn(_sum, 0),
    "min": _fn(_min, 0),
    "max": _fn(_max, 0),
    # quantity
    "isInteger": _fn(_is_integer, 0),
    "asInteger": _fn(_as_integer, 0),
    "asApproximateFloat": _fn(_as_approximate_float, 0),
    "sign": _fn(_sign, 0),
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
}
