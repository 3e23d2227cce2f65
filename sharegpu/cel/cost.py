"""Kubernetes' CEL cost model for DRA selectors: estimates at compile time, a budget at run time.

The estimate follows cel-go's checker (``checker/cost.go``) with Kubernetes' library estimator
(``apiserver/pkg/cel/library/cost.go``) and the DRA size estimator
(``dynamic-resource-allocation/cel/compile.go``): every identifier and field selection costs 1,
a literal 0, a list literal 10, a map literal 30, a call 1 unless its cost grows with the size of
its operands (string traversals cost 0.1 per character, regular expressions 0.25 per pattern
character, list membership 1 per element), and a comprehension costs its range's size times
the cost of one step. Sizes come from literals and from the declared bounds of the ``device``
variable (:data:`DEVICE_DECL`). Costs and sizes are ``(min, max)`` pairs of unsigned 64-bit
integers that saturate at :data:`UNBOUNDED` instead of overflowing.

The API server refuses a new selector whose estimated maximum is above
:data:`SELECTOR_MAX_COST` (``too complex, exceeds cost limit``); the scheduler stops an
evaluation whose actual cost passes :data:`RUNTIME_COST_LIMIT` (:data:`COST_EXCEEDED`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import CelEvalError

#: The largest cost or size: cel-go's ``math.MaxUint64``.
UNBOUNDED = 2**64 - 1
#: resource.k8s.io's ``CELSelectorExpressionMaxCost``: the most a selector may be estimated to
#: cost when it is created or changed, and the default runtime limit of one evaluation.
SELECTOR_MAX_COST = 1_000_000
RUNTIME_COST_LIMIT = SELECTOR_MAX_COST
#: The API server's validation message for a selector estimated above the limit.
TOO_COMPLEX = "too complex, exceeds cost limit"
#: cel-go's error for an evaluation stopped by the runtime limit.
COST_EXCEEDED = "operation cancelled: actual cost limit exceeded"

STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25
LIST_CREATE = 10
MAP_CREATE = 30

#: resource.k8s.io API bounds (``DeviceMaxDomainLength``, ``DeviceMaxIDLength``,
#: ``DriverNameMaxLength``, ``DeviceAttributeMaxValueLength``,
#: ``ResourceSliceMaxAttributesAndCapacitiesPerDevice``,
#: ``ResourceSliceMaxAttributeValuesPerDevice``).
MAX_DOMAIN = 63
MAX_ID = 32
MAX_DRIVER = 63
MAX_ATTRIBUTE_VALUE = 64
MAX_ATTRIBUTES = 32
MAX_LIST_VALUES = 48
#: The size bound of an attribute whose type is unknown at compile time: a string or a list.
ATTRIBUTE_BOUND = max(MAX_ATTRIBUTE_VALUE, MAX_LIST_VALUES)

Est = tuple[int, int]
UNKNOWN: Est = (0, UNBOUNDED)
ZERO: Est = (0, 0)
ONE: Est = (1, 1)


def add(a: Est, b: Est) -> Est:
    """Saturating sum of two estimates."""
    return (min(a[0] + b[0], UNBOUNDED), min(a[1] + b[1], UNBOUNDED))


def total(*parts: Est) -> Est:
    """Saturating sum of several estimates."""
    result = ZERO
    for p in parts:
        result = add(result, p)
    return result


def mul(a: Est, b: Est) -> Est:
    """Saturating product (sizes times per-element costs)."""
    return (min(a[0] * b[0], UNBOUNDED), min(a[1] * b[1], UNBOUNDED))


def _factor(x: int, f: float) -> int:
    if x > 0 and x > UNBOUNDED / f:
        return UNBOUNDED
    value = math.ceil(float(x) * f)
    return UNBOUNDED if value >= 2**64 else value


def factor(a: Est, f: float) -> Est:
    """``ceil(size * f)`` per bound, as cel-go's ``MultiplyByCostFactor``."""
    return (_factor(a[0], f), _factor(a[1], f))


def union(a: Est, b: Est) -> Est:
    """The range covering both."""
    return (min(a[0], b[0]), max(a[1], b[1]))


@dataclass(frozen=True)
class Decl:
    """The declared shape of part of the ``device`` variable: its size bound (cel-go's
    ``MaxElements``) and, for maps and objects, key, element and field declarations."""

    max_elements: int
    key: Decl | None = None
    elem: Decl | None = None
    fields: Mapping[str, Decl] | None = None


_ATTRIBUTE = Decl(ATTRIBUTE_BOUND)
_QUANTITY = Decl(0)
_INNER_ATTRIBUTES = Decl(MAX_ATTRIBUTES, Decl(MAX_ID), _ATTRIBUTE)
_INNER_CAPACITY = Decl(MAX_ATTRIBUTES, Decl(MAX_ID), _QUANTITY)
#: The ``device`` variable as DRA declares it for the cost estimator.
DEVICE_DECL = Decl(
    0,
    fields={
        "driver": Decl(MAX_DRIVER),
        "allowMultipleAllocations": Decl(1),
        "attributes": Decl(MAX_ATTRIBUTES, Decl(MAX_DOMAIN), _INNER_ATTRIBUTES),
        "capacity": Decl(MAX_ATTRIBUTES, Decl(MAX_DOMAIN), _INNER_CAPACITY),
    },
)


def path_size(path: Sequence[str] | None) -> Est | None:
    """The size bound of the value at ``path`` (``device``, field names, ``@items``,
    ``@values``, ``@keys``), as DRA's size estimator computes it; None when unknown."""
    if not path or path[0] != "device":
        return None
    node = DEVICE_DECL
    for name in path[1:]:
        found: Decl | None
        if name in ("@items", "@values"):
            found = node.elem
        elif name == "@keys":
            found = node.key
        elif node.fields is not None and name in node.fields:
            found = node.fields[name]
        elif node.elem is _ATTRIBUTE:
            found = _ATTRIBUTE
        else:
            found = None
        if found is None:
            return None
        node = found
    return (0, node.max_elements)


# --- runtime ---------------------------------------------------------------------------------


class CostBudget:
    """The actual cost of one evaluation, charged as nodes run; raises :class:`CelEvalError`
    (:data:`COST_EXCEEDED`) as soon as it passes ``limit``."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int = RUNTIME_COST_LIMIT) -> None:
        self.limit = limit
        self.spent = 0

    def charge(self, amount: int) -> None:
        """Add ``amount``; the error once the total is above the limit."""
        self.spent += amount
        if self.spent > self.limit:
            raise CelEvalError(COST_EXCEEDED)
