"""cel-go's sets extension and version 3 of its lists extension (Kubernetes 1.34+).

Sets compare elements with CEL equality (``1 == 1.0``). ``sort`` and ``sortBy`` need
elements (keys) of one orderable type; ``sortBy(e, key)`` is a macro that the compiler turns
into ``list.@sortByAssociatedKeys(list.map(e, key))``, implemented here by
:func:`sort_by_associated_keys`. Every function raises :class:`CelEvalError` with cel-go's
message on a bad argument.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .errors import CelEvalError
from .values import cel_compare, cel_eq, no_overload, type_name


def _is_list(value: Any) -> bool:
    return isinstance(value, list | tuple)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and type_name(value) == "int"


def _contains_all(container: Sequence[Any], items: Sequence[Any]) -> bool:
    return all(any(cel_eq(x, y) for y in container) for x in items)


def sets_contains(container: Any, items: Any) -> bool:
    """``sets.contains(a, b)``: every element of ``b`` is in ``a``."""
    if not (_is_list(container) and _is_list(items)):
        raise no_overload("sets.contains", container, items)
    return _contains_all(container, items)


def sets_equivalent(a: Any, b: Any) -> bool:
    """``sets.equivalent(a, b)``: the same elements, ignoring order and repetition."""
    if not (_is_list(a) and _is_list(b)):
        raise no_overload("sets.equivalent", a, b)
    return _contains_all(a, b) and _contains_all(b, a)


def sets_intersects(a: Any, b: Any) -> bool:
    """``sets.intersects(a, b)``: at least one common element."""
    if not (_is_list(a) and _is_list(b)):
        raise no_overload("sets.intersects", a, b)
    return any(cel_eq(x, y) for x in a for y in b)


#: cel-go's bound on the length of the list ``lists.range`` makes (``defaultMaxRangeSize``).
MAX_RANGE_SIZE = 1_000_000


def lists_range(n: Any) -> list[int]:
    """``lists.range(n)``: ``[0, 1, ..., n-1]``; an error for a negative ``n`` or one above
    :data:`MAX_RANGE_SIZE`, as in cel-go."""
    if not _is_int(n):
        raise no_overload("lists.range", n)
    if n < 0:
        raise CelEvalError(f"lists.range: size must be non-negative, got {n}")
    if n > MAX_RANGE_SIZE:
        raise CelEvalError(f"lists.range: size {n} exceeds maximum allowed ({MAX_RANGE_SIZE})")
    return list(range(n))


def slice_(items: Any, start: Any, end: Any) -> list[Any]:
    """``list.slice(start, end)``: the elements from ``start`` up to (excluding) ``end``."""
    if not (_is_list(items) and _is_int(start) and _is_int(end)):
        raise no_overload("slice", items, start, end)
    if start < 0 or end < 0:
        raise CelEvalError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelEvalError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
        )
    if end > len(items):
        raise CelEvalError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return list(items[start:end])


def flatten(items: Any, depth: Any = 1) -> list[Any]:
    """``list.flatten()`` one level, ``list.flatten(n)`` ``n`` levels."""
    if not _is_list(items) or not _is_int(depth):
        raise no_overload("flatten", items, depth)
    if depth < 0:
        raise CelEvalError("level must be non-negative")
    out: list[Any] = []
    for item in items:
        if _is_list(item) and depth > 0:
            out.extend(flatten(item, depth - 1))
        else:
            out.append(item)
    return out


def distinct(items: Any) -> list[Any]:
    """``list.distinct()``: the first occurrence of each element (CEL equality)."""
    if not _is_list(items):
        raise no_overload("distinct", items)
    out: list[Any] = []
    for item in items:
        if not any(cel_eq(item, seen) for seen in out):
            out.append(item)
    return out


def reverse(items: Any) -> list[Any]:
    """``list.reverse()``."""
    if not _is_list(items):
        raise no_overload("reverse", items)
    return list(reversed(items))


_ORDERABLE = frozenset(
    {
        "int",
        "uint",
        "double",
        "bool",
        "string",
        "bytes",
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
    }
)


def sort_by_associated_keys(items: Any, keys: Any) -> list[Any]:
    """``items.@sortByAssociatedKeys(keys)``: ``items`` ordered as ``keys`` sort (stable)."""
    if not (_is_list(items) and _is_list(keys)):
        raise no_overload("@sortByAssociatedKeys", items, keys)
    if len(items) != len(keys):
        raise CelEvalError(
            "@sortByAssociatedKeys() expected a list of the same size as the associated keys "
            f"list, but got {len(items)} and {len(keys)} elements respectively"
        )
    if not items:
        return []
    kind = type_name(keys[0])
    if kind not in _ORDERABLE:
        raise CelEvalError("list elements must be comparable")
    if any(type_name(k) != kind for k in keys):
        raise CelEvalError("list elements must have the same type")

    def order(i: int, j: int) -> int:
        return cel_compare("sort", keys[i], keys[j])

    indices = sorted(range(len(items)), key=functools.cmp_to_key(order))
    return [items[i] for i in indices]


def sort(items: Any) -> list[Any]:
    """``list.sort()``: elements of one orderable type, ascending."""
    if not _is_list(items):
        raise no_overload("sort", items)
    return sort_by_associated_keys(items, items)
