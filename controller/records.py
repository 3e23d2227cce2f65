"""Compact records of the API objects the tracker follows, and the reducers that make them.

The informers keep one record per object instead of the decoded JSON: only the fields
accounting reads survive, quantities are parsed once, and repeated texts (namespaces, pools,
device, request and container names) are interned, so 10,000 nodes and 200,000 claims fit in a
few hundred MiB. Records are immutable (frozen, slotted) and never refer back to the JSON they
came from; everything :mod:`controller.reconcile` computes is a function of them alone.

Reducers take the decoded JSON of one object and never raise on malformed input: a field of the
wrong type reads as absent, as it did when the rules read the JSON directly.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from api.burst import LimitAmounts, configured_limit
from api.gpuconfig import STRATEGY_MPS, DriverConfigs, decode_driver_configs
from api.jsontypes import ObjView as Obj
from api.names import (
    ATTR_INDEX,
    ATTR_PARENT_UUID,
    ATTR_PARTITION,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAP_CORES,
    CAP_MEMORY,
    CORES_PER_GPU,
    base_request_name,
    driver_value,
    unhealthy_taint_key,
)
from api.quantity import QuantityError, quantity_int
from api.sharepolicy import recorded_amounts
from api.shareusage import MeasuredUsage, read_usage_data
from sharegpu.kube.devicetaints import (
    SELECTOR_FIELDS,
    rule_name,
    selector_matches,
    validate_device_taint_rule,
)
from sharegpu.kube.slicerules import MAX_TAINTS_PER_DEVICE

log = logging.getLogger(__name__)


def _s(value: object) -> str:
    """``value`` as an interned text (records repeat the same names many times)."""
    return sys.intern(str(value))


@lru_cache(maxsize=4096)
def _qty_text(value: str | int) -> int | None:
    try:
        return quantity_int(value)
    except QuantityError:
        return None


def qty(value: Any) -> int | None:
    """Integer value of a quantity (None when absent or invalid); texts repeat, so cached."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return _qty_text(value)
    return None


def _attr(device: Obj, driver: str, name: str) -> Any:
    value = driver_value(device.get("attributes") or {}, driver, name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _capacity(device: Obj, driver: str, name: str) -> int | None:
    cap = driver_value(device.get("capacity") or {}, driver, name)
    return qty(cap.get("value")) if isinstance(cap, Mapping) else None


def _cores_min(device: Obj, driver: str) -> int | None:
    """The smallest cores request the device's policy allows (its share limit, see
    ``kubeletplugin/devices/sharelimit.py``), None without a policy or outside 1..100."""
    cap = driver_value(device.get("capacity") or {}, driver, CAP_CORES)
    policy = cap.get("requestPolicy") if isinstance(cap, Mapping) else None
    bounds = policy.get("validRange") if isinstance(policy, Mapping) else None
    low = qty(bounds.get("min")) if isinstance(bounds, Mapping) else None
    return low if low is not None and 1 <= low <= CORES_PER_GPU else None


def _consumed_counters(device: Obj, name: str) -> int | None:
    total: int | None = None
    for consumption in device.get("consumesCounters") or []:
        counter = (consumption.get("counters") or {}).get(name)
        if isinstance(counter, Mapping) and (v := qty(counter.get("value"))) is not None:
            total = (total or 0) + v
    return total


# --- ResourceSlices ---------------------------------------------------------------------------

#: One device taint: ``(key, value, effect)``.
TaintRecord = tuple[str, str, str]


def _taint_record(taint: Any) -> TaintRecord | None:
    if not isinstance(taint, Mapping):
        return None
    key, value, effect = taint.get("key"), taint.get("value") or "", taint.get("effect")
    if not isinstance(key, str) or not isinstance(value, str) or not isinstance(effect, str):
        return None
    return (_s(key), _s(value), _s(effect))


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One published device, reduced to what accounting reads.

    ``gpu_uuid`` is the physical GPU: the ``parentUUID`` attribute when there is one
    (``has_parent``: a partition), else the ``uuid`` attribute ("" when neither is a text).
    """

    name: str
    gpu_uuid: str
    has_parent: bool
    index: int | None
    model: str | None
    partition: bool
    cores: int | None
    memory: int | None
    counter_cores: int | None
    counter_memory: int | None
    shared: bool
    #: Why the device is unhealthy (its ``<driver>/unhealthy`` taint), None when it is not.
    unhealthy_reason: str | None
    #: The device's own taints (``(key, value, effect)``, in slice order, at most 16).
    taints: tuple[TaintRecord, ...] = ()
    #: A shared device's smallest cores request (its cores policy's minimum), None without one.
    cores_min: int | None = None


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """One ResourceSlice of the driver. ``pool`` is None when it counts for no pool
    (see :func:`node_pool`)."""

    name: str
    pool: str | None
    node: str
    generation: int
    #: ``spec.pool.resourceSliceCount`` (at least 1).
    count: int
    devices: tuple[PublishedDevice, ...]
    #: shared counter set name -> ((counter name, value), ...)
    counters: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]


def node_pool(s: Obj, driver: str) -> str | None:
    """The pool a slice of ``driver`` counts for, or None when it counts for none.

    This driver's plugin names its pool after its node and publishes it with ``nodeName`` set,
    so a pool is identified by driver + node: a slice whose pool name is not its ``nodeName``
    (a plugin writing for another node's pool) is never counted, whatever its generation. The
    chart's ValidatingAdmissionPolicy refuses such writes; this keeps the GPU objects right
    where that policy is not installed.
    """
    spec = s.get("spec") or {}
    if spec.get("driver") != driver:
        return None
    name = (spec.get("pool") or {}).get("name")
    if not isinstance(name, str) or not name:
        return None
    if spec.get("nodeName") != name:
        log.warning(
            "ignoring ResourceSlice %s: its pool %r is not its node %r",
            (s.get("metadata") or {}).get("name", ""),
            name,
            spec.get("nodeName"),
        )
        return None
    return name


def _device_record(d: Obj, driver: str, taint_key: str) -> PublishedDevice:
    parent = _attr(d, driver, ATTR_PARENT_UUID)
    gpu_uuid = parent or _attr(d, driver, ATTR_UUID)
    index = _attr(d, driver, ATTR_INDEX)
    model = _attr(d, driver, ATTR_PRODUCT_NAME)
    name = _s(d.get("name", ""))
    reason: str | None = None
    raw = d.get("taints")
    raw_taints: list[Any] = raw if isinstance(raw, list) else []
    taints = tuple(
        t for t in map(_taint_record, raw_taints[:MAX_TAINTS_PER_DEVICE]) if t is not None
    )
    for taint in d.get("taints") or []:
        if isinstance(taint, Mapping) and taint.get("key") == taint_key:
            value = taint.get("value")
            reason = str(value) if value else f"device {name} has taint {taint_key}"
            break
    return PublishedDevice(
        name=name,
        gpu_uuid=gpu_uuid if isinstance(gpu_uuid, str) else "",
        has_parent=parent is not None,
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        model=_s(model) if model is not None else None,
        partition=_attr(d, driver, ATTR_PARTITION) is not None,
        cores=_capacity(d, driver, CAP_CORES),
        memory=_capacity(d, driver, CAP_MEMORY),
        counter_cores=_consumed_counters(d, CAP_CORES),
        counter_memory=_consumed_counters(d, CAP_MEMORY),
        shared=bool(d.get("allowMultipleAllocations")),
        unhealthy_reason=reason,
        taints=taints,
        cores_min=_cores_min(d, driver),
    )


def slice_record(s: Obj, driver: str) -> SliceRecord:
    """Reduce one ResourceSlice of ``driver``."""
    spec = s.get("spec") or {}
    pool_spec = spec.get("pool") or {}
    generation = pool_spec.get("generation")
    count = pool_spec.get("resourceSliceCount")
    pool = node_pool(s, driver)
    taint_key = unhealthy_taint_key(driver)
    counters = []
    for cs in spec.get("sharedCounters") or []:
        values = tuple(
            (_s(k), v)
            for k, c in (cs.get("counters") or {}).items()
            if isinstance(c, Mapping) and (v := qty(c.get("value"))) is not None
        )
        counters.append((_s(cs.get("name")), values))
    return SliceRecord(
        name=_s((s.get("metadata") or {}).get("name", "")),
        pool=_s(pool) if pool is not None else None,
        node=_s(spec.get("nodeName") or pool or ""),
        generation=generation if isinstance(generation, int) else 0,
        count=count if isinstance(count, int) and count > 0 else 1,
        devices=tuple(
            _device_record(d, driver, taint_key)
            for d in spec.get("devices") or []
            if isinstance(d, Mapping)
        ),
        counters=tuple(counters),
    )


# --- DeviceTaintRules -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaintRuleRecord:
    """A well-formed DeviceTaintRule with a selector: its name, the selector's fields that are
    set (``(field, value)``) and its taint."""

    name: str
    selector: tuple[tuple[str, str], ...]
    taint: TaintRecord

    def matches(self, driver: str, pool: str, device: str) -> bool:
        """Whether the rule selects the device ``driver``/``pool``/``device``."""
        return selector_matches(dict(self.selector), driver, pool, device)


def taint_rule_record(obj: Obj) -> TaintRuleRecord | None:
    """Reduce one DeviceTaintRule; None for a malformed rule or one without a selector (it
    taints nothing, see :mod:`sharegpu.kube.devicetaints`)."""
    if validate_device_taint_rule(obj):
        return None
    spec = obj["spec"]
    selector = spec.get("deviceSelector")
    taint = _taint_record(spec["taint"])
    if not isinstance(selector, Mapping) or taint is None:
        return None
    return TaintRuleRecord(
        name=_s(rule_name(obj)),
        selector=tuple(
            (f, _s(selector[f])) for f in SELECTOR_FIELDS if isinstance(selector.get(f), str)
        ),
        taint=taint,
    )


# --- ResourceClaims ---------------------------------------------------------------------------


def device_usage(claim: Obj, driver: str) -> dict[tuple[str, str, str | None], MeasuredUsage]:
    """Usage by ``(pool, device, shareID)`` from the claim's ``status.devices`` entries of
    ``driver`` (the list-map key of ``status.devices``, driver left out)."""
    out: dict[tuple[str, str, str | None], MeasuredUsage] = {}
    for entry in (claim.get("status") or {}).get("devices") or []:
        if not isinstance(entry, Mapping) or entry.get("driver") != driver:
            continue
        record = read_usage_data(entry.get("data"))
        if record is not None:
            share = entry.get("shareID")
            key = (str(entry.get("pool")), str(entry.get("device")), str(share) if share else None)
            out[key] = record
    return out


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """One allocation result of the driver.

    ``consumed`` is ``(cores, memory)`` when the scheduler recorded a ``consumedCapacity`` (an
    invalid amount reads 0; a missing one is None and counts as the device's whole amount, as
    the node plugin counts it), None when it recorded none. ``usage`` is the node
    plugin's measurement of the result's device (and share), None when there is none.
    """

    request: str
    pool: str
    device: str
    share_id: str | None
    admin_access: bool
    consumed: tuple[int | None, int | None] | None
    usage: MeasuredUsage | None = None
    #: Whether the claim's configuration makes the result's device an MPS share, as
    #: ``(configured as a share, configured as a whole GPU)`` (which of the two applies is
    #: :func:`api.sharepolicy.configured_as_share`); None when this driver's config entries are
    #: invalid (the node plugin refuses the claim). The default: no config entry applies.
    mps: tuple[bool, bool] | None = (True, False)
    #: The share's ``burstLimit`` as ``(cores, memory bytes)``, an amount it leaves out None
    #: (:func:`api.burst.configured_limit`); None without one.
    limit: LimitAmounts | None = None


@dataclass(frozen=True, slots=True)
class AllocatedClaim:
    """An allocated ResourceClaim, reduced to the driver's results and its reserving pods."""

    namespace: str
    name: str
    uid: str
    results: tuple[ResultRecord, ...]
    #: ``(name, uid)`` of the pods in ``status.reservedFor``.
    reserved: tuple[tuple[str, str], ...]


def reserved_pods(claim: Obj) -> tuple[tuple[str, str], ...]:
    """``(name, uid)`` of the pods in the claim's ``status.reservedFor``."""
    out = []
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if ref.get("resource") == "pods" and not ref.get("apiGroup"):
            out.append((_s(ref.get("name", "")), str(ref.get("uid", ""))))
    return tuple(out)


def _amount(_name: str, value: Any) -> int:
    """One amount of a ``consumedCapacity``: 0 when invalid. A fraction (never recorded under
    the published whole-unit policies; the node refuses to prepare it) counts rounded up, so
    the tracker never counts less than kube-scheduler holds."""
    return qty(value) or 0


#: Most distinct config lists whose decoding is remembered (claims of one template repeat them).
_CONFIG_CACHE = 1024


@lru_cache(maxsize=_CONFIG_CACHE)
def _decoded_configs(entries_json: str, driver: str) -> DriverConfigs:
    return decode_driver_configs(json.loads(entries_json), driver)


def driver_configs(claim: Obj, driver: str) -> DriverConfigs | None:
    """``driver``'s entries of the claim's ``status.allocation.devices.config``, decoded by
    the one decoder (:func:`api.gpuconfig.decode_driver_configs`); None when it has none."""
    allocation = (claim.get("status") or {}).get("allocation")
    raw = allocation.get("devices") if isinstance(allocation, Mapping) else None
    entries = raw.get("config") if isinstance(raw, Mapping) else None
    if not isinstance(entries, list):
        return None
    mine = [
        e
        for e in entries
        if isinstance(e, Mapping)
        and isinstance(opaque := e.get("opaque"), Mapping)
        and opaque.get("driver") == driver
    ]
    if not mine:
        return None
    return _decoded_configs(json.dumps(mine, sort_keys=True, default=str), driver)


def mps_by_configuration(configs: DriverConfigs | None, request: str) -> tuple[bool, bool] | None:
    """:attr:`ResultRecord.mps` of ``request``: the node plugin's resolution
    (:meth:`api.gpuconfig.DriverConfigs.resolve`) once as a share and once as a whole GPU."""
    if configs is None:
        return (True, False)
    if configs.problems:
        return None
    return (
        configs.resolve(request, shared=True).strategy == STRATEGY_MPS,
        configs.resolve(request, shared=False).strategy == STRATEGY_MPS,
    )


def _result_record(
    r: Obj,
    driver: str,
    usage: Mapping[tuple[str, str, str | None], MeasuredUsage],
    configs: DriverConfigs | None = None,
) -> ResultRecord:
    consumed = r.get("consumedCapacity")
    amounts = None
    if isinstance(consumed, Mapping):
        amounts = recorded_amounts(consumed, driver, _amount)
    pool, device = _s(r.get("pool")), _s(r.get("device"))
    share_id = str(r["shareID"]) if r.get("shareID") else None
    request = _s(r.get("request", ""))
    return ResultRecord(
        request=request,
        pool=pool,
        device=device,
        share_id=share_id,
        admin_access=bool(r.get("adminAccess")),
        consumed=amounts,
        usage=usage.get((pool, device, share_id)) if usage else None,
        mps=mps_by_configuration(configs, request),
        limit=None if r.get("adminAccess") else configured_limit(configs, request),
    )


def claim_record(claim: Obj, driver: str) -> AllocatedClaim | None:
    """The parts of a claim accounting needs, or None when none of its results is ``driver``'s."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    usage = device_usage(claim, driver) if status.get("devices") else {}
    configs = driver_configs(claim, driver)
    mine = tuple(
        _result_record(r, driver, usage, configs)
        for r in results
        if isinstance(r, Mapping) and r.get("driver") == driver
    )
    if not mine:
        return None
    meta = claim.get("metadata") or {}
    return AllocatedClaim(
        namespace=_s(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        results=mine,
        reserved=reserved_pods(claim),
    )


# --- Pods -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a Pod that say which containers use which claim."""

    namespace: str
    name: str
    uid: str
    #: ``(pod claim entry name, ResourceClaim name it resolves to)``
    claim_names: tuple[tuple[str, str], ...]
    #: ``(pod claim entry name, ((container name, request or None), ...))``
    claim_containers: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...]
    #: ``(container name, effective runAsUser or None)`` of the containers that use a claim
    #: (:func:`run_as_users`).
    run_as: tuple[tuple[str, int | None], ...] = ()

    def run_as_user(self, container: str) -> int | None:
        """The effective runAsUser of ``container``; None: unknown (the image's user)."""
        return next((uid for name, uid in self.run_as if name == container), None)

    @property
    def key(self) -> str:
        """``<namespace>/<name>``: the pod's informer key."""
        return f"{self.namespace}/{self.name}"

    def containers_for(self, claim_name: str, request: str) -> tuple[str, ...]:
        """Containers of this pod that use ``request`` of the claim named ``claim_name``,
        sorted."""
        top = base_request_name(request)
        found: set[str] = set()
        for entry, resolved in self.claim_names:
            if resolved != claim_name:
                continue
            for e, refs in self.claim_containers:
                if e == entry:
                    found.update(c for c, req in refs if req is None or req == top)
        return tuple(sorted(found))


#: Largest runAsUser the API server accepts (a 32-bit signed integer).
MAX_RUN_AS_USER = 2**31 - 1


def _run_as_user(context: Any) -> int | None:
    """``runAsUser`` of a securityContext, None when absent or not a valid UID."""
    uid = context.get("runAsUser") if isinstance(context, Mapping) else None
    if isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid <= MAX_RUN_AS_USER:
        return uid
    return None


def run_as_users(spec: Obj, containers: Sequence[Obj]) -> tuple[tuple[str, int | None], ...]:
    """The effective UID of each of ``containers`` (of the pod ``spec``): the container's
    ``securityContext.runAsUser``, else the pod's; None when neither sets one (the image's
    user, which only the node sees)."""
    pod_uid = _run_as_user(spec.get("securityContext"))
    out = []
    for c in containers:
        uid = _run_as_user(c.get("securityContext"))
        out.append((_s(c.get("name")), uid if uid is not None else pod_uid))
    return tuple(out)


def pod_info(pod: Obj) -> PodInfo:
    """Reduce a Pod to its claim entries and the containers that use them."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    names: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names[_s(entry["name"])] = str(entry["resourceClaimName"])
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName") and st.get("name") not in names:
            names[_s(st["name"])] = str(st["resourceClaimName"])
    containers: dict[str, list[tuple[str, str | None]]] = {}
    users: list[Obj] = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if (c.get("resources") or {}).get("claims"):
            users.append(c)
        for ref in (c.get("resources") or {}).get("claims") or []:
            req = ref.get("request")
            containers.setdefault(_s(ref.get("name")), []).append(
                (_s(c.get("name")), _s(req) if req else None)
            )
    return PodInfo(
        namespace=_s(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        claim_names=tuple(names.items()),
        claim_containers=tuple((k, tuple(v)) for k, v in containers.items()),
        run_as=run_as_users(spec, users),
    )


def pod_record(pod: Obj) -> PodInfo | None:
    """:func:`pod_info` of a pod that references claims, None for any other pod."""
    return pod_info(pod) if (pod.get("spec") or {}).get("resourceClaims") else None
