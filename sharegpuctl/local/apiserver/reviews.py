"""TokenReview and SubjectAccessReview for the in-process API server.

The real API server answers these create-only resources from its authenticators and
authorizers; here a test or the demo registers tokens (:meth:`Reviews.add_token`) and grants
(:meth:`Reviews.allow`). A review is answered, never stored: a TokenReview with an unknown token,
or one of a token bound to none of the review's ``spec.audiences`` (absent: the API server's
own, :data:`API_AUDIENCE`), is ``authenticated: false``, and an authenticated one lists the
audiences both share in ``status.audiences``, as the API server does; a SubjectAccessReview is
allowed when a grant matches the user (or one of its groups), the verb, the API group and the
resource (``"*"`` matches any).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sharegpuctl.local.apiserver.errors import ApiError

TOKEN_REVIEWS = "tokenreviews"
ACCESS_REVIEWS = "subjectaccessreviews"
REVIEW_PLURALS = frozenset({TOKEN_REVIEWS, ACCESS_REVIEWS})
#: The API server's own audience: a token's audience unless it was created for others.
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Grant:
    """``subject`` (a user name or group) may ``verb`` ``resource`` of ``group``."""

    subject: str
    verb: str
    group: str
    resource: str

    def matches(self, subjects: set[str], verb: str, group: str, resource: str) -> bool:
        return (
            self.subject in subjects
            and self.verb in ("*", verb)
            and self.group in ("*", group)
            and self.resource in ("*", resource)
        )


@dataclass
class Reviews:
    """Tokens and grants; thread-safe."""

    _tokens: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    _grants: list[Grant] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_token(
        self,
        token: str,
        username: str,
        groups: tuple[str, ...] = (),
        audiences: tuple[str, ...] = (API_AUDIENCE,),
    ) -> None:
        """Register ``token`` of ``username`` bound to ``audiences``."""
        with self._lock:
            self._tokens[token] = (username, groups, audiences)

    def allow(self, subject: str, verb: str, group: str, resource: str) -> None:
        with self._lock:
            self._grants.append(Grant(subject, verb, group, resource))

    def answer(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """The review ``body`` with its ``status`` filled in."""
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise ApiError(400, "spec: Required value")
        with self._lock:
            if plural == TOKEN_REVIEWS:
                status = self._token_status(spec)
            else:
                status = self._access_status(spec)
        return {**body, "status": status}

    def _token_status(self, spec: dict[str, Any]) -> dict[str, Any]:
        user = self._tokens.get(str(spec.get("token", "")))
        if user is None:
            return {"authenticated": False, "error": "invalid bearer token"}
        name, groups, bound = user
        asked = spec.get("audiences") or [API_AUDIENCE]
        shared = [a for a in asked if isinstance(a, str) and a in bound]
        if not shared:
            return {"authenticated": False, "error": "token audiences are invalid"}
        return {
            "authenticated": True,
            "user": {"username": name, "groups": [*groups, "system:authenticated"]},
            "audiences": shared,
        }

    def _access_status(self, spec: dict[str, Any]) -> dict[str, Any]:
        attrs = spec.get("resourceAttributes") or {}
        subjects = {str(spec.get("user", ""))} | {str(g) for g in spec.get("groups") or []}
        verb, group = str(attrs.get("verb", "")), str(attrs.get("group", ""))
        resource = str(attrs.get("resource", ""))
        if any(g.matches(subjects, verb, group, resource) for g in self._grants):
            return {"allowed": True, "reason": "granted"}
        return {"allowed": False, "reason": f"no grant for {verb} {resource}.{group}"}
