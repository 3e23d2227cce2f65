"""Decoded JSON: the one alias for a JSON object (and its read-only view), and naming a value's
JSON type in error messages (one rule for every message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: A decoded JSON object (a Kubernetes object or part of one).
Obj = dict[str, Any]
#: A decoded JSON object only read, never changed.
ObjView = Mapping[str, Any]


def json_type(value: Any) -> str:
    """The JSON type of a decoded value with its article (``a string``, ``an object``,
    ``null``); a value JSON cannot hold is named by its Python type (``a Decimal``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"
