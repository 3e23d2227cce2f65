"""Compile-time checks Kubernetes' type-checker makes: static result and receiver types of
library functions, timestamp and duration operators, constant format strings, cel-go's
lexing of ``42.``, and the lists extension's ``sortBy`` macro."""

from __future__ import annotations

import pytest

from sharegpu.cel import CelEvalError, compile_error, compile_selector
from sharegpu.cel.strformat import check_format

DEVICE = {"driver": "d", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}
T0 = "timestamp('2024-01-01T00:00:00Z')"


def ev(expression: str) -> object:
    return compile_selector(expression).evaluate(DEVICE)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "isIP(cidr('10.0.0.0/8'))",
            "found no matching overload for 'isIP' applied to '(net.CIDR)'",
        ),
        ("isCIDR(1)", "found no matching overload for 'isCIDR' applied to '(int)'"),
        ("ip('::1').containsIP(ip('::1'))", "applied to 'net.IP.(net.IP)'"),
        ("cidr('::/0').family() == 6", "applied to 'net.CIDR.()'"),
        ("duration('1h').getFullYear() == 1", "applied to 'google.protobuf.Duration.()'"),
        (f"{T0} + {T0} > {T0}", "found no matching overload for '_+_'"),
        (f"{T0} < duration('1h')", "found no matching overload for '_<_'"),
        ("duration('1h') * 2 > duration('1h')", "found no matching overload for '_*_'"),
        ("ip('::1') + ip('::1') == ip('::1')", "found no matching overload for '_+_'"),
        ("42.charAt(0) == ''", "found no matching overload for 'charAt' applied to 'int.(int)'"),
        ("[1].trim() == ''", "found no matching overload for 'trim' applied to 'list.()'"),
        ("'a'.sum() == 1", "found no matching overload for 'sum' applied to 'string.()'"),
        ("'%s %s'.format(['a']) == ''", "index 1 out of range"),
        ("'%s'.format(['a', 'b']) == ''", "too many arguments supplied to string.format"),
        (
            "'%d'.format(['a']) == ''",
            "decimal clause can only be used on integers, was given string",
        ),
        ("'%'.format([]) == ''", "unexpected end of string"),
        ("'%z'.format([1]) == ''", 'unrecognized formatting clause "z"'),
    ],
)
def test_type_errors_are_compile_errors(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None and message in error.message, error


@pytest.mark.parametrize(
    "expression",
    [
        f"{T0} - {T0} == duration('0s')",
        f"{T0} + duration('1h') > {T0} && duration('1h') + {T0} > {T0}",
        f"{T0} - duration('1h') < {T0} && duration('2h') - duration('1h') == duration('1h')",
        "duration('1h') < duration('2h') && duration('1h') >= duration('1h')",
        f"{T0}.getHours() == 0 && duration('90m').getHours() == 1",
        "timestamp(dyn('2024-01-01T00:00:00Z')) + duration('1s') > timestamp(0)",
        "cidr('10.0.0.0/8').ip() == ip('10.0.0.0') && ip('10.0.0.1').family() == 4",
        "cidr('10.0.0.0/8').masked().prefixLength() == 8",
        "url('https://a/b?x=1').getQuery()['x'] == ['1']",
        "'%d %s'.format([dyn('x').size(), device.driver]) == '1 d'",
        "'%s'.format([device.attributes]) == '{}'",
        "1.5 < 2.0 && .5 < 1.0 && 1e3 == 1000.0",
        "[1, 2].indexOf(2) == 1 && 'ab'.indexOf('b') == 1",
    ],
)
def test_well_typed_expressions_compile_and_hold(expression: str) -> None:
    assert compile_error(expression) is None
    assert ev(expression) is True


def test_check_format_follows_cel_go_order() -> None:
    # cel-go checks the end of the string before the argument count at compile time.
    assert check_format("filler %", []) == "unexpected end of string"
    assert check_format("%d", ["dyn"]) is None
    assert check_format("%f %e", ["string", "double"]) is None
    assert check_format("%%", []) is None
    assert check_format("%x", ["bool"]) == (
        "error during formatting: only integers, byte buffers, and strings can be formatted as "
        "hex, was given bool"
    )


def test_float_literals_need_a_digit_after_the_point() -> None:
    error = compile_error("1. == 1.0")
    assert error is not None and "Syntax error" in error.message


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("[3, 1, 2].sortBy(x, x) == [1, 2, 3]", True),
        ("[3, 1, 2].sortBy(x, -x) == [3, 2, 1]", True),
        ("['b', 'a', 'c'].sortBy(s, s == 'c' ? '' : s) == ['c', 'a', 'b']", True),
        ("[[2], [1, 1]].sortBy(l, l.size()) == [[2], [1, 1]]", True),
        ("[].sortBy(x, x) == []", True),
    ],
)
def test_sort_by_macro(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


def test_sort_by_keys_must_be_comparable() -> None:
    with pytest.raises(CelEvalError, match="comparable"):
        ev("[[1], [2]].sortBy(x, x) == []")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("[1].sortBy(1, x) == [1]", "argument must be a simple name"),
        ("{'a': 1}.sortBy(k, k) == []", "sortBy can only be applied to"),
    ],
)
def test_sort_by_misuse_is_a_compile_error(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None and message in error.message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("['a', 1].size() == 2", "expected type 'string' but found 'int'"),
        ("[1, 2.0].size() == 2", "expected type 'int' but found 'double'"),
        ("[[1], ['a']].size() == 2", "expected type 'list(int)' but found 'list(string)'"),
        ("{'a': 1, 'b': 'x'}.size() == 2", "expected type 'int' but found 'string'"),
        ("{'a': 1, 2: 1}.size() == 2", "expected type 'string' but found 'int'"),
        ("['a', 'b'].sum() == 'ab'", "applied to 'list(string).()'"),
        ("[[1], [2]].min() == [1]", "applied to 'list(list(int)).()'"),
        # dyn is a type of its own: an attribute value or dyn(x) and a literal differ
        (
            "['H100', device.attributes['x'].model].exists(m, m == 'H100')",
            "expected type 'string' but found 'dyn'",
        ),
        (
            "'a' in [device.attributes['x'].model, device.attributes['x'].uuid, device.driver]",
            "expected type 'dyn' but found 'string'",
        ),
        ("{'a': device.attributes['x'].y, 'b': 1}.size() == 2", "expected type 'dyn'"),
        ("[device.driver, dyn(1)].size() == 2", "expected type 'string' but found 'dyn'"),
        ("[dyn(1), 'a'].size() == 2", "expected type 'dyn' but found 'string'"),
        ("{0: 1, dyn(0u): 2}.size() == 2", "expected type 'int' but found 'dyn'"),
        ("[{'a': 1}].max() == {'a': 1}", "applied to 'list(map(string, int)).()'"),
    ],
)
def test_literal_types_are_checked_as_kubernetes_does(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None and message in error.message, error


@pytest.mark.parametrize(
    "expression",
    [
        # dyn elements only, or a type this compiler does not infer (sum() is int in cel-go)
        "[dyn(1), dyn('a')].size() == 2",
        "[1, [1, 2].sum()].size() == 2",
        "[[], [1]].size() == 2",
        "{'a': [1], 'b': []}.size() == 2",
        # format's argument list is exempt, as in cel-go.
        "'%s %d'.format(['a', 1]) == 'a 1'",
        "'%s'.format([[1, 'a']]) == '[1, \"a\"]'",
        "[1, 2].sum() == 3 && ['b', 'a'].min() == 'a'",
    ],
)
def test_homogeneous_check_accepts_what_it_cannot_refute(expression: str) -> None:
    assert compile_error(expression) is None
    assert ev(expression) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("dyn(1) > semver('1.0.0')", "'_>_' applied to '(dyn, Semver)'"),
        ("quantity('1') <= dyn(1)", "'_<=_' applied to '(Quantity, dyn)'"),
        ("dyn(1) < [1]", "'_<_' applied to '(dyn, list)'"),
        ("1 in [1.0]", "'@in' applied to '(int, list)'"),
        ("'a' in {1: 'x'}", "'@in' applied to '(string, map)'"),
        ("[1] in [['a']]", "'@in' applied to '(list, list)'"),
        ("dyn('abc').reverse() == 'cba'", "'_==_' applied to '(list, string)'"),
        ("[1, [dyn(2)].max()].size() == 2", "expected type 'int' but found 'dyn'"),
        ("[1, 2].sum() == 'a'", "'_==_' applied to '(int, string)'"),
    ],
)
def test_static_types_of_operands_as_kubernetes_infers_them(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert message in error.message


@pytest.mark.parametrize(
    "expression",
    [
        "dyn(1) < null || true",
        "dyn(1) in [1.0] && [1, [2].max()].size() == 2",
        "dyn(1.0) in {1: 'a'} == false",
    ],
)
def test_operands_the_checker_accepts(expression: str) -> None:
    assert compile_error(expression) is None, expression


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # A constant list's membership is a hash-set test of exact conversions.
        ("dyn(9223372036854775807) in [9223372036854775807.0]", False),
        ("dyn(9007199254740993) in [9007199254740992.0]", False),
        ("dyn(9007199254740992.0) in [9007199254740993]", True),
        ("dyn(1u) in [1.0] && dyn(1.0) in [1u] && dyn(1) in [1u]", True),
        ("dyn(0.0 / 0.0) in [0.0 / 0.0]", False),
        ("dyn(true) in [1] || dyn('1') in [1]", False),
        # A list that is no constant compares with CEL's equality.
        ("cel.bind(l, [9223372036854775807.0], dyn(9223372036854775807) in l)", True),
        ("[9223372036854775807.0].exists(d, dyn(9223372036854775807) in [d])", True),
    ],
)
def test_membership_in_a_constant_list(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "device.attributes[1].size() == 0",
            "'_[_]' applied to '(map(string, map(string, dyn)), int)'",
        ),
        ("device.capacity['d'][1].isInteger()", "'_[_]' applied to"),
        ("'a,b'.split(',')[1u] == 'b'", "'_[_]' applied to '(list(string), uint)'"),
        ("{'a': 1}[1] == 1", "'_[_]' applied to '(map(string, int), int)'"),
        ("{'a': 1}[?1].hasValue()", "'_[?_]' applied to '(map(string, int), int)'"),
        ("[1, 2][0] == 'a'", "'_==_' applied to '(int, string)'"),
        ("{'a': [1]}['a'][0] == 'x'", "'_==_' applied to '(int, string)'"),
        ("'a,b'.split(',')[1] == 1", "'_==_' applied to '(string, int)'"),
        ("[1, 2].exists(x, x == 'a')", "'_==_' applied to '(int, string)'"),
        ("{'a': 'b'}.exists(k, k == 1)", "'_==_' applied to '(string, int)'"),
        ("[1, 2].all(i, v, v == 'a')", "'_==_' applied to '(int, string)'"),
        ("{'a': 'b'}.all(k, v, v == 1)", "'_==_' applied to '(string, int)'"),
        ("[1, 2].map(x, x + 'a').size() == 2", "'_+_' applied to '(int, string)'"),
        ("[1] == [1.0]", "'_==_' applied to '(list(int), list(double))'"),
        ("{'a': 1} != {1: 1}", "'_!=_' applied to '(map(string, int), map(int, int))'"),
        ("[[1]].exists(x, x == ['a'])", "'(list(int), list(string))'"),
        ("[dyn(1)].exists(m, [m, 'a'].size() == 2)", "expected type 'dyn' but found 'string'"),
        ("[dyn(1) + dyn(2), 1].size() == 2", "expected type 'dyn' but found 'int'"),
        ("[-dyn(1), 1].size() == 2", "expected type 'dyn' but found 'int'"),
    ],
)
def test_element_and_key_types_of_literals_as_kubernetes_infers_them(
    expression: str, message: str
) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert message in error.message


@pytest.mark.parametrize(
    "expression",
    [
        "[1, 2][dyn(0)] == 1 && {'a': 1}[?'a'].orValue(0) == 1",
        "[[1, 2]].exists(x, x[0] == 1) && {'a': {'b': 1}}['a']['b'] == 1",
        "[1, 2].exists(x, [x, 1].size() == 2) && [dyn(1)][0] + 1 == 2",
        "[1] == [dyn(1)] && [dyn(1) + 1, 1].size() == 2",
        "'a,b'.split(',') == ['a', 'b']",
    ],
)
def test_literals_the_checker_accepts(expression: str) -> None:
    assert ev(expression) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("'other.io' in device", "'@in' applied to '(string, device)'"),
        ("device + 1 == 1", "'_+_' applied to '(device, int)'"),
        ("[device, 1].size() == 2", "expected type 'kubernetes.DRADevice' but found 'int'"),
        (
            "[device.attributes['d'], {'a': 1}].size() == 2",
            "expected type 'map(string, dyn)' but found 'map(string, int)'",
        ),
    ],
)
def test_the_device_variable_has_its_declared_types(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert message in error.message


@pytest.mark.parametrize(
    "expression",
    [
        "[device.attributes, {}].size() == 2",
        "[[], [1]].size() == 2 && [{}, {'a': 1}].size() == 2",
        "device.attributes['d'] == {'model': 1}",
    ],
)
def test_empty_literals_and_dyn_parameters_unify(expression: str) -> None:
    assert compile_error(expression) is None, expression


@pytest.mark.parametrize(
    "expression",
    [
        "sets.contains([1], [1.0])",
        "sets.intersects([1], [1u])",
        "sets.equivalent(['a'], [1])",
    ],
)
def test_sets_of_different_element_types_are_compile_errors(expression: str) -> None:
    error = compile_error(expression)
    assert error is not None and "found no matching overload for 'sets." in error.message


def test_sets_with_an_empty_or_dyn_list_compile() -> None:
    assert ev("sets.contains([1], []) && sets.contains([1], [dyn(1.0)])") is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("(true ? 1 : 'a') == 1", "'_?_:_' applied to '(bool, int, string)'"),
        ("(true ? 1 : 2.0) == 1", "'_?_:_' applied to '(bool, int, double)'"),
        ("(true ? null : 1) == null", "'_?_:_' applied to '(bool, null_type, int)'"),
        ("(true ? [1] : ['a']) == [1]", "'(bool, list(int), list(string))'"),
        ("[(true ? dyn(1) : 2), 1].size() == 2", "expected type 'dyn' but found 'int'"),
        ("[(true ? 2 : dyn(1)), 'a'].size() == 2", "expected type 'dyn' but found 'string'"),
    ],
)
def test_conditional_branches_as_kubernetes_types_them(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert message in error.message


def test_conditional_branches_that_unify() -> None:
    assert ev("[(true ? 2 : 3), 1].size() == 2 && (true ? [1] : []) == [1]") is True
    assert ev("(true ? {'a': 1} : {}).size() == 1") is True
