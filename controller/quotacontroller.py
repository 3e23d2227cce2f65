"""The quota controller: keeps every GpuQuota's ``status`` equal to the charges of the live
claims of its namespace.

Two informers (GpuQuotas and ResourceClaims, all namespaces) mark a namespace *dirty* on every
event; a worker thread recomputes the dirty namespaces, and every ``resync_s`` all namespaces
with quotas, so a missed event never leaves a wrong status for long. A third informer watches
DeviceClasses: a class whose selectors name the driver is this driver's whatever its name
(:func:`sharegpu.admission.checks.class_selects_driver`), so a quota scoped to it charges its
requests (:meth:`QuotaController.driver_classes`, also read by admission); a change of any
class marks every namespace with quotas dirty. For each quota:

- every live claim of the namespace with a non-zero charge (:func:`controller.quotacharge.
  claim_charge`) is charged: what its allocation consumes once allocated, else the most it can
  consume;
- a charge written by admission for a claim not seen yet (``admittedAt``) is kept for
  ``grace_s`` seconds (the claim may not have reached the informer), then released: a claim
  admitted and then refused by the API server, or deleted before it was seen, does not leak;
- charges of deleted claims are released.

The status is written (PUT of the ``status`` subresource with the quota's resourceVersion) only
when it differs, and only while this replica leads; a conflict (409: admission charged a claim
meanwhile) leaves the namespace dirty for the next round. After a restart the first round
recomputes everything from the live claims.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.gpuconfig import DriverConfigs, decode_driver_configs
from api.gpuquota import ClaimCharge, GpuQuota, GpuQuotaError, parse_gpu_quota
from api.jsontypes import Obj
from api.names import API_GROUP, API_VERSION, GPU_QUOTA_PLURAL, RESOURCE_GROUP, RESOURCE_VERSION
from controller.metrics import QuotaGauge
from controller.quotaadmit import put_status
from controller.quotacharge import (
    RESOURCES,
    ChargeBasis,
    amounts_of,
    charge_entry,
    charge_key,
    claim_charge,
    hard_amounts,
    status_json,
)
from sharegpu.admission.checks import class_selects_driver
from sharegpu.kube.clock import SYSTEM_CLOCK, Clock
from sharegpu.kube.informer import Informer
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimInput:
    """What the controller keeps of one claim: the parts its charge is computed from."""

    namespace: str
    name: str
    uid: str
    spec: Any
    status: Any

    def as_claim(self) -> Obj:
        """The claim's JSON shape for :func:`claim_charge`."""
        return {"spec": self.spec, "status": self.status}


def claim_input(obj: Obj) -> ClaimInput:
    """Reduce a ResourceClaim to its namespace, name, uid, requests and allocation."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    return ClaimInput(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        spec={"devices": {"requests": (spec.get("devices") or {}).get("requests") or []}},
        status={"allocation": allocation} if allocation else {},
    )


def _quota_or_error(obj: Obj) -> GpuQuota | str:
    try:
        return parse_gpu_quota(obj)
    except GpuQuotaError as exc:
        meta = obj.get("metadata") or {}
        return f"GpuQuota {meta.get('namespace')}/{meta.get('name')} is invalid: {exc}"


def _age_s(stamp: str | None, now: float) -> float:
    if not stamp:
        return float("inf")
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return float("inf")
    return now - then


def desired_claims(
    quota: GpuQuota,
    claims: Iterable[ClaimInput],
    driver: str,
    classes: Iterable[str],
    basis: ChargeBasis,
    now: float,
    grace_s: float,
) -> dict[str, ClaimCharge]:
    """The charges ``quota`` should hold, keyed by :func:`~controller.quotacharge.charge_key`:
    one per live claim with a non-zero charge, plus the admission charges of unseen claims
    younger than ``grace_s`` (module text)."""
    out: dict[str, ClaimCharge] = {}
    for claim in claims:
        try:
            amounts, is_allocated = claim_charge(
                claim.as_claim(), driver, classes, basis, quota.spec.device_class_names
            )
        except ValueError as exc:
            log.warning("quota: claim %s/%s is not charged: %s", claim.namespace, claim.name, exc)
            continue
        if not amounts.zero:
            out[charge_key(claim.name, claim.uid)] = charge_entry(
                amounts, uid=claim.uid, is_allocated=is_allocated, name=claim.name
            )
    for key, entry in quota.status.claims.items():
        if key not in out and _age_s(entry.admitted_at, now) < grace_s:
            out[key] = entry
    return out


@dataclass(frozen=True)
class WatchedClass:
    """What the controller keeps of a watched DeviceClass: whether its selectors name the
    driver, and the driver's entries of its ``spec.config`` (decoded once, at the watch)."""

    selects_driver: bool
    configs: DriverConfigs

    @staticmethod
    def of(obj: Any, driver: str) -> WatchedClass:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        config = spec.get("config") if isinstance(spec, Mapping) else None
        return WatchedClass(
            selects_driver=class_selects_driver(obj, driver),
            configs=decode_driver_configs(config if isinstance(config, list) else [], driver),
        )


class QuotaController:
    """Recomputes GpuQuota statuses (module text). Start with :meth:`start`."""

    def __init__(
        self,
        kube: KubeRest,
        driver: str,
        *,
        classes: Iterable[str] = (),
        basis: Callable[[], ChargeBasis] = ChargeBasis,
        is_leader: Callable[[], bool] = lambda: True,
        resync_s: float = 30.0,
        grace_s: float = 60.0,
        tick_s: float = 0.1,
        watch_timeout_s: int = 300,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.classes = frozenset(classes)
        self.basis = basis
        self.is_leader = is_leader
        self.resync_s = resync_s
        self.grace_s = grace_s
        self.tick_s = tick_s
        #: Ages charges (wall time, against their stored timestamps) and times the resync.
        self.clock = clock
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.quotas = Informer(
            kube,
            resource_path(API_GROUP, API_VERSION, GPU_QUOTA_PLURAL),
            self._on_event,
            name="gpuquotas",
            transform=_quota_or_error,
            watch_timeout_s=watch_timeout_s,
        )
        self.claims = Informer(
            kube,
            resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"),
            self._on_event,
            name="quota-resourceclaims",
            transform=claim_input,
            watch_timeout_s=watch_timeout_s,
        )
        #: DeviceClass name -> whether its selectors name the driver, and its config entries.
        self.device_classes = Informer(
            kube,
            resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses"),
            self._on_class_event,
            name="quota-deviceclasses",
            transform=lambda obj: WatchedClass.of(obj, driver),
            watch_timeout_s=watch_timeout_s,
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the informers and the worker (daemon threads)."""
        self.quotas.start()
        self.claims.start()
        self.device_classes.start()
        self._thread = threading.Thread(target=self._run, name="quota-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop all threads."""
        self._stop.set()
        self._wake.set()
        self.quotas.stop()
        self.claims.stop()
        self.device_classes.stop()
        if self._thread is not None:
            self._thread.join(10.0)

    def synced(self) -> bool:
        """Whether every informer completed its first list."""
        return (
            self.quotas.synced.is_set()
            and self.claims.synced.is_set()
            and self.device_classes.synced.is_set()
        )

    def driver_classes(self) -> frozenset[str]:
        """The DeviceClasses of the driver: those given (``classes``) and every watched class
        whose selectors name the driver (classes named like the driver always are, see
        :func:`sharegpu.admission.checks.is_driver_class`)."""
        selected = {
            str(k).rsplit("/", 1)[-1]
            for k, v in list(self.device_classes.store.items())
            if isinstance(v, WatchedClass) and v.selects_driver
        }
        return self.classes | selected

    def class_configs(self, name: str) -> DriverConfigs | None:
        """The driver's config entries of the watched DeviceClass ``name`` (None: not known,
        or the class informer has not listed yet); admission judges a claim's ``burstLimit``
        against them (:data:`sharegpu.admission.checks.ClassConfigs`)."""
        watched = self.device_classes.store.get(f"/{name}")
        return watched.configs if isinstance(watched, WatchedClass) else None

    def namespace_has_quotas(self, namespace: str) -> bool | None:
        """Whether the watched GpuQuotas include one in ``namespace``; None before the quota
        informer's first list (the caller must then ask the API server)."""
        if not self.quotas.synced.is_set():
            return None
        prefix = f"{namespace}/"
        return any(key.startswith(prefix) for key in list(self.quotas.store))

    # --- events and work ---------------------------------------------------------------------

    def _on_event(self, key: str, old: Any, new: Any) -> None:
        namespace = key.split("/", 1)[0] if "/" in key else ""
        with self._lock:
            self._dirty.add(namespace)
        self._wake.set()

    def _on_class_event(self, key: str, old: Any, new: Any) -> None:
        """A DeviceClass changed: every quota may scope it, so all are recomputed."""
        with self._lock:
            self._dirty |= self._quota_namespaces()
        self._wake.set()

    def _run(self) -> None:
        last_resync = self.clock.monotonic()
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            if self.clock.monotonic() - last_resync >= self.resync_s:
                last_resync = self.clock.monotonic()
                with self._lock:
                    self._dirty |= self._quota_namespaces()
            try:
                self.sync()
            except Exception:  # a defect: logged, and the namespaces stay dirty
                log.exception("quota: reconciling failed")

    def _quota_namespaces(self) -> set[str]:
        return {k.split("/", 1)[0] for k in list(self.quotas.store)}

    def sync(self) -> int:
        """Reconcile the dirty namespaces (while leading and synced); returns the writes made.
        A namespace whose write conflicted stays dirty."""
        if not self.synced() or not self.is_leader():
            return 0
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        writes = 0
        retry: set[str] = set()
        for namespace in sorted(dirty):
            done, wrote = self.reconcile_namespace(namespace)
            writes += wrote
            if not done:
                retry.add(namespace)
        if retry:
            with self._lock:
                self._dirty |= retry
        self.writes += writes
        return writes

    def reconcile_namespace(self, namespace: str) -> tuple[bool, int]:
        """Recompute the quotas of ``namespace``: (all written or unchanged, writes made)."""
        prefix = f"{namespace}/"
        quotas = [q for k, q in list(self.quotas.store.items()) if k.startswith(prefix)]
        if not quotas:
            return True, 0
        claims = [c for k, c in list(self.claims.store.items()) if k.startswith(prefix)]
        classes = self.driver_classes()
        basis = self.basis()
        now = self.clock.time()
        done, writes = True, 0
        for quota in quotas:
            if isinstance(quota, str):
                log.warning("quota: %s", quota)
                continue
            desired = desired_claims(quota, claims, self.driver, classes, basis, now, self.grace_s)
            status = status_json(quota, desired)
            if status == quota.status.to_json_dict():
                if any(entry.admitted_at for entry in desired.values()):
                    done = False  # look again once the grace period may have passed
                continue
            if self._write(quota, status):
                writes += 1
            else:
                done = False
        return done, writes

    def _write(self, quota: GpuQuota, status: Obj) -> bool:
        try:
            put_status(self.kube, quota, status, expected=(404, 409))
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                log.warning("quota: writing %s/%s: %s", quota.namespace, quota.name, exc)
            return False
        return True

    # --- metrics -----------------------------------------------------------------------------

    def gauges(self) -> list[QuotaGauge]:
        """Used and hard of every valid quota, per resource, from the informer's copies."""
        out: list[QuotaGauge] = []
        for quota in list(self.quotas.store.values()):
            if isinstance(quota, str):
                continue
            used = amounts_of(quota.status.used)
            hard = hard_amounts(quota.spec.hard)
            for resource in RESOURCES:
                out.append(
                    QuotaGauge(
                        quota.namespace,
                        quota.name,
                        resource,
                        used.get(resource),
                        hard.get(resource),
                    )
                )
        return out
