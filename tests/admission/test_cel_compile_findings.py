"""The webhook's CEL findings: real compile errors deny with Kubernetes' wording; what
Kubernetes accepts never does."""

from __future__ import annotations

import pytest

from sharegpu.admission.checks import ERROR, WARNING, compile_findings

D = "device.attributes['gpu.sharegpu.dev']"
NESTED = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"


@pytest.mark.parametrize(
    "expression",
    [
        f"{D}.?productName.orValue('') == 'H100'",
        f"{D}[?'productName'].hasValue()",
        # An optional element beside a string is refused by Kubernetes (the list's element type
        # is the attribute's dyn); beside another attribute it is accepted.
        f"[?{D}.?uuid, {D}.?productName.orValue('')].size() > 0",
        f"{D}.transformMap(k, v, k).size() > 0",
        f"{D}.exists(k, v, k == 'uuid' && v != '')",
        f"{D}.productName.includes('H100')",
    ],
)
def test_kubernetes_features_are_checked_and_accepted(expression: str) -> None:
    assert compile_findings(expression, "p") == []


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f"{D}.productName.bogus()", "undeclared reference to 'bogus'"),
        (f"{D}.productName ==", "Syntax error"),
        (
            f"{D}.productName.startsWith('a', 'b')",
            "found no matching overload for 'startsWith' applied to 'dyn.(string, string)'",
        ),
        (f"{D}.?productName.orValue('') == 1 && '\\q' == ''", "invalid escape sequence \\q"),
        (
            f"{NESTED}.all(a, {NESTED}.all(b, {NESTED}.all(c, {NESTED}.all(d, "
            f"{NESTED}.all(e, {NESTED}.all(f, a < 100))))))",
            "too complex, exceeds cost limit",
        ),
    ],
)
def test_true_errors_deny_with_kubernetes_wording(expression: str, message: str) -> None:
    [finding] = compile_findings(expression, "p")
    assert finding.severity == ERROR
    assert message in finding.message


def test_every_kubernetes_function_is_checked() -> None:
    """Each function of Kubernetes' CEL environment is implemented, so a misuse of one is a
    compile error (as the API server reports it), never a not-checked warning."""
    for expression in (
        "sets.bogus([1], [1])",
        f"format.bogus().validate({D}.productName) == optional.none()",
        f"isIP(cidr({D}.productName))",
    ):
        [finding] = compile_findings(expression, "p")
        assert finding.severity == ERROR, finding
    assert (
        compile_findings(f"!format.dns1123Label().validate({D}.productName).hasValue()", "p") == []
    )


def test_selector_nested_deeper_than_the_compiler_follows_is_not_checked() -> None:
    expression = f"{D}.productName == " + "(" * 300 + "'x'" + ")" * 300
    [finding] = compile_findings(expression, "p")
    assert finding.severity == WARNING
    assert finding.message.startswith("not checked: the selector is nested deeper")


def test_implemented_function_with_wrong_arity_denies() -> None:
    [finding] = compile_findings(f"size({D}.productName, 1) == 1", "p")
    assert finding.severity == ERROR
