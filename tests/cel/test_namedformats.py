"""Kubernetes' named-format library: ``format.<name>().validate(s)`` and ``format.named``."""

from __future__ import annotations

import pytest

from sharegpu.cel import CelEvalError, compile_error, compile_selector
from sharegpu.cel.namedformats import FORMATS

DEVICE = {"driver": "d", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}

#: The names Kubernetes' ConstantFormats declares (apiserver pkg/cel/library/format.go).
KUBERNETES_FORMATS = {
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
}


def ev(expression: str) -> object:
    return compile_selector(expression).evaluate(DEVICE)


def test_every_kubernetes_format_is_declared() -> None:
    assert set(FORMATS) == KUBERNETES_FORMATS


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("dns1123Label", "gpu-0"),
        ("dns1123Subdomain", "gpu.sharegpu.dev"),
        ("dns1035Label", "a-1"),
        ("qualifiedName", "example.com/My_Name.1"),
        ("qualifiedName", "name"),
        ("dns1123LabelPrefix", "gpu-"),
        ("dns1035LabelPrefix", "a-"),
        ("labelValue", ""),
        ("labelValue", "v1.2_x"),
        ("uri", "/relative/path"),
        ("uuid", "123E4567E89B12D3A456426614174000"),
        ("byte", "aGk="),
        ("date", "2024-02-29"),
        ("datetime", "2021-01-01t10:00:00.5+01:00"),
    ],
)
def test_valid_strings_give_none(name: str, value: str) -> None:
    assert FORMATS[name].check(value) == []
    assert ev(f"format.{name}().validate({value!r}) == optional.none()") is True


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("dns1123Label", "a.b", "must not contain dots"),
        ("dns1123Label", "a" * 64, "must be no more than 63 characters"),
        ("dns1123Label", "a\n", "a lowercase RFC 1123 label must consist of"),
        ("dns1035Label", "1a", "a DNS-1035 label must consist of"),
        ("qualifiedName", "/x", "prefix part must be non-empty"),
        ("qualifiedName", "x/", "name part must be non-empty"),
        ("qualifiedName", "x/" + "a" * 64, "name part must be no more than 63 bytes"),
        ("qualifiedName", "a/b/c", "a valid label key must consist of"),
        ("qualifiedName", "Ex.com/x", "prefix part a lowercase RFC 1123 subdomain"),
        ("labelValue", "-a", "a valid label must be an empty string or consist of"),
        ("uri", "x", 'parse "x": invalid URI for request'),
        ("uuid", "123e4567-e89b-12d3-a456", "does not match the UUID format"),
        ("byte", "aGk", "invalid base64"),
        ("date", "2021-02-30", "invalid date"),
        ("date", "21-02-03", "invalid date"),
        ("datetime", "2021-01-01T24:00:00Z", "invalid datetime"),
        ("datetime", "2021-01-01", "invalid datetime"),
    ],
)
def test_invalid_strings_give_kubernetes_messages(name: str, value: str, message: str) -> None:
    [first, *_] = FORMATS[name].check(value)
    assert first.startswith(message)
    assert ev(f"format.{name}().validate({value!r}).value()[0].startsWith({message!r})")


def test_regex_messages_keep_apimachinery_wording() -> None:
    assert FORMATS["dns1035Label"].check("1a") == [
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
        "with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name', "
        " or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
    ]


def test_prefix_formats_mask_a_trailing_dash_as_kubernetes_does() -> None:
    # maskTrailingDash replaces the last two characters by "a": "ab-" checks "aa".
    assert FORMATS["dns1123LabelPrefix"].check("ab-") == []
    assert FORMATS["dns1123LabelPrefix"].check("a.-") == []  # "a" + "a": the dot is gone
    with pytest.raises(CelEvalError, match="runtime error"):
        ev("format.dns1123LabelPrefix().validate('-') == optional.none()")


def test_named_lookup() -> None:
    assert ev("format.named('uuid').hasValue() && !format.named('nope').hasValue()") is True
    assert ev("format.named('dns1123Label').value() == format.dns1123Label()") is True
    assert ev("type(format.uuid()) == type(format.date())") is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("format.uuid(1).validate('x') == optional.none()", "found no matching overload"),
        ("format.bogus().validate('x') == optional.none()", "undeclared reference"),
    ],
)
def test_bad_calls_are_compile_errors(expression: str, message: str) -> None:
    error = compile_error(expression)
    assert error is not None and message in error.message


def test_wrong_argument_types_are_errors() -> None:
    with pytest.raises(CelEvalError, match="no such overload"):
        ev("format.uuid().validate(dyn(1)) == optional.none()")
    with pytest.raises(CelEvalError, match="no such overload"):
        ev("format.named(dyn(1)).hasValue()")


def test_validate_cost_is_kubernetes_estimate() -> None:
    """Kubernetes: ceil(ceil(size * 0.1) * 128 * 0.25); 'abc' has size 3, so 32."""
    base = compile_selector("!format.uuid().validate('').hasValue()").max_cost
    assert compile_selector("!format.uuid().validate('abc').hasValue()").max_cost == base + 32
    # device.driver is at most 63 bytes: ceil(6.3) * 32, plus 2 to read it.
    assert compile_selector("!format.uuid().validate(device.driver).hasValue()").max_cost == (
        base + 7 * 32 + 2
    )
