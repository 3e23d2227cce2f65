"""sharegpu.kube.rest: where the connection settings come from, and the JSON request and watch
client."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from sharegpu.kube.rest import (
    KubeApiError,
    KubeConfigError,
    KubeRest,
    _event_lines,
    kubeconfig_path,
    load_api_client,
    resource_path,
)
from sharegpuctl.local.apiserver import KubeAPIServer

NODES = resource_path("", "v1", "nodes")


class Failures:
    """An ``on_error`` hook that records what it sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def __call__(self, verb: str, resource: str, status: int) -> None:
        self.seen.append((verb, resource, status))


def test_kubeconfig_flag_then_first_path_of_the_environment(tmp_path: Path) -> None:
    env = {"KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}
    assert kubeconfig_path("/flag", env) == "/flag"
    assert kubeconfig_path(None, env) == f"{tmp_path}/a"
    assert kubeconfig_path(None, {"KUBECONFIG": ""}) is None
    assert kubeconfig_path(None, {}) is None


def test_config_errors_name_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "none"
    with pytest.raises(KubeConfigError, match=rf"kubeconfig {missing} \(from --kubeconfig\)"):
        load_api_client(str(missing), {})
    with pytest.raises(KubeConfigError, match=r"\(from \$KUBECONFIG\) does not exist"):
        load_api_client(None, {"KUBECONFIG": str(missing)})
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    with pytest.raises(KubeConfigError, match=rf"cannot use kubeconfig {broken}") as err:
        load_api_client(str(broken), {})
    assert "\n" not in str(err.value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="not running in a cluster"):
        load_api_client(None, {})


def test_requests_lists_and_http_errors(apiserver: KubeAPIServer, tmp_path: Path) -> None:
    api = load_api_client(apiserver.write_kubeconfig(tmp_path / "kubeconfig"), {})
    failures = Failures()
    rest = KubeRest(api, on_error=failures)
    try:
        for name in ("n1", "n2", "n3"):
            rest.request("POST", NODES, body={"metadata": {"name": name}})
        items, version = rest.list_all(NODES, page_size=2)
        assert sorted(i["metadata"]["name"] for i in items) == ["n1", "n2", "n3"]
        assert version
        with pytest.raises(KubeApiError) as err:
            rest.get(f"{NODES}/absent", expected=(404,))
        assert (err.value.status, err.value.reason) == (404, "NotFound")
        assert str(err.value).startswith(f"GET {NODES}/absent: HTTP 404 NotFound: ")
        assert failures.seen == []  # an expected status is not a failure
        with pytest.raises(KubeApiError) as err:
            rest.request("POST", NODES, body={"metadata": {"name": "n1"}})
        assert err.value.status == 409
        assert failures.seen == [("post", "nodes", 409)]
    finally:
        api.close()


def test_no_answer_is_status_zero(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = False
    failures = Failures()
    with kubernetes.client.ApiClient(configuration) as api, pytest.raises(KubeApiError) as err:
        KubeRest(api, on_error=failures, timeout_s=5.0).get(NODES)
    assert err.value.status == 0
    assert str(err.value).startswith(f"GET {NODES}: ")
    assert failures.seen == [("get", "nodes", 0)]


def test_watch_yields_events_and_raises_on_an_error_event(
    apiserver: KubeAPIServer, kube_client: kubernetes.client.ApiClient
) -> None:
    failures = Failures()
    rest = KubeRest(kube_client, on_error=failures)
    first = rest.request("POST", NODES, body={"metadata": {"name": "n1"}})
    old = first["metadata"]["resourceVersion"]
    rest.request("POST", NODES, body={"metadata": {"name": "n2"}})
    registered: list[object] = []
    events = list(
        rest.watch(
            NODES, [("resourceVersion", old), ("timeoutSeconds", "1")], 30.0, registered.append
        )
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "n2")]
    assert len(registered) == 1
    apiserver.store.compact()
    with pytest.raises(KubeApiError) as err:
        list(rest.watch(NODES, [("resourceVersion", old), ("timeoutSeconds", "1")], 30.0))
    assert (err.value.status, err.value.reason) == (410, "Expired")
    assert str(err.value).startswith(f"WATCH {NODES}: HTTP 410 Expired: ")
    assert failures.seen == []  # 410 is routine: the caller relists


class Chunks:
    """A streamed answer that arrives in the given chunks."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks


@pytest.mark.parametrize(
    "chunks",
    [
        (b'{"a":1}\n{"b":2}\n\n{"c":3}',),
        (b'{"a"', b":1}\n", b'{"b":2}\n\n{"c"', b":3}"),
        (b'{"a":1}\n', b'{"b":2}', b"\n", b"\n", b'{"c":3}\n'),
        tuple(bytes([c]) for c in b'{"a":1}\n{"b":2}\n{"c":3}\n'),
    ],
)
def test_watch_lines_are_split_wherever_the_chunks_end(chunks: tuple[bytes, ...]) -> None:
    lines = list(_event_lines(Chunks(*chunks)))  # type: ignore[arg-type]
    assert lines == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
