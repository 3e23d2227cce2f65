"""A thin JSON client for the Kubernetes API, on top of ``kubernetes.client.ApiClient``.

Objects are plain dicts in their JSON shape (the generated models lag the DRA fields). Every
non-2xx answer raises :class:`KubeError` with the server's status code and message; transport
failures raise it with code 0. An optional ``on_error(verb, resource, code)`` callback sees each
failure (for metrics).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, cast

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.watch.watch import iter_resp_lines

ErrorHook = Callable[[str, str, int], None]
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A failed API request: ``code`` is the HTTP status (0 when no answer came)."""

    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def resource_path(
    group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """REST path of a collection or object (``group`` empty for the core API)."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    return base


def load_api_client(kubeconfig: str | None) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster config.

    Raises KubeError (code 0) with the reason when none of them is usable.
    """
    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        if path:
            api: k8s_client.ApiClient = k8s_config.new_client_from_config(config_file=path)
            return api
        k8s_config.load_incluster_config()
        return k8s_client.ApiClient()
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = f"kubeconfig {path}" if path else "in-cluster configuration"
        raise KubeError(0, f"cannot load {where}: {exc}") from exc


def _resource_of(path: str) -> str:
    """A short resource label (``gpus``, ``leases``) for a REST path, for metrics."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        parts = parts[:i] + parts[i + 2 :]
    # /api/v1/<plural>[/name[/sub]] or /apis/<group>/<version>/<plural>[/name[/sub]]
    rest = parts[2:] if parts and parts[0] == "api" else parts[3:]
    return rest[0] if rest else "unknown"


class Kube:
    """JSON requests and watch streams against one API server."""

    def __init__(self, api_client: k8s_client.ApiClient, on_error: ErrorHook | None = None):
        self.api_client = api_client
        self.on_error = on_error

    def _send(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, _, _ = self.api_client.param_serialize(
                method,
                path,
                query_params=list(query or ()),
                header_params=headers,
                auth_settings=["BearerToken"],
            )
            resp = self.api_client.call_api(method, url, headers, body, _request_timeout=timeout)
        except Exception as exc:  # urllib3 and ssl errors: report as "no answer"
            self._fail(method, path, 0)
            raise KubeError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        return resp

    def _fail(self, method: str, path: str, code: int) -> None:
        if self.on_error is not None:
            self.on_error(method.lower(), _resource_of(path), code)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 30.0,
        expected: Collection[int] = (),
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer; raise KubeError on failure.

        Failures with a status in ``expected`` (e.g. 404 of a lookup) still raise but are not
        reported to ``on_error``.
        """
        resp = self._send(method, path, query, body, content_type, timeout)
        try:
            raw = resp.read()
        except Exception as exc:
            self._fail(method, path, 0)
            raise KubeError(0, f"{method} {path}: reading the answer failed: {exc}") from exc
        if not 200 <= resp.status < 300:
            if resp.status not in expected:
                self._fail(method, path, resp.status)
            message, reason = _status_message(raw)
            raise KubeError(resp.status, f"{method} {path}: {resp.status} {message}", reason)
        return cast(dict[str, Any], json.loads(raw)) if raw else {}

    def get(
        self,
        path: str,
        query: Sequence[tuple[str, str]] | None = None,
        expected: Collection[int] = (),
    ) -> dict[str, Any]:
        """GET ``path`` (``expected``: see :meth:`request`)."""
        return self.request("GET", path, query=query, expected=expected)

    def list_all(
        self, path: str, query: Sequence[tuple[str, str]] = (), page_size: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """All items of a collection (following ``continue``) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            q = [*query, ("limit", str(page_size))]
            if token:
                q.append(("continue", token))
            page = self.get(path, q)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self,
        path: str,
        query: Sequence[tuple[str, str]],
        read_timeout: float,
        register: Callable[[Any], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) of a collection until the server ends the stream.

        ``register`` receives the underlying response so another thread can close it.
        """
        q = [*query, ("watch", "true")]
        resp = self._send("GET", path, q, None, JSON, (10.0, read_timeout))
        if not 200 <= resp.status < 300:
            raw = resp.read()
            self._fail("WATCH", path, resp.status)
            message, reason = _status_message(raw)
            raise KubeError(resp.status, f"WATCH {path}: {resp.status} {message}", reason)
        raw_resp = resp.response
        if register is not None:
            register(raw_resp)
        try:
            for line in iter_resp_lines(raw_resp):
                if line:
                    yield cast(dict[str, Any], json.loads(line))
        except KubeError:
            raise
        except Exception as exc:
            self._fail("WATCH", path, 0)
            raise KubeError(0, f"WATCH {path}: stream broken: {type(exc).__name__}: {exc}") from exc
        finally:
            raw_resp.release_conn()


def _status_message(raw: bytes) -> tuple[str, str]:
    try:
        status = json.loads(raw)
        return str(status.get("message", "")), str(status.get("reason", ""))
    except (ValueError, AttributeError):
        return raw[:200].decode(errors="replace"), ""
