"""sharegpu's answer to an oracle case, in the oracle's shape, and the comparison of the two.

Answers are compared by what matters to a user, never by message text: a selector's outcome
(compile error, evaluation error, true, false); an allocation's outcome (allocated,
unsatisfiable, or an error of a class named by :func:`error_class`) and, when both allocate,
per claim the devices in upstream's order, the consumed capacity (as exact amounts), whether a
result is a share, the node selector and the configuration. Share IDs are random upstream and
are compared only for presence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from api.quantity import QuantityError, parse_quantity
from sharegpu.allocator import AllocatorInputError, allocate_pod, seeded_share_ids
from sharegpu.cel import CelCompileError, CelEvalError, compile_selector, device_activation

Answer = dict[str, Any]

#: Error classes, by the text both sides use (sharegpu writes kube-scheduler's messages).
ERROR_CLASSES: Final = (
    ("cel-compile", re.compile(r"CEL compile error|compilation failed")),
    ("cel-runtime", re.compile(r"CEL runtime error|selector #\d+ on device")),
    ("class-missing", re.compile(r"could not retrieve device class")),
    ("all-pool-not-ready", re.compile(r"asks for all devices, but resource pool")),
    ("invalid-pools", re.compile(r"invalid resource pools")),
    ("result-limit", re.compile(r"exceeds the claim limit")),
    ("constraint-all", re.compile(r"claim constraint would not be satisfied")),
    ("search-limit", re.compile(r"search limit of \d+ steps")),
)


@dataclass(frozen=True)
class Disagreement:
    """One difference between upstream and sharegpu on a case: which ``aspect`` (outcome,
    devices, consumed-capacity, share, node-selector, config) and what each side said."""

    case_id: str
    aspect: str
    upstream: Any
    sharegpu: Any

    def describe(self) -> str:
        """One line for a report."""
        return (
            f"{self.case_id}: {self.aspect}: upstream {self.upstream!r}, sharegpu {self.sharegpu!r}"
        )


def error_class(message: str) -> str:
    """The class of an allocation error message (``other`` when none matches)."""
    for name, pattern in ERROR_CLASSES:
        if pattern.search(message):
            return name
    return "other"


# --- sharegpu's answers ------------------------------------------------------------------


def sharegpu_cel(case: Mapping[str, Any]) -> Answer:
    """sharegpu's answer to a ``cel`` case."""
    try:
        program = compile_selector(case["expression"])
    except CelCompileError as exc:
        return {"compileError": str(exc)}
    try:
        return {"value": program.evaluate(device_activation(case["driver"], case["device"]))}
    except CelEvalError as exc:
        return {"evalError": str(exc)}


def sharegpu_allocate(case: Mapping[str, Any]) -> Answer:
    """sharegpu's answer to an ``allocate`` case: all claims of one pod jointly, or with
    ``sequence`` each claim on its own, seeing the results of the ones before."""
    node = case.get("node") or {}
    meta = node.get("metadata") or {}
    claims = list(case["claims"])
    groups = [[c] for c in claims] if case.get("sequence") else [claims]
    held = list(case.get("allocatedClaims") or [])
    results: list[Any] = []
    for step, group in enumerate(groups):
        try:
            outcomes = allocate_pod(
                group,
                case.get("slices") or [],
                case.get("classes") or [],
                held,
                node=str(meta.get("name") or ""),
                node_labels=meta.get("labels") or {},
                share_ids=seeded_share_ids(step),
            )
        except AllocatorInputError as exc:
            return {"error": f"invalid input: {exc}"}
        if not all(o.allocation is not None for o in outcomes):
            errors = [o.error for o in outcomes if o.error]
            return {"error": errors[0]} if errors else {"unsatisfiable": True}
        for claim, outcome in zip(group, outcomes, strict=True):
            results.append(outcome.allocation)
            held.append({**claim, "status": {"allocation": outcome.allocation}})
    return {"results": results}


def sharegpu_answer(case: Mapping[str, Any]) -> Answer:
    """sharegpu's answer to a case of either kind."""
    if case["kind"] == "cel":
        return sharegpu_cel(case)
    return sharegpu_allocate(case)


# --- comparison ----------------------------------------------------------------------------


def cel_outcome(answer: Mapping[str, Any]) -> str:
    """``compile-error``, ``eval-error``, ``true``, ``false``, or ``upstream-panic`` (the Go
    code panicked: no answer to agree with) or ``oracle-input-error``."""
    if "inputError" in answer:
        panicked = str(answer["inputError"]).startswith("upstream panicked")
        return "upstream-panic" if panicked else "oracle-input-error"
    if "compileError" in answer:
        return "compile-error"
    if "evalError" in answer:
        return "eval-error"
    return "true" if answer.get("value") else "false"


def allocation_outcome(answer: Mapping[str, Any]) -> str:
    """``allocated``, ``unsatisfiable``, ``error:<class>``, ``upstream-timeout`` (upstream's
    search ran past the oracle's bound) or ``oracle-input-error``."""
    if answer.get("results") is not None or answer.get("allocated"):
        return "allocated"
    if answer.get("unsatisfiable"):
        return "unsatisfiable"
    if answer.get("inputError"):
        return "oracle-input-error"
    if answer.get("timedOut"):
        return "upstream-timeout"
    return f"error:{error_class(str(answer.get('error', '')))}"


def _amount(value: Any) -> Decimal | str:
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return f"unparsable {value!r}"


def _device_key(result: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(result.get("request")),
        str(result.get("driver")),
        str(result.get("pool")),
        str(result.get("device")),
    )


def _results(allocation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(((allocation.get("devices") or {}).get("results")) or [])


def _configs(allocation: Mapping[str, Any]) -> list[Any]:
    return list(((allocation.get("devices") or {}).get("config")) or [])


def _flags(result: Mapping[str, Any]) -> tuple[Any, ...]:
    """A result's fields besides device, capacity and share: admin access, tolerations and
    binding conditions."""
    return (
        bool(result.get("adminAccess")),
        result.get("tolerations") or [],
        result.get("bindingConditions") or [],
        result.get("bindingFailureConditions") or [],
    )


def _claim_aspects(
    upstream: Mapping[str, Any], ours: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The aspects of one claim's allocation where the two differ."""
    out: dict[str, tuple[Any, Any]] = {}
    up_results, our_results = _results(upstream), _results(ours)
    up_devices = [_device_key(r) for r in up_results]
    our_devices = [_device_key(r) for r in our_results]
    if up_devices != our_devices:
        out["devices"] = (up_devices, our_devices)
        return out
    up_cap = [
        {k: _amount(v) for k, v in (r.get("consumedCapacity") or {}).items()} for r in up_results
    ]
    our_cap = [
        {k: _amount(v) for k, v in (r.get("consumedCapacity") or {}).items()} for r in our_results
    ]
    if up_cap != our_cap:
        out["consumed-capacity"] = (
            [{k: str(v) for k, v in c.items()} for c in up_cap],
            [{k: str(v) for k, v in c.items()} for c in our_cap],
        )
    up_share = [r.get("shareID") is not None for r in up_results]
    our_share = [r.get("shareID") is not None for r in our_results]
    if up_share != our_share:
        out["share"] = (up_share, our_share)
    up_flags = [_flags(r) for r in up_results]
    our_flags = [_flags(r) for r in our_results]
    if up_flags != our_flags:
        out["result-fields"] = (up_flags, our_flags)
    if (upstream.get("nodeSelector") or None) != (ours.get("nodeSelector") or None):
        out["node-selector"] = (upstream.get("nodeSelector"), ours.get("nodeSelector"))
    if _configs(upstream) != _configs(ours):
        out["config"] = (_configs(upstream), _configs(ours))
    return out


def compare(
    case_id: str, kind: str, upstream: Mapping[str, Any], ours: Mapping[str, Any]
) -> list[Disagreement]:
    """Every aspect in which ``ours`` differs from ``upstream`` on one case."""
    if kind == "cel":
        up, me = cel_outcome(upstream), cel_outcome(ours)
        if up == "upstream-panic":
            return []  # cel-go crashed on the case: there is no answer to agree with
        return [] if up == me else [Disagreement(case_id, "outcome", up, me)]
    up, me = allocation_outcome(upstream), allocation_outcome(ours)
    if up == "upstream-timeout":
        return []  # kube-scheduler gives up on the case too: there is no answer to agree with
    if up != me:
        return [Disagreement(case_id, "outcome", up, me)]
    if up != "allocated":
        return []
    # aspect -> (upstream's, sharegpu's), each by claim index
    found: dict[str, tuple[dict[int, Any], dict[int, Any]]] = {}
    pairs = zip(upstream.get("results") or [], ours.get("results") or [], strict=True)
    for index, (u, m) in enumerate(pairs):
        for aspect, (a, b) in _claim_aspects(u, m).items():
            theirs, mine = found.setdefault(aspect, ({}, {}))
            theirs[index], mine[index] = a, b
    return [Disagreement(case_id, aspect, a, b) for aspect, (a, b) in found.items()]
