"""Why a claim cannot be allocated: per request, each candidate device's first failing check
against the node's current allocations (constraints judged against the other requests'
eligible devices), and a one-line summary; the summary of a request for several devices that
must share an attribute value (``matchAttribute``) says how many eligible devices share each
value when too few do."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from .attributes import attribute, show
from .model import Rejection, RequestReport
from .pools import Candidate
from .requests import Alternative, Constraint
from .search import ClaimPlan, Search

if TYPE_CHECKING:
    from .allocator import Allocator


def explain(owner: Allocator, plan: ClaimPlan, pod_claims: int = 1) -> list[RequestReport]:
    """Per request of ``plan`` (per subrequest for ``firstAvailable``): every candidate's
    first failing check against the node's current allocations, and a summary.
    ``pod_claims`` is how many claims were allocated together with it (its pod's)."""
    fresh = Search(owner, [plan])
    alts = [alt for request in plan.requests for alt in request.alternatives]
    eligible: dict[int, list[Candidate]] = {}
    rejections: dict[int, list[Rejection]] = {}
    for alt in alts:
        ok, bad = [], []
        for cand in owner.candidates:
            if not cand.on_node:
                continue
            outcome = fresh.check(0, alt, cand, constraints=False)
            if isinstance(outcome, Rejection):
                bad.append(outcome)
            else:
                ok.append(cand)
        eligible[id(alt)], rejections[id(alt)] = ok, bad
    for constraint in plan.constraints:
        members = [a for a in alts if constraint.applies_to(a)]
        for alt in members:
            others = [o for o in members if o.request != alt.request]
            still_ok = []
            for cand in eligible[id(alt)]:
                reason = _constraint_reason(constraint, cand, others, eligible)
                if reason is None:
                    still_ok.append(cand)
                else:
                    rejections[id(alt)].append(reason)
            eligible[id(alt)] = still_ok
    reports = []
    for alt in alts:
        ok, bad = eligible[id(alt)], rejections[id(alt)]
        notes = [
            note
            for constraint in plan.constraints
            if (note := _group_note(constraint, alt, ok)) is not None
        ]
        order = {c.id: c.position for c in owner.candidates}
        bad.sort(key=lambda r: order.get(r.device, 0))
        reports.append(
            RequestReport(
                request=alt.full_name,
                needed=None if alt.all_mode else alt.count,
                eligible=[c.id for c in ok],
                rejections=bad,
                summary="; ".join([_summary(owner.node, alt, ok, bad, pod_claims), *notes]),
            )
        )
    return reports


def _constraint_reason(
    constraint: Constraint,
    cand: Candidate,
    others: list[Alternative],
    eligible: dict[int, list[Candidate]],
) -> Rejection | None:
    value = attribute(cand, constraint.attribute)
    details: dict[str, Any] = {"constraint": constraint.kind, "attribute": constraint.attribute}
    if value is None:
        return Rejection(
            "constraint",
            cand.id,
            f"{constraint.kind} {constraint.attribute}: device lacks the attribute",
            details,
        )
    details["value"] = show(value)
    if constraint.kind != "matchAttribute":
        return None
    by_request: dict[str, bool] = {}
    for other in others:
        has = any(
            (c.id != cand.id or cand.multi) and attribute(c, constraint.attribute) == value
            for c in eligible[id(other)]
        )
        by_request[other.request] = by_request.get(other.request, False) or has
    missing = sorted(r for r, has in by_request.items() if not has)
    if not missing:
        return None
    return Rejection(
        "constraint",
        cand.id,
        f"matchAttribute {constraint.attribute}: device has {show(value)}, but no eligible "
        f"device of request {', '.join(missing)} has that value",
        details,
    )


#: The most attribute values a group note lists.
_GROUPS_SHOWN = 4


def _group_note(constraint: Constraint, alt: Alternative, ok: list[Candidate]) -> str | None:
    """For a ``matchAttribute`` over ``alt`` when it asks for several devices: how many
    distinct eligible devices share each value, when no value has ``alt.count`` of them."""
    if constraint.kind != "matchAttribute" or alt.all_mode or alt.count < 2:
        return None
    if not constraint.applies_to(alt):
        return None
    groups: dict[str, set[Any]] = defaultdict(set)
    for cand in ok:
        value = attribute(cand, constraint.attribute)
        if value is not None:
            groups[show(value)].add(cand.id)
    sizes = sorted(((len(ids), value) for value, ids in groups.items()), key=lambda g: -g[0])
    if sizes and sizes[0][0] >= alt.count:
        return None
    shown = ", ".join(f"{value}: {n}" for n, value in sizes[:_GROUPS_SHOWN])
    more = f", {len(sizes) - _GROUPS_SHOWN} more" if len(sizes) > _GROUPS_SHOWN else ""
    return (
        f"matchAttribute {constraint.attribute}: {alt.count} devices must share one value, "
        f"at most {sizes[0][0] if sizes else 0} eligible do"
        + (f" ({shown}{more})" if shown else "")
    )


def _summary(
    node: str, alt: Alternative, ok: list[Candidate], bad: list[Rejection], pod_claims: int
) -> str:
    counts: dict[str, int] = defaultdict(int)
    for r in bad:
        counts[r.kind] += 1
    why = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    total = len(ok) + len(bad)
    if alt.all_mode:
        if not ok:
            return f"asks for all matching devices, but none of {total} is usable ({why})"
        return f"asks for all matching devices; {len(ok)} usable" + (f", {why}" if why else "")
    if len(ok) < alt.count:
        if total == 0:
            return f"needs {alt.count} device(s); no device of any pool is visible from node {node}"
        return f"needs {alt.count} device(s), {len(ok)} of {total} eligible ({why})"
    return (
        f"needs {alt.count} device(s), {len(ok)} eligible on their own; the claim's requests "
        "cannot be satisfied together"
        + (" with the other claims of the pod" if pod_claims > 1 else "")
        + " (constraints, or capacity and counters they share)"
    )
