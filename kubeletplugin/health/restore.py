"""Unhealthy GPUs survive a plugin restart: read back the taints the node's slices carry.

Without this, a restarted plugin would start with every GPU healthy, publish untainted slices
and only re-taint a GPU whose probe still fails; a GPU tainted for an XID would silently come
back. :func:`published_unhealthy` returns, per device, the reason and the time of the unhealthy
taint found on the API server; :meth:`HealthMonitor.restore` starts those GPUs unhealthy, so
they recover only through the usual consecutive healthy probes, or, for a fault that needs a
GPU reset, not before the GPU was reset (:func:`node_boot_time` tells whether the node rebooted
since).

A GPU-wide fault is published on every device of its GPU, an instance-level fault (a health
event that named a MIG instance) on the device of that instance only (on every device of a
static GPU instance when the event named no compute instance). :func:`split_published` tells
them apart again: on a GPU whose devices are MIG instances, a fault (same value and time) is
GPU-wide when it is on devices of more than one GPU instance or on every device of the GPU;
otherwise it is restored on the devices that carry it only. Two instance-level faults with the
same value added in the same second on different instances read as GPU-wide (the fail-safe
side: more devices stay tainted, never fewer).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from api import names
from kubeletplugin.devices.table import NodeDevice
from kubeletplugin.health.instances import instance_group
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)

SLICES_PATH = f"/apis/{names.RESOURCE_GROUP_VERSION}/resourceslices"
#: The kernel's statistics; its ``btime`` line is the boot time (not namespaced in containers).
PROC_STAT: Final = Path("/proc/stat")


def node_boot_time(proc_stat: Path = PROC_STAT) -> float | None:
    """When the node booted (Unix seconds, ``btime`` of ``/proc/stat``); None when unreadable."""
    try:
        lines = proc_stat.read_text().splitlines()
    except OSError as exc:
        log.warning("cannot read the boot time from %s: %s", proc_stat, exc)
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[0] == "btime" and fields[1].isdigit():
            return float(fields[1])
    log.warning("no boot time (btime) in %s", proc_stat)
    return None


@dataclass(frozen=True)
class PublishedFault:
    """An unhealthy taint as published: its value and when it was added (Unix seconds)."""

    reason: str
    since: float


@dataclass(frozen=True)
class RestoredFaults:
    """The published faults of one physical GPU: GPU-wide (``gpu``) and per instance device
    (``devices``: device name -> its own fault)."""

    gpu: PublishedFault | None = None
    devices: dict[str, PublishedFault] = field(default_factory=dict)


def split_published(
    whole_name: str, devices: Sequence[NodeDevice], published: Mapping[str, PublishedFault]
) -> RestoredFaults:
    """Split the published faults of one GPU's ``devices`` (its ``gpu-<index>`` device is
    ``whole_name``) into its GPU-wide fault and its instance-level ones (module doc).

    A GPU whose devices are no MIG instances (whole GPU, partitions) has GPU-wide faults only:
    the first published one of ``whole_name`` and its devices, in order."""
    groups = {d.name: instance_group(d) for d in devices}
    if not any(group is not None for group in groups.values()):
        candidates = [whole_name, *groups]
        return RestoredFaults(next((published[n] for n in candidates if n in published), None))
    carriers: dict[PublishedFault, list[str]] = {}
    for name in groups:
        if name in published:
            carriers.setdefault(published[name], []).append(name)
    gpu_fault: PublishedFault | None = None
    per_device: dict[str, PublishedFault] = {}
    for fault, holders in carriers.items():
        gpu_wide = len(holders) == len(groups) or len({groups[n] for n in holders}) > 1
        if gpu_wide and gpu_fault is None:
            gpu_fault = fault
        else:
            per_device.update((n, fault) for n in holders)
    return RestoredFaults(gpu_fault, per_device)


def _since(taint: dict[str, Any], default: float) -> float:
    value = taint.get("timeAdded")
    if not isinstance(value, str):
        return default
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return default


def unhealthy_from_slices(
    slices: list[dict[str, Any]], driver_name: str, now: float
) -> dict[str, PublishedFault]:
    """Device name -> its published unhealthy taint, for every device of ``slices`` having one."""
    key = names.unhealthy_taint_key(driver_name)
    result: dict[str, PublishedFault] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") != driver_name:
            continue
        for device in spec.get("devices") or []:
            for taint in device.get("taints") or []:
                if isinstance(taint, dict) and taint.get("key") == key:
                    reason = str(taint.get("value") or "unhealthy before the plugin restarted")
                    result[str(device.get("name"))] = PublishedFault(reason, _since(taint, now))
    return result


def published_unhealthy(
    rest: KubeRest, driver_name: str, node_name: str, now: float
) -> dict[str, PublishedFault]:
    """The unhealthy taints of this node's slices; empty (with a warning) when unreadable."""
    query = [("fieldSelector", f"spec.nodeName={node_name},spec.driver={driver_name}")]
    try:
        listing = rest.request("GET", SLICES_PATH, query=query)
    except KubeApiError as exc:
        log.warning("cannot read the published taints, GPUs start healthy: %s", exc)
        return {}
    items = [i for i in listing.get("items") or [] if isinstance(i, dict)]
    return unhealthy_from_slices(items, driver_name, now)
