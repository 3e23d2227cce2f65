"""Naming the JSON type of a decoded value in error messages (one rule for every message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
