"""A ResourceClaim's device requests, constraints and configs in the allocator's terms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .capacity import Amount, amount
from .model import AllocatorInputError


@dataclass(frozen=True)
class Selector:
    """One CEL selector and where it came from (``class <name>`` or ``request``)."""

    source: str
    index: int
    expression: str


@dataclass
class Alternative:
    """What to allocate for a request: the request itself, or one ``firstAvailable`` entry."""

    request: str
    subrequest: str | None
    class_name: str
    selectors: list[Selector]
    all_mode: bool
    count: int
    admin_access: bool
    tolerations: list[Mapping[str, Any]]
    capacity_requests: dict[str, Amount]
    #: Whether ``class_name`` names an existing class; the search stops on a missing one
    #: where kube-scheduler's does, when it validates this entry (requests in order).
    class_found: bool = True
    #: ``spec`` dict of the entry (``exactly`` or the subrequest), for messages.
    source: Mapping[str, Any] = field(repr=False, default_factory=dict)

    @property
    def full_name(self) -> str:
        """``req`` or ``req/sub``: the name written to ``results[].request``."""
        return self.request if self.subrequest is None else f"{self.request}/{self.subrequest}"


@dataclass
class Request:
    """One entry of ``spec.devices.requests``; several alternatives for ``firstAvailable``."""

    name: str
    alternatives: list[Alternative]


@dataclass(frozen=True)
class Constraint:
    """``matchAttribute`` or ``distinctAttribute`` over ``requests`` (empty: all requests)."""

    kind: str
    attribute: str
    requests: frozenset[str]

    def applies_to(self, alt: Alternative) -> bool:
        """Whether devices picked for ``alt`` are subject to this constraint."""
        if not self.requests:
            return True
        return alt.request in self.requests or alt.full_name in self.requests


def _capacity_requests(entry: Mapping[str, Any], path: str) -> dict[str, Amount]:
    requests = (entry.get("capacity") or {}).get("requests") or {}
    return {
        str(name): amount(value, f"{path}.capacity.requests[{name}]")
        for name, value in requests.items()
    }


def _alternative(
    entry: Mapping[str, Any],
    request: str,
    subrequest: str | None,
    classes: Mapping[str, Mapping[str, Any]],
    path: str,
    missing_classes: list[str],
) -> Alternative:
    class_name = entry.get("deviceClassName")
    if not class_name:
        raise AllocatorInputError(f"{path}.deviceClassName: required")
    selectors: list[Selector] = []
    device_class = classes.get(str(class_name))
    if device_class is None:
        missing_classes.append(str(class_name))
    else:
        for i, sel in enumerate((device_class.get("spec") or {}).get("selectors") or []):
            expression = (sel.get("cel") or {}).get("expression")
            if not expression:
                raise AllocatorInputError(
                    f"deviceclass {class_name}: spec.selectors[{i}].cel.expression: required"
                )
            selectors.append(Selector(f"class {class_name}", i, str(expression)))
    for i, sel in enumerate(entry.get("selectors") or []):
        expression = (sel.get("cel") or {}).get("expression")
        if not expression:
            raise AllocatorInputError(f"{path}.selectors[{i}].cel.expression: required")
        selectors.append(Selector("request", i, str(expression)))
    mode = entry.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise AllocatorInputError(f"{path}.allocationMode: {mode!r} is not one of ExactCount, All")
    raw_count = entry.get("count")
    count = 1 if raw_count is None else int(raw_count)
    if mode == "ExactCount" and count < 1:
        raise AllocatorInputError(f"{path}.count: must be at least 1, got {count}")
    return Alternative(
        request=request,
        subrequest=subrequest,
        class_name=str(class_name),
        selectors=selectors,
        all_mode=mode == "All",
        count=count,
        admin_access=bool(entry.get("adminAccess")),
        tolerations=list(entry.get("tolerations") or []),
        capacity_requests=_capacity_requests(entry, path),
        class_found=device_class is not None,
        source=entry,
    )


def parse_requests(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]
) -> tuple[list[Request], list[Constraint], list[str]]:
    """Requests, constraints and the names of referenced classes that do not exist."""
    devices = ((claim.get("spec") or {}).get("devices")) or {}
    missing: list[str] = []
    requests: list[Request] = []
    for i, raw in enumerate(devices.get("requests") or []):
        name = raw.get("name")
        path = f"spec.devices.requests[{i}]"
        if not name:
            raise AllocatorInputError(f"{path}.name: required")
        if raw.get("firstAvailable"):
            alts = []
            for j, sub in enumerate(raw["firstAvailable"]):
                if not sub.get("name"):
                    raise AllocatorInputError(f"{path}.firstAvailable[{j}].name: required")
                alts.append(
                    _alternative(
                        sub, name, str(sub["name"]), classes, f"{path}.firstAvailable[{j}]", missing
                    )
                )
            requests.append(Request(str(name), alts))
        elif raw.get("exactly") or raw.get("deviceClassName"):
            entry = raw.get("exactly") or raw
            requests.append(
                Request(
                    str(name),
                    [_alternative(entry, str(name), None, classes, f"{path}.exactly", missing)],
                )
            )
        else:
            raise AllocatorInputError(f"{path}: exactly one of exactly, firstAvailable required")
    constraints = []
    for i, raw in enumerate(devices.get("constraints") or []):
        for kind in ("matchAttribute", "distinctAttribute"):
            if raw.get(kind):
                attribute = str(raw[kind])
                if "/" not in attribute:
                    raise AllocatorInputError(
                        f"spec.devices.constraints[{i}].{kind}: {attribute!r} must be fully "
                        "qualified (domain/name)"
                    )
                constraints.append(
                    Constraint(kind, attribute, frozenset(raw.get("requests") or []))
                )
                break
        else:
            raise AllocatorInputError(
                f"spec.devices.constraints[{i}]: one of matchAttribute, distinctAttribute required"
            )
    return requests, constraints, sorted(set(missing))


def claim_name(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` of a claim (``name`` alone when it has no namespace)."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name", "")
    return f"{ns}/{name}" if ns else str(name)
