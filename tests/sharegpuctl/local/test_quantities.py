"""Quantity fields of resource.k8s.io objects are decoded as the real API server decodes them:
a malformed one fails the request with 400 BadRequest before any validation."""

from __future__ import annotations

from typing import Any

import pytest

from api.quantity import FORMAT_WRONG
from sharegpuctl.local.apiserver import ApiError, KubeAPIServer
from tests.sharegpuctl.local.objects import request_json

Obj = dict[str, Any]


def claim(**requests: Any) -> Obj:
    exactly = {"deviceClassName": "gpu.sharegpu.dev", "capacity": {"requests": requests}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def slice_with(capacity: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.sharegpu.dev",
            "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
            "nodeName": "n",
            "devices": [{"name": "gpu-0", "capacity": capacity}],
        },
    }


@pytest.mark.parametrize(
    "requests", [{"memory": "10GB"}, {"cores": "30%"}, {"memory": True}, {"memory": ""}]
)
def test_a_malformed_claim_quantity_is_a_bad_request(
    apiserver: KubeAPIServer, requests: Obj
) -> None:
    with pytest.raises(ApiError) as err:
        apiserver.store.create("resourceclaims", claim(**requests))
    assert err.value.code == 400 and err.value.reason == "BadRequest"
    assert err.value.message == (
        'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: ' + FORMAT_WRONG
    )


@pytest.mark.parametrize("value", ["10Gi", 10, "1.5", " 2Gi ", "1e30"])
def test_quantities_the_real_server_decodes_are_accepted(
    apiserver: KubeAPIServer, value: Any
) -> None:
    apiserver.store.create("resourceclaims", claim(memory=value))


def test_first_available_and_template_quantities_are_decoded(apiserver: KubeAPIServer) -> None:
    sub = {"name": "a", "deviceClassName": "gpu.sharegpu.dev"}
    sub["capacity"] = {"requests": {"memory": "lots"}}
    obj = claim()
    obj["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [sub]}]
    with pytest.raises(ApiError) as err:
        apiserver.store.create("resourceclaims", obj)
    assert err.value.code == 400
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": claim(memory="10GB")["spec"]},
    }
    with pytest.raises(ApiError) as err:
        apiserver.store.create("resourceclaimtemplates", template)
    assert "cannot be handled as a ResourceClaimTemplate" in err.value.message


@pytest.mark.parametrize(
    "capacity",
    [
        {"memory": {"value": "80GB"}},
        {"memory": {"value": "80Gi", "requestPolicy": {"default": "1 Gi"}}},
        {"memory": {"value": "80Gi", "requestPolicy": {"validRange": {"min": "x"}}}},
    ],
)
def test_slice_capacity_quantities_are_decoded(apiserver: KubeAPIServer, capacity: Obj) -> None:
    with apiserver.client() as api:
        code, status = request_json(
            api, "POST", "/apis/resource.k8s.io/v1/resourceslices", slice_with(capacity)
        )
    assert code == 400 and status["reason"] == "BadRequest"
    assert status["message"].endswith(FORMAT_WRONG)


def test_a_patch_to_a_malformed_quantity_is_refused(apiserver: KubeAPIServer) -> None:
    apiserver.store.create("resourceslices", slice_with({"memory": {"value": "80Gi"}}))
    patch = [{"op": "replace", "path": "/spec/devices/0/capacity/memory/value", "value": "8 0"}]
    with pytest.raises(ApiError) as err:
        apiserver.store.patch(
            "resourceslices", "s", None, patch, content_type="application/json-patch+json"
        )
    assert err.value.code == 400
    stored = apiserver.store.get("resourceslices", "s")
    assert stored is not None
    assert stored["spec"]["devices"][0]["capacity"]["memory"]["value"] == "80Gi"
