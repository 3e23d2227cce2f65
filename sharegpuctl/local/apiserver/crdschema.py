"""Pruning and validation of custom resources against a CRD's structural ``openAPIV3Schema``, as
kube-apiserver's apiextensions-apiserver does on every write, for the keywords this project's
CRDs use (types, ``nullable``, ``enum``, bounds, lengths, ``pattern``, items, properties,
``required``, ``additionalProperties``, int-or-string, ``x-kubernetes-preserve-unknown-fields``).

Invariants, as upstream: pruning runs first (undeclared fields and ``null`` of non-nullable
fields dropped; root ``apiVersion``, ``kind``, ``metadata`` kept); every error is one
``path: body`` string worded as ``k8s.io/apimachinery/pkg/util/validation/field``, the schema
messages converted as ``kubeOpenAPIResultToFieldErrors`` does (required -> ``Required value``,
enum -> ``Unsupported value``, maxLength -> ``Too long``, maxItems -> ``Too many``, the rest
``Invalid value``); paths join properties with ``.`` and items with ``[i]``. Not modelled:
``x-kubernetes-validations``, ``format``, defaults, list-type uniqueness, ratcheting."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

Schema = Mapping[str, Any]

#: Root fields pruning leaves to the generic object machinery.
_ROOT_KEPT = frozenset({"apiVersion", "kind", "metadata"})
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING = "x-kubernetes-int-or-string"


def prune(schema: Schema, obj: dict[str, Any]) -> list[str]:
    """Drop, in place, what the schema does not declare (see the module invariants); returns
    the paths of the unknown fields dropped, sorted (``spec.colour``, ``spec.items[0].x``), what a
    request with ``fieldValidation=Strict`` is refused for (nulls dropped are not listed)."""
    unknown: list[str] = []
    _prune_object(schema, obj, root=True, path="", unknown=unknown)
    return sorted(unknown)


def _prune(schema: Schema, value: Any, path: str, unknown: list[str]) -> None:
    if isinstance(value, dict):
        _prune_object(schema, value, root=False, path=path, unknown=unknown)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                _prune(items, item, f"{path}[{i}]", unknown)


def _prune_object(
    schema: Schema, obj: dict[str, Any], *, root: bool, path: str, unknown: list[str]
) -> None:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    additional = schema.get("additionalProperties")
    preserve = schema.get(_PRESERVE) is True
    for key in list(obj):
        if root and key in _ROOT_KEPT:
            continue
        sub = properties.get(key)
        if sub is None and isinstance(additional, Mapping):
            sub = additional
        child = f"{path}.{key}" if path else key
        if sub is None:
            if not preserve:
                del obj[key]
                unknown.append(child)
            continue
        if obj[key] is None and not sub.get("nullable"):
            del obj[key]
            continue
        _prune(sub, obj[key], child, unknown)


def validate(schema: Schema, obj: Mapping[str, Any]) -> list[str]:
    """``path: body`` errors of ``obj`` (already pruned) against ``schema``; [] when valid."""
    errors: list[str] = []
    _validate(schema, obj, "", errors)
    return errors


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _has_type(value: Any, wanted: str) -> bool:
    actual = _json_type(value)
    if actual == wanted:
        return True
    if wanted == "number":
        return actual == "integer"
    if wanted == "integer":  # a JSON number without fraction counts as an integer upstream
        return actual == "number" and float(value).is_integer()
    return False


def go_value(value: Any) -> str:
    """``value`` as ``field.Error.ErrorBody`` prints a bad value: strings quoted, numbers and
    booleans plain (floats as Go's ``%v``), anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return '"null"'
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def go_float(value: float) -> str:
    """Go's ``%v`` of a float64: shortest digits, exponent form below 1e-4 or from 1e21."""
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{abs(int(exponent)):02d}"
    return text


def _bound(value: Any) -> str:
    """A schema bound as kube-openapi prints it (``%v`` of an int64 or a float64)."""
    if isinstance(value, float) and not value.is_integer():
        return go_float(value)
    return str(int(value))


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {go_value(value)}: {detail}"


def _validate(schema: Schema, value: Any, path: str, errors: list[str]) -> None:
    if value is None and schema.get("nullable"):
        return
    types = ["integer", "string"] if schema.get(_INT_OR_STRING) else []
    if not types and isinstance(schema.get("type"), str):
        types = [schema["type"]]
    if types and not any(_has_type(value, t) for t in types):
        actual = _json_type(value)
        errors.append(
            f'{path}: Invalid value: "{actual}": {path} in body must be of type '
            f'{",".join(types)}: "{actual}"'
        )
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        allowed = ", ".join(
            json.dumps(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
            for v in enum
        )
        errors.append(f"{path}: Unsupported value: {go_value(value)}: supported values: {allowed}")
    if isinstance(value, str):
        _validate_string(schema, value, path, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(schema, value, path, errors)
    elif isinstance(value, list):
        _validate_array(schema, value, path, errors)
    elif isinstance(value, dict):
        _validate_object(schema, value, path, errors)


def _validate_string(schema: Schema, value: str, path: str, errors: list[str]) -> None:
    max_length = schema.get("maxLength")
    if isinstance(max_length, int) and len(value) > max_length:
        errors.append(f"{path}: Too long: may not be more than {max_length} bytes")
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(value) < min_length:
        errors.append(
            _invalid(path, value, f"{path} in body should be at least {min_length} chars long")
        )
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not _compiled(pattern).search(value):
        errors.append(_invalid(path, value, f"{path} in body should match '{pattern}'"))


def _validate_number(schema: Schema, value: float, path: str, errors: list[str]) -> None:
    maximum = schema.get("maximum")
    if isinstance(maximum, (int, float)):
        exclusive = schema.get("exclusiveMaximum") is True
        if value > maximum or (exclusive and value == maximum):
            relation = "less than" if exclusive else "less than or equal to"
            errors.append(
                _invalid(path, value, f"{path} in body should be {relation} {_bound(maximum)}")
            )
    minimum = schema.get("minimum")
    if isinstance(minimum, (int, float)):
        exclusive = schema.get("exclusiveMinimum") is True
        if value < minimum or (exclusive and value == minimum):
            relation = "greater than" if exclusive else "greater than or equal to"
            errors.append(
                _invalid(path, value, f"{path} in body should be {relation} {_bound(minimum)}")
            )


def _validate_array(schema: Schema, value: list[Any], path: str, errors: list[str]) -> None:
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _validate(items, item, f"{path}[{i}]", errors)
    min_items = schema.get("minItems")
    if isinstance(min_items, int) and len(value) < min_items:
        errors.append(
            _invalid(path, len(value), f"{path} in body should have at least {min_items} items")
        )
    max_items = schema.get("maxItems")
    if isinstance(max_items, int) and len(value) > max_items:
        errors.append(f"{path}: Too many: {len(value)}: must have at most {max_items} items")


def _validate_object(schema: Schema, value: dict[str, Any], path: str, errors: list[str]) -> None:
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        if name not in value:
            errors.append(f"{_child(path, name)}: Required value")
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    additional = schema.get("additionalProperties")
    for key, item in value.items():
        sub = properties.get(key)
        if sub is None and isinstance(additional, Mapping):
            sub = additional
        if sub is not None:
            _validate(sub, item, _child(path, key), errors)
