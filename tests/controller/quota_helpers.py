"""Builders of GpuQuotas and ResourceClaims for the quota tests."""

from __future__ import annotations

from typing import Any

from api.names import DEFAULT_DRIVER_NAME, GPU_QUOTA_KIND, GROUP_VERSION, RESOURCE_GROUP_VERSION
from controller.quotaadmit import quota_path
from sharegpu.kube.rest import KubeRest, resource_path

DRIVER = DEFAULT_DRIVER_NAME
NAMESPACE = "team-a"
GI = 1024**3


def quota(name: str, hard: dict[str, Any], classes: list[str] | None = None) -> dict[str, Any]:
    """A GpuQuota manifest in :data:`NAMESPACE`."""
    spec: dict[str, Any] = {"hard": hard}
    if classes is not None:
        spec["deviceClassNames"] = classes
    return {
        "apiVersion": GROUP_VERSION,
        "kind": GPU_QUOTA_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def claim(
    name: str, cores: int | None = None, memory: str | None = None, device_class: str = DRIVER
) -> dict[str, Any]:
    """A ResourceClaim with one request of ``device_class`` for a share (or a whole GPU)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    asked: dict[str, Any] = {}
    if cores is not None:
        asked["cores"] = str(cores)
    if memory is not None:
        asked["memory"] = memory
    if asked:
        exactly["capacity"] = {"requests": asked}
    return {
        "apiVersion": RESOURCE_GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def review(obj: dict[str, Any], uid: str = "u-1", dry_run: bool = False) -> dict[str, Any]:
    """An AdmissionReview of a CREATE of ``obj``."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
            "operation": "CREATE",
            "namespace": obj["metadata"]["namespace"],
            "object": obj,
            "dryRun": dry_run,
        },
    }


def create_quota(kube: KubeRest, manifest: dict[str, Any]) -> None:
    """Store a GpuQuota."""
    kube.request("POST", quota_path(manifest["metadata"]["namespace"]), body=manifest)


def read_quota(kube: KubeRest, name: str) -> dict[str, Any]:
    """The stored GpuQuota ``name`` of :data:`NAMESPACE`."""
    return kube.get(quota_path(NAMESPACE, name))


def claims_path() -> str:
    """The ResourceClaims of :data:`NAMESPACE`."""
    return resource_path("resource.k8s.io", "v1", "resourceclaims", NAMESPACE)
