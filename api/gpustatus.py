"""The one encoder of the ``GPU`` object's ``spec`` and ``status``: plain values in, the JSON
shape :class:`api.gpu.GpuSpec` and :class:`api.gpu.GpuStatus` validate out.

The tracker encodes a GPU status on every change of a claim on it, so these build dicts
directly (no model instance on the way); that they agree with the pydantic models is a tested
property. The rules that choose the values (what an allocation consumes, the conditions' verdicts)
live in :mod:`controller.reconcile`; this module only lays them out:

- amounts are bytes in, canonical quantities out (:func:`api.quantity.format_quantity`);
- ``allocations`` are written in the order given (the caller sorts them);
- optional fields without a value (``shareID``, ``usage``, ``limit``, ``healthReason``,
  ``taints``, ``conditions``, the burst ``limits``) are left out, never written as null or empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from api.burst import overcommit_ratio
from api.gpu import HEALTHY, UNHEALTHY
from api.quantity import format_bytes_human, format_quantity
from api.shareusage import MeasuredUsage, usage_json

#: One taint on a device of a GPU: ``(device, key, value, effect, rule)``, ``rule`` the name of
#: the DeviceTaintRule it comes from, None for a taint in the slice.
GpuTaintEntry = tuple[str, str, str, str, str | None]
#: A pod using an allocation: ``(name, uid, containers)``.
PodEntry = tuple[str, str, tuple[str, ...]]


class GpuHardwareView(Protocol):
    """What ``spec`` is made of (the controller's ``GpuHardware``)."""

    @property
    def node(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def memory(self) -> int: ...
    @property
    def cores(self) -> int: ...
    @property
    def sharing_mode(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def devices(self) -> Sequence[str]: ...


class AllocationView(Protocol):
    """What one entry of ``status.allocations`` is made of (the controller's ``Alloc``)."""

    @property
    def claim_namespace(self) -> str: ...
    @property
    def claim_name(self) -> str: ...
    @property
    def claim_uid(self) -> str: ...
    @property
    def request(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def share_id(self) -> str | None: ...
    @property
    def cores(self) -> int: ...
    @property
    def memory(self) -> int: ...
    @property
    def pods(self) -> Sequence[PodEntry]: ...
    @property
    def usage(self) -> MeasuredUsage | None: ...
    @property
    def limit(self) -> tuple[int, int] | None: ...


def gpu_spec_json(gpu: GpuHardwareView) -> dict[str, Any]:
    """``spec`` of the GPU object."""
    return {
        "node": gpu.node,
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "memory": format_quantity(gpu.memory),
        "cores": gpu.cores,
        "sharingMode": gpu.sharing_mode,
        "pool": gpu.pool,
        "devices": list(gpu.devices),
    }


def allocation_json(a: AllocationView, idle: bool = False) -> dict[str, Any]:
    """One entry of ``status.allocations``; ``idle`` is written only when True."""
    out: dict[str, Any] = {
        "claimNamespace": a.claim_namespace,
        "claimName": a.claim_name,
        "claimUid": a.claim_uid,
        "request": a.request,
        "device": a.device,
        "cores": a.cores,
        "memory": format_quantity(a.memory),
        "pods": [{"name": n, "uid": u, "containers": list(c)} for n, u, c in a.pods],
    }
    if a.share_id is not None:
        out["shareID"] = a.share_id
    if a.usage is not None:
        out["usage"] = usage_json(a.usage)
    if a.limit is not None:
        out["limit"] = {"cores": a.limit[0], "memory": format_quantity(a.limit[1])}
    if idle:
        out["idle"] = True
    return out


def taint_json(t: GpuTaintEntry) -> dict[str, Any]:
    """One entry of ``status.taints``."""
    device, key, value, effect, rule = t
    out: dict[str, Any] = {"device": device, "key": key, "value": value, "effect": effect}
    if rule is not None:
        out["deviceTaintRule"] = rule
    return out


def gpu_status_json(
    *,
    capacity: tuple[int, int],
    allocated: tuple[int, int],
    allocations: Iterable[dict[str, Any]],
    claim_count: int,
    unhealthy_reason: str | None = None,
    taints: Sequence[GpuTaintEntry] = (),
    conditions: Sequence[Mapping[str, Any]] = (),
    limits: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``status`` of a GPU: ``capacity``, ``allocated`` and ``limits`` are ``(cores, memory
    bytes)``, ``allocations`` entries of :func:`allocation_json`; ``allocatable`` and the
    summaries are derived (never below zero). ``limits`` (the allocations' burst limits, or their
    requests, summed) is given only when an allocation has a burst limit; it adds ``limits``,
    ``limitsSummary`` and ``overcommit`` (:func:`api.burst.overcommit_ratio`)."""
    cores, memory = capacity
    used_cores, used_memory = allocated
    status: dict[str, Any] = {"health": UNHEALTHY if unhealthy_reason else HEALTHY}
    if unhealthy_reason:
        status["healthReason"] = unhealthy_reason
    status.update(
        capacity={"cores": cores, "memory": format_quantity(memory)},
        allocated={"cores": used_cores, "memory": format_quantity(used_memory)},
        allocatable={
            "cores": max(cores - used_cores, 0),
            "memory": format_quantity(max(memory - used_memory, 0)),
        },
        allocations=list(allocations),
        claimCount=claim_count,
    )
    if taints:
        status["taints"] = [taint_json(t) for t in taints]
    status.update(
        coresSummary=f"{used_cores}/{cores}",
        memorySummary=f"{format_bytes_human(used_memory)}/{format_bytes_human(memory)}",
    )
    if limits is not None:
        limit_cores, limit_memory = limits
        status.update(
            limits={"cores": limit_cores, "memory": format_quantity(limit_memory)},
            limitsSummary=f"{limit_cores}/{cores} cores, "
            f"{format_bytes_human(limit_memory)}/{format_bytes_human(memory)}",
            overcommit=overcommit_ratio((limit_cores, limit_memory), (cores, memory)),
        )
    if conditions:
        status["conditions"] = [dict(c) for c in conditions]
    return status
