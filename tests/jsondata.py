"""Walking decoded JSON documents in tests (the fuzz tests mutate a value at any path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def json_paths(node: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every key path inside ``node`` (the empty path first), depth first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from json_paths(value, (*prefix, i))
