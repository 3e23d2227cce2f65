"""CEL values as Python values, and the operators of the CEL language on them.

Mapping: bool -> ``bool``, int -> ``int``, uint -> :class:`UInt`, double -> ``float``,
string -> ``str``, bytes -> ``bytes``, null -> ``None``, list -> ``list``/``tuple``,
map -> ``dict`` (a map literal or comprehension: :class:`CelMap`), plus the Kubernetes types
:class:`Quantity` and :class:`Semver`, and the value classes of the other modules here
(timestamp, duration, IP, CIDR, URL, type), which name their CEL type in a ``cel_type_name``
class attribute.
Every operator raises :class:`CelEvalError` where CEL produces an error value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .errors import CelEvalError
from .netaddr import CIDR, IP
from .quantity import Quantity
from .semver import Semver
from .timevalues import Duration, Timestamp
from .timevalues import add as _time_add
from .timevalues import subtract as _time_subtract
from .urls import URL

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


class UInt(int):
    """A CEL ``uint`` (an ``int`` subclass so that arithmetic stays cheap)."""

    def __repr__(self) -> str:
        return f"{int(self)}u"


_UNIQUE = itertools.count()


def key_identity(key: Any) -> tuple[Any, ...]:
    """What makes two map keys the same key in cel-go (a Go map keyed by CEL values): the
    type and the value for bool, int, uint, double, string, bytes, null and the time types
    (``1``, ``1u`` and ``true`` are three keys); the object itself for a list, a map, a
    quantity or an optional (pointers in cel-go); NaN never equals a key, itself included.
    Bytes and semvers are an error (Go cannot hash them)."""
    if isinstance(key, bool):
        return ("bool", key)
    if isinstance(key, UInt):
        return ("uint", int(key))
    if isinstance(key, int):
        return ("int", key)
    if isinstance(key, float):
        return ("double", key) if key == key else ("nan", next(_UNIQUE))
    if isinstance(key, bytes | Semver):
        # Go cannot hash these: cel-go's evaluation panics and reports an internal error.
        name = "types.Bytes" if isinstance(key, bytes) else "cel.Semver"
        raise CelEvalError(f"internal error: runtime error: hash of unhashable type {name}")
    if isinstance(key, str | Duration | Timestamp) or key is None:
        return (type(key).__name__, key)
    try:
        hash(key)
    except TypeError:
        return ("ref", id(key))
    if isinstance(key, Quantity) or getattr(key, "cel_type_name", None) == "optional_type":
        return ("ref", id(key))
    return (type(key).__name__, key)


class CelMap(Mapping[Any, Any]):
    """A map built by a CEL map literal (or comprehension), with cel-go's key semantics.

    Keys are told apart as cel-go tells them apart (:func:`key_identity`), so a map may hold
    ``1``, ``1u`` and ``true`` at once; a later entry with the same key replaces the earlier
    one. Lookup (``m[k]``, ``k in m``) also finds an int key by an equal uint or integral
    double and a uint key by an equal int or integral double, as cel-go's map lookup does.
    Iteration follows insertion order (cel-go's is unspecified).
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[tuple[Any, Any]] = ()) -> None:
        self._entries: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        for key, value in entries:
            self.put(key, value)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (replacing the entry of the same key)."""
        self._entries[key_identity(key)] = (key, value)

    def remove(self, key: Any) -> None:
        """Drop the entry of ``key`` when there is one."""
        self._entries.pop(key_identity(key), None)

    def _find(self, key: Any) -> tuple[Any, Any] | None:
        entry = self._entries.get(key_identity(key))
        if entry is not None or isinstance(key, bool):
            return entry
        candidates: list[tuple[str, int]] = []
        if isinstance(key, float):
            if key == key and key.is_integer():
                number = int(key)
                if INT64_MIN <= number <= INT64_MAX:
                    candidates.append(("int", number))
                if 0 <= number <= UINT64_MAX:
                    candidates.append(("uint", number))
        elif isinstance(key, UInt):
            if key <= INT64_MAX:
                candidates.append(("int", int(key)))
        elif isinstance(key, int) and key >= 0:
            candidates.append(("uint", key))
        for candidate in candidates:
            entry = self._entries.get(candidate)
            if entry is not None:
                return entry
        return None

    def __getitem__(self, key: Any) -> Any:
        entry = self._find(key)
        if entry is None:
            raise KeyError(key)
        return entry[1]

    def __contains__(self, key: object) -> bool:
        return self._find(key) is not None

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _ in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> Any:
        """The (key, value) pairs, NaN keys included."""
        return list(self._entries.values())

    def values(self) -> Any:
        """The values."""
        return [value for _, value in self._entries.values()]

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self._entries.values()) + "}"


def type_name(value: Any) -> str:
    """The CEL type name of ``value`` (used in error messages)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, UInt):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if value is None:
        return "null_type"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, Sequence):
        return "list"
    if isinstance(value, Quantity):
        return "Quantity"
    if isinstance(value, Semver):
        return "Semver"
    return str(getattr(value, "cel_type_name", type(value).__name__))


def no_overload(op: str, *args: Any) -> CelEvalError:
    """The error CEL reports for an operator or function applied to the wrong types."""
    kinds = ", ".join(type_name(a) for a in args)
    return CelEvalError(f"no such overload: {op}({kinds})")


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_list(v: Any) -> bool:
    return isinstance(v, list | tuple)


_TWO_63 = 2.0**63
_TWO_64 = 2.0**64


def _integer_vs_double(i: int, d: float) -> int:
    """-1/0/1 ordering an int or uint against a double as cel-go does
    (``common/types/compare.go``): a double outside the integer type's range orders outside
    it; otherwise the integer is converted to a double, so that near 2^63 the comparison is
    the lossy one cel-go makes (``9223372036854775807 == 9223372036854775808.0``)."""
    low, high = (0.0, _TWO_64) if isinstance(i, UInt) else (-_TWO_63, _TWO_63)
    if d < low:
        return 1
    if d > high:
        return -1
    x = float(i)
    return (x > d) - (x < d)


def _numeric_order(a: Any, b: Any) -> int:
    """-1/0/1 for two numbers: exact between integers and between doubles, cel-go's
    cross-type rule (:func:`_integer_vs_double`) between an integer and a double."""
    fa, fb = isinstance(a, float), isinstance(b, float)
    if fa is fb:
        return int((a > b) - (a < b))
    return -_integer_vs_double(b, a) if fa else _integer_vs_double(a, b)


def cel_eq(a: Any, b: Any) -> bool:
    """Whether CEL's equality of ``a`` and ``b`` is true (an error is not): what ``!=``,
    ``in`` and the list and set functions test. The ``==`` operator is :func:`cel_eq_op`."""
    return equal(a, b) is True


def cel_eq_op(a: Any, b: Any) -> bool:
    """The ``==`` operator: :func:`equal`, whose error is the answer."""
    result = equal(a, b)
    if result is None:
        raise CelEvalError("no such overload")
    return result


#: Kubernetes' own value types, whose ``Equal`` accepts only a value of exactly its own Go
#: type: anything else (another type, or a quantity made by ``add``/``sub``, a ``*Quantity``)
#: is "no such overload".
_STRICT_EQUALITY: tuple[type, ...] = (Quantity, Semver, IP, CIDR, URL)


def equal(a: Any, b: Any) -> bool | None:
    """cel-go's ``types.Equal``: True, False, or None for its error value. Numbers compare
    across int/uint/double (as :func:`_numeric_order`; NaN equals nothing); other types must
    match. Kubernetes' types err on another operand (:data:`_STRICT_EQUALITY`). A list or map
    is unequal only when an element or value is: an element whose equality errs is passed
    over (``[dyn(quantity('1'))] == [dyn(1)]`` is true, as in cel-go)."""
    if a is None or b is None:
        return a is b
    if _is_num(a) and _is_num(b):
        if isinstance(a, float) is isinstance(b, float):
            return bool(a == b)
        return a == a and b == b and _numeric_order(a, b) == 0
    if isinstance(a, _STRICT_EQUALITY):
        if type(a) is not type(b) or getattr(b, "arithmetic", False):
            return None
        return bool(a == b)
    own = getattr(type(a), "cel_equal", None)
    if own is not None:
        return own(a, b)  # type: ignore[no-any-return]
    if _is_list(a) and _is_list(b):
        return len(a) == len(b) and all(equal(x, y) is not False for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _map_eq(a, b)
    ta, tb = type(a), type(b)
    if ta is tb or (isinstance(a, str) and isinstance(b, str)):
        return bool(a == b)
    return False


def _map_eq(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    if len(a) != len(b):
        return False
    return all(k in b and equal(v, b[k]) is not False for k, v in a.items())


def cel_order(op: str, a: Any, b: Any) -> int:
    """The ordering operators' comparison: :func:`cel_compare`, except that a NaN operand is
    an error, as cel-go's ``Compare`` of a double makes it."""
    nan = (isinstance(a, float) and a != a) or (isinstance(b, float) and b != b)
    if nan and _is_num(a) and _is_num(b):
        raise CelEvalError("NaN values cannot be ordered")
    return cel_compare(op, a, b)


def comparable(value: Any) -> bool:
    """Whether ``value`` is of a type cel-go can order (its ``traits.Comparer``): a number,
    bool, string, bytes, timestamp or duration (no null, list, map or Kubernetes type)."""
    return isinstance(value, int | float | str | bytes | Timestamp | Duration)


def compare_result(a: Any, b: Any) -> int | None:
    """cel-go's ``a.Compare(b)`` for a comparable ``a``: -1, 0 or 1, or None for its error
    value (``b`` of another type, or a NaN), which the list functions pass over."""
    try:
        return cel_order("compare", a, b)
    except CelEvalError:
        return None


def cel_compare(op: str, a: Any, b: Any) -> int:
    """-1/0/1 for the ordering operators; error for types without an ordering."""
    if _is_num(a) and _is_num(b):
        return _numeric_order(a, b)
    for kind in (bool, str, bytes):
        if isinstance(a, kind) and isinstance(b, kind):
            return (a > b) - (a < b)  # type: ignore[operator]
    if (isinstance(a, Timestamp) and isinstance(b, Timestamp)) or (
        isinstance(a, Duration) and isinstance(b, Duration)
    ):
        return int((a.nanos > b.nanos) - (a.nanos < b.nanos))
    raise no_overload(op, a, b)


def _check_int(value: int, op: str) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise CelEvalError(f"integer overflow in {op}")
    return value


def _check_uint(value: int, op: str) -> UInt:
    if not 0 <= value <= UINT64_MAX:
        raise CelEvalError(f"unsigned integer overflow in {op}")
    return UInt(value)


def _same_numeric(op: str, a: Any, b: Any) -> str:
    """``int``, ``uint`` or ``double`` when both operands have that type, else an error."""
    if isinstance(a, bool) or isinstance(b, bool):
        raise no_overload(op, a, b)
    ua, ub = isinstance(a, UInt), isinstance(b, UInt)
    if ua and ub:
        return "uint"
    if isinstance(a, int) and isinstance(b, int) and not ua and not ub:
        return "int"
    if isinstance(a, float) and isinstance(b, float):
        return "double"
    raise no_overload(op, a, b)


def cel_add(a: Any, b: Any) -> Any:
    """``a + b`` for numbers, strings, bytes and lists."""
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(a, bytes) and isinstance(b, bytes):
        return a + b
    if _is_list(a) and _is_list(b):
        return [*a, *b]
    if isinstance(a, Timestamp | Duration) and isinstance(b, Timestamp | Duration):
        if isinstance(a, Timestamp) and isinstance(b, Timestamp):
            raise no_overload("_+_", a, b)
        return _time_add(a, b)
    kind = _same_numeric("_+_", a, b)
    if kind == "int":
        return _check_int(a + b, "_+_")
    if kind == "uint":
        return _check_uint(a + b, "_+_")
    return a + b


def cel_sub(a: Any, b: Any) -> Any:
    """``a - b`` for numbers, timestamps and durations."""
    if isinstance(a, Timestamp | Duration) and isinstance(b, Timestamp | Duration):
        if isinstance(a, Duration) and isinstance(b, Timestamp):
            raise no_overload("_-_", a, b)
        return _time_subtract(a, b)
    kind = _same_numeric("_-_", a, b)
    if kind == "int":
        return _check_int(a - b, "_-_")
    if kind == "uint":
        return _check_uint(a - b, "_-_")
    return a - b


def cel_mul(a: Any, b: Any) -> Any:
    """``a * b`` for numbers."""
    kind = _same_numeric("_*_", a, b)
    if kind == "int":
        return _check_int(a * b, "_*_")
    if kind == "uint":
        return _check_uint(a * b, "_*_")
    return a * b


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def cel_div(a: Any, b: Any) -> Any:
    """``a / b``: integer division truncates toward zero; division by zero is an error."""
    kind = _same_numeric("_/_", a, b)
    if kind == "double":
        if b == 0:  # IEEE 754: NaN for 0/0 and NaN/0, else an infinity of the signs
            if a == 0 or a != a:
                return float("nan")
            return math.copysign(float("inf"), a) * math.copysign(1.0, b)
        return a / b
    if b == 0:
        raise CelEvalError("division by zero")
    if kind == "uint":
        return UInt(a // b)
    return _check_int(_trunc_div(a, b), "_/_")


def cel_mod(a: Any, b: Any) -> Any:
    """``a % b`` for int and uint (the sign follows the dividend)."""
    kind = _same_numeric("_%_", a, b)
    if kind == "double":
        raise no_overload("_%_", a, b)
    if b == 0:
        raise CelEvalError("modulus by zero")
    if kind == "int" and a == INT64_MIN and b == -1:
        raise CelEvalError("integer overflow")  # as cel-go: the quotient overflows
    result = a - _trunc_div(a, b) * b
    return UInt(result) if kind == "uint" else result


def cel_neg(a: Any) -> Any:
    """Unary minus for int, double and duration."""
    if isinstance(a, Duration):
        return Duration(-a.nanos)
    if isinstance(a, bool | UInt) or not _is_num(a):
        raise no_overload("-_", a)
    return _check_int(-a, "-_") if isinstance(a, int) else -a


def cel_not(a: Any) -> bool:
    """Logical not of a bool."""
    if not isinstance(a, bool):
        raise no_overload("!_", a)
    return not a


def cel_in(a: Any, container: Any) -> bool:
    """``a in list`` (CEL equality) or ``a in map`` (key presence)."""
    if isinstance(container, Mapping):
        try:
            if _is_num(a) and not isinstance(container, CelMap):
                return a in container or any(_is_num(k) and k == a for k in container)
            return a in container
        except TypeError:  # an unhashable key (a list or map) is no key of any map
            return False
    if _is_list(container):
        return any(cel_eq(a, x) for x in container)
    raise no_overload("@in", a, container)


#: The Go type names cel-go prints for a value that cannot qualify.
_GO_TYPE_NAMES = {"null_type": "types.Null", "bytes": "types.Bytes", "list": "*types.baseList"}


def check_qualifier(key: Any) -> None:
    """An index computed at evaluation qualifies only as a string, int, uint, double or bool
    (cel-go's ``newQualifier``); another value (null, bytes, a list, a quantity, a duration,
    ...) is the error "invalid qualifier type", whatever is indexed."""
    if not isinstance(key, str | int | float):
        name = type_name(key)
        raise CelEvalError(f"invalid qualifier type: {_GO_TYPE_NAMES.get(name, name)}")


def cel_index(container: Any, key: Any) -> Any:
    """``container[key]``: list by int index, map by key; a missing key is an error, and so
    is a key that cannot qualify (:func:`check_qualifier`)."""
    check_qualifier(key)
    if isinstance(container, Mapping):
        try:
            return container[key]
        except KeyError:
            raise CelEvalError(f"no such key: {key}", str(key)) from None
        except TypeError:
            raise no_overload("_[_]", container, key) from None
    if _is_list(container):
        if isinstance(key, float) and key.is_integer():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int):
            raise no_overload("_[_]", container, key)
        if not 0 <= key < len(container):
            raise CelEvalError(f"index out of bounds: {key}")
        return container[key]
    raise no_overload("_[_]", container, key)


def cel_select(value: Any, field: str) -> Any:
    """``value.field``: maps only (Kubernetes' ``device`` is a map-like object)."""
    if isinstance(value, Mapping):
        try:
            return value[field]
        except KeyError:
            raise CelEvalError(f"no such key: {field}", field) from None
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")
