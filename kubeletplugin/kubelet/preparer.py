"""The contract between the thin gRPC layer and the state module that prepares claims.

The gRPC servicers (v1 and v1beta1) translate requests into :class:`ClaimRef` lists, call a
:class:`ClaimPreparer`, and translate :class:`PrepareOutcome` / :class:`UnprepareOutcome` back.
Invariants every implementation keeps:

- every requested claim UID gets exactly one outcome (kubelet retries missing ones);
- a per-claim failure is an outcome with ``error`` set, never an exception;
- calls are idempotent and may run concurrently for different claims;
- a preparer only ever sees references that pass :func:`claim_ref_problem` (the gRPC layer
  answers the others with a per-claim error), so a claim UID is safe inside a file name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from sharegpu.kube.slicerules import is_dns_label, is_dns_subdomain

#: A claim UID as the API server assigns it (a UUID) or a test writes it: letters, digits and
#: ``-``, starting with a letter or digit, at most 128 characters. No ``/``, ``.`` or NUL, so a
#: UID can never lead a path built from it out of its directory.
CLAIM_UID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
#: How much of a rejected value an error message shows.
_SHOWN: Final = 64


@dataclass(frozen=True)
class ClaimRef:
    """What kubelet sends about a claim: no allocation data, so it must be fetched."""

    namespace: str
    uid: str
    name: str


def _show(value: str) -> str:
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def is_claim_uid(value: str) -> bool:
    """Whether ``value`` has the shape of a claim UID (:data:`CLAIM_UID_PATTERN`)."""
    return CLAIM_UID_PATTERN.fullmatch(value) is not None


def claim_ref_problem(ref: ClaimRef) -> str | None:
    """Why ``ref`` cannot name a ResourceClaim, or None: the UID must match
    :data:`CLAIM_UID_PATTERN`, the namespace be a DNS label and the name a DNS subdomain."""
    if not is_claim_uid(ref.uid):
        return f"uid {_show(ref.uid)} is not a UID (letters, digits and '-', at most 128)"
    if not is_dns_label(ref.namespace):
        return f"namespace {_show(ref.namespace)} is not a DNS label"
    if not is_dns_subdomain(ref.name):
        return f"name {_show(ref.name)} is not a DNS subdomain"
    return None


class PreparedDevice(Protocol):
    """One allocated device of a prepared claim, as the gRPC layer answers it to kubelet.

    A preparer answers with its own record type (read-only attributes suffice). ``request_names``
    are the requests the device serves as allocated (``req``, or ``req/sub`` for an alternative
    of ``firstAvailable``): the gRPC layer reduces them to base names, in this one place.
    ``cdi_device_ids`` are fully qualified CDI IDs (``vendor/class=name``); ``share_id`` is set
    for consumable-capacity shares (sent to v1 kubelets only).
    """

    @property
    def request_names(self) -> Sequence[str]: ...

    @property
    def pool_name(self) -> str: ...

    @property
    def device_name(self) -> str: ...

    @property
    def cdi_device_ids(self) -> Sequence[str]: ...

    @property
    def share_id(self) -> str | None: ...


@dataclass(frozen=True)
class PrepareOutcome:
    """Result of preparing one claim: devices, or a non-empty ``error``."""

    devices: tuple[PreparedDevice, ...] = field(default=())
    error: str = ""


@dataclass(frozen=True)
class UnprepareOutcome:
    """Result of unpreparing one claim: empty ``error`` on success (also for unknown claims)."""

    error: str = ""


class ClaimPreparer(Protocol):
    """Prepares and unprepares claims; implemented by the state module."""

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]:
        """Prepare ``claims``; returns one outcome per claim UID."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        """Unprepare ``claims``; returns one outcome per claim UID."""
        ...
