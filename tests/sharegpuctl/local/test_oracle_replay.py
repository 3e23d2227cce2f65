"""The embedded API server against the real one: every oracle case recorded from a real
kube-apiserver (``tests/data/apiserver-oracle/``, see :mod:`tests.e2e.oracle`) is replayed
here, and the embedded server must give the same HTTP status, Status reason, cause fields and
reasons, and message; an accepted object must come back as the real server stored it (pruned).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from sharegpuctl.local.apiserver import KubeAPIServer
from tests.e2e.oracle import CASES, ORACLE_DIR, OracleCase, normalized


def send(server: KubeAPIServer, method: str, path: str, body: Any, content_type: str) -> Any:
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), method=method
    )
    request.add_header("Accept", "application/json")
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def comparable(code: int, body: Any) -> dict[str, Any]:
    """What must agree: status, and for a Status its reason, causes and message; for an object
    its spec."""
    if isinstance(body, dict) and body.get("kind") == "Status":
        details = body.get("details") or {}
        return {
            "code": code,
            "reason": body.get("reason"),
            "causes": [
                (c.get("field"), c.get("reason"), c.get("message"))
                for c in details.get("causes") or []
            ],
            "message": body.get("message"),
        }
    return {"code": code, "spec": (body or {}).get("spec")}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_embedded_server_answers_as_the_real_one(
    apiserver: KubeAPIServer, case: OracleCase
) -> None:
    recorded = json.loads((ORACLE_DIR / f"{case.name}.json").read_text())
    if case.setup is not None:
        code, body = send(
            apiserver, "POST", case.path.rsplit("/", 1)[0], case.setup, "application/json"
        )
        assert code == 201, body
    code, body = send(apiserver, case.method, case.path, case.body, case.content_type)
    want = recorded["response"]
    assert comparable(code, normalized(body)) == comparable(want["code"], want["body"])


def test_strict_field_validation_refuses_unknown_fields_of_a_patched_object(
    apiserver: KubeAPIServer,
) -> None:
    quotas = "/apis/resource.sharegpu.dev/v1alpha1/namespaces/default/gpuquotas"
    stored = {
        "apiVersion": "resource.sharegpu.dev/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": {"cores": 100}},
    }
    assert send(apiserver, "POST", quotas, stored, "application/json")[0] == 201
    patch = {"spec": {"colour": "blue", "hard": {"extra": 1}}}
    code, body = send(
        apiserver,
        "PATCH",
        f"{quotas}/q?fieldValidation=Strict",
        patch,
        "application/merge-patch+json",
    )
    # As the real server (v1.37.2) answered: 422 naming the patch and the patched object.
    assert (code, body["reason"]) == (422, "Invalid")
    [cause] = body["details"]["causes"]
    assert (cause["field"], cause["reason"]) == ("patch", "FieldValueInvalid")
    assert body["message"].startswith(' "" is invalid: patch: Invalid value: "{')
    assert body["message"].endswith(
        'strict decoding error: unknown field "spec.colour", unknown field "spec.hard.extra"'
    )
    # Without Strict the same patch is pruned, as the real server does.
    code, body = send(apiserver, "PATCH", f"{quotas}/q", patch, "application/merge-patch+json")
    assert (code, body["spec"]) == (200, {"hard": {"cores": 100}})


def test_normalized_orders_causes_and_the_message_list_alike() -> None:
    causes = [
        {"field": "spec.b", "message": "Invalid value: 1: bad", "reason": "FieldValueInvalid"},
        {"field": "spec.a", "message": "Required value", "reason": "FieldValueRequired"},
    ]
    body = {
        "kind": "Status",
        "message": 'X "x" is invalid: [spec.b: Invalid value: 1: bad, spec.a: Required value]',
        "details": {"causes": causes},
    }
    out = normalized(body)
    assert [c["field"] for c in out["details"]["causes"]] == ["spec.a", "spec.b"]
    assert out["message"] == (
        'X "x" is invalid: [spec.a: Required value, spec.b: Invalid value: 1: bad]'
    )
    assert body["details"]["causes"] is causes and causes[0]["field"] == "spec.b"  # not mutated
