"""The ResourceSlices a node publishes, computed from its device table
(:mod:`kubeletplugin.devices.table`); pure functions, no I/O. :func:`desired_slices` gives each
slice's content (``devices`` or ``sharedCounters``, never both), split to obey
:mod:`sharegpu.kube.slicerules`; :func:`resource_slice_objects` wraps it into
``resource.k8s.io/v1`` objects of the node's one pool.

Invariants: deterministic (same GPUs, same slices in the same order); device names unique in the
pool, a GPU's devices in one slice, every ``consumesCounters`` naming a set of the pool; memory
is the usable memory in bytes; a MIG device is exclusive in every mode (capacity ``memory``
only); a dynamic MIG GPU's counter set (:func:`mig_counter_set`) admits exactly the placement
sets :func:`kubeletplugin.devices.migtables.placement_problem` accepts; a ``hidden`` device is in
no slice; no GPU holds more shares than its ``NodeDevices.share_limit`` (through the cores
policy's minimum and the partition profiles published). Which Kubernetes versions and gates
each mode needs: docs/compatibility.md."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from api import names
from api.jsontypes import Obj
from api.quantity import format_quantity
from api.sharepolicy import consumable_capacity
from kubeletplugin.devices import migtables, sharelimit
from kubeletplugin.devices.table import NodeDevice, NodeDevices, node_devices
from kubeletplugin.devices.versions import VersionError, to_semver
from kubeletplugin.model import GpuInfo, MigProfile
from sharegpu.kube import slicerules

log = logging.getLogger(__name__)


#: Characters that ``generateName`` adds to a name prefix.
GENERATED_SUFFIX_LENGTH: Final = 5
#: Bytes per MiB (MIG profile memory sizes are in MiB).
MIB: Final = 1024 * 1024


def _string(value: str) -> Obj:
    return {"string": slicerules.truncate_utf8(value, slicerules.MAX_STRING_ATTRIBUTE_LENGTH)}


def _version(gpu: GpuInfo, what: str, raw: str) -> Obj | None:
    try:
        return {"version": to_semver(raw)}
    except VersionError as exc:
        log.warning("GPU %d: %s attribute left out: %s", gpu.index, what, exc)
        return None


def gpu_attributes(gpu: GpuInfo) -> Obj:
    """The attributes of the device standing for ``gpu``.

    Names without a domain are implicitly in the driver's domain (Kubernetes qualifies them with
    ``spec.driver``); the PCI attributes use the standard ``resource.kubernetes.io`` names.
    """
    attrs: Obj = {
        names.ATTR_UUID: _string(gpu.uuid),
        names.ATTR_PRODUCT_NAME: _string(gpu.product_name),
        names.ATTR_BRAND: _string(gpu.brand),
        names.ATTR_ARCHITECTURE: _string(gpu.architecture),
        names.ATTR_INDEX: {"int": gpu.index},
        names.ATTR_MINOR: {"int": gpu.minor},
    }
    for attr, raw in (
        (names.ATTR_CUDA_COMPUTE_CAPABILITY, gpu.cuda_compute_capability),
        (names.ATTR_DRIVER_VERSION, gpu.driver_version),
        (names.ATTR_CUDA_DRIVER_VERSION, gpu.cuda_driver_version),
    ):
        value = _version(gpu, attr, raw)
        if value is not None:
            attrs[attr] = value
    attrs[names.ATTR_PCI_BUS_ID] = _string(gpu.pci_bus_id)
    if gpu.pcie_root is not None:
        attrs[names.ATTR_PCIE_ROOT] = _string(gpu.pcie_root)
    if gpu.numa_node is not None:
        attrs[names.ATTR_NUMA_NODE] = {"int": gpu.numa_node}
        attrs[names.ATTR_STANDARD_NUMA_NODE] = {"int": gpu.numa_node}
    if gpu.nvlink_domain is not None:
        attrs[names.ATTR_NVLINK_DOMAIN] = _string(gpu.nvlink_domain)
    return attrs


def _capacity(cores: int, memory: int) -> Obj:
    return {
        names.CAP_CORES: {"value": format_quantity(cores)},
        names.CAP_MEMORY: {"value": format_quantity(memory)},
    }


def consumable_device(
    gpu: GpuInfo, default_cores: int = names.CORES_PER_GPU, share_limit: int | None = None
) -> Obj:
    """The whole GPU as a device that several claims can share (KEP-5075 consumable capacity).

    A request without capacity asks gets the defaults: ``default_cores`` cores (100 unless the
    node says otherwise, ``--default-share-cores``) and all the memory; so a request for memory
    alone is charged ``default_cores`` cores. No request is charged fewer cores than
    :func:`~kubeletplugin.devices.sharelimit.min_share_cores` of the GPU's share limit (None:
    :func:`~kubeletplugin.devices.sharelimit.mps_client_limit`), so kube-scheduler never places
    more shares on it; a default below that is raised to it.
    """
    limit = sharelimit.mps_client_limit(gpu) if share_limit is None else share_limit
    min_cores = sharelimit.min_share_cores(limit)
    capacity = consumable_capacity(gpu.memory_usable, max(default_cores, min_cores), min_cores)
    return {
        "name": names.device_name(gpu.index),
        "attributes": gpu_attributes(gpu),
        "capacity": capacity,
        "allowMultipleAllocations": True,
    }


def exclusive_device(gpu: GpuInfo) -> Obj:
    """The whole GPU as a device for one claim at a time."""
    return {
        "name": names.device_name(gpu.index),
        "attributes": gpu_attributes(gpu),
        "capacity": _capacity(names.CORES_PER_GPU, gpu.memory_usable),
    }


def counter_set(gpu: GpuInfo) -> Obj:
    """The shared counter set ``gpu-<index>-counters`` that the partitions of ``gpu`` consume."""
    return {
        "name": names.counter_set_name(gpu.index),
        "counters": {
            names.CAP_CORES: {"value": format_quantity(names.CORES_PER_GPU)},
            names.CAP_MEMORY: {"value": format_quantity(gpu.memory_usable)},
        },
    }


def partition_share(gpu: GpuInfo, profile: str) -> tuple[int, int]:
    """(cores, memory bytes) of one ``1/n`` partition of ``profile`` on ``gpu``: ``floor(100/n)``
    cores and ``floor(usable/n)`` bytes, so any set of partitions that fits the counters fits the
    GPU. The one rule for both what a partition device publishes and consumes from the counters
    and what a prepared partition is entitled to (``shares.device_share``)."""
    parts = names.PARTITION_PROFILES[profile]
    return names.CORES_PER_GPU // parts, gpu.memory_usable // parts


def partition_device(device: NodeDevice) -> Obj:
    """One partition device of ``device.gpu`` (KEP-4815): its profile's attributes, and the
    capacity and counter consumption of :func:`partition_share`."""
    if device.profile is None:
        raise ValueError(f"device {device.name} has no partition profile")
    gpu = device.gpu
    cores, memory = partition_share(gpu, device.profile)
    attrs = gpu_attributes(gpu)
    attrs[names.ATTR_PARTITION] = _string(device.profile)
    attrs[names.ATTR_PARENT_UUID] = _string(gpu.uuid)
    return {
        "name": device.name,
        "attributes": attrs,
        "capacity": _capacity(cores, memory),
        "consumesCounters": [
            {
                "counterSet": names.counter_set_name(gpu.index),
                "counters": {
                    names.CAP_CORES: {"value": format_quantity(cores)},
                    names.CAP_MEMORY: {"value": format_quantity(memory)},
                },
            }
        ],
    }


def mig_device(device: NodeDevice) -> Obj:
    """One MIG device, for one claim at a time: the attributes of the GPU its container sees
    (``uuid`` the MIG UUID; product, index, PCI and versions the parent's), the parent's UUID
    and index, the profile, the instance ids and the multiprocessor count; capacity ``memory``
    (the MIG device's usable memory). ValueError for a device that is not a MIG device."""
    mig = device.mig
    if mig is None:
        raise ValueError(f"device {device.name} is not a MIG device")
    gpu = device.gpu
    attrs = gpu_attributes(gpu)
    attrs[names.ATTR_PARENT_UUID] = _string(mig.parent_uuid)
    attrs[names.ATTR_PARENT_INDEX] = {"int": gpu.index}
    attrs[names.ATTR_PROFILE] = _string(mig.profile)
    attrs[names.ATTR_MIG_GPU_INSTANCE] = {"int": mig.gpu_instance}
    attrs[names.ATTR_MIG_COMPUTE_INSTANCE] = {"int": mig.compute_instance}
    attrs[names.ATTR_MULTIPROCESSORS] = {"int": mig.multiprocessors}
    return {
        "name": device.name,
        "attributes": attrs,
        "capacity": {names.CAP_MEMORY: {"value": format_quantity(gpu.memory_usable)}},
    }


# --- dynamic MIG -------------------------------------------------------------------------------


def mig_instance_counters(profiles: Sequence[MigProfile]) -> dict[int, int]:
    """Profile id -> instance limit, for the profiles whose ``instance_count`` is below their
    number of placements (only these need a counter: the memory-slice counters already keep
    the others within their limit). On an H100 and an A100 only ``1g.*+me`` (1 instance, 7
    placements)."""
    return {
        p.profile_id: p.instance_count for p in profiles if p.instance_count < len(p.placements)
    }


def mig_counter_set(gpu: GpuInfo) -> Obj:
    """The shared counter set ``gpu-<index>-counters`` of a dynamic-MIG GPU: ``memory-slice-<k>``
    (value 1) per memory slice, ``compute-slices`` (the GPU's compute slices) and
    ``profile-<id>-instances`` per profile of :func:`mig_instance_counters`. 8 + 1 + 1 counters
    on an H100 or A100 (at most :data:`~sharegpu.kube.slicerules.MAX_COUNTERS_PER_SET`)."""
    profiles = gpu.mig_profiles
    counters: Obj = {
        names.memory_slice_counter(k): {"value": format_quantity(1)}
        for k in range(migtables.memory_slices(profiles))
    }
    counters[names.COUNTER_COMPUTE_SLICES] = {
        "value": format_quantity(migtables.compute_slices(profiles))
    }
    for profile_id, limit in mig_instance_counters(profiles).items():
        counters[names.profile_instances_counter(profile_id)] = {"value": format_quantity(limit)}
    return {"name": names.counter_set_name(gpu.index), "counters": counters}


def mig_placement_device(device: NodeDevice) -> Obj:
    """One placement of one MIG profile of a dynamic-MIG GPU (KEP-4815), for one claim at a time.

    Attributes: the parent GPU's (:func:`gpu_attributes`) without ``uuid`` (the MIG device and
    its UUID only exist once prepare created it) and ``nvlinkDomain``, the parent's UUID and
    index, the profile name and NVML id, the placement, and the profile's multiprocessors and
    engines; ``migDynamic`` true. Capacity ``memory``: the profile's memory. Consumes, from the
    GPU's :func:`mig_counter_set`, 1 of each memory slice of its placement, its slice count of
    ``compute-slices`` and 1 of its profile's instance counter when it has one.
    ValueError for a device that is not a placement device."""
    profile, placement = device.mig_profile, device.placement
    if profile is None or placement is None:
        raise ValueError(f"device {device.name} is not a dynamic MIG placement device")
    gpu = device.gpu
    attrs = gpu_attributes(gpu)
    del attrs[names.ATTR_UUID]
    attrs.pop(names.ATTR_NVLINK_DOMAIN, None)  # a MIG instance has no NVLink peer-to-peer
    attrs[names.ATTR_PARENT_UUID] = _string(gpu.uuid)
    attrs[names.ATTR_PARENT_INDEX] = {"int": gpu.index}
    attrs[names.ATTR_PROFILE] = _string(profile.name)
    for attr, value in (
        (names.ATTR_MIG_PROFILE_ID, profile.profile_id),
        (names.ATTR_PLACEMENT_START, placement.start),
        (names.ATTR_PLACEMENT_SIZE, placement.size),
        (names.ATTR_MULTIPROCESSORS, profile.multiprocessors),
        (names.ATTR_COPY_ENGINES, profile.copy_engines),
        (names.ATTR_DECODERS, profile.decoders),
        (names.ATTR_ENCODERS, profile.encoders),
        (names.ATTR_JPEG_ENGINES, profile.jpeg_engines),
        (names.ATTR_OFA_ENGINES, profile.ofa_engines),
    ):
        attrs[attr] = {"int": value}
    attrs[names.ATTR_MIG_DYNAMIC] = {"bool": True}
    consumed: Obj = {
        names.memory_slice_counter(k): {"value": format_quantity(1)} for k in placement.slots
    }
    consumed[names.COUNTER_COMPUTE_SLICES] = {"value": format_quantity(profile.slice_count)}
    if profile.profile_id in mig_instance_counters(gpu.mig_profiles):
        consumed[names.profile_instances_counter(profile.profile_id)] = {
            "value": format_quantity(1)
        }
    return {
        "name": device.name,
        "attributes": attrs,
        "capacity": {names.CAP_MEMORY: {"value": format_quantity(profile.memory_mb * MIB)}},
        "consumesCounters": [
            {"counterSet": names.counter_set_name(gpu.index), "counters": consumed}
        ],
    }


def partition_devices(gpu: GpuInfo) -> list[Obj]:
    """Every partition device of ``gpu`` (whole, halves, quarters, eighths) as published."""
    table = node_devices([gpu], names.SHARING_MODE_PARTITIONS)
    return [partition_device(d) for d in table]


def device_object(
    device: NodeDevice,
    sharing_mode: str,
    default_cores: int = names.CORES_PER_GPU,
    share_limit: int | None = None,
) -> Obj:
    """The slice entry of one device of the table in ``sharing_mode`` (``default_cores`` and
    ``share_limit``: see :func:`consumable_device`); a MIG device is :func:`mig_device` in every
    mode, a dynamic MIG placement :func:`mig_placement_device`."""
    if device.mig is not None:
        return mig_device(device)
    if device.dynamic_mig:
        return mig_placement_device(device)
    if sharing_mode == names.SHARING_MODE_CONSUMABLE:
        return consumable_device(device.gpu, default_cores, share_limit)
    if sharing_mode == names.SHARING_MODE_EXCLUSIVE:
        return exclusive_device(device.gpu)
    if sharing_mode == names.SHARING_MODE_PARTITIONS:
        return partition_device(device)
    allowed = ", ".join(names.SHARING_MODES)
    raise ValueError(f"unknown sharing mode {sharing_mode!r} (allowed: {allowed})")


def _apply_taints(
    gpu: GpuInfo, devices: list[Obj], taints: Mapping[str, Sequence[Mapping[str, Any]]]
) -> None:
    """Put the taints of ``gpu-<i>`` on every device of that GPU (its partitions, MIG devices
    and MIG placements included), plus each device's own."""
    whole = list(taints.get(names.device_name(gpu.index), ()))
    for device in devices:
        own = (
            [] if device["name"] == names.device_name(gpu.index) else taints.get(device["name"], ())
        )
        combined = [dict(t) for t in [*whole, *own]]
        if combined:
            device["taints"] = combined[: slicerules.MAX_TAINTS_PER_DEVICE]


def _pack(groups: Iterable[list[Obj]]) -> list[list[Obj]]:
    """Pack device groups (one per GPU) into slices without splitting a group that fits."""
    slices: list[list[Obj]] = []
    current: list[Obj] = []
    for group in groups:
        for chunk in _split_group(group):
            candidate = current + chunk
            if current and len(candidate) > slicerules.device_limit(candidate):
                slices.append(current)
                current = list(chunk)
            else:
                current = candidate
    if current:
        slices.append(current)
    return slices


def _split_group(group: list[Obj]) -> list[list[Obj]]:
    """A group larger than the restricted limit is cut into chunks (never the case for GPUs)."""
    size = slicerules.MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    return [group[i : i + size] for i in range(0, len(group), size)] or [[]]


def desired_slices(
    devices: NodeDevices,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    hidden: frozenset[str] = frozenset(),
) -> list[Obj]:
    """The content of every slice of the node's pool, in publishing order, rendered from the
    node's device table.

    Each element is ``{"devices": [...]}`` or ``{"sharedCounters": [...]}``. Counter slices
    come first (at most ``MAX_SHARED_COUNTER_SETS_PER_SLICE`` sets each), then device slices.
    ``taints`` maps a device name to its taints; a taint on ``gpu-<i>`` also applies to every
    device of GPU ``i`` (partitions, MIG devices, MIG placements). The devices named in
    ``hidden`` (dynamic MIG placements blocked by MIG instances the driver did not create) are
    left out; the GPU's counter set stays as it is. With no GPUs the pool is one empty slice,
    which shows that the driver is alive.
    """
    taints = taints or {}
    groups: list[list[Obj]] = []
    dynamic: set[str] = set()
    for gpu in devices.gpus:
        own = devices.of_gpu(gpu)
        if any(d.dynamic_mig for d in own):
            dynamic.add(gpu.uuid)
        limit = devices.share_limit(gpu)
        group = [
            device_object(d, devices.sharing_mode, devices.default_share_cores, limit)
            for d in own
            if d.name not in hidden
        ]
        _apply_taints(gpu, group, taints)
        groups.append(group)
    result: list[Obj] = []
    if devices.sharing_mode == names.SHARING_MODE_PARTITIONS:
        sets = [
            mig_counter_set(gpu) if gpu.uuid in dynamic else counter_set(gpu)
            for gpu in devices.gpus
        ]
        per = slicerules.MAX_SHARED_COUNTER_SETS_PER_SLICE
        result += [{"sharedCounters": sets[i : i + per]} for i in range(0, len(sets), per)]
    result += [{"devices": group} for group in _pack(groups)]
    return result or [{"devices": []}]


def slice_generate_name(index: int, driver_name: str, node_name: str) -> str:
    """``generateName`` of slice ``index``: ``<4 hex digits>-<driver>-<node>-``.

    Truncated so that the generated name (5 random characters added) stays a DNS subdomain.
    """
    limit = slicerules.MAX_DNS_SUBDOMAIN_LENGTH - GENERATED_SUFFIX_LENGTH - 1
    prefix = f"{index:04x}-{driver_name}-{node_name}"[:limit]
    return prefix.rstrip(".-") + "-"


def slice_index(name: str) -> int | None:
    """Index encoded in a slice name by :func:`slice_generate_name`; None for other names."""
    head, sep, _ = name.partition("-")
    if not sep or len(head) != 4:
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


def node_owner_reference(node_name: str, node_uid: str) -> Obj:
    """Controller ownerReference to the Node, so its slices are garbage-collected with it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "controller": True,
    }


def slice_spec(content: Obj, driver_name: str, node_name: str, generation: int, count: int) -> Obj:
    """``spec`` of one slice of the pool: driver, pool, nodeName and the content."""
    spec: Obj = {
        "driver": driver_name,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
        "nodeName": node_name,
    }
    spec.update(content)
    return spec


def resource_slice_objects(
    contents: Sequence[Obj],
    driver_name: str,
    node_name: str,
    node_uid: str | None,
    generation: int,
) -> list[Obj]:
    """Full ResourceSlice objects for ``contents`` (as from :func:`desired_slices`).

    ``node_uid`` None leaves out the ownerReference (used by ``--print-slices``, where no API
    server is asked for the Node).
    """
    objects = []
    for index, content in enumerate(contents):
        metadata: Obj = {"generateName": slice_generate_name(index, driver_name, node_name)}
        if node_uid is not None:
            metadata["ownerReferences"] = [node_owner_reference(node_name, node_uid)]
        objects.append(
            {
                "apiVersion": names.RESOURCE_GROUP_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": slice_spec(content, driver_name, node_name, generation, len(contents)),
            }
        )
    return objects


def preview_slices(
    gpus: Sequence[GpuInfo],
    sharing_mode: str,
    default_share_cores: int,
    mig_strategy: str,
    driver_name: str,
    node_name: str,
    max_shares: int = 0,
) -> list[Obj]:
    """The ResourceSlices a plugin with these settings publishes for ``gpus``, before any API
    server is asked (generation 1, no owner): what ``--print-slices`` prints and what
    ``sharegpu devices`` and ``sharegpu explain`` work on. Raises ValueError as
    :func:`~kubeletplugin.devices.table.node_devices` does."""
    table = node_devices(gpus, sharing_mode, default_share_cores, mig_strategy, max_shares)
    return resource_slice_objects(desired_slices(table), driver_name, node_name, None, 1)
