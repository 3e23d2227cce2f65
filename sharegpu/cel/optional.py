"""CEL optional values (``optional_type``), as Kubernetes enables them since 1.28.

An :class:`OptionalValue` either holds a value or is ``optional.none()``. Selecting a field or
an index of an optional yields an optional (``x.?a.b`` is ``none`` when ``a`` is absent).
Invariant: an :class:`OptionalValue` never holds another one by construction from the syntax
(``optional.of(optional.none())`` may, as in cel-go).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .celtypes import CelType
from .device import finds
from .errors import CelEvalError
from .values import check_qualifier, equal, no_overload

_ABSENT = object()


class OptionalValue:
    """``optional.of(value)`` or, without a value, ``optional.none()``."""

    __slots__ = ("_value",)
    cel_type_name = "optional_type"

    def __init__(self, value: Any = _ABSENT) -> None:
        self._value = value

    @property
    def has_value(self) -> bool:
        """Whether a value is held."""
        return self._value is not _ABSENT

    def get(self) -> Any:
        """The value; :class:`CelEvalError` for ``optional.none()``."""
        if self._value is _ABSENT:
            raise CelEvalError("optional.none() dereference")
        return self._value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptionalValue):
            return NotImplemented
        return self.cel_equal(other) is True

    def cel_equal(self, other: object) -> bool | None:
        """cel-go's ``Optional.Equal``: false beside anything but an optional, else by
        presence, then the values' equality (None: its error)."""
        if not isinstance(other, OptionalValue):
            return False
        if not self.has_value or not other.has_value:
            return self.has_value == other.has_value
        return equal(self._value, other._value)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"optional.of({self._value!r})" if self.has_value else "optional.none()"


NONE = OptionalValue()
#: The type value ``optional_type`` (what ``type(optional.none())`` is).
OPTIONAL_TYPE = CelType(OptionalValue.cel_type_name)


def _is_zero(value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == 0
    if isinstance(value, str | bytes | list | tuple | Mapping):
        return len(value) == 0
    return False


def of_non_zero(value: Any) -> OptionalValue:
    """``optional.ofNonZeroValue``: none for the zero value of the type."""
    return NONE if _is_zero(value) else OptionalValue(value)


def select(value: Any, field: str) -> OptionalValue:
    """``value.?field``, and ``value.field`` on an optional ``value``: the field of a held
    map, ``optional.none()`` for a map without it or a held value that is neither map nor
    list (a list is an error)."""
    if isinstance(value, OptionalValue):
        if not value.has_value:
            return NONE
        value = value.get()
    if isinstance(value, Mapping):
        return OptionalValue(value[field]) if finds(value, field) else NONE
    if isinstance(value, list | tuple):
        raise CelEvalError("unsupported index type 'string' in list")
    return NONE  # cel-go: a value that is neither map nor list has no field to select


def index(value: Any, key: Any) -> OptionalValue:
    """``value[?key]``: the entry of a map or list when present, else ``optional.none()``;
    a key that cannot qualify (:func:`~sharegpu.cel.values.check_qualifier`) is an error."""
    check_qualifier(key)
    if isinstance(value, OptionalValue):
        if not value.has_value:
            return NONE
        value = value.get()
    if isinstance(value, Mapping):
        if isinstance(key, float) and key.is_integer():
            key = int(key)
        try:
            return OptionalValue(value[key]) if finds(value, key) else NONE
        except TypeError:
            raise no_overload("_[?_]", value, key) from None
    if isinstance(value, list | tuple):
        if isinstance(key, float) and key.is_integer():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int):
            raise no_overload("_[?_]", value, key)
        return OptionalValue(value[key]) if 0 <= key < len(value) else NONE
    return NONE  # cel-go: a value that is neither map nor list has no entry


def expect(value: Any, op: str) -> OptionalValue:
    """``value`` as an optional, or the no-overload error of ``op``."""
    if not isinstance(value, OptionalValue):
        raise no_overload(op, value)
    return value


def has_value(opt: Any) -> bool:
    """``opt.hasValue()``."""
    return expect(opt, "hasValue").has_value


def value(opt: Any) -> Any:
    """``opt.value()``."""
    return expect(opt, "value").get()


#: Global functions of the optional library: name -> (implementation, argument count).
GLOBALS: dict[str, tuple[Any, int]] = {
    "optional.of": (OptionalValue, 1),
    "optional.none": (lambda: NONE, 0),
    "optional.ofNonZeroValue": (of_non_zero, 1),
}
#: Methods on optionals that evaluate all their arguments: name -> (implementation, arity).
METHODS: dict[str, tuple[Any, int]] = {
    "hasValue": (has_value, 0),
    "value": (value, 0),
}
