"""Stored GPU objects as the tracker keeps them: metadata and digests of spec and status."""

from __future__ import annotations

from controller.stored import StoredGpu, json_digest, older, stored_gpu


def test_digest_equal_exactly_when_the_json_is_equal() -> None:
    a = {"cores": 10, "allocations": [{"name": "x", "pods": []}], "memory": "1Gi"}
    b = {"memory": "1Gi", "allocations": [{"pods": [], "name": "x"}], "cores": 10}
    assert json_digest(a) == json_digest(b)
    for changed in (
        {**a, "cores": 11},
        {**a, "allocations": []},
        {**a, "memory": "1Gi "},
        {k: v for k, v in a.items() if k != "memory"},
        {**a, "extra": None},
    ):
        assert json_digest(changed) != json_digest(a), changed
    assert json_digest(None) != json_digest({})
    assert len(json_digest(a)) == 16


def test_stored_gpu_drops_managed_fields_and_keeps_the_rest_of_metadata() -> None:
    obj = {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GPU",
        "metadata": {
            "name": "n1-gpu-0",
            "resourceVersion": "42",
            "labels": {"a": "1", "b": "2"},
            "annotations": {"note": "kept"},
            "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"node": "n1"},
        "status": {"health": "Healthy"},
    }
    s = stored_gpu(obj)
    assert "managedFields" not in s.metadata and s.metadata["annotations"] == {"note": "kept"}
    assert s.resource_version == "42"
    assert s.spec_digest == json_digest({"node": "n1"})
    assert s.status_digest == json_digest({"health": "Healthy"})
    assert s.has_labels({"a": "1"}) and not s.has_labels({"a": "2"}) and s.has_labels({})
    body = s.body(status={"health": "Unhealthy"})
    assert body["metadata"] is s.metadata and body["kind"] == "GPU"
    assert body["status"] == {"health": "Unhealthy"} and "spec" not in body


def test_older_compares_integer_resource_versions_only() -> None:
    def at(rv: str) -> StoredGpu:
        return stored_gpu({"metadata": {"name": "g", "resourceVersion": rv}})

    assert older(at("9"), at("10"))
    assert not older(at("10"), at("9"))
    assert not older(at("9"), None)
    assert not older(at("abc"), at("10"))
