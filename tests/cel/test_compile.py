"""Compile errors (with position), the compile cache, type identifiers, backtick-quoted field
names and map literal keys."""

from __future__ import annotations

import pytest

from sharegpu.cel import (
    CelCompileError,
    CelEvalError,
    cache_info,
    clear_cache,
    compile_error,
    compile_selector,
    device_activation,
)


@pytest.mark.parametrize(
    ("expression", "message", "column"),
    [
        ("device.driver ==", "Syntax error", None),
        ("device.foo == 'x'", "undefined field 'foo'", 8),
        ("dev.driver == 'x'", "undeclared reference to 'dev'", 1),
        (
            "device.driver.startsWith('x') && frobnicate(1)",
            "undeclared reference to 'frobnicate'",
            34,
        ),
        ("device.driver", "must evaluate to bool or the unknown type, not string", 1),
        (
            "quantity('1Gi')",
            "must evaluate to bool or the unknown type, not kubernetes.Quantity",
            1,
        ),
        ("device.driver == 1", "no matching overload for '_==_' applied to '(string, int)'", 1),
        ("quantity('1') < quantity('2')", "no matching overload for '_<_'", 1),
        (
            "quantity('1', 2).isInteger()",
            "found no matching overload for 'quantity' applied to '(string, int)'",
            1,
        ),
        (
            "device.driver.startsWith('a', 'b')",
            "found no matching overload for 'startsWith' applied to 'string.(string, string)'",
            15,
        ),
        (
            "optional.of(1).hasValue(2)",
            "found no matching overload for 'hasValue' applied to 'optional.(int)'",
            16,
        ),
        ("semver('1.0.0').add(1) == semver('1.0.1')", "no matching overload for 'add'", 17),
        (
            "'a'.isLessThan('b')",
            "no matching overload for 'isLessThan' applied to 'string.(string)'",
            5,
        ),
        ("device.attributes['x'].y.frob()", "undeclared reference to 'frob'", 26),
        # sign() is a global function only (Kubernetes' quantity library), whatever the receiver
        (
            "quantity('1').sign() == 1",
            "found no matching overload for 'sign' applied to 'Quantity.()'",
            15,
        ),
        ("device.capacity['x'].y.sign() == 1", "no matching overload for 'sign'", 24),
        ("sign(1) == 1", "found no matching overload for 'sign' applied to '(int)'", 1),
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
        "!(" * 2500 + "true" + ")" * 2500,
        "[" * 2000 + "]" * 2000 + " == []",
        "1" + " + 1" * 2000 + " > 0",
    ],
    ids=["parentheses", "negations", "lists", "sum"],
)
def test_deep_nesting_is_a_compile_error_not_a_crash(expression: str) -> None:
    """Under the 10 KiB limit, yet deeper than a recursive compiler can follow."""
    err = compile_error(expression)
    assert err is not None and err.message == "expression is nested too deeply"


@pytest.mark.parametrize(
    ("expression", "device_driver", "value"),
    [
        ("!" * 5000 + "true", "", True),
        ("!!device.driver == 'a'", "a", True),
        ("--'a' == 'a'", "", True),
        ("- -1 == 1", "", True),
        ("---1 == -1", "", True),
        ("!!!true", "", False),
    ],
)
def test_a_chain_of_one_unary_operator_applies_once_or_not_at_all(
    expression: str, device_driver: str, value: bool
) -> None:
    """cel-go's grammar reads ``!!x`` and ``--x`` as ``x`` (no type check) and ``!!!x`` as
    ``!x``, however long the chain."""
    program = compile_selector(expression)
    assert program.evaluate(device_activation(device_driver, {"name": "d"})) is value


@pytest.mark.parametrize("expression", ["--9223372036854775808 == 1", "!!-(1) == 1"])
def test_the_sign_of_a_literal_after_a_chain_of_minus_is_one_more_operator(
    expression: str,
) -> None:
    """``--9223372036854775808`` is ``-(-(9223372036854775808))``: an invalid literal;
    a chain of ``!`` before a ``-`` is a compile error too."""
    assert compile_error(expression) is not None


def test_a_constant_that_overflows_when_negated_is_an_evaluation_error() -> None:
    program = compile_selector("-(-9223372036854775808) == 1")
    with pytest.raises(CelEvalError, match="overflow"):
        program.evaluate(device_activation("", {"name": "d"}))


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


def _holds(expression: str) -> bool:
    return compile_selector(expression).evaluate(device_activation("", {}))


@pytest.mark.parametrize(
    "expression",
    [
        "type(1) == int && type(1u) == uint && type(1.0) == double && type('') == string",
        "type(b'') == bytes && type(true) == bool && type(null) == null_type",
        "type([]) == list && type({}) == map && type(int) == type && type(type) == type",
        "type(duration('1s')) == google.protobuf.Duration",
        "type(optional.none()) == optional_type",
        "int != uint && [int, string].exists(t, t == string)",
    ],
)
def test_type_identifiers_are_values(expression: str) -> None:
    assert _holds(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("int == 1", "no matching overload for '_==_' applied to '(type, int)'"),
        ("dyn == dyn", "undeclared reference to 'dyn'"),
        ("google.protobuf.Any == int", "undeclared reference to 'google'"),
    ],
)
def test_type_identifier_errors(expression: str, message: str) -> None:
    err = compile_error(expression)
    assert err is not None and message in err.message


def test_a_variable_shadows_a_type_name() -> None:
    assert _holds("[1].all(int, int == 1)")


@pytest.mark.parametrize(
    "expression",
    [
        "{'content-type': 'json'}.`content-type` == 'json'",
        "has({'a.b': 1}.`a.b`) && !has({'a.b': 1}.`a/b`)",
        "{'x y': 1}.?`x y`.orValue(0) == 1",
    ],
)
def test_backtick_quoted_field_names(expression: str) -> None:
    assert _holds(expression)


def test_backtick_names_only_letters_digits_and_separators() -> None:
    err = compile_error("{'a': 1}.`a+b` == 1")
    assert err is not None and "Syntax error" in err.message


@pytest.mark.parametrize(
    "expression",
    [
        # Kubernetes' cel-go builds a map literal entry by entry: a repeated key replaces the
        # earlier entry, an absent optional entry removes it.
        "{'a': 1, 'a': 2}.size() == 1 && {'a': 1, 'a': 2}['a'] == 2",
        "{'a': 1, 'b': 2, 'a': 3} == {'b': 2, 'a': 3}",
        "{'a': 1, ?'a': optional.none()}.size() == 0",
        "{'a': 1, ?'a': optional.of(5)}['a'] == 5",
        # Keys are told apart by type: 1, 1u, 1.0 and true are four keys.
        "{dyn(1): 'i', dyn(1u): 'u', dyn(1.0): 'd', dyn(true): 'b'}.size() == 4",
        "{dyn(2): 'x', dyn(true): 'y'}[true] == 'y'",
        "{dyn(1): 'i', dyn(true): 'b'}[1] == 'i'",
        # Lookup finds an int or uint key by an equal number of another type.
        "{dyn(1u): 'u'}[1] == 'u' && {dyn(1): 'i'}[1u] == 'i' && {dyn(1): 'i'}[1.0] == 'i'",
        "!(1 in {dyn(1.0): 'd'}) && 1.0 in {dyn(1.0): 'd'}",
        # Any value is a key.
        "{1.5: 'x'}[1.5] == 'x' && {dyn(null): 1}.size() == 1",
        "{dyn([1]): 1, dyn([1]): 2}.size() == 2",
    ],
)
def test_map_literals_build_as_kubernetes_does(expression: str) -> None:
    assert _holds(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("duration('1d') == duration('1h')", "invalid duration argument"),
        ("timestamp('2024-13-01T00:00:00Z') == timestamp(0)", "invalid timestamp argument"),
        ("'ab'.matches('(?<=a)b')", "invalid matches argument"),
    ],
)
def test_invalid_constant_arguments_are_compile_errors(expression: str, message: str) -> None:
    err = compile_error(expression)
    assert err is not None and message in err.message


def test_arguments_known_only_at_run_time_are_checked_then() -> None:
    assert compile_error("duration(device.driver) == duration('1h')") is None
    with pytest.raises(CelEvalError):
        _holds("duration(device.driver) == duration('1h')")


@pytest.mark.parametrize(
    "expression",
    ["{dyn(semver('1.0.0')): 1}.size() == 1", "{b'a': 1}.size() == 1", "dyn(b'a') in [1, 2]"],
)
def test_keys_go_cannot_hash_are_evaluation_errors(expression: str) -> None:
    with pytest.raises(CelEvalError, match="hash of unhashable type"):
        _holds(expression)
