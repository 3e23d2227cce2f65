"""``meta.k8s.io/v1`` Table answers, what ``kubectl get`` asks for.

A client that sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` on a get or list
gets a Table. A built-in kind gets the columns the real server prints for it
(:mod:`.printers`); any other type gets a ``Name`` column, then the type's
``additionalPrinterColumns`` (or, for a type without any, ``Created At`` with the RFC 3339
timestamp, as the real server's default table convertor has it). Cells follow
apiextensions-apiserver's CRD table convertor: a missing value is ``null``; ``string`` columns
print the value; ``integer``, ``number`` and ``boolean`` columns keep a value of that type;
``date`` columns show the age (``duration.HumanDuration``). Each row carries the object as
``includeObject`` asks (``Metadata``, the default: a PartialObjectMetadata; ``Object``; ``None``).
Only simple JSONPaths (``.a.b``, ``.a[0].b``) are evaluated; others give empty cells.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.printers import (
    AGE_DESCRIPTION,
    BUILTIN_COLUMNS,
    NAME_DESCRIPTION,
    ROW_CONDITIONS,
    Column,
    human_duration,
)
from sharegpuctl.local.apiserver.resources import ResourceType

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": NAME_DESCRIPTION,
    "priority": 0,
}
_CREATED_COLUMN = {
    "name": "Created At",
    "type": "date",
    "description": AGE_DESCRIPTION,
    "priority": 0,
}
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")
_INCLUDE = ("Metadata", "Object", "None")


def wants_table(accept: str) -> bool:
    """Whether ``accept`` asks for a meta.k8s.io Table first."""
    first = accept.split(",")[0].replace(" ", "").lower()
    params = set(first.split(";")[1:])
    return "as=table" in params and "g=meta.k8s.io" in params


def _lookup(obj: Any, path: str) -> Any:
    if not path.startswith(".") or _STEP.sub("", path):
        return None
    current = obj
    for key, index in _STEP.findall(path):
        if key and isinstance(current, Mapping):
            current = current.get(key)
        elif index and isinstance(current, list) and int(index) < len(current):
            current = current[int(index)]
        else:
            return None
    return current


def _age(value: Any, now: datetime) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        then = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return human_duration((now - then).total_seconds())


def _cell(column: Mapping[str, Any], value: Any, now: datetime) -> Any:
    kind = column.get("type")
    if value is None:
        return None
    if kind == "date":
        return _age(value, now)
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value if ok else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (int, float)) else None


def _builtin(rt: ResourceType) -> tuple[Column, ...] | None:
    """The printed columns of a built-in kind (never of a custom resource)."""
    return BUILTIN_COLUMNS.get((rt.group, rt.plural)) if rt.crd is None else None


def _columns(rt: ResourceType) -> list[dict[str, Any]]:
    if not rt.printer_columns:
        return [_NAME_COLUMN, _CREATED_COLUMN]
    columns = [_NAME_COLUMN]
    for col in rt.printer_columns:
        path = col.get("jsonPath", "")
        columns.append(
            {
                "name": col.get("name", ""),
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "description": col.get("description")
                or f"Custom resource definition column (in JSONPath format): {path}",
                "priority": int(col.get("priority", 0)),
            }
        )
    return columns


def _paths(rt: ResourceType) -> list[str]:
    return [str(col.get("jsonPath", "")) for col in rt.printer_columns]


def _cells(
    rt: ResourceType,
    builtin: tuple[Column, ...] | None,
    columns: list[dict[str, Any]],
    obj: dict[str, Any],
    now: datetime,
) -> list[Any]:
    if builtin:
        return [column.cell(obj, now) for column in builtin]
    meta = obj.get("metadata") or {}
    cells = [meta.get("name")]
    if not rt.printer_columns:  # the default convertor shows the timestamp itself
        return [*cells, meta.get("creationTimestamp")]
    for column, path in zip(columns[1:], _paths(rt), strict=False):
        cells.append(_cell(column, _lookup(obj, path), now))
    return cells


def table(
    rt: ResourceType,
    objects: list[dict[str, Any]],
    resource_version: str,
    include_object: str | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The Table of ``objects`` of type ``rt``; 400 for an unknown ``includeObject``."""
    include = include_object or "Metadata"
    if include not in _INCLUDE:
        raise ApiError(
            400,
            f"includeObject: Unsupported value: {include!r}: supported values: "
            + ", ".join(f'"{v}"' for v in _INCLUDE),
        )
    now = now or datetime.now(UTC)
    builtin = _builtin(rt)
    columns = [c.definition() for c in builtin] if builtin else _columns(rt)
    conditions = ROW_CONDITIONS.get((rt.group, rt.plural)) if builtin else None
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        row: dict[str, Any] = {"cells": _cells(rt, builtin, columns, obj, now)}
        row_conditions = conditions(obj) if conditions else []
        if row_conditions:
            row["conditions"] = row_conditions
        if include == "Object":
            row["object"] = obj
        elif include == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": meta,
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
