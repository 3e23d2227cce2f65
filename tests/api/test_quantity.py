"""Quantity parsing agrees with Kubernetes on its own test table, and stays bounded.

The table is ``TestQuantityParse`` of ``k8s.io/apimachinery/pkg/api/resource/quantity_test.go``
(kubernetes/apimachinery at commit 357557a670d84c30ef3b5355f02c11d8aba5a941), ported as data:
each input with the exact value ParseQuantity gives it, written as mantissa x 10^exponent
(upstream's ``decQuantity``); every input is also checked with a leading ``-`` and ``+``, as
upstream does.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.quantity import (
    MAX_QUANTITY,
    MAX_QUANTITY_TEXT,
    QuantityError,
    QuantityRangeError,
    parse_quantity,
    quantity_whole,
)
from tests.helpers import HANG_GUARD_S

#: (input, mantissa, exponent): ParseQuantity(input) == mantissa * 10**exponent.
UPSTREAM_PARSE: list[tuple[str, int, int]] = [
    ("0", 0, 0),
    ("0n", 0, 0),
    ("0u", 0, 0),
    ("0m", 0, 0),
    ("0Ki", 0, 0),
    ("0k", 0, 0),
    ("0Mi", 0, 0),
    ("0M", 0, 0),
    ("0Gi", 0, 0),
    ("0G", 0, 0),
    ("0Ti", 0, 0),
    ("0T", 0, 0),
    # Quantity less numbers are allowed
    ("1", 1, 0),
    # Binary suffixes
    ("1Ki", 1024, 0),
    ("8Ki", 8 * 1024, 0),
    ("7Mi", 7 * 1024**2, 0),
    ("6Gi", 6 * 1024**3, 0),
    ("5Ti", 5 * 1024**4, 0),
    ("4Pi", 4 * 1024**5, 0),
    ("3Ei", 3 * 1024**6, 0),
    ("10Ti", 10 * 1024**4, 0),
    ("100Ti", 100 * 1024**4, 0),
    # Decimal suffixes
    ("5n", 5, -9),
    ("4u", 4, -6),
    ("3m", 3, -3),
    ("9", 9, 0),
    ("8k", 8, 3),
    ("50k", 5, 4),
    ("7M", 7, 6),
    ("6G", 6, 9),
    ("5T", 5, 12),
    ("40T", 4, 13),
    ("300T", 3, 14),
    ("2P", 2, 15),
    ("1E", 1, 18),
    # Decimal exponents
    ("1E-3", 1, -3),
    ("1e3", 1, 3),
    ("1E6", 1, 6),
    ("1e9", 1, 9),
    ("1E12", 1, 12),
    ("1e15", 1, 15),
    ("1E18", 1, 18),
    # Nonstandard but still parsable
    ("1e14", 1, 14),
    ("1e13", 1, 13),
    ("1e3", 1, 3),
    ("100.035k", 100035, 0),
    # Things that look like floating point
    ("0.001", 1, -3),
    ("0.0005k", 5, -1),
    ("0.005", 5, -3),
    ("0.05", 5, -2),
    ("0.5", 5, -1),
    ("0.00050k", 5, -1),
    ("0.00500", 5, -3),
    ("0.05000", 5, -2),
    ("0.50000", 5, -1),
    ("0.5e0", 5, -1),
    ("0.5e-1", 5, -2),
    ("0.5e-2", 5, -3),
    ("0.5e0", 5, -1),
    ("10.035M", 10035, 3),
    ("1.2e3", 12, 2),
    ("1.3E+6", 13, 5),
    ("1.40e9", 14, 8),
    ("1.53E12", 153, 10),
    ("1.6e15", 16, 14),
    ("1.7E18", 17, 17),
    ("9.01", 901, -2),
    ("8.1k", 81, 2),
    ("7.123456M", 7123456, 0),
    ("6.987654321G", 6987654321, 0),
    ("5.444T", 5444, 9),
    ("40.1T", 401, 11),
    ("300.2T", 3002, 11),
    ("2.5P", 25, 14),
    ("1.01E", 101, 16),
    # Things that saturate/round
    ("3.001n", 4, -9),
    ("1.1E-9", 2, -9),
    ("0.0000000001", 1, -9),
    ("0.0000000005", 1, -9),
    ("0.00000000050", 1, -9),
    ("0.5e-9", 1, -9),
    ("0.9n", 1, -9),
    ("0.00000012345", 124, -9),
    ("0.00000012354", 124, -9),
    ("9Ei", MAX_QUANTITY, 0),  # upstream: maxAllowed
    ("9223372036854775807Ki", MAX_QUANTITY, 0),  # upstream: maxAllowed
    # ("12E", 12, 18): 1.2e19 is above int64; sharegpu refuses it (see DIVERGENT below).
    # We'll accept fractional binary stuff, too.
    ("100.035Ki", 10243584, -2),
    ("0.5Mi", 512 * 1024, 0),
    ("0.05Gi", 536870912, -1),
    ("0.025Ti", 274877906944, -1),
    # Things written by trolls
    ("0.000000000001Ki", 2, -9),  # rounds up, changes format
    (".001", 1, -3),
    (".0001k", 100, -3),
    ("1.", 1, 0),
    ("1.G", 1, 9),
]

#: TestQuantityParseEmit of the same file: inputs whose canonical text is shown.
UPSTREAM_EMIT: list[tuple[str, int, int]] = [
    ("1Ki", 1024, 0),
    ("1Mi", 1024**2, 0),
    ("1Gi", 1024**3, 0),
    ("1024Mi", 1024**3, 0),
    ("1000M", 1, 9),
    (".001Ki", 1024, -3),
    (".000001Ki", 1024, -6),
    (".000000001Ki", 1024, -9),
    (".000000000001Ki", 2, -9),
]

#: The ``invalid`` list of TestQuantityParse, plus the empty string it checks first.
UPSTREAM_INVALID = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    # trailing whitespace is forbidden
    " 1",
    "1 ",
]

#: Upstream table entries sharegpu deliberately answers differently: decimal values above
#: int64, which Kubernetes stores but no device can offer, are refused as out of range.
DIVERGENT = ["12E"]

#: Texts Python's Decimal would take but Kubernetes' grammar does not.
NOT_KUBERNETES = ["1_000", "Infinity", "-inf", "NaN", "1e", "1E+", "0x10", "1K", "\u0661"]


def _value(mantissa: int, exponent: int) -> Decimal:
    return Decimal(mantissa).scaleb(exponent)


@pytest.mark.parametrize(("text", "mantissa", "exponent"), UPSTREAM_PARSE + UPSTREAM_EMIT)
def test_upstream_parse_table(text: str, mantissa: int, exponent: int) -> None:
    expected = _value(mantissa, exponent)
    assert parse_quantity(text) == expected
    assert parse_quantity("-" + text) == -expected
    assert parse_quantity("+" + text) == expected


@pytest.mark.parametrize("text", UPSTREAM_INVALID + NOT_KUBERNETES)
def test_upstream_invalid_inputs_are_errors(text: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(text)


def test_error_names_the_grammar() -> None:
    with pytest.raises(QuantityError, match=r"regular expression '\^\(\[\+-\]\?\[0-9\.\]\+\)"):
        parse_quantity("ten gigs")
    with pytest.raises(QuantityError, match="unable to parse quantity's suffix"):
        parse_quantity("1mi")


@pytest.mark.parametrize(
    "text",
    [*DIVERGENT, "1e1500000", "1e1000000", "9223372036854775808", "10E", "1e19", "-1e1500000"],
)
@pytest.mark.timeout(HANG_GUARD_S)
def test_values_beyond_int64_are_refused_without_arithmetic(text: str) -> None:
    # Decided from the exponent (a 1.5M-digit integer would take minutes: the timeout is the
    # safety net against that, not a speed check).
    with pytest.raises(QuantityError, match=r"out of range, sharegpu accepts quantities up to"):
        parse_quantity(text)


def test_largest_and_tiny_values_are_exact() -> None:
    assert parse_quantity(str(MAX_QUANTITY)) == MAX_QUANTITY
    assert parse_quantity("9.223372036854775807E") == MAX_QUANTITY
    assert parse_quantity("1e-1500000") == Decimal("1e-9")  # rounded up to a nano
    assert parse_quantity("-1e-1500000") == Decimal("-1e-9")


def test_exponent_keeps_the_low_32_bits_as_upstream_does() -> None:
    # apimachinery parses the exponent as int64 and converts it with int32(parsed).
    assert parse_quantity("1e4294967297") == 10
    with pytest.raises(QuantityError, match="suffix"):
        parse_quantity("1e9223372036854775808")  # not an int64


def test_text_length_is_bounded() -> None:
    assert parse_quantity("0" * (MAX_QUANTITY_TEXT - 1) + "1") == 1
    with pytest.raises(QuantityError, match=f"longer than {MAX_QUANTITY_TEXT} characters"):
        parse_quantity("1" * 10_000_000)


def test_error_message_stays_short_for_huge_input() -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity("x" * 1_000_000)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [(30, Decimal(30)), (1.5, Decimal("1.5")), (1e3, Decimal(1000)), (-2, Decimal(-2))],
)
def test_json_numbers_parse_from_their_text(value: int | float, expected: Decimal) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value", [True, None, [1], {"a": 1}, float("inf"), float("nan"), 10**4000, 1e300]
)
def test_non_quantities_and_huge_numbers_are_errors(value: object) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(value)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="0123456789.+-eEinumkKMGTP ", max_size=40),
        st.text(max_size=40),
        st.from_regex(
            r"[+-]?[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,20}|[numkMGTPE]|[KMGTPE]i)?",
            fullmatch=True,
        ),
    )
)
def test_any_text_is_a_bounded_quantity_or_a_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError as exc:
        assert str(exc).startswith("invalid quantity")
        return
    assert value.is_finite() and abs(value) <= MAX_QUANTITY
    assert value == 0 or abs(value) >= Decimal("1e-9")
    assert value == value.quantize(Decimal("1e-9"))  # a whole number of nanos


@pytest.mark.parametrize(
    "value", [Decimal("1e1500000"), Decimal("-1e30"), Decimal("NaN"), Decimal("Infinity")]
)
def test_decimals_out_of_range_are_range_errors(value: Decimal) -> None:
    with pytest.raises(QuantityRangeError, match="out of range"):
        parse_quantity(value)


@pytest.mark.parametrize(("text", "value"), [("25", 25), ("25000m", 25), ("1Gi", 1024**3)])
def test_quantity_whole_reads_whole_amounts_exactly(text: str, value: int) -> None:
    assert quantity_whole(text) == value


@pytest.mark.parametrize("text", ["12500m", "12.5", "1n"])
def test_quantity_whole_refuses_fractions(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a whole number"):
        quantity_whole(text)
