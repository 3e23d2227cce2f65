"""What kubectl reads from the embedded API server: short names and categories in discovery,
Table answers with the CRDs' printer columns, and 415 for request bodies it cannot decode."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import urllib3

from api import names
from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.printers import human_duration
from sharegpuctl.local.apiserver.resources import ResourceType
from sharegpuctl.local.apiserver.tables import table
from tests.sharegpuctl.local.objects import gpu_spec, gpu_status

Obj = dict[str, Any]
#: The Accept header kubectl sends for ``get``.
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def get(apiserver: KubeAPIServer, path: str, accept: str = "application/json") -> tuple[int, Obj]:
    resp = urllib3.request("GET", apiserver.url + path, headers={"Accept": accept})
    return resp.status, json.loads(resp.data)


def test_discovery_names_short_names_and_categories(apiserver: KubeAPIServer) -> None:
    code, body = get(apiserver, f"/apis/{names.GROUP_VERSION}")
    assert code == 200
    by_name = {r["name"]: r for r in body["resources"]}
    assert by_name["gpus"]["shortNames"] == ["sgpu"]
    assert by_name["gpus"]["singularName"] == "gpu"
    assert by_name["gpuquotas"]["shortNames"] == ["gpuq"]
    assert by_name["gpus"]["categories"] == by_name["gpuquotas"]["categories"] == ["sharegpu"]
    assert "shortNames" not in by_name["gpus/status"]
    _, ext = get(apiserver, "/apis/apiextensions.k8s.io/v1")
    crds = {r["name"]: r for r in ext["resources"]}["customresourcedefinitions"]
    assert crds["shortNames"] == ["crd", "crds"]
    _, core = get(apiserver, "/api/v1")
    core_names = {r["name"]: r for r in core["resources"]}
    assert [core_names[p].get("shortNames") for p in ("namespaces", "nodes", "pods", "events")] == [
        ["ns"],
        ["no"],
        ["po"],
        ["ev"],
    ]
    assert core_names["pods"]["categories"] == ["all"]


def test_get_gpus_as_table_has_the_printer_columns(apiserver: KubeAPIServer) -> None:
    gpu = apiserver.store.create(names.GPU_PLURAL, {"metadata": {"name": "g0"}, "spec": gpu_spec()})
    apiserver.store.update_status(names.GPU_PLURAL, {**gpu, "status": gpu_status(claims=3)})
    code, listed = get(apiserver, f"/apis/{names.GROUP_VERSION}/gpus", TABLE)
    assert code == 200 and listed["kind"] == "Table"
    assert [c["name"] for c in listed["columnDefinitions"]] == [
        "Name",
        "Node",
        "Model",
        "Health",
        "Cores",
        "Memory",
        "Claims",
        "Limits",
        "Overcommit",
        "Age",
    ]
    (row,) = listed["rows"]
    assert row["cells"][:7] == ["g0", "node-1", "NVIDIA A100", "Healthy", "0/100", "0/40Gi", 3]
    # No burstable share: no limits, no ratio.
    assert row["cells"][7:9] == [None, None]
    assert row["cells"][9].endswith("s")  # an age, e.g. "0s"
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "g0"
    code, one = get(apiserver, f"/apis/{names.GROUP_VERSION}/gpus/g0?includeObject=None", TABLE)
    assert code == 200 and one["rows"] == [{"cells": row["cells"]}]
    code, plain = get(apiserver, f"/apis/{names.GROUP_VERSION}/gpus/g0")
    assert plain["kind"] == names.GPU_KIND


def test_missing_cells_are_null_and_types_without_columns_get_the_default_table(
    apiserver: KubeAPIServer,
) -> None:
    apiserver.store.create(
        "gpuquotas", {"metadata": {"name": "q", "namespace": "default"}, "spec": {"hard": {}}}
    )
    _, quotas = get(apiserver, f"/apis/{names.GROUP_VERSION}/namespaces/default/gpuquotas", TABLE)
    assert quotas["rows"][0]["cells"][:4] == ["q", None, None, None]
    widgets = ResourceType("example.com", "v1", "widgets", "Widget", namespaced=False, crd={})
    plain = table(
        widgets,
        [{"metadata": {"name": "w", "creationTimestamp": "2026-01-02T03:04:05Z"}}],
        "1",
        None,
    )
    assert [c["name"] for c in plain["columnDefinitions"]] == ["Name", "Created At"]
    assert plain["rows"][0]["cells"] == ["w", "2026-01-02T03:04:05Z"]
    code, bad = get(apiserver, "/api/v1/namespaces?includeObject=All", TABLE)
    assert code == 400 and "includeObject" in bad["message"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (0, "0s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (400 * 86400, "400d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_read_as_kubectl_shows_them(seconds: int, text: str) -> None:
    assert human_duration(timedelta(seconds=seconds).total_seconds()) == text


def test_a_protobuf_body_is_unsupported_media_type(apiserver: KubeAPIServer) -> None:
    resp = urllib3.request(
        "POST",
        apiserver.url + "/api/v1/namespaces",
        body=b"k8s\x00\n\x0f\n\x02v1\x12\tNamespace",
        headers={"Content-Type": "application/vnd.kubernetes.protobuf"},
    )
    status = json.loads(resp.data)
    assert resp.status == 415 and status["reason"] == "UnsupportedMediaType"
    assert status["message"].startswith(
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json, application/yaml (application/vnd.kubernetes.protobuf is not decoded "
        "by this server: send the object as JSON or YAML"
    )
    resp = urllib3.request(
        "PATCH",
        apiserver.url + "/api/v1/namespaces/default",
        body=b"\x00",
        headers={"Content-Type": "application/vnd.kubernetes.protobuf"},
    )
    assert resp.status == 415 and "merge-patch" in json.loads(resp.data)["message"]
