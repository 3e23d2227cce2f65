"""HTTP requests to the API server with no per-request work beyond the HTTP call itself.

The official client (``kubernetes.client.ApiClient``) loads the connection settings
(kubeconfig, in-cluster service account, exec plugins) and keeps its token fresh; its
per-request path (serialising parameters, building the request, ``auth_settings()`` calling the
token-refresh hook on every request) costs several times the HTTP call. :class:`Transport`
sends requests straight through the client's own urllib3 pool instead.

Invariants:

- The pool is the client's ``rest_client.pool_manager``: TLS settings (CA, client certificate,
  ``insecure-skip-tls-verify``, ``tls-server-name``), proxy and retries are exactly the ones the
  client configured, and closing the ``ApiClient`` closes every connection; the transport owns
  none.
- The host and the headers (the client's default headers and the auth header its
  ``auth_settings()`` gives) are taken from the client when due: at the first request, then when
  :data:`REFRESH_INTERVAL_S` has passed, and right after the server answered 401. Taking them
  runs the client's refresh hook, which renews what is about to expire: the in-cluster token is
  re-read from its file once a minute, exec-plugin and OIDC tokens when within five minutes of
  their expiry. So a token is never used past the point where the official client would have
  renewed it by more than :data:`REFRESH_INTERVAL_S`, well inside those five minutes.
- A request the server answered 401 is sent once more, with freshly taken headers (the server
  refused it before acting on it, so sending it again is safe for every verb).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import quote, urlencode

import urllib3

from sharegpu.kube.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from sharegpu.kube.connection import KubeClient

#: Seconds between two looks at the client's connection settings (token refresh).
REFRESH_INTERVAL_S: Final = 30.0
JSON: Final = "application/json"
#: urllib3 timeout: seconds for the whole request, or (connect, read).
Timeout = float | tuple[float, float | None]


@dataclass(frozen=True)
class _Settings:
    """What every request carries, as taken from the client at ``taken``."""

    host: str
    headers: Mapping[str, str]
    taken: float


def encode_query(query: Sequence[tuple[str, str]]) -> str:
    """``k=v&...`` as the official client writes it (values percent-encoded, ``/`` kept)."""
    return urlencode(list(query), quote_via=quote, safe="/")


def urllib3_timeout(timeout: Timeout) -> urllib3.Timeout:
    """A number bounds the whole request; a pair bounds connecting and each read."""
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


class Transport:
    """Requests through one client's pool with its host and auth (thread-safe); the client is an
    official ``ApiClient`` or an :class:`~sharegpu.kube.connection.ApiConnection`."""

    def __init__(
        self,
        api_client: KubeClient,
        *,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.api_client = api_client
        self._pool: urllib3.PoolManager = api_client.rest_client.pool_manager
        self._refresh_interval_s = refresh_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._settings: _Settings | None = None

    @property
    def host(self) -> str:
        """The API server's URL (without a trailing path)."""
        return str(self.api_client.configuration.host)

    def _take_settings(self) -> _Settings:
        """Host and headers from the client now (runs its token-refresh hook)."""
        configuration = self.api_client.configuration
        headers = {str(k): str(v) for k, v in self.api_client.default_headers.items()}
        headers["Accept"] = JSON
        auth = configuration.auth_settings().get("BearerToken")
        if auth and auth.get("value") and auth.get("in") == "header":
            headers[str(auth["key"])] = str(auth["value"])
        return _Settings(str(configuration.host), headers, self._clock.monotonic())

    def settings(self, force: bool = False) -> _Settings:
        """The current settings, taken again when due (or when ``force``)."""
        current = self._settings
        if (
            not force
            and current is not None
            and self._clock.monotonic() - current.taken < self._refresh_interval_s
        ):
            return current
        with self._lock:
            current = self._settings
            if (
                force
                or current is None
                or self._clock.monotonic() - current.taken >= self._refresh_interval_s
            ):
                current = self._settings = self._take_settings()
            return current

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        content_type: str = JSON,
        timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request; the answer is not read yet (``preload_content=False``): read it
        (or stream it) and then call ``release_conn()``. Transport failures raise urllib3's
        (or ssl's, socket's) exceptions."""
        settings = self.settings()
        response = self._send(settings, method, path, query, body, content_type, timeout)
        if response.status == 401:
            response.drain_conn()
            response.release_conn()
            fresh = self.settings(force=True)
            response = self._send(fresh, method, path, query, body, content_type, timeout)
        return response

    def _send(
        self,
        settings: _Settings,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]],
        body: bytes | None,
        content_type: str,
        timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse:
        url = settings.host + path
        if query:
            url += "?" + encode_query(query)
        headers: Mapping[str, str] = settings.headers
        if body is not None:
            headers = {**settings.headers, "Content-Type": content_type}
        return self._pool.request(
            method,
            url,
            body=body,
            headers=headers,
            timeout=urllib3_timeout(timeout),
            preload_content=False,
        )
