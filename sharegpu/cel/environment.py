"""Compile-once, evaluate-many DRA selectors.

:func:`compile_selector` parses and checks an expression once and keeps the result (the
program or the compile error) in a least-recently-used cache keyed by the expression text,
bounded both by its number of entries (:data:`CACHE_SIZE`) and by the total UTF-8 length of the
expressions it holds (:data:`CACHE_BYTES`): the memory of a compiled selector grows with its
text, so the bound on bytes is what bounds the memory, whoever chooses the expressions.
Expressions longer than Kubernetes' limit are refused before parsing and never cached.
:meth:`SelectorProgram.evaluate` runs a program against a ``device`` activation from
:func:`sharegpu.cel.device.device_activation`. Thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .cache import WeightedLru
from .compiler import DEVICE, Eval, Reference, compile_tree, parse
from .errors import CelCompileError, CelEvalError
from .values import type_name

#: Kubernetes rejects selector expressions longer than this many bytes.
MAX_EXPRESSION_BYTES = 10 * 1024
#: The compile error of an expression nested deeper than the parser here can follow.
NESTED_TOO_DEEPLY = "expression is nested too deeply"
#: How many compiled expressions the cache keeps at most.
CACHE_SIZE = 4096
#: Total UTF-8 bytes of the expressions the cache keeps at most. A compiled program holds up to
#: about 256 bytes of memory per byte of its text, so the cache stays below about 64 MiB; the
#: selectors of a cluster are usually a few hundred bytes each, so thousands of them fit.
CACHE_BYTES = 256 * 1024

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
    """Counters of the compile cache: lookups that hit and missed, entries held, and the total
    UTF-8 length of their expressions (at most :data:`CACHE_BYTES`)."""

    hits: int
    misses: int
    size: int
    expression_bytes: int = 0


_cache: WeightedLru[SelectorProgram | CelCompileError] = WeightedLru(CACHE_SIZE, CACHE_BYTES)


def _bare(exc: CelCompileError) -> CelCompileError:
    """``exc`` without traceback, cause or context: what a cache may keep. A traceback holds
    the frames of the parse (megabytes for a long expression) and of the caller."""
    exc.__traceback__ = None
    exc.__cause__ = None
    exc.__context__ = None
    return exc


def expression_bytes(expression: str) -> int:
    """The length of ``expression`` in UTF-8 bytes, as Kubernetes measures it (a lone
    surrogate, which JSON can carry, counts as the three bytes it would take)."""
    return len(expression.encode("utf-8", "surrogatepass"))


def _compile(expression: str) -> SelectorProgram:
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
    """The compiled program for ``expression`` (cached); :class:`CelCompileError` if invalid.

    Each compile error raised is a fresh instance, so no traceback of one caller stays attached
    to the cached error.
    """
    size = expression_bytes(expression)
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            expression[:80] + "...", f"expression longer than {MAX_EXPRESSION_BYTES} bytes"
        )
    entry = _cache.get(expression)
    if entry is None:
        try:
            entry = _compile(expression)
        except CelCompileError as exc:
            entry = _bare(exc)
        _cache.put(expression, entry, size)
    if isinstance(entry, CelCompileError):
        raise CelCompileError(entry.expression, entry.message, entry.line, entry.column)
    return entry


def compile_error(expression: str) -> CelCompileError | None:
    """The compile error of ``expression``, or ``None`` when it compiles."""
    try:
        compile_selector(expression)
    except CelCompileError as exc:
        return exc
    return None


def cache_info() -> CacheInfo:
    """Hits, misses, size and expression bytes of the compile cache."""
    stats = _cache.stats()
    return CacheInfo(stats.hits, stats.misses, stats.size, stats.weight)


def clear_cache() -> None:
    """Drop every cached program and reset the counters."""
    _cache.clear()
