"""Strategic merge patches of built-in kinds, driven by the kind's published schema.

A strategic merge patch is a merge patch whose lists follow the schema: a list marked
``x-kubernetes-patch-strategy: merge`` with ``x-kubernetes-patch-merge-key`` merges its
elements by that key (a container named in the patch is merged into the container of that
name), a merge list of scalars is a union; every other list is replaced. The directives kubectl
sends are honoured: ``$patch`` (``replace``, ``delete``, ``merge``) in a map or list element,
``$retainKeys``, ``$setElementOrder/<field>`` and ``$deleteFromPrimitiveList/<field>``. Nothing
of a directive is ever stored. Custom resources have no strategic merge patch (the API server
answers 415; :mod:`.patch`).
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import Any, Final

from api.jsontypes import Obj
from sharegpuctl.local.apiserver.builtinschema import EMPTY, field_schema
from sharegpuctl.local.apiserver.errors import ApiError

PATCH_DIRECTIVE: Final = "$patch"
RETAIN_KEYS: Final = "$retainKeys"
SET_ELEMENT_ORDER: Final = "$setElementOrder/"
DELETE_FROM_PRIMITIVE_LIST: Final = "$deleteFromPrimitiveList/"


def _is_directive(key: str) -> bool:
    return key in (PATCH_DIRECTIVE, RETAIN_KEYS) or key.startswith(
        (SET_ELEMENT_ORDER, DELETE_FROM_PRIMITIVE_LIST)
    )


def _without_directives(value: Any) -> Any:
    if isinstance(value, list):
        return [
            _without_directives(v)
            for v in value
            if not (isinstance(v, dict) and set(v) == {PATCH_DIRECTIVE})
        ]
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items() if not _is_directive(k)}
    return copy.deepcopy(value)


def strategic_merge(target: Obj, patch: Obj, schema: Obj) -> Obj:
    """``target`` with ``patch`` applied as a strategic merge patch of ``schema`` (a published
    definition). ``target`` is left unchanged; the result shares the parts the patch does not
    touch with it (copy it before changing it in place). The work is linear in the sizes of
    both: a merge list's elements are found by their merge key in a hash index."""
    merged = _merge_map(target, patch, schema, "")
    return merged if merged is not None else {}


def _merge_map(original: Obj, patch: Obj, schema: Obj, path: str) -> Obj | None:
    """The merged map; None when the patch deletes it (``$patch: delete``)."""
    directive = patch.get(PATCH_DIRECTIVE, "merge")
    if directive == "delete":
        return None
    if directive == "replace":
        replaced: Obj = _without_directives(patch)
        return replaced
    if directive != "merge":
        raise ApiError(
            422,
            f'{path or "<root>"}: Unsupported value: "{directive}": supported values: '
            '"delete", "merge", "replace"',
        )
    result = dict(original)  # shallow: nothing below is changed in place, only replaced
    retain = patch.get(RETAIN_KEYS)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith(DELETE_FROM_PRIMITIVE_LIST):
            field = key.removeprefix(DELETE_FROM_PRIMITIVE_LIST)
            drop = {_ident(v) for v in value} if isinstance(value, list) else set()
            kept = [v for v in result.get(field) or [] if _ident(v) not in drop]
            result[field] = kept
        elif key.startswith(SET_ELEMENT_ORDER) and isinstance(value, list):
            orders[key.removeprefix(SET_ELEMENT_ORDER)] = value
    for key, value in patch.items():
        if _is_directive(key):
            continue
        where = f"{path}.{key}" if path else key
        if value is None:
            result.pop(key, None)
            continue
        node = field_schema(schema, key)
        old = result.get(key)
        if isinstance(value, dict):
            merged = _merge_map(old if isinstance(old, dict) else {}, value, node, where)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and "merge" in str(node.get("x-kubernetes-patch-strategy")):
            result[key] = _merge_list(old if isinstance(old, list) else [], value, node, where)
        else:
            result[key] = _without_directives(value)
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            key_name = field_schema(schema, field).get("x-kubernetes-patch-merge-key")
            result[field] = _ordered(result[field], order, key_name)
    return result


def _merge_list(original: list[Any], patch: list[Any], schema: Obj, path: str) -> list[Any]:
    if any(isinstance(e, dict) and e.get(PATCH_DIRECTIVE) == "replace" for e in patch):
        replaced: list[Any] = _without_directives(patch)
        return replaced
    if not all(isinstance(e, dict) for e in patch):
        present = {_ident(v) for v in original}
        return list(original) + [v for v in patch if _ident(v) not in present]
    key = schema.get("x-kubernetes-patch-merge-key")
    if not isinstance(key, str):
        replaced = _without_directives(patch)
        return replaced
    items = schema.get("items")
    item_schema = items if isinstance(items, dict) else EMPTY
    slots: list[Any] = list(original)
    # merge key value -> the positions of the elements holding it, first first: each patch
    # element finds its target in constant time, so a merge is linear in both lists' lengths
    where: dict[str, deque[int]] = {}
    for i, e in enumerate(slots):
        if isinstance(e, dict) and key in e:
            where.setdefault(_ident(e[key]), deque()).append(i)
    for element in patch:
        if key not in element:
            raise ApiError(422, f"{path}: map in a merge list lacks the merge key {key!r}")
        positions = where.get(_ident(element[key]))
        at = positions[0] if positions else None
        if element.get(PATCH_DIRECTIVE) == "delete":
            if positions:
                slots[positions.popleft()] = _DELETED
            continue
        base = slots[at] if at is not None else {}
        merged = _merge_map(base, element, item_schema, f"{path}[{key}={element[key]}]")
        if at is None:
            slots.append(merged)
            where.setdefault(_ident(element[key]), deque()).append(len(slots) - 1)
        elif merged is not None:
            slots[at] = merged
    return [e for e in slots if e is not _DELETED]


#: Marks an element a patch deleted (dropped when the merged list is built).
_DELETED: Final = object()


def _ident(value: Any) -> str:
    """A hashable identity of a JSON value (equal values, equal identities)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _ordered(items: list[Any], order: list[Any], key: Any) -> list[Any]:
    """``items`` in the order of ``$setElementOrder`` (by merge key, or by value for scalars);
    items it does not name follow, in their order."""

    def ident(item: Any) -> Any:
        return item.get(key) if isinstance(item, dict) and isinstance(key, str) else item

    wanted = [o.get(key) if isinstance(o, dict) and isinstance(key, str) else o for o in order]
    rank = {repr(w): i for i, w in enumerate(wanted)}
    listed = [i for i in items if repr(ident(i)) in rank]
    rest = [i for i in items if repr(ident(i)) not in rank]
    return sorted(listed, key=lambda i: rank[repr(ident(i))]) + rest
