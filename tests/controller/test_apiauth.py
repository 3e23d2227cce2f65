"""JSON API authorization: bearer tokens and their audience, the decision cache, failing
closed, and a flood of random tokens against the real servers."""

from __future__ import annotations

import http.client
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controller.apiauth import MAX_TOKEN_BYTES, AllowAll, KubeAuthorizer
from controller.httpapi import serve_api, serve_probes
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest
from sharegpuctl.local.apiserver import KubeAPIServer
from tests.helpers import PATIENCE_S, eventually


@pytest.fixture
def authorizer(kube: KubeRest) -> Iterator[tuple[KubeAuthorizer, FakeClock]]:
    clock = FakeClock()
    yield KubeAuthorizer(kube, clock=clock, ttl_s=10.0, max_entries=3), clock


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer   ",
        "Bearer " + "x" * (MAX_TOKEN_BYTES + 1),
    ],
)
def test_requests_without_a_usable_bearer_token_are_401_without_a_review(
    apiserver: KubeAPIServer,
    authorizer: tuple[KubeAuthorizer, FakeClock],
    header: str | None,
) -> None:
    decision = authorizer[0].decide(header)
    assert decision.code == 401
    assert apiserver.request_count("create", "tokenreviews") == 0


def test_decisions_expire_after_the_ttl(
    apiserver: KubeAPIServer, authorizer: tuple[KubeAuthorizer, FakeClock]
) -> None:
    auth, clock = authorizer
    apiserver.reviews.add_token("t", "alice", audiences=("sharegpu.dev",))
    assert auth.decide("Bearer t").code == 403
    apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
    assert auth.decide("Bearer t").code == 403  # cached
    clock.advance(10.0)
    decision = auth.decide("Bearer t")
    assert (decision.code, decision.user) == (200, "alice")


def test_the_cache_is_bounded_and_keeps_no_token(
    apiserver: KubeAPIServer, authorizer: tuple[KubeAuthorizer, FakeClock]
) -> None:
    auth, _ = authorizer
    for i in range(50):
        assert auth.decide(f"Bearer random-{i}").code == 401
    assert len(auth._cache) == 3
    assert all(len(key) == 32 and b"random" not in key for key in auth._cache)


def test_an_unreachable_api_server_fails_closed_and_is_not_cached(
    apiserver: KubeAPIServer, authorizer: tuple[KubeAuthorizer, FakeClock]
) -> None:
    auth, _ = authorizer
    apiserver.reviews.add_token("t", "alice", audiences=("sharegpu.dev",))
    apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
    apiserver.inject_fault("create", "tokenreviews", code=500, times=1)
    assert auth.decide("Bearer t").code == 503
    assert auth.decide("Bearer t").code == 200


def test_allow_all_serves_everyone() -> None:
    assert AllowAll().decide(None).code == 200


def test_the_review_asks_for_the_apis_own_audience(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    """A token for the Kubernetes API is no key to the JSON API: clients send one bound to the
    API's audience (configurable), so a token the API sees cannot be replayed elsewhere."""
    auth = KubeAuthorizer(kube, audience="gpus.example.com")
    apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
    apiserver.reviews.add_token("kube", "alice")  # the API server's own audience
    apiserver.reviews.add_token("other", "alice", audiences=("sharegpu.dev",))
    apiserver.reviews.add_token("bound", "alice", audiences=("gpus.example.com",))
    for token in ("kube", "other"):
        decision = auth.decide(f"Bearer {token}")
        assert decision.code == 401 and "audience 'gpus.example.com'" in decision.reason
    assert auth.decide("Bearer bound").code == 200


class CountingRest(KubeRest):
    """The real client, counting the TokenReviews in flight."""

    def __init__(self, inner: KubeRest) -> None:
        self.__dict__.update(inner.__dict__)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if not path.endswith("/tokenreviews"):
            return super().request(method, path, **kw)
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            return super().request(method, path, **kw)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_a_flood_of_random_tokens_is_bounded_and_the_probes_answer(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    """The attack: 48 clients from four addresses send random bearer tokens as fast as they
    are answered, against an API server that takes a second per TokenReview. Each token used
    to cost a review at once (48 in flight) and /healthz failed most probes. Now at most 4
    reviews are in flight, the rest are answered 429 at once, and every probe of the probe
    port is answered."""
    apiserver.inject_fault("create", "tokenreviews", action="delay", delay_s=1.0, times=None)
    rest = CountingRest(kube)
    auth = KubeAuthorizer(rest, max_reviews=4, review_wait_s=0.2)
    api = serve_api("127.0.0.1:0", lambda _node: [], lambda: True, authorizer=auth)
    probes = serve_probes("127.0.0.1:0", lambda: True)
    stop = threading.Event()
    codes: list[int] = []

    def flood(source: str) -> None:
        while not stop.is_set():
            conn = http.client.HTTPConnection(
                "127.0.0.1", api.port, timeout=30, source_address=(source, 0)
            )
            try:
                conn.request(
                    "GET",
                    "/api/v1/gpus",
                    headers={"Authorization": f"Bearer {secrets.token_hex(16)}"},
                )
                resp = conn.getresponse()
                resp.read()
                codes.append(resp.status)
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()

    flooders = [
        threading.Thread(target=flood, args=(f"127.0.0.{2 + i % 4}",), daemon=True)
        for i in range(48)
    ]
    for thread in flooders:
        thread.start()
    answered = []
    try:
        deadline = time.monotonic() + 30
        while rest.in_flight < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(30):
            conn = http.client.HTTPConnection("127.0.0.1", probes.port, timeout=30)
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                answered.append((resp.status, resp.read()))
            finally:
                conn.close()
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in flooders:
            thread.join(30)
        api.stop()
        probes.stop()
    assert answered == [(200, b"ok\n")] * 30
    assert 1 <= rest.peak <= 4
    assert 429 in codes and set(codes) <= {401, 429}


class HeldRest(KubeRest):
    """The real client; each TokenReview of a token starting ``flood-`` waits for a permit."""

    def __init__(self, inner: KubeRest) -> None:
        self.__dict__.update(inner.__dict__)
        self._lock = threading.Lock()
        self.permits = threading.Semaphore(0)
        self.in_flight = 0
        self.completed = 0

    def request(self, method: str, path: str, **kw: Any) -> Any:
        token = str(((kw.get("body") or {}).get("spec") or {}).get("token", ""))
        if not path.endswith("/tokenreviews") or not token.startswith("flood-"):
            return super().request(method, path, **kw)
        with self._lock:
            self.in_flight += 1
        try:
            assert self.permits.acquire(timeout=PATIENCE_S * 4)
            return super().request(method, path, **kw)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.completed += 1


FLOODERS = [f"10.0.0.{i}" for i in range(4)]


def test_a_flood_of_uncached_tokens_from_four_addresses_leaves_another_client_its_turn(
    apiserver: KubeAPIServer, kube: KubeRest
) -> None:
    """The attack: four addresses send random bearer tokens without pause, so every
    TokenReview slot is always taken and more wait; a legitimate client whose token is not
    cached used to wait behind all of them and get 429. Now each address has one review in
    flight or waiting (another is 429 at once), so the client, from another address, takes the
    first slot that comes free, however the flood goes on."""
    apiserver.reviews.add_token("good", "alice", audiences=("sharegpu.dev",))
    apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
    rest = HeldRest(kube)
    auth = KubeAuthorizer(rest, max_reviews=4, review_wait_s=PATIENCE_S * 4)
    serial = iter(range(10**6))

    def flood(peer: str) -> Any:
        return pool.submit(auth.decide, f"Bearer flood-{next(serial)}", peer)

    with ThreadPoolExecutor(max_workers=64) as pool:
        try:
            flooding = [flood(peer) for peer in FLOODERS]
            eventually(lambda: rest.in_flight == 4)
            for peer in FLOODERS * 3:  # more from each address is not waited for
                assert flood(peer).result(PATIENCE_S).code == 429
            legit = pool.submit(auth.decide, "Bearer good", "10.0.0.9")
            eventually(lambda: auth.reviews.waiting("10.0.0.9") == 1)
            rest.permits.release()  # one flood review ends: its slot is the client's
            decision = legit.result(PATIENCE_S)
            assert rest.completed == 1
            flooding += [flood(peer) for peer in FLOODERS]  # the flood goes on
        finally:
            for _ in range(200):
                rest.permits.release()
        assert (decision.code, decision.user) == (200, "alice")
        codes = {f.result(PATIENCE_S).code for f in flooding}
    assert codes <= {401, 429}


def test_plain_functions_serve_the_list_and_readiness() -> None:
    """The GPU lister and the readiness check may be plain functions (they used to be bound to
    the handler and called with it: every list answered with a dropped connection)."""
    api = serve_api("127.0.0.1:0", lambda node: [{"node": node}], lambda: False)
    try:
        for path, expected in (("/api/v1/nodes/n1/gpus", 200), ("/readyz", 503)):
            conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=PATIENCE_S)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
            finally:
                conn.close()
            assert resp.status == expected, body
        assert b'"node": "n1"' in http_get(api.port, "/api/v1/nodes/n1/gpus")
    finally:
        api.stop()


def http_get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE_S)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()
