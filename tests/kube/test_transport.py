"""sharegpu.kube.transport: requests through the official client's pool with its host and auth,
the token refreshed when due (not on every request), one resend after a 401."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes.client
import pytest

from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeApiError, KubeRest
from sharegpu.kube.transport import REFRESH_INTERVAL_S, Transport, encode_query


@dataclass
class Seen:
    """One request as the recording server received it."""

    method: str
    path: str
    authorization: str
    content_type: str
    user_agent: str
    body: bytes


@dataclass
class Recorder:
    """A local HTTP server that records requests; ``status_for(seen)`` picks each answer."""

    status_for: Callable[[Seen], int] = lambda _seen: 200
    seen: list[Seen] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(
                self.command,
                self.path,
                self.headers.get("Authorization", ""),
                self.headers.get("Content-Type", ""),
                self.headers.get("User-Agent", ""),
                self.rfile.read(length),
            )
            rec.seen.append(seen)
            status = rec.status_for(seen)
            body = json.dumps({"kind": "Status", "code": status, "reason": "R"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


class Tokens:
    """A token-refresh hook (as the kubeconfig and in-cluster loaders install one): each call
    counts and moves to the next token."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, configuration: kubernetes.client.Configuration) -> None:
        self.calls += 1
        configuration.api_key["BearerToken"] = f"t{self.calls}"


def client_for(url: str, hook: Tokens | None = None) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = url
    configuration.retries = False
    configuration.api_key["BearerToken"] = "t0"
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    # The official loaders install such a hook; its attribute is typed None by the client.
    setattr(configuration, "refresh_api_key_hook", hook)  # noqa: B010
    return kubernetes.client.ApiClient(configuration)


def get(transport: Transport) -> int:
    """GET a collection; returns the status (the answer read, the connection released)."""
    response = transport.request("GET", "/api/v1/nodes", timeout=5.0)
    response.read()
    response.release_conn()
    return response.status


def test_the_token_is_refreshed_when_due_not_per_request(recorder: Recorder) -> None:
    tokens, clock = Tokens(), FakeClock()
    with client_for(recorder.url, tokens) as api:
        transport = Transport(api, clock=clock)
        for _ in range(5):
            get(transport)
        assert tokens.calls == 1
        clock.advance(REFRESH_INTERVAL_S - 0.1)
        get(transport)
        assert tokens.calls == 1
        clock.advance(0.1)
        get(transport)
        assert tokens.calls == 2
    assert [s.authorization for s in recorder.seen] == ["Bearer t1"] * 6 + ["Bearer t2"]


def test_kube_rest_does_not_run_the_refresh_hook_on_every_request(recorder: Recorder) -> None:
    tokens = Tokens()
    with client_for(recorder.url, tokens) as api:
        rest = KubeRest(api)
        for _ in range(20):
            rest.get("/api/v1/nodes")
    # The official client's per-request path runs the hook 20 times; the transport once per
    # refresh interval (30 s), so at most twice even on a very slow machine.
    assert len(recorder.seen) == 20
    assert tokens.calls <= 2


def test_a_401_is_sent_once_more_with_fresh_headers(recorder: Recorder) -> None:
    tokens, clock = Tokens(), FakeClock()
    recorder.status_for = lambda seen: 401 if seen.authorization == "Bearer t1" else 200
    with client_for(recorder.url, tokens) as api:
        response = Transport(api, clock=clock).request(
            "PUT", "/api/v1/nodes/n1", body=b'{"a": 1}', timeout=5.0
        )
        assert response.status == 200
        response.read()
        response.release_conn()
    assert [(s.method, s.authorization, s.body) for s in recorder.seen] == [
        ("PUT", "Bearer t1", b'{"a": 1}'),
        ("PUT", "Bearer t2", b'{"a": 1}'),
    ]


def test_a_second_401_is_the_answer(recorder: Recorder) -> None:
    recorder.status_for = lambda _seen: 401
    failures: list[tuple[str, str, int]] = []
    with client_for(recorder.url, Tokens()) as api:
        rest = KubeRest(api, on_error=lambda *f: failures.append(f))
        with pytest.raises(KubeApiError) as err:
            rest.get("/api/v1/nodes")
    assert err.value.status == 401
    assert len(recorder.seen) == 2
    assert failures == [("get", "nodes", 401)]


def test_headers_body_and_query_as_the_official_client_sends_them(recorder: Recorder) -> None:
    with client_for(recorder.url) as api:
        rest = KubeRest(api)
        rest.request("POST", "/api/v1/nodes", body={"metadata": {"name": "ü"}})
        rest.get("/api/v1/nodes", [("labelSelector", "a in (b,c)"), ("fieldSelector", "x=y/z")])
        user_agent = api.default_headers["User-Agent"]
    post, get = recorder.seen
    assert (post.content_type, post.authorization, post.user_agent) == (
        "application/json",
        "Bearer t0",
        user_agent,
    )
    assert json.loads(post.body) == {"metadata": {"name": "ü"}}
    assert (get.content_type, get.body) == ("", b"")
    assert get.path == "/api/v1/nodes?labelSelector=a%20in%20%28b%2Cc%29&fieldSelector=x%3Dy/z"


@pytest.mark.parametrize(
    "query",
    [
        [("limit", "500"), ("continue", "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ==")],
        [("labelSelector", "app in (a, b),!x"), ("fieldSelector", "spec.nodeName=n/1")],
        [("watch", "true"), ("resourceVersion", "12"), ("timeoutSeconds", "300")],
        [("q", "ü&=?#+%")],
    ],
)
def test_query_encoding_is_the_official_clients(query: list[tuple[str, str]]) -> None:
    with kubernetes.client.ApiClient() as api:
        assert encode_query(query) == api.parameters_to_url_query(query, {})


def test_closing_the_api_client_closes_the_connections(recorder: Recorder) -> None:
    api = client_for(recorder.url)
    KubeRest(api).get("/api/v1/nodes")
    pools = api.rest_client.pool_manager.pools
    assert len(pools) == 1
    api.close()
    assert len(pools) == 0
