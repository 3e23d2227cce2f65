"""The embedded API server's hooks for the demo cluster: validating admission (the judged
object is the stored one), ``pods/log``, and kinds served only to be refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.errors import ApiError
from sharegpuctl.local.apiserver.resources import ResourceType, default_resources, refused_kinds
from sharegpuctl.local.apiserver.server import Admission


@pytest.fixture
def judged() -> Iterator[tuple[KubeAPIServer, list[tuple[str, dict[str, Any], bool]]]]:
    seen: list[tuple[str, dict[str, Any], bool]] = []

    def admit(operation: str, rt: ResourceType, obj: dict[str, Any], dry_run: bool) -> list[str]:
        seen.append((operation, obj, dry_run))
        if (obj["metadata"].get("labels") or {}).get("refuse"):
            raise ApiError(403, "refused by the test hook")
        return ["first warning", 'a "quoted" one']

    resources = [*default_resources(), *refused_kinds(lambda kind: f"no {kind}s here")]
    server = KubeAPIServer(
        resources=resources,
        admission=Admission(lambda rt: rt.plural == "namespaces", admit),
        pod_logs=lambda ns, name, container: f"logs of {ns}/{name} {container}\n",
    )
    with server:
        yield server, seen


def _post(server: KubeAPIServer, path: str, body: dict[str, Any]) -> urllib3.BaseHTTPResponse:
    return urllib3.request(
        "POST",
        server.url + path,
        body=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )


def test_the_admitted_object_is_the_one_stored(
    judged: tuple[KubeAPIServer, list[tuple[str, dict[str, Any], bool]]],
) -> None:
    server, seen = judged
    resp = _post(server, "/api/v1/namespaces", {"metadata": {"generateName": "team-"}})
    assert resp.status == 201
    assert resp.headers["Warning"] == '299 - "first warning", 299 - "a \\"quoted\\" one"'
    stored = json.loads(resp.data)
    ((operation, judged_obj, dry_run),) = seen
    assert (operation, dry_run) == ("CREATE", False)
    # the generated name and the uid the hook saw are those stored (quota charges key on them)
    assert judged_obj["metadata"]["name"] == stored["metadata"]["name"]
    assert judged_obj["metadata"]["uid"] == stored["metadata"]["uid"]


def test_a_refused_write_stores_nothing(
    judged: tuple[KubeAPIServer, list[tuple[str, dict[str, Any], bool]]],
) -> None:
    server, seen = judged
    resp = _post(
        server, "/api/v1/namespaces", {"metadata": {"name": "no", "labels": {"refuse": "yes"}}}
    )
    assert resp.status == 403 and json.loads(resp.data)["message"] == "refused by the test hook"
    assert server.store.get("namespaces", "no") is None
    # resources the hook does not review are written without it
    resp = _post(server, "/api/v1/namespaces/default/events", {"metadata": {"name": "e"}})
    assert resp.status == 201 and len(seen) == 1


def test_pod_logs_come_from_the_hook(
    judged: tuple[KubeAPIServer, list[tuple[str, dict[str, Any], bool]]],
) -> None:
    server, _ = judged
    missing = urllib3.request("GET", server.url + "/api/v1/namespaces/default/pods/p/log")
    assert missing.status == 404
    server.store.create("pods", {"metadata": {"name": "p", "namespace": "default"}, "spec": {}})
    resp = urllib3.request("GET", server.url + "/api/v1/namespaces/default/pods/p/log?container=c")
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/plain"
    assert resp.data == b"logs of default/p c\n"


def test_refused_kinds_are_served_only_to_say_why(
    judged: tuple[KubeAPIServer, list[tuple[str, dict[str, Any], bool]]],
) -> None:
    server, _ = judged
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
    resp = _post(server, "/apis/apps/v1/namespaces/default/deployments", body)
    status = json.loads(resp.data)
    assert resp.status == 405 and status["reason"] == "MethodNotAllowed"
    assert status["message"] == "no Deployments here"
    listed = urllib3.request("GET", server.url + "/apis/apps/v1/namespaces/default/deployments")
    assert listed.status == 200 and json.loads(listed.data)["items"] == []
    resp = _post(server, "/api/v1/namespaces/default/services", {"metadata": {"name": "s"}})
    assert resp.status == 405 and json.loads(resp.data)["message"] == "no Services here"
