"""Compile a CEL expression into a tree of Python closures.

cel-python parses the expression (its Lark grammar gives positions for errors); this module
turns the parse tree into nested closures once, so that evaluating a selector against a
device is a handful of Python calls instead of a tree walk per evaluation. Alongside, it
infers a coarse static type per node and rejects what Kubernetes' type checker rejects
cheaply: undeclared variables, unknown fields of ``device``, unknown functions, wrong
argument counts (reported as cel-go does: ``found no matching overload for ...``), invalid
constant arguments (``library.constant_call_error``), operands of clearly mismatched types and a
non-bool result. An identifier (or dotted name) that no variable declares and that names a type
(``int``, ``google.protobuf.Timestamp``, ``optional_type``) is that type value.

Runtime errors are raised as :class:`CelEvalError`; ``||``, ``&&`` and the ``all``/``exists``
macros absorb them where the CEL specification says so (``true || error`` is ``true``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, cast

import lark

from . import cost as C
from . import optional as opt
from .celtypes import TYPE_IDENTIFIERS, CelType
from .device import finds
from .errors import CelCompileError, CelEvalError
from .library import GLOBAL_FUNCTIONS, METHODS, constant_call_error
from .parser import bytes_literal, field_name, string_literal
from .re2regex import check_pattern
from .strformat import check_format
from .values import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    CelMap,
    UInt,
    cel_add,
    cel_div,
    cel_eq,
    cel_eq_op,
    cel_in,
    cel_index,
    cel_mod,
    cel_mul,
    cel_neg,
    cel_not,
    cel_order,
    cel_select,
    cel_sub,
    key_identity,
    no_overload,
    type_name,
)

Env = Mapping[str, Any]
Eval = Callable[[Env], Any]

#: Static types. ``dyn`` is unknown; the ``device*`` ones describe the ``device`` variable.
DYN = "dyn"
DEVICE = "device"
ATTRIBUTES = "attributes"
CAPACITY = "capacity"
ATTRIBUTE_DOMAIN = "attribute-domain"
CAPACITY_DOMAIN = "capacity-domain"

#: Fields of the ``device`` variable and their static types.
DEVICE_FIELDS = {
    "driver": "string",
    "attributes": ATTRIBUTES,
    "capacity": CAPACITY,
    "allowMultipleAllocations": "bool",
}

_ORDERED = frozenset({"int", "uint", "double", "string", "bytes", "bool"})
_NUMERIC = frozenset({"int", "uint", "double"})
#: Words cel-go's lexer reads as tokens of their own, never as a field name.
_KEYWORDS = frozenset({"in", "null", "true", "false"})
_MACROS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})
#: Two-variable comprehensions (cel-go's ext.TwoVarComprehensions, Kubernetes 1.32+).
_TWO_VAR = frozenset({"transformList", "transformMap", "transformMapEntry"})
#: Kubernetes' names for CEL value types in iteration errors (``got 'types.Int', ...``).
_GO_TYPES = {
    "int": "types.Int",
    "uint": "types.Uint",
    "double": "types.Double",
    "bool": "types.Bool",
    "string": "types.String",
    "bytes": "types.Bytes",
    "null_type": "types.Null",
    "Quantity": "cel.Quantity",
    "Semver": "cel.Semver",
}

TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"
NET_IP = "net.IP"
NET_CIDR = "net.CIDR"
URL = "kubernetes.URL"
_TIME_TYPES = frozenset({TIMESTAMP, DURATION})
#: Kubernetes' bound on a named format's regex length (apiserver pkg/cel/limits.go).
MAX_NAME_FORMAT_REGEX_SIZE = 128
#: The operand types of each arithmetic operator's overloads (times and durations apart).
_ARITHMETIC = {
    "_+_": frozenset({"int", "uint", "double", "string", "bytes", "list"}),
    "_-_": frozenset({"int", "uint", "double"}),
    "_*_": frozenset({"int", "uint", "double"}),
    "_/_": frozenset({"int", "uint", "double"}),
    "_%_": frozenset({"int", "uint"}),
}

_GLOBAL_RESULT = {
    "timestamp": TIMESTAMP,
    "duration": DURATION,
    "ip": NET_IP,
    "cidr": NET_CIDR,
    "url": URL,
    "isIP": "bool",
    "isCIDR": "bool",
    "isURL": "bool",
    "ip.isCanonical": "bool",
    "sets.contains": "bool",
    "sets.equivalent": "bool",
    "sets.intersects": "bool",
    "lists.range": "list",
    "strings.quote": "string",
    "size": "int",
    "int": "int",
    "uint": "uint",
    "double": "double",
    "string": "string",
    "bool": "bool",
    "bytes": "bytes",
    "matches": "bool",
    "quantity": "Quantity",
    "isQuantity": "bool",
    "sign": "int",
    "semver": "Semver",
    "isSemver": "bool",
}
#: The type conversions cel-go's planner folds when their argument is a constant
#: (``overloads.IsTypeConversionFunction``; ``dyn`` and ``type`` never fail, so need no fold).
_CONVERSIONS = frozenset(
    {"bool", "bytes", "double", "duration", "int", "string", "timestamp", "uint"}
)
#: The functions whose second argument (receiver first) cel-go's planner precompiles as a
#: regular expression when it is a constant.
_REGEX_FUNCTIONS = frozenset({"matches", "find", "findAll"})
#: The sets extension's functions, each of two lists of one element type.
_SET_FUNCTIONS = frozenset({"sets.contains", "sets.equivalent", "sets.intersects"})
#: Argument types of global functions with one overload per position (a known static type
#: outside the set is cel-go's "found no matching overload" at compile time).
_GLOBAL_ARGS: dict[str, tuple[frozenset[str], ...]] = {
    **dict.fromkeys(
        ("ip", "isIP", "cidr", "isCIDR", "url", "isURL", "ip.isCanonical", "quantity"),
        (frozenset({"string"}),),
    ),
    "isQuantity": (frozenset({"string"}),),
    "size": (frozenset({"string", "bytes", "list", "map"}),),
    "lists.range": (frozenset({"int"}),),
    "matches": (frozenset({"string"}), frozenset({"string"})),
    **dict.fromkeys(_SET_FUNCTIONS, (frozenset({"list"}), frozenset({"list"}))),
    "sign": (frozenset({"Quantity"}),),
    "format.named": (frozenset({"string"}),),
    "strings.quote": (frozenset({"string"}),),
    "semver": (frozenset({"string"}), frozenset({"bool"})),
    "isSemver": (frozenset({"string"}), frozenset({"bool"})),
    "timestamp": (frozenset({"string", "int", TIMESTAMP}),),
    "duration": (frozenset({"string", DURATION}),),
    # The type conversions' overloads (cel-go's standard library; ``string`` also takes
    # Kubernetes' IP and CIDR): ``int([])`` or ``string(quantity('1'))`` is a compile error.
    # ``null`` passes the checker only where an object type is declared (``int`` and
    # ``string`` take a timestamp, a duration, ...), and then fails at evaluation, or at the
    # planner's fold of a null literal; ``uint``, ``double``, ``bool`` and ``bytes`` refuse it.
    "int": (frozenset({"int", "uint", "double", "string", "null", TIMESTAMP, DURATION}),),
    "uint": (frozenset({"int", "uint", "double", "string"}),),
    "double": (frozenset({"int", "uint", "double", "string"}),),
    "bool": (frozenset({"bool", "string"}),),
    "bytes": (frozenset({"bytes", "string"}),),
    "string": (
        frozenset(
            {"string", "bool", "bytes", "int", "uint", "double", "null"}
            | {TIMESTAMP, DURATION, NET_IP, NET_CIDR}
        ),
    ),
}
_METHOD_RESULT = {
    **dict.fromkeys(
        (
            "getFullYear",
            "getMonth",
            "getDate",
            "getDayOfMonth",
            "getDayOfWeek",
            "getDayOfYear",
            "getHours",
            "getMinutes",
            "getSeconds",
            "getMilliseconds",
            "family",
            "prefixLength",
        ),
        "int",
    ),
    **dict.fromkeys(
        (
            "isUnspecified",
            "isLoopback",
            "isLinkLocalMulticast",
            "isLinkLocalUnicast",
            "isGlobalUnicast",
            "containsIP",
            "containsCIDR",
        ),
        "bool",
    ),
    **dict.fromkeys(("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"), "string"),
    "getQuery": "map",
    "masked": NET_CIDR,
    "size": "int",
    "contains": "bool",
    "startsWith": "bool",
    "endsWith": "bool",
    "matches": "bool",
    "charAt": "string",
    "indexOf": "int",
    "lastIndexOf": "int",
    "lowerAscii": "string",
    "upperAscii": "string",
    "replace": "string",
    "split": "list",
    "substring": "string",
    "trim": "string",
    "join": "string",
    "format": "string",
    "find": "string",
    "findAll": "list",
    "isSorted": "bool",
    # The lists extension's list-valued methods (``s.reverse()`` on a dyn ``s`` resolves to
    # the list overload, as strings version 2 has no ``reverse``).
    **dict.fromkeys(("reverse", "distinct", "flatten", "slice", "sort"), "list"),
    "isInteger": "bool",
    "asInteger": "int",
    "asApproximateFloat": "double",
    "add": "Quantity",
    "sub": "Quantity",
    "major": "int",
    "minor": "int",
    "patch": "int",
    "compareTo": "int",
    "isGreaterThan": "bool",
    "isLessThan": "bool",
}
#: Receiver types a method accepts (absent: any). A known mismatch is a compile error.
_METHOD_RECEIVERS: dict[str, AbstractSet[str]] = {
    **dict.fromkeys(
        ("getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear"),
        frozenset({TIMESTAMP}),
    ),
    **dict.fromkeys(("getHours", "getMinutes", "getSeconds", "getMilliseconds"), _TIME_TYPES),
    **dict.fromkeys(
        (
            "family",
            "isUnspecified",
            "isLoopback",
            "isLinkLocalMulticast",
            "isLinkLocalUnicast",
            "isGlobalUnicast",
        ),
        frozenset({NET_IP}),
    ),
    **dict.fromkeys(
        ("containsIP", "containsCIDR", "masked", "prefixLength"), frozenset({NET_CIDR})
    ),
    **dict.fromkeys(
        ("getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery"),
        frozenset({URL}),
    ),
    "isInteger": {"Quantity"},
    "asInteger": {"Quantity"},
    "asApproximateFloat": {"Quantity"},
    "add": {"Quantity"},
    "sub": {"Quantity"},
    "major": {"Semver"},
    "minor": {"Semver"},
    "patch": {"Semver"},
    "compareTo": {"Quantity", "Semver"},
    "isGreaterThan": {"Quantity", "Semver"},
    "isLessThan": {"Quantity", "Semver"},
    **dict.fromkeys(
        (
            "startsWith",
            "endsWith",
            "contains",
            "lowerAscii",
            "upperAscii",
            "charAt",
            "replace",
            "split",
            "substring",
            "trim",
            "format",
            "matches",
            "find",
            "findAll",
        ),
        frozenset({"string"}),
    ),
    **dict.fromkeys(("indexOf", "lastIndexOf"), frozenset({"string", "list"})),
    **dict.fromkeys(
        ("join", "isSorted", "sum", "min", "max", "slice", "flatten", "distinct", "reverse"),
        frozenset({"list"}),
    ),
    "sort": {"list"},
    "size": frozenset({"string", "bytes", "list", "map"}),
}


@dataclass(frozen=True)
class Reference:
    """An attribute or capacity that an expression names with constant keys.

    ``kind`` is ``attribute`` or ``capacity``; ``guard`` is true for a presence test
    (``'x' in device.attributes[d]``, ``has(...)``), false for a read, which errors on a
    device without it. ``line``/``column`` locate the name in the expression.
    """

    kind: str
    domain: str
    name: str
    guard: bool
    line: int | None
    column: int | None


class Node:
    """A compiled sub-expression: its evaluator, its static type, and, when known at compile
    time, its constant value or the (kind, domain) of an attribute/capacity domain map.

    ``cost`` is the estimated (min, max) cost of evaluating it (:mod:`sharegpu.cel.cost`),
    ``size`` the size estimate of its value (None: unknown), ``path`` where in ``device`` the
    value comes from, ``items`` the size estimate of the elements of a list or map literal,
    ``elements`` the full CEL types of a list literal's elements and ``full`` the full CEL
    type of a list or map literal (``list(int)``, ``map(string, dyn)``; None for anything
    else, see :func:`_full_type`). ``planned`` holds, as a 1-tuple, the value cel-go's planner
    knows as a constant where ``const`` does not say it (``dyn('x')``: a constant to the
    planner, not to the literal checks); None otherwise.
    """

    __slots__ = (
        "const",
        "cost",
        "domain",
        "elements",
        "fn",
        "full",
        "items",
        "path",
        "planned",
        "size",
        "type",
    )

    def __init__(
        self,
        fn: Eval,
        type_: str,
        const: Any = None,
        domain: tuple[str, str] | None = None,
        *,
        cost: C.Est = C.ONE,
        size: C.Est | None = None,
        path: tuple[str, ...] | None = None,
        items: C.Est | None = None,
        elements: tuple[str, ...] | None = None,
        full: str | None = None,
    ) -> None:
        self.fn = fn
        self.elements = elements
        self.full = full
        self.type = type_
        self.const = const
        self.domain = domain
        self.cost = cost
        self.path = path
        self.items = items
        self.planned: tuple[Any] | None = None
        if size is None:
            size = C.path_size(path)
        if size is None and type_ in ("int", "uint", "double", "bool"):
            size = C.ONE
        self.size = size


@dataclass(frozen=True)
class Features:
    """What the environment offers beyond the Kubernetes 1.34 base: ``includes`` (the
    DRAListTypeAttributes gate, or a stored expression) and ``device.allowMultipleAllocations``
    (DRAConsumableCapacity, or a stored expression). ``budget``: charge a runtime cost."""

    includes: bool = True
    allow_multiple_allocations: bool = True
    budget: bool = False


@dataclass
class _Local:
    type: str
    path: tuple[str, ...] | None
    size: C.Est | None
    full: str | None = None


def compile_tree(
    expression: str,
    tree: lark.Tree[Any],
    variables: Mapping[str, str],
    features: Features = Features(),
) -> tuple[Node, list[Reference]]:
    """Compile a parse tree; ``variables`` maps the declared variable names to static types.

    Returns the root node (with its cost estimate) and the attributes and capacities the
    expression names.
    """
    compiler = _Compiler(expression, dict(variables), features)
    root = compiler.node(tree)
    return root, compiler.references


def _logical_type_check(c: _Compiler, op: str, tree: lark.Tree[Any], *nodes: Node) -> None:
    for n in nodes:
        if n.type not in ("bool", DYN):
            c.fail(tree, f"found no matching overload for '{op}' applied to '{n.type}'")


def _size(n: Node) -> C.Est:
    return n.size if n.size is not None else C.UNKNOWN


def _charged(fn: Eval, amount: int) -> Eval:
    def charged(env: Env) -> Any:
        env["@budget"].charge(amount)
        return fn(env)

    return charged


class _Compiler:
    def __init__(self, expression: str, scope: dict[str, str], features: Features) -> None:
        self.expression = expression
        self.scope = scope
        self.features = features
        self.locals: dict[str, list[_Local]] = {}
        self.references: list[Reference] = []
        #: How many ``format`` calls enclose the node being compiled: their literals are
        #: exempt from the homogeneous literal check, as in cel-go.
        self.in_format = 0

    def refer(self, domain_node: Node, name: str, guard: bool, where: Any) -> None:
        """Record a constant-key reference into an attribute or capacity domain."""
        if domain_node.domain is None:
            return
        kind, domain = domain_node.domain
        line = getattr(where, "line", None)
        column = getattr(where, "column", None)
        if isinstance(where, lark.Tree):
            line = getattr(where.meta, "line", None)
            column = getattr(where.meta, "column", None)
        self.references.append(Reference(kind, domain, name, guard, line, column))

    # --- helpers ---------------------------------------------------------------------

    def fail(self, where: lark.Tree[Any] | lark.Token, message: str) -> CelCompileError:
        if isinstance(where, lark.Token):
            line, column = where.line, where.column
        else:
            meta = where.meta
            line = getattr(meta, "line", None)
            column = getattr(meta, "column", None)
        raise CelCompileError(self.expression, message, line, column)

    def node(self, tree: lark.Tree[Any]) -> Node:
        handler: Callable[[lark.Tree[Any]], Node] | None = getattr(self, "_" + str(tree.data), None)
        if handler is None:
            raise self.fail(tree, f"unsupported syntax: {tree.data}")
        return handler(tree)

    def made(self, fn: Eval, type_: str, own: int = 1, **kwargs: Any) -> Node:
        """A new node whose evaluation charges ``own`` to the runtime budget (when one runs)."""
        if self.features.budget and own:
            fn = _charged(fn, own)
        return Node(fn, type_, **kwargs)

    def check_constant_call(self, token: lark.Token, name: str, args: list[Node]) -> None:
        """The compile error Kubernetes reports for a call given its constant arguments
        (receiver first), such as an invalid constant regex or ``duration('1d')``."""
        message = constant_call_error(name, tuple(a.const for a in args))
        if message is not None:
            self.fail(token, message)

    def check_planned_regex(self, token: lark.Token, name: str, args: list[Node]) -> None:
        """cel-go's planner precompiles the pattern of ``matches``, ``find`` and ``findAll``
        (receiver first in ``args``) when it knows it as a constant, including one the
        checker's literal validator does not see (``dyn('[')``): an invalid pattern fails
        the program's planning, a compile error."""
        if name not in _REGEX_FUNCTIONS or len(args) < 2 or isinstance(args[1].const, str):
            return
        planned = _planned(args[1])
        if planned is not None and isinstance(planned[0], str):
            reason = check_pattern(planned[0])
            if reason is not None:
                self.fail(token, f"program instantiation failed: error parsing regexp: {reason}")

    def check_homogeneous(self, typed: list[tuple[Node, Any]]) -> None:
        """cel-go's homogeneous aggregate literal check (Kubernetes' base environment): the
        elements of a list literal, or the keys or values of a map literal, have one type
        (``dyn`` is a type of its own: an attribute value and a string differ).
        Only two statically known types that differ are refused: where this compiler only
        lacks a type cel-go infers (``dyn`` here, not in cel-go), the literal is accepted
        (never a false error)."""
        if self.in_format or not typed:
            return
        self.check_homogeneous_types([(_known_full_type(n), where) for n, where in typed])

    def check_homogeneous_types(self, typed: list[tuple[str | None, Any]]) -> None:
        """:meth:`check_homogeneous` for elements whose full types (None: not known as
        cel-go knows it) are already worked out."""
        if self.in_format or not typed or typed[0][0] is None:
            return
        first = typed[0][0]
        for type_, where in typed[1:]:
            if type_ is None:
                continue
            if _free_parameters(first) and type_.startswith(first + "("):
                first = type_  # ``optional.none()`` then ``optional.of(1)``: optional_type(int)
            elif type_ != first and not (_free_parameters(type_) and first.startswith(type_)):
                self.fail(where, f"expected type '{first}' but found '{type_}'")

    def optional_element(self, node: Node, where: Any) -> str | None:
        """The element type ``?node`` contributes to a list literal: ``T`` of its
        ``optional_type(T)``; a known type that is no optional is a compile error."""
        if node.type == "null":
            self.fail(where, "expected type 'optional_type(null)' but found 'null'")
        if node.type not in ("optional", DYN):
            shown = _known_full_type(node)
            if shown is not None:
                self.fail(where, f"expected type 'optional_type({shown})' but found '{shown}'")
            return None
        return _optional_inner(_known_full_type(node))

    def type_identifier(self, tree: lark.Tree[Any]) -> CelType | None:
        """The type value that ``tree`` names (``int``, ``google.protobuf.Timestamp``), or None:
        a (dotted) identifier whose first name is not a variable and names a type."""
        dotted = _dotted_name(tree)
        if dotted is None or dotted.split(".", 1)[0] in self.scope:
            return None
        if dotted == opt.OPTIONAL_TYPE.name:
            return opt.OPTIONAL_TYPE
        if dotted == DYN:  # ``dyn`` is a type only in declarations, as in cel-go
            return None
        return TYPE_IDENTIFIERS.get(dotted)

    def type_node(self, value: CelType) -> Node:
        """A type identifier: a constant of static type ``type``."""
        return self.made(lambda env: value, "type", const=value, cost=C.ONE)

    def exprlist(self, tree: lark.Tree[Any] | None) -> list[Node]:
        if tree is None:
            return []
        return [self.node(child) for child in tree.children]

    # --- precedence levels -------------------------------------------------------------

    def _expr(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        cond, then, other = (self.node(c) for c in tree.children)
        _logical_type_check(self, "_?_:_", tree, cond)
        cf, tf, of = cond.fn, then.fn, other.fn

        def ternary(env: Env) -> Any:
            c = cf(env)
            if c is True:
                return tf(env)
            if c is False:
                return of(env)
            raise no_overload("_?_:_", c)

        same = then.type if then.type == other.type else DYN
        # cel-go's (bool, A, A) -> A: a dyn branch makes A dyn; two known types must agree.
        fulls = (_known_full_type(then), _known_full_type(other))
        full = None
        if DYN in fulls:
            same, full = DYN, DYN
        elif fulls[0] is not None and fulls[1] is not None:
            if fulls[0] == fulls[1]:
                full = fulls[0]
            elif not _unifiable(fulls[0], fulls[1]):
                self.fail(
                    tree,
                    "found no matching overload for '_?_:_' applied to "
                    f"'(bool, {fulls[0]}, {fulls[1]})'",
                )
        return self.made(
            ternary,
            same,
            own=0,
            cost=C.add(cond.cost, C.union(then.cost, other.cost)),
            size=C.union(_size(then), _size(other)),
            full=full,
        )

    def _logic(self, tree: lark.Tree[Any], short: bool, op: str) -> Node:
        left, right = self.node(tree.children[0]), self.node(tree.children[1])
        _logical_type_check(self, op, tree, left, right)
        cost = (left.cost[0], C.add(left.cost, right.cost)[1])
        return self.made(_logical(left.fn, right.fn, short, op), "bool", own=0, cost=cost)

    def _conditionalor(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        return self._logic(tree, True, "_||_")

    def _conditionaland(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        return self._logic(tree, False, "_&&_")

    def _binary(self, tree: lark.Tree[Any]) -> tuple[str, Node, Node]:
        op_tree, right_tree = tree.children
        op = str(op_tree.data)
        left = self.node(op_tree.children[0])
        right = self.node(right_tree)
        return op, left, right

    def _relation(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        op, left, right = self._binary(tree)
        lf, rf = left.fn, right.fn
        lt, rt = _checked(left.type), _checked(right.type)
        known = lt != DYN and rt != DYN
        symbol = {
            "relation_lt": "_<_",
            "relation_le": "_<=_",
            "relation_gt": "_>_",
            "relation_ge": "_>=_",
            "relation_eq": "_==_",
            "relation_ne": "_!=_",
            "relation_in": "@in",
        }[op]
        args = C.add(left.cost, right.cost)
        mismatch = f"found no matching overload for '{symbol}' applied to '({lt}, {rt})'"
        if op in ("relation_eq", "relation_ne"):
            # ``_==_`` is one overload (A, A): two known types must be one, numbers of
            # different kinds included; null unifies only with object and optional types.
            if known and lt != rt and not _null_unifies(lt, rt):
                self.fail(tree, mismatch)
            fulls = (_known_full_type(left), _known_full_type(right))
            if (
                fulls[0] is not None
                and fulls[1] is not None
                and "(" in fulls[0] + fulls[1]
                and not _unifiable(fulls[0], fulls[1])
            ):
                # Lists and maps unify by their type parameters: list(int) is no list(double).
                self.fail(
                    tree,
                    f"found no matching overload for '{symbol}' applied to "
                    f"'({fulls[0]}, {fulls[1]})'",
                )
            cost = C.add(_compare_cost(left, right), args)
            if op == "relation_eq":
                return self.made(lambda env: cel_eq_op(lf(env), rf(env)), "bool", cost=cost)
            return self.made(lambda env: not cel_eq(lf(env), rf(env)), "bool", cost=cost)
        if op == "relation_in":
            if rt not in (DYN, "list", "map"):
                self.fail(tree, mismatch)
            if isinstance(left.const, str):
                self.refer(right, left.const, True, tree)
            own = C.ONE if rt == "map" else C.factor(_size(right), 1)
            if rt == DYN:
                own = C.union(C.ONE, own)
            left_full = _known_full_type(left)
            right_key = _known_key_type(right)
            if (
                left_full not in (None, DYN)
                and right_key is not None
                and not _unifiable(left_full, right_key)
            ):
                self.fail(tree, mismatch)
            if right.elements == ():
                # cel-go's planner (Kubernetes evaluates with OptOptimize) replaces membership
                # in a constant empty list by false: the left operand is never evaluated, so
                # its error is not the answer. The cost estimate is the checker's, unchanged.
                return self.made(lambda env: False, "bool", cost=C.add(own, args))
            members = _membership_set(right)
            if members is not None:
                return self.made(
                    lambda env: key_identity(lf(env)) in members, "bool", cost=C.add(own, args)
                )
            return self.made(lambda env: cel_in(lf(env), rf(env)), "bool", cost=C.add(own, args))
        if known and lt != rt and not ({lt, rt} <= _NUMERIC):
            self.fail(tree, mismatch)
        # No ordering overload takes a quantity, a semver, a list, ...: one such side is
        # enough (``dyn > semver('1.0.0')`` is refused).
        # (``null`` beside ``dyn`` passes the checker.)
        if any(
            t not in _ORDERED and t not in _TIME_TYPES and t not in (DYN, "null") for t in (lt, rt)
        ):
            self.fail(tree, mismatch)
        own = C.ONE
        if {lt, rt} & {"string", "bytes"} or (lt == DYN and rt == DYN):
            strings = _compare_cost(left, right)
            own = strings if {lt, rt} & {"string", "bytes"} else C.union(C.ONE, strings)
        test: Callable[[int], bool] = {
            "relation_lt": lambda c: c < 0,
            "relation_le": lambda c: c <= 0,
            "relation_gt": lambda c: c > 0,
            "relation_ge": lambda c: c >= 0,
        }[op]
        return self.made(
            lambda env: test(cel_order(symbol, lf(env), rf(env))), "bool", cost=C.add(own, args)
        )

    def _arith(
        self, tree: lark.Tree[Any], table: dict[str, tuple[str, Callable[..., Any]]]
    ) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        op, left, right = self._binary(tree)
        symbol, impl = table[op]
        lt, rt = _checked(left.type), _checked(right.type)
        mismatch = f"found no matching overload for '{symbol}' applied to '({lt}, {rt})'"
        result_type = lt if lt != DYN else rt
        if "null" in (lt, rt) and symbol in ("_+_", "_-_"):
            # null passes as a timestamp or duration (beside one, dyn or null); fails at
            # evaluation.
            other = rt if lt == "null" else lt
            if other not in (DYN, "null") and other not in _TIME_TYPES:
                self.fail(tree, mismatch)
            result_type = DYN
        elif {lt, rt} & _TIME_TYPES:
            time_result = _time_arithmetic(symbol, lt, rt)
            if time_result is None:
                self.fail(tree, mismatch)
            result_type = time_result or DYN
        elif lt != DYN and rt != DYN and lt != rt:
            self.fail(tree, mismatch)
        if symbol == "_+_" and lt == rt == "list":
            # list(E) + list(E): the element types unify (list(int) + list(double) does not).
            lfull, rfull = _known_full_type(left), _known_full_type(right)
            if lfull is not None and rfull is not None and not _unifiable(lfull, rfull):
                self.fail(
                    tree, f"found no matching overload for '_+_' applied to '({lfull}, {rfull})'"
                )
        allowed = _ARITHMETIC[symbol]
        # null passes where a timestamp or duration is declared (``_+_``, ``_-_``).
        null_ok = symbol in ("_+_", "_-_")
        if any(
            t != DYN and t not in allowed and t not in _TIME_TYPES and not (null_ok and t == "null")
            for t in (lt, rt)
        ):
            self.fail(tree, mismatch)
        lf, rf = left.fn, right.fn
        args = C.add(left.cost, right.cost)
        own, size = C.ONE, None
        if symbol == "_+_":
            kinds = {lt, rt} - {DYN}
            joined = C.add(_size(left), _size(right))
            if kinds <= {"list"}:
                size = joined
            if kinds & {"string", "bytes"}:
                own, size = C.factor(joined, C.STRING_TRAVERSAL), joined
            elif not kinds:
                own = C.union(C.ONE, C.factor(joined, C.STRING_TRAVERSAL))
        items = None
        if left.items is not None and right.items is not None:
            items = C.union(left.items, right.items)
        # Two operands cel-go types exactly dyn match several overloads: the result is dyn.
        exact = DYN if left.full == DYN and right.full == DYN else None
        return self.made(
            lambda env: impl(lf(env), rf(env)),
            result_type,
            cost=C.add(own, args),
            size=size,
            items=items,
            full=exact,
        )

    def _addition(self, tree: lark.Tree[Any]) -> Node:
        return self._arith(
            tree, {"addition_add": ("_+_", cel_add), "addition_sub": ("_-_", cel_sub)}
        )

    def _multiplication(self, tree: lark.Tree[Any]) -> Node:
        return self._arith(
            tree,
            {
                "multiplication_mul": ("_*_", cel_mul),
                "multiplication_div": ("_/_", cel_div),
                "multiplication_mod": ("_%_", cel_mod),
            },
        )

    def _unary(self, tree: lark.Tree[Any]) -> Node:
        """A chain of one unary operator, as cel-go's grammar reads it (``(ops+='!')+ member``,
        ``(ops+='-')+ member``): the operator applies once when it is written an odd number of
        times and not at all (no type check either) when an even number, and the chain takes
        the sign of a numeric literal after it as one more operator (``--9223372036854775808``
        is an invalid literal, ``- -1`` is ``1``). A chain of both operators is applied one
        operator at a time."""
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        ops: list[str] = []
        inner = tree
        while len(inner.children) == 2:
            ops.append(cast(lark.Tree[Any], inner.children[0]).data)
            inner = cast(lark.Tree[Any], inner.children[1])
        if len(set(ops)) > 1:
            return self._apply_unary(tree)
        literal = _signed_literal(inner)
        if ops[0] == "unary_neg" and literal is not None:
            ops.append("unary_neg")
            token = literal.update(value=literal.value[1:])
            operand = self._literal(lark.Tree("literal", [token]))
        else:
            operand = self.node(inner)
        if len(ops) % 2 == 0:
            return operand
        return self._unary_op(ops[0], tree, operand)

    def _apply_unary(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        op_tree, operand_tree = tree.children
        operand = self._apply_unary(operand_tree)
        return self._unary_op(op_tree.data, tree, operand)

    def _unary_op(self, op: str, tree: lark.Tree[Any], operand: Node) -> Node:
        f = operand.fn
        cost = C.add(C.ONE, operand.cost)
        if op == "unary_not":
            _logical_type_check(self, "!_", tree, operand)
            return self.made(lambda env: cel_not(f(env)), "bool", cost=cost)
        if _checked(operand.type) not in ("int", "double", DYN):
            self.fail(
                tree,
                f"found no matching overload for '-_' applied to "
                f"'({_known_full_type(operand) or _checked(operand.type)})'",
            )
        if operand.const is not None and isinstance(operand.const, int | float):
            try:
                value = cel_neg(operand.const)
            except CelEvalError:
                pass  # an overflow is the evaluation's error, as in cel-go (no folding)
            else:
                return Node(lambda env: value, operand.type, const=value, cost=C.ZERO)
        return self.made(
            lambda env: cel_neg(f(env)),
            operand.type,
            cost=cost,
            full=DYN if operand.full == DYN else None,
        )

    # --- members -----------------------------------------------------------------------

    def _member(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _primary(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _paren_expr(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _sub_path(self, member: Node, name: str) -> tuple[str, ...] | None:
        return None if member.path is None else (*member.path, name)

    def field(self, token: lark.Token) -> str:
        """The field name ``token`` selects. cel-go's lexer makes ``in``, ``null``, ``true``
        and ``false`` tokens of their own, so unquoted they are no field name (a syntax error);
        the other reserved words are names there."""
        if token.type == "IDENT" and str(token) in _KEYWORDS:
            self.fail(token, f"Syntax error: mismatched input '{token}' expecting IDENTIFIER")
        return field_name(token)

    def _member_dot(self, tree: lark.Tree[Any]) -> Node:
        member_tree, field_token = tree.children
        field = self.field(cast(lark.Token, field_token))
        type_value = self.type_identifier(tree)
        if type_value is not None:
            return self.type_node(type_value)
        member = self.node(member_tree)
        f = member.fn
        path = self._sub_path(member, field)
        if member.type == DEVICE:
            fields = dict(DEVICE_FIELDS)
            if not self.features.allow_multiple_allocations:
                del fields["allowMultipleAllocations"]
            if field not in fields:
                self.fail(field_token, f"undefined field '{field}'")
            return self.made(
                lambda env: f(env)[field],
                fields[field],
                cost=C.add(member.cost, C.ONE),
                path=path,
            )
        if member.type in _ORDERED or member.type in ("list", "Quantity", "Semver", "null"):
            self.fail(field_token, f"type '{member.type}' does not support field selection")
        self.refer(member, field, False, field_token)
        own = C.ONE if _plain(member.type) == "map" else C.ZERO
        if member.type == "optional":
            self.check_optional_field(cast(lark.Token, field_token), member)
            return self.made(
                lambda env: opt.select(f(env), field),
                "optional",
                cost=C.add(member.cost, own),
            )
        return self.made(
            lambda env: _select(f(env), field),
            _element_type(member.type),
            own=own[1],
            cost=C.add(member.cost, own),
            path=path,
            full=_exact_dyn(member),
        )

    def check_optional_field(self, where: lark.Token, member: Node) -> None:
        """cel-go selects a field of an optional's value type: one without fields (a scalar,
        null, a list, a duration) or an opaque Kubernetes type is a compile error."""
        inner = _optional_inner(_known_full_type(member))
        if inner is None or inner == DYN or inner.startswith("map("):
            return
        if inner in ("kubernetes.Quantity", "kubernetes.Semver"):
            self.fail(where, f"unexpected failed resolution of '{inner}'")
        self.fail(where, f"type '{inner}' does not support field selection")

    def _member_dot_opt(self, tree: lark.Tree[Any]) -> Node:
        member_tree, field_token = tree.children
        field = self.field(cast(lark.Token, field_token))
        member = self.node(member_tree)
        if member.type in ("null", "Quantity", "Semver"):
            self.fail(field_token, f"type '{member.type}' does not support field selection")
        if member.type == DEVICE or member.type in _ORDERED or member.type == "list":
            self.fail(
                field_token, f"type '{member.type}' does not support optional field selection"
            )
        self.refer(member, field, True, field_token)
        f = member.fn
        return self.made(
            lambda env: opt.select(f(env), field),
            "optional",
            cost=C.add(member.cost, C.ONE),
            full=_optional_of_element(member) if _plain(member.type) == "map" else None,
        )

    def check_qualifier(self, tree: lark.Tree[Any], index: Node) -> None:
        """cel-go's planner turns a constant index into a qualifier, which only a string,
        int, uint, bool or double can be: ``m[dyn(null)]`` or ``l[dyn([0])]`` fails the
        program's planning, a compile error."""
        planned = _planned(index)
        if planned is not None and not isinstance(planned[0], str | int | float):
            name = type_name(planned[0])
            self.fail(
                tree,
                "program instantiation failed: invalid qualifier type: "
                f"{_GO_TYPES.get(name, name)}",
            )

    def _member_index(self, tree: lark.Tree[Any]) -> Node:
        member = self.node(tree.children[0])
        index = self.node(tree.children[1])
        self.check_qualifier(tree, index)
        mf, xf = member.fn, index.fn
        if member.type == DEVICE:
            self.fail(tree, "device fields are selected with '.', not indexed")
        domain = None
        if isinstance(index.const, str):
            if member.type in (ATTRIBUTES, CAPACITY):
                kind = "attribute" if member.type == ATTRIBUTES else "capacity"
                domain = (kind, index.const)
            else:
                self.refer(member, index.const, False, tree.children[1])
        cost = C.total(C.ONE, member.cost, index.cost)
        if member.type == "optional":
            return self.made(lambda env: opt.index(mf(env), xf(env)), "optional", cost=cost)
        if _checked(member.type) not in ("list", "map", DYN, "null"):
            # Indexing is declared on lists and maps only (null passes the checker).
            given = _known_full_type(index) or _checked(index.type)
            self.fail(
                tree,
                f"found no matching overload for '_[_]' applied to "
                f"'({_known_full_type(member) or _cel_name(member.type)}, {given})'",
            )
        self.check_index_type(tree, "_[_]", member, index)
        path = self._sub_path(member, "@items" if member.type == "list" else "@values")
        type_, full = _element_type(member.type), _exact_dyn(member)
        value_full = _parts_of_full(member.full)[1]
        if value_full is not None:
            type_, full = _static_of_full(value_full)
        node = self.made(
            lambda env: cel_index(mf(env), xf(env)), type_, cost=cost, path=path, full=full
        )
        node.domain = domain
        return node

    def check_index_type(self, tree: lark.Tree[Any], op: str, member: Node, index: Node) -> None:
        """cel-go's index overloads: a list takes an int, a map its key type (a string for
        the device's maps); another statically known index type is a compile error."""
        key = _key_of(member)
        given = _known_full_type(index)
        if key is not None and given not in (None, DYN) and given != key:
            container = _full_type(member)
            self.fail(
                tree, f"found no matching overload for '{op}' applied to '({container}, {given})'"
            )

    def _member_index_opt(self, tree: lark.Tree[Any]) -> Node:
        member = self.node(tree.children[0])
        index = self.node(tree.children[1])
        self.check_qualifier(tree, index)
        if member.type == DEVICE:
            self.fail(tree, "device fields are selected with '.', not indexed")
        if isinstance(index.const, str):
            self.refer(member, index.const, True, tree.children[1])
        if member.type != "optional":
            mtype = _checked(member.type)
            if mtype not in ("list", "map", DYN, "null"):
                # Optional indexing is declared on lists and maps only.
                given = _known_full_type(index) or _checked(index.type)
                self.fail(
                    tree,
                    f"found no matching overload for '_[?_]' applied to "
                    f"'({_known_full_type(member) or mtype}, {given})'",
                )
            self.check_index_type(tree, "_[?_]", member, index)
        mf, xf = member.fn, index.fn
        cost = C.total(C.ONE, member.cost, index.cost)
        return self.made(
            lambda env: opt.index(mf(env), xf(env)),
            "optional",
            cost=cost,
            full=_optional_of_element(member),
        )

    def _member_object(self, tree: lark.Tree[Any]) -> Node:
        self.fail(tree, "message construction is not supported in DRA selectors")
        raise AssertionError

    def _member_dot_arg(self, tree: lark.Tree[Any]) -> Node:
        member_tree = tree.children[0]
        name_token = cast(lark.Token, tree.children[1])
        args_tree = tree.children[2] if len(tree.children) > 2 else None
        name = str(name_token)
        namespace = _ident_name(member_tree)
        if name == "bind" and namespace == "cel" and "cel" not in self.scope:
            return self._bind(tree, args_tree)
        if namespace == "optional" and "optional" not in self.scope:
            return self._optional_global(tree, name_token, f"optional.{name}", args_tree)
        if namespace is not None and namespace not in self.scope:
            dotted = f"{namespace}.{name}"
            if dotted in GLOBAL_FUNCTIONS:
                return self._global_call(dotted, name_token, args_tree)
        if name == "sortBy" and args_tree is not None and len(args_tree.children) == 2:
            return self._sort_by(tree, member_tree, args_tree)
        if name in _MACROS or name in _TWO_VAR:
            arg_count = len(args_tree.children) if args_tree is not None else 0
            if name in _TWO_VAR or (arg_count == 3 and name != "map"):
                return self._two_var(tree, name, member_tree, args_tree)
            return self._macro(tree, name, member_tree, args_tree)
        if name in ("or", "orValue"):
            return self._optional_or(tree, name, member_tree, args_tree)
        if name in ("optMap", "optFlatMap"):
            return self._optional_map(tree, name, member_tree, args_tree)
        self.in_format += name == "format"
        try:
            receiver = self.node(member_tree)
            args = self.exprlist(args_tree)
        finally:
            self.in_format -= name == "format"
        if name in opt.METHODS and name not in METHODS:
            # The optional library's methods take an optional receiver (null passes the
            # checker and fails at evaluation); ``or`` takes an optional too.
            if receiver.type not in ("optional", DYN, "null"):
                self.fail(name_token, _no_overload(name, receiver, args))
            if name == "or" and args and args[0].type not in ("optional", DYN, "null"):
                self.fail(name_token, _no_overload(name, receiver, args))
        if name in opt.METHODS and receiver.type in ("optional", DYN, "null"):
            impl_opt, arity = opt.METHODS[name]
            if len(args) != arity:
                self.fail(name_token, _no_overload(name, receiver, args))
            rfn = receiver.fn
            type_, full = "bool", None
            if name != "hasValue":
                type_, full = _value_of_full(_optional_inner(_known_full_type(receiver)))
            return self.made(
                lambda env: impl_opt(rfn(env)),
                type_,
                cost=C.add(C.ONE, receiver.cost),
                full=full,
            )
        if name == "includes" and self.features.includes:
            return self._includes(receiver, args, name_token)
        function = METHODS.get(name)
        if function is None and name in GLOBAL_FUNCTIONS:
            # Declared, but with no member overload (``q.sign()``): cel-go's checker skips
            # global overloads for a receiver call whatever the receiver's type.
            self.fail(name_token, _no_overload(name, receiver, args))
        if function is None:
            self.fail(name_token, f"undeclared reference to '{name}'")
            raise AssertionError
        if len(args) not in function.arities:
            self.fail(name_token, _no_overload(name, receiver, args))
        self.check_constant_call(name_token, name, [receiver, *args])
        self.check_planned_regex(name_token, name, [receiver, *args])
        # cel-go's format validator checks a string literal receiver with a list literal.
        literal = _unwrap(member_tree).data == "literal" and isinstance(receiver.const, str)
        if name == "format" and literal and args[0].elements is not None:
            bases = [t.split("(")[0] for t in args[0].elements]
            message = check_format(receiver.const, bases)
            if message is not None:
                self.fail(name_token, message)
        element = _known_element_type(receiver)
        base = None if element is None else element.split("(")[0]
        if base is not None and not _assignable(base, frozenset(_LIST_ELEMENTS.get(name, (base,)))):
            self.fail(
                name_token,
                f"found no matching overload for '{name}' applied to '{receiver.full}.()'",
            )
        allowed = _METHOD_RECEIVERS.get(name)
        rtype = _plain(receiver.type)
        if allowed is not None and not _assignable(rtype, allowed):
            self.fail(name_token, _no_overload(name, receiver, args))
        if name in ("indexOf", "lastIndexOf") and rtype == "list":
            # list(E).indexOf(E): one argument, of the element type when both are known.
            element = _parts_of_full(_known_full_type(receiver))[1]
            given = _known_full_type(args[0]) if args else None
            clash = element is not None and given is not None and not _unifiable(element, given)
            if len(args) != 1 or clash:
                self.fail(name_token, _no_overload(name, receiver, args))
        accepted = _method_args(name, rtype, len(args))
        if any(not _assignable(_checked(a.type), t) for a, t in zip(args, accepted, strict=False)):
            self.fail(name_token, _no_overload(name, receiver, args))
        impl, rf = function.impl, receiver.fn
        result_type = _METHOD_RESULT.get(name, DYN)
        full = None
        if name == "ip" and rtype == NET_CIDR:
            result_type = NET_IP
        if name in ("split", "findAll"):
            full = "list(string)"
        if name in ("reverse", "distinct", "slice") and rtype == "list":
            full = receiver.full  # a list of the receiver's element type
        if name == "sort":
            # sort's overloads are per orderable type: a list of one is that list; any other
            # (dyn, null, unknown elements) may resolve to another, so its type is not known.
            if _known_element_type(receiver) in _SCALARS:
                full = receiver.full
            else:
                result_type = DYN
        if name in ("sum", "min", "max"):
            # The element type of the receiver, as cel-go infers it (``dyn`` included).
            result_type, full = _element_of_full(receiver.full)
        own, size = _method_cost(name, receiver, args)
        cost = C.total(own, receiver.cost, *(a.cost for a in args))
        if not args:
            return self.made(
                lambda env: _call(name, impl, rf(env)), result_type, cost=cost, size=size, full=full
            )
        if len(args) == 1:
            af = args[0].fn
            return self.made(
                lambda env: _call(name, impl, rf(env), af(env)),
                result_type,
                cost=cost,
                size=size,
                full=full,
            )
        fns = [a.fn for a in args]
        return self.made(
            lambda env: _call(name, impl, rf(env), *(g(env) for g in fns)),
            result_type,
            cost=cost,
            size=size,
            full=full,
        )

    def _sort_by(
        self, tree: lark.Tree[Any], member_tree: lark.Tree[Any], args_tree: lark.Tree[Any]
    ) -> Node:
        """cel-go's lists extension (version 2+) macro ``l.sortBy(v, key)``: ``l`` ordered
        by ``l.map(v, key)`` through ``METHODS['@sortByAssociatedKeys']`` (stable)."""
        if _unwrap(member_tree).data in ("literal", "map_lit"):
            self.fail(
                tree,
                "sortBy can only be applied to a list, identifier, comprehension, call or "
                "select expression",
            )
        keys = self._macro(tree, "map", member_tree, args_tree)
        target = self.node(member_tree)
        impl, tf, kf = METHODS["@sortByAssociatedKeys"].impl, target.fn, keys.fn
        n = _size(target)
        own = C.add(C.ONE, C.factor(C.mul(n, n), 2))
        return self.made(
            lambda env: _call("sortBy", impl, tf(env), kf(env)),
            "list",
            cost=C.total(own, target.cost, keys.cost),
            size=target.size,
            items=target.items,
        )

    def _includes(self, receiver: Node, args: list[Node], token: lark.Token) -> Node:
        if len(args) != 1:
            self.fail(token, _no_overload("includes", receiver, args))
        rf, af = receiver.fn, args[0].fn
        cost = C.total((0, C.MAX_LIST_VALUES), receiver.cost, args[0].cost)
        return self.made(lambda env: _includes(rf(env), af(env)), "bool", cost=cost)

    def _optional_global(
        self,
        tree: lark.Tree[Any],
        token: lark.Token,
        name: str,
        args_tree: lark.Tree[Any] | None,
    ) -> Node:
        if name not in opt.GLOBALS:
            self.fail(token, f"undeclared reference to '{name}'")
        impl, arity = opt.GLOBALS[name]
        args = self.exprlist(args_tree)
        if len(args) != arity:
            self.fail(token, _no_overload(name, None, args))
        cost = C.total(C.ONE, *(a.cost for a in args))
        if not args:
            return self.made(lambda env: impl(), "optional", cost=cost)
        af = args[0].fn
        inner = _known_full_type(args[0])
        full = None if inner is None else f"optional_type({inner})"
        return self.made(lambda env: impl(af(env)), "optional", cost=cost, full=full)

    def _optional_or(
        self,
        tree: lark.Tree[Any],
        name: str,
        member_tree: lark.Tree[Any],
        args_tree: lark.Tree[Any] | None,
    ) -> Node:
        receiver = self.node(member_tree)
        args = self.exprlist(args_tree)
        if len(args) != 1:
            self.fail(tree, _no_overload(name, receiver, args))
        takes = ("optional", DYN, "null")
        if receiver.type not in takes or (name == "or" and args[0].type not in takes):
            self.fail(tree, _no_overload(name, receiver, args))
        # optional(T).or(optional(T)), optional(T).orValue(T): known Ts must be one.
        inner = _optional_inner(_known_full_type(receiver))
        other = _known_full_type(args[0])
        if name == "or":
            other = _optional_inner(other)
        if inner is not None and other is not None and not _unifiable(inner, other):
            self.fail(tree, _no_overload(name, receiver, args))
        rf, af = receiver.fn, args[0].fn
        cost = C.total(C.ONE, receiver.cost, args[0].cost)
        if name == "or":

            def or_(env: Env) -> Any:
                first = opt.expect(rf(env), "or")
                return first if first.has_value else opt.expect(af(env), "or")

            return self.made(or_, "optional", cost=cost)

        def or_value(env: Env) -> Any:
            first = opt.expect(rf(env), "orValue")
            return first.get() if first.has_value else af(env)

        # The result is V of ``orValue(optional(V), V)``: known where the known sides agree
        # and have no ``dyn`` in them (which cel-go may resolve either way).
        sides = {t for t in (inner, other) if t is not None}
        only = sides.pop() if len(sides) == 1 else None
        type_, full = _value_of_full(None if only is None or DYN in only else only)
        return self.made(or_value, type_, cost=cost, full=full)

    def _optional_map(
        self,
        tree: lark.Tree[Any],
        name: str,
        member_tree: lark.Tree[Any],
        args_tree: lark.Tree[Any] | None,
    ) -> Node:
        """The ``optMap(v, e)`` and ``optFlatMap(v, e)`` macros: ``e`` with ``v`` bound to the
        value of the optional receiver, or ``optional.none()`` when it has none. ``optMap``
        wraps the result in an optional; ``optFlatMap``'s ``e`` must produce one."""
        args = list(args_tree.children) if args_tree is not None else []
        if len(args) != 2:
            self.fail(tree, f"{name}() macro takes 2 arguments")
        receiver = self.node(member_tree)
        var = _ident_name(args[0])
        body = self._bound(args[0], args[1], _Local(DYN, None, None))
        assert var is not None
        rf, bf = receiver.fn, body.fn
        flat = name == "optFlatMap"

        def optional_map(env: Env) -> opt.OptionalValue:
            target = opt.expect(rf(env), name)
            if not target.has_value:
                return opt.NONE
            result = bf({**env, var: target.get()})
            return opt.expect(result, name) if flat else opt.OptionalValue(result)

        cost = C.total(C.ONE, receiver.cost, body.cost)
        return self.made(optional_map, "optional", cost=cost)

    def _dot_ident_arg(self, tree: lark.Tree[Any]) -> Node:
        return self._ident_arg(tree)

    def _ident_arg(self, tree: lark.Tree[Any]) -> Node:
        name_token = cast(lark.Token, tree.children[0])
        name = str(name_token)
        args_tree = tree.children[1] if len(tree.children) > 1 else None
        if name == "has":
            return self._has(tree, args_tree)
        return self._global_call(name, name_token, args_tree)

    def _global_call(
        self, name: str, name_token: lark.Token, args_tree: lark.Tree[Any] | None
    ) -> Node:
        function = GLOBAL_FUNCTIONS.get(name)
        if function is None:
            self.fail(name_token, f"undeclared reference to '{name}'")
            raise AssertionError
        args = self.exprlist(args_tree)
        if len(args) not in function.arities:
            self.fail(name_token, _no_overload(name, None, args))
        accepted = _GLOBAL_ARGS.get(name, ())
        for arg, types in zip(args, accepted, strict=False):
            if not _assignable(_checked(arg.type), types):
                self.fail(name_token, _no_overload(name, None, args))
        self.check_constant_call(name_token, name, args)
        self.check_planned_regex(name_token, name, args)
        if name in _SET_FUNCTIONS and len(args) == 2:
            # (list(T), list(T)): two lists of known, different element types do not unify.
            first, second = (_known_full_type(a) for a in args)
            if first is not None and second is not None and not _unifiable(first, second):
                self.fail(
                    name_token,
                    f"found no matching overload for '{name}' applied to '({first}, {second})'",
                )
        impl = function.impl
        result_type = DYN if name == "dyn" else _GLOBAL_RESULT.get(name, DYN)
        own, size = _global_cost(name, args)
        cost = C.total(own, *(a.cost for a in args))
        if name == "dyn":
            node = Node(args[0].fn, DYN, cost=cost, size=args[0].size, path=args[0].path, full=DYN)
            node.planned = _planned(args[0])
            return node
        planned = _planned(args[0]) if len(args) == 1 else None
        if name in _CONVERSIONS and planned is not None:
            # cel-go's planner (Kubernetes evaluates with OptOptimize) folds a conversion of a
            # constant into a constant; one that fails fails the program's planning, a
            # compile error, even in a branch that is never taken.
            try:
                value = _call(name, impl, planned[0])
            except CelEvalError as exc:
                self.fail(name_token, f"program instantiation failed: {exc.message}")
            return Node(lambda env: value, result_type, const=value, cost=cost, size=size)
        fns = [a.fn for a in args]
        if name == "lists.range" and len(fns) == 1:
            return self._allocating_range(impl, args[0], cost)
        if len(fns) == 1:
            af = fns[0]
            return self.made(
                lambda env: _call(name, impl, af(env)), result_type, cost=cost, size=size
            )
        return self.made(
            lambda env: _call(name, impl, *(g(env) for g in fns)), result_type, cost=cost, size=size
        )

    def _allocating_range(self, impl: Callable[..., Any], arg: Node, cost: C.Est) -> Node:
        """``lists.range(n)``: cel-go estimates and charges it as a list allocation, its
        length plus a call and a list's creation (so ``lists.range(1000000)`` passes the
        runtime limit)."""
        af = arg.fn
        base = 1 + C.LIST_CREATE
        n = arg.const if isinstance(arg.const, int) and not isinstance(arg.const, bool) else None
        if n is not None and n >= 0:
            own: C.Est = (n + base, n + base)
            size: C.Est | None = (n, n)
        else:
            own, size = (base, C.UNBOUNDED), None
        total = C.total(own, cost)
        if not self.features.budget:
            return self.made(
                lambda env: _call("lists.range", impl, af(env)), "list", cost=total, size=size
            )

        def charged(env: Env) -> Any:
            result = _call("lists.range", impl, af(env))
            env["@budget"].charge(len(result) + base)
            return result

        return self.made(charged, "list", cost=total, size=size)

    def _dot_ident(self, tree: lark.Tree[Any]) -> Node:
        return self._ident(tree)

    def _ident(self, tree: lark.Tree[Any]) -> Node:
        token = tree.children[0]
        name = str(token)
        if name not in self.scope:
            type_value = self.type_identifier(tree)
            if type_value is not None:
                return self.type_node(type_value)
            self.fail(token, f"undeclared reference to '{name}'")
        local = self.locals.get(name)
        if local:
            top = local[-1]
            return self.made(
                lambda env: env[name],
                top.type,
                path=top.path,
                size=top.size,
                cost=C.ONE,
                full=top.full,
            )
        return self.made(lambda env: env[name], self.scope[name], path=(name,), cost=C.ONE)

    # --- literals ------------------------------------------------------------------------

    def _literal(self, tree: lark.Tree[Any]) -> Node:
        token = cast(lark.Token, tree.children[0])
        kind = token.type
        value: Any
        size = C.ONE
        try:
            if kind == "INT_LIT":
                value = int(token.value, 0) if "x" in token.value else int(token.value)
                if not INT64_MIN <= value <= INT64_MAX:
                    raise ValueError("integer out of range")
                type_ = "int"
            elif kind == "UINT_LIT":
                text = token.value[:-1]
                value = UInt(int(text, 0) if "x" in text else int(text))
                if not 0 <= value <= UINT64_MAX:
                    raise ValueError("unsigned integer out of range")
                type_ = "uint"
            elif kind == "FLOAT_LIT":
                value, type_ = float(token.value), "double"
            elif kind in ("STRING_LIT", "MLSTRING_LIT"):
                value, type_ = string_literal(token.value), "string"
                size = (len(value), len(value))
            elif kind == "BYTES_LIT":
                value, type_ = bytes_literal(token.value), "bytes"
                size = (len(value), len(value))
            elif kind == "BOOL_LIT":
                value, type_ = token.value == "true", "bool"
            else:
                value, type_ = None, "null"
        except ValueError as exc:
            self.fail(token, f"Syntax error: invalid literal {token.value!r}: {exc}")
        node = Node(lambda env: value, type_, const=value, cost=C.ZERO, size=size)
        if value is None:
            node.planned = (None,)  # a null literal: a constant to the planner
        return node

    def _list_lit(self, tree: lark.Tree[Any]) -> Node:
        items: list[Node] = []
        optional: list[bool] = []
        for child in tree.children:
            inner = child.children[0]
            is_opt = inner.data == "opt_elem"
            items.append(self.node(inner.children[0] if is_opt else inner))
            optional.append(is_opt)
        if any(optional):
            self.check_homogeneous_types(
                [
                    (self.optional_element(i, c) if o else _known_full_type(i), c)
                    for i, c, o in zip(items, tree.children, optional, strict=True)
                ]
            )
        else:
            self.check_homogeneous(list(zip(items, tree.children, strict=True)))
        fns = [i.fn for i in items]
        cost = C.total((C.LIST_CREATE, C.LIST_CREATE), *(i.cost for i in items))
        element = (0, 0) if not items else (C.UNBOUNDED, 0)
        for i in items:
            element = C.union(element, _size(i))
        size = (len(items), len(items))
        if any(optional):
            pairs = list(zip(fns, optional, strict=True))

            def build_optional(env: Env) -> list[Any]:
                out = []
                for g, is_opt in pairs:
                    value = g(env)
                    if is_opt:
                        value = opt.expect(value, "[?_]")
                        if value.has_value:
                            out.append(value.get())
                    else:
                        out.append(value)
                return out

            return self.made(
                build_optional, "list", own=C.LIST_CREATE, cost=cost, size=size, items=element
            )
        node = self.made(
            lambda env: [g(env) for g in fns],
            "list",
            own=C.LIST_CREATE,
            cost=cost,
            size=size,
            items=element,
            elements=tuple(_full_type(i) for i in items),
            full=_literal_full("list", items),
        )
        planned = [_planned(i) for i in items]
        if all(planned):
            node.planned = ([p[0] for p in planned if p],)
        return node

    def _map_lit(self, tree: lark.Tree[Any]) -> Node:
        entries: list[tuple[Node, Node, bool]] = []
        for entry in tree.children:
            key_tree, value_tree = entry.children
            is_opt = key_tree.data == "opt_key"
            key = self.node(key_tree.children[0] if is_opt else key_tree)
            entries.append((key, self.node(value_tree), is_opt))
        self.check_homogeneous(
            [(k, e.children[0]) for (k, _, _), e in zip(entries, tree.children, strict=True)]
        )
        self.check_homogeneous(
            [
                (v, e.children[1])
                for (_, v, o), e in zip(entries, tree.children, strict=True)
                if not o
            ]
        )
        # A list or map key is a reference in cel-go, held by identity: one an index or call
        # makes is new at each evaluation (``{m[k]: 1} == {m[k]: 1}`` is false), one a variable
        # holds is the same object. Such keys, unless read from a variable, are copied here.
        fresh = [
            not _shared_reference(e.children[0].children[0] if o else e.children[0])
            for (_, _, o), e in zip(entries, tree.children, strict=True)
        ]
        pairs = [(k.fn, v.fn, o, f) for (k, v, o), f in zip(entries, fresh, strict=True)]
        cost = C.total(
            (C.MAP_CREATE, C.MAP_CREATE),
            *(k.cost for k, _, _ in entries),
            *(v.cost for _, v, _ in entries),
        )

        def build(env: Env) -> CelMap:
            # As cel-go builds a map literal: entry by entry, key then value; any key type;
            # a repeated key replaces the earlier entry, and an absent optional entry
            # removes it.
            result = CelMap()
            for kf, vf, is_opt, new in pairs:
                key = kf(env)
                if new and isinstance(key, Mapping | list | tuple):
                    key = copy.copy(key) if isinstance(key, Mapping) else list(key)
                value = vf(env)
                if is_opt:
                    value = opt.expect(value, "{?_:_}")
                    if not value.has_value:
                        result.remove(key)
                        continue
                    value = value.get()
                result.put(key, value)
            return result

        n = len(entries)
        full = _literal_full("map", [k for k, _, _ in entries], [v for _, v, o in entries if not o])
        node = self.made(build, "map", own=C.MAP_CREATE, cost=cost, size=(n, n), full=full)
        planned = [(_planned(k), _planned(v)) for k, v, o in entries if not o]
        if len(planned) == n and all(k and v for k, v in planned):
            # A key Go cannot hash: cel-go's planner panics; here the evaluation errs.
            with contextlib.suppress(CelEvalError):
                node.planned = (CelMap((k[0], v[0]) for k, v in planned if k and v),)
        return node

    # --- macros --------------------------------------------------------------------------

    def _has(self, tree: lark.Tree[Any], args_tree: lark.Tree[Any] | None) -> Node:
        args = args_tree.children if args_tree is not None else []
        target = _unwrap(args[0]) if len(args) == 1 else None
        if target is None or target.data != "member_dot":
            self.fail(tree, "invalid argument to has() macro")
            raise AssertionError
        member = self.node(target.children[0])
        field = self.field(cast(lark.Token, target.children[1]))
        if member.type == DEVICE and field not in DEVICE_FIELDS:
            self.fail(target.children[1], f"undefined field '{field}'")
        if member.type in _ORDERED or member.type in ("list", "Quantity", "Semver", "null"):
            self.fail(tree, f"type '{member.type}' does not support field selection")
        self.refer(member, field, True, target.children[1])
        f = member.fn

        def has(env: Env) -> bool:
            value = f(env)
            if isinstance(value, opt.OptionalValue):
                if not value.has_value:
                    return False
                value = value.get()
            if isinstance(value, Mapping):
                return finds(value, field)
            if isinstance(value, list | tuple):
                raise CelEvalError("unsupported index type 'string' in list")
            return False  # cel-go: no other value has fields

        return self.made(has, "bool", own=0, cost=member.cost)

    def _bound(self, var_tree: lark.Tree[Any], body_tree: lark.Tree[Any], local: _Local) -> Node:
        return self._bound_many([(var_tree, local)], body_tree)

    def _bound_many(
        self, variables: list[tuple[lark.Tree[Any], _Local]], body_tree: lark.Tree[Any]
    ) -> Node:
        names = []
        for var_tree, _ in variables:
            name = _ident_name(var_tree)
            if name is None:
                self.fail(var_tree, "argument must be a simple name")
                raise AssertionError
            names.append(name)
        saved = [self.scope.get(n) for n in names]
        for name, (_, local) in zip(names, variables, strict=True):
            self.scope[name] = local.type
            self.locals.setdefault(name, []).append(local)
        try:
            return self.node(body_tree)
        finally:
            for name, old in zip(reversed(names), reversed(saved), strict=True):
                self.locals[name].pop()
                if old is None:
                    self.scope.pop(name, None)
                else:
                    self.scope[name] = old

    def _bind(self, tree: lark.Tree[Any], args_tree: lark.Tree[Any] | None) -> Node:
        args = args_tree.children if args_tree is not None else []
        if len(args) != 3:
            self.fail(tree, "cel.bind() takes 3 arguments: variable, value, expression")
        init = self.node(args[1])
        local = _Local(init.type, init.path, init.size, _known_full_type(init))
        body = self._bound(args[0], args[2], local)
        name = _ident_name(args[0])
        assert name is not None
        initf, bodyf = init.fn, body.fn
        cost = C.total((C.LIST_CREATE, C.LIST_CREATE), init.cost, body.cost)
        return self.made(
            lambda env: bodyf({**env, name: initf(env)}),
            body.type,
            own=C.LIST_CREATE,
            cost=cost,
            size=body.size,
            full=body.full,
        )

    def check_range(self, tree: lark.Tree[Any], target: Node) -> None:
        """A comprehension's range must be a list, a map or dyn (cel-go's checker)."""
        if _plain(target.type) not in ("list", "map", DYN):
            shown = _known_full_type(target) or target.type
            self.fail(
                tree,
                f"expression of type '{shown}' cannot be range of a comprehension "
                "(must be list, map, or dynamic)",
            )

    def _range_local(self, target: Node, second: bool) -> tuple[_Local, _Local | None]:
        """The loop variable(s) of a comprehension over ``target``: one variable (list
        elements or map keys) or two (index and element, key and value)."""
        is_list = target.type == "list"
        base = target.path
        key_full, value_full = _parts_of_full(target.full)
        if not second:
            sub = "@items" if is_list else "@keys"
            path = None if base is None else (*base, sub)
            size = target.items if is_list else None
            element = _element_type(target.type) if is_list else _key_type(target.type)
            full = value_full if is_list else key_full
            if full is not None:
                element, full = _static_of_full(full)
            local = _Local(element, path, size if size is not None else C.path_size(path), full)
            return local, None
        key_path = None if base is None else (*base, "@indices" if is_list else "@keys")
        val_path = None if base is None else (*base, "@items" if is_list else "@values")
        key = _Local("int" if is_list else _key_type(target.type), key_path, None)
        if key_full is not None and not is_list:
            key.type, key.full = _static_of_full(key_full)
        val_size = target.items if is_list else None
        value = _Local(_element_type(target.type), val_path, val_size)
        if value_full is not None:
            value.type, value.full = _static_of_full(value_full)
        return key, value

    def _macro(
        self,
        tree: lark.Tree[Any],
        name: str,
        member_tree: lark.Tree[Any],
        args_tree: lark.Tree[Any] | None,
    ) -> Node:
        args = list(args_tree.children) if args_tree is not None else []
        expected = (2, 3) if name == "map" else (2,)
        if len(args) not in expected:
            self.fail(tree, f"{name}() macro takes {' or '.join(map(str, expected))} arguments")
        target = self.node(member_tree)
        tf = target.fn
        var = _ident_name(args[0])
        self.check_range(tree, target)
        local, _ = self._range_local(target, False)
        bodies = [self._bound(args[0], a, local) for a in args[1:]]
        assert var is not None
        for b in bodies[:1] if name != "map" or len(bodies) == 2 else []:
            _logical_type_check(self, name, tree, b)
        count = _size(target)
        budget = self.features.budget

        def items(env: Env) -> Iterable[Any]:
            value = tf(env)
            if isinstance(value, Mapping | list | tuple):
                if budget:
                    env["@budget"].charge(len(value))
                return list(value)
            raise _not_iterable(value)

        def loop(step: C.Est, init: C.Est = C.ZERO, result: C.Est = C.ONE) -> C.Est:
            return C.total(target.cost, init, result, C.mul(count, step))

        if name in ("all", "exists"):
            pf = bodies[0].fn
            stop = name == "exists"
            stop_result: bool = stop
            condition = (3, 3) if stop else (2, 2)
            cost = loop(C.total(condition, C.ONE, bodies[0].cost))

            def quantifier(env: Env) -> bool:
                error: CelEvalError | None = None
                for item in items(env):
                    try:
                        r = pf({**env, var: item})
                    except CelEvalError as exc:
                        if exc.message == C.COST_EXCEEDED:
                            raise
                        error = error or exc
                        continue
                    if r is stop:
                        return stop_result
                    if not isinstance(r, bool):
                        error = error or no_overload(name, r)
                if error is not None:
                    raise error
                return not stop

            return self.made(quantifier, "bool", own=0, cost=cost)
        if name in ("exists_one", "existsOne"):
            pf = bodies[0].fn
            cost = loop(C.add(bodies[0].cost, (1, 2)), result=(2, 2))

            def exists_one(env: Env) -> bool:
                count = 0
                for item in items(env):
                    r = pf({**env, var: item})
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    count += r
                return count == 1

            return self.made(exists_one, "bool", own=0, cost=cost)
        list_init = (C.LIST_CREATE, C.LIST_CREATE)
        if name == "filter":
            pf = bodies[0].fn
            cost = loop(C.add(bodies[0].cost, C.union(C.ONE, (13, 13))), init=list_init)

            def filter_(env: Env) -> list[Any]:
                out = []
                for item in items(env):
                    r = pf({**env, var: item})
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    if r:
                        out.append(item)
                return out

            # The elements (a list's) or keys (a map's) it keeps, of their type.
            kept = local.full if local.full is not None and DYN not in local.full else None
            full = None if kept is None else f"list({kept})"
            return self.made(filter_, "list", own=0, cost=cost, size=count, full=full)
        mapped = _known_full_type(bodies[-1])
        full = None if mapped is None else f"list({mapped})"
        if len(bodies) == 1:
            mf = bodies[0].fn
            cost = loop(C.add(bodies[0].cost, (12, 12)), init=list_init)
            return self.made(
                lambda env: [mf({**env, var: i}) for i in items(env)],
                "list",
                own=0,
                cost=cost,
                size=count,
                full=full,
            )
        pf, mf = bodies[0].fn, bodies[1].fn
        step = C.add(bodies[0].cost, C.union(C.ONE, C.add(bodies[1].cost, (12, 12))))
        cost = loop(step, init=list_init)

        def map_filter(env: Env) -> list[Any]:
            out = []
            for item in items(env):
                scoped = {**env, var: item}
                r = pf(scoped)
                if not isinstance(r, bool):
                    raise no_overload(name, r)
                if r:
                    out.append(mf(scoped))
            return out

        return self.made(map_filter, "list", own=0, cost=cost, size=count, full=full)

    def _two_var(
        self,
        tree: lark.Tree[Any],
        name: str,
        member_tree: lark.Tree[Any],
        args_tree: lark.Tree[Any] | None,
    ) -> Node:
        """``all``/``exists``/``existsOne`` with two variables and the ``transform*`` macros:
        over a list the variables are index and element, over a map key and value."""
        args = list(args_tree.children) if args_tree is not None else []
        expected = (3,) if name in ("all", "exists", "exists_one", "existsOne") else (3, 4)
        if len(args) not in expected:
            self.fail(tree, f"{name}() macro takes {' or '.join(map(str, expected))} arguments")
        target = self.node(member_tree)
        tf = target.fn
        first, second = _ident_name(args[0]), _ident_name(args[1])
        if first is None or second is None:
            self.fail(tree, "argument must be a simple name")
            raise AssertionError
        if first == second:
            self.fail(tree, "duplicate variable name")
        self.check_range(tree, target)
        key_local, value_local = self._range_local(target, True)
        assert value_local is not None
        bound = [(args[0], key_local), (args[1], value_local)]
        bodies = [self._bound_many(bound, body) for body in args[2:]]
        count = _size(target)
        budget = self.features.budget

        def pairs(env: Env) -> list[tuple[Any, Any]]:
            value = tf(env)
            if budget and isinstance(value, Mapping | list | tuple):
                env["@budget"].charge(len(value))
            if isinstance(value, Mapping):
                return list(value.items())
            if isinstance(value, list | tuple):
                return list(enumerate(value))
            raise _not_iterable(value)

        def scoped(env: Env, k: Any, v: Any) -> dict[str, Any]:
            return {**env, first: k, second: v}

        def loop(step: C.Est, init: C.Est = C.ZERO, result: C.Est = C.ONE) -> C.Est:
            return C.total(target.cost, init, result, C.mul(count, step))

        if name in ("all", "exists"):
            _logical_type_check(self, name, tree, bodies[0])
            pf = bodies[0].fn
            stop: bool = name == "exists"
            cost = loop(C.total((3, 3) if stop else (2, 2), C.ONE, bodies[0].cost))

            def quantifier(env: Env) -> bool:
                error: CelEvalError | None = None
                for k, v in pairs(env):
                    try:
                        r = pf(scoped(env, k, v))
                    except CelEvalError as exc:
                        if exc.message == C.COST_EXCEEDED:
                            raise
                        error = error or exc
                        continue
                    if r is stop:
                        return bool(stop)
                    if not isinstance(r, bool):
                        error = error or no_overload(name, r)
                        continue
                if error is not None:
                    raise error
                return not stop

            return self.made(quantifier, "bool", own=0, cost=cost)
        if name in ("exists_one", "existsOne"):
            _logical_type_check(self, name, tree, bodies[0])
            pf = bodies[0].fn
            cost = loop(C.add(bodies[0].cost, (1, 2)), result=(2, 2))

            def exists_one(env: Env) -> bool:
                hits = 0
                for k, v in pairs(env):
                    r = pf(scoped(env, k, v))
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    hits += r
                return hits == 1

            return self.made(exists_one, "bool", own=0, cost=cost)
        keep: Eval | None = bodies[0].fn if len(bodies) == 2 else None
        mf = bodies[-1].fn
        if keep is not None:
            _logical_type_check(self, name, tree, bodies[0])
        filter_cost = bodies[0].cost if len(bodies) == 2 else C.ZERO
        if name == "transformList":
            step = C.add(bodies[-1].cost, (12, 12))
            init = (C.LIST_CREATE, C.LIST_CREATE)
        else:
            step = C.add(bodies[-1].cost, (3, 3) if name == "transformMap" else (2, 2))
            init = (C.MAP_CREATE, C.MAP_CREATE)
        if keep is not None:
            step = C.add(filter_cost, C.union(C.ONE, step))
        cost = loop(step, init=init)

        def chosen(env: Env) -> Iterable[tuple[dict[str, Any], Any]]:
            for k, v in pairs(env):
                inner = scoped(env, k, v)
                if keep is not None:
                    r = keep(inner)
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    if not r:
                        continue
                yield inner, k

        if name == "transformList":
            return self.made(
                lambda env: [mf(inner) for inner, _ in chosen(env)],
                "list",
                own=0,
                cost=cost,
                size=count,
            )

        def transform_map(env: Env) -> CelMap:
            out = CelMap()
            for inner, k in chosen(env):
                produced = mf(inner)
                if name == "transformMap":
                    out.put(k, produced)
                    continue
                if not isinstance(produced, Mapping) or len(produced) != 1:
                    raise CelEvalError(
                        "transformMapEntry: the expression must produce a map of one entry"
                    )
                [(key, value)] = produced.items()
                if key in out:
                    raise CelEvalError(f"insert failed: key {key} already exists")
                out.put(key, value)
            return out

        return self.made(transform_map, "map", own=0, cost=cost, size=count)


_S, _I = frozenset({"string"}), frozenset({"int"})
#: Argument types (receiver left out) of methods by receiver type and argument count, as
#: their declared overloads take them; a known argument type outside is a compile error.
_METHOD_ARGS: dict[tuple[str, str, int], tuple[frozenset[str], ...]] = {
    **{(m, "string", 1): (_S,) for m in ("contains", "startsWith", "endsWith", "matches")},
    **{(m, "string", 1): (_S,) for m in ("find", "findAll", "split", "indexOf", "lastIndexOf")},
    **{(m, "string", 2): (_S, _I) for m in ("findAll", "split", "indexOf", "lastIndexOf")},
    ("charAt", "string", 1): (_I,),
    ("substring", "string", 1): (_I,),
    ("substring", "string", 2): (_I, _I),
    ("replace", "string", 2): (_S, _S),
    ("replace", "string", 3): (_S, _S, _I),
    ("format", "string", 1): (frozenset({"list"}),),
    ("join", "list", 1): (_S,),
    ("slice", "list", 2): (_I, _I),
    **{(m, "Quantity", 1): (frozenset({"Quantity", "int"}),) for m in ("add", "sub")},
    **{(m, DYN, 1): (frozenset({"Quantity", "int"}),) for m in ("add", "sub")},
    **{
        (m, r, 1): (frozenset({r}),)
        for m in ("compareTo", "isGreaterThan", "isLessThan")
        for r in ("Quantity", "Semver")
    },
    **{
        (m, DYN, 1): (frozenset({"Quantity", "Semver"}),)
        for m in ("compareTo", "isGreaterThan", "isLessThan")
    },
}


def _method_args(name: str, receiver: str, count: int) -> tuple[frozenset[str], ...]:
    """The accepted argument types of ``receiver.name(...)`` with ``count`` arguments (for a
    ``dyn`` receiver, of the only receiver type the method has), or ``()`` when not known."""
    found = _METHOD_ARGS.get((name, receiver, count))
    if found is None and receiver == DYN:
        receivers = _METHOD_RECEIVERS.get(name)
        if receivers is not None and len(receivers) == 1:
            found = _METHOD_ARGS.get((name, next(iter(receivers)), count))
    return found or ()


#: Types Kubernetes declares as object types, to which cel-go's checker lets ``null`` be
#: assigned (``sign(null)`` compiles and fails at evaluation).
_OBJECT_TYPES = frozenset({"Quantity", "Semver", URL, NET_IP, NET_CIDR, TIMESTAMP, DURATION})


def _assignable(static: str, accepted: AbstractSet[str]) -> bool:
    """Whether an operand of static type ``static`` may be passed where ``accepted`` are."""
    if static == DYN or static in accepted:
        return True
    return static in ("null", "null_type") and not accepted.isdisjoint(_OBJECT_TYPES)


def _optional_of_element(container: Node) -> str | None:
    """``optional_type(V)`` for an entry of ``container`` (a list or map whose full type is
    known, its value type ``V``), else None."""
    if container.type == "optional":
        return None
    value = _parts_of_full(_known_full_type(container))[1]
    return None if value is None else f"optional_type({value})"


def _value_of_full(full: str | None) -> tuple[str, str | None]:
    """(static type, full type) of a value whose full CEL type is ``full`` when known
    (:func:`_static_of_full`, and Kubernetes' quantity and semver, an optional); ``(dyn,
    None)`` (unknown) otherwise."""
    if full is None:
        return DYN, None
    named = {"kubernetes.Quantity": "Quantity", "kubernetes.Semver": "Semver"}.get(full)
    if named is not None:
        return named, None
    if full.startswith("optional_type("):
        return "optional", full
    return _static_of_full(full)


def _shared_reference(tree: lark.Tree[Any]) -> bool:
    """Whether the expression ``tree`` (inside any ``dyn(...)``) gives the same reference at
    every evaluation in cel-go: a variable, or a field of the ``device`` variable."""
    tree = _unwrap(tree)
    while tree.data == "ident_arg" and str(tree.children[0]) == "dyn":
        args = tree.children[-1]
        if not isinstance(args, lark.Tree) or len(args.children) != 1:
            return False
        tree = _unwrap(args.children[0])
    if _ident_name(tree) is not None:
        return True
    dotted = _dotted_name(tree)
    return dotted is not None and dotted.split(".")[0] == "device"


def _free_parameters(full: str) -> bool:
    """Whether ``full`` is a parameterised kind whose parameters are not known
    (``optional_type`` of ``optional.none()``): it unifies with any type of that kind."""
    return full == "optional_type"


def _unifiable(a: str, b: str) -> bool:
    """Whether full CEL types ``a`` and ``b`` can be one type for cel-go's checker: ``dyn``
    stands for any type, also inside a type's parameters (``list(dyn)`` and ``list(int)``);
    otherwise the kinds and their parameters must match (``map(string, dyn)`` is no ``int``,
    ``optional_type(kubernetes.Quantity)`` no ``optional_type(map(string, dyn))``); ``null``
    unifies with object types and optionals (:func:`_null_unifies`)."""
    if a == b or DYN in (a, b):
        return True
    if "null_type" in (a, b):
        other = b if a == "null_type" else a
        return other.startswith("optional_type") or other in {_cel_name(t) for t in _OBJECT_TYPES}
    head_a, _, rest_a = a.partition("(")
    head_b, _, rest_b = b.partition("(")
    if head_a != head_b:
        return False
    if not rest_a or not rest_b:
        return True  # parameters not known on one side (``optional.none()``, ``[]``)
    params_a = _split_type_arguments(rest_a[:-1])
    params_b = _split_type_arguments(rest_b[:-1])
    return len(params_a) == len(params_b) and all(
        _unifiable(x, y) for x, y in zip(params_a, params_b, strict=True)
    )


def _optional_inner(full: str | None) -> str | None:
    """``T`` of the full type ``optional_type(T)``, else None."""
    if full is not None and full.startswith("optional_type(") and full.endswith(")"):
        return full[len("optional_type(") : -1]
    return None


def _null_unifies(left: str, right: str) -> bool:
    """Whether ``null`` on one side unifies with the other side's type (an object type, an
    optional or null)."""
    if "null" not in (left, right):
        return False
    other = right if left == "null" else left
    return other in _OBJECT_TYPES or other in ("null", "optional")


def _signed_literal(unary: lark.Tree[Any]) -> lark.Token | None:
    """The token of the numeric literal with a minus sign that ``unary`` is, if it is one."""
    node: Any = unary
    for data in ("unary", "member", "primary", "literal"):
        if not isinstance(node, lark.Tree) or node.data != data or len(node.children) != 1:
            return None
        node = node.children[0]
    if isinstance(node, lark.Token) and node.type in ("INT_LIT", "UINT_LIT", "FLOAT_LIT"):
        return node if node.value.startswith("-") else None
    return None


def _not_iterable(value: Any) -> CelEvalError:
    name = type_name(value)
    return CelEvalError(f"got '{_GO_TYPES.get(name, name)}', expected iterable type")


def _select(value: Any, field: str) -> Any:
    if isinstance(value, opt.OptionalValue):
        return opt.select(value, field)
    return cel_select(value, field)


def _includes(target: Any, arg: Any) -> bool:
    """DRA's ``includes``: list membership (lists of at most 48 values), or equality."""
    if isinstance(target, list | tuple):
        for i, item in enumerate(target):
            if i >= C.MAX_LIST_VALUES:
                raise CelEvalError(
                    "'includes' function cannot be applied to lists longer than "
                    f"{C.MAX_LIST_VALUES} values"
                )
            if cel_eq(item, arg):
                return True
        return False
    return cel_eq(target, arg)


def _compare_cost(left: Node, right: Node) -> C.Est:
    """cel-go's cost of ``==``, ``!=`` and string ordering: the shorter operand's traversal."""
    smallest = min(_size(left)[1], _size(right)[1])
    return C.factor((1 if smallest > 0 else 0, smallest), C.STRING_TRAVERSAL)


#: Receiver-only methods whose cost is one traversal of the receiver string (result: same size).
_TRAVERSAL_METHODS = frozenset({"lowerAscii", "upperAscii", "substring", "trim"})
_UNIT_METHODS = frozenset(
    {"asInteger", "isInteger", "asApproximateFloat", "isGreaterThan", "isLessThan"}
    | {"compareTo", "add", "sub"}
)


def _method_cost(name: str, receiver: Node, args: list[Node]) -> tuple[C.Est, C.Est | None]:
    """The own cost and result size of ``receiver.name(args)`` (Kubernetes' library estimator,
    then cel-go's defaults)."""
    size = _size(receiver)
    if name in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"):
        if receiver.type == "list":
            element = C.ONE
            return C.mul(size, element), None
        return C.factor(size, C.STRING_TRAVERSAL), None
    if name in _TRAVERSAL_METHODS:
        return C.factor(size, C.STRING_TRAVERSAL), size
    if name == "replace" and len(args) >= 2:
        return C.factor(size, 2 * C.STRING_TRAVERSAL), None
    if name == "split":
        limit = size[1]
        if len(args) > 1 and isinstance(args[1].const, int):
            limit = max(args[1].const, 0)
        return C.factor(size, 2 * C.STRING_TRAVERSAL), (0, limit)
    if name in ("find", "findAll") and args:
        strings = C.factor(C.add(size, C.ONE), C.STRING_TRAVERSAL)
        regex = C.factor(_size(args[0]), C.REGEX_LENGTH)
        return C.mul(strings, regex), (0, size[1])
    if name == "join":
        return C.factor(C.mul(size, C.UNKNOWN), C.STRING_TRAVERSAL), None
    if name == "validate" and args:
        # Kubernetes: the string's traversal times the longest named-format regex (128).
        traversal = C.factor(_size(args[0]), C.STRING_TRAVERSAL)
        return C.factor(traversal, MAX_NAME_FORMAT_REGEX_SIZE * C.REGEX_LENGTH), None
    if name in _UNIT_METHODS:
        return C.ONE, None
    if name in ("startsWith", "endsWith") and len(args) == 1:
        return C.factor(_size(args[0]), C.STRING_TRAVERSAL), None
    if name == "matches" and len(args) == 1:
        strings = C.factor(C.add(size, C.ONE), C.STRING_TRAVERSAL)
        return C.mul(strings, C.factor(_size(args[0]), C.REGEX_LENGTH)), None
    if name == "contains" and len(args) == 1:
        return C.mul(
            C.factor(size, C.STRING_TRAVERSAL), C.factor(_size(args[0]), C.STRING_TRAVERSAL)
        ), None
    if name == "size":
        return C.ONE, None
    return C.ONE, None


def _global_cost(name: str, args: list[Node]) -> tuple[C.Est, C.Est | None]:
    """The own cost and result size of the global call ``name(args)``."""
    if name in ("bytes", "string") and len(args) == 1 and args[0].type in ("string", "bytes"):
        size = _size(args[0])
        result = (
            (size[0], min(size[1] * 4, C.UNBOUNDED)) if name == "bytes" else (size[0] // 4, size[1])
        )
        return C.factor(size, C.STRING_TRAVERSAL), result
    if name == "url" and len(args) == 1:
        return C.factor(_size(args[0]), C.STRING_TRAVERSAL), None
    return C.ONE, None


def _logical(lf: Eval, rf: Eval, short: bool, op: str) -> Eval:
    """``||`` (short=True) or ``&&`` (short=False) with CEL's error absorption."""

    outcome: bool = short

    def logical(env: Env) -> bool:
        try:
            left = lf(env)
        except CelEvalError as exc:
            left_error: CelEvalError | None = exc
            left = None
        else:
            left_error = None
            if left is short:
                return outcome
            if not isinstance(left, bool):
                left_error = no_overload(op, left)
        right = rf(env)
        if right is short:
            return outcome
        if not isinstance(right, bool):
            raise no_overload(op, right)
        if left_error is not None:
            raise left_error
        return not short

    return logical


def _call(name: str, impl: Callable[..., Any], *args: Any) -> Any:
    try:
        return impl(*args)
    except CelEvalError:
        raise
    except (TypeError, AttributeError, ValueError, ArithmeticError):
        raise no_overload(name, *args) from None


_TIME_ARITHMETIC = {
    ("_+_", TIMESTAMP, DURATION): TIMESTAMP,
    ("_+_", DURATION, TIMESTAMP): TIMESTAMP,
    ("_+_", DURATION, DURATION): DURATION,
    ("_-_", TIMESTAMP, TIMESTAMP): DURATION,
    ("_-_", TIMESTAMP, DURATION): TIMESTAMP,
    ("_-_", DURATION, DURATION): DURATION,
}


def _time_arithmetic(symbol: str, left: str, right: str) -> str | None:
    """The static result type of ``left symbol right`` where one side is a timestamp or a
    duration (CEL's overloads); ``""`` when a dyn side leaves it open; ``None`` when no
    overload accepts the pair."""
    if DYN not in (left, right):
        return _TIME_ARITHMETIC.get((symbol, left, right))
    known = left if right == DYN else right
    open_ = {r for (s, a, b), r in _TIME_ARITHMETIC.items() if s == symbol and known in (a, b)}
    return None if not open_ else ""


#: Element types the lists functions accept (Kubernetes' lists library: summable and
#: comparable types); a list literal of another element type is a compile error.
_COMPARABLE = ("int", "uint", "double", "bool", "string", "bytes", TIMESTAMP, DURATION)
_LIST_ELEMENTS = {
    "sum": ("int", "uint", "double", DURATION),
    "min": _COMPARABLE,
    "max": _COMPARABLE,
    "isSorted": _COMPARABLE,
    "sort": _COMPARABLE,
    "join": ("string",),
    "flatten": ("list",),
}


#: The full CEL types of the ``device`` variable and its maps, as Kubernetes declares them.
_DEVICE_FULL = {
    DEVICE: "kubernetes.DRADevice",
    ATTRIBUTES: "map(string, map(string, dyn))",
    CAPACITY: "map(string, map(string, kubernetes.Quantity))",
    ATTRIBUTE_DOMAIN: "map(string, dyn)",
    CAPACITY_DOMAIN: "map(string, kubernetes.Quantity)",
}


def _full_type(node: Node) -> str:
    """The full CEL type of ``node`` as cel-go prints it: a literal's own (``list(int)``),
    the device's declared ones, else its static type with ``dyn`` parameters
    (``list(dyn)``)."""
    if node.full is not None:
        return node.full
    if node.type in _DEVICE_FULL:
        return _DEVICE_FULL[node.type]
    name = _cel_name(_plain(node.type))
    return {"list": "list(dyn)", "map": "map(dyn, dyn)"}.get(name, name)


def _planned(node: Node) -> tuple[Any] | None:
    """The value of ``node`` as a 1-tuple when cel-go's planner knows it as a constant (a
    literal, ``null``, a folded conversion, ``dyn`` of one of these, a list or map literal of
    these), else None."""
    if node.const is not None:
        return (node.const,)
    return node.planned


def _exact_dyn(container: Node) -> str | None:
    """``dyn`` as the full type of a value selected from ``container`` when cel-go types it
    ``dyn`` too (an attribute value: Kubernetes declares attributes as maps of ``dyn``)."""
    return DYN if container.type == ATTRIBUTE_DOMAIN else None


def _known_full_type(node: Node) -> str | None:
    """The full CEL type of ``node`` when this compiler knows it as cel-go does: no ``dyn``
    in it, or ``dyn`` that cel-go infers too (an attribute value, ``dyn(x)``); else None."""
    full = _full_type(node)
    if DYN not in full or node.full is not None or node.type in _DEVICE_FULL:
        return full
    return None


def _literal_full(kind: str, *parts: list[Node]) -> str | None:
    """The full type of a list literal (``kind`` ``list``, its elements) or map literal
    (``map``, its keys and values), as cel-go infers it; None when an element's type is not
    known here (``list(dyn)`` would then claim an exact ``dyn`` cel-go may not infer)."""
    if any(not nodes for nodes in parts):
        return None  # cel-go types ``[]`` and ``{}`` with a free type parameter
    if any(_known_full_type(n) is None for nodes in parts for n in nodes):
        return None
    return f"{kind}({', '.join(_common_type(nodes) for nodes in parts)})"


def _common_type(nodes: list[Node]) -> str:
    """The full type shared by ``nodes``; ``dyn`` when they differ or there are none."""
    types = {_full_type(n) for n in nodes}
    return types.pop() if len(types) == 1 else DYN


def _known_key_type(container: Node) -> str | None:
    """The element type of a list literal, or the key type of a map literal, when fully known
    (no ``dyn`` in it), else None."""
    full = container.full
    if full is None or DYN in full:
        return None
    if full.startswith("list("):
        return full[len("list(") : -1]
    if full.startswith("map("):
        return _split_type_arguments(full[len("map(") : -1])[0]
    return None


def _parts_of_full(container: str | None) -> tuple[str | None, str | None]:
    """(key, element) full types of a list (``int``, E) or map (K, V) whose full type is
    ``container`` when known; (None, None) otherwise."""
    if container is None:
        return None, None
    if container.startswith("list("):
        return "int", container[len("list(") : -1]
    if container.startswith("map("):
        key, value = _split_type_arguments(container[len("map(") : -1])
        return key, value
    return None, None


def _static_of_full(full: str) -> tuple[str, str | None]:
    """The static type and full type of a value whose full CEL type is ``full``: a scalar or
    exactly ``dyn`` as such, a list or map with its full type, anything else unknown."""
    if full == DYN or full in _SCALARS:
        return full, full
    if full.startswith("list("):
        return "list", full
    if full.startswith("map("):
        return "map", full
    return DYN, None


def _key_of(container: Node) -> str | None:
    """The index type ``container`` takes when statically known: ``int`` for a list, the key
    type of a map literal without ``dyn``, ``string`` for the device's maps."""
    if container.type == "list":
        return "int"
    if container.type in (ATTRIBUTES, CAPACITY, ATTRIBUTE_DOMAIN, CAPACITY_DOMAIN):
        return "string"
    key = _parts_of_full(container.full)[0] if container.type == "map" else None
    return None if key is None or DYN in key else key


#: Static types whose full CEL type is their name.
_SCALARS = frozenset({"int", "uint", "double", "bool", "string", "bytes"})


def _element_of_full(container: str | None) -> tuple[str, str | None]:
    """The static type and full type of the elements of a list whose full type is
    ``container`` (``list(int)`` -> ``('int', 'int')``, ``list(dyn)`` -> ``('dyn', 'dyn')``:
    exactly ``dyn``, as cel-go infers it); ``(dyn, None)`` (unknown) when not known."""
    if container is None or not container.startswith("list("):
        return DYN, None
    element = container[len("list(") : -1]
    if element == DYN or element in _SCALARS:
        return element, element
    return DYN, None


def _split_type_arguments(arguments: str) -> list[str]:
    """``'string, list(int)'`` -> ``['string', 'list(int)']`` (top-level commas only)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(arguments):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(arguments[start:i].strip())
            start = i + 1
    parts.append(arguments[start:].strip())
    return parts


def _membership_set(container: Node) -> frozenset[tuple[Any, ...]] | None:
    """cel-go's planner turns ``x in [constants]`` into a hash-set test when every element is
    a bool, int, uint, double or string: the set holds each element with its lossless
    conversions to the other numeric types (a double's to int and uint only when exact, an
    int's or uint's to double always), and ``x`` is looked up by type and value
    (:func:`key_identity`), so ``dyn(9223372036854775807) in [9223372036854775807.0]`` is
    false. None when the planner keeps the list (not a literal of such constants)."""
    if container.type != "list":
        return None
    planned = container.planned
    if planned is None:
        return None
    members: set[tuple[Any, ...]] = set()
    for element in planned[0]:
        if not isinstance(element, bool | int | float | str):
            return None
        members.add(key_identity(element))
        if isinstance(element, bool | str):
            continue
        if isinstance(element, float):
            if element == element and element.is_integer():
                if -(2.0**63) < element < 2.0**63:  # cel-go refuses both bounds
                    members.add(("int", int(element)))
                if 0 <= element < 2.0**64:
                    members.add(("uint", int(element)))
            continue
        members.add(("double", float(element)))
        if isinstance(element, UInt):
            if element <= INT64_MAX:
                members.add(("int", int(element)))
        elif element >= 0:
            members.add(("uint", int(element)))
    return frozenset(members)


def _known_element_type(node: Node) -> str | None:
    """The element type of a list literal when fully known (no ``dyn`` in it), else None."""
    full = node.full
    if full is None or not full.startswith("list(") or DYN in full:
        return None
    return full[len("list(") : -1]


def _cel_name(type_: str) -> str:
    """The CEL name of a static type, as cel-go's messages print it."""
    return _CEL_NAMES.get(type_, type_)


_CEL_NAMES = {
    "Quantity": "kubernetes.Quantity",
    "Semver": "kubernetes.Semver",
    "null": "null_type",
    "optional": "optional_type",
}


def _plain(type_: str) -> str:
    if type_ in (ATTRIBUTES, CAPACITY, ATTRIBUTE_DOMAIN, CAPACITY_DOMAIN):
        return "map"
    if type_ == DEVICE:
        return DYN
    return type_


def _checked(type_: str) -> str:
    """The static type an overload check sees: :func:`_plain`, except that ``device`` is a
    type of its own (cel-go's ``kubernetes.DRADevice``), which no function argument takes."""
    return DEVICE if type_ == DEVICE else _plain(type_)


def _key_type(container: str) -> str:
    return {ATTRIBUTES: "string", CAPACITY: "string", ATTRIBUTE_DOMAIN: "string"}.get(
        container, "string" if container == CAPACITY_DOMAIN else DYN
    )


def _element_type(container: str) -> str:
    return {
        ATTRIBUTES: ATTRIBUTE_DOMAIN,
        CAPACITY: CAPACITY_DOMAIN,
        CAPACITY_DOMAIN: "Quantity",
    }.get(container, DYN)


def _unwrap(tree: lark.Tree[Any]) -> lark.Tree[Any]:
    """Descend through single-child precedence levels to the node that does the work."""
    while (
        isinstance(tree, lark.Tree)
        and len(tree.children) == 1
        and isinstance(tree.children[0], lark.Tree)
        and tree.data
        in (
            "expr",
            "conditionalor",
            "conditionaland",
            "relation",
            "addition",
            "multiplication",
            "unary",
            "member",
            "primary",
            "paren_expr",
        )
    ):
        tree = tree.children[0]
    return tree


def _dotted_name(tree: lark.Tree[Any]) -> str | None:
    """``a.b.c`` for a chain of plain field selections on an identifier, else None."""
    node = _unwrap(tree)
    if isinstance(node, lark.Tree) and node.data == "member_dot":
        token = cast(lark.Token, node.children[1])
        base = _dotted_name(node.children[0])
        if base is None or token.type != "IDENT":
            return None
        return f"{base}.{token}"
    return _ident_name(node)


def _ident_name(tree: lark.Tree[Any]) -> str | None:
    node = _unwrap(tree)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _no_overload(name: str, receiver: Node | None, args: list[Node]) -> str:
    """cel-go's compile error for a call that no overload of ``name`` accepts (here: a wrong
    number of arguments), with the static types: ``'string.(string, string)'`` for a method,
    ``'(string, int)'`` for a global function."""
    types = f"({', '.join(_plain(a.type) for a in args)})"
    shown = types if receiver is None else f"{_plain(receiver.type)}.{types}"
    return f"found no matching overload for '{name}' applied to '{shown}'"
