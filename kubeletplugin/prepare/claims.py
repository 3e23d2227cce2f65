"""Fetching ResourceClaims and reading this driver's part of their allocation.

Kubelet sends only a claim's namespace, name and UID; the allocation lives in the ResourceClaim's
``status.allocation``, so every prepare GETs the claim (``resource.k8s.io/v1``) and keeps:

- the results of this driver in this node's pool (other drivers' and other pools' results ignored);
- the opaque configs of this driver: DeviceClass configs (``FromClass``) first, then the claim's
  (``FromClaim``), each group in the order the API server stored it (later entries win when the
  config decoder merges them).

Everything that makes a claim unpreparable raises :class:`ClaimError` with a message that names the
claim and the problem; the caller turns it into that claim's per-claim error.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.gpuconfig import SOURCE_FROM_CLAIM, SOURCE_FROM_CLASS, DriverConfigs, decode_driver_configs
from api.names import RESOURCE_GROUP, RESOURCE_VERSION
from kubeletplugin.kubelet.preparer import ClaimRef
from sharegpu.kube.connection import KubeClient
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

#: Why a claim cannot be prepared (the ``reason`` of :class:`ClaimError`, a metrics label).
REASON_NOT_FOUND = "not_found"
REASON_API_ERROR = "api_error"
REASON_REPLACED = "replaced"
REASON_UNALLOCATED = "unallocated"
REASON_NO_RESULT = "no_result"
REASON_UNKNOWN_DEVICE = "unknown_device"
REASON_INVALID_ALLOCATION = "invalid_allocation"
#: The GPU is held by another prepared claim (the last line of defence).
REASON_CONFLICT = "conflict"
#: Share enforcement refused the claim (config, strategy or capacity).
REASON_ENFORCEMENT = "enforcement"
#: A spec file or the checkpoint could not be written.
REASON_IO = "io"
#: A dynamic MIG device's instance could not be created (or a leftover one destroyed).
REASON_MIG = "mig"
#: A bug: logged with its traceback.
REASON_INTERNAL = "internal"


class ClaimError(Exception):
    """A claim that cannot be prepared; the message is the per-claim error sent to kubelet and
    ``reason`` one of the ``REASON_*`` names."""

    def __init__(self, message: str, reason: str = REASON_INVALID_ALLOCATION) -> None:
        super().__init__(message)
        self.reason = reason


class ClaimGetter(Protocol):
    """Reads a ResourceClaim as a plain dict in its JSON shape."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """Return the claim; raise :class:`ClaimError` when it is missing or unreadable."""
        ...


class KubeClaimGetter:
    """:class:`ClaimGetter` over the Kubernetes API (``GET resource.k8s.io/v1`` ResourceClaim),
    through the same JSON client the controller and the publisher use (:class:`KubeRest`, whose
    transport sends it without the official client's per-request work).

    The raw JSON is used instead of the generated models, which lag the DRA fields.
    """

    def __init__(self, api_client: KubeClient, timeout_seconds: float = 10.0) -> None:
        self._rest = KubeRest(api_client, timeout_s=timeout_seconds)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", namespace, name)
        try:
            return self._rest.get(path, expected=(404,))
        except KubeApiError as exc:
            if exc.status == 404:
                raise ClaimError(
                    f"ResourceClaim {namespace}/{name} not found", REASON_NOT_FOUND
                ) from exc
            text = f"cannot get ResourceClaim {namespace}/{name}"
            if exc.status:
                text += f": HTTP {exc.status} {exc.reason}"
            raise ClaimError(f"{text}: {exc.message}", REASON_API_ERROR) from exc


@dataclass(frozen=True)
class AllocationResult:
    """One ``status.allocation.devices.results[]`` entry of this driver on this node."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    #: ``consumedCapacity`` as written by the scheduler: capacity name -> quantity string.
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False


@dataclass(frozen=True)
class ClaimAllocation:
    """This driver's part of one claim's allocation on this node."""

    ref: ClaimRef
    results: tuple[AllocationResult, ...]
    configs: DriverConfigs


def _claim_label(ref: ClaimRef) -> str:
    return f"ResourceClaim {ref.namespace}/{ref.name}"


def extract_allocation(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    driver_name: str,
    pool_name: str,
    published_devices: Container[str],
) -> ClaimAllocation:
    """Read this driver's results and configs from ``claim`` for the claim kubelet named in ``ref``.

    Raises :class:`ClaimError` when the claim was replaced (UID differs), is not allocated, has no
    result for this driver in ``pool_name``, or names a device this node does not publish.
    """
    label = _claim_label(ref)
    metadata = claim.get("metadata") or {}
    uid = metadata.get("uid", "")
    if uid != ref.uid:
        raise ClaimError(
            f"{label} was replaced: kubelet asked for UID {ref.uid}, the API server has UID "
            f"{uid or '(none)'}",
            REASON_REPLACED,
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(
            f"{label} (UID {ref.uid}) is not allocated: status.allocation is unset",
            REASON_UNALLOCATED,
        )
    devices = allocation.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise ClaimError(f"{label}: status.allocation.devices is not an object")
    results = _read_results(devices.get("results") or [], label, driver_name, pool_name)
    if not results:
        raise ClaimError(
            f"{label} has no allocation result for driver {driver_name} in pool {pool_name}",
            REASON_NO_RESULT,
        )
    for result in results:
        if result.device not in published_devices:
            raise ClaimError(
                f"{label}: request {result.request!r} was allocated device {result.device!r}, "
                f"which node {pool_name} does not publish",
                REASON_UNKNOWN_DEVICE,
            )
    configs = _read_configs(devices.get("config") or [], label, driver_name)
    return ClaimAllocation(ref=ref, results=results, configs=configs)


def _read_results(
    raw: Any, label: str, driver_name: str, pool_name: str
) -> tuple[AllocationResult, ...]:
    if not isinstance(raw, list):
        raise ClaimError(f"{label}: status.allocation.devices.results is not a list")
    results: list[AllocationResult] = []
    for i, entry in enumerate(raw):
        path = f"status.allocation.devices.results[{i}]"
        if not isinstance(entry, Mapping):
            raise ClaimError(f"{label}: {path} is not an object")
        if entry.get("driver") != driver_name or entry.get("pool") != pool_name:
            continue
        request, device = entry.get("request"), entry.get("device")
        if not isinstance(request, str) or not request:
            raise ClaimError(f"{label}: {path}.request must be a non-empty string")
        if not isinstance(device, str) or not device:
            raise ClaimError(f"{label}: {path}.device must be a non-empty string")
        share_id = entry.get("shareID")
        if share_id is not None and (not isinstance(share_id, str) or not share_id):
            raise ClaimError(f"{label}: {path}.shareID must be a non-empty string")
        consumed = entry.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in consumed.items()
        ):
            raise ClaimError(f"{label}: {path}.consumedCapacity must map names to quantities")
        results.append(
            AllocationResult(
                request=request,
                pool=pool_name,
                device=device,
                share_id=share_id,
                consumed_capacity={k: str(v) for k, v in consumed.items()},
                admin_access=entry.get("adminAccess") is True,
            )
        )
    return tuple(results)


def _read_configs(raw: Any, label: str, driver_name: str) -> DriverConfigs:
    """This driver's config entries, checked for shape and decoded once
    (:func:`api.gpuconfig.decode_driver_configs`; invalid GpuConfigs are kept as problems, so the
    share enforcer refuses the devices they concern with the decoder's messages)."""
    if not isinstance(raw, list):
        raise ClaimError(f"{label}: status.allocation.devices.config is not a list")
    for i, entry in enumerate(raw):
        path = f"status.allocation.devices.config[{i}]"
        if not isinstance(entry, Mapping):
            raise ClaimError(f"{label}: {path} is not an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver_name:
            continue
        source = entry.get("source")
        if source not in (SOURCE_FROM_CLASS, SOURCE_FROM_CLAIM):
            raise ClaimError(
                f"{label}: {path}.source is {source!r}; allowed: "
                f"{SOURCE_FROM_CLASS}, {SOURCE_FROM_CLAIM}"
            )
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"{label}: {path}.requests must be a list of request names")
    return decode_driver_configs(raw, driver_name)
