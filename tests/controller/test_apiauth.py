"""JSON API authorization: bearer tokens, the decision cache and failing closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.apiauth import MAX_TOKEN_BYTES, AllowAll, KubeAuthorizer
from sharegpu.kube.clock import FakeClock
from sharegpu.kube.rest import KubeRest
from sharegpu.local.apiserver import KubeAPIServer


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
    apiserver.reviews.add_token("t", "alice")
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
    apiserver.reviews.add_token("t", "alice")
    apiserver.reviews.allow("alice", "list", "resource.sharegpu.dev", "gpus")
    apiserver.inject_fault("create", "tokenreviews", code=500, times=1)
    assert auth.decide("Bearer t").code == 503
    assert auth.decide("Bearer t").code == 200


def test_allow_all_serves_everyone() -> None:
    assert AllowAll().decide(None).code == 200
