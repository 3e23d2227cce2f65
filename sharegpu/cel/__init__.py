"""Kubernetes CEL for DRA device selectors, built on cel-python's parser.

Public interface::

    program = compile_selector("device.attributes['gpu.sharegpu.dev'].productName == 'H100'")
    activation = device_activation("gpu.sharegpu.dev", slice_device_dict)   # once per device
    program.evaluate(activation)   # -> bool, or raises CelEvalError
    program.references             # attributes/capacities the expression names

:class:`CelCompileError` carries the expression, message, line and column.

The environment is Kubernetes 1.36's base CEL environment (cel-go v0.26.0) with DRA's
``device`` variable. Supported, checked at compile time as Kubernetes' type-checker does:

- the CEL language: literals (``1.`` is no float literal, as in cel-go), operators with CEL's
  error absorption, cross-type numeric comparison (cel-go's rules near 2^63), ``has``,
  ``all``, ``exists``, ``exists_one``/``existsOne``, ``map``, ``filter``, ``cel.bind``, the
  two-variable comprehensions (``all``/``exists``/``existsOne`` with two variables,
  ``transformList``, ``transformMap``, ``transformMapEntry``), optional values (``.?f``,
  ``[?k]``, ``[?e]``, ``{?k: v}``, ``optional.of``/``none``/``ofNonZeroValue``,
  ``hasValue``, ``value``, ``orValue``, ``or``, ``optMap``, ``optFlatMap``) and type values
  (``type(x) == int``);
- static checks: wrong argument counts and known argument/receiver types are "found no
  matching overload" errors (``isIP(cidr(...))``), timestamps and durations in ``+ - < <=
  > >=`` by CEL's overloads, homogeneous list and map literals (outside ``format``), constant
  regex patterns, ``duration()``/``timestamp()`` literals and constant ``format`` strings;
- the standard functions and conversions, timestamps and durations with their accessors and
  time zones, the strings extension at version 2 (``charAt``, ``indexOf``, ``lastIndexOf``,
  ``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``, ``join``,
  ``format``, ``strings.quote``), the sets extension, the lists extension at version 3
  (``slice``, ``flatten``, ``distinct``, ``reverse``, ``sort``, ``sortBy``, ``lists.range``),
  and Kubernetes' libraries: lists (``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``,
  ``lastIndexOf``), regex (``find``, ``findAll``, RE2 syntax), URL, IP, CIDR, quantity,
  semver and the named formats (``format.named``, ``format.dns1123Label()``, ...,
  ``validate``) -- the tables are :mod:`sharegpu.cel.library`;
- DRA's ``includes`` and list-valued attributes, and Kubernetes' cost model
  (:mod:`sharegpu.cel.cost`): ``program.max_cost`` is the estimate, :func:`validate_selector`
  refuses what the API server refuses, and a program whose estimate is above the runtime
  limit is charged as it runs and stopped past the limit.

Not part of a DRA selector's environment, so a compile error: message construction
(``T{f: v}``), the authorizer library and the strings extension's later versions
(``"abc".reverse()``).
"""

from __future__ import annotations

from .compiler import Reference
from .device import DomainMap, device_activation, split_qualified
from .environment import (
    STORED,
    CacheInfo,
    CompileOptions,
    SelectorProgram,
    cache_info,
    clear_cache,
    compile_error,
    compile_selector,
    is_compiled,
    validate_selector,
)
from .errors import CelCompileError, CelCostError, CelError, CelEvalError
from .quantity import Quantity
from .semver import Semver

__all__ = [
    "STORED",
    "CacheInfo",
    "CelCompileError",
    "CelCostError",
    "CelError",
    "CelEvalError",
    "CompileOptions",
    "DomainMap",
    "Quantity",
    "Reference",
    "SelectorProgram",
    "Semver",
    "cache_info",
    "clear_cache",
    "compile_error",
    "compile_selector",
    "device_activation",
    "is_compiled",
    "split_qualified",
    "validate_selector",
]
