"""What a ResourceClaim is charged against a GpuQuota: the one rule, shared by the admission
webhook, the quota controller and ``sharegpu validate --quota``.

A claim is charged the most it can consume of this driver's devices (requests whose DeviceClass
is the driver's, :func:`sharegpu.admission.checks.is_driver_class`, and among the quota's
``spec.deviceClassNames`` when set): per device, its capacity requests rounded by
:func:`sharegpu.allocator.capacity.consumed_amount` under the policies the plugin publishes
(:meth:`ChargeBasis.capacity`; nothing asked is a whole GPU), times ``count``, or the most GPUs
one node publishes for ``All``; the largest ``firstAvailable`` subrequest. Once allocated, it is
charged what the allocation consumes (:func:`api.sharepolicy.share_reservation`; a whole or
partition device is a whole GPU). With no GPU published the largest memory is 0 and ``All`` is
one device. Amounts are integers (percent, bytes; fractions round up). docs/quota.md explains it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from api import names
from api.burst import LimitAmounts, configured_limit, limit_caps
from api.gpuconfig import DriverConfigs, decode_driver_configs
from api.gpuquota import (
    ClaimCharge,
    GpuQuota,
    QuotaLimits,
    Usage,
    memory_summary,
    quantity_bytes,
    summary,
)
from api.quantity import format_quantity
from api.sharepolicy import (
    capacity_of_unknown_gpu,
    consumable_capacity,
    memory_policy_max,
    share_reservation,
)
from sharegpu.admission.checks import is_driver_class
from sharegpu.allocator.capacity import PolicyViolation, amount, consumed_amount
from sharegpu.allocator.model import AllocatorInputError

#: The resources of a quota, in the order they are reported.
RESOURCES: Final = ("cores", "memory", "devices")
#: The sums of limits a quota may also bound (ResourceQuota's ``limits.*``), by JSON name.
LIMIT_RESOURCES: Final = ("limitsCores", "limitsMemory")
_ATTRIBUTES: Final = {"limitsCores": "limits_cores", "limitsMemory": "limits_memory"}


@dataclass(frozen=True, slots=True)
class Amounts:
    """Cores (percent), memory (bytes) and devices, and the limits of cores and memory
    (:attr:`limits_cores`, :attr:`limits_memory`: a burstable share's ``burstLimit``, else its
    request, never below it); all non-negative. ``burst_cores``/``burst_memory`` hold a limit
    only where it differs from the request (None: equal), so a charge without burst equals
    ``Amounts(cores, memory, devices)``."""

    cores: int = 0
    memory: int = 0
    devices: int = 0
    burst_cores: int | None = None
    burst_memory: int | None = None

    @staticmethod
    def of(
        cores: int,
        memory: int,
        devices: int,
        limits: tuple[int, int] | None = None,
    ) -> Amounts:
        """A charge whose limits are ``limits`` (None: its cores and memory)."""
        if limits is None:
            return Amounts(cores, memory, devices)
        return Amounts(
            cores,
            memory,
            devices,
            None if limits[0] == cores else limits[0],
            None if limits[1] == memory else limits[1],
        )

    @property
    def limits_cores(self) -> int:
        """The cores limits: :attr:`burst_cores`, else :attr:`cores`."""
        return self.cores if self.burst_cores is None else self.burst_cores

    @property
    def limits_memory(self) -> int:
        """The memory limits: :attr:`burst_memory`, else :attr:`memory`."""
        return self.memory if self.burst_memory is None else self.burst_memory

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts.of(
            self.cores + other.cores,
            self.memory + other.memory,
            self.devices + other.devices,
            (self.limits_cores + other.limits_cores, self.limits_memory + other.limits_memory),
        )

    def times(self, n: int) -> Amounts:
        """``n`` devices of this charge each."""
        return Amounts.of(
            self.cores * n,
            self.memory * n,
            self.devices * n,
            (self.limits_cores * n, self.limits_memory * n),
        )

    def most(self, other: Amounts) -> Amounts:
        """Each amount's maximum (the most either of two alternatives may consume)."""
        return Amounts.of(
            max(self.cores, other.cores),
            max(self.memory, other.memory),
            max(self.devices, other.devices),
            (
                max(self.limits_cores, other.limits_cores),
                max(self.limits_memory, other.limits_memory),
            ),
        )

    @property
    def zero(self) -> bool:
        """Whether nothing is charged."""
        return not (self.cores or self.memory or self.devices)

    @property
    def bursts(self) -> bool:
        """Whether a limit is above cores or memory."""
        return self.burst_cores is not None or self.burst_memory is not None

    def get(self, resource: str) -> int:
        """The amount of ``resource`` (one of :data:`RESOURCES` or :data:`LIMIT_RESOURCES`)."""
        value: int = getattr(self, _ATTRIBUTES.get(resource, resource))
        return value


def amounts_of(usage: Usage) -> Amounts:
    """The amounts of a stored charge (limits it leaves out are its cores and memory)."""
    memory = quantity_bytes(usage.memory)
    return Amounts.of(
        usage.cores,
        memory,
        usage.devices,
        (
            usage.cores if usage.limits_cores is None else usage.limits_cores,
            memory if usage.limits_memory is None else quantity_bytes(usage.limits_memory),
        ),
    )


def hard_amounts(hard: QuotaLimits) -> dict[str, int]:
    """The limits that are set, as integers (absent limits left out)."""
    out: dict[str, int] = {}
    if hard.cores is not None:
        out["cores"] = hard.cores
    if hard.memory is not None:
        out["memory"] = quantity_bytes(hard.memory)
    if hard.devices is not None:
        out["devices"] = hard.devices
    if hard.limits_cores is not None:
        out["limitsCores"] = hard.limits_cores
    if hard.limits_memory is not None:
        out["limitsMemory"] = quantity_bytes(hard.limits_memory)
    return out


@dataclass(frozen=True, slots=True)
class ChargeBasis:
    """What the charge of a request without amounts depends on: the published GPUs."""

    #: The largest usable memory of a GPU of this driver (bytes; 0 when none is known).
    largest_memory: int = 0
    #: The most GPUs one node publishes (at least 1).
    largest_node_gpus: int = 1
    #: The largest smallest-share a GPU publishes (1 to 100): a share asking fewer cores is
    #: charged this many, the most it can consume on any GPU.
    min_share_cores: int = 1

    def capacity(self) -> dict[str, Any]:
        """The capacities and request policies of a consumable device of the largest GPU, as
        the plugin publishes them (``kubeletplugin/devices/slices.py``), with the largest
        smallest-share any GPU publishes."""
        low = min(max(self.min_share_cores, 1), names.CORES_PER_GPU)
        if memory_policy_max(self.largest_memory) > 0:
            return consumable_capacity(self.largest_memory, names.CORES_PER_GPU, low)
        capacity = capacity_of_unknown_gpu()
        capacity[names.CAP_CORES]["requestPolicy"]["validRange"]["min"] = format_quantity(low)
        return capacity

    def whole_gpu(self) -> Amounts:
        """The charge of one whole GPU (one device, nothing asked)."""
        return self.device_charge({}, "")

    def device_charge(self, asked: Mapping[str, Any], driver: str) -> Amounts:
        """The charge of one device for the ``capacity.requests`` ``asked`` (keys ``cores`` or
        ``<driver>/cores``; other capacities are not charged). A request the policy does not
        allow is charged what it rounds to (admission refuses it anyway); an amount that is no
        quantity raises ``ValueError`` naming it."""
        capacity = self.capacity()
        out: dict[str, int] = {}
        for name in (names.CAP_CORES, names.CAP_MEMORY):
            raw = next(
                (v for k, v in asked.items() if k in (name, names.qualify(driver, name))), None
            )
            path = f"capacity.requests[{name}]"
            try:
                requested = None if raw is None else amount(raw, path)
                got = consumed_amount(name, capacity[name], requested, path)
            except AllocatorInputError as exc:
                raise ValueError(str(exc)) from None
            if isinstance(got, PolicyViolation):
                got = got.rounded if got.rounded is not None else got.requested
            out[name] = max(0, math.ceil(got))
        return Amounts.of(out[names.CAP_CORES], out[names.CAP_MEMORY], 1)


def basis_of(gpus: Iterable[tuple[str, int, int]]) -> ChargeBasis:
    """The basis from ``(node, usable memory, smallest share's cores)`` of every published
    GPU."""
    per_node: dict[str, int] = {}
    largest = 0
    low = 1
    for node, memory, min_cores in gpus:
        per_node[node] = per_node.get(node, 0) + 1
        largest = max(largest, memory)
        low = max(low, min_cores)
    return ChargeBasis(largest, max(per_node.values(), default=1), low)


# --- claims -----------------------------------------------------------------------------------


def _in_scope(
    class_name: Any, driver: str, classes: frozenset[str], scope: frozenset[str] | None
) -> bool:
    if not isinstance(class_name, str) or not is_driver_class(class_name, driver, classes):
        return False
    return scope is None or class_name in scope


def _request_charge(
    req: Mapping[str, Any],
    driver: str,
    basis: ChargeBasis,
    path: str,
    limit: LimitAmounts | None = None,
) -> Amounts:
    mode = req.get("allocationMode") or "ExactCount"
    if mode == "All":
        n = basis.largest_node_gpus
    else:
        count = req.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{path}.count: must be a positive integer (got {count!r})")
        n = count
    capacity = req.get("capacity")
    asked = (capacity or {}).get("requests") if isinstance(capacity, Mapping) else None
    if asked is not None and not isinstance(asked, Mapping):
        raise ValueError(f"{path}.capacity.requests: must be an object")
    one = basis.device_charge(asked or {}, driver)
    if limit is not None:
        one = Amounts.of(one.cores, one.memory, 1, limit_caps(limit, one.cores, one.memory))
    return one.times(n)


def _spec_configs(spec: Mapping[str, Any], driver: str) -> DriverConfigs | None:
    """The claim's own config entries of ``driver`` (what sets a ``burstLimit`` before
    allocation; a DeviceClass's entries are not known here)."""
    devices = spec.get("devices")
    entries = devices.get("config") if isinstance(devices, Mapping) else None
    return decode_driver_configs(entries, driver) if isinstance(entries, list) else None


def _requests(spec: Mapping[str, Any]) -> list[Any]:
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    return requests if isinstance(requests, list) else []


def demand(
    spec: Mapping[str, Any],
    driver: str,
    classes: Iterable[str],
    basis: ChargeBasis,
    scope: Iterable[str] | None = None,
) -> Amounts:
    """The most a claim with ``spec`` can consume of ``driver``'s devices (module rules);
    ``scope``: only requests of these DeviceClasses count. Raises ``ValueError`` naming the
    field for a request whose amounts cannot be read."""
    known = frozenset(classes)
    only = frozenset(scope) if scope is not None else None
    configs = _spec_configs(spec, driver)
    total = Amounts()
    for i, req in enumerate(_requests(spec)):
        if not isinstance(req, Mapping):
            continue
        path = f"spec.devices.requests[{i}]"
        name = str(req.get("name"))
        exactly = req.get("exactly")
        if isinstance(exactly, Mapping):
            if _in_scope(exactly.get("deviceClassName"), driver, known, only):
                limit = configured_limit(configs, name)
                total += _request_charge(exactly, driver, basis, f"{path}.exactly", limit)
            continue
        largest: Amounts | None = None
        for j, sub in enumerate(req.get("firstAvailable") or []):
            if isinstance(sub, Mapping) and _in_scope(
                sub.get("deviceClassName"), driver, known, only
            ):
                limit = configured_limit(configs, f"{name}/{sub.get('name')}")
                charge = _request_charge(sub, driver, basis, f"{path}.firstAvailable[{j}]", limit)
                largest = charge if largest is None else largest.most(charge)
        if largest is not None:
            total += largest
    return total


def _request_classes(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Request name (``main`` or ``main/sub``) -> its DeviceClass name."""
    out: dict[str, Any] = {}
    for req in _requests(spec):
        if not isinstance(req, Mapping):
            continue
        name = req.get("name")
        exactly = req.get("exactly")
        if isinstance(exactly, Mapping):
            out[str(name)] = exactly.get("deviceClassName")
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, Mapping):
                out[f"{name}/{sub.get('name')}"] = sub.get("deviceClassName")
    return out


def _qty_int(_name: str, value: Any) -> int:
    """One amount of a ``consumedCapacity``, 0 when invalid; a fraction (never recorded under
    the published whole-unit policies) is charged rounded up, never less than is held."""
    try:
        return quantity_bytes(value)
    except ValueError:
        return 0


def allocated(
    claim: Mapping[str, Any],
    driver: str,
    classes: Iterable[str],
    basis: ChargeBasis,
    scope: Iterable[str] | None = None,
) -> Amounts | None:
    """What an allocated claim consumes of ``driver``'s devices (module rules), or None when
    the claim is not allocated."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        return None
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    spec = claim.get("spec")
    by_request = _request_classes(spec if isinstance(spec, Mapping) else {})
    known = frozenset(classes)
    only = frozenset(scope) if scope is not None else None
    entries = devices.get("config") if isinstance(devices, Mapping) else None
    configs = decode_driver_configs(entries, driver) if isinstance(entries, list) else None
    total = Amounts()
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, Mapping) or r.get("driver") != driver:
            continue
        if not _in_scope(by_request.get(str(r.get("request"))), driver, known, only):
            continue
        consumed = r.get("consumedCapacity")
        whole = basis.whole_gpu()
        cores, memory = share_reservation(
            consumed if isinstance(consumed, Mapping) else None,
            driver,
            (whole.cores, whole.memory),
            _qty_int,
        )
        limit = None if r.get("adminAccess") else configured_limit(configs, str(r.get("request")))
        caps = None if limit is None else limit_caps(limit, cores, memory)
        total += Amounts.of(cores, memory, 1, caps)
    return total


def claim_charge(
    claim: Mapping[str, Any],
    driver: str,
    classes: Iterable[str],
    basis: ChargeBasis,
    scope: Iterable[str] | None = None,
) -> tuple[Amounts, bool]:
    """The charge of a claim object and whether it is the allocation's (module rules)."""
    used = allocated(claim, driver, classes, basis, scope)
    if used is not None:
        return used, True
    spec = claim.get("spec")
    return demand(spec if isinstance(spec, Mapping) else {}, driver, classes, basis, scope), False


# --- verdicts and status ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Excess:
    """One resource a charge would take past its limit."""

    resource: str
    used: int
    asked: int
    hard: int

    def text(self) -> str:
        """``cores: used 80, asked 40, hard 100, 20 left``."""
        show = format_quantity if self.resource in ("memory", "limitsMemory") else str
        left = max(0, self.hard - self.used)
        return (
            f"{self.resource}: used {show(self.used)}, asked {show(self.asked)}, "
            f"hard {show(self.hard)}, {show(left)} left"
        )


def excess(hard: Mapping[str, int], used: Amounts, asked: Amounts) -> list[Excess]:
    """The resources for which ``used + asked`` exceeds ``hard`` (empty: the charge fits).
    A resource the claim does not ask for never exceeds (a quota already over its limit does
    not block claims that add nothing to that resource)."""
    return [
        Excess(r, used.get(r), asked.get(r), limit)
        for r, limit in hard.items()
        if asked.get(r) > 0 and used.get(r) + asked.get(r) > limit
    ]


def denial(quota: GpuQuota, used: Amounts, asked: Amounts) -> str | None:
    """The denial text when ``asked`` does not fit in ``quota`` beside ``used``, else None."""
    over = excess(hard_amounts(quota.spec.hard), used, asked)
    if not over:
        return None
    return f"exceeded GpuQuota {quota.namespace}/{quota.name}: " + "; ".join(e.text() for e in over)


def charge_key(name: str, uid: str | None) -> str:
    """The key of a claim's charge in ``status.claims``: its UID (the name only for a claim
    without one). Two claims of one name (a live one and a CREATE the API server refuses as a
    duplicate after admission) have different UIDs, so neither replaces or releases the other's
    charge."""
    return uid or name


def charge_entry(
    amounts: Amounts,
    *,
    uid: str | None,
    is_allocated: bool,
    admitted_at: str | None = None,
    name: str | None = None,
) -> ClaimCharge:
    """A ``status.claims`` entry (keyed by :func:`charge_key`)."""
    return ClaimCharge(
        cores=amounts.cores,
        memory=format_quantity(amounts.memory),
        devices=amounts.devices,
        limits_cores=amounts.limits_cores if amounts.bursts else None,
        limits_memory=format_quantity(amounts.limits_memory) if amounts.bursts else None,
        uid=uid or None,
        name=name or None,
        allocated=is_allocated,
        admitted_at=admitted_at,
    )


def status_json(quota: GpuQuota, claims: Mapping[str, ClaimCharge]) -> dict[str, Any]:
    """The ``status`` of ``quota`` with exactly these charges: ``used`` is their sum, claims
    sorted by key, summaries ``used/hard``."""
    total = Amounts()
    for entry in claims.values():
        total += amounts_of(entry)
    hard = quota.spec.hard
    used: dict[str, Any] = {
        "cores": total.cores,
        "memory": format_quantity(total.memory),
        "devices": total.devices,
    }
    limited = hard.limits_cores is not None or hard.limits_memory is not None
    if limited or total.bursts:
        used.update(
            limitsCores=total.limits_cores, limitsMemory=format_quantity(total.limits_memory)
        )
    out: dict[str, Any] = {
        "used": used,
        "claims": {name: claims[name].to_json_dict() for name in sorted(claims)},
        "coresSummary": summary(total.cores, hard.cores),
        "memorySummary": memory_summary(total.memory, hard.memory),
        "devicesSummary": summary(total.devices, hard.devices),
    }
    if limited:
        out["limitsSummary"] = (
            f"{summary(total.limits_cores, hard.limits_cores)} cores, "
            f"{memory_summary(total.limits_memory, hard.limits_memory)}"
        )
    return out


def used_of(claims: Mapping[str, ClaimCharge], leave_out: str | None = None) -> Amounts:
    """The sum of the charges (without the one keyed ``leave_out``)."""
    total = Amounts()
    for name, entry in claims.items():
        if name != leave_out:
            total += amounts_of(entry)
    return total
