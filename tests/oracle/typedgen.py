"""A type-directed generator of DRA selector cases, independent of ``celgen``'s grammar.

It builds expressions from a table of the environment's operators and functions
(:data:`OPERATIONS`): each case picks operations and, for each operand, a *type tag* of
:data:`TAGS`: the operand type of one of the operation's declared overloads (well-typed), any
other tag (ill-typed), or ``dyn`` (a value whose static type is unknown: an attribute of the
device or ``dyn(...)``, holding a value of any tag at run time). An operand of a tag is built
recursively from the well-typed overloads whose result has that tag (:data:`SIGNATURES`), down to
literals, the device's attributes and capacities. The result is wrapped into a bool where it is
none (``type(e) == t`` or ``e == e``).

Coverage is counted as operation by operand-tag combinations: every combination of the first two
operands' tags of each operation (later operands are drawn well-typed and not counted), so the
universe is :func:`universe` and a batch reports how much of it its cases reached
(:func:`coverage`). Each case lists the combinations it reached under ``overloads``.

The random choices come from one integer drawn by Hypothesis per case, so a case is a pure
function of its seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st

from .celgen import DRIVER, K8S, devices

#: Operand type tags. ``dyn`` stands for any static type unknown to the checker.
TAGS: Final = (
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "null",
    "list",
    "map",
    "quantity",
    "semver",
    "optional",
    "dyn",
)
_VALUE_TAGS: Final = TAGS[:-1]
#: How many operands of an operation vary over every tag (the others are drawn well-typed).
COUNTED_OPERANDS: Final = 2
MAX_DEPTH: Final = 3

_A = f"device.attributes['{DRIVER}']"
_K = f"device.attributes['{K8S}']"
_C = f"device.capacity['{DRIVER}']"

#: Leaves of each tag: literals and device fields whose static type is the tag.
LEAVES: Final[dict[str, tuple[str, ...]]] = {
    "int": ("0", "1", "-7", "42", "9223372036854775807", "-9223372036854775808"),
    "uint": ("0u", "1u", "7u", "18446744073709551615u"),
    "double": ("0.0", "-0.5", "1.0", "2.5e3", "double('NaN')", "double('inf')", "-1e308"),
    "string": ("''", "'a'", "'A100'", "'1.2.3'", "'1Gi'", "'b'", "device.driver", "'true'"),
    "bool": ("true", "false", "device.allowMultipleAllocations"),
    "bytes": ("b''", "b'ab'", "b'\\xff'"),
    "null": ("null",),
    "list": (
        "[]",
        "[1, 2]",
        "[3, 1, 2]",
        "['b', 'a']",
        "[1.0, 2.5]",
        "[1u, 2u]",
        "[true, false]",
        "[quantity('1'), quantity('2Gi')]",
        "[semver('1.0.0'), semver('0.9.0')]",
        "[[1], [2, 3]]",
        "[dyn(1), dyn('a')]",
        "[null]",
    ),
    "map": (
        "{}",
        "{'a': 1}",
        "{1: 'a'}",
        "{'a': 'b', 'c': 'd'}",
        "{true: 1}",
        "device.attributes",
        "device.capacity",
        _A,
        _C,
    ),
    "quantity": ("quantity('1Gi')", "quantity('1500m')", "quantity('0')", f"{_C}.memory"),
    "semver": ("semver('1.2.3')", "semver('1.0.0-rc.1')", "semver('0.0.1')"),
    "optional": (
        "optional.of(1)",
        "optional.of('a')",
        "optional.none()",
        f"{_A}.?model",
        f"{_A}.?index",
        f"{_C}.?memory",
        f"{_C}.?nosuch",
        f"device.attributes[?'{DRIVER}']",
        "optional.ofNonZeroValue('')",
    ),
    "dyn": (
        f"{_A}.model",
        f"{_A}.index",
        f"{_A}.mig",
        f"{_A}.driverVersion",
        f"{_K}.pcieRoot",
        f"{_K}.numaNode",
        f"{_A}['model']",
    ),
}

#: Field names for selection, reserved words of CEL among them.
FIELD_NAMES: Final = (
    "model",
    "index",
    "memory",
    "nosuch",
    "driver",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
    "in",
    "null",
    "true",
)

_TYPE_NAMES: Final = {
    "int": "int",
    "uint": "uint",
    "double": "double",
    "string": "string",
    "bool": "bool",
    "bytes": "bytes",
    "null": "null_type",
    "list": "list",
    "map": "map",
    "quantity": "type(quantity('0'))",
    "semver": "type(semver('0.0.0'))",
    "optional": "type(optional.none())",
}


@dataclass(frozen=True)
class Operation:
    """An operator or function: its name for coverage, how many operands it takes (receiver
    first for a method) and how its text is written from the operands' texts."""

    name: str
    operands: int
    render: Callable[[list[str]], str]


def _binary(symbol: str) -> Operation:
    return Operation(f"_{symbol}_", 2, lambda a: f"({a[0]} {symbol} {a[1]})")


def _method(name: str, operands: int) -> Operation:
    def render(a: list[str]) -> str:
        return f"{a[0]}.{name}({', '.join(a[1:])})"

    return Operation(f"{name}/{operands}", operands, render)


def _global(name: str, operands: int) -> Operation:
    return Operation(f"{name}()/{operands}", operands, lambda a: f"{name}({', '.join(a)})")


_METHODS: Final = (
    ("size", 1),
    ("contains", 2),
    ("startsWith", 2),
    ("endsWith", 2),
    ("matches", 2),
    ("charAt", 2),
    ("indexOf", 2),
    ("indexOf", 3),
    ("lastIndexOf", 2),
    ("lowerAscii", 1),
    ("upperAscii", 1),
    ("replace", 3),
    ("split", 2),
    ("substring", 2),
    ("substring", 3),
    ("trim", 1),
    ("join", 1),
    ("join", 2),
    ("format", 2),
    ("find", 2),
    ("findAll", 2),
    ("isSorted", 1),
    ("sum", 1),
    ("min", 1),
    ("max", 1),
    ("slice", 3),
    ("flatten", 1),
    ("distinct", 1),
    ("reverse", 1),
    ("sort", 1),
    ("isInteger", 1),
    ("asInteger", 1),
    ("asApproximateFloat", 1),
    ("add", 2),
    ("sub", 2),
    ("major", 1),
    ("minor", 1),
    ("patch", 1),
    ("compareTo", 2),
    ("isGreaterThan", 2),
    ("isLessThan", 2),
    ("hasValue", 1),
    ("value", 1),
    ("orValue", 2),
    ("or", 2),
)
_GLOBALS: Final = (
    ("size", 1),
    ("int", 1),
    ("uint", 1),
    ("double", 1),
    ("string", 1),
    ("bool", 1),
    ("bytes", 1),
    ("dyn", 1),
    ("type", 1),
    ("matches", 2),
    ("quantity", 1),
    ("isQuantity", 1),
    ("sign", 1),
    ("semver", 1),
    ("semver", 2),
    ("isSemver", 1),
    ("isSemver", 2),
    ("sets.contains", 2),
    ("sets.equivalent", 2),
    ("sets.intersects", 2),
    ("lists.range", 1),
    ("strings.quote", 1),
    ("optional.of", 1),
    ("optional.ofNonZeroValue", 1),
)

#: Every operation the generator covers.
OPERATIONS: Final[tuple[Operation, ...]] = (
    *(_binary(s) for s in ("==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "in")),
    *(_binary(s) for s in ("&&", "||")),
    Operation("!_", 1, lambda a: f"!{a[0]}"),
    Operation("-_", 1, lambda a: f"-{a[0]}"),
    Operation("!!_", 1, lambda a: f"!!{a[0]}"),
    Operation("--_", 1, lambda a: f"--{a[0]}"),
    Operation("_?_:_", 3, lambda a: f"({a[0]} ? {a[1]} : {a[2]})"),
    Operation("_[_]", 2, lambda a: f"{a[0]}[{a[1]}]"),
    Operation("_[?_]", 2, lambda a: f"{a[0]}[?{a[1]}]"),
    Operation("[_,_]", 2, lambda a: f"[{a[0]}, {a[1]}]"),
    Operation("[?_,_]", 2, lambda a: f"[?{a[0]}, {a[1]}]"),
    Operation("{_:_}", 2, lambda a: f"{{{a[0]}: {a[1]}}}"),
    Operation("_.f", 1, lambda a: f"{a[0]}.{{field}}"),
    Operation("_.?f", 1, lambda a: f"{a[0]}.?{{field}}"),
    Operation("has(_.f)", 1, lambda a: f"has({a[0]}.{{field}})"),
    Operation("all", 1, lambda a: f"{a[0]}.all(x, x == x)"),
    Operation("exists", 1, lambda a: f"{a[0]}.exists(x, type(x) == int)"),
    Operation("map", 1, lambda a: f"{a[0]}.map(x, [x])"),
    Operation("filter", 1, lambda a: f"{a[0]}.filter(x, true)"),
    Operation("cel.bind", 2, lambda a: f"cel.bind(v, {a[0]}, [v, {a[1]}])"),
    *(_method(name, n) for name, n in _METHODS),
    *(_global(name, n) for name, n in _GLOBALS),
)
_BY_NAME: Final = {op.name: op for op in OPERATIONS}

#: Well-typed overloads: operation name -> [(operand tags, result tag)]. Operations absent here
#: have no overload the generator knows; their operands are drawn from every tag.
SIGNATURES: Final[dict[str, list[tuple[tuple[str, ...], str]]]] = {
    "_+_": [((t, t), t) for t in ("int", "uint", "double", "string", "bytes", "list")],
    "_-_": [((t, t), t) for t in ("int", "uint", "double")],
    "_*_": [((t, t), t) for t in ("int", "uint", "double")],
    "_/_": [((t, t), t) for t in ("int", "uint", "double")],
    "_%_": [((t, t), t) for t in ("int", "uint")],
    **{op: [((t, t), "bool") for t in _VALUE_TAGS] for op in ("_==_", "_!=_")},
    **{
        op: [((t, t), "bool") for t in ("int", "uint", "double", "string", "bytes", "bool")]
        for op in ("_<_", "_<=_", "_>_", "_>=_")
    },
    "_in_": [(("int", "list"), "bool"), (("string", "map"), "bool"), (("string", "list"), "bool")],
    "_&&_": [(("bool", "bool"), "bool")],
    "_||_": [(("bool", "bool"), "bool")],
    "!_": [(("bool",), "bool")],
    "!!_": [(("bool",), "bool")],
    "-_": [(("int",), "int"), (("double",), "double")],
    "--_": [(("int",), "int"), (("double",), "double")],
    "_?_:_": [(("bool", t, t), t) for t in _VALUE_TAGS],
    "_[_]": [(("list", "int"), "dyn"), (("map", "string"), "dyn")],
    "_[?_]": [(("map", "string"), "optional"), (("list", "int"), "optional")],
    "[_,_]": [((t, t), "list") for t in _VALUE_TAGS],
    "[?_,_]": [(("optional", t), "list") for t in _VALUE_TAGS],
    "{_:_}": [((k, v), "map") for k in ("string", "int", "bool", "uint") for v in _VALUE_TAGS],
    "_.f": [(("map",), "dyn")],
    "_.?f": [(("map",), "optional")],
    "has(_.f)": [(("map",), "bool")],
    "all": [(("list",), "bool"), (("map",), "bool")],
    "exists": [(("list",), "bool"), (("map",), "bool")],
    "map": [(("list",), "list")],
    "filter": [(("list",), "list")],
    "cel.bind": [((t, t), "list") for t in _VALUE_TAGS],
    "size/1": [((t,), "int") for t in ("string", "bytes", "list", "map")],
    "contains/2": [(("string", "string"), "bool")],
    "startsWith/2": [(("string", "string"), "bool")],
    "endsWith/2": [(("string", "string"), "bool")],
    "matches/2": [(("string", "string"), "bool")],
    "charAt/2": [(("string", "int"), "string")],
    "indexOf/2": [(("string", "string"), "int"), (("list", "int"), "int")],
    "indexOf/3": [(("string", "string", "int"), "int")],
    "lastIndexOf/2": [(("string", "string"), "int"), (("list", "int"), "int")],
    "lowerAscii/1": [(("string",), "string")],
    "upperAscii/1": [(("string",), "string")],
    "replace/3": [(("string", "string", "string"), "string")],
    "split/2": [(("string", "string"), "list")],
    "substring/2": [(("string", "int"), "string")],
    "substring/3": [(("string", "int", "int"), "string")],
    "trim/1": [(("string",), "string")],
    "join/1": [(("list",), "string")],
    "join/2": [(("list", "string"), "string")],
    "format/2": [(("string", "list"), "string")],
    "find/2": [(("string", "string"), "string")],
    "findAll/2": [(("string", "string"), "list")],
    "isSorted/1": [(("list",), "bool")],
    "sum/1": [(("list",), "dyn")],
    "min/1": [(("list",), "dyn")],
    "max/1": [(("list",), "dyn")],
    "slice/3": [(("list", "int", "int"), "list")],
    "flatten/1": [(("list",), "list")],
    "distinct/1": [(("list",), "list")],
    "reverse/1": [(("list",), "list")],
    "sort/1": [(("list",), "list")],
    "isInteger/1": [(("quantity",), "bool")],
    "asInteger/1": [(("quantity",), "int")],
    "asApproximateFloat/1": [(("quantity",), "double")],
    "add/2": [(("quantity", "quantity"), "quantity"), (("quantity", "int"), "quantity")],
    "sub/2": [(("quantity", "quantity"), "quantity"), (("quantity", "int"), "quantity")],
    "major/1": [(("semver",), "int")],
    "minor/1": [(("semver",), "int")],
    "patch/1": [(("semver",), "int")],
    "compareTo/2": [(("quantity", "quantity"), "int"), (("semver", "semver"), "int")],
    "isGreaterThan/2": [(("quantity", "quantity"), "bool"), (("semver", "semver"), "bool")],
    "isLessThan/2": [(("quantity", "quantity"), "bool"), (("semver", "semver"), "bool")],
    "hasValue/1": [(("optional",), "bool")],
    "value/1": [(("optional",), "dyn")],
    "orValue/2": [(("optional", t), "dyn") for t in ("int", "string")],
    "or/2": [(("optional", "optional"), "optional")],
    "size()/1": [((t,), "int") for t in ("string", "bytes", "list", "map")],
    "int()/1": [((t,), "int") for t in ("int", "uint", "double", "string")],
    "uint()/1": [((t,), "uint") for t in ("int", "uint", "double", "string")],
    "double()/1": [((t,), "double") for t in ("int", "uint", "double", "string")],
    "string()/1": [((t,), "string") for t in ("int", "uint", "double", "string", "bytes")],
    "bool()/1": [((t,), "bool") for t in ("bool", "string")],
    "bytes()/1": [((t,), "bytes") for t in ("bytes", "string")],
    "dyn()/1": [((t,), "dyn") for t in _VALUE_TAGS],
    "type()/1": [((t,), "type") for t in _VALUE_TAGS],
    "matches()/2": [(("string", "string"), "bool")],
    "quantity()/1": [(("string",), "quantity")],
    "isQuantity()/1": [(("string",), "bool")],
    "sign()/1": [(("quantity",), "int")],
    "semver()/1": [(("string",), "semver")],
    "semver()/2": [(("string", "bool"), "semver")],
    "isSemver()/1": [(("string",), "bool")],
    "isSemver()/2": [(("string", "bool"), "bool")],
    "sets.contains()/2": [(("list", "list"), "bool")],
    "sets.equivalent()/2": [(("list", "list"), "bool")],
    "sets.intersects()/2": [(("list", "list"), "bool")],
    "lists.range()/1": [(("int",), "list")],
    "strings.quote()/1": [(("string",), "string")],
    "optional.of()/1": [((t,), "optional") for t in _VALUE_TAGS],
    "optional.ofNonZeroValue()/1": [((t,), "optional") for t in _VALUE_TAGS],
}

#: Operations that produce each tag when given well-typed operands.
_PRODUCERS: Final[dict[str, list[tuple[str, tuple[str, ...]]]]] = {}
for _name, _sigs in SIGNATURES.items():
    for _args, _result in _sigs:
        _PRODUCERS.setdefault(_result, []).append((_name, _args))


def universe() -> set[str]:
    """Every operation by operand-tag combination the coverage counts."""
    out: set[str] = set()
    for op in OPERATIONS:
        counted = min(op.operands, COUNTED_OPERANDS)
        combos: list[tuple[str, ...]] = [()]
        for _ in range(counted):
            combos = [(*c, t) for c in combos for t in TAGS]
        out.update(combination(op.name, c) for c in combos)
    return out


def combination(name: str, tags: Iterable[str]) -> str:
    """The coverage key of ``name`` applied to operands of these tags (counted ones only)."""
    return f"{name}({','.join(list(tags)[:COUNTED_OPERANDS])})"


def coverage(cases: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(combinations reached by ``cases``, combinations in the universe)."""
    reached: set[str] = set()
    for case in cases:
        reached.update(case.get("overloads") or ())
    whole = universe()
    return len(reached & whole), len(whole)


class _Builder:
    """One expression's construction: the random source and the combinations reached."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.reached: list[str] = []

    def operand_tags(self, op: Operation) -> tuple[str, ...]:
        """Tags for ``op``'s operands: a well-typed overload's, or (counted operands) any
        tag, or ``dyn``."""
        sigs = SIGNATURES.get(op.name) or []
        well = (
            self.rng.choice(sigs)[0]
            if sigs
            else tuple(self.rng.choice(TAGS) for _ in range(op.operands))
        )
        tags = []
        for i, tag in enumerate(well):
            if i < COUNTED_OPERANDS:
                roll = self.rng.random()
                if roll < 0.45:
                    tag = self.rng.choice(TAGS)
                elif roll < 0.6:
                    tag = "dyn"
            tags.append(tag)
        return tuple(tags)

    def apply(self, op: Operation, tags: tuple[str, ...], depth: int) -> str:
        """``op`` applied to fresh operands of ``tags``; records the combination."""
        self.reached.append(combination(op.name, tags))
        text = op.render([self.term(t, depth - 1) for t in tags])
        if "{field}" in text:
            text = text.replace("{field}", self.rng.choice(FIELD_NAMES))
        return text

    def term(self, tag: str, depth: int) -> str:
        """An expression whose static type has ``tag`` (``dyn``: unknown to the checker)."""
        rng = self.rng
        if tag == "dyn":
            roll = rng.random()
            if roll < 0.4:
                return rng.choice(LEAVES["dyn"])
            if roll < 0.5 and depth > 0:
                name, args = rng.choice(_PRODUCERS["dyn"])
                return self.apply(_BY_NAME[name], args, depth)
            return f"dyn({self.term(rng.choice(_VALUE_TAGS), depth - 1)})"
        producers = _PRODUCERS.get(tag) or []
        if depth <= 0 or not producers or rng.random() < 0.45:
            return rng.choice(LEAVES[tag])
        name, args = rng.choice(producers)
        return self.apply(_BY_NAME[name], args, depth)


def _result_tag(op: Operation, tags: tuple[str, ...]) -> str | None:
    for args, result in SIGNATURES.get(op.name) or []:
        if args == tags:
            return result
    return None


def expression(seed: int) -> tuple[str, list[str]]:
    """The selector drawn from ``seed`` and the combinations it reached."""
    rng = random.Random(seed)
    builder = _Builder(rng)
    op = rng.choice(OPERATIONS)
    tags = builder.operand_tags(op)
    body = builder.apply(op, tags, rng.randint(1, MAX_DEPTH))
    result = _result_tag(op, tags)
    if result == "bool" and rng.random() < 0.7:
        text = body
    elif rng.random() < 0.5:
        names = list(_TYPE_NAMES.values())
        known = _TYPE_NAMES.get(result or "")
        name = known if known is not None and rng.random() < 0.7 else rng.choice(names)
        text = f"type({body}) == {name}"
    else:
        text = f"{body} == {body}"
    return text, builder.reached


@st.composite
def typed_cel_cases(draw: st.DrawFn) -> dict[str, Any]:
    """One type-directed CEL case for the oracle (without its id)."""
    seed = draw(st.integers(0, 2**63 - 1))
    text, reached = expression(seed)
    return {
        "kind": "cel",
        "expression": text,
        "driver": DRIVER,
        "device": draw(devices()),
        "overloads": sorted(set(reached)),
    }
