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
from .compiler import DEVICE, Eval, Features, Reference, compile_tree
from .cost import RUNTIME_COST_LIMIT, SELECTOR_MAX_COST, TOO_COMPLEX, CostBudget
from .errors import CelCompileError, CelCostError, CelEvalError
from .parser import parse
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


@dataclass(frozen=True)
class CompileOptions:
    """Which of Kubernetes' environments compiles the selector.

    ``stored`` is Kubernetes' StoredExpressions environment (the scheduler, and the API server
    for an expression that did not change): every feature of the version. Otherwise the
    NewExpressions environment applies, where ``includes()`` needs the DRAListTypeAttributes
    gate (``list_type_attributes``) and ``device.allowMultipleAllocations`` the
    DRAConsumableCapacity gate (``consumable_capacity``). ``cost_limit`` is the runtime limit
    of one evaluation.
    """

    stored: bool = True
    list_type_attributes: bool = False
    consumable_capacity: bool = True
    cost_limit: int = RUNTIME_COST_LIMIT

    @property
    def features(self) -> Features:
        """The compiler features these options enable."""
        return Features(
            includes=self.stored or self.list_type_attributes,
            allow_multiple_allocations=self.stored or self.consumable_capacity,
        )

    def key(self, expression: str) -> str:
        """The cache key of ``expression`` compiled with these options (the expression itself
        for the default options)."""
        if self == CompileOptions():
            return expression
        flags = f"{int(self.stored)}{int(self.list_type_attributes)}{int(self.consumable_capacity)}"
        return f"{flags}:{self.cost_limit}:{expression}"


#: The scheduler's environment: StoredExpressions, the default runtime limit.
STORED = CompileOptions()


class SelectorProgram:
    """A compiled selector. ``evaluate`` returns a bool or raises :class:`CelEvalError`.

    ``references`` lists the attributes and capacities the expression names with constant
    keys (for checks such as "this driver publishes no attribute X").
    """

    __slots__ = ("_fn", "cost_limit", "expression", "max_cost", "references")

    def __init__(
        self,
        expression: str,
        fn: Eval,
        references: tuple[Reference, ...] = (),
        max_cost: int = 0,
        cost_limit: int | None = None,
    ) -> None:
        self.expression = expression
        self._fn = fn
        self.references = references
        #: The estimated worst-case cost (Kubernetes' ``CompilationResult.MaxCost``).
        self.max_cost = max_cost
        #: The runtime limit charged while evaluating, or None when the estimate is within it
        #: (the actual cost of an evaluation never exceeds the estimate).
        self.cost_limit = cost_limit

    def evaluate(self, device: Mapping[str, Any]) -> bool:
        """Evaluate with ``device`` bound to the given activation."""
        if self.cost_limit is None:
            result = self._fn({"device": device})
        else:
            result = self._fn({"device": device, "@budget": CostBudget(self.cost_limit)})
        if not isinstance(result, bool):
            name = type_name(result)
            raise CelEvalError(
                f"CEL result of type {name} could not be converted to bool: "
                f"expression must evaluate to bool, got {name}"
            )
        return result

    def check_cost(self) -> None:
        """:class:`CelCostError` when the estimate is above Kubernetes' selector limit: the API
        server refuses such a selector when it is created or changed."""
        if self.max_cost > SELECTOR_MAX_COST:
            raise CelCostError(
                self.expression,
                f"{TOO_COMPLEX} (estimated cost {self.max_cost}, limit {SELECTOR_MAX_COST})",
            )

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


def _compile(expression: str, options: CompileOptions) -> SelectorProgram:
    try:
        tree = parse(expression)
        features = options.features
        root, references = compile_tree(expression, tree, _VARIABLES, features)
        max_cost = root.cost[1]
        limit = None
        if max_cost > options.cost_limit:
            budgeted = Features(features.includes, features.allow_multiple_allocations, True)
            root, references = compile_tree(expression, tree, _VARIABLES, budgeted)
            limit = options.cost_limit
    except RecursionError:
        raise _too_deep(expression) from None
    if root.type not in ("bool", "dyn"):
        shown = {"Quantity": "kubernetes.Quantity", "Semver": "kubernetes.Semver"}
        raise CelCompileError(
            expression,
            f"must evaluate to bool or the unknown type, not {shown.get(root.type, root.type)}",
            1,
            1,
        )
    return SelectorProgram(expression, root.fn, tuple(references), max_cost, limit)


def _too_deep(expression: str) -> CelCompileError:
    # Kubernetes' parser stops at a fixed nesting depth too: a compile error, not a crash.
    return CelCompileError(expression[:80] + "...", NESTED_TOO_DEEPLY)


def compile_expression(expression: str, variables: Mapping[str, str] | None = None) -> Eval:
    """``expression`` compiled whatever its result type, for tools and conformance tables.

    The environment is the selector's (``device`` and every function), plus ``variables``
    (name -> static type: ``int``, ``string``, ``list``, ..., or ``dyn``), which the returned
    function finds by name in the mapping it is called with. Not cached, no cost limit.
    Raises :class:`CelCompileError`.
    """
    try:
        tree = parse(expression)
        root, _ = compile_tree(expression, tree, {**_VARIABLES, **(variables or {})})
    except RecursionError:
        raise _too_deep(expression) from None
    return root.fn


def compile_selector(expression: str, options: CompileOptions = STORED) -> SelectorProgram:
    """The compiled program for ``expression`` (cached); :class:`CelCompileError` if invalid.

    Each compile error raised is a fresh instance, so no traceback of one caller stays attached
    to the cached error.
    """
    size = expression_bytes(expression)
    if size > MAX_EXPRESSION_BYTES:
        raise CelCompileError(
            expression[:80] + "...", f"expression longer than {MAX_EXPRESSION_BYTES} bytes"
        )
    key = options.key(expression)
    entry = _cache.get(key)
    if entry is None:
        try:
            entry = _compile(expression, options)
        except CelCompileError as exc:
            entry = _bare(exc)
        _cache.put(key, entry, size)
    if isinstance(entry, CelCompileError):
        raise CelCompileError(entry.expression, entry.message, entry.line, entry.column)
    return entry


def compile_error(expression: str, options: CompileOptions = STORED) -> CelCompileError | None:
    """The compile error of ``expression``, or ``None`` when it compiles."""
    try:
        compile_selector(expression, options)
    except CelCompileError as exc:
        return exc
    return None


def validate_selector(
    expression: str, options: CompileOptions = CompileOptions(stored=False)
) -> SelectorProgram:
    """What the API server checks of a new or changed selector: it compiles in the
    NewExpressions environment (by default) and its estimated cost is within the limit.
    Raises :class:`CelCompileError` (:class:`CelCostError` for the cost)."""
    program = compile_selector(expression, options)
    program.check_cost()
    return program


def is_compiled(expression: str, options: CompileOptions = STORED) -> bool:
    """Whether ``expression`` is in the compile cache (its program or its compile error), so
    :func:`compile_selector` answers it without compiling."""
    return options.key(expression) in _cache


def cache_info() -> CacheInfo:
    """Hits, misses, size and expression bytes of the compile cache."""
    stats = _cache.stats()
    return CacheInfo(stats.hits, stats.misses, stats.size, stats.weight)


def clear_cache() -> None:
    """Drop every cached program and reset the counters."""
    _cache.clear()
