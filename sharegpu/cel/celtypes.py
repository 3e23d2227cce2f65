"""CEL type values: what ``type(x)`` returns and what ``int``, ``string``, ... denote.

A :class:`CelType` is a value like any other: ``type(1) == int`` compares two of them, and
``type(int)`` is ``type``. Invariant: two type values are equal exactly when their names are.
:data:`TYPE_IDENTIFIERS` maps the identifiers that name types in expressions (where no
variable of that name is declared) to their values.
"""

from __future__ import annotations

from typing import Any


class CelType:
    """A CEL type, identified by its name (``int``, ``list``, ``net.IP``, ...)."""

    __slots__ = ("name",)
    cel_type_name = "type"

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and self.name == other.name

    def __hash__(self) -> int:
        return hash(("type", self.name))

    def __repr__(self) -> str:
        return f"type({self.name})"

    def __str__(self) -> str:
        return self.name


_NAMES = (
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "net.IP",
    "net.CIDR",
    "kubernetes.URL",
    "kubernetes.Quantity",
    "kubernetes.Semver",
)

#: Identifiers that denote types; the dotted names are reached through field selection.
TYPE_IDENTIFIERS: dict[str, CelType] = {name: CelType(name) for name in _NAMES}


def type_of(value: Any, name: str) -> CelType:
    """The type value of ``value`` whose CEL type name is ``name`` (see ``values.type_name``).

    Kubernetes' own types carry a ``kubernetes.`` prefix in type values.
    """
    if name in ("Quantity", "Semver", "URL"):
        name = "kubernetes." + name
    return TYPE_IDENTIFIERS.get(name) or CelType(name)
