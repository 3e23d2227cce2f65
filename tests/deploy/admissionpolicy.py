"""Evaluate a rendered ValidatingAdmissionPolicy on a request, with sharegpu's Kubernetes CEL.

The way kube-apiserver applies a policy: the request is in scope only if every match condition
is true; then the variables are evaluated in order (each sees the earlier ones as
``variables.<name>``), and each validation that is false denies with its message (or the
evaluated ``messageExpression``). Only the parts the chart's policies use are modelled:
``matchConstraints`` is checked by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharegpu.cel.environment import compile_expression

_SCOPE = {"request": "dyn", "object": "dyn", "oldObject": "dyn", "variables": "dyn"}


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    return compile_expression(expression, _SCOPE)(dict(activation))


def denials(
    policy: Mapping[str, Any],
    request: Mapping[str, Any],
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
) -> list[str] | None:
    """The messages ``policy`` denies the request with ([] when allowed), or None when its match
    conditions leave the request out of scope."""
    spec = policy["spec"]
    activation: dict[str, Any] = {"request": request, "object": obj, "oldObject": old}
    variables: dict[str, Any] = {}
    activation["variables"] = variables
    for condition in spec.get("matchConditions", []):
        if _evaluate(condition["expression"], activation) is not True:
            return None
    for variable in spec.get("variables", []):
        variables[variable["name"]] = _evaluate(variable["expression"], activation)
    messages = []
    for validation in spec["validations"]:
        if _evaluate(validation["expression"], activation) is True:
            continue
        if "messageExpression" in validation:
            messages.append(str(_evaluate(validation["messageExpression"], activation)))
        else:
            messages.append(" ".join(validation["message"].split()))
    return messages


def user(name: str, node: str | None) -> dict[str, Any]:
    """``request.userInfo`` of a ServiceAccount token, bound to ``node`` (KEP-4193) if given."""
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    return {"username": name, "extra": extra}
