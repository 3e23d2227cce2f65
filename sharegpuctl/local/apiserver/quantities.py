"""Decoding of the ``resource.k8s.io`` Quantity fields, as the real API server decodes them.

kube-apiserver parses every ``resource.Quantity`` while it decodes the request body, before any
validation; a malformed one fails the whole request with 400 BadRequest, ``<Kind> in version
"<version>" cannot be handled as a <Kind>: quantities must match the regular expression ...``
(no field path: the decoder has none). :func:`quantity_problem` finds the first such field of an
object with the project's parser (:func:`api.quantity.parse_quantity`). As upstream, JSON
numbers and ``null`` are accepted, surrounding whitespace of a string is ignored, and values
beyond int64 are stored (they are valid quantities); sharegpu only refuses texts longer than
:data:`api.quantity.MAX_QUANTITY_TEXT` characters, which no real quantity needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from api.quantity import FORMAT_WRONG, QuantityError, QuantityRangeError, parse_quantity

#: A path through an object: keys, ``[]`` for every list item, ``*`` for every map value.
Path = tuple[str, ...]

_REQUEST_CAPACITY: Path = ("capacity", "requests", "*")
_CLAIM_SPEC: tuple[Path, ...] = (
    ("devices", "requests", "[]", "exactly", *_REQUEST_CAPACITY),
    ("devices", "requests", "[]", "firstAvailable", "[]", *_REQUEST_CAPACITY),
)
_CLAIM_STATUS: Path = ("status", "allocation", "devices", "results", "[]", "consumedCapacity", "*")
_SLICE_CAPACITY: Path = ("spec", "devices", "[]", "capacity", "*")

#: Where each kind of ``resource.k8s.io`` holds quantities.
QUANTITY_PATHS: dict[str, tuple[Path, ...]] = {
    "ResourceClaim": (*(("spec", *p) for p in _CLAIM_SPEC), _CLAIM_STATUS),
    "ResourceClaimTemplate": tuple(("spec", "spec", *p) for p in _CLAIM_SPEC),
    "ResourceSlice": (
        (*_SLICE_CAPACITY, "value"),
        (*_SLICE_CAPACITY, "requestPolicy", "default"),
        (*_SLICE_CAPACITY, "requestPolicy", "validValues", "[]"),
        (*_SLICE_CAPACITY, "requestPolicy", "validRange", "min"),
        (*_SLICE_CAPACITY, "requestPolicy", "validRange", "max"),
        (*_SLICE_CAPACITY, "requestPolicy", "validRange", "step"),
        ("spec", "sharedCounters", "[]", "counters", "*", "value"),
        ("spec", "devices", "[]", "consumesCounters", "[]", "counters", "*", "value"),
    ),
}


def _values(node: Any, path: Path) -> Iterator[Any]:
    if not path:
        yield node
        return
    step, rest = path[0], path[1:]
    if step == "[]":
        for item in node if isinstance(node, list) else []:
            yield from _values(item, rest)
    elif step == "*":
        for item in node.values() if isinstance(node, dict) else []:
            yield from _values(item, rest)
    elif isinstance(node, dict) and step in node:
        yield from _values(node[step], rest)


def is_quantity(value: Any) -> bool:
    """Whether ``Quantity.UnmarshalJSON`` accepts ``value`` (as sharegpu bounds it)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return True
    if not isinstance(value, str):
        return False
    try:
        parse_quantity(value.strip(" \t\n\r\v\f"))
    except QuantityRangeError:
        return True
    except QuantityError:
        return False
    return True


def quantity_problem(kind: str, obj: dict[str, Any]) -> str | None:
    """The decoding error of the first malformed quantity of ``obj``; None when all parse."""
    for path in QUANTITY_PATHS.get(kind, ()):
        for value in _values(obj, path):
            if not is_quantity(value):
                return FORMAT_WRONG
    return None
