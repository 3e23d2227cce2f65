"""Hypothesis strategies for DRA selector cases: a device as a driver publishes it and a
selector drawn from a grammar of realistic device CEL.

The grammar builds typed terms (bool, int, string, semver, quantity) from the device's
attributes (the standard ``resource.kubernetes.io`` ones included) and capacities, literals,
map literals as lookup tables, the standard and Kubernetes functions (strings, regex with
constant and computed patterns, semver, quantity arithmetic, lists, sets, optionals, macros,
``cel.bind``) and the logical operators; with a small chance
it yields what users get wrong: an attribute the device lacks, a type mismatch, a result that
is no bool, a division by zero, an unknown function or a truncated expression.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from hypothesis import strategies as st

DRIVER: Final = "gpu.example.com"
K8S: Final = "resource.kubernetes.io"
MODELS: Final = ("A100", "H100", "L4", "a100", "")
VERSIONS: Final = ("535.104.5", "550.54.15", "1.2.3-rc.1", "2.0.0+build.5", "0.0.1")
QUANTITIES: Final = (
    "40Gi", "80Gi", "81079Mi", "16G", "1500m", "0", "1", "100", "1k", "2.5",
    "2000m", "1.0", "1.5Gi", "1Ei", "10E",
)  # fmt: skip
PCIE_ROOTS: Final = ("pci0000:00", "pci0000:01")

Strategy = st.SearchStrategy[str]


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- devices ---------------------------------------------------------------------------


@st.composite
def device_attributes(draw: st.DrawFn, absent_one_in: int = 10) -> dict[str, Any]:
    """Attributes of a GPU-like device; each one is absent about once in ``absent_one_in``."""
    attrs: dict[str, Any] = {}

    def maybe(name: str, value: dict[str, Any]) -> None:
        if draw(st.integers(1, absent_one_in)) > 1:
            attrs[name] = value

    maybe("model", {"string": draw(st.sampled_from(MODELS))})
    maybe("uuid", {"string": f"GPU-{draw(st.integers(0, 0xFFFF)):08x}"})
    maybe("index", {"int": draw(st.integers(-1, 7))})
    maybe("mig", {"bool": draw(st.booleans())})
    maybe("driverVersion", {"version": draw(st.sampled_from(VERSIONS))})
    maybe(f"{K8S}/pcieRoot", {"string": draw(st.sampled_from(PCIE_ROOTS))})
    maybe(f"{K8S}/numaNode", {"int": draw(st.integers(0, 1))})
    return attrs


@st.composite
def device_capacity(draw: st.DrawFn) -> dict[str, Any]:
    """Capacities of a GPU-like device; each one may be absent."""
    cap: dict[str, Any] = {}
    if draw(st.integers(0, 9)) > 0:
        memory = ("40Gi", "80Gi", "81079Mi", "16G", "1.5Gi")
        cap["memory"] = {"value": draw(st.sampled_from(memory))}
    if draw(st.integers(0, 9)) > 1:
        cap["cores"] = {"value": draw(st.sampled_from(("100", "50", "1500m", "0", "2000m")))}
    if draw(st.integers(0, 9)) > 6:
        cap["example.com/bandwidth"] = {"value": draw(st.sampled_from(("10G", "100M")))}
    return cap


@st.composite
def devices(draw: st.DrawFn) -> dict[str, Any]:
    """A ResourceSlice device (``spec.devices[]``)."""
    device: dict[str, Any] = {"name": "gpu-0"}
    attrs = draw(device_attributes())
    if attrs:
        device["attributes"] = attrs
    cap = draw(device_capacity())
    if cap:
        device["capacity"] = cap
    multi = draw(st.sampled_from((None, True, False)))
    if multi is not None:
        device["allowMultipleAllocations"] = multi
    return device


# --- the selector grammar ----------------------------------------------------------------

_ATTRS = f"device.attributes[{_quoted(DRIVER)}]"
_K8S_ATTRS = f"device.attributes[{_quoted(K8S)}]"
_CAPS = f"device.capacity[{_quoted(DRIVER)}]"


@cache
def _access(base: str, name: str) -> Strategy:
    return st.sampled_from((f"{base}.{name}", f"{base}[{_quoted(name)}]"))


@cache
def _attr(kind: str) -> Strategy:
    names = {
        "string": [(_ATTRS, "model"), (_ATTRS, "uuid"), (_K8S_ATTRS, "pcieRoot")],
        "int": [(_ATTRS, "index"), (_K8S_ATTRS, "numaNode")],
        "bool": [(_ATTRS, "mig")],
        "version": [(_ATTRS, "driverVersion")],
        "quantity": [
            (_CAPS, "memory"),
            (_CAPS, "cores"),
            ("device.capacity['example.com']", "bandwidth"),
        ],
    }[kind]
    return st.one_of(*(_access(base, name) for base, name in names))


@cache
def string_term(depth: int) -> Strategy:
    """A term of type string."""
    leaves = st.one_of(
        st.sampled_from((*MODELS, "H", "100", "pci0000:00", "GPU-", "gpu.example.com")).map(
            _quoted
        ),
        _attr("string"),
        st.just("device.driver"),
    )
    if depth <= 0:
        return leaves
    sub = string_term(depth - 1)
    return st.one_of(
        leaves,
        sub.map(lambda s: f"{s}.lowerAscii()"),
        sub.map(lambda s: f"{s}.upperAscii()"),
        sub.map(lambda s: f"{s}.trim()"),
        st.tuples(sub, sub).map(lambda p: f"{p[0]} + {p[1]}"),
        st.tuples(sub, st.integers(-1, 4)).map(lambda p: f"{p[0]}.substring({p[1]})"),
        st.tuples(sub, st.sampled_from(("A", "0", ":"))).map(
            lambda p: f"{p[0]}.replace({_quoted(p[1])}, 'x')"
        ),
        st.tuples(bool_term(depth - 1), sub, sub).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        _attr("version").map(lambda v: f"string({v}.major())"),
        st.tuples(sub, int_term(0)).map(lambda p: f"{p[0]}.charAt({p[1]})"),
        st.tuples(sub, st.sampled_from((":", "0", "-"))).map(
            lambda p: f"{p[0]}.split({_quoted(p[1])}).join('/')"
        ),
        st.tuples(sub, int_term(0)).map(lambda p: f"'%s-%d'.format([{p[0]}, {p[1]}])"),
        st.tuples(sub, st.sampled_from(("[0-9]+", "[A-Z]", "x"))).map(
            lambda p: f"{p[0]}.find({_quoted(p[1])})"
        ),
        _optional_string(),
    )


@cache
def _optional_string() -> Strategy:
    """A string read through an optional: ``orValue``, ``value``, ``or``, ``optMap``."""
    names = ("model", "uuid", "nosuch")
    return st.one_of(
        st.tuples(st.sampled_from(names), string_term(0)).map(
            lambda p: f"{_ATTRS}.?{p[0]}.orValue({p[1]})"
        ),
        st.sampled_from(names).map(lambda n: f"{_ATTRS}.?{n}.value()"),
        st.tuples(st.sampled_from(names), string_term(0)).map(
            lambda p: f"{_ATTRS}.?{p[0]}.or(optional.of({p[1]})).value()"
        ),
        st.sampled_from(names).map(
            lambda n: f"{_ATTRS}.?{n}.optMap(m, m.lowerAscii()).orValue('none')"
        ),
        st.sampled_from((DRIVER, K8S, "other.io")).map(
            lambda d: f"device.attributes[?{_quoted(d)}].?pcieRoot.orValue('')"
        ),
    )


@cache
def int_term(depth: int) -> Strategy:
    """A term of type int."""
    leaves = st.one_of(
        st.integers(-3, 10).map(str),
        st.sampled_from(("9223372036854775807", "-9223372036854775808", "1000000")),
        _attr("int"),
    )
    if depth <= 0:
        return leaves
    sub = int_term(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(sub, st.sampled_from("+-*/%"), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        string_term(depth - 1).map(lambda s: f"{s}.size()"),
        _attr("version").map(lambda v: f"{v}.major()"),
        _attr("version").map(lambda v: f"{v}.minor()"),
        st.one_of(_attr("quantity"), quantity_literal()).map(lambda q: f"{q}.asInteger()"),
        _attr("quantity").map(lambda q: f"sign({q})"),
        st.tuples(_attr("quantity"), quantity_literal()).map(lambda p: f"{p[0]}.compareTo({p[1]})"),
        st.tuples(_attr("version"), semver_literal()).map(lambda p: f"{p[0]}.compareTo({p[1]})"),
        st.lists(sub, min_size=1, max_size=3).map(lambda xs: f"[{', '.join(xs)}].sum()"),
        st.lists(sub, min_size=1, max_size=3).map(lambda xs: f"[{', '.join(xs)}].max()"),
        string_term(depth - 1).map(lambda s: f"int({s})"),
        _attr("version").map(lambda v: f"{v}.patch()"),
        st.lists(sub, min_size=1, max_size=3).map(lambda xs: f"[{', '.join(xs)}].min()"),
        st.tuples(st.lists(sub, max_size=3), sub).map(
            lambda p: f"[{', '.join(p[0])}].map(x, x + {p[1]}).size()"
        ),
        st.tuples(string_term(depth - 1), string_term(0)).map(lambda p: f"{p[0]}.indexOf({p[1]})"),
        st.tuples(_attr("quantity"), st.sampled_from(("quantity('1Gi')", "1", "-5"))).map(
            lambda p: f"{p[0]}.add({p[1]}).asInteger()"
        ),
        st.tuples(_attr("quantity"), st.sampled_from(("quantity('1500m')", "100"))).map(
            lambda p: f"{p[0]}.sub({p[1]}).compareTo(quantity('0'))"
        ),
        _lookup_table(sub),
    )


@st.composite
def _lookup_table(draw: st.DrawFn, values: Strategy) -> str:
    """A map literal used as a lookup table keyed by model (``{'A100': 40, ...}[model]``),
    its keys drawn with repeats now and then; read by index, optional index or ``in``."""
    keys = draw(st.lists(st.sampled_from(MODELS[:3]), min_size=1, max_size=3))
    table = "{" + ", ".join(f"{_quoted(k)}: {draw(values)}" for k in keys) + "}"
    model = draw(_attr("string"))
    return draw(
        st.sampled_from(
            (
                f"{table}[{model}]",
                f"{table}[?{model}].orValue(0)",
                f"({model} in {table} ? {table}[{model}] : -1)",
                f"{table}.size()",
            )
        )
    )


@cache
def quantity_literal() -> Strategy:
    """``quantity('...')``, now and then one that does not parse."""
    return st.sampled_from((*QUANTITIES, "40GB", "1.5Gi", "-1")).map(lambda q: f"quantity('{q}')")


@cache
def semver_literal() -> Strategy:
    """``semver('...')``, now and then one that does not parse."""
    odd = ("535", "v1.2.3", "1.2", "18446744073709551615.0.0", "1.2.3-rc.01")
    return st.one_of(
        st.sampled_from((*VERSIONS, *odd)).map(lambda v: f"semver('{v}')"),
        st.sampled_from(("v1.2", "535", "1.2.3", "01.2.3", "1.2-rc", "v550.54.015")).map(
            lambda v: f"semver('{v}', true)"
        ),
    )


@cache
def _comparison(left: Strategy, right: Strategy, ops: tuple[str, ...]) -> Strategy:
    return st.tuples(left, st.sampled_from(ops), right).map(lambda t: f"{t[0]} {t[1]} {t[2]}")


_ORDER = ("==", "!=", "<", "<=", ">", ">=")


@cache
def atom(depth: int) -> Strategy:
    """A bool term without logical operators."""
    ints = int_term(depth)
    strings = string_term(depth)
    return st.one_of(
        st.sampled_from(("true", "false", "device.allowMultipleAllocations")),
        _attr("bool"),
        st.just(f"device.driver == {_quoted(DRIVER)}"),
        _comparison(ints, ints, _ORDER),
        _comparison(strings, strings, ("==", "!=", "<", ">=")),
        st.tuples(strings, st.sampled_from(("startsWith", "endsWith", "contains")), strings).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"
        ),
        st.tuples(strings, st.sampled_from(("^[AH][0-9]+$", "100", "(?i)a100", "^pci", "["))).map(
            lambda p: f"{p[0]}.matches({_quoted(p[1])})"
        ),
        st.tuples(strings, st.lists(string_term(0), max_size=3)).map(
            lambda p: f"{p[0]} in [{', '.join(p[1])}]"
        ),
        st.tuples(ints, st.lists(st.integers(-1, 8).map(str), max_size=3)).map(
            lambda p: f"{p[0]} in [{', '.join(p[1])}]"
        ),
        st.tuples(
            _attr("version"),
            st.sampled_from(("isGreaterThan", "isLessThan")),
            semver_literal(),
        ).map(lambda t: f"{t[0]}.{t[1]}({t[2]})"),
        st.tuples(_attr("version"), semver_literal()).map(lambda p: f"{p[0]} == {p[1]}"),
        st.tuples(
            _attr("quantity"),
            st.sampled_from(("isGreaterThan", "isLessThan")),
            quantity_literal(),
        ).map(lambda t: f"{t[0]}.{t[1]}({t[2]})"),
        st.tuples(_attr("quantity"), quantity_literal()).map(lambda p: f"{p[0]} == {p[1]}"),
        _attr("quantity").map(lambda q: f"{q}.isInteger()"),
        quantity_literal().map(lambda q: f"{q}.isInteger()"),
        st.tuples(_attr("quantity"), st.sampled_from(("1.5", "0.0", "1e9"))).map(
            lambda p: f"{p[0]}.asApproximateFloat() > {p[1]}"
        ),
        st.sampled_from((*VERSIONS, "v1", "1.2")).map(lambda v: f"isSemver('{v}')"),
        st.sampled_from((*QUANTITIES, "1GB")).map(lambda q: f"isQuantity('{q}')"),
        st.tuples(
            st.sampled_from((_ATTRS, _K8S_ATTRS, _CAPS)),
            st.sampled_from(("model", "index", "mig", "pcieRoot", "memory", "numaNode")),
        ).map(lambda p: f"{_quoted(p[1])} in {p[0]}"),
        st.sampled_from((DRIVER, K8S, "example.com", "other.io")).map(
            lambda d: f"{_quoted(d)} in device.attributes"
        ),
        st.sampled_from(("model", "mig", "index")).map(lambda n: f"has({_ATTRS}.{n})"),
        st.tuples(st.sampled_from(("model", "uuid")), strings).map(
            lambda p: f"{_ATTRS}.?{p[0]}.orValue('') == {p[1]}"
        ),
        st.sampled_from(("model", "index", "driverVersion")).map(
            lambda n: f"{_ATTRS}.?{n}.hasValue()"
        ),
        st.sampled_from((DRIVER, "other.io")).map(
            lambda d: f"device.attributes[?{_quoted(d)}].hasValue()"
        ),
        st.tuples(st.lists(string_term(0), min_size=1, max_size=3), strings).map(
            lambda p: f"[{', '.join(p[0])}].exists(m, m == {p[1]})"
        ),
        st.tuples(st.lists(st.integers(-2, 8).map(str), max_size=4), ints).map(
            lambda p: f"[{', '.join(p[0])}].all(x, x <= {p[1]})"
        ),
        st.tuples(st.lists(st.integers(-2, 8).map(str), max_size=4), ints).map(
            lambda p: f"[{', '.join(p[0])}].exists_one(x, x == {p[1]})"
        ),
        st.tuples(st.lists(st.integers(-2, 8).map(str), max_size=4), ints).map(
            lambda p: f"[{', '.join(p[0])}].filter(x, x > {p[1]}).size() == 1"
        ),
        ints.map(lambda i: f"cel.bind(v, {i}, v * v >= v)"),
        strings.map(lambda t: f"cel.bind(s, {t}, s == s.upperAscii())"),
        st.tuples(strings, strings).map(lambda p: f"{p[0]}.matches({p[1]})"),
        st.tuples(strings, st.sampled_from(("^H", "[", "a|b", "(?i)h100"))).map(
            lambda p: f"{p[0]}.matches(dyn({_quoted(p[1])}))"
        ),
        st.sampled_from(("numaNode", "pcieRoot")).map(lambda n: f"has({_K8S_ATTRS}.{n})"),
        st.tuples(
            st.sampled_from(("numaNode", "pcieRoot")),
            st.sampled_from(("0", "1", "'pci0000:00'")),
        ).map(lambda p: f"{_K8S_ATTRS}.?{p[0]}.orValue({p[1]}) == {p[1]}"),
        st.sampled_from(("v1.2", "535", "1.2.3", "01.2.3")).map(lambda v: f"isSemver('{v}', true)"),
        st.tuples(st.lists(st.integers(-2, 8).map(str), max_size=4), st.booleans()).map(
            lambda p: f"[{', '.join(p[0])}].isSorted() == {str(p[1]).lower()}"
        ),
        st.tuples(st.lists(ints, max_size=3), st.lists(ints, max_size=2)).map(
            lambda p: f"sets.contains([{', '.join(p[0])}], [{', '.join(p[1])}])"
        ),
        st.tuples(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3), strings).map(
            lambda p: (
                "{" + ", ".join(f"{_quoted(k)}: true" for k in p[0]) + f"}}[?{p[1]}].orValue(false)"
            )
        ),
    )


@cache
def bool_term(depth: int) -> Strategy:
    """A term of type bool."""
    if depth <= 0:
        return atom(0)
    sub = bool_term(depth - 1)
    return st.one_of(
        atom(depth - 1),
        sub.map(lambda b: f"!({b})"),
        st.tuples(sub, st.sampled_from(("&&", "||")), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, sub, sub).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
    )


def _mistake(expression: str) -> Strategy:
    """What users get wrong, applied to a valid expression."""
    return st.one_of(
        st.integers(1, max(1, len(expression) - 1)).map(lambda n: expression[:n]),
        st.just(f"{expression} && {_ATTRS}.nosuch == 1"),
        st.just(f"{expression} || {_ATTRS}.model == 1"),
        st.just(f"{expression} && 1 / 0 == 1"),
        st.just(f"{expression} && {_ATTRS}.model.frobnicate()"),
        st.just(f"dev.driver == 'x' || {expression}"),
        st.sampled_from((_ATTRS + ".model", _ATTRS + ".index + 1", "device.capacity", "1.0")),
        st.just(f"{expression} && int({_CAPS}.memory) > 0"),
        st.just(f"{expression} && {_CAPS}.memory > quantity('1Gi')"),
        st.just(f"{expression} && {_K8S_ATTRS}.numaNode == '0'"),
        st.just(f"{expression} && string({_ATTRS}.driverVersion) == '1'"),
        st.just(f"{expression} && {{'a': 1, 'a': 2}}['a'] == 2"),
    )


@st.composite
def selectors(draw: st.DrawFn, depth: int = 2) -> str:
    """A selector expression; about one in eight carries a mistake."""
    expression = draw(bool_term(draw(st.integers(0, depth))))
    if draw(st.integers(0, 7)) == 0:
        expression = draw(_mistake(expression))
    return expression


@st.composite
def cel_cases(draw: st.DrawFn) -> dict[str, Any]:
    """One CEL case for the oracle (without its id)."""
    return {
        "kind": "cel",
        "expression": draw(selectors()),
        "driver": DRIVER,
        "device": draw(devices()),
    }
