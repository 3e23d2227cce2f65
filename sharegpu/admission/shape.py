"""The JSON shape of the fields the admission checks read, with Kubernetes' size limits.

An API server decodes every object into its Go types and validates it before a validating
webhook sees it, so an object of the wrong shape (a request that is a string, ``selectors``
that is an object, a capacity request that is a list) or beyond Kubernetes' limits (more than
32 selectors in a request, a selector longer than 10 KiB) never comes from one. Such objects
come from other clients and from hand-written manifests; :func:`problems` reports each wrong
field as a :class:`Problem` with its path and what the field must be, so that the rules of
:mod:`sharegpu.admission.checks` only ever read fields of the types they expect.

Only the fields the checks read are described (unknown fields are ignored), and ``null`` is
the same as an absent field, as in Kubernetes' decoding. A list longer than its limit is
reported once and its items are not looked at, so the work spent on one object is bounded by
the limits, not by its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from api.jsontypes import json_type

#: Kubernetes' limits on DRA objects (``k8s.io/api/resource/v1``, enforced by the API server's
#: validation): name of the Go constant and its value.
DEVICE_REQUESTS_MAX_SIZE: Final = ("DeviceRequestsMaxSize", 32)
FIRST_AVAILABLE_MAX_SIZE: Final = ("FirstAvailableDeviceRequestMaxSize", 8)
DEVICE_SELECTORS_MAX_SIZE: Final = ("DeviceSelectorsMaxSize", 32)
DEVICE_CONFIG_MAX_SIZE: Final = ("DeviceConfigMaxSize", 32)
CEL_EXPRESSION_MAX_LENGTH: Final = ("CELSelectorExpressionMaxLength", 10 * 1024)
OPAQUE_PARAMETERS_MAX_LENGTH: Final = ("OpaqueParametersMaxLength", 10 * 1024)


@dataclass(frozen=True)
class Problem:
    """A field of the wrong JSON type or beyond a limit: ``path`` as the checks write it
    (``spec.devices.requests[0].exactly``), ``message`` says what the field must be."""

    path: str
    message: str


def _limit_text(limit: tuple[str, int]) -> str:
    name, most = limit
    return f"Kubernetes' {name} is {most}"


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8, as Go's ``len`` measures a string (a lone surrogate, which
    JSON can carry, counts as three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Node(Protocol):
    """The expected shape of one field."""

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        """Append a :class:`Problem` to ``out`` for every part of ``value`` (not ``None``)
        that does not have this shape."""


class String:
    """A string, at most ``limit`` UTF-8 bytes long when a limit is given."""

    def __init__(self, limit: tuple[str, int] | None = None) -> None:
        self.limit = limit

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, str):
            out.append(Problem(path, f"must be a string, got {json_type(value)}"))
        elif self.limit is not None and len(value) * 4 > self.limit[1]:
            size = utf8_length(value)
            if size > self.limit[1]:
                out.append(
                    Problem(
                        path,
                        f"must be at most {self.limit[1]} bytes long "
                        f"({_limit_text(self.limit)}), got {size}",
                    )
                )


class QuantityValue:
    """A ``resource.Quantity``: a string such as ``4Gi`` or a JSON number (what its text
    means is the rules' business)."""

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            out.append(
                Problem(
                    path,
                    f"must be a quantity (a string such as '4Gi', or a number), "
                    f"got {json_type(value)}",
                )
            )


class Object:
    """A JSON object whose listed ``fields`` have the given shapes (others are not looked at)."""

    def __init__(self, fields: Mapping[str, Node]) -> None:
        self.fields = dict(fields)

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, Mapping):
            out.append(Problem(path or "<root>", f"must be an object, got {json_type(value)}"))
            return
        for key, node in self.fields.items():
            field = value.get(key)
            if field is not None:
                node.check(field, _child(path, key), out)


class MapOf:
    """A JSON object with any keys whose values have the shape ``values`` (a value's path is
    ``path[key]``; a null value is checked too, as a value of its own)."""

    def __init__(self, values: Node) -> None:
        self.values = values

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, Mapping):
            out.append(Problem(path, f"must be an object, got {json_type(value)}"))
            return
        for key, item in value.items():
            self.values.check(item, f"{path}[{key}]", out)


class ListOf:
    """A list of items of the shape ``items``, at most ``limit`` long when a limit is given
    (a longer list is reported once and its items are not looked at)."""

    def __init__(self, items: Node, limit: tuple[str, int] | None = None) -> None:
        self.items = items
        self.limit = limit

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, list):
            out.append(Problem(path, f"must be a list, got {json_type(value)}"))
            return
        if self.limit is not None and len(value) > self.limit[1]:
            out.append(
                Problem(
                    path,
                    f"must have at most {self.limit[1]} items ({_limit_text(self.limit)}), "
                    f"got {len(value)}",
                )
            )
            return
        for i, item in enumerate(value):
            if item is None:
                out.append(Problem(f"{path}[{i}]", "must not be null"))
            else:
                self.items.check(item, f"{path}[{i}]", out)


class JsonText:
    """Any JSON value whose compact encoding is at most ``limit`` bytes (Kubernetes measures
    the raw text as sent, which is never shorter, so nothing Kubernetes accepts is refused)."""

    def __init__(self, limit: tuple[str, int]) -> None:
        self.limit = limit

    def check(self, value: Any, path: str, out: list[Problem]) -> None:
        most = self.limit[1]
        if json_length_above(value, most):
            out.append(
                Problem(
                    path,
                    f"must be at most {most} bytes of JSON ({_limit_text(self.limit)})",
                )
            )


def json_length_above(value: Any, limit: int) -> bool:
    """Whether the compact JSON encoding of ``value`` is longer than ``limit`` bytes.

    Iterative (safe for any nesting) and stops as soon as the answer is known, so the work is
    bounded by ``limit``. Lengths are counted without escapes: a lower bound of the encoding.
    """
    total = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += utf8_length(item) + 2
        elif isinstance(item, Mapping):
            total += 2 + max(len(item) - 1, 0)
            for key, child in item.items():
                total += utf8_length(str(key)) + 3
                stack.append(child)
                if total > limit:
                    return True
        elif isinstance(item, list):
            total += 2 + max(len(item) - 1, 0)
            stack.extend(item)
        elif item is None or isinstance(item, bool):
            total += 4
        elif isinstance(item, int):
            total += max(1, abs(item).bit_length() * 3 // 10)
        elif isinstance(item, float):
            total += len(repr(item))
        else:
            total += len(str(item))
        if total > limit:
            return True
    return False


def problems(node: Node, value: Any, path: str = "") -> list[Problem]:
    """Every shape problem of ``value`` against ``node``, in document order."""
    out: list[Problem] = []
    node.check(value, path, out)
    return out


# --- the DRA objects ---------------------------------------------------------------------------

STRING: Final = String()
SELECTORS: Final = ListOf(
    Object({"cel": Object({"expression": String(CEL_EXPRESSION_MAX_LENGTH)})}),
    DEVICE_SELECTORS_MAX_SIZE,
)
CAPACITY: Final = Object({"requests": MapOf(QuantityValue())})
#: The fields of an ``exactly`` request, a ``firstAvailable`` subrequest and a v1beta1 request.
_EXACT_FIELDS: Final[dict[str, Node]] = {
    "deviceClassName": STRING,
    "selectors": SELECTORS,
    "capacity": CAPACITY,
}
SUBREQUEST: Final = Object({"name": STRING, **_EXACT_FIELDS})
REQUEST: Final = Object(
    {
        "name": STRING,
        "exactly": Object(_EXACT_FIELDS),
        "firstAvailable": ListOf(SUBREQUEST, FIRST_AVAILABLE_MAX_SIZE),
        **_EXACT_FIELDS,
    }
)
OPAQUE: Final = Object({"driver": STRING, "parameters": JsonText(OPAQUE_PARAMETERS_MAX_LENGTH)})
CLAIM_CONFIG: Final = ListOf(
    Object({"source": STRING, "requests": ListOf(STRING), "opaque": OPAQUE}),
    DEVICE_CONFIG_MAX_SIZE,
)
CLAIM_SPEC: Final = Object(
    {
        "devices": Object(
            {"requests": ListOf(REQUEST, DEVICE_REQUESTS_MAX_SIZE), "config": CLAIM_CONFIG}
        )
    }
)
METADATA: Final = Object({"name": STRING, "generateName": STRING, "namespace": STRING})
RESOURCE_CLAIM: Final = Object({"metadata": METADATA, "spec": CLAIM_SPEC})
RESOURCE_CLAIM_TEMPLATE: Final = Object(
    {"metadata": METADATA, "spec": Object({"metadata": Object({}), "spec": CLAIM_SPEC})}
)
DEVICE_CLASS: Final = Object(
    {
        "metadata": METADATA,
        "spec": Object(
            {
                "selectors": SELECTORS,
                "config": ListOf(Object({"opaque": OPAQUE}), DEVICE_CONFIG_MAX_SIZE),
            }
        ),
    }
)
