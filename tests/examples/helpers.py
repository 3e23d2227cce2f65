"""What the example tests share: the examples' manifests and claims, and the slices the plugin
publishes for its default mock GPUs on one node (what kube-scheduler allocates from)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from api.names import DEFAULT_DRIVER_NAME
from kubeletplugin.devices.mock import default_gpu
from kubeletplugin.devices.slices import desired_slices, resource_slice_objects
from kubeletplugin.devices.table import node_devices
from sharegpu.allocator import AllocationOutcome
from tests.deploy.helpers import EXAMPLES_DIR, load_documents

EXAMPLE_FILES = sorted(EXAMPLES_DIR.glob("*/*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return load_documents(path.read_text())


def all_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in EXAMPLE_FILES:
        for doc in documents(path):
            yield path, doc


def claim_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ResourceClaimSpecs in a manifest (claims and claim templates)."""
    if doc["kind"] == "ResourceClaim":
        return [doc["spec"]]
    if doc["kind"] == "ResourceClaimTemplate":
        return [doc["spec"]["spec"]]
    return []


NODE = "node-a"
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DEFAULT_DRIVER_NAME},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DEFAULT_DRIVER_NAME}"'}}]},
}


def node_slices(sharing_mode: str, gpus: int = 8) -> list[dict[str, Any]]:
    """The ResourceSlices the plugin publishes for ``gpus`` default mock GPUs on one node."""
    infos = [default_gpu(NODE, i, gpus) for i in range(gpus)]
    contents = desired_slices(node_devices(infos, sharing_mode))
    objects = resource_slice_objects(contents, DEFAULT_DRIVER_NAME, NODE, None, 1)
    for obj in objects:  # the API server completes generateName
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + "x"
    return objects


def example_claims(example: str) -> list[dict[str, Any]]:
    """The example's claims, templates instantiated as kube-scheduler sees them."""
    claims = []
    for path in sorted((EXAMPLES_DIR / example).glob("*.yaml")):
        for doc in documents(path):
            for spec in claim_specs(doc):
                name = doc["metadata"]["name"]
                claims.append({"metadata": {"name": name, "namespace": "default"}, "spec": spec})
    return claims


def example_classes(example: str) -> list[dict[str, Any]]:
    """The DeviceClasses an example defines, next to the chart's class."""
    found = [GPU_CLASS]
    for path in sorted((EXAMPLES_DIR / example).glob("*.yaml")):
        found += [doc for doc in documents(path) if doc["kind"] == "DeviceClass"]
    return found


def results(outcome: AllocationOutcome) -> list[dict[str, Any]]:
    assert outcome.allocation is not None, f"not allocatable: {outcome.error} {outcome.reports}"
    found: list[dict[str, Any]] = outcome.allocation["devices"]["results"]
    return found
