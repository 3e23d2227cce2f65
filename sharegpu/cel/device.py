"""The ``device`` variable of DRA selectors, built from a ResourceSlice device.

Kubernetes exposes attributes and capacities grouped by domain: an unqualified name ``uuid``
published by driver ``gpu.sharegpu.dev`` is ``device.attributes['gpu.sharegpu.dev'].uuid``;
a qualified name ``resource.kubernetes.io/pcieRoot`` sits under its own domain. An unknown
domain is an empty map; a missing name inside a domain is an error when selected.

Build the activation once per device and reuse it for every expression.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import CelEvalError
from .quantity import Quantity
from .semver import Semver

_EMPTY: Mapping[str, Any] = {}


class DomainMap(dict[str, Mapping[str, Any]]):
    """Domain -> name -> value; an unknown domain reads as an empty map (``in`` stays exact)."""

    def __missing__(self, key: str) -> Mapping[str, Any]:
        return _EMPTY


def finds(mapping: Mapping[Any, Any], key: Any) -> bool:
    """Whether looking ``key`` up in ``mapping`` finds a value (``m[?k]``, ``m.?k``,
    ``has(m.k)``). A :class:`DomainMap` finds every domain, as Kubernetes' does: an unknown
    one is its empty default. Membership (``k in m``), size and iteration stay exact."""
    if isinstance(mapping, DomainMap):
        return isinstance(key, str)
    return key in mapping


def split_qualified(driver: str, name: str) -> tuple[str, str]:
    """``(domain, id)`` of an attribute or capacity name as published by ``driver``."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


_LIST_KINDS = ("ints", "bools", "strings", "versions")


def attribute_value(value: Mapping[str, Any]) -> Any:
    """The CEL value of a published attribute (``{"int": 1}``, ``{"version": "1.2.3"}``, ...).

    A list-valued attribute (``ints``, ``bools``, ``strings``, ``versions``: the
    DRAListTypeAttributes API) is a tuple of those values, as the scheduler builds it whatever
    the gate (with the gate off the API server keeps such attributes out of ResourceSlices)."""
    for kind in _LIST_KINDS:
        if kind in value:
            items = value[kind]
            if not isinstance(items, list | tuple):
                raise CelEvalError(f"attribute value {kind} is not a list: {items!r}")
            return tuple(attribute_value({kind[:-1]: item}) for item in items)
    if "int" in value:
        return int(value["int"])
    if "bool" in value:
        return bool(value["bool"])
    if "string" in value:
        return str(value["string"])
    if "version" in value:
        return Semver(str(value["version"]))
    raise CelEvalError(
        f"attribute value has no int, bool, string or version (or a list of them): {dict(value)}"
    )


def device_activation(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The ``device`` variable for one ResourceSlice device (the ``spec.devices[]`` dict).

    Raises :class:`CelEvalError` when an attribute or capacity value is malformed.
    """
    attributes = DomainMap()
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = split_qualified(driver, name)
        attributes.setdefault(domain, {})[ident] = attribute_value(value)  # type: ignore[index]
    capacity = DomainMap()
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = split_qualified(driver, name)
        capacity.setdefault(domain, {})[ident] = Quantity.parse(str(cap.get("value")))  # type: ignore[index]
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
