"""Builders for allocator tests: slices shaped like the ones the kubelet plugin publishes
(consumable, partitions and exclusive modes), device classes and claims."""

from __future__ import annotations

from typing import Any

from api import names
from api.quantity import format_quantity

DRIVER = names.DEFAULT_DRIVER_NAME
CLASS = "gpu.sharegpu.dev"
GI = 1024**3
MI = 1024**2
STEP = names.MEMORY_STEP_BYTES
H100_USABLE = 81_079 * MI  # usable memory of an H100 80GB HBM3 (total minus reserved)

Obj = dict[str, Any]


def attributes(
    index: int,
    product: str = "NVIDIA H100 80GB HBM3",
    pcie_root: str | None = None,
    numa: int | None = None,
) -> Obj:
    """Attributes of GPU ``index`` as the plugin publishes them."""
    attrs: Obj = {
        names.ATTR_UUID: {"string": f"GPU-{index:08x}-1111-2222-3333-444444444444"},
        names.ATTR_PRODUCT_NAME: {"string": product},
        names.ATTR_BRAND: {"string": "Nvidia"},
        names.ATTR_ARCHITECTURE: {"string": "Hopper"},
        names.ATTR_INDEX: {"int": index},
        names.ATTR_MINOR: {"int": index},
        names.ATTR_CUDA_COMPUTE_CAPABILITY: {"version": "9.0.0"},
        names.ATTR_DRIVER_VERSION: {"version": "580.159.4"},
        names.ATTR_CUDA_DRIVER_VERSION: {"version": "13.0.0"},
        names.ATTR_PCI_BUS_ID: {"string": f"0000:{index + 0x10:02x}:00.0"},
        names.ATTR_PCIE_ROOT: {"string": pcie_root or f"pci0000:{index // 2:02x}"},
    }
    if numa is not None:
        attrs[names.ATTR_NUMA_NODE] = {"int": numa}
    return attrs


def consumable_device(index: int, usable: int = H100_USABLE, **attr_kw: Any) -> Obj:
    """A shareable whole GPU: cores (100, default 100, range 1..100 step 1) and memory (usable
    bytes; default = max = largest 256Mi multiple, range from 256Mi in 256Mi steps)."""
    memory_max = usable - usable % STEP
    return {
        "name": names.device_name(index),
        "attributes": attributes(index, **attr_kw),
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": {"min": "1", "max": "100", "step": "1"},
                },
            },
            "memory": {
                "value": format_quantity(usable),
                "requestPolicy": {
                    "default": format_quantity(memory_max),
                    "validRange": {
                        "min": format_quantity(STEP),
                        "max": format_quantity(memory_max),
                        "step": format_quantity(STEP),
                    },
                },
            },
        },
        "allowMultipleAllocations": True,
    }


def exclusive_device(index: int, usable: int = H100_USABLE, **attr_kw: Any) -> Obj:
    """A whole GPU for one claim at a time."""
    return {
        "name": names.device_name(index),
        "attributes": attributes(index, **attr_kw),
        "capacity": {"cores": {"value": "100"}, "memory": {"value": format_quantity(usable)}},
    }


def partition_devices(index: int, usable: int = H100_USABLE) -> list[Obj]:
    """Whole, halves, quarters and eighths of GPU ``index`` consuming its counter set."""
    devices = []
    for profile, parts in names.PARTITION_PROFILES.items():
        cores, memory = 100 // parts, usable // parts
        for j in range(parts):
            attrs = attributes(index)
            attrs[names.ATTR_PARTITION] = {"string": profile}
            attrs[names.ATTR_PARENT_UUID] = attrs[names.ATTR_UUID]
            name = (
                names.device_name(index)
                if parts == 1
                else names.partition_device_name(index, profile, j)
            )
            devices.append(
                {
                    "name": name,
                    "attributes": attrs,
                    "capacity": {
                        "cores": {"value": str(cores)},
                        "memory": {"value": format_quantity(memory)},
                    },
                    "consumesCounters": [
                        {
                            "counterSet": names.counter_set_name(index),
                            "counters": {
                                "cores": {"value": str(cores)},
                                "memory": {"value": format_quantity(memory)},
                            },
                        }
                    ],
                }
            )
    return devices


def counter_set(index: int, usable: int = H100_USABLE) -> Obj:
    """Counter set ``gpu-<index>-counters``."""
    return {
        "name": names.counter_set_name(index),
        "counters": {"cores": {"value": "100"}, "memory": {"value": format_quantity(usable)}},
    }


def resource_slice(
    name: str,
    devices: list[Obj] | None = None,
    *,
    node: str | None = "n1",
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    shared_counters: list[Obj] | None = None,
    all_nodes: bool = False,
    driver: str = DRIVER,
) -> Obj:
    """One ResourceSlice object."""
    spec: Obj = {
        "driver": driver,
        "pool": {
            "name": pool or node or "cluster",
            "generation": generation,
            "resourceSliceCount": count,
        },
    }
    if all_nodes:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    if shared_counters is not None:
        spec["sharedCounters"] = shared_counters
    else:
        spec["devices"] = devices or []
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def consumable_slices(gpus: int = 8, node: str = "n1", **kw: Any) -> list[Obj]:
    """The node's pool in consumable mode (one slice)."""
    return [
        resource_slice(
            f"{node}-slice-0", [consumable_device(i, **kw) for i in range(gpus)], node=node
        )
    ]


def exclusive_slices(gpus: int = 8, node: str = "n1") -> list[Obj]:
    """The node's pool in exclusive mode (one slice)."""
    return [
        resource_slice(f"{node}-slice-0", [exclusive_device(i) for i in range(gpus)], node=node)
    ]


def partition_slices(gpus: int = 2, node: str = "n1") -> list[Obj]:
    """The node's pool in partitions mode: a counter slice, then one device slice per GPU."""
    count = 1 + gpus
    slices = [
        resource_slice(
            f"{node}-slice-0",
            node=node,
            count=count,
            shared_counters=[counter_set(i) for i in range(gpus)],
        )
    ]
    for i in range(gpus):
        slices.append(
            resource_slice(f"{node}-slice-{i + 1}", partition_devices(i), node=node, count=count)
        )
    return slices


def device_class(
    name: str = CLASS, selectors: list[str] | None = None, config: list[Obj] | None = None
) -> Obj:
    """A DeviceClass; by default it selects every device of the driver."""
    exprs = selectors if selectors is not None else [f"device.driver == '{DRIVER}'"]
    spec: Obj = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
    if config:
        spec["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def exactly(
    name: str = "gpu",
    *,
    count: int | None = None,
    all_mode: bool = False,
    selectors: list[str] | None = None,
    capacity: dict[str, str] | None = None,
    tolerations: list[Obj] | None = None,
    admin: bool = False,
    device_class_name: str = CLASS,
) -> Obj:
    """A request with ``exactly``."""
    body: Obj = {"deviceClassName": device_class_name}
    if all_mode:
        body["allocationMode"] = "All"
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        body["capacity"] = {"requests": dict(capacity)}
    if tolerations:
        body["tolerations"] = tolerations
    if admin:
        body["adminAccess"] = True
    return {"name": name, "exactly": body}


def first_available(name: str, subs: list[Obj]) -> Obj:
    """A request with ``firstAvailable`` subrequests (each ``{"name", "deviceClassName", ...}``)."""
    return {"name": name, "firstAvailable": subs}


def claim(
    name: str,
    requests: list[Obj],
    *,
    namespace: str = "default",
    constraints: list[Obj] | None = None,
    config: list[Obj] | None = None,
) -> Obj:
    """A ResourceClaim with the given requests."""
    devices: Obj = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def allocated(claim_obj: Obj, allocation: Obj) -> Obj:
    """``claim_obj`` with ``status.allocation`` set."""
    return {**claim_obj, "status": {"allocation": allocation}}


def share(name: str, cores: str | None = None, memory: str | None = None) -> Obj:
    """A one-GPU claim asking for a share."""
    capacity = {}
    if cores is not None:
        capacity["cores"] = cores
    if memory is not None:
        capacity["memory"] = memory
    return claim(name, [exactly(capacity=capacity or None)])


def device_taint_rule(
    name: str,
    selector: Obj | None,
    *,
    key: str = "example.com/maintenance",
    value: str = "",
    effect: str = "NoSchedule",
) -> Obj:
    """A ``resource.k8s.io/v1`` DeviceTaintRule (``selector`` None: no ``deviceSelector``)."""
    taint: Obj = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    spec: Obj = {"taint": taint}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }
