"""Read-only JSON API over the tracker's cache (HTTPS with a certificate, else plain HTTP for an
API bound to 127.0.0.1; put it behind a Service).

``GET /api/v1/gpus`` and ``GET /api/v1/nodes/<node>/gpus`` answer
``{"apiVersion": "v1", "kind": "List", "items": [<GPU object>, ...]}`` with the GPU objects the
tracker currently computes (also on standby replicas, which watch but do not write).
``/healthz`` answers 200 while the process serves; ``/readyz`` 200 once the tracker has synced
(always, when the tracker is disabled). The probes carry no data and need no credentials; every
``/api/`` path is decided by the ``authorizer`` first (:mod:`controller.apiauth`: a bearer token
allowed to list GPU objects), and answered 401, 403, 429 or 503 with a JSON ``error``
otherwise.

:func:`serve_probes` serves only ``/healthz`` and ``/readyz`` on a port of their own, off the
authenticated path: no flood of API requests (each waiting on a TokenReview) shares its
connection slots, and a NetworkPolicy can close it to every pod (the kubelet's probes come from
the node).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from controller.apiauth import AllowAll, ApiAuthorizer
from sharegpu.kube.httpserve import BoundedHTTPServer, BoundedRequestHandler, ServerLimits
from sharegpu.kube.telemetry import parse_address

log = logging.getLogger(__name__)

GpuLister = Callable[[str | None], list[dict[str, Any]]]


def gpu_list(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON list answer for GPU objects given as their manifests."""
    return {"apiVersion": "v1", "kind": "List", "items": manifests}


class _Handler(BoundedRequestHandler):
    protocol_version = "HTTP/1.1"
    list_gpus: GpuLister | None
    ready: Callable[[], bool]
    authorizer: ApiAuthorizer

    def _send(self, code: int, body: Any) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(code)
        ctype = "text/plain" if isinstance(body, str) else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _probe(self, path: str) -> bool:
        """Answer ``/healthz`` or ``/readyz``; False for any other path."""
        if path == "/healthz":
            self._send(200, "ok\n")
        elif path == "/readyz":
            ok = self.ready()
            self._send(200 if ok else 503, "ok\n" if ok else "not ready: tracker not synced\n")
        else:
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        parts = [unquote(p) for p in path.split("/") if p]
        if self._probe(path):
            return
        decision = (
            self.authorizer.decide(self.headers.get("Authorization"), self._peer())
            if parts[:1] == ["api"]
            else None
        )
        if decision is not None and decision.code != 200:
            self._send(decision.code, {"error": decision.reason})
        elif self.list_gpus is None and parts[:2] == ["api", "v1"]:
            self._send(503, {"error": "the tracker is disabled (--disable-tracker)"})
        elif parts == ["api", "v1", "gpus"] and self.list_gpus is not None:
            self._send(200, gpu_list(self.list_gpus(None)))
        elif (
            len(parts) == 5
            and parts[:3] == ["api", "v1", "nodes"]
            and parts[4] == "gpus"
            and self.list_gpus is not None
        ):
            self._send(200, gpu_list(self.list_gpus(parts[3])))
        else:
            self._send(404, {"error": f"no such path {path!r}"})

    def _peer(self) -> str:
        address = self.client_address
        return str(address[0]) if isinstance(address, tuple) else ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("api %s", format % args)


class _ProbeHandler(_Handler):
    """Only the probes; every other path is 404."""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if not self._probe(path):
            self._send(404, {"error": f"no such path {path!r}"})


def serve_api(
    address: str,
    list_gpus: GpuLister | None,
    ready: Callable[[], bool],
    limits: ServerLimits | None = None,
    authorizer: ApiAuthorizer | None = None,
    tls_context: Callable[[], ssl.SSLContext] | None = None,
) -> BoundedHTTPServer:
    """Serve the JSON API on ``address`` in a daemon thread; stop with ``shutdown()`` and
    ``server_close()``. A :class:`~sharegpu.kube.httpserve.BoundedHTTPServer` (``limits``);
    ``authorizer`` None serves everyone (for an API bound to 127.0.0.1); ``tls_context`` (the
    context for each new connection) serves HTTPS."""
    handler = type(
        "ApiHandler",
        (_Handler,),
        {
            # Static, so a plain function is called as given (a bound method would be anyway).
            "list_gpus": staticmethod(list_gpus) if list_gpus is not None else None,
            "ready": staticmethod(ready),
            "authorizer": authorizer or AllowAll(),
        },
    )
    return BoundedHTTPServer(
        parse_address(address), handler, limits, tls_context=tls_context, name="json-api"
    ).start()


def serve_probes(
    address: str, ready: Callable[[], bool], limits: ServerLimits | None = None
) -> BoundedHTTPServer:
    """Serve ``/healthz`` and ``/readyz`` only (plain HTTP, no credentials, no data) on
    ``address`` in a daemon thread (module text)."""
    handler = type(
        "ProbeHandler",
        (_ProbeHandler,),
        {"list_gpus": None, "ready": staticmethod(ready), "authorizer": AllowAll()},
    )
    return BoundedHTTPServer(parse_address(address), handler, limits, name="probes").start()
