"""Connecting to the Kubernetes API server.

Also :class:`KubeRest`, a small JSON-over-REST layer on the official client's transport: objects
are plain dicts in their JSON shape (the generated models lag the DRA fields).

Precedence, in this one place: ``--kubeconfig`` flag, else the ``KUBECONFIG`` environment
variable, else the in-cluster service account. Failures raise :class:`KubeConfigError` with one
line that says which source was tried and why it failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

#: Environment variable naming a kubeconfig file (first path when it is a list).
KUBECONFIG_ENV = "KUBECONFIG"


class KubeConfigError(RuntimeError):
    """No usable connection settings; the message is one line naming the source and cause."""


def kubeconfig_path(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The kubeconfig file to use: the flag, else the first path in ``KUBECONFIG``, else None."""
    if flag:
        return flag
    env = (environ if environ is not None else os.environ).get(KUBECONFIG_ENV, "")
    paths = [p for p in env.split(os.pathsep) if p]
    return paths[0] if paths else None


def load_api_client(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None
) -> client.ApiClient:
    """An ApiClient from the kubeconfig (flag or ``KUBECONFIG``) or the in-cluster config."""
    configuration = client.Configuration()
    path = kubeconfig_path(kubeconfig, environ)
    if path is not None:
        source = "--kubeconfig" if kubeconfig else f"${KUBECONFIG_ENV}"
        if not os.path.isfile(path):
            raise KubeConfigError(f"kubeconfig {path} (from {source}) does not exist")
        try:
            config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, ValueError, TypeError, KeyError, OSError) as exc:
            message = str(exc).replace("\n", " ") or type(exc).__name__
            raise KubeConfigError(
                f"cannot use kubeconfig {path} (from {source}): {message}"
            ) from None
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise KubeConfigError(
                "no --kubeconfig, no $KUBECONFIG, and not running in a cluster "
                f"(in-cluster config: {exc})"
            ) from None
    return client.ApiClient(configuration)


class KubeApiError(Exception):
    """An API request that failed: HTTP ``status`` (0 for transport errors) and the message.

    ``message`` is the ``message`` of the server's Status body when there is one.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message


def _status_message(body: bytes) -> tuple[str, str]:
    """(reason, message) of a Kubernetes Status body; the raw text when it is not one."""
    text = body.decode(errors="replace")
    try:
        status = json.loads(text)
    except ValueError:
        return "", text.strip()[:500]
    if not isinstance(status, dict):
        return "", text.strip()[:500]
    return str(status.get("reason", "")), str(status.get("message", text.strip()[:500]))


class KubeRest:
    """JSON requests through an :class:`ApiClient` (its auth, TLS and host settings).

    Every failure, HTTP or transport, raises :class:`KubeApiError`.
    """

    def __init__(self, api_client: client.ApiClient, timeout_seconds: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout_seconds = timeout_seconds

    def _send(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] | None,
        body: Any,
        timeout: Any,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = self.api_client.param_serialize(
            method,
            path,
            query_params=list(query or []),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self.api_client.call_api(*params, _request_timeout=timeout).response
        except client.ApiException as exc:
            raise KubeApiError(0, "", f"{method} {path}: {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeApiError(0, "", f"{method} {path}: {type(exc).__name__}: {exc}") from None

    def request(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON object of a 2xx answer."""
        response = self._send(method, path, query, body, self.timeout_seconds)
        try:
            data = response.data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeApiError(0, "", f"{method} {path}: {type(exc).__name__}: {exc}") from None
        finally:
            response.release_conn()
        if not 200 <= response.status < 300:
            reason, message = _status_message(data)
            raise KubeApiError(response.status, reason or str(response.reason), message)
        try:
            obj = json.loads(data)
        except ValueError:
            raise KubeApiError(response.status, "", f"{method} {path}: invalid JSON") from None
        if not isinstance(obj, dict):
            raise KubeApiError(response.status, "", f"{method} {path}: not a JSON object")
        return obj

    def open_watch(
        self, path: str, query: Sequence[tuple[str, str]], read_timeout: float | None
    ) -> urllib3.BaseHTTPResponse:
        """Start a watch (``watch=true`` must be in ``query``); the caller reads and closes it."""
        response = self._send("GET", path, query, None, (self.timeout_seconds, read_timeout))
        if response.status != 200:
            data = response.data
            response.release_conn()
            reason, message = _status_message(data)
            raise KubeApiError(response.status, reason or str(response.reason), message)
        return response  # type: ignore[no-any-return]


def watch_events(response: urllib3.BaseHTTPResponse) -> Iterator[dict[str, Any]]:
    """The events of a watch response, one JSON object per line, until the stream ends."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)
