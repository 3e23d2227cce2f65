"""Kubernetes CEL functions: quantity, semver, strings, lists, standard operators and macros."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharegpu.cel import CelEvalError, Quantity, Semver, compile_error, compile_selector
from sharegpu.cel.celtypes import type_of
from sharegpu.cel.library import GLOBAL_FUNCTIONS, METHODS, TYPE_IDENTIFIERS, constant_call_error
from sharegpu.cel.strformat import go_double

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
    "sign(quantity('-3')) == -1 && sign(quantity('0')) == 0 && sign(quantity('2m')) == 1",
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
    # arithmetic and comparison
    "1 + 2 * 3 == 7 && 7 / 2 == 3 && -7 / 2 == -3 && 7 % 3 == 1 && -7 % 3 == -1",
    "2.5 * 2.0 == 5.0 && dyn(1) == 1.0 && 2u > 1u && 'b' > 'a' && 1 < 2.5",
    "[1, 2] + [3] == [1, 2, 3] && 'a' + 'b' == 'ab'",
    "2 in [1, 2] && 'k' in {'k': 1} && !(3 in [1, 2])",
    "{'a': [1, 2]} == {'a': [1, 2]} && [1, 2] != [1, 3]",
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
    # regex on RE2 semantics
    "'Ab'.matches('^\\\\p{Lu}') && !'ab'.matches('^\\\\p{Lu}')",
    "'ab\\n'.matches('b\\\\n\\\\z') && !'ab\\n'.matches('b\\\\z')",
    "'baaa'.findAll('a*') == ['', 'aaa'] && 'a1b22c333'.findAll('[0-9]+', 2) == ['1', '22']",
    "'GPU-ABC'.find('(?i)gpu-[a-z]+') == 'GPU-ABC'",
    # sets and lists extensions
    "sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])",
    "sets.equivalent([1, 2, 2], [2, 1]) && sets.intersects([1, 2], [dyn(2.0), dyn(5.0)])",
    "lists.range(3) == [0, 1, 2] && [1, 2, 3, 4].slice(1, 3) == [2, 3]",
    "[[1], [2]].flatten() == [1, 2] && [[[1]], [[2]]].flatten(2) == [1, 2]",
    "[3, 1, 3, 2].distinct() == [3, 1, 2] && [1, 2].reverse() == [2, 1]",
    "['b', 'c', 'a'].sort() == ['a', 'b', 'c'] && [1.5, 1.0].sort() == [1.0, 1.5]",
    "[duration('1s'), duration('2ms')].sum() == duration('1002ms')",
    "[timestamp('2024-01-02T00:00:00Z'), timestamp('2023-01-01T00:00:00Z')].min()"
    " == timestamp('2023-01-01T00:00:00Z')",
    # strings extension version 2
    "'%s has %d cores at %.1f%%'.format(['H100', 132, 99.5]) == 'H100 has 132 cores at 99.5%'",
    "'%x %X %o %b'.format([255, 255, 8, 5]) == 'ff FF 10 101'",
    "'%s'.format([[1, 'a', 2.5, null, true]]) == '[1, \"a\", 2.500000, null, true]'",
    "'%s'.format([{'b': 1, 'a': [2]}]) == '{\"a\":[2], \"b\":1}'",
    "'%e'.format([1234.5678]) == '1.234568\u202f\u00d7\u202f10\u2070\u00b3'",
    "'%.2f'.format([1234.5]) == '1,234.50'",
    "strings.quote('a\"b\\n') == '\"a\\\\\"b\\\\n\"'",
    "' \\t x \\u3000'.trim() == 'x' && 'tacocat'.lastIndexOf('a', 30) == -1",
    # IP and CIDR
    "ip('10.0.0.1').family() == 4 && ip('::1').family() == 6 && ip('::1').isLoopback()",
    "ip('2001:0db8:0000:0000:0000:0000:0000:0001') == ip('2001:db8::1')",
    "string(ip('2001:db8:0:0:1:0:0:1')) == '2001:db8::1:0:0:1'",
    "!ip.isCanonical('2001:db8:0:0:0:0:0:1') && ip.isCanonical('2001:db8::1')",
    "ip('fe80::1').isLinkLocalUnicast() && ip('ff02::1').isLinkLocalMulticast()",
    "ip('10.0.0.1').isGlobalUnicast() && !ip('255.255.255.255').isGlobalUnicast()",
    "!isIP('fe80::1%eth0') && !isIP('::ffff:1.2.3.4') && !isIP('010.0.0.1') && isIP('::1.2.3.4')",
    "cidr('10.0.0.0/8').containsIP('10.255.0.1')",
    "!cidr('10.0.0.0/8').containsIP(ip('11.0.0.1'))",
    "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')",
    "!cidr('10.1.0.0/16').containsCIDR('10.0.0.0/8')",
    "cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8')",
    "cidr('10.1.2.3/8').ip() == ip('10.1.2.3')",
    "cidr('2001:db8::/32').prefixLength() == 32",
    "!isCIDR('10.0.0.0/33') && !isCIDR('10.0.0.0/08')",
    # URL
    "url('https://user@example.com:8443/a%2Fb?x=1&x=2&y').getPort() == '8443'",
    "url('https://example.com:8443/a%2Fb').getEscapedPath() == '/a%2Fb'",
    "url('https://[::1]:80/').getHostname() == '::1' && url('HTTPS://x/').getScheme() == 'https'",
    "url('https://x/?a=1&a=2&b=%20').getQuery() == {'a': ['1', '2'], 'b': [' ']}",
    "isURL('/just/a/path') && !isURL('relative/path') && !isURL('https://a:b:c/')",
    # timestamps and durations
    "timestamp('2024-03-01T10:20:30.5+01:00').getHours() == 9",
    "timestamp('2024-03-01T10:20:30Z').getHours('Europe/Paris') == 11",
    "timestamp('2024-03-01T10:20:30Z').getHours('-02:30') == 7",
    "timestamp('2024-03-01T00:00:00Z').getMonth() == 2",
    "timestamp('2024-03-01T00:00:00Z').getDate() == 1",
    "timestamp('2024-03-01T00:00:00Z').getDayOfMonth() == 0",
    "timestamp('2024-03-03T00:00:00Z').getDayOfWeek() == 0",
    "timestamp('2024-12-31T00:00:00Z').getDayOfYear() == 365",
    "timestamp('2024-01-01T00:00:01.250Z').getMilliseconds() == 250",
    "timestamp('2024-01-01T00:00:00Z') - timestamp('2023-12-31T23:00:00Z') == duration('1h')",
    "timestamp('2024-01-01T00:00:00Z') + duration('-1.5h') < timestamp('2024-01-01T00:00:00Z')",
    "int(timestamp('1970-01-01T00:01:00Z')) == 60",
    "timestamp(60) == timestamp('1970-01-01T00:01:00Z')",
    "string(timestamp('2024-01-01T00:00:00.120+05:30')) == '2024-01-01T00:00:00.12+05:30'",
    "duration('1h2m3s4ms').getMinutes() == 62",
    "duration('1h2m3s4ms').getMilliseconds() == 3723004",
    "string(duration('1h30m')) == '5400s' && string(duration('1.5s')) == '1.5s'",
    "duration('-1s') < duration('0') && duration('1\u00b5s') == duration('1000ns')",
    # type values
    "type(1) == type(2) && type('a') != type(1) && type(type(1)) == type(type('a'))",
    "type(ip('::1')) == type(ip('10.0.0.1')) && type(duration('1s')) != type(timestamp(0))",
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
    ("['x'].all(s, int(s) == 1)", "cannot convert"),
    ("'abc'.substring(2, 1) == ''", "invalid substring range. start: 2, end: 1"),
    ("'abc'.substring(4) == ''", "index out of range: 4"),
    ("[].max() == 1", "max called on empty list"),
    (
        "'a'.matches(device.driver + '(?=a)')",
        "error parsing regexp: invalid or unsupported Perl syntax: `\\(\\?=`",
    ),
    ("'a'.find(device.driver + 'a)') == ''", "Illegal regex: error parsing regexp: unexpected \\)"),
    ("[dyn('a'), dyn(1)].sort() == []", "list elements must have the same type"),
    ("dyn([[1]]).sort() == []", "list elements must be comparable"),
    ("[1].slice(0, 2) == []", "cannot slice\\(0, 2\\), list is length 1"),
    ("[dyn('a')].sum() == 'a'", "no such overload"),
    (
        "dyn('%d').format(['x']) == ''",
        "decimal clause can only be used on integers, was given string",
    ),
    ("dyn('%d %d').format([1]) == ''", "index 1 out of range"),
    ("dyn('%q').format([1]) == ''", 'unrecognized formatting clause "q"'),
    ("dyn('%s').format([ip('::1')]) == ''", "was given net.IP"),
    ("ip('1.2.3') == ip('::1')", "IPv4 address too short"),
    ("ip('fe80::1%eth0') == ip('::1')", "with zone value is not allowed"),
    ("cidr('10.0.0.0/33') == cidr('10.0.0.0/8')", "prefix length out of range"),
    ("url('x') == url('/x')", "invalid URI for request"),
    ("['2024-13-01T00:00:00Z'].all(s, timestamp(s) == timestamp(0))", "type conversion error"),
    ("['1d'].all(s, duration(s) == duration('1h'))", "type conversion error"),
    ("timestamp('9999-12-31T23:59:59Z') + duration('1s') > timestamp(0)", "timestamp out of range"),
    ("timestamp(0).getHours('Mars/Olympus') == 0", "unknown time zone"),
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


def test_kubernetes_library_functions_are_declared() -> None:
    """Every function Kubernetes' library_compatibility_test.go lists exists here, unless the
    data names why the DRA environment has no use for it."""
    doc = json.loads(
        (Path(__file__).parent / "upstream" / "known_library_functions.json").read_text()
    )
    declared = set(GLOBAL_FUNCTIONS) | set(METHODS)
    missing = {
        name
        for names in doc["functions"].values()
        for name in names
        if name not in declared and name not in doc["absent"]
    }
    assert not missing
    assert not set(doc["absent"]) & declared, "listed as absent but declared"


def test_constant_arguments_errors_use_kubernetes_wording() -> None:
    assert constant_call_error("matches", ("x", "a+")) is None
    assert constant_call_error("matches", ("x", "(?<=a)b")) == "invalid matches argument"
    assert constant_call_error("find", ("x", ")")) == (
        "program instantiation failed: error parsing regexp: unexpected ): `)`"
    )
    assert constant_call_error("duration", ("1d",)) == "invalid duration argument"
    assert constant_call_error("duration", ("1h",)) is None
    assert constant_call_error("timestamp", (-62135596801,)) == "invalid timestamp argument"
    assert constant_call_error("size", ("abc",)) is None
    # None stands for an argument that is not a constant: the others are still checked.
    assert constant_call_error("matches", (None, "(?<=a)b")) == "invalid matches argument"
    assert constant_call_error("matches", ("(?<=a)b", None)) is None
    assert constant_call_error("duration", (None,)) is None


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("device.driver.matches('(?<=a)b')", "invalid matches argument"),
        ("matches(device.driver, '(?<=a)b')", "invalid matches argument"),
        ("device.driver.find('(') == ''", "error parsing regexp: missing closing )"),
        ("device.driver.findAll('(', 1) == []", "error parsing regexp: missing closing )"),
        ("timestamp(-62135596801) < timestamp(device.driver)", "invalid timestamp argument"),
    ],
)
def test_constant_arguments_are_checked_beside_variable_ones(expression: str, message: str) -> None:
    """Kubernetes checks a constant pattern or literal even when the receiver is a variable."""
    error = compile_error(expression)
    assert error is not None and message in error.message


def test_variable_arguments_are_checked_when_evaluated() -> None:
    assert compile_error("'a'.matches(device.driver)") is None
    with pytest.raises(CelEvalError, match="error parsing regexp"):
        compile_selector("'a'.matches(device.driver)").evaluate({**DEVICE, "driver": "("})


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # cel-go converts the integer to a double unless the double lies outside its range
        ("dyn(9223372036854775807) < 9223372036854775808.0", False),
        ("dyn(9223372036854775807) == 9223372036854775808.0", True),
        ("dyn(9223372036854775807) < 9223372036854777857.0", True),
        ("dyn(-9223372036854775808) > -9223372036854777857.0", True),
        ("dyn(18446744073709551615u) == 18446744073709551616.0", True),
        ("dyn(0u) > -1.0", True),
        ("dyn(1) != double('NaN')", True),
        ("int(9223372036854774784.0) == 9223372036854774784", True),
        ("int(-9223372036854774784.0) == -9223372036854774784", True),
    ],
)
def test_numbers_compare_across_types_as_cel_go(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


@pytest.mark.parametrize(
    "expression",
    [
        "[9223372036854775807.0].all(d, int(d) == 0)",
        "[-9223372036854775808.0].all(d, int(d) == 0)",
        "[-0.5].all(d, uint(d) == 0u)",
        "[18446744073709551616.0].all(d, uint(d) == 0u)",
    ],
)
def test_double_conversions_refuse_both_bounds(expression: str) -> None:
    with pytest.raises(CelEvalError, match="out of range"):
        ev(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("int('H100') == 1", "cannot convert 'H100' to int"),
        ("true || int('H100') == 1", "cannot convert"),
        ("int(dyn('x')) == 1", "cannot convert"),
        ("int(9223372036854775807.0) == 0", "out of range"),
        ("uint(-1) == 1u", "out of range"),
        ("string(b'\\xff') == ''", "invalid UTF-8"),
        ("bool('maybe')", "cannot convert"),
        ("duration(dyn('1d')) == duration('1h')", "type conversion error"),
        ("int(null) == 1", "no such overload"),
        ("int(dyn([])) == 1", "no such overload: int(list)"),
        ("string(dyn({'a': 1})) == ''", "no such overload: string(map)"),
    ],
)
def test_failing_conversions_of_constants_are_compile_errors(expression: str, message: str) -> None:
    # Kubernetes' planner folds a conversion of a constant, and its failure fails the program.
    error = compile_error(expression)
    assert error is not None, expression
    assert "program instantiation failed" in error.message and message in error.message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("int([]) == 1", "found no matching overload for 'int' applied to '(list)'"),
        ("double({}) == 1.0", "found no matching overload for 'double' applied to '(map)'"),
        ("string(quantity('1Gi')) == '1Gi'", "found no matching overload for 'string'"),
        ("string(semver('1.2.3')) == '1.2.3'", "found no matching overload for 'string'"),
        (
            "int(device.capacity['d'].memory) > 0",
            "found no matching overload for 'int' applied to '(Quantity)'",
        ),
        ("int(device) == 1", "found no matching overload for 'int'"),
        ("bool(1)", "found no matching overload for 'bool' applied to '(int)'"),
    ],
)
def test_conversions_of_a_type_without_an_overload_are_compile_errors(
    expression: str, message: str
) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert message in error.message and "program instantiation" not in error.message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("'a'.matches(dyn('(?=a)'))", "invalid or unsupported Perl syntax"),
        ("true || matches('a', dyn('['))", "missing closing ]"),
        ("'a'.find(dyn('a)')) == ''", "unexpected )"),
        ("'a'.findAll(string(dyn('['))) == []", "missing closing ]"),
    ],
)
def test_patterns_known_to_the_planner_are_checked_when_compiling(
    expression: str, message: str
) -> None:
    # The planner precompiles a constant pattern, also one the checker does not see as one.
    error = compile_error(expression)
    assert error is not None, expression
    assert "program instantiation failed: error parsing regexp" in error.message
    assert message in error.message


@pytest.mark.parametrize(
    "expression",
    [
        "{'a': 1}[dyn(null)] == 1",
        "device.attributes[dyn(null)].size() == 0",
        "[1][dyn(b'a')] == 1",
        "[1][?dyn([0])].hasValue()",
        "false && {'a': 1}[dyn(duration('1s'))] == 1",
    ],
)
def test_constant_indexes_of_a_type_no_qualifier_takes_are_compile_errors(
    expression: str,
) -> None:
    error = compile_error(expression)
    assert error is not None, expression
    assert "program instantiation failed: invalid qualifier type" in error.message


def test_conversions_of_constants_fold_to_their_value() -> None:
    assert ev("int(string(12)) == 12 && uint(3) == 3u && double('1.5') == 1.5 && bool('true')")
    assert ev("int(dyn(1)) == 1 && string(1) == '1'")


def test_scientific_clause_takes_its_precision_as_a_width() -> None:
    """cel-go v0.26.0 formats ``%.Ne`` with ``%Ne``: a field width, the precision stays 6."""
    assert ev("'%.2e'.format([2.5]) == '2.500000\u202f\u00d7\u202f10\u2070\u2070'")
    assert ev("'%.20e'.format([2.5]) == '     2.500000\u202f\u00d7\u202f10\u2070\u2070'")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (64.2, "64.2"),
        (1e6, "1e+06"),
        (123456.0, "123456"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (-2.5e21, "-2.5e+21"),
        (float("inf"), "+Inf"),
        (float("nan"), "NaN"),
        (0.0, "0"),
    ],
)
def test_doubles_print_as_go_does(value: float, text: str) -> None:
    assert go_double(value) == text


def test_type_identifiers_name_types() -> None:
    assert TYPE_IDENTIFIERS["int"] == type_of(1, "int")
    assert str(TYPE_IDENTIFIERS["net.IP"]) == "net.IP"
    assert type_of(Quantity.parse("1"), "Quantity") == TYPE_IDENTIFIERS["kubernetes.Quantity"]


@pytest.mark.parametrize(
    "expression",
    [
        "int('+1') == 1 && int('-0') == 0 && int('010') == 10",
        "uint('010') == 10u && uint('18446744073709551615') == 18446744073709551615u",
        "double('1_000.5') == 1000.5 && double('.5') == 0.5 && double('5.') == 5.0",
        "double('0x1.8p1') == 3.0 && double('0X1P4') == 16.0 && double('-0x.8p1') == -1.0",
        "double('Inf') > 0.0 && double('-infinity') < 0.0 && double('1e-400') == 0.0",
        "bool('T') && !bool('F') && bool('True') && !bool('0')",
    ],
)
def test_strings_convert_as_go_parses_them(expression: str) -> None:
    assert ev(expression)


@pytest.mark.parametrize(
    "text", ["' 1'", "'1 '", "'1_0'", "'\\uff10'", "'0x10'", "'9223372036854775808'"]
)
def test_int_refuses_what_go_refuses(text: str) -> None:
    with pytest.raises(CelEvalError):
        ev(f"[{text}].all(s, int(s) == 1)")


@pytest.mark.parametrize(
    ("function", "text"),
    [
        ("uint", "'+1'"),
        ("uint", "'-0'"),
        ("double", "' 1'"),
        ("double", "'\\uff11'"),
        ("double", "'1e400'"),
        ("double", "'0x10'"),
        ("double", "'+nan'"),
        ("double", "'_1'"),
        ("double", "'1e_5'"),
        ("bool", "'tRue'"),
    ],
)
def test_conversions_refuse_what_go_refuses(function: str, text: str) -> None:
    with pytest.raises(CelEvalError, match="cannot convert"):
        ev(f"[{text}].all(s, {function}(s) == {function}(s))")


@pytest.mark.parametrize(
    "expression",
    [
        "[dyn(quantity('1Gi'))].all(q, string(q) == '1Gi')",
        "[dyn(semver('1.2.3'))].all(v, string(v) == '1.2.3')",
    ],
)
def test_string_of_a_quantity_or_semver_has_no_overload(expression: str) -> None:
    with pytest.raises(CelEvalError, match="no such overload: string"):
        ev(expression)


@pytest.mark.parametrize(
    ("text", "integer"),
    [
        # Stored as an int64 with scale >= 0: converts.
        ("0", True),
        ("16G", True),
        ("80Gi", True),
        ("81079Mi", True),
        ("1e3", True),
        ("-5k", True),
        ("123456789012345678", True),
        # An int64 with a negative scale (milli, a fraction): does not, whatever the value.
        ("2000m", False),
        ("1.0", False),
        ("0.0", False),
        ("100e-2", False),
        # Stored as a decimal (a binary fraction, too many digits, a large binary suffix).
        ("1.5Gi", False),
        ("0.5Gi", False),
        ("1Ei", False),
        ("1234567890123456789", False),
        ("9223372036854775807", False),
        ("10E", False),
    ],
)
def test_is_integer_follows_how_kubernetes_stores_the_quantity(text: str, integer: bool) -> None:
    assert ev(f"quantity('{text}').isInteger() == {str(integer).lower()}")
    if not integer:
        with pytest.raises(CelEvalError, match="cannot convert value to integer"):
            ev(f"quantity('{text}').asInteger() == 0")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("quantity('1k').add(quantity('1')).asInteger() == 1001", True),
        ("quantity('1k').sub(1).asInteger() == 999", True),
        ("quantity('0').add(quantity('2k')).asInteger() == 2000", True),
        # The sum keeps the smaller scale, and overflow turns it into a decimal.
        ("quantity('1500m').add(quantity('500m')).isInteger()", False),
        ("quantity('1').add(9223372036854775807).isInteger()", False),
        ("quantity('1').add(9223372036854775806).isInteger()", True),
        ("quantity('1Ei').add(quantity('1')).isInteger()", False),
    ],
)
def test_arithmetic_keeps_kubernetes_storage_form(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


def test_decimal_quantities_beyond_int64_are_valid() -> None:
    assert ev("isQuantity('10E') && quantity('10E').compareTo(quantity('1')) == 1")
    assert ev("isQuantity('1e1000') && !isQuantity('1e1001')")
    assert ev("quantity('1.5e19').isGreaterThan(quantity('9223372036854775807'))")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # blang/semver: uint64 numbers (major() returns them as Kubernetes does, wrapped to
        # int64), ASCII digits, non-empty identifiers.
        ("isSemver('18446744073709551615.0.0')", True),
        ("isSemver('18446744073709551616.0.0')", False),
        ("semver('18446744073709551615.0.0').major() == -1", True),
        ("isSemver('1.2.3-18446744073709551616')", False),
        ("isSemver('1.2.\\u0661')", False),
        ("isSemver('1.2.3-a..b') || isSemver('1.2.3+')", False),
        ("isSemver('1.2.3--') && isSemver('1.2.3-b-c+d-e')", True),
        # Kubernetes' normalisation: per part, and a short version with a suffix is refused.
        ("isSemver('1.2-rc', true) || isSemver('1-rc', true)", False),
        ("semver('v01.2.03-rc', true) == semver('1.2.3-rc')", True),
        ("semver('1.2.00-rc', true).patch() == 0", True),
        ("isSemver('1.2.-rc', true)", True),
    ],
)
def test_semver_parses_as_kubernetes_does(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # cel-go's strings extension clamps an empty match to the end, and refuses a
        # negative offset first.
        ("'abc'.indexOf('', 4) == 3 && 'abc'.lastIndexOf('', 4) == 3", True),
        ("'abc'.indexOf('', 2) == 2 && 'abc'.lastIndexOf('', 1) == 1", True),
        ("'abc'.indexOf('c', 4) == -1", True),
    ],
)
def test_index_of_offsets_as_cel_go(expression: str, expected: bool) -> None:
    assert ev(expression) is expected


@pytest.mark.parametrize(
    "expression", ["'abc'.indexOf('', -1) == 0", "'a'.lastIndexOf('', -1) == 0"]
)
def test_negative_offsets_are_errors_even_for_the_empty_string(expression: str) -> None:
    with pytest.raises(CelEvalError, match="index out of range: -1"):
        ev(expression)


def test_the_any_byte_escape_is_refused_as_go_refuses_it() -> None:
    assert compile_error("'x'.matches('\\\\C')") is not None
    assert compile_error("'x'.matches('[\\\\C]')") is not None
    assert ev("'x\\\\C'.matches('\\\\\\\\C')")
    with pytest.raises(CelEvalError, match="invalid escape sequence"):
        ev("'x'.matches(device.driver + '\\\\C')")


def test_modulo_of_the_smallest_int_by_minus_one_overflows() -> None:
    with pytest.raises(CelEvalError, match="integer overflow"):
        ev("[-9223372036854775808].all(x, x % -1 == 0)")
    assert ev("[-9223372036854775807].all(x, x % -1 == 0)")
