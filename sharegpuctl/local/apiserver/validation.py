"""Admission validation of resource.k8s.io objects.

Objects are checked against the official OpenAPI-derived JSON schemas shipped by the
``kubernetes-validate`` package (strict variant: unknown fields are rejected) for Kubernetes
``SCHEMA_KUBERNETES_VERSION``; ResourceSlices additionally go through
:func:`sharegpu.kube.slicerules.validate_resource_slice`, DeviceTaintRules through
:func:`sharegpu.kube.devicetaints.validate_device_taint_rule`. Compiled validators are cached
per kind, so the 1.6 MB definitions file is read once per process.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

from api.upstream import UPSTREAM
from sharegpu.kube.devicetaints import validate_device_taint_rule
from sharegpu.kube.slicerules import validate_resource_slice

#: Kubernetes version whose schemas are used: the ``.0`` of the targeted minor release
#: (``api/upstream.toml``), as ``kubernetes-validate`` names its schema sets.
SCHEMA_KUBERNETES_VERSION = "{}.{}.0".format(*UPSTREAM.minor)
_SCHEMA_DIR = f"kubernetes-json-schema/v{SCHEMA_KUBERNETES_VERSION}-local"

Validator = Callable[[dict[str, Any]], list[str]]


def _schema_file(name: str, *, strict: bool = True) -> Any:
    """One file of the schemas; ``strict``: the variant that rejects unknown fields."""
    folder = f"{_SCHEMA_DIR}-strict" if strict else _SCHEMA_DIR
    ref = resources.files("kubernetes_validate").joinpath(f"{folder}/{name}")
    return json.loads(ref.read_text(encoding="utf-8"))


@functools.cache
def published_definitions() -> dict[str, Any]:
    """Every definition of ``SCHEMA_KUBERNETES_VERSION`` as the API server publishes it (the
    non-strict variant: unknown fields are not marked forbidden), by OpenAPI name. Read once;
    callers must not modify it."""
    defs: dict[str, Any] = _schema_file("_definitions.json", strict=False)["$defs"]
    return defs


@functools.cache
def _definition_names() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in published_definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            key = (gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))
            out.setdefault(key, name)
    return out


def definition_name(group: str, version: str, kind: str) -> str | None:
    """The name of the published definition of ``kind`` in ``group``/``version``, if any."""
    return _definition_names().get((group, version, kind))


@functools.cache
def _registry() -> referencing.Registry[Any]:
    definitions = referencing.Resource.from_contents(
        _schema_file("_definitions.json"), default_specification=referencing.jsonschema.DRAFT202012
    )
    return definitions @ referencing.Registry()


def _schema_name(api_version: str, kind: str) -> str:
    # resource.k8s.io/v1 -> resource-v1; v1 -> v1
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    return f"{kind.lower()}-{group_version}.json"


def _format_path(path: Any) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif text:
            text += f".{part}"
        else:
            text = str(part)
    return text or "<root>"


_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"


@functools.cache
def _definitions() -> dict[str, Any]:
    defs: dict[str, Any] = _schema_file("_definitions.json")["$defs"]
    return defs


def _inline_refs(node: Any, stack: tuple[str, ...] = ()) -> Any:
    """``node`` with every definition ``$ref`` replaced by the definition itself (descriptions
    dropped). Validating against the inlined tree is about three times faster than resolving
    references through the registry on every object. A recursive reference is kept, pointing at
    the definitions document by absolute URI (the registry resolves it)."""
    if isinstance(node, list):
        return [_inline_refs(item, stack) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    rest = {k: _inline_refs(v, stack) for k, v in node.items() if k not in ("$ref", "description")}
    if not (isinstance(ref, str) and "$defs/" in ref):
        if ref is not None:
            rest["$ref"] = ref
        return rest
    name = ref.rsplit("/", 1)[1]
    if name in stack:
        target: Any = {"$ref": f"{_DEFINITIONS_ID}#/$defs/{name}"}
    else:
        target = _inline_refs(_definitions()[name], (*stack, name))
    return {"allOf": [target], **rest} if rest else target


@functools.cache
def schema_validator(api_version: str, kind: str) -> Validator:
    """A cached validator for ``kind`` in ``api_version``; it returns ``path: message`` strings."""
    schema = _inline_refs(_schema_file(_schema_name(api_version, kind)))
    schema.pop("$id", None)
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())

    def validate(obj: dict[str, Any]) -> list[str]:
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
        return [f"{_format_path(e.path)}: {e.message}" for e in errors]

    return validate


def validate_resource_slice_object(obj: dict[str, Any]) -> list[str]:
    """Schema validation plus the ResourceSlice rules the schema cannot express."""
    messages = schema_validator("resource.k8s.io/v1", "ResourceSlice")(obj)
    if messages:
        return messages
    return validate_resource_slice(obj)


def validate_device_taint_rule_object(obj: dict[str, Any]) -> list[str]:
    """Schema validation plus the DeviceTaintRule rules the schema cannot express."""
    messages = schema_validator("resource.k8s.io/v1", "DeviceTaintRule")(obj)
    if messages:
        return messages
    return validate_device_taint_rule(obj)


def resource_schema_validator(kind: str) -> Validator:
    """Validator for a resource.k8s.io/v1 kind, loaded lazily on first use."""

    def validate(obj: dict[str, Any]) -> list[str]:
        return schema_validator("resource.k8s.io/v1", kind)(obj)

    return validate
