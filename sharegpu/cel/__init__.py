"""Kubernetes CEL for DRA device selectors, built on cel-python's parser.

Public interface::

    program = compile_selector("device.attributes['gpu.sharegpu.dev'].productName == 'H100'")
    activation = device_activation("gpu.sharegpu.dev", slice_device_dict)   # once per device
    program.evaluate(activation)   # -> bool, or raises CelEvalError
    program.references             # attributes/capacities the expression names

:class:`CelCompileError` carries the expression, message, line and column.

Supported: the CEL operators and macros (``has``, ``all``, ``exists``, ``exists_one``,
``map``, ``filter``, ``cel.bind``), the standard functions and conversions, Kubernetes'
string extensions (``charAt``, ``indexOf``, ``lastIndexOf``, ``lowerAscii``, ``upperAscii``,
``replace``, ``split``, ``substring``, ``trim``, ``join``), regex ``find``/``findAll``, list
``isSorted``/``sum``/``min``/``max``/``indexOf``/``lastIndexOf``, and the quantity and semver
libraries. Not supported (a compile error names the function): the URL, IP and CIDR
libraries, ``format``/``quote``/``reverse``, ``type()``, timestamps and durations, optional
types, and the runtime cost limit (selectors here are bounded by the device's own data).
"""

from __future__ import annotations

from .compiler import Reference
from .device import DomainMap, device_activation, split_qualified
from .environment import (
    CacheInfo,
    SelectorProgram,
    cache_info,
    clear_cache,
    compile_error,
    compile_selector,
)
from .errors import CelCompileError, CelError, CelEvalError
from .quantity import Quantity
from .semver import Semver

__all__ = [
    "CacheInfo",
    "CelCompileError",
    "CelError",
    "CelEvalError",
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
    "split_qualified",
]
