"""Objects and requests shared by the embedded API server's tests."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import ApiClient

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
