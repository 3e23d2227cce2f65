"""The embedded API server's OpenAPI v3 documents, as kubectl reads them (apply, explain, edit),
and its strategic merge patches of built-in kinds, which kubectl apply and edit send."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3

from api import names
from api.crd import crd_manifest
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.openapi import component_name
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION

Obj = dict[str, Any]
GPU_COMPONENT = "dev.sharegpu.resource.v1alpha1.GPU"


def fetch(apiserver: KubeAPIServer, path: str) -> tuple[int, Any]:
    resp = urllib3.request("GET", apiserver.url + path, headers={"Accept": "application/json"})
    return resp.status, json.loads(resp.data)


def documents(apiserver: KubeAPIServer) -> dict[str, Obj]:
    """Every document of the index, fetched by the URL the index gives."""
    code, index = fetch(apiserver, "/openapi/v3")
    assert code == 200
    out = {}
    for key, entry in index["paths"].items():
        code, doc = fetch(apiserver, entry["serverRelativeURL"])
        assert code == 200, key
        out[key] = doc
    return out


def refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(refs(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
    return found.union(*(refs(v) for v in node.values())) if node else found


def test_the_index_lists_one_document_per_served_group_version(apiserver: KubeAPIServer) -> None:
    code, index = fetch(apiserver, "/openapi/v3")
    assert code == 200
    served = {
        f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
        for rt in apiserver.store.registry.all()
    }
    assert set(index["paths"]) == served
    for key, entry in index["paths"].items():
        url, _, digest = entry["serverRelativeURL"].partition("?hash=")
        assert url == f"/openapi/v3/{key}" and len(digest) == 128
    code, status = fetch(apiserver, "/openapi/v3/apis/apps/v1")
    assert code == 404 and status["kind"] == "Status"


def test_every_reference_resolves_and_only_served_media_types_are_named(
    apiserver: KubeAPIServer,
) -> None:
    for key, doc in documents(apiserver).items():
        assert doc["openapi"] == "3.0.0"
        assert doc["info"]["version"] == f"v{SCHEMA_KUBERNETES_VERSION}"
        schemas = doc["components"]["schemas"]
        for ref in refs(doc):
            assert ref.startswith("#/components/schemas/"), (key, ref)
            assert ref.removeprefix("#/components/schemas/") in schemas, (key, ref)
        text = json.dumps(doc)
        assert "protobuf" not in text and "apply-patch" not in text, key
        assert "$defs" not in text and '"null"' not in text, key


def test_custom_resources_are_published_from_their_crd(apiserver: KubeAPIServer) -> None:
    doc = documents(apiserver)[f"apis/{names.GROUP_VERSION}"]
    gpu = doc["components"]["schemas"][GPU_COMPONENT]
    crd_schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert gpu["properties"]["spec"] == crd_schema["properties"]["spec"]
    assert gpu["x-kubernetes-group-version-kind"] == [
        {"group": names.API_GROUP, "version": names.API_VERSION, "kind": names.GPU_KIND}
    ]
    meta = gpu["properties"]["metadata"]["allOf"][0]["$ref"]
    assert meta == "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    item = doc["paths"][f"/apis/{names.GROUP_VERSION}/gpus/{{name}}"]
    assert item["get"]["x-kubernetes-group-version-kind"]["kind"] == names.GPU_KIND
    patch = item["patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    # a custom resource takes no strategic merge patch (kubectl apply then sends a merge patch)
    assert set(patch["requestBody"]["content"]) == {
        "application/json-patch+json",
        "application/merge-patch+json",
    }
    assert set(doc["paths"]) >= {
        f"/apis/{names.GROUP_VERSION}/gpus",
        f"/apis/{names.GROUP_VERSION}/gpus/{{name}}/status",
        f"/apis/{names.GROUP_VERSION}/namespaces/{{namespace}}/gpuquotas/{{name}}",
        f"/apis/{names.GROUP_VERSION}/gpuquotas",
    }


def test_built_in_kinds_are_published_from_the_schemas_the_server_validates_with(
    apiserver: KubeAPIServer,
) -> None:
    doc = documents(apiserver)["api/v1"]
    schemas = doc["components"]["schemas"]
    pod = schemas["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    assert pod["properties"]["apiVersion"] == {
        "description": pod["properties"]["apiVersion"]["description"],
        "type": "string",
    }
    spec = pod["properties"]["spec"]
    assert spec["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]
    containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["type"] == "array"
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert containers["items"] == {"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}
    assert "io.k8s.api.core.v1.NamespaceList" in schemas
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]
    assert patch["x-kubernetes-action"] == "patch"
    resource = documents(apiserver)["apis/resource.k8s.io/v1"]
    assert "io.k8s.api.resource.v1.ResourceClaimTemplate" in resource["components"]["schemas"]


def test_a_crd_created_later_changes_the_index(apiserver: KubeAPIServer) -> None:
    _, before = fetch(apiserver, "/openapi/v3")
    crd = crd_manifest()
    crd["metadata"]["name"] = "widgets.example.com"
    crd["spec"]["group"] = "example.com"
    crd["spec"]["names"] = {"plural": "widgets", "kind": "Widget"}
    apiserver.store.create("customresourcedefinitions", crd)
    _, after = fetch(apiserver, "/openapi/v3")
    assert set(after["paths"]) - set(before["paths"]) == {"apis/example.com/v1alpha1"}
    doc = documents(apiserver)["apis/example.com/v1alpha1"]
    assert "com.example.v1alpha1.Widget" in doc["components"]["schemas"]
    assert "com.example.v1alpha1.WidgetList" in doc["components"]["schemas"]
    apiserver.store.delete("customresourcedefinitions", "widgets.example.com")
    _, gone = fetch(apiserver, "/openapi/v3")
    assert set(gone["paths"]) == set(before["paths"])


def test_component_names_follow_the_api_server() -> None:
    from sharegpuctl.local.apiserver.resources import default_resources

    by_plural = {rt.plural: rt for rt in default_resources()}
    assert component_name(by_plural["gpus"], "GPU") == GPU_COMPONENT
    assert component_name(by_plural["pods"], "Pod") == "io.k8s.api.core.v1.Pod"
    claims = by_plural["resourceclaims"]
    assert component_name(claims, "ResourceClaimList") == "io.k8s.api.resource.v1.ResourceClaimList"


# --- strategic merge patch -------------------------------------------------------------------


def patch(apiserver: KubeAPIServer, path: str, body: Any, media: str) -> tuple[int, Any]:
    resp = urllib3.request(
        "PATCH",
        apiserver.url + path,
        body=json.dumps(body).encode(),
        headers={"Content-Type": media, "Accept": "application/json"},
    )
    return resp.status, json.loads(resp.data)


SMP = "application/strategic-merge-patch+json"
POD = "/api/v1/namespaces/default/pods/p"


@pytest.fixture
def pod(apiserver: KubeAPIServer) -> Obj:
    return apiserver.store.create(
        "pods",
        {
            "metadata": {"name": "p", "namespace": "default", "finalizers": ["a"]},
            "spec": {
                "containers": [
                    {"name": "one", "image": "i1", "args": ["x"]},
                    {"name": "two", "image": "i2"},
                ]
            },
        },
    )


def test_strategic_merge_patch_merges_lists_by_their_merge_key(
    apiserver: KubeAPIServer, pod: Obj
) -> None:
    code, out = patch(
        apiserver,
        POD,
        {
            "metadata": {"finalizers": ["b"]},
            "spec": {
                "$setElementOrder/containers": [{"name": "two"}, {"name": "one"}],
                "containers": [{"name": "one", "image": "new"}],
            },
        },
        SMP,
    )
    assert code == 200, out
    assert out["spec"]["containers"] == [
        {"name": "two", "image": "i2"},
        {"name": "one", "image": "new", "args": ["x"]},
    ]
    assert out["metadata"]["finalizers"] == ["a", "b"]  # a merge list of scalars is a union
    assert "$setElementOrder/containers" not in out["spec"]


def test_strategic_merge_patch_directives_delete_and_replace(
    apiserver: KubeAPIServer, pod: Obj
) -> None:
    code, out = patch(
        apiserver,
        POD,
        {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"containers": [{"name": "two", "$patch": "delete"}]},
        },
        SMP,
    )
    assert code == 200, out
    assert [c["name"] for c in out["spec"]["containers"]] == ["one"]
    assert out["metadata"].get("finalizers") == []
    code, out = patch(
        apiserver,
        POD,
        {"spec": {"containers": [{"name": "z", "image": "z"}, {"$patch": "replace"}]}},
        SMP,
    )
    assert code == 200 and out["spec"]["containers"] == [{"name": "z", "image": "z"}]
    code, out = patch(apiserver, POD, {"spec": {"$patch": "sideways"}}, SMP)
    assert code == 422 and '"sideways"' in out["message"]


def test_strategic_merge_patch_of_a_custom_resource_is_refused(apiserver: KubeAPIServer) -> None:
    apiserver.store.create(
        "gpuquotas", {"metadata": {"name": "q", "namespace": "default"}, "spec": {"hard": {}}}
    )
    path = f"/apis/{names.GROUP_VERSION}/namespaces/default/gpuquotas/q"
    code, out = patch(apiserver, path, {"spec": {}}, SMP)
    assert code == 415 and out["reason"] == "UnsupportedMediaType"
    assert out["message"].endswith(
        "accepted media types include: application/json-patch+json, application/merge-patch+json"
    )
    code, out = patch(apiserver, path, {"spec": {}}, "application/apply-patch+yaml")
    assert code == 415
    assert out["message"].startswith(
        "server-side apply (application/apply-patch+yaml) is not supported by this server"
    )


def test_strategic_merge_patch_retain_keys_clears_the_other_fields(
    apiserver: KubeAPIServer,
) -> None:
    apiserver.store.create(
        "pods",
        {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "containers": [{"name": "one", "image": "i1"}],
                "volumes": [{"name": "v", "hostPath": {"path": "/data"}}],
            },
        },
    )
    change = {"name": "v", "$retainKeys": ["emptyDir", "name"], "emptyDir": {}}
    code, out = patch(apiserver, POD, {"spec": {"volumes": [change]}}, SMP)
    assert code == 200, out
    assert out["spec"]["volumes"] == [{"name": "v", "emptyDir": {}}]
