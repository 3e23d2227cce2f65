"""The in-process API server, exercised through the official kubernetes client."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import ApiClient, ApiException

from api import names
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION
from tests.helpers import eventually
from tests.sharegpuctl.local.objects import gpu_spec, gpu_status, request_json

Obj = dict[str, Any]
DRIVER = names.DEFAULT_DRIVER_NAME


def test_namespaced_objects_need_a_live_namespace(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= {
        ns.metadata.name for ns in core.list_namespace().items
    }
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("nowhere", pod_obj("p"))
    assert err.value.status == 404
    body = body_of(err.value)
    assert body["message"] == 'namespaces "nowhere" not found'
    assert body["reason"] == "NotFound"
    assert body["details"] == {"name": "nowhere", "kind": "namespaces"}
    # admission runs before validation: an invalid object there is refused the same way
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("nowhere", pod_obj("Bad_Name"))
    assert err.value.status == 404
    hold = {"metadata": {"name": "going", "finalizers": ["example.com/hold"]}}
    core.create_namespace(hold)
    core.delete_namespace("going")
    assert core.read_namespace("going").metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("going", pod_obj("p"))
    assert err.value.status == 403
    assert (
        "unable to create new content in namespace going because it is being terminated"
        in (body_of(err.value)["message"])
    )
    assert apiserver.store.list("pods") == []


def body_of(exc: ApiException) -> Obj:
    data: Obj = json.loads(exc.body)
    return data


def slice_obj(name: str, node: str = "node-1", devices: int = 2, **spec: Any) -> Obj:
    obj: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"uuid": {"string": f"GPU-{i}"}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "16Gi"}},
                }
                for i in range(devices)
            ],
        },
    }
    obj["spec"].update(spec)
    return obj


def claim_obj(name: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.sharegpu.dev"}}]
            }
        },
    }


def pod_obj(name: str, node: str = "", **labels: str) -> Obj:
    spec: Obj = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def raw(resp: Any) -> Obj:
    data: Obj = json.loads(resp.data)
    return data


# --- CRUD ----------------------------------------------------------------------------------


def test_node_crud_and_metadata(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "node-1", "labels": {"zone": "a"}}})
    assert node.metadata.uid and node.metadata.creation_timestamp
    assert node.metadata.generation == 1
    rv1 = int(node.metadata.resource_version)
    got = core.read_node("node-1")
    assert got.metadata.uid == node.metadata.uid
    got.metadata.labels["zone"] = "b"
    updated = core.replace_node("node-1", got)
    assert int(updated.metadata.resource_version) > rv1
    assert updated.metadata.labels == {"zone": "b"}
    assert [n.metadata.name for n in core.list_node().items] == ["node-1"]
    core.delete_node("node-1")
    with pytest.raises(ApiException) as err:
        core.read_node("node-1")
    assert err.value.status == 404


def test_namespaced_and_cluster_scoped_paths(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_pod("team-a", pod_obj("p"))
    core.create_namespaced_pod("default", pod_obj("p"))
    assert len(core.list_pod_for_all_namespaces().items) == 2
    assert [p.metadata.namespace for p in core.list_namespaced_pod("team-a").items] == ["team-a"]
    assert core.read_namespace("team-a").status.phase == "Active"
    # the namespace is taken from the URL; a different one in the body is rejected
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(
            "team-a", {**pod_obj("q"), "metadata": {"name": "q", "namespace": "x"}}
        )
    assert err.value.status == 400


def test_generate_name(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    names_seen = {
        core.create_namespaced_pod(
            "default", {"metadata": {"generateName": "worker-"}, "spec": {"containers": []}}
        ).metadata.name
        for _ in range(5)
    }
    assert len(names_seen) == 5
    assert all(n.startswith("worker-") and len(n) == len("worker-") + 5 for n in names_seen)


def test_resourceversion_is_global_and_monotonic(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    res = client.ResourceV1Api(kube_client)
    rvs = [int(core.create_node({"metadata": {"name": "n1"}}).metadata.resource_version)]
    rvs.append(
        int(
            raw(res.create_resource_slice(slice_obj("s1"), _preload_content=False))["metadata"][
                "resourceVersion"
            ]
        )
    )
    rvs.append(int(core.create_namespaced_pod("default", pod_obj("p")).metadata.resource_version))
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    assert apiserver.store.resource_version == rvs[-1]


def test_status_bodies(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("missing", "default")
    status = body_of(err.value)
    assert err.value.status == 404
    assert status["kind"] == "Status" and status["apiVersion"] == "v1"
    assert (
        status["status"] == "Failure" and status["reason"] == "NotFound" and status["code"] == 404
    )
    assert status["details"]["name"] == "missing" and status["details"]["kind"] == "pods"
    assert status["message"] == 'pods "missing" not found'

    core.create_node({"metadata": {"name": "n1"}})
    with pytest.raises(ApiException) as err:
        core.create_node({"metadata": {"name": "n1"}})
    assert err.value.status == 409 and body_of(err.value)["reason"] == "AlreadyExists"


def test_invalid_names_are_rejected(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    for create in (
        lambda: core.create_node({"metadata": {"name": "Node_1"}}),
        lambda: core.create_namespace({"metadata": {"name": "a.b"}}),
    ):
        with pytest.raises(ApiException) as err:
            create()
        assert err.value.status == 422
        assert body_of(err.value)["details"]["causes"][0]["field"].startswith("metadata.")
    # a namespace that cannot exist is not found (admission runs before validation)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("Bad_NS", pod_obj("p"))
    assert err.value.status == 404


def test_update_with_stale_resource_version_conflicts(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "n1"}})
    stale = node.metadata.resource_version
    node.metadata.labels = {"a": "1"}
    core.replace_node("n1", node)
    node.metadata.labels = {"a": "2"}
    node.metadata.resource_version = stale
    with pytest.raises(ApiException) as err:
        core.replace_node("n1", node)
    assert err.value.status == 409
    status = body_of(err.value)
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]


def test_update_of_a_recreated_object_conflicts_on_uid(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "n1"}})
    core.delete_node("n1")
    core.create_node({"metadata": {"name": "n1"}})
    node.metadata.resource_version = None
    with pytest.raises(ApiException) as err:
        core.replace_node("n1", node)
    assert err.value.status == 409 and "UID in precondition" in body_of(err.value)["message"]


def test_custom_resource_update_needs_resource_version(kube_client: ApiClient) -> None:
    custom = client.CustomObjectsApi(kube_client)
    args = (names.API_GROUP, names.API_VERSION, names.GPU_PLURAL)
    created = custom.create_cluster_custom_object(
        *args, {"metadata": {"name": "g"}, "spec": gpu_spec()}
    )
    changed = {**gpu_spec(), "uuid": "x"}
    unconditional = {**created, "metadata": {"name": "g"}, "spec": changed}
    with pytest.raises(ApiException) as err:
        custom.replace_cluster_custom_object(*args, "g", unconditional)
    assert err.value.status == 422
    assert (
        custom.replace_cluster_custom_object(*args, "g", {**created, "spec": changed})["spec"]
        == changed
    )


def test_noop_update_writes_nothing(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "n1"}})
    again = core.replace_node("n1", node)
    assert again.metadata.resource_version == node.metadata.resource_version
    assert apiserver.store.resource_version == int(node.metadata.resource_version)


# --- resource.k8s.io -----------------------------------------------------------------------


def test_resource_slice_roundtrip_and_field_selectors(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    res.create_resource_slice(slice_obj("a", node="node-1"), _preload_content=False)
    res.create_resource_slice(slice_obj("b", node="node-2"), _preload_content=False)
    other = slice_obj("c", node="node-1")
    other["spec"]["driver"] = "other.example.com"
    res.create_resource_slice(other, _preload_content=False)

    def listed(**kw: Any) -> list[str]:
        return [
            i["metadata"]["name"]
            for i in raw(res.list_resource_slice(_preload_content=False, **kw))["items"]
        ]

    assert listed() == ["a", "b", "c"]
    assert listed(field_selector="spec.nodeName=node-1") == ["a", "c"]
    assert listed(field_selector=f"spec.nodeName=node-1,spec.driver={DRIVER}") == ["a"]
    assert listed(field_selector="spec.driver!=other.example.com") == ["a", "b"]
    assert listed(field_selector="metadata.name=b") == ["b"]
    assert listed(limit=1) == ["a", "b", "c"]
    got = raw(res.read_resource_slice("a", _preload_content=False))
    assert got["spec"]["devices"][0]["attributes"]["uuid"] == {"string": "GPU-0"}
    with pytest.raises(ApiException) as err:
        listed(field_selector="spec.pool.name=x")
    assert err.value.status == 400 and "field label not supported" in body_of(err.value)["message"]


def test_slice_with_129_devices_is_invalid(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    with pytest.raises(ApiException) as err:
        res.create_resource_slice(slice_obj("big", devices=129), _preload_content=False)
    assert err.value.status == 422
    status = body_of(err.value)
    assert status["reason"] == "Invalid"
    assert status["details"]["kind"] == "ResourceSlice"
    assert {
        "reason": "FieldValueTooMany",
        "field": "spec.devices",
        "message": "Too many: 129: must have at most 128 items",
    } in status["details"]["causes"]
    assert "must have at most 128" in status["message"]


def test_slice_with_long_string_attribute_is_invalid(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    obj = slice_obj("s")
    obj["spec"]["devices"][1]["attributes"]["uuid"] = {"string": "x" * 65}
    with pytest.raises(ApiException) as err:
        res.create_resource_slice(obj, _preload_content=False)
    assert err.value.status == 422
    fields = [c["field"] for c in body_of(err.value)["details"]["causes"]]
    assert fields == ["spec.devices[1].attributes[uuid].string"]


def test_unknown_fields_of_built_in_kinds_are_dropped_or_refused_when_strict(
    kube_client: ApiClient,
) -> None:
    """As decoding into the real server's types: dropped, and refused with 400 naming the
    field under fieldValidation=Strict."""
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    obj = slice_obj("s")
    obj["spec"]["devices"][0]["sharing"] = "yes"
    code, status = request_json(kube_client, "POST", slices + "?fieldValidation=Strict", obj)
    assert code == 400 and status["reason"] == "BadRequest"
    assert status["message"].endswith(
        'strict decoding error: unknown field "spec.devices[0].sharing"'
    )
    code, stored = request_json(kube_client, "POST", slices, obj)
    assert code == 201 and "sharing" not in stored["spec"]["devices"][0]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "colour": 1}]}}
    code, status = request_json(
        kube_client, "POST", "/api/v1/namespaces/default/pods?fieldValidation=Strict", pod
    )
    assert code == 400
    assert 'unknown field "spec.containers[0].colour"' in status["message"]
    claim = claim_obj("c")
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    code, status = request_json(
        kube_client, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim
    )
    assert code == 422
    assert status["details"]["causes"][0]["field"] == "spec.devices.requests[0].exactly.count"


def test_fields_newer_than_the_client_models_are_served(kube_client: ApiClient) -> None:
    claim = claim_obj("c")
    code, _ = request_json(
        kube_client, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim
    )
    assert code == 201
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-1",
        "device": "gpu-0",
        "shareID": "4f1c1c4e-5b7a-4c39-9a43-000000000001",
        "consumedCapacity": {"memory": "4Gi"},
    }
    code, body = request_json(
        kube_client,
        "PUT",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c/status",
        {**claim, "status": {"allocation": {"devices": {"results": [result]}}}},
    )
    assert code == 200, body
    assert body["status"]["allocation"]["devices"]["results"][0]["shareID"] == result["shareID"]


def test_slice_update_keeps_immutable_fields(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    created = raw(res.create_resource_slice(slice_obj("s"), _preload_content=False))
    created["spec"]["nodeName"] = "node-2"
    created["spec"]["pool"]["name"] = "node-2"
    with pytest.raises(ApiException) as err:
        res.replace_resource_slice("s", created, _preload_content=False)
    assert err.value.status == 422
    assert "spec.nodeName: field is immutable" in body_of(err.value)["message"]


def test_device_taints_get_time_added(kube_client: ApiClient) -> None:
    obj = slice_obj("s")
    obj["spec"]["devices"][0]["taints"] = [{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]
    obj["spec"]["devices"][1]["taints"] = [
        {"key": f"{DRIVER}/unhealthy", "effect": "NoExecute", "timeAdded": "2026-01-02T03:04:05Z"}
    ]
    code, created = request_json(
        kube_client, "POST", "/apis/resource.k8s.io/v1/resourceslices", obj
    )
    assert code == 201, created
    devices = created["spec"]["devices"]
    assert devices[0]["taints"][0]["timeAdded"].endswith("Z")
    assert devices[1]["taints"][0]["timeAdded"] == "2026-01-02T03:04:05Z"


def test_generation_bumps_only_on_spec_change(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    created = raw(res.create_resource_slice(slice_obj("s"), _preload_content=False))
    created["metadata"]["labels"] = {"x": "y"}
    relabeled = raw(res.replace_resource_slice("s", created, _preload_content=False))
    assert relabeled["metadata"]["generation"] == 1
    relabeled["spec"]["pool"]["generation"] = 1
    changed = raw(res.replace_resource_slice("s", relabeled, _preload_content=False))
    assert changed["metadata"]["generation"] == 2


def test_claim_status_subresource(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    created = raw(
        res.create_namespaced_resource_claim(
            "default", {**claim_obj("c"), "status": {"reservedFor": []}}, _preload_content=False
        )
    )
    assert "status" not in created  # status is not settable on create
    allocation = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}
                ]
            }
        }
    }
    # the main resource ignores status changes
    ignored = raw(
        res.replace_namespaced_resource_claim(
            "c", "default", {**created, "status": allocation}, _preload_content=False
        )
    )
    assert "status" not in ignored
    # the status subresource changes only the status
    with_status = raw(
        res.replace_namespaced_resource_claim_status(
            "c",
            "default",
            {
                **created,
                "metadata": {**created["metadata"], "labels": {"x": "y"}},
                "status": allocation,
            },
            _preload_content=False,
        )
    )
    assert with_status["status"] == allocation
    assert "labels" not in with_status["metadata"]
    patched = raw(
        res.patch_namespaced_resource_claim_status(
            "c",
            "default",
            {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}},
            _preload_content=False,
        )
    )
    assert patched["status"]["reservedFor"][0]["uid"] == "u1"
    assert patched["status"]["allocation"] == allocation["allocation"]
    # the spec of a claim is immutable
    changed = {**patched, "spec": {"devices": {"requests": []}}}
    with pytest.raises(ApiException) as err:
        res.replace_namespaced_resource_claim("c", "default", changed, _preload_content=False)
    assert err.value.status == 422


def test_claim_requests_are_defaulted(kube_client: ApiClient) -> None:
    claim = claim_obj("c")
    claim["spec"]["devices"]["requests"].append(
        {
            "name": "any",
            "firstAvailable": [
                {"name": "all", "deviceClassName": "x", "allocationMode": "All"},
                {"name": "one", "deviceClassName": "x", "tolerations": [{"key": "k"}]},
            ],
        }
    )
    code, created = request_json(
        kube_client, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim
    )
    assert code == 201, created
    exact, first = created["spec"]["devices"]["requests"]
    assert exact["exactly"]["allocationMode"] == "ExactCount" and exact["exactly"]["count"] == 1
    assert first["firstAvailable"][0] == {
        "name": "all",
        "deviceClassName": "x",
        "allocationMode": "All",
    }
    assert first["firstAvailable"][1]["count"] == 1
    assert first["firstAvailable"][1]["tolerations"] == [{"key": "k", "operator": "Equal"}]
    # an update that leaves the defaults out is not a change of the immutable spec
    code, same = request_json(
        kube_client,
        "PUT",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c",
        {**claim, "metadata": created["metadata"]},
    )
    assert code == 200, same


def test_device_class_and_claim_template(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    res.create_device_class(
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        _preload_content=False,
    )
    res.create_namespaced_resource_claim_template(
        "default",
        {"metadata": {"name": "t"}, "spec": {"spec": claim_obj("x")["spec"]}},
        _preload_content=False,
    )
    assert raw(res.read_device_class(DRIVER, _preload_content=False))["kind"] == "DeviceClass"
    tmpl = raw(res.read_namespaced_resource_claim_template("t", "default", _preload_content=False))
    assert tmpl["spec"]["spec"]["devices"]["requests"][0]["name"] == "gpu"


# --- patch ---------------------------------------------------------------------------------


def test_merge_strategic_and_json_patch(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_node({"metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}})
    # a dict body is sent as strategic merge patch, applied as a merge patch
    node = core.patch_node("n1", {"metadata": {"labels": {"a": "10", "b": None, "c": "3"}}})
    assert node.metadata.labels == {"a": "10", "c": "3"}
    node = core.patch_node(
        "n1", {"metadata": {"labels": {"d": "4"}}}, _content_type="application/merge-patch+json"
    )
    assert node.metadata.labels == {"a": "10", "c": "3", "d": "4"}
    node = core.patch_node(
        "n1",
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "10"},
            {"op": "remove", "path": "/metadata/labels/c"},
            {"op": "replace", "path": "/metadata/labels/d", "value": "40"},
            {"op": "add", "path": "/spec", "value": {"unschedulable": True}},
        ],
    )
    assert node.metadata.labels == {"a": "10", "d": "40"}
    assert node.spec.unschedulable is True
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/a", "value": "nope"}])
    assert err.value.status == 422
    # a patch carrying a stale resourceVersion is a conflict
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", {"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}})
    assert err.value.status == 409


def test_patch_of_missing_object_is_404(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    with pytest.raises(ApiException) as err:
        core.patch_node("missing", {"metadata": {"labels": {"a": "1"}}})
    assert err.value.status == 404


# --- delete --------------------------------------------------------------------------------


def test_delete_preconditions(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "n1"}})
    with pytest.raises(ApiException) as err:
        core.delete_node("n1", body={"preconditions": {"uid": "not-the-uid"}})
    assert err.value.status == 409 and "Precondition failed: UID" in body_of(err.value)["message"]
    with pytest.raises(ApiException) as err:
        core.delete_node("n1", body={"preconditions": {"resourceVersion": "999"}})
    assert err.value.status == 409
    core.delete_node(
        "n1",
        body={
            "preconditions": {
                "uid": node.metadata.uid,
                "resourceVersion": node.metadata.resource_version,
            }
        },
    )
    assert core.list_node().items == []


def test_delete_with_finalizers_waits_for_them(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    claim = claim_obj("c")
    claim["metadata"]["finalizers"] = [f"{DRIVER}/prepared"]
    res.create_namespaced_resource_claim("default", claim, _preload_content=False)
    res.delete_namespaced_resource_claim("c", "default", _preload_content=False)
    pending = raw(res.read_namespaced_resource_claim("c", "default", _preload_content=False))
    assert pending["metadata"]["deletionTimestamp"]
    res.patch_namespaced_resource_claim(
        "c", "default", {"metadata": {"finalizers": None}}, _preload_content=False
    )
    with pytest.raises(ApiException) as err:
        res.read_namespaced_resource_claim("c", "default", _preload_content=False)
    assert err.value.status == 404


def test_deletecollection_with_field_selector(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    res = client.ResourceV1Api(kube_client)
    for name, node in [("a", "node-1"), ("b", "node-2"), ("c", "node-1")]:
        res.create_resource_slice(slice_obj(name, node=node), _preload_content=False)
    res.delete_collection_resource_slice(
        field_selector="spec.nodeName=node-1", _preload_content=False
    )
    assert [s["metadata"]["name"] for s in apiserver.store.list("resourceslices")] == ["b"]


def test_deleting_a_node_collects_owned_objects(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    res = client.ResourceV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "node-1"}})
    owned = slice_obj("owned")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "node-1",
            "uid": node.metadata.uid,
            "controller": True,
        }
    ]
    res.create_resource_slice(owned, _preload_content=False)
    res.create_resource_slice(slice_obj("unowned"), _preload_content=False)
    core.delete_node("node-1")
    assert [s["metadata"]["name"] for s in apiserver.store.list("resourceslices")] == ["unowned"]


def test_orphan_propagation_keeps_dependents(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    node = core.create_node({"metadata": {"name": "node-1"}})
    owned = slice_obj("owned")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": node.metadata.uid}
    ]
    apiserver.store.create("resourceslices", owned)
    core.delete_node("node-1", propagation_policy="Orphan")
    kept = apiserver.store.get("resourceslices", "owned")
    assert kept is not None and "ownerReferences" not in kept["metadata"]


def test_deleting_a_namespace_deletes_its_objects(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": "gone"}})
    core.create_namespaced_pod("gone", pod_obj("p"))
    core.create_namespaced_pod("default", pod_obj("p"))
    core.delete_namespace("gone")
    assert [p["metadata"]["namespace"] for p in apiserver.store.list("pods")] == ["default"]


# --- selectors -----------------------------------------------------------------------------


def test_label_selectors(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", pod_obj("a", app="x", tier="web"))
    core.create_namespaced_pod("default", pod_obj("b", app="y"))
    core.create_namespaced_pod("default", pod_obj("c"))

    def names_for(selector: str) -> list[str]:
        return [
            p.metadata.name
            for p in core.list_namespaced_pod("default", label_selector=selector).items
        ]

    assert names_for("app=x") == ["a"]
    assert names_for("app==y") == ["b"]
    assert names_for("app!=x") == ["b", "c"]
    assert names_for("app in (x, y)") == ["a", "b"]
    assert names_for("app notin (x)") == ["b", "c"]
    assert names_for("app") == ["a", "b"]
    assert names_for("!app") == ["c"]
    assert names_for("app=x,tier=web") == ["a"]
    assert names_for("app=x,tier=db") == []


def test_pod_field_selectors(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", pod_obj("a", node="node-1"))
    core.create_namespaced_pod("default", pod_obj("b", node="node-2"))
    core.create_namespaced_pod("default", pod_obj("c"))
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1").items
    assert [p.metadata.name for p in pods] == ["a"]
    unscheduled = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items
    assert [p.metadata.name for p in unscheduled] == ["c"]
    pending = core.list_namespaced_pod("default", field_selector="status.phase=Pending").items
    assert len(pending) == 3


# --- watch ---------------------------------------------------------------------------------


def test_watch_events_in_order_and_resume(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    start_rv = core.list_node().metadata.resource_version
    core.create_node({"metadata": {"name": "n1"}})
    core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    core.delete_node("n1")
    core.create_node({"metadata": {"name": "n2"}})
    w = watch.Watch()
    events = [
        (e["type"], e["object"].metadata.name)
        for e in w.stream(core.list_node, resource_version=start_rv, timeout_seconds=1)
    ]
    assert events == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1"), ("ADDED", "n2")]
    # resume from the middle
    rv_after_patch = str(int(start_rv) + 2)
    resumed = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_node, resource_version=rv_after_patch, timeout_seconds=1
        )
    ]
    assert resumed == [("DELETED", "n1"), ("ADDED", "n2")]


def test_watch_without_resource_version_starts_with_current_state(kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    res.create_resource_slice(slice_obj("a"), _preload_content=False)
    res.create_resource_slice(slice_obj("b", node="node-2"), _preload_content=False)
    events = list(
        watch.Watch().stream(
            res.list_resource_slice,
            field_selector="spec.nodeName=node-2",
            timeout_seconds=1,
            deserialize=False,
        )
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


def test_live_watch_sees_writes(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    rv = core.list_node().metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def consume() -> None:
        for e in w.stream(core.list_node, resource_version=rv, timeout_seconds=30):
            seen.append((e["type"], e["object"].metadata.name))
            if len(seen) == 3:
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    eventually(lambda: apiserver.open_watches() == 1)
    apiserver.store.put("nodes", {"metadata": {"name": "direct"}})
    core.create_node({"metadata": {"name": "api"}})
    apiserver.store.delete("nodes", "direct")
    t.join(30)
    assert not t.is_alive()
    assert seen == [("ADDED", "direct"), ("ADDED", "api"), ("DELETED", "direct")]


def test_watch_label_selector_transitions(kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    rv = core.list_node().metadata.resource_version
    core.create_node({"metadata": {"name": "n1"}})
    core.patch_node("n1", {"metadata": {"labels": {"gpu": "true"}}})
    core.patch_node("n1", {"metadata": {"labels": {"extra": "1"}}})
    core.patch_node("n1", {"metadata": {"labels": {"gpu": None}}})
    events = [
        e["type"]
        for e in watch.Watch().stream(
            core.list_node, resource_version=rv, label_selector="gpu=true", timeout_seconds=1
        )
    ]
    assert events == ["ADDED", "MODIFIED", "DELETED"]


def test_watch_from_compacted_resource_version_is_gone(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    old_rv = core.create_node({"metadata": {"name": "n1"}}).metadata.resource_version
    core.create_node({"metadata": {"name": "n2"}})
    apiserver.store.compact()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_node, resource_version=old_rv, timeout_seconds=1))
    assert err.value.status == 410
    assert "Expired" in str(err.value.reason)
    # the raw event is an ERROR carrying a Status
    resp = core.list_node(
        watch=True, resource_version=old_rv, timeout_seconds=1, _preload_content=False
    )
    lines = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert lines == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": lines[0]["object"]["message"],
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


def test_history_window_expires_old_versions() -> None:
    with KubeAPIServer(history_size=3) as srv, srv.client() as api:
        core = client.CoreV1Api(api)
        first = core.create_node({"metadata": {"name": "n0"}}).metadata.resource_version
        for i in range(1, 6):
            core.create_node({"metadata": {"name": f"n{i}"}})
        with pytest.raises(ApiException) as err:
            list(watch.Watch().stream(core.list_node, resource_version=first, timeout_seconds=1))
        assert err.value.status == 410
        recent = str(srv.store.resource_version - 2)
        events = list(
            watch.Watch().stream(core.list_node, resource_version=recent, timeout_seconds=1)
        )
        assert [e["object"].metadata.name for e in events] == ["n4", "n5"]


def test_drop_watches_ends_streams(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    ended = threading.Event()

    def consume() -> None:
        for _ in watch.Watch().stream(core.list_node, timeout_seconds=60):
            pass
        ended.set()

    t = threading.Thread(target=consume)
    t.start()
    eventually(lambda: apiserver.open_watches() == 1)
    assert apiserver.drop_watches() == 1
    t.join(30)
    assert ended.is_set()
    eventually(lambda: apiserver.open_watches() == 0)


# --- custom resources ----------------------------------------------------------------------


def test_gpu_custom_resource_with_status(kube_client: ApiClient) -> None:
    custom = client.CustomObjectsApi(kube_client)
    gpu = {
        "apiVersion": names.GROUP_VERSION,
        "kind": names.GPU_KIND,
        "metadata": {"name": "node-1-gpu-0"},
        "spec": gpu_spec(),
        "status": {"allocated": "ignored on create"},
    }
    created = custom.create_cluster_custom_object(
        names.API_GROUP, names.API_VERSION, names.GPU_PLURAL, gpu
    )
    assert "status" not in created
    custom.patch_cluster_custom_object_status(
        names.API_GROUP,
        names.API_VERSION,
        names.GPU_PLURAL,
        "node-1-gpu-0",
        {"status": gpu_status(claims=2)},
    )
    got = custom.get_cluster_custom_object(
        names.API_GROUP, names.API_VERSION, names.GPU_PLURAL, "node-1-gpu-0"
    )
    assert got["status"] == gpu_status(claims=2) and got["spec"]["uuid"] == "GPU-0"
    listed = custom.list_cluster_custom_object(names.API_GROUP, names.API_VERSION, names.GPU_PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["node-1-gpu-0"]
    custom.delete_cluster_custom_object(
        names.API_GROUP, names.API_VERSION, names.GPU_PLURAL, "node-1-gpu-0"
    )
    assert (
        custom.list_cluster_custom_object(names.API_GROUP, names.API_VERSION, names.GPU_PLURAL)[
            "items"
        ]
        == []
    )


def test_crds_and_leases_are_stored(kube_client: ApiClient) -> None:
    ext = client.ApiextensionsV1Api(kube_client)
    ext.create_custom_resource_definition(
        {
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "kind": "Widget"},
                "scope": "Cluster",
                "versions": [{"name": "v1", "served": True, "storage": True}],
            },
        }
    )
    assert ext.read_custom_resource_definition("widgets.example.com").spec.group == "example.com"
    assert ext.read_custom_resource_definition(names.GPU_CRD_NAME).spec.group == names.API_GROUP
    coord = client.CoordinationV1Api(kube_client)
    coord.create_namespaced_lease(
        "kube-system", {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}
    )
    assert coord.read_namespaced_lease("leader", "kube-system").spec.holder_identity == "a"


# --- faults and counters -------------------------------------------------------------------


def test_fault_injection_status_codes(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    res = client.ResourceV1Api(kube_client)
    fault = apiserver.inject_fault(verb="create", resource="resourceslices", code=500, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            res.create_resource_slice(slice_obj("s"), _preload_content=False)
        assert err.value.status == 500 and body_of(err.value)["reason"] == "InternalError"
    res.create_resource_slice(slice_obj("s"), _preload_content=False)
    assert fault.hits == 2
    apiserver.inject_fault(verb="update", resource="resourceslices", code=409)
    current = raw(res.read_resource_slice("s", _preload_content=False))
    with pytest.raises(ApiException) as err:
        res.replace_resource_slice("s", current, _preload_content=False)
    assert err.value.status == 409
    # POST is not retried by urllib3, so the 429 reaches the caller with its Retry-After
    apiserver.inject_fault(verb="create", code=429)
    with pytest.raises(ApiException) as err:
        res.create_resource_slice(slice_obj("t"), _preload_content=False)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
    assert body_of(err.value)["reason"] == "TooManyRequests"
    res.create_resource_slice(slice_obj("t"), _preload_content=False)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
    res.list_resource_slice(_preload_content=False)


def test_fault_injection_on_status_subresource_only(
    apiserver: KubeAPIServer, kube_client: ApiClient
) -> None:
    res = client.ResourceV1Api(kube_client)
    apiserver.inject_fault(verb="patch", resource="resourceclaims/status", code=503, times=None)
    res.create_namespaced_resource_claim("default", claim_obj("c"), _preload_content=False)
    res.patch_namespaced_resource_claim(
        "c", "default", {"metadata": {"labels": {"a": "b"}}}, _preload_content=False
    )
    with pytest.raises(ApiException) as err:
        res.patch_namespaced_resource_claim_status(
            "c", "default", {"status": {}}, _preload_content=False
        )
    assert err.value.status == 503
    apiserver.clear_faults()
    res.patch_namespaced_resource_claim_status(
        "c", "default", {"status": {}}, _preload_content=False
    )


def test_fault_injection_hangup_and_delay(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    hangup = apiserver.inject_fault(verb="create", resource="nodes", action="hangup")
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.create_node({"metadata": {"name": "n1"}})
    assert hangup.hits == 1 and apiserver.store.get("nodes", "n1") is None
    # urllib3 retries an idempotent GET after a hang-up on its own
    apiserver.inject_fault(verb="list", resource="nodes", action="hangup")
    assert core.list_node().items == []
    assert apiserver.request_count("list", "nodes") == 2
    apiserver.inject_fault(verb="create", resource="nodes", action="delay", delay_s=3)
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.create_node({"metadata": {"name": "n2"}}, _request_timeout=0.3)
    eventually(lambda: apiserver.store.get("nodes", "n2") is not None)


def test_request_counters(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    res = client.ResourceV1Api(kube_client)
    core.create_node({"metadata": {"name": "n1"}})
    core.read_node("n1")
    core.read_node("n1")
    res.create_namespaced_resource_claim("default", claim_obj("c"), _preload_content=False)
    res.patch_namespaced_resource_claim_status(
        "c", "default", {"status": {}}, _preload_content=False
    )
    assert apiserver.request_count("get", "nodes") == 2
    assert apiserver.request_count("create") == 2
    assert apiserver.request_count("patch", "resourceclaims") == 1
    assert apiserver.request_count("patch", "resourceclaims/status") == 1
    assert apiserver.write_count("nodes") == 1
    assert apiserver.write_count() == 3
    assert apiserver.request_counts()[("get", "nodes")] == 2
    apiserver.reset_counters()
    assert apiserver.request_count() == 0


# --- lifecycle -----------------------------------------------------------------------------


def test_kubeconfig_and_clean_stop(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    server = KubeAPIServer().start()
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    api = kubernetes.config.new_client_from_config(config_file=path)
    core = client.CoreV1Api(api)
    core.create_node({"metadata": {"name": "n1"}})
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    watcher = threading.Thread(
        target=lambda: list(watch.Watch().stream(core.list_node, timeout_seconds=60))
    )
    watcher.start()
    eventually(lambda: server.open_watches() == 1)
    server.stop()
    watcher.join(30)
    api.close()
    assert not watcher.is_alive()
    assert set(threading.enumerate()) <= before
    server.stop()  # idempotent


def test_direct_store_access(apiserver: KubeAPIServer) -> None:
    stored = apiserver.store.put(
        "pods", {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}}
    )
    assert stored["status"] == {"phase": "Running"} and stored["kind"] == "Pod"
    got = apiserver.store.get("pods", "p", "ns")
    assert got is not None and got["metadata"]["uid"] == stored["metadata"]["uid"]
    got["metadata"]["name"] = "changed"  # copies: the store is not affected
    assert apiserver.store.get("pods", "p", "ns") is not None
    assert apiserver.store.list("pods", namespace="ns")[0]["metadata"]["name"] == "p"
    apiserver.store.put("pods", pod_obj("q", node="node-1", app="x"))
    assert [
        p["metadata"]["name"]
        for p in apiserver.store.list("pods", field_selector="spec.nodeName=node-1")
    ] == ["q"]
    assert [
        p["metadata"]["name"] for p in apiserver.store.list("pods", label_selector="app=x")
    ] == ["q"]
    patched = apiserver.store.patch("pods", "q", "default", {"metadata": {"labels": {"app": "y"}}})
    assert patched["metadata"]["labels"] == {"app": "y"}
    patched["metadata"]["labels"]["app"] = "mutated"  # a copy
    assert apiserver.store.get("pods", "q", "default")["metadata"]["labels"] == {"app": "y"}  # type: ignore[index]
    with_status = apiserver.store.update_status("pods", {**patched, "status": {"phase": "Running"}})
    assert with_status["status"] == {"phase": "Running"}
    apiserver.store.delete("pods", "p", "ns")
    assert apiserver.store.get("pods", "p", "ns") is None
    with pytest.raises(KeyError, match="unknown resource 'widgets'"):
        apiserver.store.get("widgets", "x")


@pytest.mark.process
def test_standalone_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpuctl.local.apiserver", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        with api:
            core = client.CoreV1Api(api)
            core.create_node({"metadata": {"name": "n1"}})
            assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_concurrent_writers_and_a_watcher(apiserver: KubeAPIServer) -> None:
    writers, per_writer = 6, 40
    start_rv = str(apiserver.store.resource_version)
    events: list[tuple[str, int]] = []
    w = watch.Watch()

    def consume() -> None:
        with apiserver.client() as api:
            custom = client.CustomObjectsApi(api)
            for e in w.stream(
                custom.list_cluster_custom_object,
                names.API_GROUP,
                names.API_VERSION,
                names.GPU_PLURAL,
                resource_version=start_rv,
                timeout_seconds=60,
            ):
                events.append((e["type"], int(e["object"]["metadata"]["resourceVersion"])))
                if len(events) == writers * per_writer * 2:
                    w.stop()

    def write(k: int) -> None:
        with apiserver.client() as api:
            custom = client.CustomObjectsApi(api)
            args = (names.API_GROUP, names.API_VERSION, names.GPU_PLURAL)
            for i in range(per_writer):
                created = custom.create_cluster_custom_object(
                    *args, {"metadata": {"name": f"w{k}-{i}"}, "spec": gpu_spec(index=i)}
                )
                custom.patch_cluster_custom_object_status(
                    *args, created["metadata"]["name"], {"status": gpu_status(claims=i)}
                )

    consumer = threading.Thread(target=consume)
    consumer.start()
    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    consumer.join(60)
    assert not consumer.is_alive()
    assert [t for t, _ in events].count("ADDED") == writers * per_writer
    assert [t for t, _ in events].count("MODIFIED") == writers * per_writer
    rvs = [rv for _, rv in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    assert apiserver.store.count(names.GPU_PLURAL) == writers * per_writer


def test_discovery_serves_the_dynamic_client(kube_client: ApiClient) -> None:
    from kubernetes import dynamic

    dc = dynamic.DynamicClient(kube_client)
    slices = dc.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    assert slices.name == "resourceslices" and not slices.namespaced
    gpus = dc.resources.get(api_version=names.GROUP_VERSION, kind=names.GPU_KIND)
    gpus.create(
        body={"apiVersion": names.GROUP_VERSION, "kind": names.GPU_KIND, "metadata": {"name": "g"}}
    )
    assert [i.metadata.name for i in gpus.get().items] == ["g"]
    version = client.VersionApi(kube_client).get_code()
    assert (version.major, version.minor) == ("1", SCHEMA_KUBERNETES_VERSION.split(".")[1])
    assert version.git_version == f"v{SCHEMA_KUBERNETES_VERSION}+sharegpu"


def test_dry_run_stores_nothing(apiserver: KubeAPIServer, kube_client: ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_node({"metadata": {"name": "dry"}}, dry_run="All")
    assert apiserver.store.get("nodes", "dry") is None
    core.create_node({"metadata": {"name": "n1"}})
    rv = apiserver.store.resource_version
    core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}, dry_run="All")
    core.delete_node("n1", dry_run="All")
    assert apiserver.store.resource_version == rv
    assert apiserver.store.get("nodes", "n1") is not None


def test_json_patch_follows_pointers_and_names_a_missing_path() -> None:
    from sharegpuctl.local.apiserver.errors import ApiError
    from sharegpuctl.local.apiserver.patch import json_patch

    doc = {"spec": {"items": [{"a/b": 1}, {"c": 2}]}}
    patched = json_patch(
        doc,
        [
            {"op": "test", "path": "/spec/items/0/a~1b", "value": 1},
            {"op": "copy", "from": "/spec/items/1/c", "path": "/spec/copied"},
            {"op": "replace", "path": "/spec/items/1/c", "value": 3},
        ],
    )
    assert patched == {"spec": {"items": [{"a/b": 1}, {"c": 3}], "copied": 2}}
    for bad in ("/spec/items/5/c", "/spec/nothing/x", "/spec/items/x"):
        with pytest.raises(ApiError) as err:
            json_patch(doc, [{"op": "replace", "path": bad, "value": 0}])
        assert err.value.code == 422
        assert repr(bad) in err.value.message


def taint_rule_obj(name: str, effect: str = "NoExecute", **selector: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": selector,
            "taint": {"key": "example.com/maintenance", "effect": effect},
        },
    }


def test_device_taint_rules_are_served_cluster_scoped(kube_client: ApiClient) -> None:
    custom = client.CustomObjectsApi(kube_client)
    args = (names.RESOURCE_GROUP, names.RESOURCE_VERSION, "devicetaintrules")
    created = custom.create_cluster_custom_object(
        *args, taint_rule_obj("drain", driver=DRIVER, pool="node-1", device="gpu-0")
    )
    assert created["metadata"]["name"] == "drain" and "namespace" not in created["metadata"]
    [item] = custom.list_cluster_custom_object(*args)["items"]
    assert item["spec"]["deviceSelector"]["device"] == "gpu-0"
    for bad, path in (
        (taint_rule_obj("bad-effect", effect="Sometimes"), "spec.taint.effect"),
        (taint_rule_obj("bad-device", device="GPU_0"), "spec.deviceSelector.device"),
    ):
        with pytest.raises(ApiException) as err:
            custom.create_cluster_custom_object(*args, bad)
        assert err.value.status == 422
        assert path in body_of(err.value)["message"]
    unknown = taint_rule_obj("unknown")
    unknown["spec"]["taint"]["x"] = 1
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(*args, unknown, field_validation="Strict")
    assert err.value.status == 400
    assert 'unknown field "spec.taint.x"' in body_of(err.value)["message"]
