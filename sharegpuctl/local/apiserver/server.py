"""An in-process Kubernetes API server over HTTP, good enough for the official client.

``KubeAPIServer`` serves the REST protocol (list/watch/get/create/update/patch/delete/
deletecollection, status subresources, Status error bodies) for the resources in
:mod:`sharegpuctl.local.apiserver.resources` from an
:class:`~sharegpuctl.local.apiserver.store.ObjectStore`.
It binds a loopback address only (127.0.0.1, port 0 by default) and runs in background threads;
``stop()`` ends watch streams, closes every connection and joins all threads.

Given a ``token``, every request must carry ``Authorization: Bearer <token>`` (401 otherwise);
:meth:`KubeAPIServer.write_kubeconfig` writes it into a kubeconfig only its owner can read.
Bodies are bounded (:mod:`.bounds`: size, YAML aliases, stored object size). ``admission``
judges each write as a validating webhook would (after defaulting and validation, before it is
stored); ``pod_logs`` answers ``pods/log``.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import ipaddress
import json
import os
import queue
import select
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

import yaml

from sharegpu.kube import jsonbody
from sharegpuctl.local.apiserver import selectors
from sharegpuctl.local.apiserver.bounds import MAX_BODY_BYTES, body_too_large, load_yaml
from sharegpuctl.local.apiserver.builtinschema import definition
from sharegpuctl.local.apiserver.errors import ApiError, success_status
from sharegpuctl.local.apiserver.faults import (
    ACTION_DELAY,
    ACTION_HANGUP,
    Fault,
    FaultInjector,
)
from sharegpuctl.local.apiserver.openapi import OPENAPI_V3_PREFIX, OpenAPIDocuments
from sharegpuctl.local.apiserver.patch import (
    SUPPORTED_PATCH_TYPES,
    apply_patch,
    unsupported_patch_type,
)
from sharegpuctl.local.apiserver.tables import table, wants_table
from sharegpuctl.local.apiserver.validation import SCHEMA_KUBERNETES_VERSION

if TYPE_CHECKING:
    import kubernetes.client

    from sharegpuctl.local.apiserver.tls import ServingCert
from sharegpuctl.local.apiserver.resources import ResourceRegistry, ResourceType, default_resources
from sharegpuctl.local.apiserver.reviews import REVIEW_PLURALS, Reviews
from sharegpuctl.local.apiserver.store import CLOSED, Event, ObjectStore, Watcher

#: Media types of request bodies this server decodes (create, update, delete options); the
#: real server also reads protobuf and CBOR, which this one answers 415 Unsupported Media Type.
BODY_MEDIA_TYPES = ("application/json", "application/yaml")
PROTOBUF = "application/vnd.kubernetes.protobuf"


def unsupported_body(media: str) -> str:
    """The 415 message for a body of media type ``media``: the accepted types, and for
    protobuf (which kubectl's typed commands such as ``kubectl create namespace`` always send)
    what to do instead."""
    message = (
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(BODY_MEDIA_TYPES)
    )
    if media == PROTOBUF:
        message += (
            f" ({PROTOBUF} is not decoded by this server: send the object as JSON or YAML, "
            "e.g. kubectl create -f with a manifest)"
        )
    return message


#: How long a client has to complete the TLS handshake.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: Watch streams without ``timeoutSeconds`` end after this long (the real server: 30-60 min).
DEFAULT_WATCH_TIMEOUT_S = 1800.0
#: How often an idle watch checks whether its client went away.
_WATCH_POLL_S = 0.5
_MAJOR, _MINOR, _ = SCHEMA_KUBERNETES_VERSION.split(".")
#: The version ``/version`` reports: the Kubernetes release whose schemas this server validates
#: with and publishes (build metadata ``+sharegpu`` says which server it is).
SERVED_VERSION = {
    "major": _MAJOR,
    "minor": _MINOR,
    "gitVersion": f"v{SCHEMA_KUBERNETES_VERSION}+sharegpu",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "none",
    "compiler": "cpython",
    "platform": "linux/amd64",
}


class _Route:
    """A parsed request path."""

    def __init__(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
    ) -> None:
        self.rt = rt
        self.namespace = namespace
        self.name = name
        self.subresource = subresource

    @property
    def resource_label(self) -> str:
        """``plural`` or ``plural/subresource``, as counted and matched by faults."""
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural


def _route(registry: ResourceRegistry, path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        rt = registry.find(group, version, rest[2])
        if rt is not None and rt.namespaced:
            namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    rt = registry.find(group, version, rest[0])
    if rt is None:
        return None
    if rt.namespaced and namespace is None and len(rest) > 1:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    return _Route(rt, namespace, name, sub)


class _HTTPServer(ThreadingHTTPServer):
    """Joins its handler threads on close and can cut every open connection."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, api: KubeAPIServer, address: tuple[str, int], tls: ssl.SSLContext | None = None
    ) -> None:
        self.api = api
        self._conn_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        super().__init__(address, _Handler)
        if tls is not None:
            # the handshake runs in the connection's own thread (see _Handler.setup), so a
            # client that never completes one holds no other connection up
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def track(self, conn: socket.socket, open_: bool) -> None:
        with self._conn_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that go away mid-request are expected; anything else is reported."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        super().handle_error(request, client_address)

    def cut_connections(self) -> None:
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request log lines."""

    # ------------------------------------------------------------ plumbing

    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_encoded(code, json.dumps(body, separators=(",", ":")).encode(), headers)

    def _send_encoded(self, code: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Answer ``code`` with ``data``, a JSON document already encoded."""
        head = [f"HTTP/1.1 {code} {self.responses.get(code, ('',))[0]}"]
        head.append("Content-Type: application/json")
        head.append(f"Content-Length: {len(data)}")
        head.append("Cache-Control: no-cache, private")
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        self.wfile.flush()

    def _send_error(self, err: ApiError) -> None:
        headers = {}
        if err.retry_after_seconds is not None:
            headers["Retry-After"] = str(err.retry_after_seconds)
        self._send_json(err.code, err.status(), headers)

    def _read_body(self, method: str) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise ApiError(400, "Content-Length must be a non-negative integer")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread
            raise body_too_large(length)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        content_type = (self.headers.get("Content-Type") or "").lower()
        media = content_type.split(";")[0].strip()
        if method == "PATCH" and media and media not in SUPPORTED_PATCH_TYPES:
            raise unsupported_patch_type(media, SUPPORTED_PATCH_TYPES)
        if method != "PATCH" and media and media not in BODY_MEDIA_TYPES:
            raise ApiError(415, unsupported_body(media))
        if "yaml" in content_type:
            try:
                return load_yaml(raw)
            except (ValueError, yaml.YAMLError) as exc:
                raise ApiError(400, f"the request body is not valid YAML: {exc}") from None
        try:
            return jsonbody.decode(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ------------------------------------------------------------ dispatch

    def _dispatch(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            self._authenticate(api.token)
            body = self._read_body(method)
            if method == "GET" and self._serve_discovery(url.path):
                return
            route = _route(api.store.registry, url.path)
            if route is None:
                raise ApiError(
                    404, f"the server could not find the requested resource ({url.path})"
                )
            verb = self._verb(method, route, query)
            api.count_request(verb, route.resource_label)
            fault = api.faults.take(verb, route.resource_label, route.name, route.namespace)
            if fault is not None:
                if fault.action == ACTION_HANGUP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault.action == ACTION_DELAY:
                    api.stopping.wait(fault.delay_s)
                else:
                    retry = 1 if fault.code == 429 else None
                    raise ApiError(fault.code, fault.message, retry_after_seconds=retry)
            if verb == "watch":
                self._watch(route, query)
                return
            if route.rt.refused and verb not in ("get", "list"):
                raise ApiError(405, route.rt.refused, reason="MethodNotAllowed")
            if verb == "get" and route.subresource == "log" and route.rt.plural == "pods":
                self._send_log(route, query)
                return
            warnings: list[str] = []
            code, result = self._execute(verb, route, query, body, warnings)
            self._send_json(code, result, _warning_headers(warnings))
        except ApiError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in this server: answer 500 instead of hanging up
            self._send_error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))

    def _authenticate(self, token: str | None) -> None:
        """401 unless the request carries the server's bearer token (when it has one)."""
        if token is None:
            return
        given = self.headers.get("Authorization") or ""
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token):
            return
        self.close_connection = True  # an unauthenticated body is never read
        raise ApiError(401, "Unauthorized")

    @staticmethod
    def _verb(method: str, route: _Route, query: dict[str, str]) -> str:
        if method == "GET":
            if route.name is not None:
                return "get"
            return "watch" if query.get("watch") in ("true", "1") else "list"
        if method == "POST":
            if route.name is not None:
                raise ApiError(405, "POST is only allowed on collections")
            return "create"
        if method == "PUT":
            if route.name is None:
                raise ApiError(405, "PUT needs an object name")
            return "update"
        if method == "PATCH":
            if route.name is None:
                raise ApiError(405, "PATCH needs an object name")
            return "patch"
        return "delete" if route.name is not None else "deletecollection"

    def _matcher(self, route: _Route, query: dict[str, str]) -> selectors.Matcher:
        labels = selectors.parse_label_selector(query.get("labelSelector"))
        fields = selectors.parse_field_selector(
            query.get("fieldSelector"), route.rt.selectable_fields
        )
        return selectors.make_matcher(labels, fields)

    def _send_log(self, route: _Route, query: dict[str, str]) -> None:
        """``pods/log``: the text ``pod_logs`` gives (404 for a pod that does not exist)."""
        api = self.server.api
        assert route.name is not None
        if api.store.get_ref("pods", route.name, route.namespace) is None:
            raise ApiError(404, f'pods "{route.name}" not found', name=route.name, kind="pods")
        if api.pod_logs is None:
            raise ApiError(404, "this server keeps no container logs")
        text = api.pod_logs(route.namespace or "", route.name, query.get("container"))
        data = text.encode()
        head = [
            "HTTP/1.1 200 OK",
            "Content-Type: text/plain",
            f"Content-Length: {len(data)}",
            "Cache-Control: no-cache, private",
        ]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        self.wfile.flush()

    def _admitted(
        self,
        operation: str,
        route: _Route,
        dry_run: bool,
        warnings: list[str],
        write: Callable[[bool], Any],
    ) -> Any:
        """Run ``write`` (``write(dry_run)``); with the server's admission, as a validating
        webhook judges a write: the defaulted, validated object of a dry run is judged, then
        that very object (its generated name and uid kept) is stored, unless it changed since
        (409 Conflict)."""
        admission = self.server.api.admission
        if admission is None or not admission.reviews(route.rt):
            return write(dry_run)
        candidate = write(True)
        warnings.extend(admission.admit(operation, route.rt, candidate, dry_run))
        if dry_run:
            return candidate
        store = self.server.api.store
        if operation == "CREATE":
            return store.create_ref(route.rt.plural, candidate, keep_uid=True)
        return store.update_ref(route.rt.plural, candidate)

    def _execute(
        self, verb: str, route: _Route, query: dict[str, str], body: Any, warnings: list[str]
    ) -> tuple[int, Any]:
        store = self.server.api.store
        rt = route.rt
        dry_run = bool(query.get("dryRun"))
        strict = field_validation(query, verb) == "Strict"
        as_table = wants_table(self.headers.get("Accept") or "")
        if verb == "list":
            items, rv = store.list_refs(rt.plural, route.namespace, self._matcher(route, query))
            if as_table:
                return 200, table(rt, items, str(rv), query.get("includeObject"))
            return 200, {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(rv)},
                "items": items,
            }
        if verb == "deletecollection":
            store.delete_collection(
                rt.plural, route.namespace, self._matcher(route, query), dry_run=dry_run
            )
            return 200, success_status(group=rt.group, kind=rt.plural)
        if verb == "create" and rt.plural in REVIEW_PLURALS:
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            return 201, self.server.api.reviews.answer(rt.plural, body)
        if verb == "create":
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            self._check_namespace(route, body)
            created = body
            return 201, self._admitted(
                "CREATE",
                route,
                dry_run,
                warnings,
                lambda dry: store.create_ref(rt.plural, created, dry_run=dry, strict=strict),
            )
        if route.name is None:
            raise ApiError(405, f"{verb} needs an object name")
        if verb == "get":
            if route.subresource is not None and route.subresource not in rt.subresources:
                raise ApiError(404, f"{rt.qualified} has no subresource {route.subresource!r}")
            obj = store.get_ref(rt.plural, route.name, route.namespace)
            if obj is None:
                raise ApiError(
                    404,
                    f'{rt.qualified} "{route.name}" not found',
                    name=route.name,
                    group=rt.group,
                    kind=rt.plural,
                )
            if as_table and route.subresource is None:
                return 200, table(
                    rt, [obj], obj["metadata"]["resourceVersion"], query.get("includeObject")
                )
            return 200, obj
        if verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            self._check_namespace(route, body)
            meta = body.get("metadata") or {}
            if meta.get("name") != route.name:
                raise ApiError(
                    400,
                    f"the name of the object ({meta.get('name')}) does not match the name on "
                    f"the URL ({route.name})",
                )
            updated = body

            def update(dry: bool) -> Any:
                return store.update_ref(
                    rt.plural, updated, subresource=route.subresource, dry_run=dry, strict=strict
                )

            if route.subresource is not None:
                return 200, update(dry_run)
            return 200, self._admitted("UPDATE", route, dry_run, warnings, update)
        if verb == "patch":
            content_type = self.headers.get("Content-Type") or ""
            patch_body = body

            schema = definition(rt)

            def apply(old: dict[str, Any]) -> dict[str, Any]:
                return apply_patch(content_type, old, patch_body, schema)

            name = route.name

            def patch(dry: bool) -> Any:
                return store.patch_ref(
                    rt.plural,
                    name,
                    route.namespace,
                    apply,
                    subresource=route.subresource,
                    dry_run=dry,
                    strict=strict,
                )

            if route.subresource is not None:
                return 200, patch(dry_run)
            return 200, self._admitted("UPDATE", route, dry_run, warnings, patch)
        # delete
        options = body if isinstance(body, dict) else {}
        preconditions = options.get("preconditions") or {}
        dry_run = dry_run or bool(options.get("dryRun"))
        return 200, store.delete_ref(
            rt.plural,
            route.name,
            route.namespace,
            uid=preconditions.get("uid"),
            resource_version=preconditions.get("resourceVersion"),
            dry_run=dry_run,
            orphan=(options.get("propagationPolicy") or query.get("propagationPolicy")) == "Orphan"
            or options.get("orphanDependents") is True,
        )

    @staticmethod
    def _check_namespace(route: _Route, body: dict[str, Any]) -> None:
        if not route.rt.namespaced:
            return
        meta = body.setdefault("metadata", {})
        given = meta.get("namespace")
        if given and given != route.namespace:
            raise ApiError(
                400,
                f"the namespace of the provided object ({given}) does not match the namespace "
                f"sent on the request ({route.namespace})",
            )
        meta["namespace"] = route.namespace

    # ------------------------------------------------------------ watch

    def _watch(self, route: _Route, query: dict[str, str]) -> None:
        api = self.server.api
        watcher = api.store.watch(
            route.rt.plural,
            route.namespace,
            self._matcher(route, query),
            query.get("resourceVersion"),
        )
        api.register_watch(watcher)
        try:
            timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        except ValueError:
            timeout = DEFAULT_WATCH_TIMEOUT_S
        deadline = time.monotonic() + timeout
        self.close_connection = True
        try:
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n"
                b"Connection: close\r\n\r\n"
            )
            self.wfile.flush()
            self._stream(watcher, deadline)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            api.store.unwatch(watcher)
            api.unregister_watch(watcher)

    def _write_event(self, event: dict[str, Any]) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and isinstance(self.connection, ssl.SSLSocket):
                # TLS cannot peek: a watch's client sends nothing more, so what it sends now
                # is read and dropped (the connection closes after the watch anyway)
                self.connection.setblocking(False)
                try:
                    return self.connection.recv(1) == b""
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    return False
                finally:
                    self.connection.setblocking(True)
            if readable:
                peek: bytes = self.connection.recv(1, socket.MSG_PEEK)
                return peek == b""
        except (OSError, ValueError):
            return True
        return False

    def _stream(self, watcher: Watcher, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                item = watcher.queue.get(timeout=min(remaining, _WATCH_POLL_S))
            except queue.Empty:
                if self._client_gone():
                    return
                continue
            if item is CLOSED:
                return
            if isinstance(item, Event):
                self._write_event({"type": item.type, "object": item.object})
            elif isinstance(item, dict):
                self._write_event({"type": "ERROR", "object": item})

    # ------------------------------------------------------------ discovery

    def _serve_discovery(self, path: str) -> bool:
        registry = self.server.api.store.registry
        path = path.rstrip("/")
        if path == "/version":
            self._send_json(200, SERVED_VERSION)
            return True
        if path == OPENAPI_V3_PREFIX:
            self._send_json(200, self.server.api.openapi.index())
            return True
        if path.startswith(OPENAPI_V3_PREFIX + "/"):
            data = self.server.api.openapi.get(path.removeprefix(OPENAPI_V3_PREFIX + "/"))
            if data is None:
                raise ApiError(404, f"the server could not find the requested resource ({path})")
            self._send_encoded(200, data)
            return True
        if path == "/api":
            self._send_json(200, {"kind": "APIVersions", "versions": ["v1"]})
            return True
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for rt in registry.all():
                if rt.group:
                    groups.setdefault(rt.group, [])
                    if rt.version not in groups[rt.group]:
                        groups[rt.group].append(rt.version)
            self._send_json(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in sorted(groups.items())
                    ],
                },
            )
            return True
        parts = [p for p in path.split("/") if p]
        group_version = None
        if len(parts) == 2 and parts[0] == "api":
            group_version = ("", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            group_version = (parts[1], parts[2])
        if group_version is None:
            return False
        types = [rt for rt in registry.all() if (rt.group, rt.version) == group_version]
        if not types:
            return False
        resources: list[dict[str, Any]] = []
        for rt in types:
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
            entry: dict[str, Any] = {
                "name": rt.plural,
                "singularName": rt.singular_name,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": [*verbs, "watch"],
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            for sub in sorted(rt.subresources):
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        self._send_json(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": types[0].api_version,
                "resources": resources,
            },
        )
        return True


def _warning_headers(warnings: list[str]) -> dict[str, str]:
    """``Warning`` headers as the real server sends admission warnings (one header line each
    is not possible through a dict, so they are joined as HTTP allows: comma-separated)."""
    if not warnings:
        return {}
    texts = (" ".join(w.split()).encode("ascii", "replace").decode() for w in warnings)
    quoted = ['299 - "' + t.replace("\\", "\\\\").replace('"', '\\"') + '"' for t in texts]
    return {"Warning": ", ".join(quoted)}


@dataclass(frozen=True)
class Admission:
    """A validating admission hook: ``reviews(type)`` says which resources it judges (the
    others are written as without it); ``admit(operation, type, object, dry_run)`` returns the
    warnings for a write it allows and raises :class:`~.errors.ApiError` to refuse it.
    ``object`` is the defaulted, validated object about to be stored; with ``dry_run`` nothing
    may be charged."""

    reviews: Callable[[ResourceType], bool]
    admit: Callable[[str, ResourceType, dict[str, Any], bool], list[str]]


#: ``pod_logs(namespace, name, container)``: the text ``kubectl logs`` prints.
PodLogs = Callable[[str, str, str | None], str]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class KubeAPIServer:
    """The in-process API server. Use as a context manager or call :meth:`start`/:meth:`stop`.

    ``store`` gives direct, thread-safe access to the objects (writes there emit watch events);
    ``faults``/:meth:`inject_fault` make requests fail; :meth:`request_count` tells how many
    requests of a verb/resource were served. ``disabled_gates`` emulates an API server with those
    feature gates off (:func:`~sharegpuctl.local.apiserver.resources.default_resources`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        resources: list[ResourceType] | None = None,
        history_size: int = 200_000,
        disabled_gates: Collection[str] = (),
        token: str | None = None,
        tls: bool = False,
        admission: Admission | None = None,
        pod_logs: PodLogs | None = None,
    ) -> None:
        if not _is_loopback(host):
            raise ValueError(f"host: {host!r} is not a loopback address; this server has no TLS")
        if token is not None and not token.strip():
            raise ValueError("token: must not be empty")
        #: The bearer token every request must carry (None: no authentication).
        self.token = token
        #: The serving certificate (``tls``: HTTPS with a fresh self-signed certificate; kubectl
        #: sends a token only over TLS).
        self.serving_cert: ServingCert | None = None
        if tls:
            # imported only here: the other users of this server never load cryptography
            from sharegpuctl.local.apiserver.tls import self_signed

            self.serving_cert = self_signed(host)
        self._ca_dir: tempfile.TemporaryDirectory[str] | None = None
        #: Judges writes before they are stored (see :data:`Admission`).
        self.admission = admission
        #: Answers ``pods/log`` (see :data:`PodLogs`).
        self.pod_logs = pod_logs
        if resources is None:
            resources = default_resources(disabled_gates)
        registry = ResourceRegistry(resources)
        self.store = ObjectStore(registry, history_size=history_size)
        #: The OpenAPI v3 documents of the served types (``/openapi/v3``).
        self.openapi = OpenAPIDocuments(registry)
        self.faults = FaultInjector()
        #: Tokens and grants that TokenReviews and SubjectAccessReviews are answered from.
        self.reviews = Reviews()
        self._address = (host, port)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counts: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()
        self._watches: set[Watcher] = set()
        self._watches_lock = threading.Lock()
        self._stopping = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> KubeAPIServer:
        """Bind and serve in a background thread; returns self."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        context = self.serving_cert.server_context() if self.serving_cert else None
        self._httpd = _HTTPServer(self, self._address, context)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"kube-apiserver-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """End watches, close connections, join every thread. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        self._stopping.set()
        self.store.close_watches()
        # let the watch streams write their final chunk before the connections are cut
        self.wait_for(lambda: self.open_watches() == 0, timeout_s=5.0)
        httpd.cut_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._ca_dir is not None:
            self._ca_dir.cleanup()
            self._ca_dir = None

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` has begun (stalled requests wake up on it)."""
        return self._stopping

    # ------------------------------------------------------------ addresses and clients

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._httpd is None:
            raise RuntimeError("the API server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http(s)://127.0.0.1:<port>``."""
        scheme = "https" if self.serving_cert is not None else "http"
        return f"{scheme}://{self._address[0]}:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A client Configuration pointing at this server."""
        import kubernetes.client  # the whole package: imported only when a client is asked for

        config = kubernetes.client.Configuration()
        config.host = self.url
        if self.serving_cert is not None:
            config.ssl_ca_cert = self._ca_file()
        if self.token is not None:
            config.api_key = {"authorization": self.token}
            config.api_key_prefix = {"authorization": "Bearer"}
        return config

    def _ca_file(self) -> str:
        """A file holding the serving certificate, for clients that read their CA from a file
        (removed with the server)."""
        assert self.serving_cert is not None
        if self._ca_dir is None:
            self._ca_dir = tempfile.TemporaryDirectory(prefix="sharegpu-apiserver-ca-")
            (Path(self._ca_dir.name) / "ca.crt").write_bytes(self.serving_cert.cert_pem)
        return str(Path(self._ca_dir.name) / "ca.crt")

    def client(self) -> kubernetes.client.ApiClient:
        """A fresh ApiClient for this server (close it when done)."""
        import kubernetes.client

        return kubernetes.client.ApiClient(self.configuration())

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> str:
        """Write a kubeconfig for this server to ``path`` (mode 0600: it holds the token);
        returns the path."""
        token = self.token if self.token is not None else "sharegpu-test-token"
        cluster: dict[str, str] = {"server": self.url}
        if self.serving_cert is not None:
            ca = base64.b64encode(self.serving_cert.cert_pem).decode()
            cluster["certificate-authority-data"] = ca
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sharegpu", "cluster": cluster}],
            "users": [{"name": "sharegpu", "user": {"token": token}}],
            "contexts": [
                {"name": "sharegpu", "context": {"cluster": "sharegpu", "user": "sharegpu"}}
            ],
            "current-context": "sharegpu",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        return os.fspath(path)

    # ------------------------------------------------------------ faults

    def inject_fault(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        code: int = 500,
        times: int | None = 1,
        action: str = "status",
        delay_s: float = 0.0,
        name: str | None = None,
        namespace: str | None = None,
        message: str = "injected fault",
    ) -> Fault:
        """Make the next ``times`` matching requests fail with ``code`` (``action="status"``),
        have their connection closed unanswered (``"hangup"``), or stall ``delay_s`` seconds
        first (``"delay"``). 429 answers carry ``Retry-After: 1``. Returns the fault (its
        ``hits`` counts the requests it hit)."""
        return self.faults.add(
            Fault(
                verb=verb,
                resource=resource,
                code=code,
                times=times,
                action=action,
                delay_s=delay_s,
                name=name,
                namespace=namespace,
                message=message,
            )
        )

    def clear_faults(self) -> None:
        """Remove every injected fault."""
        self.faults.clear()

    def drop_watches(self) -> int:
        """End every open watch stream (clients see the response end); returns how many."""
        with self._watches_lock:
            watchers = list(self._watches)
        for w in watchers:
            self.store.unwatch(w)
            w.close()
        return len(watchers)

    def open_watches(self) -> int:
        """How many watch streams are being served."""
        with self._watches_lock:
            return len(self._watches)

    def register_watch(self, watcher: Watcher) -> None:
        """Book-keeping of the HTTP layer: a watch stream started."""
        with self._watches_lock:
            self._watches.add(watcher)

    def unregister_watch(self, watcher: Watcher) -> None:
        """Book-keeping of the HTTP layer: a watch stream ended."""
        with self._watches_lock:
            self._watches.discard(watcher)

    # ------------------------------------------------------------ request counters

    def count_request(self, verb: str, resource: str) -> None:
        """Count one request (called by the HTTP layer)."""
        with self._counts_lock:
            self._counts[(verb, resource)] += 1

    def request_count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests served for ``verb`` and ``resource`` (None: any). ``resource`` is a plural
        (including its subresources) or ``plural/subresource`` for one subresource."""
        with self._counts_lock:
            return sum(
                n
                for (v, r), n in self._counts.items()
                if (verb is None or v == verb)
                and (resource is None or r == resource or r.split("/")[0] == resource)
            )

    def write_count(self, resource: str | None = None) -> int:
        """Create/update/patch/delete/deletecollection requests for ``resource`` (None: any)."""
        return sum(
            self.request_count(v, resource)
            for v in ("create", "update", "patch", "delete", "deletecollection")
        )

    def request_counts(self) -> dict[tuple[str, str], int]:
        """A snapshot of all counters, keyed by (verb, resource)."""
        with self._counts_lock:
            return dict(self._counts)

    def reset_counters(self) -> None:
        """Zero all request counters."""
        with self._counts_lock:
            self._counts.clear()

    def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.02
    ) -> bool:
        """Poll ``predicate`` until it holds or ``timeout_s`` passes; returns its last value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval_s)
        return predicate()


#: ``fieldValidation`` values the API server takes ("" and absent mean ``Warn``).
FIELD_VALIDATION_VALUES: Final = ("", "Ignore", "Strict", "Warn")
#: The options kind whose ``fieldValidation`` a write verb validates.
_OPTIONS_KIND: Final = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
}


def field_validation(query: Mapping[str, str], verb: str) -> str:
    """The ``fieldValidation`` directive of a write (``create``, ``update``, ``patch``); 422
    Invalid worded as the real server's options validation for a value it does not take. The
    embedded server prunes unknown fields for ``Ignore`` and ``Warn`` (no warning header) and
    refuses them for ``Strict``."""
    value = query.get("fieldValidation", "")
    if verb not in _OPTIONS_KIND or value in FIELD_VALIDATION_VALUES:
        return value
    options = _OPTIONS_KIND[verb]
    supported = ", ".join(f'"{v}"' for v in FIELD_VALIDATION_VALUES)
    detail = f'Unsupported value: "{value}": supported values: {supported}'
    raise ApiError(
        422,
        f'{options}.meta.k8s.io "" is invalid: fieldValidation: {detail}',
        reason="Invalid",
        name="",
        group="meta.k8s.io",
        kind=options,
        causes=[
            {"reason": "FieldValueNotSupported", "message": detail, "field": "fieldValidation"}
        ],
    )
