"""Quota admission: charge a ResourceClaim on CREATE against every GpuQuota of its namespace.

For each quota of the namespace (by name) whose scope the claim touches, the webhook reads the
quota, checks ``used + charge <= hard`` (:mod:`controller.quotacharge`) and writes the charge
into ``status.claims`` under the claim's UID (a CREATE named like a live claim adds its own
charge and never replaces or releases the live one's) with a PUT of the ``status`` subresource
carrying the quota's ``metadata.resourceVersion``: the API server refuses it (409) when anyone
wrote the quota since it was read, and the webhook then re-reads and decides again. So two
admissions can never both take the last unit (kube-apiserver's quota admission works the same
way). A claim that one quota denies is un-charged from the quotas already charged (best
effort); whatever stays behind (a claim admitted here and then refused by the API server)
carries ``admittedAt`` and is released by the controller when no such claim appears within its
grace period (:mod:`controller.quotacontroller`).

``dryRun`` requests are judged without writing anything, and so are reviews the webhook cannot
tie to the API server (no verified client certificate): those are admitted with
:func:`not_enforced_warning` when a quota applies, since claims judged at the same time can
then together exceed it.

A GpuQuota resource the API server does not serve (HTTP 404 on the list: the CRD is not
installed, e.g. a chart installed with ``--skip-crds`` before the CRDs are applied) means no
quota is enforced: the claim is admitted with :data:`CRD_ABSENT_WARNING` as an AdmissionReview
warning, logged once per change of that state, and quotas apply again from the first list that
succeeds (no restart). Any other failure to read the quotas still denies, naming the error (the
webhook's ``failurePolicy`` decides only when the webhook itself does not answer).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from api.gpuquota import GpuQuota, GpuQuotaError, parse_gpu_quota
from api.names import API_GROUP, API_VERSION, GPU_QUOTA_CRD_NAME, GPU_QUOTA_KIND, GPU_QUOTA_PLURAL
from controller.quotacharge import (
    ChargeBasis,
    charge_entry,
    charge_key,
    demand,
    denial,
    status_json,
    used_of,
)
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock, rfc3339
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)

#: Attempts to write one charge before admission gives up (each conflict is another writer).
MAX_ATTEMPTS: Final = 64
#: How long a live list that found no GpuQuota in a namespace answers for it while the watch cache
#: also says "none" (kube-apiserver's quota admission keeps such live lookups for 30 s).
EMPTY_LIST_TTL_S: Final = 10.0
#: Namespaces whose empty live list is remembered (the oldest is forgotten first).
MAX_EMPTY_NAMESPACES: Final = 4096
#: The warning of a claim admitted while the API server does not serve GpuQuotas.
CRD_ABSENT_WARNING: Final = (
    f"the GpuQuota CRD ({GPU_QUOTA_CRD_NAME}) is not installed, so GpuQuotas are not enforced"
)


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """What quota admission decided: ``denial`` (None: admitted), a ``warning`` to return
    with an admitted claim, and whether any GpuQuota ``applies`` to the claim."""

    denial: str | None = None
    warning: str | None = None
    applies: bool = False


def not_enforced_warning(namespace: str) -> str:
    """The warning of a claim judged against ``namespace``'s GpuQuotas but not charged."""
    return (
        f"GpuQuotas of namespace {namespace} are not enforced at admission: the webhook cannot "
        "verify that this review comes from the API server (no client certificate), so the "
        "claim was judged against them but not charged, and claims created at the same time "
        "can together exceed a quota (see the webhook client authentication in docs/security.md)"
    )


def quota_path(namespace: str, name: str | None = None) -> str:
    """REST path of a namespace's GpuQuotas (or of one)."""
    return resource_path(API_GROUP, API_VERSION, GPU_QUOTA_PLURAL, namespace, name)


def put_status(
    kube: KubeRest, quota: GpuQuota, status: Mapping[str, Any], expected: tuple[int, ...]
) -> None:
    """PUT ``status`` as ``quota``'s status, guarded by the resourceVersion ``quota`` was read at
    (the API server answers 409 when someone wrote it since). Raises KubeApiError; statuses in
    ``expected`` are not logged as failures by the client."""
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": GPU_QUOTA_KIND,
        "metadata": {
            "name": quota.name,
            "namespace": quota.namespace,
            "resourceVersion": quota.resource_version,
        },
        "spec": quota.spec.to_json_dict(),
        "status": dict(status),
    }
    kube.request(
        "PUT", quota_path(quota.namespace, quota.name) + "/status", body=body, expected=expected
    )


class QuotaAdmitter:
    """Charges claims against GpuQuotas (see the module text). Thread-safe: it keeps no state
    between calls; the quota objects are the only shared state."""

    def __init__(
        self,
        kube: KubeRest,
        driver: str,
        classes: Iterable[str] = (),
        basis: Callable[[], ChargeBasis] = ChargeBasis,
        clock: Clock = SYSTEM_CLOCK,
        has_quotas: Callable[[str], bool | None] = lambda _namespace: None,
        known_classes: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.classes = frozenset(classes)
        #: The driver's DeviceClasses known from a watch (by their selectors, whatever their
        #: names: :meth:`controller.quotacontroller.QuotaController.driver_classes`).
        self.known_classes = known_classes
        self.basis = basis
        self.clock = clock
        #: Whether a namespace has GpuQuotas, from a watch cache (None: unknown). The cache may
        #: lag a quota created moments ago, so its "none" is checked with a live list, as
        #: kube-apiserver's quota admission does; a list that found none answers for
        #: :data:`EMPTY_LIST_TTL_S` (of ``clock.monotonic``), and while the cache says none a
        #: list that fails admits (a namespace without quotas never depends on the API server).
        self.has_quotas = has_quotas
        self._empty_lock = threading.Lock()
        self._empty_at: OrderedDict[str, float] = OrderedDict()
        #: Conflicts met (a measure of contention, for tests and benchmarks).
        self.conflicts = 0
        self._served_lock = threading.Lock()
        self._served: bool | None = None

    def crd_served(self) -> bool | None:
        """Whether the last list of GpuQuotas found the resource served (None: not listed yet).
        False while the GpuQuota CRD is not installed and quotas are therefore not enforced."""
        with self._served_lock:
            return self._served

    def _note_served(self, served: bool) -> None:
        """Record whether GpuQuotas are served; log each change of that once."""
        with self._served_lock:
            changed, self._served = self._served != served, served
        if changed and not served:
            log.warning("quota: %s; claims are admitted with a warning", CRD_ABSENT_WARNING)
        elif changed and served:
            log.info("quota: the GpuQuota resource is served; quotas are enforced")

    def admit(
        self, namespace: str, claim: Mapping[str, Any], dry_run: bool = False
    ) -> QuotaDecision:
        """Charge ``claim`` (being created in ``namespace``) to every quota it touches. A quota
        that cannot be read or decoded denies (naming the quota and the problem): a quota is
        only enforced while it is valid. GpuQuotas not served at all admit with a warning."""
        cached_none = self.has_quotas(namespace) is False
        if cached_none and self._listed_empty_lately(namespace):
            return QuotaDecision()
        try:
            items, _ = self.kube.list_all(quota_path(namespace))
        except KubeApiError as exc:
            if exc.status == 404:
                self._note_served(False)
                return QuotaDecision(warning=CRD_ABSENT_WARNING)
            if cached_none:
                return QuotaDecision()
            return QuotaDecision(f"cannot read the GpuQuotas of namespace {namespace}: {exc}")
        self._note_served(True)
        self._note_listed(namespace, empty=not items)
        denied, applies = self._admit_listed(namespace, claim, items, dry_run)
        return QuotaDecision(denied, applies=applies)

    def _listed_empty_lately(self, namespace: str) -> bool:
        """Whether a live list of ``namespace`` found no GpuQuota within the TTL."""
        with self._empty_lock:
            at = self._empty_at.get(namespace)
            return at is not None and self.clock.monotonic() - at < EMPTY_LIST_TTL_S

    def _note_listed(self, namespace: str, *, empty: bool) -> None:
        with self._empty_lock:
            self._empty_at.pop(namespace, None)
            if empty:
                self._empty_at[namespace] = self.clock.monotonic()
                while len(self._empty_at) > MAX_EMPTY_NAMESPACES:
                    self._empty_at.popitem(last=False)

    def _admit_listed(
        self,
        namespace: str,
        claim: Mapping[str, Any],
        items: list[dict[str, Any]],
        dry_run: bool,
    ) -> tuple[str | None, bool]:
        """The denial of ``claim`` by the listed quotas ``items``, or None (charged), and
        whether any of them applies to it."""
        meta = claim.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            name = str(meta.get("generateName") or "") + "(generated)"
        uid = meta.get("uid") if isinstance(meta.get("uid"), str) else None
        key = charge_key(name, uid)
        basis = self.basis()
        classes = self.classes | frozenset(self.known_classes())
        charged: list[str] = []
        spec = claim.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        applies = False
        for item in sorted(items, key=lambda o: str((o.get("metadata") or {}).get("name"))):
            quota_name = str((item.get("metadata") or {}).get("name"))
            try:
                quota = parse_gpu_quota(item)
                asked = demand(spec, self.driver, classes, basis, quota.spec.device_class_names)
            except (GpuQuotaError, ValueError) as exc:
                self._undo(namespace, charged, key)
                return f"GpuQuota {namespace}/{quota_name} cannot be applied: {exc}", True
            if asked.zero:
                continue
            applies = True
            if dry_run:
                refused = denial(quota, used_of(quota.status.claims, key), asked)
            else:
                refused = self._charge(quota, key, name, uid, asked)
            if refused is not None:
                self._undo(namespace, charged, key)
                return refused, True
            if not dry_run:
                charged.append(quota_name)
        return None, applies

    def _charge(
        self, quota: GpuQuota, key: str, name: str, uid: str | None, asked: Any
    ) -> str | None:
        """Write ``asked`` as the charge keyed ``key`` (replacing only that key's own charge);
        the denial text, or None once written."""
        for _ in range(MAX_ATTEMPTS):
            refused = denial(quota, used_of(quota.status.claims, key), asked)
            if refused is not None:
                return refused
            claims = dict(quota.status.claims)
            claims[key] = charge_entry(
                asked,
                uid=uid,
                is_allocated=False,
                admitted_at=rfc3339(self.clock.time()),
                name=name,
            )
            try:
                if self._write(quota, claims):
                    return None
            except KubeApiError as exc:
                return f"GpuQuota {quota.namespace}/{quota.name} cannot be charged: {exc}"
            self.conflicts += 1
            try:
                quota = parse_gpu_quota(self.kube.get(quota_path(quota.namespace, quota.name)))
            except (KubeApiError, GpuQuotaError) as exc:
                return f"GpuQuota {quota.namespace}/{quota.name} cannot be read: {exc}"
        return f"GpuQuota {quota.namespace}/{quota.name}: too many concurrent updates, try again"

    def _write(self, quota: GpuQuota, claims: Mapping[str, Any]) -> bool:
        """PUT the status with the quota's resourceVersion; False on a conflict (409)."""
        try:
            put_status(self.kube, quota, status_json(quota, claims), expected=(409,))
        except KubeApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _undo(self, namespace: str, quotas: list[str], claim: str) -> None:
        """Remove the charge keyed ``claim`` (:func:`~controller.quotacharge.charge_key`: the
        denied claim's UID, so never a live claim's charge) from ``quotas`` (best effort; the
        controller releases what stays behind after its grace period)."""
        for name in quotas:
            for _ in range(MAX_ATTEMPTS):
                try:
                    quota = parse_gpu_quota(self.kube.get(quota_path(namespace, name)))
                    if claim not in quota.status.claims:
                        break
                    claims = {k: v for k, v in quota.status.claims.items() if k != claim}
                    if self._write(quota, claims):
                        break
                except (KubeApiError, GpuQuotaError) as exc:
                    log.warning("quota: releasing %s from %s/%s: %s", claim, namespace, name, exc)
                    break
