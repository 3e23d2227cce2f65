"""Compile-once, evaluate-many DRA selectors.

:func:`compile_selector` parses and checks an expression once and keeps the result (the
program or the compile error) in a bounded LRU cache keyed by the expression text.
:meth:`SelectorProgram.evaluate` runs it against a ``device`` activation from
:func:`sharegpu.cel.device.device_activation`. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .compiler import DEVICE, Eval, Reference, compile_tree, parse
from .errors import CelCompileError, CelEvalError
from .values import type_name

#: Kubernetes rejects selector expressions longer than this many bytes.
MAX_EXPRESSION_BYTES = 10 * 1024
#: The compile error of an expression nested deeper than the parser here can follow.
NESTED_TOO_DEEPLY = "expression is nested too deeply"
#: How many compiled expressions the cache keeps.
CACHE_SIZE = 4096

_VARIABLES = {"device": DEVICE}


class SelectorProgram:
    """A compiled selector. ``evaluate`` returns a bool or raises :class:`CelEvalError`.

    ``references`` lists the attributes and capacities the expression names with constant
    keys (for checks such as "this driver publishes no attribute X").
    """

    __slots__ = ("_fn", "expression", "references")

    def __init__(self, expression: str, fn: Eval, references: tuple[Reference, ...] = ()) -> None:
        self.expression = expression
        self._fn = fn
        self.references = references

    def evaluate(self, device: Mapping[str, Any]) -> bool:
        """Evaluate with ``device`` bound to the given activation."""
        result = self._fn({"device": device})
        if not isinstance(result, bool):
            raise CelEvalError(f"expression must evaluate to bool, got {type_name(result)}")
        return result

    def __repr__(self) -> str:
        return f"SelectorProgram({self.expression!r})"


@dataclass(frozen=True)
class CacheInfo:
    """Counters of the compile cache."""

    hits: int
    misses: int
    size: int


class _Cache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, SelectorProgram | CelCompileError] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, expression: str) -> SelectorProgram | CelCompileError | None:
        with self.lock:
            entry = self.entries.get(expression)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self.entries.move_to_end(expression)
            return entry

    def put(self, expression: str, entry: SelectorProgram | CelCompileError) -> None:
        with self.lock:
            self.entries[expression] = entry
            self.entries.move_to_end(expression)
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)


_cache = _Cache(CACHE_SIZE)


def _compile(expression: str) -> SelectorProgram:
    if len(expression.encode()) > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            expression[:80] + "...", f"expression longer than {MAX_EXPRESSION_BYTES} bytes"
        )
    try:
        root, references = compile_tree(expression, parse(expression), _VARIABLES)
    except RecursionError:
        # Kubernetes' parser stops at a fixed nesting depth too: a compile error, not a crash.
        raise CelCompileError(expression[:80] + "...", NESTED_TOO_DEEPLY) from None
    if root.type not in ("bool", "dyn"):
        raise CelCompileError(
            expression, f"must evaluate to bool, but evaluates to {root.type}", 1, 1
        )
    return SelectorProgram(expression, root.fn, tuple(references))


def compile_selector(expression: str) -> SelectorProgram:
    """The compiled program for ``expression`` (cached); :class:`CelCompileError` if invalid."""
    entry = _cache.get(expression)
    if entry is None:
        try:
            entry = _compile(expression)
        except CelCompileError as exc:
            entry = exc
        _cache.put(expression, entry)
    if isinstance(entry, CelCompileError):
        # The cached instance is raised again each time; drop the previous traceback so it
        # does not grow with every raise.
        raise entry.with_traceback(None)
    return entry


def compile_error(expression: str) -> CelCompileError | None:
    """The compile error of ``expression``, or ``None`` when it compiles."""
    try:
        compile_selector(expression)
    except CelCompileError as exc:
        return exc
    return None


def cache_info() -> CacheInfo:
    """Hits, misses and size of the compile cache."""
    with _cache.lock:
        return CacheInfo(_cache.hits, _cache.misses, len(_cache.entries))


def clear_cache() -> None:
    """Drop every cached program and reset the counters."""
    with _cache.lock:
        _cache.entries.clear()
        _cache.hits = _cache.misses = 0
