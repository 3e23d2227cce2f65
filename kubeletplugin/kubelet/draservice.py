"""The kubelet-facing DRA services (v1 and v1beta1), both backed by one :class:`DraService`.

:class:`DraService` is the single place that turns whatever the :class:`ClaimPreparer` does
into answers kubelet can use. It guarantees, whatever the preparer returns or raises:

- every requested claim UID gets exactly one entry (a missing one would be retried forever);
- a preparer exception becomes a per-claim ``error`` for every claim of the call, never a
  gRPC-level error (kubelet ignores a response that comes with a gRPC error);
- request names are answered as base names (``req/sub`` -> ``req``), duplicates removed, order
  kept: the preparer answers with the names as allocated and they are reduced here, once;
- ``share_id`` is sent only by the v1 servicer (v1beta1 has no such field);
- an outcome with an ``error`` is answered without devices;
- a claim reference that cannot name a claim (a UID with ``/`` or ``..``, a namespace or name
  that is no DNS name) gets a per-claim error and never reaches the preparer.

The layer holds no lock: concurrent calls reach the preparer concurrently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeVar

import grpc

from kubeletplugin.kubelet.grpcapi.gen import dra_v1_pb2, dra_v1beta1_pb2
from kubeletplugin.kubelet.preparer import (
    ClaimPreparer,
    ClaimRef,
    PrepareOutcome,
    UnprepareOutcome,
    claim_ref_problem,
)
from kubeletplugin.model import base_request_names

log = logging.getLogger(__name__)

_Outcome = TypeVar("_Outcome", PrepareOutcome, UnprepareOutcome)

MISSING_OUTCOME_ERROR = "the driver returned no result for this claim"
MISSING_UID_ERROR = "kubelet sent a claim without a UID"
INVALID_REFERENCE_ERROR = "kubelet sent an invalid claim reference"


def _unique_claims(claims: Iterable[ClaimRef]) -> list[ClaimRef]:
    by_uid: dict[str, ClaimRef] = {}
    for claim in claims:
        by_uid.setdefault(claim.uid, claim)
    return list(by_uid.values())


def _describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class DraService:
    """Calls a :class:`ClaimPreparer` and enforces the guarantees in the module docstring."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        """One outcome per distinct requested UID, request names reduced to base names."""
        valid, outcomes = self._split_invalid(claims, PrepareOutcome)
        if valid:
            try:
                returned: Mapping[str, PrepareOutcome] = self._preparer.prepare(valid)
            except Exception as err:
                log.exception("preparing claims %s failed", [c.uid for c in valid])
                returned = {
                    c.uid: PrepareOutcome(error=f"prepare failed: {_describe(err)}") for c in valid
                }
            outcomes.update(self._complete(valid, returned, PrepareOutcome, "prepare"))
        return outcomes

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareOutcome]:
        """One outcome per distinct requested UID."""
        valid, outcomes = self._split_invalid(claims, UnprepareOutcome)
        if valid:
            try:
                returned: Mapping[str, UnprepareOutcome] = self._preparer.unprepare(valid)
            except Exception as err:
                log.exception("unpreparing claims %s failed", [c.uid for c in valid])
                returned = {
                    c.uid: UnprepareOutcome(error=f"unprepare failed: {_describe(err)}")
                    for c in valid
                }
            outcomes.update(self._complete(valid, returned, UnprepareOutcome, "unprepare"))
        return outcomes

    @staticmethod
    def _split_invalid(
        claims: Sequence[ClaimRef], outcome_type: type[_Outcome]
    ) -> tuple[list[ClaimRef], dict[str, _Outcome]]:
        unique = _unique_claims(claims)
        invalid: dict[str, _Outcome] = {}
        for c in unique:
            problem = claim_ref_problem(c) if c.uid else None
            if not c.uid:
                invalid[c.uid] = outcome_type(error=MISSING_UID_ERROR)
            elif problem is not None:
                log.warning("kubelet sent an invalid claim reference: %s", problem)
                invalid[c.uid] = outcome_type(error=f"{INVALID_REFERENCE_ERROR}: {problem}")
        return [c for c in unique if c.uid not in invalid], invalid

    @staticmethod
    def _complete(
        claims: Sequence[ClaimRef],
        returned: Mapping[str, _Outcome],
        outcome_type: type[_Outcome],
        verb: str,
    ) -> dict[str, _Outcome]:
        result: dict[str, _Outcome] = {}
        for claim in claims:
            outcome = returned.get(claim.uid)
            if outcome is None:
                log.error("%s of claim %s returned no outcome", verb, claim.uid)
                outcome = outcome_type(error=MISSING_OUTCOME_ERROR)
            result[claim.uid] = outcome
        extra = set(returned) - set(result)
        if extra:
            log.warning("%s returned outcomes for claims not asked for: %s", verb, sorted(extra))
        return result


class _DraServicer:
    """Translates one DRAPlugin API version to and from :class:`DraService`."""

    def __init__(self, service: DraService, pb: ModuleType, with_share_id: bool) -> None:
        self._service = service
        self._pb = pb
        self._with_share_id = with_share_id
        self._api = str(pb.DESCRIPTOR.package)

    @staticmethod
    def _claims(request: Any) -> list[ClaimRef]:
        return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        claims = self._claims(request)
        log.debug("%s: NodePrepareResources for %d claim(s)", self._api, len(claims))
        outcomes = self._service.prepare(claims)
        response = self._pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                item = entry.devices.add(
                    request_names=base_request_names(device.request_names),
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self._with_share_id and device.share_id:
                    item.share_id = device.share_id
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        claims = self._claims(request)
        log.debug("%s: NodeUnprepareResources for %d claim(s)", self._api, len(claims))
        outcomes = self._service.unprepare(claims)
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            response.claims[uid].error = outcome.error
        return response


class DraV1Servicer(_DraServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``; sends ``share_id``."""

    def __init__(self, service: DraService) -> None:
        super().__init__(service, dra_v1_pb2, with_share_id=True)


class DraV1beta1Servicer(_DraServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``; has no ``share_id``."""

    def __init__(self, service: DraService) -> None:
        super().__init__(service, dra_v1beta1_pb2, with_share_id=False)
