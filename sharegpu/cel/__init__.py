"""Kubernetes CEL for DRA device selectors, built on cel-python's parser::

    program = compile_selector(expression)   # CelCompileError: expression, message, line, column
    program.evaluate(device_activation(driver, device))   # bool, or raises CelEvalError
    program.references   # the attributes and capacities the expression names

The environment is Kubernetes 1.36's for DRA selectors (cel-go v0.26.0, its extensions and
Kubernetes' libraries, tabled in :mod:`sharegpu.cel.library`), type-checked at compile time and
costed (:mod:`sharegpu.cel.cost`) as the API server does; anything outside it is a compile error.
docs/compatibility.md lists the environment and the upstream tables it passes."""

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
