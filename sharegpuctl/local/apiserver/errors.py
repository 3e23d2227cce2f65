"""API errors and the ``Status`` bodies the Kubernetes API server answers them with."""

from __future__ import annotations

from typing import Any

#: HTTP status code -> the ``reason`` of the ``Status`` body (``metav1.StatusReason``).
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered to the client as a ``Status`` object with HTTP status ``code``.

    ``reason`` defaults to the standard reason of ``code``; ``causes`` (each ``{reason, message,
    field}``) go into ``details.causes`` (used for 422 Invalid).
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        name: str | None = None,
        group: str | None = None,
        kind: str | None = None,
        causes: list[dict[str, str]] | None = None,
        retry_after_seconds: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after_seconds = retry_after_seconds

    def status(self) -> dict[str, Any]:
        """The ``Status`` body of this error."""
        details: dict[str, Any] = {}
        if self.name is not None:
            details["name"] = self.name
        if self.group is not None:
            details["group"] = self.group
        if self.kind is not None:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after_seconds is not None:
            details["retryAfterSeconds"] = self.retry_after_seconds
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


def success_status(**details: Any) -> dict[str, Any]:
    """A ``Status`` body for a successful operation that has no object to return."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
    }
    if details:
        body["details"] = details
    return body
