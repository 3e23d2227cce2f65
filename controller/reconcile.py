"""From ResourceSlices, ResourceClaims and Pods to the desired ``GPU`` objects.

Everything here is deterministic and side-effect free: the same inputs always give equal
objects, whatever their order. The tracker calls the pieces incrementally
(:func:`pool_hardware` per pool, :func:`claim_allocations` per claim, :func:`gpu_object` per GPU);
:func:`reconcile` composes them over whole inputs and is what tests compare against.

Rules, stated once:

- A physical GPU is identified by its UUID within a pool: a device's ``parentUUID`` if it has one
  (partition devices), else its ``uuid``. Only one generation of a pool counts: the newest
  complete one (see :func:`newest_generation`).
- What an allocation result consumes: its ``consumedCapacity`` if the scheduler recorded one
  (consumable shares); else the device's own ``cores``/``memory`` capacity (whole GPUs and
  partitions); else the counters the device consumes; else the whole GPU. ``adminAccess``
  results are listed but consume nothing.
- Health: a device of the GPU tainted with ``<driver>/unhealthy`` makes the GPU Unhealthy.
- Pods come from the claim's ``status.reservedFor``; their containers are those whose
  ``resources.claims`` name the pod's claim entry that resolves to this claim (and, if a request
  is named, the result's top-level request).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from api.gpu import HEALTHY, UNHEALTHY, Allocation, GpuObject, GpuSpec, GpuStatus, PodRef, Resources
from api.names import (
    ATTR_INDEX,
    ATTR_PARENT_UUID,
    ATTR_PARTITION,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAP_CORES,
    CAP_MEMORY,
    CORES_PER_GPU,
    SHARING_MODE_CONSUMABLE,
    SHARING_MODE_EXCLUSIVE,
    SHARING_MODE_PARTITIONS,
    counter_set_name,
    gpu_object_name,
    unhealthy_taint_key,
)
from api.quantity import QuantityError, format_bytes_human, format_quantity, quantity_int

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
_DEVICE_INDEX = re.compile(r"^gpu-(\d+)(?:-|$)")


@dataclass(frozen=True)
class DeviceInfo:
    """One published device of this driver, reduced to what accounting needs."""

    pool: str
    name: str
    gpu_name: str
    cores: int | None
    memory: int | None
    counter_cores: int | None
    counter_memory: int | None
    shared: bool


@dataclass
class GpuHardware:
    """A physical GPU as its pool publishes it (the future ``spec`` plus health)."""

    name: str
    node: str
    pool: str
    index: int
    uuid: str
    model: str
    memory: int
    cores: int
    sharing_mode: str
    devices: list[str] = field(default_factory=list)
    unhealthy_reason: str | None = None


@dataclass(frozen=True)
class PodInfo:
    """The parts of a Pod that say which containers use which claim."""

    namespace: str
    name: str
    uid: str
    #: pod claim entry name -> ResourceClaim name it resolves to
    claim_names: Mapping[str, str]
    #: pod claim entry name -> [(container name, request or None)]
    claim_containers: Mapping[str, tuple[tuple[str, str | None], ...]]

    def containers_for(self, claim_name: str, request: str) -> list[str]:
        """Containers of this pod that use ``request`` of the claim named ``claim_name``."""
        top = request.split("/", 1)[0]
        found: list[str] = []
        for entry, resolved in self.claim_names.items():
            if resolved != claim_name:
                continue
            for container, req in self.claim_containers.get(entry, ()):
                if (req is None or req == top) and container not in found:
                    found.append(container)
        return sorted(found)


def _key_of(d: Mapping[str, Any], driver: str, name: str) -> Any:
    """Value under the qualified or the unqualified name (``<driver>/name`` or ``name``)."""
    if name in d:
        return d[name]
    return d.get(f"{driver}/{name}")


def _attr(device: Obj, driver: str, name: str) -> Any:
    value = _key_of(device.get("attributes") or {}, driver, name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


@lru_cache(maxsize=4096)
def _qty_text(value: str | int) -> int | None:
    try:
        return quantity_int(value)
    except QuantityError:
        return None


def _qty(value: Any) -> int | None:
    """Integer value of a quantity (None when absent or invalid); texts repeat, so cached."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return _qty_text(value)
    return None


def _capacity(device: Obj, driver: str, name: str) -> int | None:
    cap = _key_of(device.get("capacity") or {}, driver, name)
    return _qty(cap.get("value")) if isinstance(cap, Mapping) else None


def _consumed_counters(device: Obj, name: str) -> int | None:
    total: int | None = None
    for consumption in device.get("consumesCounters") or []:
        counter = (consumption.get("counters") or {}).get(name)
        if isinstance(counter, Mapping) and (v := _qty(counter.get("value"))) is not None:
            total = (total or 0) + v
    return total


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
            _slice_name(s),
            name,
            spec.get("nodeName"),
        )
        return None
    return name


def newest_generation(slices: Iterable[Obj], driver: str) -> dict[str, list[Obj]]:
    """This driver's slices grouped by pool (driver + node, see :func:`node_pool`): each pool's
    newest *complete* generation (all ``resourceSliceCount`` slices present), or its newest one
    when none is complete.

    Preferring a complete generation keeps GPUs in place while a plugin republishes its pool
    slice by slice, instead of dropping and re-creating their objects.
    """
    by_gen: dict[str, dict[int, list[Obj]]] = defaultdict(lambda: defaultdict(list))
    for s in slices:
        name = node_pool(s, driver)
        if name is not None:
            generation = (s.get("spec") or {}).get("pool", {}).get("generation")
            by_gen[name][generation if isinstance(generation, int) else 0].append(s)
    chosen: dict[str, list[Obj]] = {}
    for name, gens in by_gen.items():
        complete = [g for g, ss in gens.items() if len(ss) >= _slice_count(ss[0])]
        gen = max(complete) if complete else max(gens)
        chosen[name] = sorted(gens[gen], key=_slice_name)
    return chosen


def _slice_count(s: Obj) -> int:
    count = ((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount")
    return int(count) if isinstance(count, int) and count > 0 else 1


def _slice_name(s: Obj) -> str:
    return str((s.get("metadata") or {}).get("name", ""))


def pool_hardware(
    pool: str, slices: Iterable[Obj], driver: str
) -> tuple[dict[str, GpuHardware], dict[str, DeviceInfo]]:
    """The physical GPUs of one pool (by GPU object name) and its devices (by device name).

    ``slices`` are the pool's slices of one generation (see :func:`newest_generation`).
    """
    taint_key = unhealthy_taint_key(driver)
    counters: dict[str, dict[str, int]] = {}
    raw_devices: list[tuple[str, Obj]] = []
    for s in slices:
        spec = s.get("spec") or {}
        node = spec.get("nodeName") or pool
        for cs in spec.get("sharedCounters") or []:
            values = {
                k: v
                for k, c in (cs.get("counters") or {}).items()
                if isinstance(c, Mapping) and (v := _qty(c.get("value"))) is not None
            }
            counters[str(cs.get("name"))] = values
        raw_devices.extend((str(node), d) for d in spec.get("devices") or [])

    by_uuid: dict[str, list[tuple[str, Obj]]] = defaultdict(list)
    for node, d in raw_devices:
        gpu_uuid = _attr(d, driver, ATTR_PARENT_UUID) or _attr(d, driver, ATTR_UUID)
        if isinstance(gpu_uuid, str) and gpu_uuid:
            by_uuid[gpu_uuid].append((node, d))

    gpus: dict[str, GpuHardware] = {}
    devices: dict[str, DeviceInfo] = {}
    for gpu_uuid, members in by_uuid.items():
        members.sort(
            key=lambda m: (_attr(m[1], driver, ATTR_PARENT_UUID) is not None, m[1]["name"])
        )
        node, first = members[0]
        index = _attr(first, driver, ATTR_INDEX)
        if not isinstance(index, int):
            match = _DEVICE_INDEX.match(str(first.get("name", "")))
            index = int(match.group(1)) if match else 0
        memory = max((_capacity(d, driver, CAP_MEMORY) or 0 for _, d in members), default=0)
        if memory == 0:
            memory = counters.get(counter_set_name(index), {}).get(CAP_MEMORY, 0)
        cores = max((_capacity(d, driver, CAP_CORES) or 0 for _, d in members), default=0)
        cores = cores or counters.get(counter_set_name(index), {}).get(CAP_CORES, CORES_PER_GPU)
        if any(d.get("allowMultipleAllocations") for _, d in members):
            mode = SHARING_MODE_CONSUMABLE
        elif (
            any(_attr(d, driver, ATTR_PARTITION) is not None for _, d in members)
            or len(members) > 1
        ):
            mode = SHARING_MODE_PARTITIONS
        else:
            mode = SHARING_MODE_EXCLUSIVE
        reason: str | None = None
        for _, d in members:
            for taint in d.get("taints") or []:
                if taint.get("key") == taint_key and reason is None:
                    value = taint.get("value")
                    reason = str(value) if value else f"device {d['name']} has taint {taint_key}"
        name = gpu_object_name(node, index)
        gpus[name] = GpuHardware(
            name=name,
            node=node,
            pool=pool,
            index=index,
            uuid=gpu_uuid,
            model=str(_attr(first, driver, ATTR_PRODUCT_NAME) or "unknown"),
            memory=memory,
            cores=cores,
            sharing_mode=mode,
            devices=sorted(str(d["name"]) for _, d in members),
            unhealthy_reason=reason,
        )
        for _, d in members:
            devices[str(d["name"])] = DeviceInfo(
                pool=pool,
                name=str(d["name"]),
                gpu_name=name,
                cores=_capacity(d, driver, CAP_CORES),
                memory=_capacity(d, driver, CAP_MEMORY),
                counter_cores=_consumed_counters(d, CAP_CORES),
                counter_memory=_consumed_counters(d, CAP_MEMORY),
                shared=bool(d.get("allowMultipleAllocations")),
            )
    return gpus, devices


def pod_info(pod: Obj) -> PodInfo:
    """Reduce a Pod to its claim entries and the containers that use them."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    names: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names[str(entry["name"])] = str(entry["resourceClaimName"])
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName") and st.get("name") not in names:
            names[str(st["name"])] = str(st["resourceClaimName"])
    containers: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for ref in (c.get("resources") or {}).get("claims") or []:
            req = ref.get("request")
            containers[str(ref.get("name"))].append((str(c.get("name")), req or None))
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        claim_names=names,
        claim_containers={k: tuple(v) for k, v in containers.items()},
    )


def claim_key(claim: Obj) -> str:
    """``<namespace>/<name>`` of a claim (or any namespaced object)."""
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def reserved_pods(claim: Obj) -> list[tuple[str, str]]:
    """``(name, uid)`` of the pods in the claim's ``status.reservedFor``."""
    out = []
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if ref.get("resource") == "pods" and not ref.get("apiGroup"):
            out.append((str(ref.get("name", "")), str(ref.get("uid", ""))))
    return out


def _consumption(result: Obj, device: DeviceInfo, gpu: GpuHardware, driver: str) -> tuple[int, int]:
    consumed = result.get("consumedCapacity")
    if isinstance(consumed, Mapping):
        return (
            _qty(_key_of(consumed, driver, CAP_CORES)) or 0,
            _qty(_key_of(consumed, driver, CAP_MEMORY)) or 0,
        )
    cores = device.cores if device.cores is not None else device.counter_cores
    memory = device.memory if device.memory is not None else device.counter_memory
    return (gpu.cores if cores is None else cores, gpu.memory if memory is None else memory)


def claim_allocations(
    claim: Obj,
    devices: Mapping[tuple[str, str], DeviceInfo],
    gpus: Mapping[str, GpuHardware],
    pods: Mapping[tuple[str, str], PodInfo],
    driver: str,
) -> list[tuple[str, Allocation]]:
    """The allocations this claim holds, as ``(GPU object name, Allocation)`` pairs.

    ``devices`` is keyed by (pool, device name), ``pods`` by (namespace, name). Results of other
    drivers and devices not (or no longer) published are ignored.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    if not results:
        return []
    meta = claim.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    claim_name = str(meta.get("name", ""))
    reserved = reserved_pods(claim)
    out: list[tuple[str, Allocation]] = []
    for result in results:
        if result.get("driver") != driver:
            continue
        device = devices.get((str(result.get("pool")), str(result.get("device"))))
        if device is None:
            continue
        gpu = gpus[device.gpu_name]
        request = str(result.get("request", ""))
        cores, memory = (
            (0, 0) if result.get("adminAccess") else _consumption(result, device, gpu, driver)
        )
        pod_refs = []
        for pod_name, uid in reserved:
            info = pods.get((namespace, pod_name))
            containers = (
                info.containers_for(claim_name, request)
                if info and (not uid or info.uid == uid)
                else []
            )
            pod_refs.append(PodRef(name=pod_name, uid=uid, containers=containers))
        pod_refs.sort(key=lambda p: (p.name, p.uid))
        out.append(
            (
                device.gpu_name,
                Allocation(
                    claim_namespace=namespace,
                    claim_name=claim_name,
                    claim_uid=str(meta.get("uid", "")),
                    request=request,
                    device=device.name,
                    share_id=result.get("shareID") or None,
                    cores=cores,
                    memory=format_quantity(memory),
                    pods=pod_refs,
                ),
            )
        )
    return out


def _alloc_sort_key(a: Allocation) -> tuple[str, str, str, str, str]:
    return (a.claim_namespace, a.claim_name, a.request, a.device, a.share_id or "")


def gpu_object(gpu: GpuHardware, allocations: Iterable[Allocation]) -> GpuObject:
    """The desired ``GPU`` object for one physical GPU and the allocations on it."""
    allocs = sorted(allocations, key=_alloc_sort_key)
    used_cores = sum(a.cores for a in allocs)
    used_memory = sum(_qty(a.memory) or 0 for a in allocs)
    return GpuObject(
        name=gpu.name,
        spec=GpuSpec(
            node=gpu.node,
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            memory=format_quantity(gpu.memory),
            cores=gpu.cores,
            sharing_mode=gpu.sharing_mode,
            pool=gpu.pool,
            devices=list(gpu.devices),
        ),
        status=GpuStatus(
            health=UNHEALTHY if gpu.unhealthy_reason else HEALTHY,
            health_reason=gpu.unhealthy_reason,
            capacity=Resources(cores=gpu.cores, memory=format_quantity(gpu.memory)),
            allocated=Resources(cores=used_cores, memory=format_quantity(used_memory)),
            allocatable=Resources(
                cores=max(gpu.cores - used_cores, 0),
                memory=format_quantity(max(gpu.memory - used_memory, 0)),
            ),
            allocations=allocs,
            claim_count=len({a.claim_uid or f"{a.claim_namespace}/{a.claim_name}" for a in allocs}),
            cores_summary=f"{used_cores}/{gpu.cores}",
            memory_summary=f"{format_bytes_human(used_memory)}/{format_bytes_human(gpu.memory)}",
        ),
    )


def reconcile(
    slices: Iterable[Obj], claims: Iterable[Obj], pods: Iterable[Obj], driver: str
) -> dict[str, GpuObject]:
    """All desired ``GPU`` objects, by name, from the complete current inputs."""
    gpus: dict[str, GpuHardware] = {}
    devices: dict[tuple[str, str], DeviceInfo] = {}
    for pool, pool_slices in newest_generation(slices, driver).items():
        pool_gpus, pool_devices = pool_hardware(pool, pool_slices, driver)
        gpus.update(pool_gpus)
        devices.update({(pool, name): d for name, d in pool_devices.items()})
    pod_index = {(p.namespace, p.name): p for p in map(pod_info, pods)}
    per_gpu: dict[str, list[Allocation]] = defaultdict(list)
    for claim in claims:
        for gpu_name, alloc in claim_allocations(claim, devices, gpus, pod_index, driver):
            per_gpu[gpu_name].append(alloc)
    return {name: gpu_object(hw, per_gpu.get(name, ())) for name, hw in sorted(gpus.items())}
