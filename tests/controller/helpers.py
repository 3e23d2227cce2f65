"""Builders of ResourceSlices, ResourceClaims and Pods in the JSON shape the API server serves."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence
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
from controller.reconcile import reconcile
from sharegpu.kube.rest import KubeApiError, KubeRest, resource_path

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
    pods: Sequence[tuple[str, str]] = (),
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


# --- a cluster in the in-process API server --------------------------------------------------

SLICES = resource_path("resource.k8s.io", "v1", "resourceslices")
GPUS = resource_path("resource.sharegpu.dev", "v1alpha1", "gpus")
RULES = resource_path("resource.k8s.io", "v1", "devicetaintrules")


def claims_path(namespace: str = "default", name: str | None = None) -> str:
    return resource_path("resource.k8s.io", "v1", "resourceclaims", namespace, name)


def pods_path(namespace: str = "default", name: str | None = None) -> str:
    return resource_path("", "v1", "pods", namespace, name)


class Cluster:
    """Writes slices, claims and pods the way the plugin and kube-scheduler would."""

    def __init__(self, kube: KubeRest) -> None:
        self.kube = kube

    def add_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.request("POST", SLICES, body=obj)

    def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        current = self.kube.get(f"{SLICES}/{name}")
        body = {**obj, "metadata": {**current["metadata"]}}
        return self.kube.request("PUT", f"{SLICES}/{name}", body=body)

    def delete_slice(self, name: str) -> None:
        self.kube.request("DELETE", f"{SLICES}/{name}")

    def add_pod(self, obj: dict[str, Any]) -> str:
        """Create a pod; returns its server-assigned uid."""
        ns = obj["metadata"]["namespace"]
        body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
        return str(self.kube.request("POST", pods_path(ns), body=body)["metadata"]["uid"])

    def add_claim(
        self,
        name: str,
        results: list[dict[str, Any]] | None = None,
        *,
        namespace: str = "default",
        pods: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """Create a claim; allocate it (and reserve it for ``pods``) when ``results`` given."""
        obj = claim(name, namespace=namespace)
        obj["metadata"].pop("uid")
        created = self.kube.request("POST", claims_path(namespace), body=obj)
        if results:
            return self.set_status(name, results, namespace=namespace, pods=pods)
        return created

    def set_status(
        self,
        name: str,
        results: list[dict[str, Any]] | None,
        *,
        namespace: str = "default",
        pods: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """Replace the claim's allocation and reservations (None: deallocate)."""
        current = self.kube.get(claims_path(namespace, name))
        status: dict[str, Any] = {}
        if results:
            status["allocation"] = {"devices": {"results": results}}
        if pods:
            status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
        current["status"] = status
        return self.kube.request("PUT", claims_path(namespace, name) + "/status", body=current)

    def add_rule(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.request("POST", RULES, body=obj)

    def delete_rule(self, name: str) -> None:
        self.kube.request("DELETE", f"{RULES}/{name}")

    def delete_claim(self, name: str, namespace: str = "default") -> None:
        self.kube.request("DELETE", claims_path(namespace, name))

    def expected(self, driver: str = DRIVER) -> dict[str, dict[str, Any]]:
        """What the GPU objects must be, by the pure reconcile over the server's contents."""
        slices, _ = self.kube.list_all(SLICES)
        claims, _ = self.kube.list_all(resource_path("resource.k8s.io", "v1", "resourceclaims"))
        pods, _ = self.kube.list_all(resource_path("", "v1", "pods"))
        rules, _ = self.kube.list_all(RULES)
        return {
            name: {"spec": g.spec.to_json_dict(), "status": g.status.to_json_dict()}
            for name, g in reconcile(slices, claims, pods, driver, rules).items()
        }

    def stored(self) -> dict[str, dict[str, Any]]:
        """The GPU objects in the server (spec and status only)."""
        items, _ = self.kube.list_all(GPUS)
        return {
            o["metadata"]["name"]: {"spec": o.get("spec"), "status": o.get("status")} for o in items
        }

    def converged(self) -> bool:
        try:
            return self.stored() == self.expected()
        except KubeApiError:
            return False


def taint_rule(
    name: str, selector: dict[str, Any], *, value: str = "", effect: str = "NoSchedule"
) -> dict[str, Any]:
    """A DeviceTaintRule tainting what ``selector`` selects with ``example.com/maintenance``."""
    taint: dict[str, Any] = {"key": "example.com/maintenance", "effect": effect}
    if value:
        taint["value"] = value
    return {
        "apiVersion": RESOURCE_GROUP_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": selector, "taint": taint},
    }
