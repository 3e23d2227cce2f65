"""The API server's connections to the real webhook over HTTPS: verified by their client
certificate at the handshake, they are served from a pool of their own, so the per-address cap
(which the API server's address used to share with every review of every tenant) never refuses
them, while a client without the certificate is still capped; and each review's compiles are
counted against the user the API server names in ``request.userInfo``, a client without the
certificate against its address."""

from __future__ import annotations

import http.client
import ssl
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from controller.webhook import (
    AdmissionHandler,
    WebhookServer,
    requester_key,
)
from sharegpu.admission.checks import Finding
from sharegpu.kube import httpserve
from tests.controller.webhook_helpers import (
    DRIVER,
    claim,
    exactly,
    post_claim_review,
    webhook_tls,
)
from tests.helpers import PATIENCE_S, eventually


class Blocking(AdmissionHandler):
    """The real handler; the checks of a claim named ``block`` wait for :attr:`release`, and
    every review's requester is recorded."""

    def __init__(self) -> None:
        super().__init__(DRIVER)
        self.release = threading.Event()
        self.blocked = 0
        self.requesters: list[str] = []
        self._count_lock = threading.Lock()

    def bounded_findings(
        self, kind: str, obj: dict[str, Any], requester: str = ""
    ) -> list[Finding]:
        with self._count_lock:
            self.requesters.append(requester)
        if obj["metadata"]["name"] == "block":
            with self._count_lock:
                self.blocked += 1
            assert self.release.wait(PATIENCE_S)
        return super().bounded_findings(kind, obj, requester)


@dataclass
class Hook:
    server: WebhookServer
    handler: Blocking
    serving_ca: trustme.CA
    client_ca: trustme.CA

    def post(
        self, name: str, client: trustme.LeafCert | None = None, user: str = "alice"
    ) -> dict[str, Any]:
        context = ssl.create_default_context()
        self.serving_ca.configure_trust(context)
        if client is not None:
            client.configure_cert(context)
        obj = claim(exactly())
        obj["metadata"]["name"] = name
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                "operation": "CREATE",
                "namespace": "default",
                "userInfo": {"username": user},
                "object": obj,
            },
        }
        return post_claim_review(self.server.port, context, body, PATIENCE_S)


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Hook]:
    tls = webhook_tls(tmp_path)
    serving_ca, client_ca, certs = tls.serving_ca, tls.client_ca, tls.certs
    handler = Blocking()
    limits = httpserve.ServerLimits(
        request_timeout_s=PATIENCE_S, max_connections=4, max_connections_per_peer=2
    )
    server = WebhookServer("127.0.0.1:0", handler, certs, limits).start()
    try:
        yield Hook(server, handler, serving_ca, client_ca)
    finally:
        handler.release.set()
        server.stop()


def fill_the_cap(hook: Hook, pool: ThreadPoolExecutor) -> list[Future[dict[str, Any]]]:
    """Two reviews without a client certificate from 127.0.0.1, held in their checks: every
    slot of that address is taken, and neither is a staller that could be evicted."""
    held = [pool.submit(hook.post, "block") for _ in range(2)]
    eventually(lambda: hook.handler.blocked == 2)
    return held


def test_the_api_servers_connections_are_served_when_its_address_is_at_the_cap(
    hook: Hook,
) -> None:
    """The attack: every slot of the API server's address is held (by a tenant's slow reviews
    that the API server forwards, here by two held reviews). A review the API server sends next
    used to be closed at once (the webhook's failurePolicy then let the claim pass unchecked);
    with its client certificate it is served from its own pool now, again and again."""
    apiserver = hook.client_ca.issue_cert("kube-apiserver")
    with ThreadPoolExecutor(max_workers=4) as pool:
        held = fill_the_cap(hook, pool)
        for i in range(5):
            assert hook.post(f"plain-{i}", apiserver)["allowed"] is True
        assert hook.server.rejected == 0
        hook.handler.release.set()
        assert all(f.result(PATIENCE_S)["allowed"] for f in held)


def test_a_burst_of_the_api_servers_connections_beyond_the_cap_is_queued_not_closed(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve reviews of the API server at once (a tenant creating claims concurrently makes it
    open that many connections) against a cap of two per address, all held in their checks
    until every one has arrived. Beyond the cap a connection used to be closed, or evict a
    handshake in progress; now it waits for a handshake slot and all twelve are answered."""
    monkeypatch.setattr(httpserve, "HANDSHAKE_GRACE_S", PATIENCE_S * 4)  # no eviction at all
    apiserver = hook.client_ca.issue_cert("kube-apiserver")
    with ThreadPoolExecutor(max_workers=12) as pool:
        burst = [pool.submit(hook.post, "block", apiserver) for _ in range(12)]
        eventually(lambda: hook.handler.blocked == 12)
        hook.handler.release.set()
        assert all(f.result(PATIENCE_S)["allowed"] for f in burst)
    assert (hook.server.rejected, hook.server.evicted) == (0, 0)


def test_a_client_without_the_certificate_is_still_capped(hook: Hook) -> None:
    """A third connection without the API server's certificate from the same address is closed
    once its handshake shows it is not the API server's."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        held = fill_the_cap(hook, pool)
        with pytest.raises((OSError, http.client.HTTPException)):
            hook.post("third")
        assert hook.server.rejected == 1
        stranger = trustme.CA().issue_cert("kube-apiserver")  # another CA: no handshake
        with pytest.raises((OSError, http.client.HTTPException)):
            hook.post("forged", stranger)
        hook.handler.release.set()
        assert all(f.result(PATIENCE_S)["allowed"] for f in held)


def test_compiles_are_counted_per_user_only_for_the_api_servers_reviews(hook: Hook) -> None:
    """The API server's reviews are counted against the user they name; a review without its
    certificate against the address it came from, whatever user it claims to be."""
    apiserver = hook.client_ca.issue_cert("kube-apiserver")
    hook.post("a", apiserver, user="alice")
    hook.post("b", apiserver, user="bob")
    hook.post("c", None, user="bob")
    assert hook.handler.requesters == ["user alice", "user bob", "peer 127.0.0.1"]


def test_the_requester_key_bounds_what_it_keeps() -> None:
    assert requester_key({"userInfo": {"username": "x" * 10_000}}) == "user " + "x" * 512
    assert requester_key({"userInfo": {"username": 3}}) == "user "
    assert requester_key({}) == "user "
