"""Kubernetes CEL functions: quantity, semver, strings, lists, standard operators and macros."""

from __future__ import annotations

import pytest

from sharegpu.cel import CelEvalError, Quantity, Semver, compile_selector

DEVICE = {"driver": "d", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}


def ev(expression: str) -> bool:
    return compile_selector(expression).evaluate(DEVICE)


TRUE_EXPRESSIONS = [
    # quantity library
    "quantity('1Gi') == quantity('1024Mi')",
    "quantity('1Gi').compareTo(quantity('1G')) == 1",
    "quantity('500m').compareTo(quantity('0.5')) == 0",
    "quantity('1k').compareTo(quantity('2k')) == -1",
    "quantity('2Gi').isGreaterThan(quantity('1Gi'))",
    "quantity('1Gi').isLessThan(quantity('2Gi'))",
    "!quantity('1Gi').isLessThan(quantity('1Gi'))",
    "isQuantity('10Gi') && isQuantity('500m') && !isQuantity('ten') && !isQuantity('1.5.5')",
    "quantity('10Gi').isInteger() && !quantity('1.5').isInteger()",
    "quantity('1Gi').asInteger() == 1073741824",
    "quantity('1.5').asApproximateFloat() == 1.5",
    "quantity('-3').sign() == -1 && quantity('0').sign() == 0 && quantity('2m').sign() == 1",
    "quantity('1Gi').add(quantity('1Gi')) == quantity('2Gi')",
    "quantity('1Gi').add(1) == quantity('1073741825')",
    "quantity('2Gi').sub(quantity('1Gi')) == quantity('1Gi')",
    "quantity('10').sub(3).asInteger() == 7",
    # semver library
    "semver('1.2.3').major() == 1 && semver('1.2.3').minor() == 2 && semver('1.2.3').patch() == 3",
    "isSemver('1.2.3') && !isSemver('1.2') && !isSemver('v1.2.3') && isSemver('v1.2', true)",
    "semver('v1.2', true) == semver('1.2.0')",
    "semver('01.002.3', true) == semver('1.2.3')",
    "semver('1.10.0').isGreaterThan(semver('1.9.9'))",
    "semver('1.0.0-alpha').isLessThan(semver('1.0.0'))",
    "semver('1.0.0-alpha.1').compareTo(semver('1.0.0-alpha.beta')) == -1",
    "semver('1.0.0-2').compareTo(semver('1.0.0-10')) == -1",
    "semver('1.0.0+build1') == semver('1.0.0+build2')",
    "semver('2.0.0').compareTo(semver('2.0.0')) == 0",
    # strings extension and standard string functions
    "'abc'.contains('b') && 'abc'.startsWith('ab') && 'abc'.endsWith('bc')",
    "'H100 SXM'.matches('^H1[0-9]+') && !'A100'.matches('^H')",
    "matches('abc', 'b')",
    "'hello'.charAt(1) == 'e' && 'hello'.charAt(5) == ''",
    "'hello'.indexOf('l') == 2 && 'hello'.indexOf('l', 3) == 3 && 'hello'.indexOf('z') == -1",
    "'hello'.lastIndexOf('l') == 3",
    "'AbC'.lowerAscii() == 'abc' && 'AbC'.upperAscii() == 'ABC'",
    "'a-b-c'.replace('-', '+') == 'a+b+c' && 'a-b-c'.replace('-', '+', 1) == 'a+b-c'",
    "'a,b,c'.split(',') == ['a', 'b', 'c'] && 'a,b,c'.split(',', 2) == ['a', 'b,c']",
    "'hello'.substring(1) == 'ello' && 'hello'.substring(1, 3) == 'el'",
    "'  x '.trim() == 'x'",
    "['a', 'b'].join('-') == 'a-b' && ['a', 'b'].join() == 'ab'",
    "'abc123def'.find('[0-9]+') == '123' && 'a1b22'.findAll('[0-9]+') == ['1', '22']",
    "size('abc') == 3 && 'abc'.size() == 3 && size([1, 2]) == 2 && size({'a': 1}) == 1",
    # lists extension
    "[1, 2, 3].isSorted() && ![3, 1].isSorted()",
    "[1, 2, 3].sum() == 6 && [1, 5, 2].max() == 5 && [4, 2, 9].min() == 2",
    "[1, 2, 3].indexOf(2) == 1 && [1, 2, 2].lastIndexOf(2) == 2",
    # conversions
    "int('42') == 42 && uint(3) == 3u && double(1) == 1.0 && string(12) == '12'",
    "bool('true') && !bool('false') && bytes('a') == b'a' && dyn(1) == 1",
    "string(quantity('1Gi')) == '1Gi' && string(semver('1.2.3')) == '1.2.3'",
    # arithmetic and comparison
    "1 + 2 * 3 == 7 && 7 / 2 == 3 && -7 / 2 == -3 && 7 % 3 == 1 && -7 % 3 == -1",
    "2.5 * 2.0 == 5.0 && 1 == 1.0 && 2u > 1u && 'b' > 'a' && 1 < 2.5",
    "[1, 2] + [3] == [1, 2, 3] && 'a' + 'b' == 'ab'",
    "2 in [1, 2] && 'k' in {'k': 1} && !(3 in [1, 2])",
    "{'a': [1, 2]} == {'a': [1, 2]} && [1, 'a'] != [1, 'b']",
    "null == null && (true ? 1 : 2) == 1",
    "1 != 'a'.size() + 1",
    # macros
    "[1, 2, 3].all(x, x > 0) && ![1, -2].all(x, x > 0)",
    "[1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x > 2)",
    "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].map(x, x > 1, x) == [2, 3]",
    "[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]",
    "{'a': 1, 'b': 2}.all(k, k in ['a', 'b'])",
    "cel.bind(x, 10, x * x == 100)",
    "has({'a': 1}.a) && !has({'a': 1}.b)",
]


@pytest.mark.parametrize("expression", TRUE_EXPRESSIONS)
def test_true_expressions(expression: str) -> None:
    assert ev(expression) is True


ERROR_EXPRESSIONS = [
    ("quantity('ten') == quantity('1')", "quantit"),
    ("semver('1.2') == semver('1.2.0')", "could not parse '1.2' as semver"),
    ("quantity('1.5').asInteger() == 1", "cannot convert"),
    ("1 / 0 == 0", "division by zero"),
    ("9223372036854775807 + 1 > 0", "overflow"),
    ("[1][5] == 1", "index out of bounds"),
    ("{'a': 1}.b == 1", "no such key: b"),
    ("{'a': 1}['b'] == 1", "no such key: b"),
    ("dyn(1) + dyn(1.0) == 2.0", "no such overload"),
    ("dyn(quantity('1')) < dyn(quantity('2'))", "no such overload"),
    ("dyn('a').major() == 1", "no such overload"),
    ("dyn(quantity('1')).compareTo(dyn(semver('1.0.0'))) == 0", "no such overload"),
    ("int('x') == 1", "cannot convert"),
    ("'abc'.substring(2, 1) == ''", "out of range"),
    ("[].max() == 1", "empty list"),
]


@pytest.mark.parametrize(("expression", "message"), ERROR_EXPRESSIONS)
def test_runtime_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvalError, match=message):
        ev(expression)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("({'a': 1}.b == 1) || true", True),
        ("true || ({'a': 1}.b == 1)", True),
        ("({'a': 1}.b == 1) && false", False),
        ("false && ({'a': 1}.b == 1)", False),
        ("[1, 0].exists(x, 1 / x == 1)", True),
        ("![0, 1].all(x, 1 / x == 2)", True),
    ],
)
def test_logical_operators_absorb_errors(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


@pytest.mark.parametrize(
    "expression",
    ["({'a': 1}.b == 1) || false", "true && ({'a': 1}.b == 1)", "[1, 0].all(x, 1 / x == 1)"],
)
def test_logical_operators_keep_errors_that_decide(expression: str) -> None:
    with pytest.raises(CelEvalError):
        ev(expression)


def test_non_bool_result_is_an_error() -> None:
    with pytest.raises(CelEvalError, match="must evaluate to bool, got int"):
        ev("dyn(1)")


def test_value_types() -> None:
    assert Quantity.parse("1Gi").as_integer() == 1024**3
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert Semver("1.2.3") == Semver("v1.2.3", normalize=True)
    assert Semver.is_valid("1.0.0-rc.1+build.5")
    assert not Semver.is_valid("1.0.0-01")
