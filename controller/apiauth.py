"""Who may read the JSON API: Kubernetes authentication and authorization, as kube-rbac-proxy
does it.

The JSON API shows every tenant's claim and pod names, the same data as the ``GPU`` objects; it
is served under the same RBAC. A request must carry ``Authorization: Bearer <token>``; the token
is checked with a TokenReview, and its user must be allowed to ``list``
``gpus.resource.sharegpu.dev`` by a SubjectAccessReview (``kubectl create clusterrole ...
--verb=list --resource=gpus.resource.sharegpu.dev`` and a binding grant it).

Audience: the TokenReview asks for the API's own audience (``--api-token-audience``, default
:data:`DEFAULT_AUDIENCE`), so clients send a token bound to it (``kubectl create token SA
--audience sharegpu.dev``), never one valid for the whole Kubernetes API; a token the API server
does not confirm for that audience is 401.

Invariants: a decision (allowed or denied) is cached per token (by its SHA-256, never the token
itself) for ``ttl_s`` in an LRU of at most ``max_entries``, so a polling client costs two reviews
per ``ttl_s`` and an attacker's random tokens cannot grow memory; at most ``max_reviews``
reviews are in flight at once, shared between client addresses in turn
(:class:`~controller.fairgate.FairGate`): one address has at most ``reviews_per_peer`` reviews
in flight or waiting, and a request beyond that, or one that finds no room within
``review_wait_s``, is answered 429 at once. So a flood of random tokens costs the API server a
bounded rate of reviews and holds each connection briefly, and however many uncached tokens a
few addresses send, a client from another address takes the next free slot (with many
addresses waiting: after at most one review of each); a review that fails (API server
unreachable) is not cached and answers 503: the API fails closed.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final, Protocol

from api import names
from controller.fairgate import FairGate
from sharegpu.kube.clock import Clock, SystemClock
from sharegpu.kube.rest import KubeApiError, KubeRest

log = logging.getLogger(__name__)

TOKEN_REVIEWS_PATH: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS_PATH: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
#: Longer bearer tokens are refused unread (service account tokens are about 1 KiB).
MAX_TOKEN_BYTES: Final = 16 * 1024
#: The audience the JSON API's tokens must be bound to, by default.
DEFAULT_AUDIENCE: Final = "sharegpu.dev"


@dataclass(frozen=True)
class Decision:
    """The answer to one request: HTTP ``code`` 200 (serve it), 401, 403, 429 or 503, and
    why."""

    code: int
    reason: str
    user: str = ""


class ApiAuthorizer(Protocol):
    def decide(self, authorization: str | None, peer: str = "") -> Decision:
        """The decision for a request with this ``Authorization`` header (None: absent) from
        the client address ``peer``."""
        ...


class AllowAll:
    """No authentication (``--api-auth=none``): for a local API bound to 127.0.0.1."""

    def decide(self, authorization: str | None, peer: str = "") -> Decision:
        return Decision(200, "authentication is off (--api-auth=none)")


class KubeAuthorizer:
    """TokenReview + SubjectAccessReview against the API server (see the module docstring)."""

    def __init__(
        self,
        rest: KubeRest,
        *,
        clock: Clock | None = None,
        ttl_s: float = 10.0,
        max_entries: int = 1024,
        audience: str = DEFAULT_AUDIENCE,
        max_reviews: int = 4,
        review_wait_s: float = 1.0,
        reviews_per_peer: int = 1,
    ) -> None:
        self._rest = rest
        self._clock = clock or SystemClock()
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.audience = audience
        self.max_reviews = max_reviews
        self.review_wait_s = review_wait_s
        self._cache: OrderedDict[bytes, tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()
        #: The TokenReviews in flight, shared between client addresses in turn.
        self.reviews = FairGate(
            max_reviews,
            review_wait_s,
            per_user=reviews_per_peer,
            queue_per_user=reviews_per_peer,
            most_per_user=reviews_per_peer,
        )

    def decide(self, authorization: str | None, peer: str = "") -> Decision:
        token = _bearer_token(authorization)
        if isinstance(token, Decision):
            return token
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        now = self._clock.monotonic()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and now - cached[0] < self.ttl_s:
                self._cache.move_to_end(key)
                return cached[1]
        try:
            decision = self.reviews.run(True, lambda: self._review(token), peer)
        except KubeApiError as exc:
            log.warning("JSON API: cannot review a token: %s", exc)
            return Decision(503, "cannot reach the API server to authorize the request")
        if decision is None:
            return Decision(429, "too many authorization requests in flight; retry later")
        with self._lock:
            self._cache[key] = (now, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return decision

    def _review(self, token: str) -> Decision:
        review = self._rest.request(
            "POST",
            TOKEN_REVIEWS_PATH,
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]},
            },
        )
        status = _mapping(review.get("status"))
        user = _mapping(status.get("user"))
        if status.get("authenticated") is not True or not isinstance(user.get("username"), str):
            return Decision(401, f"the bearer token is not valid for audience {self.audience!r}")
        audiences = status.get("audiences")
        if not isinstance(audiences, list) or self.audience not in audiences:
            return Decision(401, f"the bearer token is not valid for audience {self.audience!r}")
        username = str(user["username"])
        access = self._rest.request(
            "POST",
            ACCESS_REVIEWS_PATH,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": username,
                    "uid": user.get("uid") if isinstance(user.get("uid"), str) else None,
                    "groups": [g for g in user.get("groups") or [] if isinstance(g, str)],
                    "extra": user.get("extra") if isinstance(user.get("extra"), dict) else None,
                    "resourceAttributes": {
                        "verb": "list",
                        "group": names.API_GROUP,
                        "resource": names.GPU_PLURAL,
                    },
                },
            },
        )
        if _mapping(access.get("status")).get("allowed") is True:
            return Decision(200, "allowed", username)
        return Decision(
            403,
            f"user {username!r} may not list {names.GPU_PLURAL}.{names.API_GROUP}",
            username,
        )


def _bearer_token(authorization: str | None) -> str | Decision:
    """The token of a ``Bearer`` header, or the 401 decision for a missing or bad one."""
    if not authorization:
        return Decision(401, "the JSON API needs a bearer token (Authorization: Bearer ...)")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return Decision(401, "the JSON API needs a bearer token (Authorization: Bearer ...)")
    if len(token) > MAX_TOKEN_BYTES:
        return Decision(401, f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes")
    return token


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
