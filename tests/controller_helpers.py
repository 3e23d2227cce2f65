"""Builders of ResourceSlices, ResourceClaims and Pods in the JSON shape the API server serves."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from api.names import (
    ATTR_INDEX,
    ATTR_PARENT_UUID,
    ATTR_PARTITION,
    ATTR_PRODUCT_NAME,
    ATTR_UUID,
    CAP_CORES,
    CAP_MEMORY,
    DEFAULT_DRIVER_NAME,
    RESOURCE_GROUP_VERSION,
    device_name,
    partition_device_name,
    unhealthy_taint_key,
)

DRIVER = DEFAULT_DRIVER_NAME
GI = 1024**3
GPU_MEMORY = 80 * GI
MODEL = "NVIDIA H100 80GB HBM3"


def gpu_uuid(node: str, index: int) -> str:
    """A stable fake UUID for GPU ``index`` of ``node``."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{index}"))


def _attrs(node: str, index: int) -> dict[str, Any]:
    return {
        ATTR_UUID: {"string": gpu_uuid(node, index)},
        ATTR_PRODUCT_NAME: {"string": MODEL},
        ATTR_INDEX: {"int": index},
    }


def whole_device(
    node: str, index: int, *, shared: bool = True, unhealthy: str | None = None
) -> dict[str, Any]:
    """Device ``gpu-<index>`` as published in consumable (``shared``) or exclusive mode."""
    dev: dict[str, Any] = {
        "name": device_name(index),
        "attributes": _attrs(node, index),
        "capacity": {
            CAP_CORES: {"value": "100"},
            CAP_MEMORY: {"value": str(GPU_MEMORY)},
        },
    }
    if shared:
        dev["allowMultipleAllocations"] = True
        dev["capacity"][CAP_CORES]["requestPolicy"] = {
            "default": "100",
            "validRange": {"min": "1", "max": "100", "step": "1"},
        }
        dev["capacity"][CAP_MEMORY]["requestPolicy"] = {
            "default": str(GPU_MEMORY),
            "validRange": {"min": "256Mi", "max": str(GPU_MEMORY), "step": "256Mi"},
        }
    if unhealthy:
        dev["taints"] = [
            {"key": unhealthy_taint_key(DRIVER), "value": unhealthy, "effect": "NoSchedule"}
        ]
    return dev


def half_devices(node: str, index: int) -> list[dict[str, Any]]:
    """The two ``half`` partition devices of GPU ``index`` (partitions mode)."""
    out = []
    for j in range(2):
        attrs = _attrs(node, index)
        attrs[ATTR_PARTITION] = {"string": "half"}
        attrs[ATTR_PARENT_UUID] = {"string": gpu_uuid(node, index)}
        del attrs[ATTR_UUID]
        out.append(
            {
                "name": partition_device_name(index, "half", j),
                "attributes": attrs,
                "capacity": {
                    CAP_CORES: {"value": "50"},
                    CAP_MEMORY: {"value": str(GPU_MEMORY // 2)},
                },
            }
        )
    return out


def node_slice(
    node: str,
    gpus: int = 8,
    *,
    generation: int = 1,
    devices: list[dict[str, Any]] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """The single ResourceSlice of ``node`` with ``gpus`` consumable GPUs."""
    return {
        "apiVersion": RESOURCE_GROUP_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-slice"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices
            if devices is not None
            else [whole_device(node, i) for i in range(gpus)],
        },
    }


def result(
    node: str,
    device: str,
    *,
    request: str = "gpu",
    cores: int | None = None,
    memory: str | None = None,
    share_id: str | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """One allocation result as kube-scheduler writes it."""
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": node, "device": device}
    if cores is not None or memory is not None:
        r["shareID"] = share_id or str(uuidlib.uuid4())
        r["consumedCapacity"] = {CAP_CORES: str(cores or 0), CAP_MEMORY: memory or "0"}
    return r


def claim(
    name: str,
    results: list[dict[str, Any]] | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    pods: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """A ResourceClaim, allocated when ``results`` is given, reserved for ``pods`` (name, uid)."""
    obj: dict[str, Any] = {
        "apiVersion": RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{namespace}/{name}")),
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    }
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": results}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
    if status:
        obj["status"] = status
    return obj


def pod(
    name: str,
    claim_name: str,
    containers: dict[str, str | None],
    *,
    namespace: str = "default",
    uid: str | None = None,
    entry: str = "gpu",
) -> dict[str, Any]:
    """A Pod whose claim entry ``entry`` names ``claim_name``; ``containers`` maps each container
    to the request it uses (None: the whole claim)."""
    cs = []
    for cname, req in containers.items():
        ref: dict[str, Any] = {"name": entry}
        if req:
            ref["request"] = req
        cs.append({"name": cname, "image": "busybox", "resources": {"claims": [ref]}})
    cs.append({"name": "sidecar", "image": "busybox"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pod/{namespace}/{name}")),
        },
        "spec": {
            "containers": cs,
            "resourceClaims": [{"name": entry, "resourceClaimName": claim_name}],
        },
    }
