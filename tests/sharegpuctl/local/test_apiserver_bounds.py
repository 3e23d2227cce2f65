"""The embedded API server's edge: loopback only, TLS with a bearer token, bounded request
bodies, stored objects and strategic merges, YAML without aliases."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, watch

from sharegpuctl.local.apiserver import KubeAPIServer
from sharegpuctl.local.apiserver.bounds import MAX_BODY_BYTES, MAX_OBJECT_BYTES
from sharegpuctl.local.apiserver.builtinschema import definition
from sharegpuctl.local.apiserver.strategicpatch import strategic_merge

TOKEN = "a-test-token-0123456789"


@pytest.fixture
def secured() -> Iterator[KubeAPIServer]:
    with KubeAPIServer(token=TOKEN, tls=True) as server:
        yield server


def _pool(server: KubeAPIServer, tmp_path: Path) -> urllib3.PoolManager:
    assert server.serving_cert is not None
    ca = tmp_path / "ca.crt"
    ca.write_bytes(server.serving_cert.cert_pem)
    return urllib3.PoolManager(ca_certs=str(ca), cert_reqs="CERT_REQUIRED")


def _status(resp: urllib3.BaseHTTPResponse) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(resp.data)
    return body


def test_only_loopback_addresses_are_served() -> None:
    with pytest.raises(ValueError, match="not a loopback address"):
        KubeAPIServer(host="0.0.0.0")
    with KubeAPIServer() as server:
        assert server.url.startswith("http://127.0.0.1:")


def test_every_request_needs_the_token(secured: KubeAPIServer, tmp_path: Path) -> None:
    pool = _pool(secured, tmp_path)
    assert secured.url.startswith("https://127.0.0.1:")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        for path in ("/api", "/api/v1/namespaces", "/openapi/v3", "/version"):
            resp = pool.request("GET", secured.url + path, headers=headers)
            assert resp.status == 401, (path, headers)
            assert _status(resp)["reason"] == "Unauthorized"
    resp = pool.request(
        "POST",
        secured.url + "/api/v1/namespaces",
        body=json.dumps({"metadata": {"name": "sneaky"}}),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 401 and secured.store.get("namespaces", "sneaky") is None
    ok = pool.request(
        "GET", secured.url + "/api/v1/namespaces", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert ok.status == 200 and _status(ok)["kind"] == "NamespaceList"


def test_the_client_and_its_watches_work_over_tls(secured: KubeAPIServer) -> None:
    with secured.client() as api_client:
        core = client.CoreV1Api(api_client)
        names = [n.metadata.name for n in core.list_namespace().items]
        assert "default" in names
        secured.store.create("namespaces", {"metadata": {"name": "watched"}})
        stream = watch.Watch().stream(core.list_namespace, timeout_seconds=5)
        seen = {e["object"].metadata.name for e in stream}
        assert "watched" in seen


def test_plain_http_gets_no_answer_from_a_tls_server(secured: KubeAPIServer) -> None:
    plain = secured.url.replace("https://", "http://") + "/api"
    with pytest.raises(urllib3.exceptions.HTTPError):
        urllib3.request("GET", plain, retries=False)


def test_the_kubeconfig_holds_token_and_ca_and_only_its_owner_reads_it(
    secured: KubeAPIServer, tmp_path: Path
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("old")
    path.chmod(0o644)
    secured.write_kubeconfig(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    assert config["users"][0]["user"]["token"] == TOKEN
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == secured.url and cluster["certificate-authority-data"]


def _raw(server: KubeAPIServer, request: bytes) -> bytes:
    """Send ``request`` over a plain socket and read the answer until the server closes."""
    host, port = "127.0.0.1", server.port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_body_over_the_limit_is_refused_unread(apiserver: KubeAPIServer) -> None:
    # only the headers are sent: the server answers without waiting for the 64 MiB
    declared = 64 * 1024 * 1024
    answer = _raw(
        apiserver,
        b"POST /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\n" + f"Content-Length: {declared}\r\n\r\n".encode(),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    status = json.loads(body)
    assert status["reason"] == "RequestEntityTooLarge"
    assert str(MAX_BODY_BYTES) in status["message"]
    assert apiserver.store.count("pods") == 0


def _pod(name: str, env_value_bytes: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "env": [{"name": "BIG", "value": "x" * env_value_bytes}],
                }
            ]
        },
    }


def test_an_object_over_the_stored_limit_is_refused(apiserver: KubeAPIServer) -> None:
    pool = urllib3.PoolManager()
    big = _pod("big", MAX_OBJECT_BYTES)  # under the body limit, over the object limit
    resp = pool.request(
        "POST",
        apiserver.url + "/api/v1/namespaces/default/pods",
        body=json.dumps(big),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 413 and "too large to store" in _status(resp)["message"]
    assert apiserver.store.get("pods", "big", "default") is None
    # nor can patches grow an object past it, a step at a time
    apiserver.store.create("pods", _pod("grows"))
    codes = []
    for _ in range(3):
        patch = {"metadata": {"annotations": {f"a{len(codes)}": "y" * (MAX_OBJECT_BYTES // 2)}}}
        resp = pool.request(
            "PATCH",
            apiserver.url + "/api/v1/namespaces/default/pods/grows",
            body=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        codes.append(resp.status)
    assert codes == [200, 413, 413]
    stored = apiserver.store.get("pods", "grows", "default")
    assert stored is not None and len(json.dumps(stored)) <= MAX_OBJECT_BYTES


def test_yaml_aliases_are_refused(apiserver: KubeAPIServer) -> None:
    # a billion-laughs document: 1 KiB that expands to 10^9 strings
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 10) + "]")
    bomb = ("metadata: {name: bomb}\n" + "\n".join(lines) + "\n").encode()
    assert len(bomb) < 1024
    resp = urllib3.request(
        "POST",
        apiserver.url + "/api/v1/namespaces",
        body=bomb,
        headers={"Content-Type": "application/yaml"},
    )
    assert resp.status == 400
    assert "YAML aliases are not accepted" in _status(resp)["message"]
    assert apiserver.store.get("namespaces", "bomb") is None
    # YAML without aliases is still read
    resp = urllib3.request(
        "POST",
        apiserver.url + "/api/v1/namespaces",
        body=b"metadata:\n  name: plain\n",
        headers={"Content-Type": "application/yaml"},
    )
    assert resp.status == 201 and apiserver.store.get("namespaces", "plain") is not None


class _CountingKey(str):
    """A merge key value that counts how often it is compared."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        _CountingKey.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_strategic_merge_does_linear_work_in_the_lists_lengths(
    apiserver: KubeAPIServer,
) -> None:
    n = 2000
    schema = definition(apiserver.store.registry.get("pods"))
    assert schema is not None
    old = _pod("p")
    old["spec"]["containers"][0]["env"] = [
        {"name": _CountingKey(f"E{i}"), "value": "old"} for i in range(n)
    ]
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "env": [{"name": _CountingKey(f"E{i}"), "value": "new"} for i in range(n)]
                    + [{"name": "E0", "$patch": "delete"}]
                    + [{"name": _CountingKey(f"N{i}"), "value": "added"} for i in range(n)],
                }
            ]
        }
    }
    _CountingKey.comparisons = 0
    merged = strategic_merge(old, patch, schema)
    env = merged["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == [f"E{i}" for i in range(1, n)] + [f"N{i}" for i in range(n)]
    assert all(e["value"] == "new" for e in env[: n - 1])
    # a search per patch element would compare ~n^2/2 = 2,000,000 times
    assert _CountingKey.comparisons <= 4 * n


def test_tls_handshake_is_required_before_any_request(secured: KubeAPIServer) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", secured.port), timeout=30) as raw,
        context.wrap_socket(raw) as tls,
    ):
        tls.sendall(b"GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401")
