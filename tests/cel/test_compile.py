"""Compile errors (with position) and the compile cache."""

from __future__ import annotations

import pytest

from sharegpu.cel import (
    CelCompileError,
    cache_info,
    clear_cache,
    compile_error,
    compile_selector,
)


@pytest.mark.parametrize(
    ("expression", "message", "column"),
    [
        ("device.driver ==", "syntax error", None),
        ("device.foo == 'x'", "undefined field 'foo'", 8),
        ("dev.driver == 'x'", "undeclared reference to 'dev'", 1),
        (
            "device.driver.startsWith('x') && frobnicate(1)",
            "undeclared reference to 'frobnicate'",
            34,
        ),
        ("device.driver", "must evaluate to bool, but evaluates to string", 1),
        ("quantity('1Gi')", "must evaluate to bool, but evaluates to Quantity", 1),
        ("device.driver == 1", "no matching overload for '_==_' applied to '(string, int)'", 1),
        ("quantity('1') < quantity('2')", "no matching overload for '_<_'", 1),
        ("quantity('1', 2).isInteger()", "'quantity' takes 1 argument(s), got 2", 1),
        ("semver('1.0.0').add(1) == semver('1.0.1')", "no matching overload for 'add'", 17),
        ("'a'.isLessThan('b')", "no matching overload for 'isLessThan' applied to 'string'", 5),
        ("device.attributes['x'].y.frob()", "undeclared reference to 'frob'", 26),
        ("1 || true", "no matching overload for '_||_' applied to 'int'", 1),
        ("has(device.driver.size())", "has() macro", 1),
        ("device['driver'] == 'x'", "not indexed", 1),
    ],
)
def test_compile_errors(expression: str, message: str, column: int | None) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    err = info.value
    assert message in err.message
    assert err.expression == expression
    if column is not None:
        assert (err.line, err.column) == (1, column)
    assert message in str(err)


def test_syntax_error_has_position_and_caret() -> None:
    err = compile_error("device.driver == 'a' &&")
    assert err is not None
    assert err.line == 1 and err.column is not None
    assert "^" in err.describe()


def test_too_long_expression_is_rejected() -> None:
    expression = "true || " * 1300 + "true"
    err = compile_error(expression)
    assert err is not None and "longer than 10240 bytes" in err.message


@pytest.mark.parametrize(
    "expression",
    [
        "(" * 3000 + "true" + ")" * 3000,
        "!" * 5000 + "true",
        "[" * 2000 + "]" * 2000 + " == []",
        "1" + " + 1" * 2000 + " > 0",
    ],
    ids=["parentheses", "negations", "lists", "sum"],
)
def test_deep_nesting_is_a_compile_error_not_a_crash(expression: str) -> None:
    """Under the 10 KiB limit, yet deeper than a recursive compiler can follow."""
    err = compile_error(expression)
    assert err is not None and err.message == "expression is nested too deeply"


def test_compile_once_and_cache() -> None:
    clear_cache()
    expression = "device.driver == 'gpu.sharegpu.dev'"
    first = compile_selector(expression)
    second = compile_selector(expression)
    assert first is second
    info = cache_info()
    assert (info.hits, info.misses, info.size) == (1, 1, 1)


def test_compile_errors_are_cached_too() -> None:
    clear_cache()
    assert compile_error("device.nope") is not None
    assert compile_error("device.nope") is not None
    info = cache_info()
    assert (info.hits, info.misses) == (1, 1)


def test_valid_expression_has_no_compile_error() -> None:
    assert compile_error("device.attributes['a.b'].c == 1") is None


def test_references_list_named_attributes_and_capacities() -> None:
    d = "gpu.sharegpu.dev"
    program = compile_selector(
        f"'numaNode' in device.attributes['{d}'] && device.attributes['{d}'].numaNode == 0 && "
        f"device.capacity['{d}'].memry.compareTo(quantity('1Gi')) > 0 && "
        "device.attributes['resource.kubernetes.io']['pcieRoot'] == 'x' && "
        f"has(device.attributes['{d}'].uuid)"
    )
    found = [(r.kind, r.domain, r.name, r.guard) for r in program.references]
    assert found == [
        ("attribute", d, "numaNode", True),
        ("attribute", d, "numaNode", False),
        ("capacity", d, "memry", False),
        ("attribute", "resource.kubernetes.io", "pcieRoot", False),
        ("attribute", d, "uuid", True),
    ]
    memry = program.references[2]
    assert memry.line == 1 and memry.column is not None
    assert program.expression[memry.column - 1 :].startswith("memry")
