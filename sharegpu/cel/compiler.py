"""Compile a CEL expression into a tree of Python closures.

cel-python parses the expression (its Lark grammar gives positions for errors); this module
turns the parse tree into nested closures once, so that evaluating a selector against a
device is a handful of Python calls instead of a tree walk per evaluation. Alongside, it
infers a coarse static type per node and rejects what Kubernetes' type checker rejects
cheaply: undeclared variables, unknown fields of ``device``, unknown functions, wrong
argument counts, operands of clearly mismatched types and a non-bool result.

Runtime errors are raised as :class:`CelEvalError`; ``||``, ``&&`` and the ``all``/``exists``
macros absorb them where the CEL specification says so (``true || error`` is ``true``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import lark
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import celbytes, celstr

from .errors import CelCompileError, CelEvalError
from .library import GLOBAL_FUNCTIONS, METHODS
from .values import (
    UInt,
    cel_add,
    cel_compare,
    cel_div,
    cel_eq,
    cel_in,
    cel_index,
    cel_mod,
    cel_mul,
    cel_neg,
    cel_not,
    cel_select,
    cel_sub,
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
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

_GLOBAL_RESULT = {
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
    "semver": "Semver",
    "isSemver": "bool",
}
_METHOD_RESULT = {
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
    "find": "string",
    "findAll": "list",
    "isSorted": "bool",
    "isInteger": "bool",
    "asInteger": "int",
    "asApproximateFloat": "double",
    "sign": "int",
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
_METHOD_RECEIVERS = {
    "isInteger": {"Quantity"},
    "asInteger": {"Quantity"},
    "asApproximateFloat": {"Quantity"},
    "sign": {"Quantity"},
    "add": {"Quantity"},
    "sub": {"Quantity"},
    "major": {"Semver"},
    "minor": {"Semver"},
    "patch": {"Semver"},
    "compareTo": {"Quantity", "Semver"},
    "isGreaterThan": {"Quantity", "Semver"},
    "isLessThan": {"Quantity", "Semver"},
    "startsWith": {"string"},
    "endsWith": {"string"},
    "contains": {"string"},
    "lowerAscii": {"string"},
    "upperAscii": {"string"},
}

_PARSER: CELParser | None = None


def parse(expression: str) -> lark.Tree[Any]:
    """Parse with cel-python's grammar; :class:`CelCompileError` with the position on failure."""
    global _PARSER
    if _PARSER is None:
        _PARSER = CELParser()
    try:
        return _PARSER.parse(expression)
    except CELParseError as exc:
        first = str(exc.args[0]).strip().splitlines()
        message = "syntax error" + (f" near {first[0].strip()!r}" if first else "")
        raise CelCompileError(expression, message, exc.line, exc.column) from None
    except lark.exceptions.LarkError as exc:
        raise CelCompileError(expression, f"syntax error: {exc}") from None


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
    time, its constant value or the (kind, domain) of an attribute/capacity domain map."""

    __slots__ = ("const", "domain", "fn", "type")

    def __init__(
        self, fn: Eval, type_: str, const: Any = None, domain: tuple[str, str] | None = None
    ) -> None:
        self.fn = fn
        self.type = type_
        self.const = const
        self.domain = domain


def compile_tree(
    expression: str, tree: lark.Tree[Any], variables: Mapping[str, str]
) -> tuple[Node, list[Reference]]:
    """Compile a parse tree; ``variables`` maps the declared variable names to static types.

    Returns the root node and the attributes and capacities the expression names.
    """
    compiler = _Compiler(expression, dict(variables))
    root = compiler.node(tree)
    return root, compiler.references


def _logical_type_check(c: _Compiler, op: str, tree: lark.Tree[Any], *nodes: Node) -> None:
    for n in nodes:
        if n.type not in ("bool", DYN):
            c.fail(tree, f"found no matching overload for '{op}' applied to '{n.type}'")


class _Compiler:
    def __init__(self, expression: str, scope: dict[str, str]) -> None:
        self.expression = expression
        self.scope = scope
        self.references: list[Reference] = []

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
        result = handler(tree)
        return result

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
        return Node(ternary, same)

    def _conditionalor(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        left, right = self.node(tree.children[0]), self.node(tree.children[1])
        _logical_type_check(self, "_||_", tree, left, right)
        return Node(_logical(left.fn, right.fn, True, "_||_"), "bool")

    def _conditionaland(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        left, right = self.node(tree.children[0]), self.node(tree.children[1])
        _logical_type_check(self, "_&&_", tree, left, right)
        return Node(_logical(left.fn, right.fn, False, "_&&_"), "bool")

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
        lt, rt = _plain(left.type), _plain(right.type)
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
        mismatch = f"found no matching overload for '{symbol}' applied to '({lt}, {rt})'"
        if op in ("relation_eq", "relation_ne"):
            if known and lt != rt and not ({lt, rt} <= _NUMERIC) and "null" not in (lt, rt):
                self.fail(tree, mismatch)
            if op == "relation_eq":
                return Node(lambda env: cel_eq(lf(env), rf(env)), "bool")
            return Node(lambda env: not cel_eq(lf(env), rf(env)), "bool")
        if op == "relation_in":
            if rt not in (DYN, "list", "map"):
                self.fail(tree, mismatch)
            if isinstance(left.const, str):
                self.refer(right, left.const, True, tree)
            return Node(lambda env: cel_in(lf(env), rf(env)), "bool")
        if known and (
            lt not in _ORDERED or rt not in _ORDERED or (lt != rt and not ({lt, rt} <= _NUMERIC))
        ):
            self.fail(tree, mismatch)
        test: Callable[[int], bool] = {
            "relation_lt": lambda c: c < 0,
            "relation_le": lambda c: c <= 0,
            "relation_gt": lambda c: c > 0,
            "relation_ge": lambda c: c >= 0,
        }[op]
        return Node(lambda env: test(cel_compare(symbol, lf(env), rf(env))), "bool")

    def _arith(
        self, tree: lark.Tree[Any], table: dict[str, tuple[str, Callable[..., Any]]]
    ) -> Node:
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        op, left, right = self._binary(tree)
        symbol, impl = table[op]
        lt, rt = _plain(left.type), _plain(right.type)
        if lt != DYN and rt != DYN and lt != rt:
            self.fail(tree, f"found no matching overload for '{symbol}' applied to '({lt}, {rt})'")
        if lt in ("Quantity", "Semver", "bool", "map", "null"):
            self.fail(tree, f"found no matching overload for '{symbol}' applied to '({lt}, {rt})'")
        lf, rf = left.fn, right.fn
        return Node(lambda env: impl(lf(env), rf(env)), lt if lt != DYN else rt)

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
        if len(tree.children) == 1:
            return self.node(tree.children[0])
        op_tree, operand_tree = tree.children
        operand = self.node(operand_tree)
        f = operand.fn
        if op_tree.data == "unary_not":
            _logical_type_check(self, "!_", tree, operand)
            return Node(lambda env: cel_not(f(env)), "bool")
        return Node(lambda env: cel_neg(f(env)), operand.type)

    # --- members -----------------------------------------------------------------------

    def _member(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _primary(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _paren_expr(self, tree: lark.Tree[Any]) -> Node:
        return self.node(tree.children[0])

    def _member_dot(self, tree: lark.Tree[Any]) -> Node:
        member_tree, field_token = tree.children
        field = str(field_token)
        member = self.node(member_tree)
        f = member.fn
        if member.type == DEVICE:
            if field not in DEVICE_FIELDS:
                self.fail(
                    field_token,
                    f"undefined field '{field}' (device has: {', '.join(DEVICE_FIELDS)})",
                )
            return Node(lambda env: f(env)[field], DEVICE_FIELDS[field])
        if member.type in _ORDERED or member.type in ("list", "Quantity", "Semver", "null"):
            self.fail(field_token, f"type '{member.type}' does not support field selection")
        self.refer(member, field, False, field_token)
        return Node(lambda env: cel_select(f(env), field), _element_type(member.type))

    def _member_index(self, tree: lark.Tree[Any]) -> Node:
        member = self.node(tree.children[0])
        index = self.node(tree.children[1])
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
        return Node(
            lambda env: cel_index(mf(env), xf(env)), _element_type(member.type), domain=domain
        )

    def _member_object(self, tree: lark.Tree[Any]) -> Node:
        self.fail(tree, "message construction is not supported in DRA selectors")
        raise AssertionError

    def _member_dot_arg(self, tree: lark.Tree[Any]) -> Node:
        member_tree, name_token = tree.children[0], tree.children[1]
        args_tree = tree.children[2] if len(tree.children) > 2 else None
        name = str(name_token)
        if name == "bind" and _ident_name(member_tree) == "cel" and "cel" not in self.scope:
            return self._bind(tree, args_tree)
        if name in _MACROS:
            return self._macro(tree, name, member_tree, args_tree)
        function = METHODS.get(name)
        if function is None:
            self.fail(name_token, f"undeclared reference to '{name}'")
            raise AssertionError
        receiver = self.node(member_tree)
        args = self.exprlist(args_tree)
        if len(args) not in function.arities:
            self.fail(
                name_token,
                f"'{name}' takes {_arity_text(function.arities)} argument(s), got {len(args)}",
            )
        allowed = _METHOD_RECEIVERS.get(name)
        rtype = _plain(receiver.type)
        if allowed is not None and rtype != DYN and rtype not in allowed:
            self.fail(name_token, f"found no matching overload for '{name}' applied to '{rtype}'")
        impl, rf = function.impl, receiver.fn
        result_type = _METHOD_RESULT.get(name, DYN)
        if not args:
            return Node(lambda env: _call(name, impl, rf(env)), result_type)
        if len(args) == 1:
            af = args[0].fn
            return Node(lambda env: _call(name, impl, rf(env), af(env)), result_type)
        fns = [a.fn for a in args]
        return Node(lambda env: _call(name, impl, rf(env), *(g(env) for g in fns)), result_type)

    def _dot_ident_arg(self, tree: lark.Tree[Any]) -> Node:
        return self._ident_arg(tree)

    def _ident_arg(self, tree: lark.Tree[Any]) -> Node:
        name_token = tree.children[0]
        name = str(name_token)
        args_tree = tree.children[1] if len(tree.children) > 1 else None
        if name == "has":
            return self._has(tree, args_tree)
        function = GLOBAL_FUNCTIONS.get(name)
        if function is None:
            self.fail(name_token, f"undeclared reference to '{name}'")
            raise AssertionError
        args = self.exprlist(args_tree)
        if len(args) not in function.arities:
            self.fail(
                name_token,
                f"'{name}' takes {_arity_text(function.arities)} argument(s), got {len(args)}",
            )
        impl = function.impl
        result_type = args[0].type if name == "dyn" else _GLOBAL_RESULT.get(name, DYN)
        if name == "dyn":
            result_type = DYN
        fns = [a.fn for a in args]
        if len(fns) == 1:
            af = fns[0]
            return Node(lambda env: _call(name, impl, af(env)), result_type)
        return Node(lambda env: _call(name, impl, *(g(env) for g in fns)), result_type)

    def _dot_ident(self, tree: lark.Tree[Any]) -> Node:
        return self._ident(tree)

    def _ident(self, tree: lark.Tree[Any]) -> Node:
        token = tree.children[0]
        name = str(token)
        if name not in self.scope:
            self.fail(token, f"undeclared reference to '{name}'")
        return Node(lambda env: env[name], self.scope[name])

    # --- literals ------------------------------------------------------------------------

    def _literal(self, tree: lark.Tree[Any]) -> Node:
        token = cast(lark.Token, tree.children[0])
        kind = token.type
        value: Any
        try:
            if kind == "INT_LIT":
                value = int(token.value, 0) if "x" in token.value else int(token.value)
                type_ = "int"
            elif kind == "UINT_LIT":
                text = token.value[:-1]
                value = UInt(int(text, 0) if "x" in text else int(text))
                type_ = "uint"
            elif kind == "FLOAT_LIT":
                value, type_ = float(token.value), "double"
            elif kind in ("STRING_LIT", "MLSTRING_LIT"):
                value, type_ = str(celstr(token)), "string"
            elif kind == "BYTES_LIT":
                value, type_ = bytes(celbytes(token)), "bytes"
            elif kind == "BOOL_LIT":
                value, type_ = token.value == "true", "bool"
            else:
                value, type_ = None, "null"
        except ValueError as exc:
            self.fail(token, f"invalid literal {token.value!r}: {exc}")
        return Node(lambda env: value, type_, const=value)

    def _list_lit(self, tree: lark.Tree[Any]) -> Node:
        items = self.exprlist(tree.children[0] if tree.children else None)
        fns = [i.fn for i in items]
        return Node(lambda env: [g(env) for g in fns], "list")

    def _map_lit(self, tree: lark.Tree[Any]) -> Node:
        inits = self.exprlist(tree.children[0] if tree.children else None)
        pairs = [(inits[i].fn, inits[i + 1].fn) for i in range(0, len(inits), 2)]

        def build(env: Env) -> dict[Any, Any]:
            result: dict[Any, Any] = {}
            for kf, vf in pairs:
                key = kf(env)
                if not isinstance(key, str | int | bool):
                    raise CelEvalError(f"unsupported map key type: {type_name(key)}")
                if key in result:
                    raise CelEvalError(f"repeated key in map literal: {key}")
                result[key] = vf(env)
            return result

        return Node(build, "map")

    def _exprlist(self, tree: lark.Tree[Any]) -> Node:
        self.fail(tree, "unexpected expression list")
        raise AssertionError

    # --- macros --------------------------------------------------------------------------

    def _has(self, tree: lark.Tree[Any], args_tree: lark.Tree[Any] | None) -> Node:
        args = args_tree.children if args_tree is not None else []
        target = _unwrap(args[0]) if len(args) == 1 else None
        if target is None or target.data != "member_dot":
            self.fail(tree, "invalid argument to has() macro: expects a field selection")
            raise AssertionError
        member = self.node(target.children[0])
        field = str(target.children[1])
        if member.type == DEVICE and field not in DEVICE_FIELDS:
            self.fail(target.children[1], f"undefined field '{field}'")
        self.refer(member, field, True, target.children[1])
        f = member.fn

        def has(env: Env) -> bool:
            value = f(env)
            if isinstance(value, Mapping):
                return field in value
            raise CelEvalError(f"invalid type for has(): {type_name(value)}")

        return Node(has, "bool")

    def _bound(self, var_tree: lark.Tree[Any], body_tree: lark.Tree[Any], var_type: str) -> Node:
        name = _ident_name(var_tree)
        if name is None:
            self.fail(var_tree, "the variable of a macro must be a simple identifier")
            raise AssertionError
        saved = self.scope.get(name)
        self.scope[name] = var_type
        try:
            return self.node(body_tree)
        finally:
            if saved is None:
                del self.scope[name]
            else:
                self.scope[name] = saved

    def _bind(self, tree: lark.Tree[Any], args_tree: lark.Tree[Any] | None) -> Node:
        args = args_tree.children if args_tree is not None else []
        if len(args) != 3:
            self.fail(tree, "cel.bind() takes 3 arguments: variable, value, expression")
        init = self.node(args[1])
        body = self._bound(args[0], args[2], init.type)
        name = _ident_name(args[0])
        assert name is not None
        initf, bodyf = init.fn, body.fn
        return Node(lambda env: bodyf({**env, name: initf(env)}), body.type)

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
        element = _element_type(target.type) if target.type == "list" else DYN
        bodies = [self._bound(args[0], a, element) for a in args[1:]]
        assert var is not None
        for b in bodies[:1] if name != "map" or len(bodies) == 2 else []:
            _logical_type_check(self, name, tree, b)

        def items(env: Env) -> Iterable[Any]:
            value = tf(env)
            if isinstance(value, Mapping | list | tuple):
                return list(value)
            raise no_overload(name, value)

        if name in ("all", "exists"):
            pf = bodies[0].fn
            stop = name == "exists"
            stop_result: bool = stop

            def quantifier(env: Env) -> bool:
                error: CelEvalError | None = None
                for item in items(env):
                    try:
                        r = pf({**env, var: item})
                    except CelEvalError as exc:
                        error = error or exc
                        continue
                    if r is stop:
                        return stop_result
                    if not isinstance(r, bool):
                        error = error or no_overload(name, r)
                if error is not None:
                    raise error
                return not stop

            return Node(quantifier, "bool")
        if name == "exists_one":
            pf = bodies[0].fn

            def exists_one(env: Env) -> bool:
                count = 0
                for item in items(env):
                    r = pf({**env, var: item})
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    count += r
                return count == 1

            return Node(exists_one, "bool")
        if name == "filter":
            pf = bodies[0].fn

            def filter_(env: Env) -> list[Any]:
                out = []
                for item in items(env):
                    r = pf({**env, var: item})
                    if not isinstance(r, bool):
                        raise no_overload(name, r)
                    if r:
                        out.append(item)
                return out

            return Node(filter_, "list")
        if len(bodies) == 1:
            mf = bodies[0].fn
            return Node(lambda env: [mf({**env, var: i}) for i in items(env)], "list")
        pf, mf = bodies[0].fn, bodies[1].fn

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

        return Node(map_filter, "list")


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


def _plain(type_: str) -> str:
    if type_ in (ATTRIBUTES, CAPACITY, ATTRIBUTE_DOMAIN, CAPACITY_DOMAIN):
        return "map"
    if type_ == DEVICE:
        return DYN
    return type_


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


def _ident_name(tree: lark.Tree[Any]) -> str | None:
    node = _unwrap(tree)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _arity_text(arities: frozenset[int]) -> str:
    return " or ".join(str(a) for a in sorted(arities))
