"""Kubernetes CEL for DRA device selectors, built on cel-python's parser.

Public interface::

    program = compile_selector("device.attributes['gpu.sharegpu.dev'].productName == 'H100'")
    activation = device_activation("gpu.sharegpu.dev", slice_device_dict)   # once per device
    program.evaluate(activation)   # -> bool, or raises CelEvalError

:class:`CelCompileError` carries the expression, message, line and column.
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
