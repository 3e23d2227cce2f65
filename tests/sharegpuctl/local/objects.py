"""Objects and requests shared by the embedded API server's tests."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import ApiClient

from api import names

Obj = dict[str, Any]


def gpu_spec(node: str = "node-1", index: int = 0) -> Obj:
    """A spec the GPU CRD's schema accepts."""
    return {
        "node": node,
        "index": index,
        "uuid": f"GPU-{index}",
        "model": "NVIDIA A100",
        "memory": "40Gi",
        "cores": 100,
        "sharingMode": "consumable",
        "pool": node,
    }


def gpu_status(claims: int = 0) -> Obj:
    """A status the GPU CRD's schema accepts."""
    amount = {"cores": 0, "memory": "0"}
    return {
        "health": "Healthy",
        "capacity": {"cores": 100, "memory": "40Gi"},
        "allocated": amount,
        "allocatable": {"cores": 100, "memory": "40Gi"},
        "claimCount": claims,
        "coresSummary": "0/100",
        "memorySummary": "0/40Gi",
    }


def builtin_samples(namespace: str) -> list[Obj]:
    """One object of every listable built-in kind the embedded server serves, valid for it and
    for the real server (namespaced ones in ``namespace``, created first; the real server also
    needs its ``default`` ServiceAccount for the pod). The node is unschedulable and the taint
    rule selects only the sample driver's devices, so neither affects other workloads."""
    resource = names.RESOURCE_GROUP_VERSION
    meta = {"name": "sample", "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "sample-node"},
            "spec": {"unschedulable": True},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "sample.1", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": "sample", "namespace": namespace},
            "reason": "Sampled",
            "message": "a sample",
            "type": "Normal",
        },
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta},
        {"apiVersion": resource, "kind": "DeviceClass", "metadata": {"name": "sample"}},
        {
            "apiVersion": resource,
            "kind": "ResourceClaim",
            "metadata": meta,
            "spec": {"devices": {}},
        },
        {
            "apiVersion": resource,
            "kind": "ResourceClaimTemplate",
            "metadata": meta,
            "spec": {"spec": {"devices": {}}},
        },
        {
            "apiVersion": resource,
            "kind": "ResourceSlice",
            "metadata": {"name": "sample"},
            "spec": {
                "driver": "sample.example.com",
                "nodeName": "sample-node",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            },
        },
        {
            "apiVersion": resource,
            "kind": "DeviceTaintRule",
            "metadata": {"name": "sample"},
            "spec": {
                "deviceSelector": {"driver": "sample.example.com"},
                "taint": {"key": "example.com/k", "effect": "NoSchedule"},
            },
        },
    ]


def request_json(api: ApiClient, method: str, path: str, body: Any = None) -> tuple[int, Obj]:
    """A raw JSON request, bypassing the client's model validation of request bodies."""
    resp = api.call_api(
        method,
        api.configuration.host + path,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
    )
    resp.read()
    data: Obj = json.loads(resp.data)
    return resp.status, data
