"""The published schemas of built-in kinds, walked as the API server's decoder walks its types.

A built-in kind's schema is its definition in :func:`~.validation.published_definitions`
(JSON Schema whose ``$ref`` point at other definitions). :func:`prune` drops what a kind does
not declare, as decoding into the API server's types does (a map with ``properties`` keeps
only those; a map without them keeps everything, e.g. ``RawExtension``); strategic merge
patches find their list strategies through :func:`field_schema`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from api.jsontypes import Obj
from sharegpuctl.local.apiserver.resources import ResourceType
from sharegpuctl.local.apiserver.validation import definition_name, published_definitions

_DEFS: Final = "#/$defs/"
#: The schema of a field nothing is known about.
EMPTY: Final[Obj] = {}
#: How many ``$ref`` are followed from one node before giving up (definitions do not chain
#: this deep).
_MAX_REFS: Final = 32


def definition(rt: ResourceType) -> Obj | None:
    """The published definition of ``rt``'s kind; None for a custom resource (or a kind
    without one)."""
    name = None if rt.crd is not None else definition_name(rt.group, rt.version, rt.kind)
    return None if name is None else published_definitions().get(name)


def resolve(node: Any) -> Obj:
    """``node`` with its ``$ref`` (or single-element ``allOf``) followed to the definition."""
    for _ in range(_MAX_REFS):
        if not isinstance(node, dict):
            return EMPTY
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEFS):
            node = published_definitions().get(ref.removeprefix(_DEFS), EMPTY)
            continue
        all_of = node.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and "properties" not in node:
            node = all_of[0]
            continue
        return node
    return EMPTY


def field_schema(schema: Obj, name: str) -> Obj:
    """The schema node of field ``name`` of the map ``schema`` describes (its property, or its
    ``additionalProperties`` for a map of any keys); empty when unknown."""
    resolved = resolve(schema)
    props = resolved.get("properties")
    if isinstance(props, dict) and isinstance(props.get(name), dict):
        node: Obj = props[name]
        return node
    extra = resolved.get("additionalProperties")
    return extra if isinstance(extra, dict) else EMPTY


def prune(schema: Obj, obj: Obj) -> list[str]:
    """Drop, in place, the fields of ``obj`` that ``schema`` does not declare; returns their
    paths, sorted (``spec.colour``, ``spec.containers[0].x``)."""
    unknown: list[str] = []
    _prune(schema, obj, "", unknown)
    return sorted(unknown)


def _prune(schema: Obj, value: Any, path: str, unknown: list[str]) -> None:
    resolved = resolve(schema)
    if isinstance(value, list):
        items = resolved.get("items")
        for i, item in enumerate(value):
            if isinstance(items, dict):
                _prune(items, item, f"{path}[{i}]", unknown)
        return
    if not isinstance(value, dict):
        return
    props = resolved.get("properties")
    extra = resolved.get("additionalProperties")
    for key in list(value):
        child = f"{path}.{key}" if path else key
        if isinstance(props, dict) and key in props:
            _prune(props[key], value[key], child, unknown)
        elif isinstance(extra, dict):
            _prune(extra, value[key], child, unknown)
        elif isinstance(props, dict):
            del value[key]
            unknown.append(child)


def pruner(rt: ResourceType) -> Callable[[Obj], list[str]] | None:
    """``rt.prune`` for a built-in kind with a published definition (None otherwise)."""
    schema = definition(rt)
    return None if schema is None else functools.partial(prune, schema)
