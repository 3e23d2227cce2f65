"""From ResourceSlices, ResourceClaims and Pods to the desired ``GPU`` objects.

Deterministic and side-effect free: the same inputs in any order give equal objects. The tracker
calls the pieces incrementally over :mod:`controller.records`; :func:`reconcile` composes them over
whole JSON inputs (what tests compare against). The JSON is built by the one encoder of the
GPU object (:mod:`api.gpustatus`), in the shape :class:`api.gpu.GpuObject` validates. Rules,
stated once:

- a GPU is its UUID within a pool (``parentUUID`` else ``uuid``), in the pool's newest complete
  generation only (:func:`newest_generation`);
- an allocation consumes its ``consumedCapacity`` (the whole device's amount for one it lacks,
  :func:`api.sharepolicy.reserved_amounts`), else the device's capacity, else its counters, else
  the whole GPU; ``adminAccess`` results consume nothing;
- health follows the slices' ``<driver>/unhealthy`` taint; ``status.taints`` lists every taint,
  DeviceTaintRules' naming their rule; ``Overcommitted`` and ``MPSEscaped`` only gather the
  plugin's measured verdicts, left out when nothing was measured;
- pods come from ``status.reservedFor``, their containers from ``resources.claims``."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from api.burst import limit_caps
from api.gpu import GpuObject, node_label_value
from api.gpustatus import GpuTaintEntry, allocation_json, gpu_spec_json
from api.gpustatus import gpu_status_json as encode_gpu_status
from api.jsontypes import Obj
from api.names import (
    CAP_CORES,
    CAP_MEMORY,
    CONDITION_MPS_ESCAPED,
    CONDITION_OVERCOMMITTED,
    CORES_PER_GPU,
    GPU_KIND,
    GPU_NODE_LABEL,
    GROUP_VERSION,
    SHARING_MODE_CONSUMABLE,
    SHARING_MODE_EXCLUSIVE,
    SHARING_MODE_PARTITIONS,
    counter_set_name,
    gpu_object_name,
)
from api.sharepolicy import reserved_amounts
from api.shareusage import MeasuredUsage
from controller.idle import IdleVerdict, alloc_key, shares_idle_condition
from controller.mpsclients import Client, client_users, mps_verdict
from controller.records import (
    AllocatedClaim,
    PodInfo,
    PublishedDevice,
    SliceRecord,
    TaintRuleRecord,
    claim_record,
    pod_info,
    slice_record,
    taint_rule_record,
)

_DEVICE_INDEX = re.compile(r"^gpu-(\d+)(?:-|$)")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A published device of the current generation and the GPU object it belongs to."""

    gpu_name: str
    record: PublishedDevice


@dataclass(frozen=True, slots=True)
class GpuHardware:
    """A physical GPU as its pool publishes it (the ``spec`` plus health)."""

    name: str
    node: str
    pool: str
    index: int
    uuid: str
    model: str
    memory: int
    cores: int
    sharing_mode: str
    devices: tuple[str, ...]
    unhealthy_reason: str | None = None
    #: Taints on the GPU's devices (see :data:`GpuTaintEntry`), sorted by device, the slice's
    #: before the rules' (:func:`with_rule_taints`).
    taints: tuple[GpuTaintEntry, ...] = ()
    #: The smallest cores a share of it is charged (its shared device's cores policy minimum,
    #: which bounds its shares; 1 without one).
    min_share_cores: int = 1


@dataclass(frozen=True, slots=True)
class Alloc:
    """One allocation result of a claim on the GPU named ``gpu`` (``memory`` in bytes).

    ``pods`` holds ``(name, uid, containers)`` sorted by name and uid.
    """

    gpu: str
    claim_namespace: str
    claim_name: str
    claim_uid: str
    request: str
    device: str
    share_id: str | None
    cores: int
    memory: int
    pods: tuple[tuple[str, str, tuple[str, ...]], ...]
    #: The node plugin's measurement of this allocation, None when there is none.
    usage: MeasuredUsage | None = None
    #: MPS shares only (:func:`controller.mpsclients.mps_verdict` True): the client
    #: containers of the reserving pods with their effective UIDs, in ``reservedFor`` order.
    mps_clients: tuple[Client, ...] = ()
    #: Whether this is an MPS share (None: unknown; see :mod:`controller.mpsclients`).
    mps: bool | None = False
    #: ``(cores, memory bytes)`` the share may use when its config sets a ``burstLimit``
    #: (:func:`api.burst.limit_caps`), None when its caps are its request.
    limit: tuple[int, int] | None = None

    def sort_key(self) -> tuple[str, str, str, str, str]:
        """The order of ``status.allocations`` (see :mod:`api.gpu`)."""
        return (
            self.claim_namespace,
            self.claim_name,
            self.request,
            self.device,
            self.share_id or "",
        )


def newest_generation(slices: Iterable[SliceRecord]) -> dict[str, list[SliceRecord]]:
    """Slices grouped by pool (driver + node, see :func:`controller.records.node_pool`): each
    pool's newest *complete* generation (all ``resourceSliceCount`` slices present), or its
    newest one when none is complete. Slices that count for no pool are left out.

    Preferring a complete generation keeps GPUs in place while a plugin republishes its pool
    slice by slice, instead of dropping and re-creating their objects.
    """
    by_gen: dict[str, dict[int, list[SliceRecord]]] = defaultdict(lambda: defaultdict(list))
    for s in slices:
        if s.pool is not None:
            by_gen[s.pool][s.generation].append(s)
    chosen: dict[str, list[SliceRecord]] = {}
    for name, gens in by_gen.items():
        complete = [g for g, ss in gens.items() if len(ss) >= ss[0].count]
        gen = max(complete) if complete else max(gens)
        chosen[name] = sorted(gens[gen], key=lambda s: s.name)
    return chosen


def pool_hardware(
    pool: str, slices: Iterable[SliceRecord]
) -> tuple[dict[str, GpuHardware], dict[str, DeviceInfo]]:
    """The physical GPUs of one pool (by GPU object name) and its devices (by device name).

    ``slices`` are the pool's slices of one generation (see :func:`newest_generation`).
    """
    counters: dict[str, dict[str, int]] = {}
    by_uuid: dict[str, list[tuple[str, PublishedDevice]]] = defaultdict(list)
    for s in slices:
        node = s.node or pool
        for set_name, values in s.counters:
            counters[set_name] = dict(values)
        for d in s.devices:
            if d.gpu_uuid:
                by_uuid[d.gpu_uuid].append((node, d))

    gpus: dict[str, GpuHardware] = {}
    devices: dict[str, DeviceInfo] = {}
    for gpu_uuid, members in by_uuid.items():
        members.sort(key=lambda m: (m[1].has_parent, m[1].name))
        node, first = members[0]
        index = first.index
        if index is None:
            match = _DEVICE_INDEX.match(first.name)
            index = int(match.group(1)) if match else 0
        set_counters = counters.get(counter_set_name(index), {})
        memory = max((d.memory or 0 for _, d in members), default=0)
        memory = memory or set_counters.get(CAP_MEMORY, 0)
        cores = max((d.cores or 0 for _, d in members), default=0)
        cores = cores or set_counters.get(CAP_CORES, CORES_PER_GPU)
        if any(d.shared for _, d in members):
            mode = SHARING_MODE_CONSUMABLE
        elif any(d.partition for _, d in members) or len(members) > 1:
            mode = SHARING_MODE_PARTITIONS
        else:
            mode = SHARING_MODE_EXCLUSIVE
        reason = next((d.unhealthy_reason for _, d in members if d.unhealthy_reason), None)
        name = gpu_object_name(node, index)
        gpus[name] = GpuHardware(
            name=name,
            node=node,
            pool=pool,
            index=index,
            uuid=gpu_uuid,
            model=first.model or "unknown",
            memory=memory,
            cores=cores,
            sharing_mode=mode,
            devices=tuple(sorted(d.name for _, d in members)),
            unhealthy_reason=reason,
            taints=tuple(
                (d.name, *t, None)
                for _, d in sorted(members, key=lambda m: m[1].name)
                for t in d.taints
            ),
            min_share_cores=max((d.cores_min or 1 for _, d in members if d.shared), default=1),
        )
        for _, d in members:
            devices[d.name] = DeviceInfo(gpu_name=name, record=d)
    return gpus, devices


def _consumption(
    consumed: tuple[int | None, int | None] | None, device: PublishedDevice, gpu: GpuHardware
) -> tuple[int, int]:
    """What a result holds: each amount its ``consumedCapacity`` recorded, else the device's
    own (a share device's is its whole GPU's, which is what the node plugin grants)."""
    cores = device.cores if device.cores is not None else device.counter_cores
    memory = device.memory if device.memory is not None else device.counter_memory
    whole = (gpu.cores if cores is None else cores, gpu.memory if memory is None else memory)
    return reserved_amounts(consumed, whole)


def claim_allocations(
    claim: AllocatedClaim,
    devices: Mapping[tuple[str, str], DeviceInfo],
    gpus: Mapping[str, GpuHardware],
    pods: Mapping[str, PodInfo],
) -> tuple[Alloc, ...]:
    """The allocations this claim holds on published devices.

    ``devices`` is keyed by (pool, device name), ``pods`` by ``<namespace>/<name>``. Devices not
    (or no longer) published are ignored.
    """
    out: list[Alloc] = []
    for result in claim.results:
        device = devices.get((result.pool, result.device))
        if device is None:
            continue
        gpu = gpus[device.gpu_name]
        cores, memory = (
            (0, 0) if result.admin_access else _consumption(result.consumed, device.record, gpu)
        )
        pod_refs = []
        for pod_name, uid in claim.reserved:
            info = pods.get(f"{claim.namespace}/{pod_name}")
            containers = (
                info.containers_for(claim.name, result.request)
                if info is not None and (not uid or info.uid == uid)
                else ()
            )
            pod_refs.append((pod_name, uid, containers))
        pod_refs.sort(key=lambda p: (p[0], p[1]))
        mps = mps_verdict(result, device.record, cores, memory)
        out.append(
            Alloc(
                gpu=device.gpu_name,
                claim_namespace=claim.namespace,
                claim_name=claim.name,
                claim_uid=claim.uid,
                request=result.request,
                device=device.record.name,
                share_id=result.share_id,
                cores=cores,
                memory=memory,
                pods=tuple(pod_refs),
                usage=result.usage,
                mps_clients=client_users(claim, result.request, pods) if mps else (),
                mps=mps,
                limit=None if result.limit is None else limit_caps(result.limit, cores, memory),
            )
        )
    return tuple(out)


def with_rule_taints(
    gpu: GpuHardware, rules: Iterable[TaintRuleRecord], driver: str
) -> GpuHardware:
    """``gpu`` with the taints of the DeviceTaintRules that select its devices (as devices of
    ``driver`` in the GPU's pool) in place of those it had from rules; the slice's taints are
    kept. Rules are taken in name order, so the result does not depend on arrival order."""
    ordered = sorted(rules, key=lambda r: r.name)
    from_rules = [
        (device, *r.taint, r.name)
        for device in gpu.devices
        for r in ordered
        if r.matches(driver, gpu.pool, device)
    ]
    own = [t for t in gpu.taints if t[4] is None]
    taints = tuple(sorted([*own, *from_rules], key=lambda t: (t[0], t[4] is not None)))
    return gpu if taints == gpu.taints else replace(gpu, taints=taints)


def gpu_labels(gpu: GpuHardware) -> dict[str, str]:
    """The object's own labels (see :attr:`api.gpu.GpuObject.labels`)."""
    value = node_label_value(gpu.node)
    return {} if value is None else {GPU_NODE_LABEL: value}


def limit_sums(allocations: Iterable[Alloc]) -> tuple[int, int] | None:
    """The allocations' burst limits (or, for one without, its request) summed as ``(cores,
    memory bytes)``; None when no allocation has a burst limit (the status then shows none)."""
    allocs = list(allocations)
    if all(a.limit is None for a in allocs):
        return None
    cores = sum(a.cores if a.limit is None else a.limit[0] for a in allocs)
    memory = sum(a.memory if a.limit is None else a.limit[1] for a in allocs)
    return cores, memory


def overcommitted_condition(allocations: Iterable[Alloc]) -> Obj | None:
    """The ``Overcommitted`` condition of a GPU's (sorted) allocations: True naming each claim
    and what it exceeds, False when every measured allocation stays within its reservation,
    None when no allocation was measured."""
    measured = False
    over: dict[str, set[str]] = {}
    for a in allocations:
        if a.usage is None:
            continue
        measured = True
        if a.usage.overcommitted:
            over.setdefault(f"{a.claim_namespace}/{a.claim_name}", set()).update(
                a.usage.overcommitted
            )
    if not measured:
        return None
    if not over:
        return {
            "type": CONDITION_OVERCOMMITTED,
            "status": "False",
            "reason": "WithinReservation",
            "message": "every measured share uses at most what it reserved",
        }
    parts = [f"{claim} ({', '.join(sorted(what))})" for claim, what in sorted(over.items())]
    return {
        "type": CONDITION_OVERCOMMITTED,
        "status": "True",
        "reason": "UsageExceedsReservation",
        "message": "claims using more than they reserved: " + "; ".join(parts),
    }


def mps_escaped_condition(allocations: Iterable[Alloc]) -> Obj | None:
    """The ``MPSEscaped`` condition of a GPU's (sorted) allocations: True when a measured MPS
    share reports its own compute processes outside MPS (the sum over the shares, naming the
    claims whose pods run them), False when every judged MPS share reports none, None when none
    was judged. A process of no share of the GPU is in no share's usage: the node's metric
    and log report it."""
    judged = False
    outside = 0
    claims: dict[str, int] = {}
    for a in allocations:
        if a.usage is None or a.usage.outside_mps is None:
            continue
        judged = True
        outside += a.usage.outside_mps
        if a.usage.escaped_pods:
            label = f"{a.claim_namespace}/{a.claim_name}"
            claims[label] = claims.get(label, 0) + len(a.usage.escaped_pods)
    if not judged:
        return None
    if not outside:
        return {
            "type": CONDITION_MPS_ESCAPED,
            "status": "False",
            "reason": "AllProcessesInMPS",
            "message": "every compute process on the GPU is an MPS client or server",
        }
    message = (
        f"{outside} compute process{'es' if outside != 1 else ''} outside MPS get the whole GPU, "
        "beyond the MPS shares' limits"
    )
    if claims:
        message += "; pods of claims: " + ", ".join(
            f"{claim} ({n} pod{'s' if n != 1 else ''})" for claim, n in sorted(claims.items())
        )
    return {
        "type": CONDITION_MPS_ESCAPED,
        "status": "True",
        "reason": "ProcessOutsideMPS",
        "message": message,
    }


def usage(allocations: Iterable[Alloc]) -> tuple[int, int, int]:
    """``(cores, memory bytes, distinct claims)`` the allocations of one GPU use; a claim is
    told apart by its UID, or by namespace and name when it has none."""
    cores = memory = 0
    claims: set[str | tuple[str, str]] = set()
    for a in allocations:
        cores += a.cores
        memory += a.memory
        claims.add(a.claim_uid or (a.claim_namespace, a.claim_name))
    return cores, memory, len(claims)


def gpu_status_json(
    gpu: GpuHardware, allocations: Iterable[Alloc], idle: IdleVerdict | None = None
) -> Obj:
    """``status`` of the GPU object for the allocations on it, laid out by
    :func:`api.gpustatus.gpu_status_json` (allocations sorted, sums and conditions decided
    here); ``idle``: the idle verdict of the allocations (None: idle reporting off)."""
    allocs = sorted(allocations, key=Alloc.sort_key)
    used_cores, used_memory, claim_count = usage(allocs)
    conditions = [
        c
        for c in (
            overcommitted_condition(allocs),
            mps_escaped_condition(allocs),
            shares_idle_condition(allocs, idle) if idle is not None else None,
        )
        if c is not None
    ]
    idle_keys = idle.idle if idle is not None else {}
    return encode_gpu_status(
        capacity=(gpu.cores, gpu.memory),
        allocated=(used_cores, used_memory),
        allocations=[allocation_json(a, alloc_key(a) in idle_keys) for a in allocs],
        claim_count=claim_count,
        unhealthy_reason=gpu.unhealthy_reason,
        taints=gpu.taints,
        conditions=conditions,
        limits=limit_sums(allocs),
    )


def gpu_manifest(
    gpu: GpuHardware, allocations: Iterable[Alloc], idle: IdleVerdict | None = None
) -> Obj:
    """The whole GPU object as the tracker writes it (what :meth:`api.gpu.GpuObject.manifest`
    gives for :func:`gpu_object`)."""
    metadata: Obj = {"name": gpu.name}
    if labels := gpu_labels(gpu):
        metadata["labels"] = labels
    return {
        "apiVersion": GROUP_VERSION,
        "kind": GPU_KIND,
        "metadata": metadata,
        "spec": gpu_spec_json(gpu),
        "status": gpu_status_json(gpu, allocations, idle),
    }


def gpu_object(
    gpu: GpuHardware, allocations: Iterable[Alloc], idle: IdleVerdict | None = None
) -> GpuObject:
    """The desired GPU object as a validated :class:`api.gpu.GpuObject` (for readers at the
    edges: the JSON API, tests; the tracker itself works on :func:`gpu_manifest`)."""
    return GpuObject.model_validate(
        {
            "name": gpu.name,
            "spec": gpu_spec_json(gpu),
            "status": gpu_status_json(gpu, allocations, idle),
        }
    )


def reconcile(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    driver: str,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> dict[str, GpuObject]:
    """All desired ``GPU`` objects, by name, from the complete current inputs (JSON)."""
    rules = [r for r in map(taint_rule_record, taint_rules) if r is not None]
    gpus: dict[str, GpuHardware] = {}
    devices: dict[tuple[str, str], DeviceInfo] = {}
    records = [slice_record(s, driver) for s in slices]
    for pool, pool_slices in newest_generation(records).items():
        pool_gpus, pool_devices = pool_hardware(pool, pool_slices)
        gpus.update({n: with_rule_taints(hw, rules, driver) for n, hw in pool_gpus.items()})
        devices.update({(pool, name): d for name, d in pool_devices.items()})
    pod_index = {p.key: p for p in map(pod_info, pods)}
    per_gpu: dict[str, list[Alloc]] = defaultdict(list)
    for claim in claims:
        record = claim_record(claim, driver)
        if record is not None:
            for alloc in claim_allocations(record, devices, gpus, pod_index):
                per_gpu[alloc.gpu].append(alloc)
    return {name: gpu_object(hw, per_gpu.get(name, ())) for name, hw in sorted(gpus.items())}
