"""Structural-schema validation and pruning of custom resources (:mod:`sharegpuctl.local.apiserver.
crdschema`), against the real server's own test table and through the embedded API server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api import names
from api.quantity import QUANTITY_PATTERN
from sharegpuctl.local.apiserver import ApiError, KubeAPIServer
from sharegpuctl.local.apiserver.crdschema import go_float, prune, validate
from tests.sharegpuctl.local.objects import gpu_spec, gpu_status, request_json

Obj = dict[str, Any]
INT_OR_STRING = "integer,string"


def type_error(wanted: str, actual: str) -> str:
    """The error of a value of type ``actual`` in ``field``, whose schema type is ``wanted``."""
    return f'field: Invalid value: "{actual}": field in body must be of type {wanted}: "{actual}"'


# Ported from TestValidateCustomResource in kubernetes/kubernetes
# staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/validation/validation_test.go
# (commit 4ed1699301068d353333ed58ab9cd1c488f3d376): schema, objects it accepts, and objects it
# refuses with exactly these errors. Left out: the cases with user-written anyOf/allOf next to
# x-kubernetes-int-or-string and an invalid regular expression, which this server does not
# model (see the module text of crdschema).
UPSTREAM: list[tuple[str, Obj, list[Any], list[tuple[Any, list[str]]]]] = [
    (
        "!nullable",
        {"properties": {"field": {"type": "object", "nullable": False}}},
        [{}, {"field": {}}],
        [
            (
                {"field": v},
                [type_error("object", t)],
            )
            for v, t in (
                ("foo", "string"),
                (42, "integer"),
                (True, "boolean"),
                (1.2, "number"),
                ([], "array"),
                (None, "null"),
            )
        ],
    ),
    (
        "nullable",
        {"properties": {"field": {"type": "object", "nullable": True}}},
        [{}, {"field": {}}, {"field": None}],
        [
            (
                {"field": v},
                [type_error("object", t)],
            )
            for v, t in (
                ("foo", "string"),
                (42, "integer"),
                (True, "boolean"),
                (1.2, "number"),
                ([], "array"),
            )
        ],
    ),
    (
        "nullable and no type",
        {"properties": {"field": {"nullable": True}}},
        [
            {},
            {"field": {}},
            {"field": None},
            {"field": "foo"},
            {"field": 42},
            {"field": True},
            {"field": 1.2},
            {"field": []},
        ],
        [],
    ),
    (
        "x-kubernetes-int-or-string",
        {"properties": {"field": {"x-kubernetes-int-or-string": True}}},
        [{}, {"field": 42}, {"field": "foo"}],
        [
            (
                {"field": v},
                [type_error(INT_OR_STRING, t)],
            )
            for v, t in (
                (None, "null"),
                (True, "boolean"),
                (1.2, "number"),
                ({}, "object"),
                ([], "array"),
            )
        ],
    ),
    (
        "nullable and x-kubernetes-int-or-string",
        {"properties": {"field": {"nullable": True, "x-kubernetes-int-or-string": True}}},
        [{}, {"field": 42}, {"field": "foo"}, {"field": None}],
        [
            (
                {"field": v},
                [type_error(INT_OR_STRING, t)],
            )
            for v, t in ((True, "boolean"), (1.2, "number"), ({}, "object"), ([], "array"))
        ],
    ),
    (
        "required field",
        {
            "required": ["field"],
            "properties": {
                "field": {"type": "object", "required": ["nested"], "properties": {"nested": {}}}
            },
        },
        [],
        [
            ({"test": "a"}, ["field: Required value"]),
            ({"field": {}}, ["field.nested: Required value"]),
        ],
    ),
    (
        "enum",
        {
            "properties": {
                "field": {
                    "type": "object",
                    "required": ["nestedint", "nestedstring"],
                    "properties": {
                        "nestedint": {"type": "integer", "enum": [1, 2]},
                        "nestedstring": {"type": "string", "enum": ["a", "b"]},
                    },
                }
            }
        },
        [],
        [
            (
                {"field": {}},
                ["field.nestedint: Required value", "field.nestedstring: Required value"],
            ),
            (
                {"field": {"nestedint": "x", "nestedstring": True}},
                [
                    'field.nestedint: Invalid value: "string": field.nestedint in body must be of '
                    'type integer: "string"',
                    'field.nestedint: Unsupported value: "x": supported values: "1", "2"',
                    'field.nestedstring: Invalid value: "boolean": field.nestedstring in body must '
                    'be of type string: "boolean"',
                    'field.nestedstring: Unsupported value: true: supported values: "a", "b"',
                ],
            ),
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "schema", "accepted", "refused"), UPSTREAM, ids=[u[0] for u in UPSTREAM]
)
def test_the_upstream_validation_table(
    name: str, schema: Obj, accepted: list[Any], refused: list[tuple[Any, list[str]]]
) -> None:
    for obj in accepted:
        assert validate(schema, obj) == [], obj
    for obj, expected in refused:
        assert sorted(validate(schema, obj)) == sorted(expected), obj


def test_pruning_drops_undeclared_fields_and_nulls_but_keeps_metadata() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "keep": {"type": "string"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "map": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"a": {"type": "integer"}},
                        },
                    },
                    "list": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"b": {"type": "integer"}}},
                    },
                    "maybe": {"type": "string", "nullable": True},
                    "never": {"type": "string"},
                },
            }
        },
    }
    obj: Obj = {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "n", "unknownMeta": 1},
        "extra": 1,
        "spec": {
            "keep": "k",
            "drop": 1,
            "free": {"anything": {"goes": 1}},
            "map": {"k": {"a": 1, "z": 2}},
            "list": [{"b": 1, "y": 2}],
            "maybe": None,
            "never": None,
        },
    }
    prune(schema, obj)
    assert obj == {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "n", "unknownMeta": 1},
        "spec": {
            "keep": "k",
            "free": {"anything": {"goes": 1}},
            "map": {"k": {"a": 1}},
            "list": [{"b": 1}],
            "maybe": None,
        },
    }


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (1e8, "100000000"), (1.5, "1.5"), (1e-5, "1e-05"), (1e21, "1e+21")],
)
def test_bounds_print_as_go_prints_them(value: float, text: str) -> None:
    assert go_float(value) == text


# --- through the embedded server ------------------------------------------------------------


def quota(**hard: Any) -> Obj:
    return {
        "apiVersion": names.GROUP_VERSION,
        "kind": names.GPU_QUOTA_KIND,
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": hard},
    }


def invalid(call: Any) -> ApiError:
    with pytest.raises(ApiError) as err:
        call()
    assert err.value.code == 422 and err.value.reason == "Invalid"
    return err.value


def test_gpu_quota_create_patch_and_update_are_checked_against_the_crd(
    apiserver: KubeAPIServer,
) -> None:
    store = apiserver.store
    err = invalid(lambda: store.create("gpuquotas", quota(cores=-5, memory="lots")))
    assert err.causes == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: -5: spec.hard.cores in body should be greater than or "
            "equal to 0",
            "field": "spec.hard.cores",
        },
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "lots": spec.hard.memory in body should match '
            f"'{QUANTITY_PATTERN}'",
            "field": "spec.hard.memory",
        },
    ]
    assert err.message.startswith('GpuQuota.resource.sharegpu.dev "q" is invalid: [spec.hard.cores')
    created = store.create("gpuquotas", {**quota(cores=50, memory="10Gi"), "unknown": 1})
    assert "unknown" not in created
    err = invalid(
        lambda: store.patch("gpuquotas", "q", "default", {"spec": {"hard": {"cores": "30%"}}})
    )
    assert err.message == (
        'GpuQuota.resource.sharegpu.dev "q" is invalid: spec.hard.cores: Invalid value: '
        '"string": spec.hard.cores in body must be of type integer: "string"'
    )
    assert err.causes[0]["reason"] == "FieldValueTypeInvalid"
    replaced = {**created, "spec": {"deviceClassNames": ["x" * 254]}}
    err = invalid(lambda: store.update("gpuquotas", replaced))
    assert {c["field"]: c["reason"] for c in err.causes} == {
        "spec.hard": "FieldValueRequired",
        "spec.deviceClassNames[0]": "FieldValueTooLong",
    }
    status = {**created, "status": {"used": {"cores": -1}}}
    err = invalid(lambda: store.update_status("gpuquotas", status))
    assert err.causes[0]["field"] == "status.used.cores"
    assert store.get("gpuquotas", "q", "default")["spec"]["hard"] == {"cores": 50, "memory": "10Gi"}


def test_gpu_status_enum_is_checked(apiserver: KubeAPIServer) -> None:
    store = apiserver.store
    gpu = store.create(names.GPU_PLURAL, {"metadata": {"name": "g"}, "spec": gpu_spec()})
    bad = {**gpu, "status": {**gpu_status(), "health": "Broken"}}
    err = invalid(lambda: store.update_status(names.GPU_PLURAL, bad))
    assert err.causes == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "Broken": supported values: "Healthy", "Unhealthy"',
            "field": "status.health",
        }
    ]


def widget_crd(**schema: Any) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", **schema}},
                }
            ],
        },
    }


def test_a_crd_created_later_is_served_and_deleting_it_removes_its_resource(
    apiserver: KubeAPIServer,
) -> None:
    with apiserver.client() as api:
        path = "/apis/example.com/v1/namespaces/default/widgets"
        code, _ = request_json(api, "GET", path)
        assert code == 404
        sizes = {
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {"size": {"type": "integer", "maximum": 3}},
                }
            }
        }
        code, crd = request_json(
            api,
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            widget_crd(**sizes),
        )
        assert code == 201
        assert {c["type"] for c in crd["status"]["conditions"]} == {"NamesAccepted", "Established"}
        widget = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 4},
        }
        code, status = request_json(api, "POST", path, widget)
        assert code == 422 and status["details"]["causes"][0]["field"] == "spec.size"
        code, _ = request_json(api, "POST", path, {**widget, "spec": {"size": 2}})
        assert code == 201
        code, _ = request_json(
            api,
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
        )
        assert code == 200
        code, status = request_json(api, "GET", path)
        assert code == 404


def test_a_crd_the_server_cannot_serve_is_invalid(apiserver: KubeAPIServer) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "gadgets.example.com"
    err = invalid(lambda: apiserver.store.create("customresourcedefinitions", crd))
    assert err.causes[0]["field"] == "metadata.name"
    assert json.dumps("must be spec.names.plural")[1:-1] in err.message
