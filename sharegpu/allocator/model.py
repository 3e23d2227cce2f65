"""Data types of the allocator: device identities, rejection reasons, per-request reports,
and the outcome of one allocation attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Why a candidate device cannot serve a request.
RejectionKind = Literal[
    "selector-false",
    "selector-error",
    "capacity-short",
    "capacity-policy",
    "counter-short",
    "tainted",
    "pool-incomplete",
    "pool-invalid",
    "already-allocated",
    "constraint",
    "other-node",
]
REJECTION_KINDS: tuple[str, ...] = (
    "selector-false",
    "selector-error",
    "capacity-short",
    "capacity-policy",
    "counter-short",
    "tainted",
    "pool-incomplete",
    "pool-invalid",
    "already-allocated",
    "constraint",
)


class AllocatorInputError(ValueError):
    """Malformed input (claim, class or slice); the message names the field path."""


@dataclass(frozen=True, order=True)
class DeviceId:
    """A device's identity across the cluster: driver, pool and device name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class Rejection:
    """Why ``device`` cannot serve a request.

    ``details`` holds the kind's structured facts (all JSON-serialisable):

    - selector-false: ``source`` ("class <name>" or "request"), ``index``, ``expression``
    - selector-error: the same plus ``error`` (and ``missingKey``, the attribute or
      capacity name whose absence failed the expression, when that was the cause)
    - capacity-short: ``capacity``, ``requested``, ``available``, ``shortBy``
      (``available`` and ``shortBy`` are ``None`` when the device lacks the capacity)
    - capacity-policy: ``capacity``, ``requested``, ``rounded``, ``policy``
    - counter-short: ``counterSet``, ``counter``, ``needed``, ``available``, ``shortBy``
    - tainted: ``key``, ``value``, ``effect``, and ``deviceTaintRule`` (the rule's name) when
      the taint comes from a DeviceTaintRule rather than the slice
    - pool-incomplete / pool-invalid: ``pool``, ``problem``
    - already-allocated: ``by`` (claim ``namespace/name``, or ``request <name>`` for a pick
      of the claim being allocated)
    - constraint: ``constraint`` ("matchAttribute"/"distinctAttribute"), ``attribute``,
      ``value`` (when the device has it)
    - other-node: ``node`` (never reported: a device of a ``perDeviceNodeSelection`` slice
      that is not available on the node, left out after its selectors, as kube-scheduler
      does; explanations list only the node's devices, so it is not in
      :data:`REJECTION_KINDS`)
    """

    kind: RejectionKind
    device: DeviceId
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"kind", "driver", "pool", "device", "message", "details"}``."""
        return {
            "kind": self.kind,
            "driver": self.device.driver,
            "pool": self.device.pool,
            "device": self.device.device,
            "message": self.message,
            "details": dict(self.details),
        }


@dataclass
class RequestReport:
    """Why a request (or one ``firstAvailable`` subrequest, ``req/sub``) was not satisfied.

    ``rejections`` lists every candidate device that cannot serve it, in search order, each
    with its first failing check against the node's current allocations; ``eligible`` lists
    the devices that pass every per-device check. ``needed`` is ``None`` for ``All``.
    """

    request: str
    needed: int | None
    eligible: list[DeviceId]
    rejections: list[Rejection]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "request": self.request,
            "needed": "All" if self.needed is None else self.needed,
            "eligible": [str(d) for d in self.eligible],
            "rejections": [r.to_dict() for r in self.rejections],
            "summary": self.summary,
        }


@dataclass
class AllocationOutcome:
    """Either ``allocation`` (the ``status.allocation`` object) or the failure explanation.

    ``error`` is set when the allocation stopped early as kube-scheduler stops (a CEL error, a
    missing class, an ``All`` request over an incomplete pool, the search limit); ``reports``
    explains every request of a failed claim.
    """

    claim: str
    allocation: dict[str, Any] | None = None
    error: str | None = None
    reports: list[RequestReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the claim was allocated."""
        return self.allocation is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {"claim": self.claim, "allocated": self.ok}
        if self.allocation is not None:
            out["allocation"] = self.allocation
        if self.error is not None:
            out["error"] = self.error
        if self.reports:
            out["reports"] = [r.to_dict() for r in self.reports]
        return out
