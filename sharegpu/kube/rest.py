"""Connecting to the Kubernetes API server, and JSON requests and watches against it.

Used by the node daemon, the controller and the CLI, so each rule lives here once:

* Connection settings (:func:`load_api_client`, :func:`load_connection`): the ``--kubeconfig``
  flag, else the first path in the ``KUBECONFIG`` environment variable, else (for the command
  line, ``use_home``) ``~/.kube/config`` when it exists, as kubectl looks, else the in-cluster
  service account. Failures raise :class:`KubeConfigError` with one line that says which source
  was tried and why it failed.
* :class:`KubeRest`: requests through :class:`~sharegpu.kube.transport.Transport`, which sends
  them straight through the official client's connection pool with its host, TLS settings,
  retries and auth (the token refreshed when due), without the client's per-request machinery.
  Objects are plain dicts in their JSON shape, because the generated models lag the DRA fields.
  Every failure, HTTP or transport, raises :class:`KubeApiError`, ``status`` 0 when no answer
  came (then one line naming the server and the root cause, :func:`transport_problem`, not the
  transport library's nested text); an optional ``on_error(verb, resource, status)`` callback
  sees each unexpected failure (for metrics).
* :meth:`KubeRest.watch`: the events of a watch stream; an ``ERROR`` event raises
  :class:`KubeApiError` with the status it carries (410 when the resourceVersion expired).

The ``kubernetes`` package (large: every generated API and model) is imported by
:func:`load_api_client` only; :func:`load_connection` (the daemons) loads the same settings with
only the official client's connection modules (:mod:`sharegpu.kube.connection`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import urllib3

from sharegpu.kube import jsonbody
from sharegpu.kube.connection import ApiConnection, KubeClient, Official, full_official, official
from sharegpu.kube.transport import Timeout, Transport

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

#: Environment variable naming a kubeconfig file (first path when it is a list).
KUBECONFIG_ENV = "KUBECONFIG"
#: kubectl's default kubeconfig, under the home directory (``$HOME``).
DEFAULT_KUBECONFIG = os.path.join(".kube", "config")
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
#: Seconds a request may take, and a watch may take to answer (its stream has its own limit).
DEFAULT_TIMEOUT_S = 10.0

#: ``on_error(verb, resource, status)``: verb lower-case (``get``, ``put``, ``watch``).
ErrorHook = Callable[[str, str, int], None]


class KubeConfigError(RuntimeError):
    """No usable connection settings; the message is one line naming the source and cause."""


def kubeconfig_path(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The kubeconfig file to use: the flag, else the first path in ``KUBECONFIG``, else None."""
    if flag:
        return flag
    env = (environ if environ is not None else os.environ).get(KUBECONFIG_ENV, "")
    paths = [p for p in env.split(os.pathsep) if p]
    return paths[0] if paths else None


def home_kubeconfig(environ: Mapping[str, str] | None = None) -> str | None:
    """``$HOME/.kube/config`` when that file exists, else None (``environ`` defaults to the
    process environment; without ``HOME`` in it there is none)."""
    home = (environ if environ is not None else os.environ).get("HOME", "")
    path = os.path.join(home, DEFAULT_KUBECONFIG) if home else ""
    return path if path and os.path.isfile(path) else None


def load_api_client(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None, *, use_home: bool = False
) -> ApiClient:
    """An ApiClient from the kubeconfig (flag, ``KUBECONFIG``, with ``use_home`` then
    ``~/.kube/config``) or the in-cluster config. The daemons leave ``use_home`` off, so a
    pod never picks up a file from its image's home directory."""
    from kubernetes import client

    return client.ApiClient(load_configuration(kubeconfig, environ, use_home, full_official()))


def load_connection(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None, *, use_home: bool = False
) -> ApiConnection:
    """Like :func:`load_api_client`, but an :class:`ApiConnection`: the same settings, without
    the generated APIs and models of the ``kubernetes`` package (for the daemons, whose requests
    all go through :class:`KubeRest`)."""
    return ApiConnection(load_configuration(kubeconfig, environ, use_home, official()))


def load_configuration(
    kubeconfig: str | None, environ: Mapping[str, str] | None, use_home: bool, code: Official
) -> Configuration:
    """The connection settings, as the module docstring says where they come from, loaded with
    the official client's ``code``; raises :class:`KubeConfigError`."""
    configuration = code.configuration()
    path = kubeconfig_path(kubeconfig, environ)
    source = "--kubeconfig" if kubeconfig else f"${KUBECONFIG_ENV}"
    if path is None and use_home:
        path, source = home_kubeconfig(environ), "the default location"
    if path is not None:
        if not os.path.isfile(path):
            raise KubeConfigError(f"kubeconfig {path} (from {source}) does not exist")
        import yaml  # the kubeconfig loader reads YAML (the in-cluster path needs none)

        try:
            code.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except (
            code.config_exception,
            yaml.YAMLError,
            ValueError,
            TypeError,
            KeyError,
            OSError,
        ) as exc:
            message = str(exc).replace("\n", " ") or type(exc).__name__
            raise KubeConfigError(
                f"cannot use kubeconfig {path} (from {source}): {message}"
            ) from None
    else:
        try:
            code.load_incluster_config(client_configuration=configuration)
        except code.config_exception as exc:
            home = f", no ~/{DEFAULT_KUBECONFIG}" if use_home else ""
            raise KubeConfigError(
                f"no --kubeconfig, no $KUBECONFIG{home}, and not running in a cluster "
                f"(in-cluster config: {exc})"
            ) from None
    return configuration


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


#: Prefixes of urllib3's messages that name its own objects (``HTTPSConnectionPool(host=...,
#: port=...): ``, ``<urllib3.connection.HTTPSConnection object at 0x...>: ``).
_TRANSPORT_NOISE = re.compile(
    r"^(?:\w+\(host=[^)]*\):\s*|<[^>]*>:\s*)*(?:Failed to establish a new connection:\s*)?"
)


def transport_problem(exc: BaseException, server: str) -> str:
    """One line for a request that got no answer: the server and the root cause
    (``cannot reach the API server https://127.0.0.1:6443: [Errno 111] Connection refused``),
    following urllib3's ``reason`` chain instead of quoting its nested text."""
    cause: BaseException = exc
    for _ in range(8):
        reason = getattr(cause, "reason", None)
        if not isinstance(reason, BaseException):
            break
        cause = reason
    text = _TRANSPORT_NOISE.sub("", str(cause).replace("\n", " ")).strip()
    text = re.sub(r"\s*\(Caused by .*\)$", "", text) or type(cause).__name__
    return f"cannot reach the API server {server}: {text}"


class KubeApiError(Exception):
    """A failed API request.

    ``status`` is the HTTP status (or the ``code`` of a watch ``ERROR`` event), 0 when no answer
    came; ``reason`` the Status reason (``NotFound``, ``Expired``); ``message`` the server's
    message, or what went wrong in transport. ``str()`` is one line that also names the request.
    """

    def __init__(self, status: int, reason: str, message: str, request: str = "") -> None:
        text = f"HTTP {status} {reason}: {message}" if status else message
        super().__init__(f"{request}: {text}" if request else text)
        self.status = status
        self.reason = reason
        self.message = message


def status_message(body: bytes) -> tuple[str, str]:
    """(reason, message) of a Kubernetes Status body; the raw text when it is not one."""
    text = body.decode(errors="replace")
    try:
        status = jsonbody.decode(text)
    except ValueError:
        return "", text.strip()[:500]
    if not isinstance(status, dict):
        return "", text.strip()[:500]
    return str(status.get("reason", "")), str(status.get("message", text.strip()[:500]))


def _resource_of(path: str) -> str:
    """A short resource label (``gpus``, ``leases``) for a REST path, for metrics."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        parts = parts[:i] + parts[i + 2 :]
    # /api/v1/<plural>[/name[/sub]] or /apis/<group>/<version>/<plural>[/name[/sub]]
    rest = parts[2:] if parts and parts[0] == "api" else parts[3:]
    return rest[0] if rest else "unknown"


def _event_lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The non-empty lines of a streamed answer, until it ends. Linear in the stream's size: the
    chunks of a line are joined once, when its end arrives."""
    parts: list[bytes] = []
    for chunk in response.stream(amt=None, decode_content=True):
        parts.append(chunk)
        if b"\n" not in chunk:
            continue
        lines = b"".join(parts).split(b"\n")
        parts = [lines.pop()]
        yield from (line for line in lines if line.strip())
    tail = b"".join(parts)
    if tail.strip():
        yield tail


class KubeRest:
    """JSON requests and watch streams through an :class:`ApiClient`'s connection.

    ``timeout_s`` bounds each request (unless a call gives its own) and the wait for a watch to
    answer. ``on_error`` sees every failure except statuses a call says it expects.
    ``api_client`` may be None for an instance that never sends (its handlers fed directly).
    """

    def __init__(
        self,
        api_client: KubeClient | None,
        on_error: ErrorHook | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.api_client = api_client
        self.on_error = on_error
        self.timeout_s = timeout_s
        self._transport = None if api_client is None else Transport(api_client)

    def _fail(self, verb: str, path: str, status: int) -> None:
        if self.on_error is not None:
            self.on_error(verb.lower(), _resource_of(path), status)

    def _send(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout: Timeout,
        verb: str,
    ) -> urllib3.BaseHTTPResponse:
        """The urllib3 response of one request; transport failures raise (and are reported)."""
        request = f"{verb} {path}"
        transport = self._transport
        if transport is None:
            raise KubeApiError(0, "", f"{request}: no API client")
        try:
            data = None if body is None else jsonbody.encode(body)
        except (TypeError, ValueError) as exc:
            raise KubeApiError(0, "", f"{request}: the body is not JSON: {exc}") from None
        try:
            return transport.request(
                method,
                path,
                query=query or (),
                body=data,
                content_type=content_type,
                timeout=timeout,
            )
        except Exception as exc:  # urllib3, ssl and socket errors: "no answer"
            self._fail(verb, path, 0)
            raise KubeApiError(
                0, "", f"{request}: {transport_problem(exc, transport.host)}"
            ) from None

    def _http_error(
        self,
        response: urllib3.BaseHTTPResponse,
        data: bytes,
        verb: str,
        path: str,
        expected: Collection[int],
    ) -> KubeApiError:
        if response.status not in expected:
            self._fail(verb, path, response.status)
        reason, message = status_message(data)
        return KubeApiError(
            response.status, reason or str(response.reason), message, f"{verb} {path}"
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        expected: Collection[int] = (),
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON object of a 2xx answer (``{}`` if empty).

        Failures with a status in ``expected`` (e.g. 404 of a lookup) still raise but are not
        reported to ``on_error``.
        """
        response = self._send(
            method,
            path,
            query,
            body,
            content_type,
            self.timeout_s if timeout is None else timeout,
            method,
        )
        try:
            data = response.data
        except Exception as exc:
            self._fail(method, path, 0)
            raise KubeApiError(
                0, "", f"{method} {path}: reading the answer failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            response.release_conn()
        if not 200 <= response.status < 300:
            raise self._http_error(response, data, method, path, expected)
        if not data:
            return {}
        try:
            obj = jsonbody.decode(data)
        except jsonbody.NestingError as exc:
            self._fail(method, path, 0)
            raise KubeApiError(0, "", f"{method} {path}: {exc}") from None
        except ValueError:
            self._fail(method, path, 0)
            raise KubeApiError(0, "", f"{method} {path}: the answer is not JSON") from None
        if not isinstance(obj, dict):
            self._fail(method, path, 0)
            raise KubeApiError(0, "", f"{method} {path}: the answer is not a JSON object")
        return obj

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
        read_timeout: float | None,
        register: Callable[[Any], None] | None = None,
    ) -> Generator[dict[str, Any], None, None]:
        """Watch events (``{"type", "object"}``) of a collection until the server ends the stream.

        ``watch=true`` is added to ``query``. The request is sent when iteration starts;
        ``register`` then receives the open urllib3 response, so another thread can stop the
        watch with ``shutdown()``. An ``ERROR`` event raises :class:`KubeApiError` with its code
        (not reported to ``on_error``: 410 Gone is routine); a broken stream raises one with
        status 0. The connection is released when the generator ends or is closed.
        """
        q = [*query, ("watch", "true")]
        response = self._send("GET", path, q, None, JSON, (self.timeout_s, read_timeout), "WATCH")
        if response.status != 200:
            data = response.data
            response.release_conn()
            raise self._http_error(response, data, "WATCH", path, ())
        if register is not None:
            register(response)
        try:
            for line in _event_lines(response):
                event = jsonbody.decode(line)
                if not isinstance(event, dict):
                    raise ValueError(f"an event is not a JSON object: {line[:200]!r}")
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise KubeApiError(
                        int(obj.get("code", 0) or 0),
                        str(obj.get("reason", "")),
                        str(obj.get("message", json.dumps(obj))),
                        f"WATCH {path}",
                    )
                yield event
        except KubeApiError:
            raise
        except Exception as exc:
            self._fail("WATCH", path, 0)
            raise KubeApiError(
                0, "", f"WATCH {path}: stream broken: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            response.release_conn()
