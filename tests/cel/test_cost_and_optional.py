"""Kubernetes' cost model (estimate and runtime limit), optional values, two-variable
comprehensions and string literal escapes."""

from __future__ import annotations

import pytest

from sharegpu.cel import (
    CelCompileError,
    CelCostError,
    CelEvalError,
    compile_selector,
    device_activation,
    validate_selector,
)
from sharegpu.cel.cost import COST_EXCEEDED, TOO_COMPLEX, path_size

DEVICE = device_activation(
    "d.example.com",
    {
        "attributes": {
            "name": {"string": "fish"},
            "n": {"int": 3},
            "tags": {"strings": ["a", "b"]},
        },
        "capacity": {"memory": {"value": "1Gi"}},
    },
)
A = "device.attributes['d.example.com']"
NESTED = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
#: 10**7 inner evaluations: minutes without a runtime limit.
EXPENSIVE = (
    f"{NESTED}.all(a, {NESTED}.all(b, {NESTED}.all(c, {NESTED}.all(d, "
    f"{NESTED}.all(e, {NESTED}.all(f, {NESTED}.all(g, a < 100)))))))"
)


def ev(expression: str) -> bool:
    return compile_selector(expression).evaluate(DEVICE)


def test_estimate_uses_declared_bounds() -> None:
    assert path_size(("device", "attributes", "@values", "x")) == (0, 64)
    assert path_size(("device", "attributes", "@keys")) == (0, 63)
    assert path_size(("device", "driver")) == (0, 63)
    assert compile_selector(f"{A}.name.matches('[^a]?sym')").max_cost == 18


def test_expensive_selector_is_refused_and_stopped_quickly() -> None:
    with pytest.raises(CelCostError) as info:
        validate_selector(EXPENSIVE)
    assert TOO_COMPLEX in info.value.message
    program = compile_selector(EXPENSIVE)
    assert program.max_cost > 1_000_000 and program.cost_limit == 1_000_000
    with pytest.raises(CelEvalError) as error:
        program.evaluate(DEVICE)
    assert error.value.message == COST_EXCEEDED


def test_cheap_selector_runs_without_budget() -> None:
    program = validate_selector(f"{A}.name == 'fish'")
    assert program.cost_limit is None and program.evaluate(DEVICE)


@pytest.mark.parametrize(
    "expression",
    [
        f"{A}.?name.orValue('') == 'fish'",
        f"!{A}.?missing.hasValue()",
        f"{A}[?'name'].value() == 'fish'",
        f"{A}.?missing.or(optional.of('x')).value() == 'x'",
        "[?optional.none(), 1, ?optional.of(2)] == [1, 2]",
        "{?'a': optional.none(), 'b': 1} == {'b': 1}",
        "!optional.ofNonZeroValue('').hasValue()",
        "[1, 2][?5] == optional.none()",
        "{'a': {'b': 1}}.?a.b.value() == 1",
        f"{A}.exists(k, v, k == 'n' && v == 3)",
        f"{A}.tags.all(i, v, i < 2 && v != '')",
        "[1, 2, 3].transformList(i, v, v * 2) == [2, 4, 6]",
        "[1, 2, 3].transformList(i, v, i > 0, v) == [2, 3]",
        "{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}",
        "{'a': 1}.transformMapEntry(k, v, {v: k}) == {1: 'a'}",
        "[1, 2].existsOne(x, x == 2)",
        f"{A}.tags.includes('b')",
        "'\\?\\`\\X41\\101' == '?`AA'",
        "'''a\nb''' == 'a\\nb'",
        "b'\\377' == b'\\xff'",
        "[1, 2, ] == [1, 2]",
    ],
)
def test_kubernetes_cel_features(expression: str) -> None:
    assert ev(expression) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("'\\q' == ''", "invalid escape sequence \\q"),
        ("'\\uD800' == ''", "invalid unicode code point"),
        ("9223372036854775808 == 0", "integer out of range"),
        ("[1].all(i, i, true)", "duplicate variable name"),
    ],
)
def test_compile_errors(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    assert message in info.value.message


def test_value_of_none_is_an_error() -> None:
    with pytest.raises(CelEvalError, match=r"optional\.none\(\) dereference"):
        ev(f"{A}.?missing.value() == 1")


@pytest.mark.parametrize(
    "expression",
    [
        "optional.of(41).optMap(y, y + 1).value() == 42",
        "!optional.none().optMap(y, y + 1).hasValue()",
        "{'k': {'s': 'v'}}.?k.optFlatMap(m, m.?s).value() == 'v'",
        "!{'k': {}}.?k.optFlatMap(m, m.?s).hasValue()",
        "!{}.?k.optFlatMap(m, m.?s).hasValue()",
        "has({'x': {'y': 'z'}}.?x.y) && !has({}.?x.y)",
        "!has({'foo': optional.none()}.foo.bar)",
    ],
)
def test_optional_macros_and_presence(expression: str) -> None:
    assert compile_selector(expression).evaluate(device_activation("", {}))


def test_opt_flat_map_needs_an_optional_result() -> None:
    program = compile_selector("optional.of(1).optFlatMap(y, y + 1).hasValue()")
    with pytest.raises(CelEvalError, match="no such overload: optFlatMap"):
        program.evaluate(device_activation("", {}))
